//! The machine model: what a slice, a pack, a transfer, a gradient sync and an optimizer step
//! cost in FLOPs, seconds and bytes — pure functions over the [`Spec`], used by the passes to
//! balance packs and by the simulator to time its tasks.
//!
//! [`CostModel::new`] precomputes every per-spec constant once; the per-call functions then do a
//! few multiplications per slice, so they can run millions of times per compile.
//!
//! How a pack's time is composed ([`CostModel::pack_time`]), on one device of a stage (the
//! per-slice sums, [`PackWork`], are the same on every stage: callers timing a pack on many
//! stages compute them once with [`CostModel::pack_work`]):
//! - GEMMs: executed FLOPs (`flops.rs`) of the stage's layers (+ the output projection on the last
//!   stage) over `tp` devices, at the achieved GEMM rate for the pack's token count
//!   (`efficiency.rs`); recomputed forward GEMMs run at the forward rate.
//! - Attention: per slice, its FLOPs at the attention rate for its query length; all of a pack's
//!   slices share one varlen call per layer.
//! - Element-wise kernels: HBM bytes (`traffic.rs`) over achieved bandwidth.
//! - Kernel overheads: a fixed cost per kernel ([`KERNELS_PER_LAYER_FORWARD`] and friends).
//! - TP collectives (sequence parallelism): reported apart, exposed (serial with compute).
//! - CP exchange: reported apart; it can hide behind the attention kernels.
//!
//! Under context parallelism (`cp` DP-merged replicas, times the layout's static CP degree) the
//! pack's tokens and attention work split evenly over the CP group (a load-balanced causal
//! split, as Megatron's CP does), and the ring K/V exchange runs over the group's link
//! (`comm.rs`). Memory lives in [`MemoryModel`]. `bound.rs` bounds the simulated step time of
//! any schedule of a batch from below ([`CostModel::step_time_lower_bound`]), for the tuner's
//! pruning. Every constant names its source in the file that
//! defines it; [`CostModel::constants`] gathers them for reports.

mod bound;
mod calibration;
mod comm;
mod efficiency;
mod flops;
mod memory;
mod optimizer;
mod traffic;

#[cfg(test)]
mod tests;

pub use bound::BatchAttention;
pub use calibration::{Calibration, CalibrationPoint, CalibrationTable};
pub use comm::{
    all_gather_time, all_reduce_time, p2p_time, reduce_scatter_time, CommModel, DpSyncTime,
    Topology, CP_BACKWARD_RING_PASSES, LOSS_ALL_REDUCES, TP_COLLECTIVES_PER_LAYER,
};
pub use efficiency::{DeviceKind, DeviceProfile, OpKind, SaturatingCurve, Throughput};
pub use flops::{
    causal_pairs, gemm_params_per_layer, recomputed_forward, DirectionFactors, FlopModel, Flops,
    BACKWARD_ATTENTION_FACTOR, BACKWARD_LINEAR_FACTOR, MODEL_FLOPS_PER_FORWARD_FLOP,
};
pub use memory::{
    CpuTemporaries, MemoryModel, ADAM_STATE_BYTES, CPU_GEMM_BLOCKING, CPU_POSITION_BYTES,
    DEFAULT_MEMORY_LIMIT, GPU_WORKSPACE_BYTES, KV_GRAD_BYTES, LOSS_SOFTMAX_BYTES, LSE_BYTES,
    MAIN_GRAD_BYTES, MASTER_WEIGHT_BYTES,
};
pub use optimizer::{optimizer_bytes, ADAM_BYTES_PER_SHARD_PARAM, ZERO_GRAD_BYTES_PER_PARAM};
pub use traffic::{Traffic, BACKWARD_ELEMENTWISE_FACTOR};

use serde::Serialize;

use crate::error::{MachineError, Result};
use slimpack_ir::spec::{Dtype, LinkSpec, Recompute, RecomputeMix, Spec};
use slimpack_ir::step::{Direction, Part};

/// Compute kernels of one layer's forward in a Megatron-Core + Transformer Engine layer: two
/// RMSNorms, the QKV GEMM, RoPE, attention, the output-projection GEMM, a residual add, the
/// gate/up GEMM, SwiGLU, the down GEMM, a residual add (collectives are costed in `comm.rs`).
pub const KERNELS_PER_LAYER_FORWARD: f64 = 11.0;

/// Compute kernels of one layer's backward: two GEMMs per forward GEMM (8), two norm backwards
/// and their weight-gradient reductions (4), RoPE, attention backward with its pre- and
/// post-processing kernels (3), SwiGLU, two gradient accumulations for the residuals (2).
pub const KERNELS_PER_LAYER_BACKWARD: f64 = 19.0;

