//! One stage worker's packs on its GPU: the forward and backward of a pack of slices, the
//! device counterpart of the CPU backend's `StageState` (`cpu/forward.rs`, `cpu/backward.rs`,
//! `cpu/layer.rs`, `cpu/head.rs`), with the same order rules, checked the same way before
//! anything runs (per sample: forwards increasing without gaps; backwards only after the whole
//! sample was forwarded, decreasing without gaps, exactly the forwarded slices; a finished
//! sample is not forwarded again) and reported with the same errors.
//!
//! Per layer a pack runs as one block of rows (its slices' tokens, in the pack's order,
//! [`PackLayout`]): RMSNorm → Q/K/V projections → RoPE → attention → O projection → residual →
//! RMSNorm → SwiGLU MLP → residual; the head (final norm, output projection, softmax
//! cross-entropy) on the last stage; the embedding on the first. The attention runs per slice,
//! in increasing order within a sample: the slice's keys and values are appended to its
//! sample's K/V cache (one buffer per sample and layer, row `p` = position `p`), then its
//! queries attend over the cached prefix. The backward runs the slices of a sample in
//! decreasing order, adding every query's contributions into the sample's dK/dV accumulators
//! (prefix included); a slice's own rows of them are then complete and flow into its K/V
//! projections. Backwarded rows are dropped from the cache.
//!
//! Saved activations are kept per forward pack; a backward pack (any other partition of the
//! same slices) gathers its slices' rows from them, and a forward pack's record is freed when
//! its last slice was taken (the CPU backend frees rows as they are taken: a GPU worker can
//! hold a little longer what the simulator's memory model frees per slice).
//!
//! A padded pack (see `cpu/padding.rs`) has the padding's rows after its slices' rows: they
//! run through every projection, norm and MLP like a slice's, their attention runs over the
//! pack's own keys and values in row order (the padded sequence), they have no target, and
//! their backward runs against zero stand-in keys of the padded sequence's length, exactly as
//! the CPU backend does. Their keys and values stay saved from the forward to the backward.
//!
//! A worker of a DP-Merge group (context parallelism, `cpu/cp/`) holds its [`CpShard`] of every
//! slice: its rows are its own tokens, its K/V cache holds its own positions only (rows in
//! [`super::cp_rows`]'s order), and per slice and layer it all-gathers the group's K/V rows of
//! the sample's prefix into position order before its queries attend; backward, it gathers
//! them again, computes its queries' contributions to every prefix key's and value's gradient,
//! all-gathers those, and adds — in member order, as the CPU does — the rows of the positions
//! it owns into its accumulators. Its padding rows attend to zero stand-in keys (the CPU's
//! rule: it does not hold the pack's keys).

use std::collections::{BTreeMap, BTreeSet};

use crate::cpu::pack_layout::PackLayout;
use crate::cpu::{CpShard, CpuError, LayerRange, ModelConfig, SampleId, TokenBatch, TokenSlice};

use super::blas::Mat;
use super::cp_rows::{gather_part_len, held_rows, member_runs, prefix_end};
use super::device::Gpu;
use super::error::Result;
use super::kernels::{AttentionGrads, AttentionSlices, KernelCalls};
use super::memory::DeviceVec;
use super::nccl::CpExchange;
use super::tensors::{DeviceTensors, LayerOffsets, Layout};

/// RoPE's angle tables for positions `0..max_len`, filled on the host in f64 as the CPU
/// backend computes the angles: `cos[p · half + i] = cos(p · theta^(-2i/head_dim))`.
pub(crate) struct RopeTables {
    pub cos: DeviceVec,
    pub sin: DeviceVec,
}

