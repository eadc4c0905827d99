//! The global batch: where sample lengths come from and how a training step's batch is drawn.
//!
//! A [`Dataset`] is one token count per source document, read from a length file (text, JSON
//! array, JSONL with a length field), a JSONL text corpus tokenized offline with tiktoken, or a
//! seeded [`Synthetic`] distribution. [`Dataset::global_batches`] turns it into [`Batch`]es of
//! [`Sample`]s under [`BatchOptions`]: documents longer than the context are cut into
//! context-length pieces (never dropped), and a sample or token budget draws whole documents
//! in a seeded order. [`BatchConfig`] is the `[batch]` table of a config file.
//!
//! Everything here is deterministic: the same input, options and seed give the same batch on
//! every run and machine. Bad input is an [`IrError::Batch`] (or [`IrError::Io`]) of one line
//! that names the file or flag, the line, the bad value and what would be valid.

mod config;
mod cut;
mod dataset;
mod format;
mod global;
mod json_array;
mod jsonl;
mod length;
mod length_lines;
mod options;
mod permutation;
mod synthetic;
mod tokenizer;

pub use config::{BatchConfig, DistributionKind, SyntheticConfig};
pub use dataset::{Dataset, LoadOptions, DEFAULT_LENGTH_FIELDS, DEFAULT_TEXT_FIELD};
pub use format::DatasetFormat;
pub use global::{Batch, BatchStream};
pub use options::BatchOptions;
pub use synthetic::{Distribution, Synthetic};
pub use tokenizer::Tokenizer;

use crate::error::IrError;

/// The most samples (and synthetic documents) one batch may hold: the step IR holds a node per
/// sample and slice, so a larger batch is an allocation failure, not a plan.
pub const MAX_SAMPLES: usize = 1 << 24;

/// The most tokens one batch may hold: the schedule's varlen offsets (`cu_seqlens_q/k`, as
/// trainers' kernels take them) are 32-bit, and a pack's keys are bounded by its batch's
/// tokens. Real global batches hold millions of tokens; this bound is a thousand times that.
pub const MAX_TOKENS: u64 = u32::MAX as u64;

/// One training sample: a document, or one context-length piece of a longer document.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct Sample {
    /// Tokens in this sample.
    pub len: u32,
    /// Index of the source document in the dataset.
    pub doc: u64,
    /// Which context-length piece of the document this is (0 when not cut).
    pub piece: u32,
}

/// Builds the batch error for `source_name` (a file, a flag or a config table).
fn batch_error(source_name: impl Into<String>, message: impl Into<String>) -> IrError {
    IrError::Batch {
        source_name: source_name.into(),
        message: message.into(),
    }
}