/// Of [`KERNELS_PER_LAYER_BACKWARD`], the weight-gradient GEMMs of one layer (QKV, output
/// projection, gate/up, down): the kernels a zero-bubble schedule's deferred weight-gradient
/// part ([`Part::WeightGrad`]) launches; the output projection adds one on the last stage.
pub const WEIGHT_GRAD_KERNELS_PER_LAYER: f64 = 4.0;

/// Kernels outside the layers: embedding lookup (first stage); final norm, output GEMM and the
/// cross-entropy's kernels (last stage), in each direction.
pub const EMBEDDING_KERNELS: f64 = 1.0;
/// See [`EMBEDDING_KERNELS`].
pub const HEAD_KERNELS: f64 = 8.0;

/// The time of one pack on one device of a stage, by stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PackTime {
    /// Compute stream: GEMMs, attention, element-wise kernels and kernel overheads, recomputation
    /// included.
    pub compute_s: f64,
    /// The attention kernels' share of `compute_s` (the window a CP exchange can hide in).
    pub attention_s: f64,
    /// The GEMMs' share of `compute_s` (the window TP collectives overlap with).
    pub gemm_s: f64,
    /// The memory-bound element-wise kernels' share of `compute_s` (norms, RoPE, activations,
    /// residuals, embedding, loss).
    pub elementwise_s: f64,
    /// The fixed per-kernel launch overheads' share of `compute_s`.
    pub kernel_overhead_s: f64,
    /// Sequence-parallel TP collectives (all-gather / reduce-scatter), before overlap.
    pub tp_comm_s: f64,
    /// The part of `tp_comm_s` the GEMMs do not hide ([`exposed_tp_comm`]).
    pub tp_exposed_s: f64,
    /// CP ring K/V exchange of a merged group (0 without CP); overlappable with attention.
    pub cp_comm_s: f64,
}

/// Where a stage sits in the pipeline: the first holds the embedding, the last the output
/// projection and the loss, and every stage holds the same number of layers. A slice's FLOPs
/// on a stage ([`CostModel::stage_part_flops`]) and a pack's memory on it (the per-stage
/// functions of [`MemoryModel`]) depend on the stage through its ends only, so callers may
/// compute them once per pack for all the stages with the same ends (a test checks it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StageEnds {
    pub first: bool,
    pub last: bool,
}

impl StageEnds {
    /// A dense index in `0..4`.
    pub fn index(self) -> usize {
        usize::from(self.first) * 2 + usize::from(self.last)
    }
}

/// Stages alike for timing a replica's packs ([`CostModel::alike_stages`]): per stage, the
/// first stage with the same pack times, and the first with the same CP exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlikeStages {
    pub times: Vec<u32>,
    pub exchange: Vec<u32>,
}

/// The sums over a pack's slices that its time depends on, on any stage and under any
/// recomputation mode: its tokens, its keys (prefix plus length of every slice) and one
/// layer's attention kernel seconds on one device. A pack runs on every stage of its replica
/// with the same slices, so [`CostModel::pack_work`] walks the slices once and
/// [`CostModel::work_part_time_on`] times each stage from the sums (with the stage's mode), the
/// same figures as [`CostModel::pack_part_time_on`] to the bit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PackWork {
    direction: Direction,
    /// DP replicas merged into the CP group that runs the pack (1: no merge).
    merged: u32,
    tokens: u64,
    keys: u64,
    /// One layer's attention kernels on one device: the forward's, and (for a backward pack)
    /// the backward kernels' alone — the recomputed forward a backward replays depends on the
    /// recomputation mode, so [`CostModel::work_part_time_on`] adds it with its own mode, and a
    /// pack's work is the same under every stage's mode.
    attention_forward_layer_s: f64,
    attention_backward_layer_s: f64,
}

impl PackTime {
    /// Compute plus the exposed TP collectives plus whatever CP exchange the attention kernels
    /// cannot hide.
    pub fn critical_path_s(&self) -> f64 {
        self.compute_s + self.tp_exposed_s + self.cp_exposed_s()
    }

    /// The part of the CP exchange the attention kernels cannot hide.
    pub fn cp_exposed_s(&self) -> f64 {
        (self.cp_comm_s - self.attention_s).max(0.0)
    }
}

