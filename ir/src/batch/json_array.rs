//! Reader for length files in JSON form: one array of lengths, `[350, 1200, 87]`.
//!
//! The array is streamed through a serde visitor that checks each element as it is read, so a
//! bad element is reported with its position in the array and the line and column where it
//! stands, and the file is never held twice in memory.

use serde::de::{DeserializeSeed, Deserializer, SeqAccess, Visitor};
use std::fmt;

use super::{batch_error, length};
use crate::error::{IrError, Result};

/// Parses a JSON array of lengths; `source_name` names it in errors.
pub(super) fn parse(source_name: &str, bytes: &[u8]) -> Result<Vec<u32>> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let lengths = deserializer
        .deserialize_seq(LengthArray)
        .and_then(|lengths| deserializer.end().map(|()| lengths))
        .map_err(|error| json_error(source_name, &error))?;
    Ok(lengths)
}

/// Renders a serde_json error as one line: `line L, column C: message`, marking syntax errors
/// as malformed JSON.
pub(super) fn json_error(source_name: &str, error: &serde_json::Error) -> IrError {
    let position = format!("line {}, column {}", error.line(), error.column());
    let message = json_message(error);
    let kind = if error.is_data() {
        ""
    } else {
        "malformed JSON: "
    };
    batch_error(source_name, format!("{position}: {kind}{message}"))
}

/// The error's message without the " at line L column C" suffix serde_json appends.
pub(super) fn json_message(error: &serde_json::Error) -> String {
    let text = error.to_string();
    let suffix = format!(" at line {} column {}", error.line(), error.column());
    text.strip_suffix(&suffix).unwrap_or(&text).to_string()
}

/// Visits the top-level array.
struct LengthArray;

impl<'de> Visitor<'de> for LengthArray {
    type Value = Vec<u32>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON array of lengths")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u32>, A::Error> {
        let mut lengths = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(length) = seq.next_element_seed(Element {
            number: lengths.len() + 1,
        })? {
            lengths.push(length);
        }
        Ok(lengths)
    }
}

/// Visits one element; `number` counts from 1 for the message.
struct Element {
    number: usize,
}

impl Element {
    fn check<E: serde::de::Error>(&self, checked: Result<u32, String>) -> Result<u32, E> {
        checked.map_err(|message| E::custom(format!("element {}: {message}", self.number)))
    }
}

impl<'de> DeserializeSeed<'de> for Element {
    type Value = u32;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<u32, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Element {
    type Value = u32;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        write!(
            formatter,
            "element {}: a length (a whole number of tokens, 0 or more)",
            self.number
        )
    }

    fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<u32, E> {
        self.check(length::from_u64(value))
    }

    fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<u32, E> {
        self.check(length::from_i64(value))
    }

    fn visit_f64<E: serde::de::Error>(self, value: f64) -> Result<u32, E> {
        self.check(length::from_f64(value))
    }

    fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<u32, E> {
        self.check(Err(length::a_string(value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_an_array() {
        assert_eq!(
            parse("a.json", b" [3, 1200,\n 7.0 ] \n").unwrap(),
            vec![3, 1200, 7]
        );
    }

    #[test]
    fn bad_elements_name_position_and_value() {
        let message = parse("a.json", b"[3,\n  -2]").unwrap_err().to_string();
        assert!(
            message.starts_with("a.json: line 2, column 4: element 2: length -2 is negative"),
            "{message}"
        );
        let message = parse("a.json", b"[\"12\"]").unwrap_err().to_string();
        assert!(
            message.contains("element 1: length '12' is a string, not a number"),
            "{message}"
        );
        assert_eq!(parse("a.json", b"[1, 0]").unwrap(), vec![1, 0]);
        let message = parse("a.json", b"[1, 4294967296]").unwrap_err().to_string();
        assert!(
            message.contains("element 2: length 4294967296 is too large"),
            "{message}"
        );
        let message = parse("a.json", b"[1, null]").unwrap_err().to_string();
        assert!(message.contains("element 2"), "{message}");
    }

    #[test]
    fn malformed_json_names_line_and_column() {
        let message = parse("a.json", b"[1, 2,\n 3 4]").unwrap_err().to_string();
        assert!(
            message.starts_with("a.json: line 2, column 4: malformed JSON: expected `,` or `]`"),
            "{message}"
        );
        assert!(!message.contains(" at line "), "{message}");
        let message = parse("a.json", b"[1, 2").unwrap_err().to_string();
        assert!(message.contains("malformed JSON"), "{message}");
        let message = parse("a.json", b"[1] [2]").unwrap_err().to_string();
        assert!(message.contains("trailing characters"), "{message}");
    }
}
