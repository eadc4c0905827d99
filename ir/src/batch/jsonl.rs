//! Reader for JSONL datasets: one JSON object per line, holding either a length or a text.
//!
//! What a record holds is decided once, before the first record is read:
//! - `field` given: a length field of that name;
//! - `text_field` or `tokenizer` given, or the `corpus` format: a text field (default `text`),
//!   whose token count under the tokenizer (default `cl100k_base`) is the length;
//! - none given: from the first record — a length field if it has one of
//!   [`DEFAULT_LENGTH_FIELDS`] (tried in that order on every line), else its `text` field.
//!
//! Blank lines are skipped. Errors name the line (1-based, counting blank lines) and, for
//! malformed JSON, the column.

use serde_json::{Map, Value};

use super::dataset::{LoadOptions, DEFAULT_LENGTH_FIELDS, DEFAULT_TEXT_FIELD};
use super::json_array::json_message;
use super::{batch_error, length, Tokenizer};
use crate::error::Result;

/// What each record of the file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RecordKind {
    /// A length under `field`, or under the first of [`DEFAULT_LENGTH_FIELDS`] present.
    Length { field: Option<String> },
    /// A text under `field`, counted with `tokenizer`.
    Text { field: String, tokenizer: Tokenizer },
}

/// Parses a JSONL dataset; `corpus` forces text records. `source_name` names it in errors.
pub(super) fn parse(
    source_name: &str,
    bytes: &[u8],
    options: &LoadOptions,
    corpus: bool,
) -> Result<Vec<u32>> {
    let mut kind = declared_kind(options, corpus);
    let mut lengths = Vec::new();
    for (index, line) in bytes.split(|&byte| byte == b'\n').enumerate() {
        if line.trim_ascii().is_empty() {
            continue;
        }
        let at_line =
            |message: String| batch_error(source_name, format!("line {}: {message}", index + 1));
        let record = parse_record(line).map_err(|message| {
            batch_error(source_name, format!("line {}, {message}", index + 1))
        })?;
        let kind = kind.get_or_insert_with(|| inferred_kind(&record));
        let length = match kind {
            RecordKind::Length { field } => record_length(&record, field.as_deref()),
            RecordKind::Text { field, tokenizer } => record_tokens(&record, field, *tokenizer),
        }
        .map_err(at_line)?;
        lengths.push(length);
    }
    Ok(lengths)
}

/// The record kind the options fix before reading, if they fix one.
fn declared_kind(options: &LoadOptions, corpus: bool) -> Option<RecordKind> {
    if let Some(field) = &options.field {
        return Some(RecordKind::Length {
            field: Some(field.clone()),
        });
    }
    if corpus || options.text_field.is_some() || options.tokenizer.is_some() {
        return Some(RecordKind::Text {
            field: options
                .text_field
                .clone()
                .unwrap_or_else(|| DEFAULT_TEXT_FIELD.to_string()),
            tokenizer: options.tokenizer.unwrap_or_default(),
        });
    }
    None
}

/// The record kind of an undeclared file, from its first record.
fn inferred_kind(first: &Map<String, Value>) -> RecordKind {
    let has_length = DEFAULT_LENGTH_FIELDS.iter().any(|f| first.contains_key(*f));
    if !has_length && first.contains_key(DEFAULT_TEXT_FIELD) {
        RecordKind::Text {
            field: DEFAULT_TEXT_FIELD.to_string(),
            tokenizer: Tokenizer::default(),
        }
    } else {
        RecordKind::Length { field: None }
    }
}

/// Parses one line into a JSON object; the error message starts with the column.
///
/// A string escape of a lone UTF-16 surrogate (`"\ud800"`, which Python's `json.dumps`
/// writes for text decoded with `surrogateescape`, and `json.loads` reads back) is no
/// character, so strict JSON refuses it: such a line is read with each lone surrogate as
/// U+FFFD, the replacement character a tokenizer sees for any undecodable text.
fn parse_record(line: &[u8]) -> Result<Map<String, Value>, String> {
    let strict = serde_json::from_slice::<Value>(line);
    let value = match strict {
        Ok(value) => value,
        Err(error) => replace_lone_surrogates(line)
            .and_then(|repaired| serde_json::from_slice::<Value>(&repaired).ok())
            .ok_or_else(|| {
                format!(
                    "column {}: malformed JSON: {}",
                    error.column(),
                    json_message(&error)
                )
            })?,
    };
    match value {
        Value::Object(record) => Ok(record),
        other => Err(format!(
            "column 1: expected a JSON object per line, got {}",
            value_kind(&other)
        )),
    }
}