/// The exposed part of `tp_comm_s` TP-collective seconds next to `gemm_s` GEMM seconds.
/// Megatron-Core on Hopper overlaps them with the GEMMs that consume or produce them
/// (`--tp-comm-overlap`, Transformer Engine userbuffers: each all-gather / reduce-scatter is
/// split into `tp` ring steps, each hidden behind the partial GEMM of the previous step; Wang et
/// al., "Overlap Communication with Dependent Computation via Decomposition in Large Deep
/// Learning Models", ASPLOS 2023). The first of the `tp` steps stays exposed, and whatever the
/// GEMMs are too short to hide.
pub fn exposed_tp_comm(tp_comm_s: f64, gemm_s: f64, tp: u32) -> f64 {
    if tp <= 1 {
        return tp_comm_s;
    }
    let first_step = tp_comm_s / f64::from(tp);
    first_step + (tp_comm_s - first_step - gemm_s).max(0.0)
}

/// Cost model of one spec: FLOPs, times and memory.
#[derive(Debug, Clone)]
pub struct CostModel {
    spec: Spec,
    flops: FlopModel,
    throughput: Throughput,
    traffic: Traffic,
    comm: CommModel,
    memory: MemoryModel,
    layers_per_stage: u32,
    tp: f64,
}

impl CostModel {
    /// The analytic model of `spec`.
    pub fn new(spec: &Spec) -> CostModel {
        let throughput = Throughput::analytic(&spec.cluster, spec.model.dtype);
        CostModel {
            spec: spec.clone(),
            flops: FlopModel::new(&spec.model, spec.layers_per_chunk()),
            throughput,
            traffic: Traffic::new(&spec.model, spec.parallel.tp, spec.layers_per_chunk()),
            comm: CommModel::new(spec),
            memory: MemoryModel::new(spec),
            layers_per_stage: spec.layers_per_stage(),
            tp: f64::from(spec.parallel.tp),
        }
    }

    /// The model of `spec` with measured tables replacing the analytic curves they cover; the
    /// calibration must have been measured on the cluster's device.
    pub fn with_calibration(spec: &Spec, calibration: Calibration) -> Result<CostModel> {
        if calibration.device != spec.cluster.gpu.name {
            return Err(MachineError::calibration(
                "calibration",
                format!(
                    "measured on '{}' but cluster '{}' has '{}'",
                    calibration.device, spec.cluster.name, spec.cluster.gpu.name
                ),
            ));
        }
        // A kernel cannot run faster than the device: a rate above its peak FLOP/s (or, for
        // memory-bound kernels, its HBM bandwidth) is not a measurement.
        let gpu = &spec.cluster.gpu;
        for (op, table) in &calibration.tables {
            let (peak, unit) = match op {
                OpKind::Elementwise => (gpu.hbm_bandwidth, "bytes/s, the HBM bandwidth"),
                _ => (gpu.peak_flops, "FLOP/s, the peak"),
            };
            if let Some(point) = table.points().iter().find(|point| point.rate > peak) {
                return Err(MachineError::calibration(
                    "calibration",
                    format!(
                        "{} at {} tokens: rate {:.3e} is above the {:.3e} {unit} of '{}'",
                        op.as_str(),
                        point.tokens,
                        point.rate,
                        peak,
                        gpu.name
                    ),
                ));
            }
        }
        let mut model = CostModel::new(spec);
        model.throughput = model.throughput.calibrated(&calibration);
        Ok(model)
    }

    /// This model with activation recomputation switched off (the same rates, measured ones
    /// included): what a step's work costs when nothing is recomputed. The simulator's useful
    /// ideal and floor are priced with it.
    pub fn without_recompute(&self) -> CostModel {
        self.with_recompute(Recompute::None)
    }

    /// This model with the recomputation `mode` in place of the model's (the same rates,
    /// measured ones included): how the simulator prices and sizes a stage that runs a mode
    /// of its own (`slimpack_ir::step::Stage::recompute`).
    pub fn with_recompute(&self, mode: Recompute) -> CostModel {
        let mut spec = self.spec.clone();
        spec.model.recompute = mode;
        CostModel {
            throughput: self.throughput.clone(),
            ..CostModel::new(&spec)
        }
    }

    /// The spec this model describes.
    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    /// FLOP coefficients.
    pub fn flop_model(&self) -> &FlopModel {
        &self.flops
    }

    /// Achieved-rate curves.
    pub fn throughput(&self) -> &Throughput {
        &self.throughput
    }

    /// Communication volumes and links.
    pub fn comm(&self) -> &CommModel {
        &self.comm
    }

    /// Memory model.
    pub fn memory(&self) -> &MemoryModel {
        &self.memory
    }