impl RopeTables {
    pub fn new(gpu: &Gpu, config: &ModelConfig, max_len: usize) -> Result<RopeTables> {
        let half = config.head_dim / 2;
        let mut cos = Vec::with_capacity(max_len * half);
        let mut sin = Vec::with_capacity(max_len * half);
        for position in 0..max_len {
            for i in 0..half {
                let angle = position as f64
                    * config
                        .rope_theta
                        .powf(-2.0 * i as f64 / config.head_dim as f64);
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        Ok(RopeTables {
            cos: gpu.upload(&cos)?,
            sin: gpu.upload(&sin)?,
        })
    }

    /// Rotates (or, `backward`, un-rotates the gradients of) the queries `q` and keys `k` of
    /// `rows` rows at `positions`, in place.
    #[allow(clippy::too_many_arguments)]
    fn rotate_qk(
        &self,
        gpu: &Gpu,
        c: &ModelConfig,
        backward: bool,
        q: u64,
        k: u64,
        positions: u64,
        rows: usize,
    ) -> Result<()> {
        let (cos, sin) = (self.cos.ptr(), self.sin.ptr());
        gpu.rope(backward, q, cos, sin, positions, rows, c.heads, c.head_dim)?;
        gpu.rope(
            backward, k, cos, sin, positions, rows, c.kv_heads, c.head_dim,
        )
    }
}

/// One sample's keys and values on one layer (rows = positions `0..rows`), and their gradient
/// accumulators once its backward started.
#[derive(Default)]
struct LayerKv {
    keys: Option<DeviceVec>,
    values: Option<DeviceVec>,
    key_grads: Option<DeviceVec>,
    value_grads: Option<DeviceVec>,
}

/// One sample's progress on the stage and its K/V per layer.
struct SampleKv {
    forwarded: usize,
    /// The sample's forwarded slices, `(start, len)`, in position order.
    slices: Vec<(usize, usize)>,
    /// Tokens not yet backwarded, once the backward started.
    frontier: Option<usize>,
    layers: Vec<LayerKv>,
}

/// One layer's saved activations for a block of rows.
struct SavedLayer {
    x: DeviceVec,
    inv_rms: DeviceVec,
    normed: DeviceVec,
    q: DeviceVec,
    attn: DeviceVec,
    lse: DeviceVec,
    mid: DeviceVec,
    mlp_inv_rms: DeviceVec,
    mlp_normed: DeviceVec,
    gate: DeviceVec,
    up: DeviceVec,
    activation: DeviceVec,
}

/// The head's saved activations: the final norm's input and output and the logits' gradient
/// (the softmax cross-entropy kernel computes it with the loss, in the logits' place).
struct SavedHead {
    x: DeviceVec,
    inv_rms: DeviceVec,
    normed: DeviceVec,
    d_logits: DeviceVec,
}

/// A forward pack's saved activations and which of its slices were taken by a backward.
struct SavedPack {
    layout: PackLayout,
    layers: Vec<SavedLayer>,
    head: Option<SavedHead>,
    /// Per layer, the padding rows' keys and values (empty when the pack is not padded).
    padding_kv: Vec<PaddingKv>,
    taken: Vec<bool>,
}

/// One layer's keys and values of a padded pack's padding rows.
type PaddingKv = (DeviceVec, DeviceVec);

/// What a forward pack hands on.
pub(crate) struct ForwardOutput {
    /// The stage's output `[rows, hidden]` in the pack's slice order (not on the last stage).
    pub hidden: Option<DeviceVec>,
    /// The pack's share of the batch's mean loss (last stage only).
    pub loss: f64,
}

/// One stage worker's in-flight state during a step.
pub(crate) struct DeviceStage {
    config: ModelConfig,
    /// This worker's share of every slice (its DP-Merge group's split; whole outside one).
    shard: CpShard,
    stage: LayerRange,
    layout: Layout,
    samples: BTreeMap<SampleId, SampleKv>,
    saved: Vec<SavedPack>,
    retired: BTreeSet<SampleId>,
}

/// Row-major views of the pack's per-row integer inputs on the device.
struct RowInputs {
    positions: DeviceVec<i32>,
    /// Per segment (slice, then the padding) `[0, len]`: the `cu_seqlens_q` of a one-slice
    /// attention launch.
    cu_seqlens: DeviceVec<i32>,
    /// `[0]`: every slice's sample starts at row 0 of its own K/V buffer.
    kv_start: DeviceVec<i32>,
}

impl RowInputs {
    fn new(gpu: &Gpu, layout: &PackLayout) -> Result<RowInputs> {
        let positions: Vec<i32> = layout.positions.iter().map(|&p| p as i32).collect();
        let cu_seqlens: Vec<i32> = (0..layout.segments())
            .flat_map(|i| [0, layout.rows_of(i).len() as i32])
            .collect();
        Ok(RowInputs {
            positions: gpu.upload(&positions)?,
            cu_seqlens: gpu.upload(&cu_seqlens)?,
            kv_start: gpu.upload(&[0i32])?,
        })
    }
}

impl DeviceStage {
    pub fn new(
        config: &ModelConfig,
        stage: LayerRange,
        layout: Layout,
        shard: CpShard,
    ) -> DeviceStage {
        DeviceStage {
            config: *config,
            shard,
            stage,
            layout,
            samples: BTreeMap::new(),
            saved: Vec::new(),
            retired: BTreeSet::new(),
        }
    }

    /// Nothing is in flight (true at the end of a step).
    pub fn is_drained(&self) -> bool {
        self.saved.is_empty() && self.samples.is_empty()
    }

    fn forwarded(&self, sample: SampleId) -> usize {
        self.samples.get(&sample).map_or(0, |s| s.forwarded)
    }

    /// The forwarded slices of `sample` that end by `end` (its prefix up to a slice bound).
    fn slices_until(&self, sample: SampleId, end: usize) -> Vec<(usize, usize)> {
        self.samples.get(&sample).map_or_else(Vec::new, |s| {
            s.slices
                .iter()
                .copied()
                .filter(|&(start, len)| start + len <= end)
                .collect()
        })
    }

    /// Rows of this worker's K/V cache of `sample` before `position` (a slice bound).
    fn rows_before(&self, sample: SampleId, position: usize) -> usize {
        held_rows(
            self.shard,
            self.shard.rank,
            &self.slices_until(sample, position),
        )
    }

    /// The group's exchange, which a worker of a DP-Merge group must be given.
    fn exchange<'l>(&self, exchange: Option<CpExchange<'l>>) -> Result<Option<CpExchange<'l>>> {
        match (self.shard.size, exchange) {
            (1, _) => Ok(None),
            (_, Some(exchange)) => Ok(Some(exchange)),
            (size, None) => Err(CpuError::Schedule {
                message: format!(
                    "a worker of a DP-Merge group of {size} runs a pack without its K/V exchange"
                ),
            }
            .into()),
        }
    }

    /// The CPU backend's forward checks: every slice in its sample, forwards in order.
    fn check_forward(&self, batch: &TokenBatch, slices: &[TokenSlice]) -> Result<()> {
        let mut next_start: BTreeMap<SampleId, usize> = BTreeMap::new();
        let mut ordered = slices.to_vec();
        ordered.sort();
        for slice in &ordered {
            batch.check_slice(slice)?;
            if self.retired.contains(&slice.sample) {
                return Err(CpuError::SampleRetired { slice: *slice }.into());
            }
            let expected = next_start
                .entry(slice.sample)
                .or_insert_with(|| self.forwarded(slice.sample));
            if slice.start != *expected {
                return Err(CpuError::ForwardOutOfOrder {
                    slice: *slice,
                    expected_start: *expected,
                }
                .into());
            }
            *expected = slice.end();
        }
        Ok(())
    }

    /// The CPU backend's backward checks: forwarded slices of fully forwarded samples, in
    /// decreasing order without gaps.
    fn check_backward(&self, batch: &TokenBatch, slices: &[TokenSlice]) -> Result<()> {
        let mut next_end: BTreeMap<SampleId, usize> = BTreeMap::new();
        let mut ordered = slices.to_vec();
        ordered.sort_by_key(|s| (s.sample, std::cmp::Reverse(s.start)));
        for slice in &ordered {
            batch.check_slice(slice)?;
            let sample_len = batch.tokens(slice.sample).len();
            if self.find_saved(slice).is_none() {
                return Err(CpuError::NotForwarded { slice: *slice }.into());
            }
            let forwarded = self.forwarded(slice.sample);
            if forwarded != sample_len {
                return Err(CpuError::BackwardBeforeForward {
                    slice: *slice,
                    forwarded,
                    sample_len,
                }
                .into());
            }
            let frontier = self.samples[&slice.sample].frontier.unwrap_or(sample_len);
            let expected = next_end.entry(slice.sample).or_insert(frontier);
            if slice.end() != *expected {
                return Err(CpuError::BackwardOutOfOrder {
                    slice: *slice,
                    expected_end: *expected,
                }
                .into());
            }
            *expected = slice.start;
        }
        Ok(())
    }

