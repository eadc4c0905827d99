//! The formats a dataset file can have, and how `auto` tells them apart.
//!
//! Detection looks at the first byte that is not whitespace (after a UTF-8 byte-order mark):
//! `[` is a JSON array, `{` is JSONL, anything else is a text file of lengths. Whether a JSONL
//! file holds lengths or texts is decided by its fields (see [`super::jsonl`]).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use super::batch_error;
use crate::error::{IrError, Result};

/// How a dataset file is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatasetFormat {
    /// Detect from the content; the default.
    #[default]
    Auto,
    /// One length per line; blank lines and `#` comments skipped.
    Text,
    /// One JSON array of lengths.
    Json,
    /// One JSON object per line holding a length field, or a text field to tokenize.
    Jsonl,
    /// JSONL whose records hold a text field that is tokenized (never a length field).
    Corpus,
}

impl DatasetFormat {
    /// Every format, in the order they are listed in messages.
    pub const ALL: [DatasetFormat; 5] = [
        DatasetFormat::Auto,
        DatasetFormat::Text,
        DatasetFormat::Json,
        DatasetFormat::Jsonl,
        DatasetFormat::Corpus,
    ];

    /// The format's name, as written in configs and flags.
    pub fn name(self) -> &'static str {
        match self {
            DatasetFormat::Auto => "auto",
            DatasetFormat::Text => "text",
            DatasetFormat::Json => "json",
            DatasetFormat::Jsonl => "jsonl",
            DatasetFormat::Corpus => "corpus",
        }
    }

    /// Resolves `Auto` from the content; other formats are returned as they are.
    pub fn detect(self, bytes: &[u8]) -> DatasetFormat {
        if self != DatasetFormat::Auto {
            return self;
        }
        let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
        match bytes.iter().find(|byte| !byte.is_ascii_whitespace()) {
            Some(b'[') => DatasetFormat::Json,
            Some(b'{') => DatasetFormat::Jsonl,
            _ => DatasetFormat::Text,
        }
    }
}

impl fmt::Display for DatasetFormat {
    fn fmt(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str(self.name())
    }
}

impl FromStr for DatasetFormat {
    type Err = IrError;

    fn from_str(text: &str) -> Result<Self> {
        DatasetFormat::ALL
            .into_iter()
            .find(|format| format.name() == text)
            .ok_or_else(|| {
                let valid: Vec<_> = DatasetFormat::ALL.iter().map(|f| f.name()).collect();
                batch_error(
                    "--format",
                    format!("unknown format '{text}' (valid: {})", valid.join(", ")),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_from_first_non_blank_byte() {
        let auto = DatasetFormat::Auto;
        assert_eq!(auto.detect(b"\n  [1, 2]"), DatasetFormat::Json);
        assert_eq!(
            auto.detect(b"\xEF\xBB\xBF{\"len\": 3}"),
            DatasetFormat::Jsonl
        );
        assert_eq!(auto.detect(b"# comment\n12\n"), DatasetFormat::Text);
        assert_eq!(auto.detect(b""), DatasetFormat::Text);
        assert_eq!(DatasetFormat::Text.detect(b"[1]"), DatasetFormat::Text);
    }

    #[test]
    fn names_round_trip() {
        for format in DatasetFormat::ALL {
            assert_eq!(format.name().parse::<DatasetFormat>().unwrap(), format);
        }
        let message = "csv".parse::<DatasetFormat>().unwrap_err().to_string();
        assert_eq!(
            message,
            "--format: unknown format 'csv' (valid: auto, text, json, jsonl, corpus)"
        );
    }
}
