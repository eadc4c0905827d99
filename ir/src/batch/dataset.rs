//! A dataset: the token count of every source document, in file order.
//!
//! [`Dataset::load`] reads a file in any [`DatasetFormat`]; [`Dataset::parse`] does the same on
//! bytes already in memory. A loaded dataset is never empty and every length is in
//! `1..=u32::MAX`: zero-length documents (empty files of a code corpus, say) are skipped and
//! counted in [`Dataset::empty`], as trainers drop them; the readers reject anything else
//! (negative, fractional, non-numeric, too large) with a one-line error naming the file, the
//! line and the value.

use serde::{Deserialize, Serialize};
use std::path::Path;

use super::{batch_error, json_array, jsonl, length_lines, DatasetFormat, Tokenizer};
use crate::error::{IrError, Result};

/// Length fields a JSONL record is searched for, in order, when no `field` is named.
pub const DEFAULT_LENGTH_FIELDS: [&str; 4] = ["length", "len", "num_tokens", "n_tokens"];

/// The text field of a JSONL corpus when no `text_field` is named.
pub const DEFAULT_TEXT_FIELD: &str = "text";

/// One length per source document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dataset {
    /// Where the lengths came from (a path, or a synthetic distribution's description).
    pub name: String,
    /// Token count of each non-empty document, in file order; document `i` is `lengths[i]`.
    pub lengths: Vec<u32>,
    /// Zero-length documents the file held, skipped as trainers drop them (not in `lengths`).
    #[serde(default)]
    pub empty: u64,
}

/// How to read a dataset file; the default detects everything from the content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadOptions {
    /// The file's format (`Auto`: from the first non-blank character).
    pub format: DatasetFormat,
    /// JSONL length field (default: the first of [`DEFAULT_LENGTH_FIELDS`] present).
    pub field: Option<String>,
    /// JSONL text field to tokenize (default: [`DEFAULT_TEXT_FIELD`]).
    pub text_field: Option<String>,
    /// Tokenizer for a text corpus (default: `cl100k_base`).
    pub tokenizer: Option<Tokenizer>,
}

impl Dataset {
    /// Reads a dataset file, or standard input where `path` is `-`. An unreadable file is
    /// [`IrError::Io`]; bad content is [`IrError::Batch`] naming the file (`<stdin>`).
    pub fn load(path: &Path, options: &LoadOptions) -> Result<Dataset> {
        if path.as_os_str() == "-" {
            let bytes = crate::file::read_from(std::io::stdin().lock())
                .map_err(|error| IrError::io(Path::new("<stdin>"), error))?;
            return Dataset::parse("<stdin>", &bytes, options);
        }
        let bytes = crate::file::read(path).map_err(|error| IrError::io(path, error))?;
        Dataset::parse(&path.display().to_string(), &bytes, options)
    }

    /// Parses a dataset from bytes; `name` names it in errors and becomes [`Dataset::name`].
    pub fn parse(name: &str, bytes: &[u8], options: &LoadOptions) -> Result<Dataset> {
        let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
        let format = options.format.detect(bytes);
        check_options(name, format, options)?;
        let lengths = match format {
            DatasetFormat::Json => json_array::parse(name, bytes)?,
            DatasetFormat::Jsonl => jsonl::parse(name, bytes, options, false)?,
            DatasetFormat::Corpus => jsonl::parse(name, bytes, options, true)?,
            DatasetFormat::Text | DatasetFormat::Auto => length_lines::parse(name, bytes)?,
        };
        let read = lengths.len();
        let lengths: Vec<u32> = lengths.into_iter().filter(|&length| length > 0).collect();
        let empty = (read - lengths.len()) as u64;
        if lengths.is_empty() {
            let message = match empty {
                0 => format!("no documents: the {format} dataset is empty (it needs at least one length)"),
                _ => format!("no documents: the {format} dataset holds only zero-length documents ({empty}), which are skipped"),
            };
            return Err(batch_error(name, message));
        }
        Ok(Dataset {
            name: name.to_string(),
            lengths,
            empty,
        })
    }

    /// A dataset of an embedder's lengths in document order (`lengths[i]` is document `i`),
    /// each value checked as the file readers check one. A zero length is kept, not skipped:
    /// the caller's list is indexed by document, and drawing a batch rejects it by index.
    pub fn from_lengths(name: &str, lengths: &[i64]) -> Result<Dataset> {
        let lengths = lengths
            .iter()
            .enumerate()
            .map(|(doc, &value)| {
                super::length::from_i64(value)
                    .map_err(|message| batch_error(name, format!("document {doc}: {message}")))
            })
            .collect::<Result<Vec<u32>>>()?;
        Ok(Dataset {
            name: name.to_string(),
            lengths,
            empty: 0,
        })
    }

    /// Number of documents.
    pub fn len(&self) -> usize {
        self.lengths.len()
    }

    /// Whether there are no documents (never true for a loaded dataset).
    pub fn is_empty(&self) -> bool {
        self.lengths.is_empty()
    }

    /// Tokens over all documents.
    pub fn total_tokens(&self) -> u64 {
        self.lengths.iter().map(|&length| u64::from(length)).sum()
    }
}