    /// The saved pack holding `slice` (not yet taken) and its index in that pack.
    fn find_saved(&self, slice: &TokenSlice) -> Option<(usize, usize)> {
        self.saved.iter().enumerate().find_map(|(pack, saved)| {
            saved
                .layout
                .slices
                .iter()
                .position(|s| s == slice)
                .filter(|&index| !saved.taken[index])
                .map(|index| (pack, index))
        })
    }

    /// The CPU backend's padding rule (`cpu/saved_store.rs`): an unpadded backward pack takes
    /// no slice of a padded forward pack; a padded one is exactly one forward pack with the
    /// same slices and padding.
    fn padding_matches(&self, slices: &[TokenSlice], padding: usize) -> bool {
        let record = |slice: &TokenSlice| self.find_saved(slice).map(|(pack, _)| &self.saved[pack]);
        if padding == 0 {
            return slices
                .iter()
                .filter_map(record)
                .all(|saved| saved.layout.padding == 0);
        }
        match slices.first().and_then(record) {
            Some(saved) => {
                saved.layout.padding == padding
                    && saved.layout.slices.len() == slices.len()
                    && slices.iter().all(|s| saved.layout.slices.contains(s))
            }
            None => false,
        }
    }

    /// The forward of the pack `slices`, padded with `padding` tokens after them (0: not
    /// padded), with the stage's weights `params`; `input` is the previous stage's output
    /// `[rows, hidden]` of this worker's rows, the padding's last (none on the first stage).
    /// A worker of a DP-Merge group exchanges K/V through `exchange`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &mut self,
        gpu: &Gpu,
        rope: &RopeTables,
        params: &DeviceTensors,
        batch: &TokenBatch,
        slices: &[TokenSlice],
        padding: usize,
        input: Option<DeviceVec>,
        exchange: Option<CpExchange<'_>>,
    ) -> Result<ForwardOutput> {
        self.check_forward(batch, slices)?;
        let exchange = self.exchange(exchange)?;
        if slices.is_empty() {
            // Nothing to compute or save; a middle stage still hands on its (empty) output.
            let hidden = (!self.stage.is_last()).then(|| gpu.zeros(0)).transpose()?;
            return Ok(ForwardOutput { hidden, loss: 0.0 });
        }
        gpu.set_backward(false);
        let layout = PackLayout::new(slices, self.shard, padding);
        let rows = layout.rows();
        let h = self.config.hidden;
        let inputs = RowInputs::new(gpu, &layout)?;
        let mut x =
            match (self.layout.embedding, input) {
                (Some(embedding), None) => self.embed(gpu, params, embedding, &layout, batch)?,
                (None, Some(hidden)) if hidden.len() == rows * h => hidden,
                (_, input) => return Err(CpuError::PackInput {
                    what: "hidden input values of a pack ([rows, hidden]; none on the first stage)"
                        .to_string(),
                    expected: if self.stage.is_first() { 0 } else { rows * h },
                    got: input.map_or(0, |i| i.len()),
                }
                .into()),
            };
        for slice in &layout.slices {
            let layers = self.stage.layer_count();
            self.samples
                .entry(slice.sample)
                .or_insert_with(|| SampleKv {
                    forwarded: 0,
                    slices: Vec::new(),
                    frontier: None,
                    layers: (0..layers).map(|_| LayerKv::default()).collect(),
                });
        }
        for index in layout.forward_order() {
            let slice = layout.slices[index];
            let sample = self.samples.get_mut(&slice.sample).expect("entered above");
            sample.slices.push((slice.start, slice.len));
        }
        let mut saved_layers = Vec::with_capacity(self.layout.layers.len());
        let mut padding_kv = Vec::new();
        for local in 0..self.layout.layers.len() {
            let (y, saved, padding) =
                self.layer_forward(gpu, rope, params, local, &layout, &inputs, x, exchange)?;
            saved_layers.push(saved);
            padding_kv.extend(padding);
            x = y;
        }
        let mut output = ForwardOutput {
            hidden: None,
            loss: 0.0,
        };
        let head = match self.layout.final_norm {
            Some(final_norm) => {
                let (loss, head) = self.head_forward(gpu, params, final_norm, &layout, batch, x)?;
                output.loss = loss;
                Some(head)
            }
            None => {
                output.hidden = Some(x);
                None
            }
        };
        for slice in &layout.slices {
            let sample = self.samples.get_mut(&slice.sample).expect("entered above");
            sample.forwarded = sample.forwarded.max(slice.end());
        }
        let taken = vec![false; layout.slices.len()];
        self.saved.push(SavedPack {
            layout,
            layers: saved_layers,
            head,
            padding_kv,
            taken,
        });
        Ok(output)
    }

    /// The embedding rows of the pack's tokens, `[rows, hidden]` (one row copy per token).
    fn embed(
        &self,
        gpu: &Gpu,
        params: &DeviceTensors,
        embedding: usize,
        layout: &PackLayout,
        batch: &TokenBatch,
    ) -> Result<DeviceVec> {
        let h = self.config.hidden;
        let x = gpu.zeros(layout.rows() * h)?;
        for (row, token) in layout.tokens(batch).enumerate() {
            gpu.copy(&params.data, embedding + token as usize * h, &x, row * h, h)?;
        }
        Ok(x)
    }

    /// One layer's forward of the pack's rows `x`: its output, what its backward needs, and
    /// the padding rows' keys and values if the pack is padded.
    #[allow(clippy::too_many_arguments)]
    fn layer_forward(
        &mut self,
        gpu: &Gpu,
        rope: &RopeTables,
        params: &DeviceTensors,
        local: usize,
        layout: &PackLayout,
        inputs: &RowInputs,
        x: DeviceVec,
        exchange: Option<CpExchange<'_>>,
    ) -> Result<(DeviceVec, SavedLayer, Option<PaddingKv>)> {
        let c = self.config;
        let (h, f, qw, kvw, rows) = (c.hidden, c.ffn, c.q_width(), c.kv_width(), layout.rows());
        let w = self.layout.layers[local];
        let at = |offset: usize| params.at(offset);
        let normed = gpu.zeros(rows * h)?;
        let inv_rms = gpu.zeros(rows)?;
        gpu.rmsnorm_fwd(
            x.ptr(),
            at(w.attn_norm),
            normed.ptr(),
            inv_rms.ptr(),
            rows,
            h,
            c.norm_eps,
        )?;
        let q = gpu.zeros(rows * qw)?;
        let k = gpu.zeros(rows * kvw)?;
        let v = gpu.zeros(rows * kvw)?;
        gpu.linear(normed.ptr(), at(w.wq), rows, h, qw, q.ptr())?;
        gpu.linear(normed.ptr(), at(w.wk), rows, h, kvw, k.ptr())?;
        gpu.linear(normed.ptr(), at(w.wv), rows, h, kvw, v.ptr())?;
        let positions = inputs.positions.ptr();
        rope.rotate_qk(gpu, &c, false, q.ptr(), k.ptr(), positions, rows)?;
        let attn = gpu.zeros(rows * qw)?;
        let lse = gpu.zeros(rows * c.heads)?;
        for index in layout.forward_order() {
            let slice = layout.slices[index];
            let range = layout.rows_of(index);
            let kv = &mut self.samples.get_mut(&slice.sample).expect("entered").layers[local];
            append_rows(gpu, &mut kv.keys, &k, range.start * kvw, range.len() * kvw)?;
            append_rows(
                gpu,
                &mut kv.values,
                &v,
                range.start * kvw,
                range.len() * kvw,
            )?;
            let kv = &self.samples[&slice.sample].layers[local];
            // A DP-Merge group's member attends over the group's whole prefix.
            let gathered = match exchange {
                Some(exchange) => {
                    let bounds = self.slices_until(slice.sample, slice.end());
                    Some(gather_prefix(gpu, self.shard, kvw, exchange, &bounds, kv)?)
                }
                None => None,
            };
            let (keys, values) = match &gathered {
                Some((keys, values)) => (keys, values),
                None => (
                    kv.keys.as_ref().expect("appended"),
                    kv.values.as_ref().expect("appended"),
                ),
            };
            let slices = AttentionSlices {
                q: q.at(range.start * qw),
                keys: keys.ptr(),
                values: values.ptr(),
                out: attn.at(range.start * qw),
                lse: lse.at(range.start * c.heads),
                positions: inputs.positions.at(range.start),
                cu_seqlens_q: inputs.cu_seqlens.at(2 * index),
                kv_starts: inputs.kv_start.ptr(),
                slices: 1,
                total_q: range.len(),
                kv_rows: keys.len() / kvw,
                heads: c.heads,
                kv_heads: c.kv_heads,
                head_dim: c.head_dim,
            };
            gpu.attention_fwd(&slices)?;
        }
        // The padding attends causally over the pack's own rows (the padded sequence); a
        // member of a DP-Merge group, which holds only its share of them, over zero stand-ins.
        let mut padding_kv = None;
        if let Some(range) = layout.padding_rows().filter(|rows| !rows.is_empty()) {
            let index = layout.slices.len();
            let stand_in = match self.shard.size {
                1 => None,
                _ => Some(gpu.zeros(layout.sequence_len() * kvw)?),
            };
            let (keys, values) = match &stand_in {
                Some(zeros) => (zeros, zeros),
                None => (&k, &v),
            };
            let slices = AttentionSlices {
                q: q.at(range.start * qw),
                keys: keys.ptr(),
                values: values.ptr(),
                out: attn.at(range.start * qw),
                lse: lse.at(range.start * c.heads),
                positions: inputs.positions.at(range.start),
                cu_seqlens_q: inputs.cu_seqlens.at(2 * index),
                kv_starts: inputs.kv_start.ptr(),
                slices: 1,
                total_q: range.len(),
                kv_rows: layout.sequence_len(),
                heads: c.heads,
                kv_heads: c.kv_heads,
                head_dim: c.head_dim,
            };
            gpu.attention_fwd(&slices)?;
            let (own, len) = (range.start * kvw, range.len() * kvw);
            let (keys, values) = (gpu.zeros(len)?, gpu.zeros(len)?);
            gpu.copy(&k, own, &keys, 0, len)?;
            gpu.copy(&v, own, &values, 0, len)?;
            padding_kv = Some((keys, values));
        }
        drop((k, v));
        let mid = gpu.zeros(rows * h)?;
        gpu.linear(attn.ptr(), at(w.wo), rows, qw, h, mid.ptr())?;
        gpu.add(mid.ptr(), x.ptr(), mid.ptr(), rows * h)?;
        let mlp_normed = gpu.zeros(rows * h)?;
        let mlp_inv_rms = gpu.zeros(rows)?;
        gpu.rmsnorm_fwd(
            mid.ptr(),
            at(w.mlp_norm),
            mlp_normed.ptr(),
            mlp_inv_rms.ptr(),
            rows,
            h,
            c.norm_eps,
        )?;
        let gate = gpu.zeros(rows * f)?;
        let up = gpu.zeros(rows * f)?;
        gpu.linear(mlp_normed.ptr(), at(w.w_gate), rows, h, f, gate.ptr())?;
        gpu.linear(mlp_normed.ptr(), at(w.w_up), rows, h, f, up.ptr())?;
        let activation = gpu.zeros(rows * f)?;
        gpu.swiglu_fwd(gate.ptr(), up.ptr(), activation.ptr(), rows * f)?;
        let y = gpu.zeros(rows * h)?;
        gpu.linear(activation.ptr(), at(w.w_down), rows, f, h, y.ptr())?;
        gpu.add(y.ptr(), mid.ptr(), y.ptr(), rows * h)?;
        let saved = SavedLayer {
            x,
            inv_rms,
            normed,
            q,
            attn,
            lse,
            mid,
            mlp_inv_rms,
            mlp_normed,
            gate,
            up,
            activation,
        };
        Ok((y, saved, padding_kv))
    }

    /// The head: final norm, logits, and the pack's share of the mean loss; the logits become
    /// their gradient in place, which the head's backward reads.
    fn head_forward(
        &self,
        gpu: &Gpu,
        params: &DeviceTensors,
        final_norm: usize,
        layout: &PackLayout,
        batch: &TokenBatch,
        x: DeviceVec,
    ) -> Result<(f64, SavedHead)> {
        let c = self.config;
        let (h, vocab, rows) = (c.hidden, c.vocab, layout.rows());
        let normed = gpu.zeros(rows * h)?;
        let inv_rms = gpu.zeros(rows)?;
        gpu.rmsnorm_fwd(
            x.ptr(),
            params.at(final_norm),
            normed.ptr(),
            inv_rms.ptr(),
            rows,
            h,
            c.norm_eps,
        )?;
        let logits = gpu.zeros(rows * vocab)?;
        let output = Mat::new(params.at(self.layout.output_weight()), vocab, h);
        gpu.gemm(
            1.0,
            Mat::new(normed.ptr(), rows, h),
            output.t(),
            0.0,
            logits.ptr(),
        )?;
        let targets: Vec<i32> = layout
            .targets(batch)
            .iter()
            .map(|t| t.map_or(-1, |t| t as i32))
            .collect();
        let targets_device = gpu.upload(&targets)?;
        let losses = gpu.zeros(rows)?;
        let scale = batch.loss_scale();
        gpu.softmax_xent(
            logits.ptr(),
            targets_device.ptr(),
            losses.ptr(),
            rows,
            vocab,
            scale,
        )?;
        let losses = gpu.download(&losses, 0..rows)?;
        let total: f64 = losses
            .iter()
            .zip(&targets)
            .filter(|(_, &t)| t >= 0)
            .map(|(&l, _)| f64::from(l))
            .sum();
        let saved = SavedHead {
            x,
            inv_rms,
            normed,
            d_logits: logits,
        };
        Ok((total * f64::from(scale), saved))
    }

    /// The backward of the pack `slices`: adds the stage's weight gradients into `grads` and
    /// returns the gradient of the stage's input `[rows, hidden]` in the pack's slice order
    /// (none on the first stage, which ends in the embedding's gradient). `grad_out` is the
    /// next stage's (none on the last stage). A padded pack (`padding` > 0) must be a forward
    /// pack of the same slices and padding; its tensors end with the padding's rows.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &mut self,
        gpu: &Gpu,
        rope: &RopeTables,
        params: &DeviceTensors,
        grads: &DeviceTensors,
        batch: &TokenBatch,
        slices: &[TokenSlice],
        padding: usize,
        grad_out: Option<DeviceVec>,
        exchange: Option<CpExchange<'_>>,
    ) -> Result<Option<DeviceVec>> {
        self.check_backward(batch, slices)?;
        let exchange = self.exchange(exchange)?;
        if !self.padding_matches(slices, padding) {
            return Err(CpuError::Padding {
                reason: format!(
                    "a backward pack with {padding} padding tokens must be a forward pack of the same slices and padding"
                ),
            }
            .into());
        }
        if slices.is_empty() {
            return (!self.stage.is_first()).then(|| gpu.zeros(0)).transpose();
        }
        gpu.set_backward(true);
        let layout = PackLayout::new(slices, self.shard, padding);
        let rows = layout.rows();
        let h = self.config.hidden;
        let (mut layers, head, padding_kv) = self.take_saved(gpu, &layout)?;
        for slice in slices {
            for local in 0..self.layout.layers.len() {
                let kv = &mut self
                    .samples
                    .get_mut(&slice.sample)
                    .expect("forwarded")
                    .layers[local];
                if kv.key_grads.is_none() {
                    let len = kv.keys.as_ref().map_or(0, DeviceVec::len);
                    kv.key_grads = Some(gpu.zeros(len)?);
                    kv.value_grads = Some(gpu.zeros(len)?);
                }
            }
        }
        let inputs = RowInputs::new(gpu, &layout)?;
        let mut dy =
            match (head, grad_out) {
                (Some(head), None) => self.head_backward(gpu, params, grads, head, rows)?,
                (None, Some(grad)) if grad.len() == rows * h => grad,
                (_, grad) => return Err(CpuError::PackInput {
                    what:
                        "output gradient values of a pack ([rows, hidden]; none on the last stage)"
                            .to_string(),
                    expected: if self.stage.is_last() { 0 } else { rows * h },
                    got: grad.map_or(0, |g| g.len()),
                }
                .into()),
            };
        for local in (0..self.layout.layers.len()).rev() {
            let saved = layers.pop().expect("bug: saved activations of every layer");
            let tensors = (saved, dy);
            dy = self.layer_backward(
                gpu, rope, params, grads, local, &layout, &inputs, tensors, exchange,
            )?;
        }
        self.finish_backward(gpu, &layout)?;
        drop(padding_kv);
        match self.layout.embedding {
            Some(embedding) => {
                for (row, token) in layout.tokens(batch).enumerate() {
                    let target = grads.at(embedding + token as usize * h);
                    gpu.add(target, dy.at(row * h), target, h)?;
                }
                Ok(None)
            }
            None => Ok(Some(dy)),
        }
    }

    /// The saved activations of the backward pack's slices (and its padding's, which a padded
    /// pack takes from the forward pack of the same slices), joined in its order (the forward
    /// pack's own buffers when it is the same pack), freeing forward records fully taken.
    fn take_saved(
        &mut self,
        gpu: &Gpu,
        layout: &PackLayout,
    ) -> Result<(Vec<SavedLayer>, Option<SavedHead>, Vec<PaddingKv>)> {
        let sources: Vec<(usize, usize)> = layout
            .slices
            .iter()
            .map(|slice| self.find_saved(slice).expect("checked"))
            .collect();
        let whole_pack = sources
            .iter()
            .enumerate()
            .all(|(i, &(pack, index))| pack == sources[0].0 && index == i)
            && self.saved[sources[0].0].layout.slices.len() == layout.slices.len();
        if whole_pack {
            let saved = self.saved.remove(sources[0].0);
            return Ok((saved.layers, saved.head, saved.padding_kv));
        }
        let rows = layout.rows();
        let gather = |field: &dyn Fn(&SavedPack) -> Vec<&DeviceVec>| -> Result<Vec<DeviceVec>> {
            let first = &self.saved[sources[0].0];
            // Row widths from a source with rows (a DP-Merge member may hold none of a pack).
            let sized = sources
                .iter()
                .map(|&(pack, _)| &self.saved[pack])
                .find(|saved| saved.layout.rows() > 0)
                .unwrap_or(first);
            let widths: Vec<usize> = field(sized)
                .iter()
                .map(|buffer| buffer.len() / sized.layout.rows().max(1))
                .collect();
            let mut out = Vec::with_capacity(widths.len());
            for (f, &width) in widths.iter().enumerate() {
                let target = gpu.zeros(rows * width)?;
                for (i, &(pack, index)) in sources.iter().enumerate() {
                    let saved = &self.saved[pack];
                    let from = saved.layout.rows_of(index);
                    let to = layout.rows_of(i);
                    gpu.copy(
                        field(saved)[f],
                        from.start * width,
                        &target,
                        to.start * width,
                        to.len() * width,
                    )?;
                }
                // A padded pack's slices all come from one forward pack, with its padding.
                if let (Some(from), Some(to)) = (first.layout.padding_rows(), layout.padding_rows())
                {
                    gpu.copy(
                        field(first)[f],
                        from.start * width,
                        &target,
                        to.start * width,
                        to.len() * width,
                    )?;
                }
                out.push(target);
            }
            Ok(out)
        };
        let mut layers = Vec::with_capacity(self.layout.layers.len());
        for local in 0..self.layout.layers.len() {
            let fields = gather(&|saved: &SavedPack| {
                let l = &saved.layers[local];
                vec![
                    &l.x,
                    &l.inv_rms,
                    &l.normed,
                    &l.q,
                    &l.attn,
                    &l.lse,
                    &l.mid,
                    &l.mlp_inv_rms,
                    &l.mlp_normed,
                    &l.gate,
                    &l.up,
                    &l.activation,
                ]
            })?;
            let mut it = fields.into_iter();
            let mut next = || it.next().expect("twelve fields");
            layers.push(SavedLayer {
                x: next(),
                inv_rms: next(),
                normed: next(),
                q: next(),
                attn: next(),
                lse: next(),
                mid: next(),
                mlp_inv_rms: next(),
                mlp_normed: next(),
                gate: next(),
                up: next(),
                activation: next(),
            });
        }
        let head = match self.saved[sources[0].0].head.is_some() {
            true => {
                let fields = gather(&|saved: &SavedPack| {
                    let head = saved.head.as_ref().expect("a last stage's record");
                    vec![&head.x, &head.inv_rms, &head.normed, &head.d_logits]
                })?;
                let mut it = fields.into_iter();
                let mut next = || it.next().expect("four fields");
                Some(SavedHead {
                    x: next(),
                    inv_rms: next(),
                    normed: next(),
                    d_logits: next(),
                })
            }
            false => None,
        };
        for &(pack, index) in &sources {
            self.saved[pack].taken[index] = true;
        }
        let padding_kv = match layout.padding {
            0 => Vec::new(),
            _ => std::mem::take(&mut self.saved[sources[0].0].padding_kv),
        };
        self.saved.retain(|saved| !saved.taken.iter().all(|&t| t));
        Ok((layers, head, padding_kv))
    }

    /// The head's backward: the output projection's and final norm's gradients, and the
    /// gradient of the head's input rows.
    fn head_backward(
        &self,
        gpu: &Gpu,
        params: &DeviceTensors,
        grads: &DeviceTensors,
        head: SavedHead,
        rows: usize,
    ) -> Result<DeviceVec> {
        let c = self.config;
        let (h, vocab) = (c.hidden, c.vocab);
        let final_norm = self.layout.final_norm.expect("a last stage");
        let output = self.layout.output_weight();
        let d_logits = Mat::new(head.d_logits.ptr(), rows, vocab);
        gpu.gemm(
            1.0,
            d_logits.t(),
            Mat::new(head.normed.ptr(), rows, h),
            1.0,
            grads.at(output),
        )?;
        let d_normed = gpu.zeros(rows * h)?;
        gpu.gemm(
            1.0,
            d_logits,
            Mat::new(params.at(output), vocab, h),
            0.0,
            d_normed.ptr(),
        )?;
        drop(head.d_logits);
        let dx = gpu.zeros(rows * h)?;
        gpu.rmsnorm_bwd(
            head.x.ptr(),
            params.at(final_norm),
            head.inv_rms.ptr(),
            d_normed.ptr(),
            dx.ptr(),
            grads.at(final_norm),
            rows,
            h,
        )?;
        Ok(dx)
    }

    /// One layer's backward from the gradient of its output; returns its input's.
    #[allow(clippy::too_many_arguments)]
    fn layer_backward(
        &mut self,
        gpu: &Gpu,
        rope: &RopeTables,
        params: &DeviceTensors,
        grads: &DeviceTensors,
        local: usize,
        layout: &PackLayout,
        inputs: &RowInputs,
        (saved, dy): (SavedLayer, DeviceVec),
        exchange: Option<CpExchange<'_>>,
    ) -> Result<DeviceVec> {
        let c = self.config;
        let (h, f, qw, kvw, rows) = (c.hidden, c.ffn, c.q_width(), c.kv_width(), layout.rows());
        let w: LayerOffsets = self.layout.layers[local];
        let (p, g) = (|o: usize| params.at(o), |o: usize| grads.at(o));
        // The MLP block.
        gpu.linear_weight_grad(saved.activation.ptr(), dy.ptr(), rows, f, h, g(w.w_down))?;
        let d_activation = gpu.zeros(rows * f)?;
        gpu.linear_input_grad(dy.ptr(), p(w.w_down), rows, f, h, 0.0, d_activation.ptr())?;
        let d_gate = gpu.zeros(rows * f)?;
        let d_up = gpu.zeros(rows * f)?;
        gpu.swiglu_bwd(
            saved.gate.ptr(),
            saved.up.ptr(),
            d_activation.ptr(),
            d_gate.ptr(),
            d_up.ptr(),
            rows * f,
        )?;
        drop(d_activation);
        gpu.linear_weight_grad(
            saved.mlp_normed.ptr(),
            d_gate.ptr(),
            rows,
            h,
            f,
            g(w.w_gate),
        )?;
        gpu.linear_weight_grad(saved.mlp_normed.ptr(), d_up.ptr(), rows, h, f, g(w.w_up))?;
        let d_normed = gpu.zeros(rows * h)?;
        gpu.linear_input_grad(d_gate.ptr(), p(w.w_gate), rows, h, f, 0.0, d_normed.ptr())?;
        gpu.linear_input_grad(d_up.ptr(), p(w.w_up), rows, h, f, 1.0, d_normed.ptr())?;
        drop((d_gate, d_up));
        let d_mid = gpu.zeros(rows * h)?;
        gpu.rmsnorm_bwd(
            saved.mid.ptr(),
            p(w.mlp_norm),
            saved.mlp_inv_rms.ptr(),
            d_normed.ptr(),
            d_mid.ptr(),
            g(w.mlp_norm),
            rows,
            h,
        )?;
        gpu.add(d_mid.ptr(), dy.ptr(), d_mid.ptr(), rows * h)?;
        drop(dy);
        gpu.linear_weight_grad(saved.attn.ptr(), d_mid.ptr(), rows, qw, h, g(w.wo))?;
        let d_attn = gpu.zeros(rows * qw)?;
        gpu.linear_input_grad(d_mid.ptr(), p(w.wo), rows, qw, h, 0.0, d_attn.ptr())?;
        // The attention, slice by slice, into the samples' dK/dV accumulators.
        let dq = gpu.zeros(rows * qw)?;
        for index in layout.backward_order() {
            let slice = layout.slices[index];
            let range = layout.rows_of(index);
            let kv = &self.samples[&slice.sample].layers[local];
            let bounds = self.slices_until(slice.sample, slice.end());
            // A DP-Merge group's member gathers the prefix again and computes its queries'
            // contributions to every prefix row's dK/dV, which the group then exchanges.
            let gathered = match exchange {
                Some(exchange) => {
                    let (keys, values) =
                        gather_prefix(gpu, self.shard, kvw, exchange, &bounds, kv)?;
                    let grads = gpu.zeros(2 * keys.len())?;
                    Some((keys, values, grads))
                }
                None => None,
            };
            let (keys, values, d_keys, d_values) = match &gathered {
                Some((keys, values, grads)) => (keys, values, grads.ptr(), grads.at(keys.len())),
                None => (
                    kv.keys.as_ref().expect("forwarded"),
                    kv.values.as_ref().expect("forwarded"),
                    kv.key_grads.as_ref().expect("allocated").ptr(),
                    kv.value_grads.as_ref().expect("allocated").ptr(),
                ),
            };
            let slices = AttentionSlices {
                q: saved.q.at(range.start * qw),
                keys: keys.ptr(),
                values: values.ptr(),
                out: saved.attn.at(range.start * qw),
                lse: saved.lse.at(range.start * c.heads),
                positions: inputs.positions.at(range.start),
                cu_seqlens_q: inputs.cu_seqlens.at(2 * index),
                kv_starts: inputs.kv_start.ptr(),
                slices: 1,
                total_q: range.len(),
                kv_rows: keys.len() / kvw,
                heads: c.heads,
                kv_heads: c.kv_heads,
                head_dim: c.head_dim,
            };
            let grads_of = AttentionGrads {
                d_out: d_attn.at(range.start * qw),
                dq: dq.at(range.start * qw),
                d_keys,
                d_values,
            };
            if !range.is_empty() {
                gpu.attention_bwd(&slices, &grads_of)?;
            }
            if let (Some(exchange), Some((keys, values, grads))) = (exchange, gathered) {
                drop((keys, values));
                scatter_add_grads(gpu, self.shard, kvw, exchange, &bounds, grads, kv)?;
            }
        }
        // The padding's (zero) query gradients, against zero stand-in keys of the padded
        // sequence's length, as the CPU backend computes them: the same work, no effect.
        if let Some(range) = layout.padding_rows().filter(|rows| !rows.is_empty()) {
            let index = layout.slices.len();
            let sequence = layout.sequence_len() * kvw;
            let stand_in = gpu.zeros(sequence)?;
            let (d_keys, d_values) = (gpu.zeros(sequence)?, gpu.zeros(sequence)?);
            let slices = AttentionSlices {
                q: saved.q.at(range.start * qw),
                keys: stand_in.ptr(),
                values: stand_in.ptr(),
                out: saved.attn.at(range.start * qw),
                lse: saved.lse.at(range.start * c.heads),
                positions: inputs.positions.at(range.start),
                cu_seqlens_q: inputs.cu_seqlens.at(2 * index),
                kv_starts: inputs.kv_start.ptr(),
                slices: 1,
                total_q: range.len(),
                kv_rows: layout.sequence_len(),
                heads: c.heads,
                kv_heads: c.kv_heads,
                head_dim: c.head_dim,
            };
            let grads_of = AttentionGrads {
                d_out: d_attn.at(range.start * qw),
                dq: dq.at(range.start * qw),
                d_keys: d_keys.ptr(),
                d_values: d_values.ptr(),
            };
            gpu.attention_bwd(&slices, &grads_of)?;
        }
        drop(d_attn);
        let dk = gpu.zeros(rows * kvw)?;
        let dv = gpu.zeros(rows * kvw)?;
        for (index, slice) in layout.slices.iter().enumerate() {
            let range = layout.rows_of(index);
            let kv = &self.samples[&slice.sample].layers[local];
            let own = self.rows_before(slice.sample, slice.start) * kvw;
            gpu.copy(
                kv.key_grads.as_ref().expect("allocated"),
                own,
                &dk,
                range.start * kvw,
                range.len() * kvw,
            )?;
            gpu.copy(
                kv.value_grads.as_ref().expect("allocated"),
                own,
                &dv,
                range.start * kvw,
                range.len() * kvw,
            )?;
        }
        // RoPE, the Q/K/V projections and the attention norm.
        let positions = inputs.positions.ptr();
        rope.rotate_qk(gpu, &c, true, dq.ptr(), dk.ptr(), positions, rows)?;
        gpu.linear_weight_grad(saved.normed.ptr(), dq.ptr(), rows, h, qw, g(w.wq))?;
        gpu.linear_weight_grad(saved.normed.ptr(), dk.ptr(), rows, h, kvw, g(w.wk))?;
        gpu.linear_weight_grad(saved.normed.ptr(), dv.ptr(), rows, h, kvw, g(w.wv))?;
        gpu.linear_input_grad(dq.ptr(), p(w.wq), rows, h, qw, 0.0, d_normed.ptr())?;
        gpu.linear_input_grad(dk.ptr(), p(w.wk), rows, h, kvw, 1.0, d_normed.ptr())?;
        gpu.linear_input_grad(dv.ptr(), p(w.wv), rows, h, kvw, 1.0, d_normed.ptr())?;
        drop((dq, dk, dv));
        let dx = gpu.zeros(rows * h)?;
        gpu.rmsnorm_bwd(
            saved.x.ptr(),
            p(w.attn_norm),
            saved.inv_rms.ptr(),
            d_normed.ptr(),
            dx.ptr(),
            g(w.attn_norm),
            rows,
            h,
        )?;
        gpu.add(dx.ptr(), d_mid.ptr(), dx.ptr(), rows * h)?;
        Ok(dx)
    }

    /// Drops the K/V rows of the backwarded tokens; retires samples whose backward finished.
    fn finish_backward(&mut self, gpu: &Gpu, layout: &PackLayout) -> Result<()> {
        let mut new_frontier: BTreeMap<SampleId, usize> = BTreeMap::new();
        for slice in &layout.slices {
            let start = new_frontier.entry(slice.sample).or_insert(slice.start);
            *start = (*start).min(slice.start);
        }
        let kvw = self.config.kv_width();
        for (sample, start) in new_frontier {
            if start == 0 {
                self.samples.remove(&sample);
                self.retired.insert(sample);
                continue;
            }
            let kept = self.rows_before(sample, start) * kvw;
            let entry = self.samples.get_mut(&sample).expect("forwarded");
            entry.frontier = Some(start);
            for kv in &mut entry.layers {
                for buffer in [
                    &mut kv.keys,
                    &mut kv.values,
                    &mut kv.key_grads,
                    &mut kv.value_grads,
                ] {
                    truncate_rows(gpu, buffer, kept)?;
                }
            }
        }
        Ok(())
    }
}