/// `line` with every `\uXXXX` escape of a UTF-16 surrogate that is not half of a pair
/// replaced by `\ufffd`; `None` when it has none.
fn replace_lone_surrogates(line: &[u8]) -> Option<Vec<u8>> {
    // The code unit of the `\uXXXX` escape at `at`, if there is one.
    let unit = |at: usize| -> Option<u16> {
        let hex = line.get(at..at + 6)?.strip_prefix(b"\\u")?;
        u16::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
    };
    let high = |unit: u16| (0xD800..0xDC00).contains(&unit);
    let low = |unit: u16| (0xDC00..0xE000).contains(&unit);
    let mut repaired = Vec::with_capacity(line.len());
    let (mut at, mut replaced) = (0, false);
    while at < line.len() {
        if line[at] != b'\\' {
            repaired.push(line[at]);
            at += 1;
            continue;
        }
        match unit(at) {
            Some(first) if high(first) && unit(at + 6).is_some_and(low) => {
                repaired.extend_from_slice(&line[at..at + 12]);
                at += 12;
            }
            Some(lone) if high(lone) || low(lone) => {
                repaired.extend_from_slice(b"\\ufffd");
                (at, replaced) = (at + 6, true);
            }
            // Any other escape, two bytes at a time (so `\\` never starts one).
            _ => {
                repaired.extend_from_slice(&line[at..(at + 2).min(line.len())]);
                at += 2;
            }
        }
    }
    replaced.then_some(repaired)
}

/// The length of a record under `field`, or under the first default length field present.
fn record_length(record: &Map<String, Value>, field: Option<&str>) -> Result<u32, String> {
    let found = match field {
        Some(field) => record.get(field).map(|value| (field, value)),
        None => DEFAULT_LENGTH_FIELDS
            .iter()
            .find_map(|field| record.get(*field).map(|value| (*field, value))),
    };
    let Some((field, value)) = found else {
        let wanted = match field {
            Some(field) => format!("no length field '{field}'"),
            None => format!(
                "no length field (looked for {}; name it with --length-field (`field` in a config), or a text to tokenize with --text-field (`text_field`))",
                quoted_list(DEFAULT_LENGTH_FIELDS.iter().copied())
            ),
        };
        return Err(format!(
            "{wanted}; the record has {}",
            record_fields(record)
        ));
    };
    length::from_json(value).map_err(|message| format!("field '{field}': {message}"))
}

/// The token count of a record's text field.
fn record_tokens(
    record: &Map<String, Value>,
    field: &str,
    tokenizer: Tokenizer,
) -> Result<u32, String> {
    let Some(value) = record.get(field) else {
        return Err(format!(
            "no text field '{field}' (name it with --text-field, `text_field` in a config); the record has {}",
            record_fields(record)
        ));
    };
    let Value::String(text) = value else {
        return Err(format!(
            "field '{field}' is {}, expected a string to tokenize",
            value_kind(value)
        ));
    };
    // An empty text is a zero-length document: read, then skipped and counted.
    length::from_u64(tokenizer.count(text) as u64)
        .map_err(|message| format!("field '{field}': {message}"))
}

/// "fields 'a', 'b'" (the first few) or "no fields", for messages.
fn record_fields(record: &Map<String, Value>) -> String {
    const SHOWN: usize = 8;
    if record.is_empty() {
        return "no fields".to_string();
    }
    let mut listed = quoted_list(record.keys().take(SHOWN).map(String::as_str));
    if record.len() > SHOWN {
        listed.push_str(&format!(" and {} more", record.len() - SHOWN));
    }
    format!("fields {listed}")
}

