//! The state one pipeline-stage worker keeps during a training step, and the schedule rules it
//! enforces.
//!
//! A [`StageState`] lives for one step on one worker (one stage of one DP replica). It holds the
//! K/V cache of the samples in flight and the activations each forwarded slice saved, and checks
//! every pack against the slice order before touching anything:
//! - a slice is a non-empty token range of a sample of the batch;
//! - per sample, forwards run in increasing order without gaps (`start` = tokens forwarded so far);
//! - a sample's backward starts only after all its tokens were forwarded on this stage, runs in
//!   decreasing order without gaps (`end` = tokens not yet backwarded), with exactly the slices
//!   that were forwarded;
//! - a sample whose backward finished is not forwarded again in the same step.
//!
//! A rejected pack leaves the state unchanged. The entry points themselves are in
//! [`super::forward`] and [`super::backward`].
//!
//! A worker of a DP-Merge group ([`StageState::with_exchange`]) holds its share of every slice's
//! tokens ([`super::cp`]): its hidden inputs, output gradients and outputs have one row per token
//! it holds, and its attention goes through the group's [`KvExchange`]. Every worker of the group
//! must run the same packs in the same order. A failed exchange (the group was aborted) fails the
//! pack midway; the step is then lost.

use std::collections::{BTreeMap, BTreeSet};

use super::batch::{SampleId, TokenBatch, TokenSlice};
use super::config::ModelConfig;
use super::cp::{CpShard, KvExchange, LocalExchange};
use super::error::{CpuError, Result};
use super::kv_cache::KvCache;
use super::params::Params;
use super::saved_store::SavedStore;
use super::stage::LayerRange;

/// One stage worker's in-flight state during a step: K/V caches and saved activations.
#[derive(Debug)]
pub struct StageState {
    pub(super) config: ModelConfig,
    pub(super) stage: LayerRange,
    /// This worker's share of each slice.
    pub(super) shard: CpShard,
    /// How it sees the K/V of the other workers of its group.
    pub(super) exchange: Box<dyn KvExchange>,
    pub(super) cache: KvCache,
    /// Activations of each forwarded slice whose backward has not run.
    pub(super) saved: SavedStore,
    /// Samples whose backward finished in this step.
    pub(super) retired: BTreeSet<SampleId>,
}

/// Bytes a stage worker holds for the step in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LiveBytes {
    /// Keys and values of the samples in flight.
    pub kv: usize,
    /// Gradient accumulators of those keys and values (samples in their backward).
    pub kv_grads: usize,
    /// Activations saved by forwarded slices whose backward has not run.
    pub activations: usize,
}

impl LiveBytes {
    /// Everything together.
    pub fn total(&self) -> usize {
        self.kv + self.kv_grads + self.activations
    }
}

impl StageState {
    /// A fresh state for the worker of `stage` at the start of a step.
    pub fn new(config: &ModelConfig, stage: LayerRange) -> StageState {
        StageState::with_exchange(config, stage, Box::new(LocalExchange))
    }

    /// A fresh state for one worker of a context-parallel group on `stage`, linked to the
    /// group's other workers by `exchange` (a [`LocalExchange`] makes it a group of one).
    pub fn with_exchange(
        config: &ModelConfig,
        stage: LayerRange,
        exchange: Box<dyn KvExchange>,
    ) -> StageState {
        let shard = exchange.shard();
        StageState {
            config: *config,
            stage,
            shard,
            exchange,
            cache: KvCache::new(stage.layer_count(), config.kv_width(), shard),
            saved: SavedStore::default(),
            retired: BTreeSet::new(),
        }
    }

    /// This worker's place in its context-parallel group.
    pub fn shard(&self) -> CpShard {
        self.shard
    }

    /// The stage this worker runs.
    pub fn stage(&self) -> LayerRange {
        self.stage
    }

    /// Nothing is in flight: every forwarded slice was backwarded (true at the end of a step).
    pub fn is_drained(&self) -> bool {
        self.saved.is_empty() && self.cache.samples_in_flight() == 0
    }

    /// Memory held for the step in flight.
    pub fn live_bytes(&self) -> LiveBytes {
        let (kv, kv_grads) = self.cache.bytes();
        let (padding_kv, activations) = self.saved.bytes();
        let kv = kv + padding_kv;
        LiveBytes {
            kv,
            kv_grads,
            activations,
        }
    }