    /// Executed FLOPs of a slice in *one transformer layer* (whole layer, all TP ranks
    /// together), recomputation included. Multiply by a stage's layers, or use
    /// [`CostModel::stage_flops`].
    pub fn slice_flops(&self, len: u64, prefix: u64, direction: Direction) -> Flops {
        self.flops.layer(len, prefix, direction)
    }

    /// Executed FLOPs of a slice on `stage` (all its layers, plus the output projection on the
    /// last stage), all TP ranks together.
    pub fn stage_flops(&self, stage: u32, len: u64, prefix: u64, direction: Direction) -> Flops {
        let mut flops = self.flops.layer(len, prefix, direction) * f64::from(self.layers_per_stage);
        if self.is_last(stage) {
            flops.linear += self.flops.head(len, direction);
        }
        flops
    }

    /// Model FLOPs of a slice through the whole model, forward and backward, no recomputation:
    /// the MFU numerator (see [`MODEL_FLOPS_PER_FORWARD_FLOP`]).
    pub fn model_flops(&self, len: u64, prefix: u64) -> f64 {
        self.flops.model_flops(self.spec.model.layers, len, prefix)
    }

    /// Time of a pack of `(len, prefix)` slices on `stage` in `direction`, run by `cp` merged
    /// DP replicas (1: one replica). Under CP the ring ships the K/V of every slice's keys,
    /// prefix included (a merged sample's K/V store is sharded over the group). The merged replicas are taken to be the aligned block of
    /// `cp` neighbouring replicas (the usual placement); [`CostModel::pack_time_on`] names them.
    pub fn pack_time(
        &self,
        stage: u32,
        slices: &[(u64, u64)],
        direction: Direction,
        cp: u32,
    ) -> PackTime {
        let members = 0..cp.max(1);
        let link = self.comm.topology().replicas_link(stage, members);
        self.pack_time_with(stage, slices, direction, cp.max(1), &link)
    }

    /// Time of a pack run by the DP replicas `dp_members` of `stage` merged into one CP group
    /// (one member: no merge).
    pub fn pack_time_on(
        &self,
        stage: u32,
        slices: &[(u64, u64)],
        direction: Direction,
        dp_members: &[u32],
    ) -> PackTime {
        let link = self.members_link(stage, dp_members);
        self.pack_time_with(stage, slices, direction, merged_count(dp_members), &link)
    }

    /// Time of `part` of a pack's work (see [`Part`]) on `stage`, run by the DP replicas
    /// `dp_members`: [`CostModel::pack_time_on`] for a whole op. A backward splits into its
    /// weight gradient — the weight-gradient GEMMs (half of the backward's non-recomputed GEMM
    /// FLOPs, the output projection's included) and their kernel launches — and its input
    /// gradient, the rest: attention backward, the activation-gradient GEMMs, recomputation,
    /// the element-wise kernels, the TP collectives and the CP exchange. The input gradient
    /// exposes its TP collectives against its own GEMMs, so B + W can exceed the whole
    /// backward by the TP time the weight-gradient GEMMs no longer hide.
    pub fn pack_part_time_on(
        &self,
        stage: u32,
        slices: &[(u64, u64)],
        direction: Direction,
        part: Part,
        dp_members: &[u32],
    ) -> PackTime {
        let work = self.pack_work(slices, direction, merged_count(dp_members));
        self.work_part_time_on(stage, &work, part, dp_members)
    }

    /// The sums over `slices` a pack's time needs on every stage (see [`PackWork`]), for a
    /// pack run by `merged` DP replicas merged into one CP group.
    pub fn pack_work(&self, slices: &[(u64, u64)], direction: Direction, merged: u32) -> PackWork {
        let merged = merged.max(1);
        let split = f64::from(merged * self.spec.parallel.cp_degree());
        let (mut tokens, mut keys) = (0u64, 0u64);
        let (mut attention_forward_layer_s, mut attention_backward_layer_s) = (0.0, 0.0);
        for &(len, prefix) in slices {
            tokens += len;
            keys += prefix + len;
            let work = self.flops.attention_per_pair() * causal_pairs(len, prefix) as f64;
            let (work, query_len) = (work / (self.tp * split), len as f64 / split);
            attention_forward_layer_s +=
                self.throughput
                    .time(OpKind::AttentionForward, work, query_len);
            if direction == Direction::Backward {
                attention_backward_layer_s += self.throughput.time(
                    OpKind::AttentionBackward,
                    BACKWARD_ATTENTION_FACTOR * work,
                    query_len,
                );
            }
        }
        PackWork {
            direction,
            merged,
            tokens,
            keys,
            attention_forward_layer_s,
            attention_backward_layer_s,
        }
    }

