//! Per-sample, per-layer K/V state of one stage worker during a step.
//!
//! For each sample with work in flight, and each layer of the stage, the cache holds the keys
//! (after RoPE) and values of the tokens forwarded so far — of the tokens this worker holds,
//! when it is one worker of a context-parallel group ([`CpShard`]): rows in ascending position
//! order. Once the sample's backward starts it also holds the gradient accumulators of those keys
//! and values: the backward of a slice adds the contributions of its queries to the gradients of
//! every earlier position, and the backward of each earlier slice later consumes the rows of its
//! own tokens. Rows of backwarded tokens are dropped, and a sample leaves the cache when its first
//! slice is backwarded, so the cache holds exactly what the schedule keeps alive.
//!
//! The cache also remembers the bounds of the sample's slices in flight: they say which
//! positions each worker of a group holds, so that gathered rows can be put in position order.

use std::collections::BTreeMap;

use super::batch::SampleId;
use super::cp::CpShard;

/// Keys, values and (once the backward started) their gradients, for one sample and one layer.
#[derive(Debug, Default)]
pub(crate) struct LayerKv {
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
    pub key_grads: Vec<f32>,
    pub value_grads: Vec<f32>,
}

/// One sample's progress on the stage, and its K/V per layer.
#[derive(Debug)]
struct SampleKv {
    /// Tokens whose forward finished on this stage.
    forwarded: usize,
    /// Tokens not backwarded yet, once the backward started.
    frontier: Option<usize>,
    /// `(start, len)` of the slices forwarded (or being forwarded) and not yet backwarded, in
    /// order.
    slices: Vec<(usize, usize)>,
    layers: Vec<LayerKv>,
}

/// The K/V state of all samples in flight on one stage.
#[derive(Debug)]
pub(crate) struct KvCache {
    layers: usize,
    kv_width: usize,
    shard: CpShard,
    samples: BTreeMap<SampleId, SampleKv>,
}

impl KvCache {
    pub fn new(layers: usize, kv_width: usize, shard: CpShard) -> KvCache {
        KvCache {
            layers,
            kv_width,
            shard,
            samples: BTreeMap::new(),
        }
    }

    /// Tokens of `sample` forwarded on this stage (0 when it is not in flight).
    pub fn forwarded(&self, sample: SampleId) -> usize {
        self.samples.get(&sample).map_or(0, |s| s.forwarded)
    }

    /// Tokens of `sample` not yet backwarded, once its backward started.
    pub fn frontier(&self, sample: SampleId) -> Option<usize> {
        self.samples.get(&sample).and_then(|s| s.frontier)
    }

    fn entry(&mut self, sample: SampleId) -> &mut SampleKv {
        let layers = self.layers;
        self.samples.entry(sample).or_insert_with(|| SampleKv {
            forwarded: 0,
            frontier: None,
            slices: Vec::new(),
            layers: (0..layers).map(|_| LayerKv::default()).collect(),
        })
    }

    /// Records that a forward pack starts the slice `(start, len)` of `sample` (slices of a
    /// sample are begun in increasing order).
    pub fn begin_slice(&mut self, sample: SampleId, start: usize, len: usize) {
        self.entry(sample).slices.push((start, len));
    }

    /// The bounds of the slices of `sample` in flight that end at or before `end`, in order.
    pub fn slices_until(&self, sample: SampleId, end: usize) -> Vec<(usize, usize)> {
        self.samples.get(&sample).map_or_else(Vec::new, |s| {
            s.slices
                .iter()
                .copied()
                .filter(|&(start, len)| start + len <= end)
                .collect()
        })
    }

    /// Rows this worker holds of the positions of `sample` before `position` (a slice bound).
    pub fn rows_before(&self, sample: SampleId, position: usize) -> usize {
        self.slices_until(sample, position)
            .iter()
            .map(|&(start, len)| self.shard.len_of(start, len))
            .sum()
    }

    /// The K/V of `sample` on local layer `layer`, created empty on first use.
    pub fn layer_mut(&mut self, sample: SampleId, layer: usize) -> &mut LayerKv {
        &mut self.entry(sample).layers[layer]
    }

    /// Like [`KvCache::layer_mut`] for a sample in its backward: the gradient accumulators cover
    /// every cached position (zero-initialised on first use).
    pub fn layer_for_backward(&mut self, sample: SampleId, layer: usize) -> &mut LayerKv {
        let kv = self.layer_mut(sample, layer);
        if kv.key_grads.len() != kv.keys.len() {
            kv.key_grads = vec![0.0; kv.keys.len()];
            kv.value_grads = vec![0.0; kv.values.len()];
        }
        kv
    }

    /// Records that the forward of `sample` reached token `end` on every layer of the stage.
    pub fn finish_forward(&mut self, sample: SampleId, end: usize) {
        let entry = self
            .samples
            .get_mut(&sample)
            .expect("bug: forward finished for a sample without K/V");
        entry.forwarded = end;
    }

    /// Records that tokens `start..` of `sample` are backwarded on every layer: drops their rows
    /// (and their slices' bounds), and the whole sample when `start == 0`.
    pub fn finish_backward(&mut self, sample: SampleId, start: usize) {
        if start == 0 {
            self.samples.remove(&sample);
            return;
        }
        let (width, shard) = (self.kv_width, self.shard);
        let entry = self
            .samples
            .get_mut(&sample)
            .expect("bug: backward finished for a sample without K/V");
        entry.frontier = Some(start);
        entry.slices.retain(|&(s, _)| s < start);
        let rows: usize = entry
            .slices
            .iter()
            .map(|&(s, len)| shard.len_of(s, len))
            .sum();
        for kv in &mut entry.layers {
            for values in [
                &mut kv.keys,
                &mut kv.values,
                &mut kv.key_grads,
                &mut kv.value_grads,
            ] {
                values.truncate(rows * width);
                values.shrink_to_fit();
            }
        }
    }

    /// Samples in flight.
    pub fn samples_in_flight(&self) -> usize {
        self.samples.len()
    }

    /// Bytes allocated: `(keys and values, their gradient accumulators)`.
    pub fn bytes(&self) -> (usize, usize) {
        let mut kv = 0;
        let mut grads = 0;
        for kv_layer in self.samples.values().flat_map(|s| &s.layers) {
            kv += (kv_layer.keys.capacity() + kv_layer.values.capacity()) * 4;
            grads += (kv_layer.key_grads.capacity() + kv_layer.value_grads.capacity()) * 4;
        }
        (kv, grads)
    }
}