/// All-gathers the keys and values a DP-Merge group holds of `bounds` (a sample's first
/// slices, contiguous from 0, up to the one attending) from every member's cache `kv`, and
/// returns them in position order, `[end, kv_width]` each (`cpu/cp/gather.rs`'s
/// `gather_prefix`, with [`super::cp_rows`]'s runs).
fn gather_prefix(
    gpu: &Gpu,
    shard: CpShard,
    kvw: usize,
    exchange: CpExchange<'_>,
    bounds: &[(usize, usize)],
    kv: &LayerKv,
) -> Result<(DeviceVec, DeviceVec)> {
    // The rows of the positions before the prefix's end: a backward pack may hold later
    // slices too (its cache is longer).
    let held = held_rows(shard, shard.rank, bounds) * kvw;
    let part = gather_part_len(shard, bounds, kvw);
    let mine = gpu.zeros(part)?;
    if let (Some(keys), Some(values)) = (&kv.keys, &kv.values) {
        gpu.copy(keys, 0, &mine, 0, held)?;
        gpu.copy(values, 0, &mine, held, held)?;
    }
    let parts = exchange.all_gather(gpu, &mine, part)?;
    drop(mine);
    let end = prefix_end(bounds) * kvw;
    let (keys, values) = (gpu.zeros(end)?, gpu.zeros(end)?);
    for rank in 0..shard.size {
        let base = rank * part;
        let half = held_rows(shard, rank, bounds) * kvw;
        for run in member_runs(shard, rank, bounds) {
            let (from, to, len) = (base + run.row * kvw, run.position * kvw, run.len * kvw);
            gpu.copy(&parts, from, &keys, to, len)?;
            gpu.copy(&parts, from + half, &values, to, len)?;
        }
    }
    Ok((keys, values))
}