    /// [`CostModel::pack_part_time_on`] of a pack whose slices `work` sums, run by the DP
    /// replicas `dp_members` (as many as `work` was summed for).
    pub fn work_part_time_on(
        &self,
        stage: u32,
        work: &PackWork,
        part: Part,
        dp_members: &[u32],
    ) -> PackTime {
        debug_assert_eq!(
            work.merged,
            merged_count(dp_members),
            "a pack's work is summed for the replicas that run it (bug in the caller)"
        );
        let link = self.members_link(stage, dp_members);
        let whole = self.work_time_with(stage, work, &link);
        let direction = work.direction;
        if part == Part::Whole || direction == Direction::Forward {
            return whole;
        }
        let merged = dp_members.len().max(1) as f64;
        let split = merged * f64::from(self.spec.parallel.cp_degree());
        let tokens = work.tokens as f64 / split;
        let weight = self.weight_grad_time(stage, tokens);
        match part {
            Part::WeightGrad => weight,
            _ => {
                let gemm_s = whole.gemm_s - weight.gemm_s;
                PackTime {
                    compute_s: whole.compute_s - weight.compute_s,
                    gemm_s,
                    kernel_overhead_s: whole.kernel_overhead_s - weight.kernel_overhead_s,
                    tp_exposed_s: exposed_tp_comm(whole.tp_comm_s, gemm_s, self.spec.parallel.tp),
                    ..whole
                }
            }
        }
    }

    /// The weight-gradient part of a backward of `tokens` tokens per device on `stage`.
    fn weight_grad_time(&self, stage: u32, tokens: f64) -> PackTime {
        let last = self.is_last(stage);
        let layers = f64::from(self.layers_per_stage);
        let mut flops = self.flops.linear_per_token() * layers * tokens / self.tp;
        let mut kernels = WEIGHT_GRAD_KERNELS_PER_LAYER * layers;
        if last {
            flops += self.flops.head_per_token() * tokens / self.tp;
            kernels += 1.0;
        }
        let gemm_s = self.throughput.time(OpKind::GemmBackward, flops, tokens);
        let kernel_overhead_s = kernels * self.throughput.profile().kernel_overhead_s;
        PackTime {
            compute_s: gemm_s + kernel_overhead_s,
            gemm_s,
            kernel_overhead_s,
            ..PackTime::default()
        }
    }

    /// Executed FLOPs of `part` of a slice's work on `stage` (see
    /// [`CostModel::pack_part_time_on`]): the weight gradient is one forward's GEMM FLOPs (no
    /// recomputation), the input gradient the rest of the backward.
    pub fn stage_part_flops(
        &self,
        stage: u32,
        len: u64,
        prefix: u64,
        direction: Direction,
        part: Part,
    ) -> Flops {
        let whole = self.stage_flops(stage, len, prefix, direction);
        if part == Part::Whole || direction == Direction::Forward {
            return whole;
        }
        let mut weight = self.flops.layer(len, prefix, Direction::Forward).linear
            * f64::from(self.layers_per_stage);
        if self.is_last(stage) {
            weight += self.flops.head(len, Direction::Forward);
        }
        match part {
            Part::WeightGrad => Flops {
                linear: weight,
                attention: 0.0,
            },
            _ => Flops {
                linear: whole.linear - weight,
                attention: whole.attention,
            },
        }
    }

    /// Pipeline send of a pack's activations (forward) or their gradients (backward) between
    /// two ranks; `tokens` is what the sending TP group holds (the pack's tokens, divided by the
    /// CP degree under CP).
    pub fn send_time(&self, tokens: u64, from_rank: u64, to_rank: u64) -> f64 {
        self.comm.send_time(tokens as f64, from_rank, to_rank)
    }

    /// DP gradient sync of pipeline device `device` (every model chunk it holds) over the
    /// replicas `dp_members` (normally all `dp`): gradient reduce-scatter plus parameter
    /// all-gather; see [`CostModel::dp_sync`] for the halves.
    pub fn dp_sync_time(&self, device: u32, dp_members: &[u32]) -> f64 {
        self.dp_sync(device, dp_members).total_s()
    }