fn quoted_list<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names
        .map(|name| format!("'{name}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// "a string", "an array", ... for messages.
fn value_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lengths(text: &str, options: &LoadOptions) -> Result<Vec<u32>> {
        parse("d.jsonl", text.as_bytes(), options, false)
    }

    fn message(text: &str, options: &LoadOptions) -> String {
        lengths(text, options).unwrap_err().to_string()
    }

    #[test]
    fn lone_surrogate_escapes_read_as_replacement_characters() {
        let text = |line: &str| -> String {
            let record = parse_record(line.as_bytes()).unwrap();
            record["text"].as_str().unwrap().to_string()
        };
        // Lone high, lone low, a high before a non-surrogate, at the end of a string.
        assert_eq!(text(r#"{"text": "a\ud800b"}"#), "a\u{fffd}b");
        assert_eq!(text(r#"{"text": "a\uDC00"}"#), "a\u{fffd}");
        assert_eq!(text(r#"{"text": "\ud83d\u0041"}"#), "\u{fffd}A");
        // A pair is one character; an escaped backslash before `ud800` is no escape of it.
        assert_eq!(
            text(r#"{"text": "\ud83d\ude00 \\ud800"}"#),
            "\u{1f600} \\ud800"
        );
        assert_eq!(text(r#"{"text": "\\\ud800"}"#), "\\\u{fffd}");
        // Other malformed lines keep their error.
        let error = parse_record(br#"{"text": "\ud800" "#).unwrap_err();
        assert!(error.contains("malformed JSON"), "{error}");
        let options = LoadOptions::default();
        assert_eq!(
            lengths("{\"text\": \"\\udfff\"}", &options).unwrap().len(),
            1
        );
    }

    #[test]
    fn default_length_fields_are_tried_in_order() {
        let text = "{\"length\": 3}\n\n{\"len\": 4, \"x\": 1}\n{\"num_tokens\": 5}\n{\"n_tokens\": 6, \"length\": 7}\n";
        assert_eq!(
            lengths(text, &LoadOptions::default()).unwrap(),
            vec![3, 4, 5, 7]
        );
    }

    #[test]
    fn named_field_overrides_defaults() {
        let options = LoadOptions {
            field: Some("tokens".into()),
            ..LoadOptions::default()
        };
        assert_eq!(
            lengths("{\"tokens\": 9, \"length\": 1}", &options).unwrap(),
            vec![9]
        );
        let message = message("{\"tokens\": 9}\n{\"length\": 1}", &options);
        assert_eq!(
            message,
            "d.jsonl: line 2: no length field 'tokens'; the record has fields 'length'"
        );
    }

    #[test]
    fn missing_field_lists_what_was_tried() {
        let message = message("{\"length\": 2}\n{\"size\": 3}", &LoadOptions::default());
        assert!(message.starts_with("d.jsonl: line 2: no length field (looked for 'length', 'len', 'num_tokens', 'n_tokens'"), "{message}");
        assert!(
            message.ends_with("the record has fields 'size'"),
            "{message}"
        );
    }

    #[test]
    fn bad_values_name_line_and_field() {
        let options = LoadOptions::default();
        let negative = message("{\"len\": 1}\n{\"len\": -3}", &options);
        assert!(
            negative.starts_with("d.jsonl: line 2: field 'len': length -3 is negative"),
            "{negative}"
        );
        let text = message("{\"len\": \"many\"}", &options);
        assert!(
            text.contains("field 'len': length 'many' is a string, not a number"),
            "{text}"
        );
        assert_eq!(lengths("{\"len\": 0}", &options).unwrap(), vec![0]);
        let large = message("{\"len\": 4294967296}", &options);
        assert!(large.contains("length 4294967296 is too large"), "{large}");
    }

    #[test]
    fn malformed_lines_name_line_and_column() {
        let message = message("{\"len\": 1}\n{\"len\": 2,}\n", &LoadOptions::default());
        assert!(
            message.starts_with("d.jsonl: line 2, column 11: malformed JSON: "),
            "{message}"
        );
        assert!(!message.contains(" at line "), "{message}");
        let array = self::message("[1]\n", &LoadOptions::default());
        assert_eq!(
            array,
            "d.jsonl: line 1, column 1: expected a JSON object per line, got an array"
        );
    }

    #[test]
    fn text_records_are_tokenized() {
        let text = "{\"text\": \"hello world\"}\n{\"text\": \"hello\"}\n";
        assert_eq!(lengths(text, &LoadOptions::default()).unwrap(), vec![2, 1]);
        let options = LoadOptions {
            text_field: Some("content".into()),
            tokenizer: Some(Tokenizer::O200kBase),
            ..LoadOptions::default()
        };
        assert_eq!(
            lengths("{\"content\": \"hello world\"}", &options).unwrap(),
            vec![2]
        );
    }

    #[test]
    fn bad_text_records_are_named() {
        let options = LoadOptions::default();
        assert_eq!(
            lengths("{\"text\": \"a\"}\n{\"text\": \"\"}", &options).unwrap(),
            vec![1, 0]
        );
        let number = message(
            "{\"text\": 3}",
            &LoadOptions {
                tokenizer: Some(Tokenizer::Cl100kBase),
                ..options.clone()
            },
        );
        assert_eq!(
            number,
            "d.jsonl: line 1: field 'text' is a number, expected a string to tokenize"
        );
        let missing = parse("d.jsonl", b"{\"body\": \"x\"}", &options, true)
            .unwrap_err()
            .to_string();
        assert!(
            missing.starts_with("d.jsonl: line 1: no text field 'text'"),
            "{missing}"
        );
    }
}