    /// Fails unless `tensors` (weights or gradients) belong to this worker's model and stage.
    pub(super) fn check_tensors(&self, tensors: &Params) -> Result<()> {
        if *tensors.config() != self.config {
            return Err(CpuError::LayoutMismatch {
                reason: "tensors of another model given to a stage worker".to_string(),
            });
        }
        if tensors.stage() != self.stage {
            return Err(CpuError::StageMismatch {
                expected: self.stage,
                got: tensors.stage(),
            });
        }
        Ok(())
    }

    /// Checks a forward pack against the batch, the slice order and its inputs.
    pub(super) fn check_forward(
        &self,
        batch: &TokenBatch,
        slices: &[TokenSlice],
        padding: usize,
        hidden_in: &[Vec<f32>],
    ) -> Result<()> {
        let mut next_start: BTreeMap<SampleId, usize> = BTreeMap::new();
        let mut ordered = slices.to_vec();
        ordered.sort();
        for slice in &ordered {
            batch.check_slice(slice)?;
            if self.retired.contains(&slice.sample) {
                return Err(CpuError::SampleRetired { slice: *slice });
            }
            let expected = next_start
                .entry(slice.sample)
                .or_insert_with(|| self.cache.forwarded(slice.sample));
            if slice.start != *expected {
                return Err(CpuError::ForwardOutOfOrder {
                    slice: *slice,
                    expected_start: *expected,
                });
            }
            *expected = slice.end();
        }
        if self.stage.is_first() {
            return expect_count(
                "hidden inputs of a first-stage pack (it embeds tokens)",
                0,
                hidden_in.len(),
            );
        }
        self.check_per_slice("hidden inputs", slices, padding, hidden_in)
    }

    /// Checks a backward pack against the batch, the slice order and its output gradients.
    pub(super) fn check_backward(
        &self,
        batch: &TokenBatch,
        slices: &[TokenSlice],
        padding: usize,
        grad_out: &[Vec<f32>],
    ) -> Result<()> {
        let mut next_end: BTreeMap<SampleId, usize> = BTreeMap::new();
        let mut ordered = slices.to_vec();
        ordered.sort_by_key(|s| (s.sample, std::cmp::Reverse(s.start)));
        for slice in &ordered {
            batch.check_slice(slice)?;
            let sample_len = batch.tokens(slice.sample).len();
            let forwarded = self.cache.forwarded(slice.sample);
            if !self.saved.contains(slice) {
                return Err(CpuError::NotForwarded { slice: *slice });
            }
            if forwarded != sample_len {
                return Err(CpuError::BackwardBeforeForward {
                    slice: *slice,
                    forwarded,
                    sample_len,
                });
            }
            let expected = next_end
                .entry(slice.sample)
                .or_insert_with(|| self.cache.frontier(slice.sample).unwrap_or(sample_len));
            if slice.end() != *expected {
                return Err(CpuError::BackwardOutOfOrder {
                    slice: *slice,
                    expected_end: *expected,
                });
            }
            *expected = slice.start;
        }
        if !self.saved.padding_matches(slices, padding) {
            return Err(CpuError::Padding {
                reason: format!(
                    "a backward pack with {padding} padding tokens must be a forward pack of the same slices and padding"
                ),
            });
        }
        if self.stage.is_last() {
            return expect_count(
                "output gradients of a last-stage pack (it starts from the loss)",
                0,
                grad_out.len(),
            );
        }
        self.check_per_slice("output gradients", slices, padding, grad_out)
    }

    /// One `[tokens held, hidden]` tensor per slice, in the slices' order, then one for the
    /// padding if the pack is padded.
    fn check_per_slice(
        &self,
        what: &str,
        slices: &[TokenSlice],
        padding: usize,
        tensors: &[Vec<f32>],
    ) -> Result<()> {
        let segments = slices.len() + usize::from(padding > 0);
        expect_count(
            &format!(
                "{what} of a pack of {} slices and {padding} padding tokens",
                slices.len()
            ),
            segments,
            tensors.len(),
        )?;
        for (slice, tensor) in slices.iter().zip(tensors) {
            expect_count(
                &format!("values of the {what} of slice {slice} ([tokens held, hidden])"),
                self.shard.len_of(slice.start, slice.len) * self.config.hidden,
                tensor.len(),
            )?;
        }
        if padding > 0 {
            let start = slices.iter().map(|s| s.len).sum();
            expect_count(
                &format!("values of the {what} of the padding ([tokens held, hidden])"),
                self.shard.len_of(start, padding) * self.config.hidden,
                tensors[slices.len()].len(),
            )?;
        }
        Ok(())
    }
}

fn expect_count(what: &str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(CpuError::PackInput {
            what: what.to_string(),
            expected,
            got,
        })
    }
}
