//! The tokenizers a text corpus can be counted with: OpenAI's BPE encodings via `tiktoken-rs`.
//!
//! Both encodings' rank tables are compiled into the binary by `tiktoken-rs` (`include_str!` of
//! its `assets/*.tiktoken`), so counting works offline; each table is decoded once per process,
//! on first use (a fraction of a second). A text's length is the number of tokens of
//! `encode_ordinary`: special-token strings such as `<|endoftext|>` inside a text count as
//! ordinary text, and no BOS/EOS token is added.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use super::batch_error;
use crate::error::{IrError, Result};

/// A BPE encoding used to count the tokens of a text corpus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Tokenizer {
    /// `cl100k_base` (GPT-4, GPT-3.5); the default.
    #[default]
    #[serde(rename = "cl100k_base", alias = "cl100k")]
    Cl100kBase,
    /// `o200k_base` (GPT-4o and later).
    #[serde(rename = "o200k_base", alias = "o200k")]
    O200kBase,
}

impl Tokenizer {
    /// Every tokenizer, in the order they are listed in messages.
    pub const ALL: [Tokenizer; 2] = [Tokenizer::Cl100kBase, Tokenizer::O200kBase];

    /// The encoding's name, as written in configs and flags.
    pub fn name(self) -> &'static str {
        match self {
            Tokenizer::Cl100kBase => "cl100k_base",
            Tokenizer::O200kBase => "o200k_base",
        }
    }

    /// Number of tokens of `text`.
    pub fn count(self, text: &str) -> usize {
        let encoding = match self {
            Tokenizer::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
            Tokenizer::O200kBase => tiktoken_rs::o200k_base_singleton(),
        };
        encoding.encode_ordinary(text).len()
    }
}

impl fmt::Display for Tokenizer {
    fn fmt(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str(self.name())
    }
}

impl FromStr for Tokenizer {
    type Err = IrError;

    /// Parses `cl100k_base` or `o200k_base` (also `cl100k`, `o200k`).
    fn from_str(text: &str) -> Result<Self> {
        match text {
            "cl100k_base" | "cl100k" => Ok(Tokenizer::Cl100kBase),
            "o200k_base" | "o200k" => Ok(Tokenizer::O200kBase),
            other => Err(batch_error(
                "--tokenizer",
                format!("unknown tokenizer '{other}' (valid: cl100k_base, o200k_base)"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_known_strings() {
        assert_eq!(Tokenizer::Cl100kBase.count("hello world"), 2);
        assert_eq!(Tokenizer::O200kBase.count("hello world"), 2);
        assert_eq!(Tokenizer::Cl100kBase.count(""), 0);
        // The special-token string is ordinary text here: more than one token.
        assert!(Tokenizer::Cl100kBase.count("<|endoftext|>") > 1);
    }

    #[test]
    fn names_round_trip() {
        for tokenizer in Tokenizer::ALL {
            assert_eq!(tokenizer.name().parse::<Tokenizer>().unwrap(), tokenizer);
        }
        let message = "gpt2".parse::<Tokenizer>().unwrap_err().to_string();
        assert_eq!(
            message,
            "--tokenizer: unknown tokenizer 'gpt2' (valid: cl100k_base, o200k_base)"
        );
    }
}