    /// The two halves of the DP gradient sync of pipeline device `device` over `dp_members`.
    pub fn dp_sync(&self, device: u32, dp_members: &[u32]) -> DpSyncTime {
        let group = dp_members.len() as u32 * self.spec.parallel.cp_degree();
        let link = self
            .comm
            .topology()
            .replicas_link(device, dp_members.iter().copied());
        let params = self.memory.device_params(device) as f64;
        let dtype = self.spec.model.dtype.bytes() as f64;
        self.comm.dp_sync(params, dtype, group, &link)
    }

    /// Optimizer step of one device of pipeline device `device`: Adam over its
    /// distributed-optimizer shard and zeroing its gradient buffer, at achieved HBM bandwidth.
    pub fn optimizer_time(&self, device: u32) -> f64 {
        let parallel = &self.spec.parallel;
        let shards = u64::from(parallel.dp) * u64::from(parallel.cp_degree());
        let local = self.memory.device_params(device);
        let copy = match self.spec.model.dtype {
            Dtype::Fp32 => 0,
            dtype => dtype.bytes(),
        };
        let bytes = optimizer_bytes(local.div_ceil(shards), local, copy) as f64;
        self.throughput
            .time(OpKind::Elementwise, bytes, local as f64)
    }

    /// The constants in use, for reports.
    pub fn constants(&self) -> CostConstants {
        let curve = |op| {
            self.throughput
                .curve(op)
                .expect("compute kinds have curves")
        };
        let profile = self.throughput.profile();
        CostConstants {
            device_kind: profile.kind,
            peak_flops: self.spec.cluster.gpu.peak_flops,
            hbm_bandwidth: self.spec.cluster.gpu.hbm_bandwidth,
            gemm_forward: curve(OpKind::GemmForward),
            gemm_backward: curve(OpKind::GemmBackward),
            attention_forward: curve(OpKind::AttentionForward),
            attention_backward: curve(OpKind::AttentionBackward),
            hbm_efficiency: profile.hbm_efficiency,
            kernel_overhead_s: profile.kernel_overhead_s,
            kernels_per_layer_forward: KERNELS_PER_LAYER_FORWARD,
            kernels_per_layer_backward: KERNELS_PER_LAYER_BACKWARD,
            backward_linear_factor: BACKWARD_LINEAR_FACTOR,
            backward_attention_factor: BACKWARD_ATTENTION_FACTOR,
            linear_flops_per_token_layer: self.flops.linear_per_token(),
            attention_flops_per_pair_layer: self.flops.attention_per_pair(),
            head_flops_per_token: self.flops.head_per_token(),
            elementwise_bytes_per_token_layer: self.traffic.layer(Direction::Forward),
            activation_bytes_per_token_layer: self.memory.activation_bytes_per_token_layer(),
            workspace_bytes: self.memory.workspace_bytes(),
            calibrated: OpKind::ALL
                .into_iter()
                .filter(|&op| self.throughput.is_calibrated(op))
                .collect(),
        }
    }

    fn pack_time_with(
        &self,
        stage: u32,
        slices: &[(u64, u64)],
        direction: Direction,
        merged: u32,
        cp_link: &LinkSpec,
    ) -> PackTime {
        let work = self.pack_work(slices, direction, merged);
        self.work_time_with(stage, &work, cp_link)
    }

    /// A whole pack's time on `stage` from its slices' sums, its CP ring over `cp_link`. It
    /// depends on the stage through its ends and `cp_link` only ([`CostModel::alike_stages`]).
    fn work_time_with(&self, stage: u32, work: &PackWork, cp_link: &LinkSpec) -> PackTime {
        let direction = work.direction;
        let split = f64::from(work.merged * self.spec.parallel.cp_degree());
        let attention_s = self.work_attention_s(work, direction);
        let tokens = work.tokens as f64 / split;
        let (first, last) = (stage == 0, self.is_last(stage));
        let gemm_s = self.linear_time(tokens, last, direction);
        let elementwise_s = self.elementwise_time(tokens, first, last, direction);
        let kernel_overhead_s = self.kernel_overhead(first, last, direction);
        let compute_s = attention_s + gemm_s + elementwise_s + kernel_overhead_s;
        let layers = f64::from(self.layers_per_stage);
        let tp_comm_s = layers * self.comm.tp_layer_time(tokens, direction)
            + self.comm.tp_edges_time(tokens, first, last, direction);
        let cp_comm_s = self.cp_exchange_s(work.keys, work.merged, cp_link, direction);
        PackTime {
            compute_s,
            attention_s,
            gemm_s,
            elementwise_s,
            kernel_overhead_s,
            tp_comm_s,
            tp_exposed_s: exposed_tp_comm(tp_comm_s, gemm_s, self.spec.parallel.tp),
            cp_comm_s,
        }
    }