/// Rejects options that the format would ignore: a setting that silently does nothing is a
/// bug waiting to be found.
fn check_options(name: &str, format: DatasetFormat, options: &LoadOptions) -> Result<()> {
    let text_options = options.text_field.is_some() || options.tokenizer.is_some();
    let fits = match format {
        DatasetFormat::Jsonl => !(options.field.is_some() && text_options),
        DatasetFormat::Corpus => options.field.is_none(),
        _ => options.field.is_none() && !text_options,
    };
    if fits {
        return Ok(());
    }
    let message = match format {
        DatasetFormat::Jsonl | DatasetFormat::Corpus => {
            "`field` (a length per record) cannot be combined with `text_field`/`tokenizer` or the corpus format (a text per record to tokenize)".to_string()
        }
        _ => format!(
            "--length-field, --text-field and --tokenizer (`field`, `text_field`, `tokenizer` in a config) apply to JSONL files only, and this file is read as {format}"
        ),
    };
    Err(batch_error(name, message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::BatchOptions;

    fn parse(text: &str) -> Result<Dataset> {
        Dataset::parse("d", text.as_bytes(), &LoadOptions::default())
    }

    #[test]
    fn auto_detects_each_format() {
        assert_eq!(parse("3\n4\n").unwrap().lengths, vec![3, 4]);
        assert_eq!(parse("\n [3, 4]").unwrap().lengths, vec![3, 4]);
        assert_eq!(
            parse("{\"len\": 3}\n{\"len\": 4}").unwrap().lengths,
            vec![3, 4]
        );
        assert_eq!(
            parse("{\"text\": \"hello world\"}").unwrap().lengths,
            vec![2]
        );
        assert_eq!(parse("\u{feff}5\n").unwrap().lengths, vec![5]);
    }

    #[test]
    fn format_can_be_forced() {
        let options = LoadOptions {
            format: DatasetFormat::Text,
            ..LoadOptions::default()
        };
        let message = Dataset::parse("d", b"[3]", &options)
            .unwrap_err()
            .to_string();
        assert!(
            message.starts_with("d: line 1: length '[3]' is not a whole number"),
            "{message}"
        );
    }

    #[test]
    fn zero_lengths_are_skipped_and_counted() {
        let dataset = parse("3\n0\n4\n0\n").unwrap();
        assert_eq!((dataset.lengths, dataset.empty), (vec![3, 4], 2));
        let dataset = parse("[0, 5]").unwrap();
        assert_eq!((dataset.lengths, dataset.empty), (vec![5], 1));
        let message = parse("0\n0\n").unwrap_err().to_string();
        assert!(
            message.contains("only zero-length documents (2)"),
            "{message}"
        );
    }

    #[test]
    fn an_embedders_lengths_keep_their_indices_and_get_the_readers_messages() {
        let dataset = Dataset::from_lengths("lengths", &[3, 0, 4]).unwrap();
        assert_eq!((dataset.lengths.clone(), dataset.empty), (vec![3, 0, 4], 0));
        let message = dataset
            .global_batch(&BatchOptions::default())
            .unwrap_err()
            .to_string();
        assert_eq!(
            message,
            "lengths: document 1 has length 0: every document needs at least 1 token"
        );
        let message = Dataset::from_lengths("lengths", &[3, -2])
            .unwrap_err()
            .to_string();
        assert!(
            message.starts_with("lengths: document 1: length -2 is negative: a length is"),
            "{message}"
        );
        let too_large = i64::from(u32::MAX) + 1;
        let message = Dataset::from_lengths("lengths", &[too_large])
            .unwrap_err()
            .to_string();
        assert!(message.contains("is too large"), "{message}");
    }

    #[test]
    fn empty_datasets_are_rejected() {
        for text in ["", "# only a comment\n\n", "[]", "\n\n"] {
            let message = parse(text).unwrap_err().to_string();
            assert!(message.starts_with("d: no documents: the "), "{message}");
        }
    }

    #[test]
    fn options_the_format_ignores_are_rejected() {
        let options = LoadOptions {
            field: Some("len".into()),
            ..LoadOptions::default()
        };
        let message = Dataset::parse("d", b"12\n", &options)
            .unwrap_err()
            .to_string();
        assert_eq!(
            message,
            "d: --length-field, --text-field and --tokenizer (`field`, `text_field`, `tokenizer` in a config) apply to JSONL files only, and this file is read as text"
        );
        let options = LoadOptions {
            field: Some("len".into()),
            tokenizer: Some(Tokenizer::O200kBase),
            ..LoadOptions::default()
        };
        let message = Dataset::parse("d", b"{\"len\": 1}", &options)
            .unwrap_err()
            .to_string();
        assert!(message.contains("cannot be combined"), "{message}");
    }

    #[test]
    fn missing_file_is_an_io_error_naming_it() {
        let path = Path::new("/nonexistent/lengths.txt");
        let error = Dataset::load(path, &LoadOptions::default()).unwrap_err();
        assert!(matches!(error, IrError::Io { .. }), "{error:?}");
        assert!(
            error
                .to_string()
                .starts_with("cannot read /nonexistent/lengths.txt: "),
            "{error}"
        );
    }
}
