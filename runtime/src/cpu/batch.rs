//! The global batch as the CPU backend sees it: token ids per sample, and slices of samples.
//!
//! Every worker of a step (each pipeline stage of each DP replica) gets the same [`TokenBatch`]: slices
//! name samples by their index in it, and the loss is normalised by the number of predicted tokens
//! of the *whole* batch, so that any split of the work adds up to the same loss and gradients.
//! Each sample predicts its own next tokens: position `p` has target `tokens[p + 1]`, and its last
//! position predicts nothing.

use std::fmt;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::config::ModelConfig;
use super::error::{CpuError, Result};

/// Index of a sample in its [`TokenBatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SampleId(pub usize);

/// Tokens `[start, start + len)` of one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TokenSlice {
    pub sample: SampleId,
    pub start: usize,
    pub len: usize,
}

impl TokenSlice {
    /// One past the last token of the slice.
    pub fn end(&self) -> usize {
        self.start + self.len
    }
}

impl fmt::Display for TokenSlice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sample {} [{}, {})",
            self.sample.0,
            self.start,
            self.end()
        )
    }
}

/// Token ids of every sample of a global batch.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenBatch {
    samples: Vec<Vec<u32>>,
    predicted_tokens: usize,
}

impl TokenBatch {
    /// A batch of the given samples; fails on empty samples and tokens outside the vocabulary.
    pub fn new(config: &ModelConfig, samples: Vec<Vec<u32>>) -> Result<TokenBatch> {
        for (sample, tokens) in samples.iter().enumerate() {
            if tokens.is_empty() {
                return Err(CpuError::EmptySample { sample });
            }
            if let Some(position) = tokens.iter().position(|&t| t as usize >= config.vocab) {
                return Err(CpuError::TokenOutOfVocab {
                    sample,
                    position,
                    token: tokens[position],
                    vocab: config.vocab,
                });
            }
        }
        let predicted_tokens = samples.iter().map(|tokens| tokens.len() - 1).sum();
        Ok(TokenBatch {
            samples,
            predicted_tokens,
        })
    }

    /// Samples of the given lengths with uniformly random tokens, deterministic in `seed`
    /// (for running length-only batches).
    pub fn synthetic(config: &ModelConfig, lengths: &[usize], seed: u64) -> Result<TokenBatch> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let vocab = config.vocab as u32;
        let samples = lengths
            .iter()
            .map(|&len| (0..len).map(|_| rng.random_range(0..vocab)).collect())
            .collect();
        TokenBatch::new(config, samples)
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// The batch has no samples.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Ids of all samples, in order.
    pub fn sample_ids(&self) -> impl Iterator<Item = SampleId> {
        (0..self.samples.len()).map(SampleId)
    }

    /// Token ids of one sample.
    pub fn tokens(&self, sample: SampleId) -> &[u32] {
        &self.samples[sample.0]
    }

    /// Length of one sample, or `None` when the batch has no such sample.
    pub fn sample_len(&self, sample: SampleId) -> Option<usize> {
        self.samples.get(sample.0).map(Vec::len)
    }

    /// The whole of one sample as a single slice.
    pub fn whole_slice(&self, sample: SampleId) -> TokenSlice {
        TokenSlice {
            sample,
            start: 0,
            len: self.samples[sample.0].len(),
        }
    }

    /// Tokens with a target, over the whole batch: the loss is their mean.
    pub fn predicted_tokens(&self) -> usize {
        self.predicted_tokens
    }

    /// Factor from a sum of per-token losses to the batch's mean loss (0 when nothing is predicted).
    pub fn loss_scale(&self) -> f32 {
        if self.predicted_tokens == 0 {
            0.0
        } else {
            1.0 / self.predicted_tokens as f32
        }
    }

    /// The next-token target of each token of `slice` (`None` for a sample's last token).
    pub(crate) fn targets(&self, slice: &TokenSlice) -> impl Iterator<Item = Option<u32>> + '_ {
        let tokens = self.tokens(slice.sample);
        (slice.start..slice.end()).map(move |p| tokens.get(p + 1).copied())
    }

    /// Checks that `slice` is a non-empty token range of one of the batch's samples.
    pub(crate) fn check_slice(&self, slice: &TokenSlice) -> Result<()> {
        let sample_len = self.sample_len(slice.sample).unwrap_or(0);
        if slice.len == 0 || slice.end() > sample_len {
            return Err(CpuError::SliceOutOfRange {
                slice: *slice,
                samples: self.len(),
                sample_len,
            });
        }
        Ok(())
    }
}