    /// The attention seconds of the stage's layers in a pack of `direction` whose slices
    /// `work` sums (a backward `work` for a backward; any for a forward, whose sums every
    /// `work` holds). The backward replays the share of the forward attention its
    /// recomputation drops.
    fn work_attention_s(&self, work: &PackWork, direction: Direction) -> f64 {
        let attention_layer_s = match direction {
            Direction::Forward => work.attention_forward_layer_s,
            Direction::Backward => {
                let (_, replayed) = recomputed_forward(self.recompute_mix());
                work.attention_backward_layer_s + replayed * work.attention_forward_layer_s
            }
        };
        f64::from(self.layers_per_stage) * attention_layer_s
    }

    /// The CP ring exchange of the stage's layers for a pack of `keys` keys (prefix plus
    /// length of every slice) run by `merged` DP replicas merged into one CP group, over
    /// `cp_link`.
    fn cp_exchange_s(
        &self,
        keys: u64,
        merged: u32,
        cp_link: &LinkSpec,
        direction: Direction,
    ) -> f64 {
        let cp = merged * self.spec.parallel.cp_degree();
        let keys_per_device = keys as f64 / f64::from(cp);
        f64::from(self.layers_per_stage)
            * self
                .comm
                .cp_layer_time(keys_per_device, cp, cp_link, direction)
    }

    /// A slice's attention seconds in a pack run by the DP replicas `dp_members`, forward and
    /// backward: [`PackTime::attention_s`] of a pack of that slice alone, on any stage (it
    /// does not depend on the stage), for the price of the attention alone.
    pub fn slice_attention_s(&self, len: u64, prefix: u64, dp_members: &[u32]) -> [f64; 2] {
        let work = self.pack_work(
            &[(len, prefix)],
            Direction::Backward,
            merged_count(dp_members),
        );
        [Direction::Forward, Direction::Backward]
            .map(|direction| self.work_attention_s(&work, direction))
    }

    /// [`PackTime::cp_comm_s`] of a pack of `keys` keys on `stage`, run by the DP replicas
    /// `dp_members` (the exchange depends on the keys alone, not on how slices share them).
    pub fn cp_exchange_on(
        &self,
        stage: u32,
        keys: u64,
        direction: Direction,
        dp_members: &[u32],
    ) -> f64 {
        let link = self.members_link(stage, dp_members);
        self.cp_exchange_s(keys, merged_count(dp_members), &link, direction)
    }

    /// The link the CP group of the DP replicas `dp_members` uses on `stage`.
    fn members_link(&self, stage: u32, dp_members: &[u32]) -> LinkSpec {
        self.comm
            .topology()
            .replicas_link(stage, dp_members.iter().copied())
    }

    /// For packs run by the DP replicas `dp_members`, per pipeline stage: the first stage
    /// on which every pack takes the same time ([`PackTime`], whole or in parts: the same
    /// ends and CP link), and the first on which the CP exchange does (the same link).
    /// Callers that time a pack on every stage compute it once per distinct stage.
    pub fn alike_stages(&self, dp_members: &[u32]) -> AlikeStages {
        let stages = self.spec.parallel.stages();
        let links: Vec<LinkSpec> = (0..stages)
            .map(|stage| self.members_link(stage, dp_members))
            .collect();
        let first_like = |same: &dyn Fn(u32, u32) -> bool| -> Vec<u32> {
            (0..stages)
                .map(|stage| {
                    (0..=stage)
                        .find(|&other| same(other, stage))
                        .unwrap_or(stage)
                })
                .collect()
        };
        AlikeStages {
            times: first_like(&|a, b| {
                self.stage_ends(a) == self.stage_ends(b) && links[a as usize] == links[b as usize]
            }),
            exchange: first_like(&|a, b| links[a as usize] == links[b as usize]),
        }
    }

    /// GEMM seconds of the stage's layers (and output projection) for `tokens` tokens.
    fn linear_time(&self, tokens: f64, last: bool, direction: Direction) -> f64 {
        let layers = f64::from(self.layers_per_stage);
        let mut forward = self.flops.linear_per_token() * layers * tokens / self.tp;
        if last {
            forward += self.flops.head_per_token() * tokens / self.tp;
        }
        let forward_s = self.throughput.time(OpKind::GemmForward, forward, tokens);
        match direction {
            Direction::Forward => forward_s,
            Direction::Backward => {
                let backward = BACKWARD_LINEAR_FACTOR * forward;
                let (replayed, _) = recomputed_forward(self.recompute_mix());
                let replay = if replayed > 0.0 {
                    let layer_work =
                        replayed * self.flops.linear_per_token() * layers * tokens / self.tp;
                    self.throughput
                        .time(OpKind::GemmForward, layer_work, tokens)
                } else {
                    0.0
                };
                self.throughput.time(OpKind::GemmBackward, backward, tokens) + replay
            }
        }
    }