/// Exchanges every member's gradients of the prefix keys and values (`grads`: `[end,
/// kv_width]` keys then values) and adds, in member order, the rows of the positions this
/// member holds into its accumulators (`cpu/cp/gather.rs`'s `scatter_add_grads`; a member with
/// no query in the slice contributes zeros, which add nothing).
fn scatter_add_grads(
    gpu: &Gpu,
    shard: CpShard,
    kvw: usize,
    exchange: CpExchange<'_>,
    bounds: &[(usize, usize)],
    grads: DeviceVec,
    kv: &LayerKv,
) -> Result<()> {
    let part = grads.len();
    let half = part / 2;
    let parts = exchange.all_gather(gpu, &grads, part)?;
    drop(grads);
    let key_grads = kv.key_grads.as_ref().expect("allocated");
    let value_grads = kv.value_grads.as_ref().expect("allocated");
    let runs = member_runs(shard, shard.rank, bounds);
    for rank in 0..shard.size {
        let base = rank * part;
        for run in &runs {
            let (to, from, len) = (run.row * kvw, base + run.position * kvw, run.len * kvw);
            let (keys_to, values_to) = (key_grads.at(to), value_grads.at(to));
            gpu.add(keys_to, parts.at(from), keys_to, len)?;
            gpu.add(values_to, parts.at(from + half), values_to, len)?;
        }
    }
    Ok(())
}

/// Grows `buffer` by `len` values copied from `source` at `from` (exactly the new size, as the
/// CPU backend reserves exactly the rows held).
fn append_rows(
    gpu: &Gpu,
    buffer: &mut Option<DeviceVec>,
    source: &DeviceVec,
    from: usize,
    len: usize,
) -> Result<()> {
    let old = buffer.take();
    let old_len = old.as_ref().map_or(0, DeviceVec::len);
    let grown = gpu.zeros(old_len + len)?;
    if let Some(old) = &old {
        gpu.copy(old, 0, &grown, 0, old_len)?;
    }
    gpu.copy(source, from, &grown, old_len, len)?;
    *buffer = Some(grown);
    Ok(())
}

/// Shrinks `buffer` to its first `len` values.
fn truncate_rows(gpu: &Gpu, buffer: &mut Option<DeviceVec>, len: usize) -> Result<()> {
    let Some(old) = buffer.take() else {
        return Ok(());
    };
    let kept = gpu.zeros(len.min(old.len()))?;
    gpu.copy(&old, 0, &kept, 0, kept.len())?;
    *buffer = Some(kept);
    Ok(())
}