    fn elementwise_time(&self, tokens: f64, first: bool, last: bool, direction: Direction) -> f64 {
        let mut per_token = self.traffic.layer(direction) * f64::from(self.layers_per_stage);
        if first {
            per_token += self.traffic.embedding(direction);
        }
        if last {
            per_token += self.traffic.head(direction);
        }
        self.throughput
            .time(OpKind::Elementwise, per_token * tokens, tokens)
    }

    fn kernel_overhead(&self, first: bool, last: bool, direction: Direction) -> f64 {
        let per_layer = match direction {
            Direction::Forward => KERNELS_PER_LAYER_FORWARD,
            Direction::Backward => {
                let mix = self.recompute_mix();
                KERNELS_PER_LAYER_BACKWARD + mix.selective + mix.full * KERNELS_PER_LAYER_FORWARD
            }
        };
        let mut kernels = per_layer * f64::from(self.layers_per_stage);
        if first {
            kernels += EMBEDDING_KERNELS;
        }
        if last {
            kernels += HEAD_KERNELS;
        }
        kernels * self.throughput.profile().kernel_overhead_s
    }

    /// The model's recomputation over the layers of one model chunk.
    pub fn recompute_mix(&self) -> RecomputeMix {
        self.spec.model.recompute.mix(self.spec.layers_per_chunk())
    }

    fn is_last(&self, stage: u32) -> bool {
        stage + 1 == self.spec.parallel.stages()
    }

    /// The ends of the pipeline `stage` holds (see [`StageEnds`]).
    pub fn stage_ends(&self, stage: u32) -> StageEnds {
        StageEnds {
            first: stage == 0,
            last: self.is_last(stage),
        }
    }
}

/// The constants a cost model uses, for reports (`--report json` can print this as is).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CostConstants {
    /// Family of the device, which picks the analytic constants.
    pub device_kind: DeviceKind,
    /// Datasheet peak FLOP/s.
    pub peak_flops: f64,
    /// Datasheet HBM bandwidth, bytes/s.
    pub hbm_bandwidth: f64,
    /// Forward GEMM efficiency vs tokens per pack (per device).
    pub gemm_forward: SaturatingCurve,
    /// Backward GEMM efficiency vs tokens per pack (per device).
    pub gemm_backward: SaturatingCurve,
    /// Forward attention efficiency vs a slice's query length.
    pub attention_forward: SaturatingCurve,
    /// Backward attention efficiency vs a slice's query length.
    pub attention_backward: SaturatingCurve,
    /// Achieved fraction of HBM bandwidth in element-wise kernels.
    pub hbm_efficiency: f64,
    /// Fixed cost per kernel, seconds.
    pub kernel_overhead_s: f64,
    /// Compute kernels per layer, forward.
    pub kernels_per_layer_forward: f64,
    /// Compute kernels per layer, backward (without recomputation).
    pub kernels_per_layer_backward: f64,
    /// Backward over forward FLOPs of the GEMMs.
    pub backward_linear_factor: f64,
    /// Backward over forward FLOPs of attention.
    pub backward_attention_factor: f64,
    /// Forward GEMM FLOPs per token per layer (`2 · P_gemm`).
    pub linear_flops_per_token_layer: f64,
    /// Forward attention FLOPs per causal pair per layer (`4 · heads · head_dim`).
    pub attention_flops_per_pair_layer: f64,
    /// Forward FLOPs per token of the output projection (`2 · hidden · vocab`).
    pub head_flops_per_token: f64,
    /// Forward element-wise HBM bytes per token per layer, per device.
    pub elementwise_bytes_per_token_layer: f64,
    /// Saved activation bytes per token per layer, per device (K/V excluded).
    pub activation_bytes_per_token_layer: f64,
    /// Fixed memory allowance per device.
    pub workspace_bytes: u64,
    /// Op kinds whose analytic curve a calibration table replaced.
    pub calibrated: Vec<OpKind>,
}

/// How many DP replicas a pack run by `dp_members` merges into its CP group (1: no merge).
fn merged_count(dp_members: &[u32]) -> u32 {
    u32::try_from(dp_members.len().max(1)).expect("fewer than 2^32 replicas")
}
