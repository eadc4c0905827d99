//! Memory: bytes per device of model states, saved activations, per-sample K/V and K/V-gradient
//! retention, per-pack temporaries and a fixed workspace — the pieces the simulator stacks into
//! a memory timeline.
//!
//! Contract: every function returns bytes on *one device* of a stage's TP group. Token counts
//! are the tokens that device's TP group holds: under context parallelism (a DP-Merge group of
//! k replicas, or a static CP degree) pass `tokens / cp`. Activation, K/V and K/V-gradient bytes
//! are additive over slices (each rounds up to whole bytes on its own).
//!
//! - Model states, mixed precision with Megatron's distributed optimizer (Megatron-LM
//!   `docs/source/api-guide/dist_optimizer.md`, "6 + 12/d bytes per parameter" for bf16
//!   parameters with fp32 gradients; ZeRO stage 1, Rajbhandari et al. 2020): bf16 weights (2 B)
//!   and fp32 main gradients (4 B) on every device; fp32 master weights and Adam's m and v
//!   (12 B) sharded over the stage's data-parallel group (`dp × static cp` devices, which hold
//!   the same weights). fp32 models keep no master copy (8 B of Adam state sharded). Matrices
//!   are split over TP; RMSNorm weights are replicated (sequence parallelism).
//! - Activations saved from a slice's forward to its backward, per token per layer. Korthikanti
//!   et al. 2022 give `sbh(34 + 5as/h)` bytes per layer for GPT (4h MLP, dropout) without
//!   FlashAttention, `÷ tp` with TP + SP; FlashAttention removes the `5as/h` term (no score
//!   matrix is stored). Re-deriving the `34` for this Llama shape, tensor by tensor
//!   (`b` = dtype bytes, all `÷ tp`): both RMSNorm inputs and outputs `4h·b`; Q after RoPE
//!   `q·b`; the attention output `q·b` and its fp32 log-sum-exp `4·heads`; SwiGLU's gate and up
//!   outputs and its product `3·ffn·b`. K and V are *not* here: slimpack keeps them per sample in
//!   the K/V store ([`MemoryModel::kv_bytes`]) because later slices attend to them. For
//!   llama-7b that is 115,328 B (+16,384 B of K/V) against Korthikanti's `34h` = 139,264 B.
//!   Selective recomputation drops the attention output and log-sum-exp (recomputed from Q, K, V
//!   in the backward); full recomputation keeps only the layer input, `h·b`; block
//!   recomputation (`block:K`, Megatron's `--recompute-method block`) keeps `h·b` for the first
//!   `K` layers of each model chunk and everything for the rest. A stage that runs a mode of
//!   its own (`assign-recompute`) is sized by the model of that mode
//!   ([`super::CostModel::with_recompute`]), so its forwards save, and its backwards free, what
//!   its mode keeps. The last stage also
//!   keeps the final norm's input and output (`2h·b`) and the fp32 softmax of the loss
//!   (`4·vocab`, all `÷ tp`).
//! - K/V retention: `2 · kv_heads · head_dim · b / tp` per token per layer while any slice of the
//!   sample still needs it. dK/dV accumulators: the same shape in fp32 (4 B), because a
//!   continuation slice's backward adds a partial sum into every earlier slice's dK/dV and many
//!   bf16 partial sums would lose precision (as Megatron keeps main gradients in fp32).
//! - Deferred weight gradients (zero-bubble schedules, [`MemoryModel::weight_grad_bytes`]): a
//!   backward split into an input-gradient part B and a later weight-gradient part W keeps,
//!   from B to W, what the weight-gradient GEMMs read, per token per layer `÷ tp`: their
//!   inputs — both norms' outputs `2h·b`, the attention output `q·b`, the SwiGLU output
//!   `ffn·b` — and their output gradients — dQKV `(q + 2·kv)·b`, the output projection's and
//!   the down projection's `2h·b`, gate/up's `2·ffn·b`: `(4h + 2q + 2kv + 3ffn)·b` (the ZB
//!   paper's "W keeps the layer inputs and output gradients"); on the last stage also the
//!   final norm's output and the logits' gradient, `(h + vocab)·b`. Kept copies, not views:
//!   B frees the saved activations as a whole backward does, so the recomputation mode does
//!   not change them (with recomputation B rematerialises the inputs W needs).
//! - Temporaries while one pack runs one layer: the sequence-parallel all-gather buffer (the
//!   pack's full `tokens · h · b`, not divided by tp); with recomputation, the rematerialised
//!   tensors of one layer; in the backward, the activation gradients of one layer (as large as
//!   its saved activations); on the last stage the `dtype` logits (`tokens · vocab / tp`).
//! - Workspace: a fixed allowance for what the caching allocator does not track or cannot reuse:
//!   the CUDA context (~0.5 GiB on Hopper), NCCL communicator buffers (`NCCL_BUFFSIZE` = 4 MiB
//!   per channel and peer, for several communicators), cuBLAS/cuBLASLt workspaces (32 MiB per
//!   stream on Hopper, PyTorch `CUBLAS_WORKSPACE_CONFIG` docs) and allocator fragmentation
//!   (PyTorch "CUDA semantics" notes, `expandable_segments`); 3 GiB on GPUs.
//!
//! **The CPU runtime** (`cpu` devices, [`DeviceKind::Cpu`]) executes fp32 steps with its own
//! buffers, and its counting allocator measures every heap byte of each worker, so its model is
//! the runtime's data structures tensor by tensor (`runtime/src/cpu`; a runtime test checks each
//! term against the structures themselves). Floats are 4 B; `h`, `q`, `kv`, `f`, `v` are the
//! hidden, query, K/V, SwiGLU and vocabulary widths, `heads` the query heads:
//! - model states: fp32 weights and gradients (8 B) on every worker, AdamW's m and v (8 B)
//!   sharded over the DP ranks (`ShardedAdamW`): the fp32 rule above;
//! - saved per token per layer (`SavedLayer`): the layer input, both norms' output and inverse
//!   RMS, Q, the attention output and its log-sum-exp, the post-attention residual, gate, up and
//!   SwiGLU output: `4 · (4h + 2 + 2q + heads + 3f)`; the last stage also keeps (`SavedHead`)
//!   the final norm's input, output and inverse RMS and the softmax: `4 · (2h + 1 + v)`;
//! - K/V and dK/dV accumulators: fp32, as above (the cache holds exactly the rows in flight);
//! - temporaries ([`CpuTemporaries`]): the received input (hidden states or their gradients,
//!   `4h`) and the pack's positions (8 B per token) through the task; and the highest of the
//!   instants at which the runtime allocates, from the order in which `forward.rs`, `layer.rs`,
//!   `head.rs` and `backward.rs` allocate and drop their tensors: each instant's live tensors
//!   (per token, counted above what the task keeps: in the forward the last layer's K and V and
//!   its output, less the saved tensors not allocated yet; in the backward `dy` and the layer's
//!   gradients so far, less the head's saved tensors, freed first on the last stage) plus the
//!   packing buffers of the GEMM running then — `matrixmultiply` packs `min(k, 256) ·
//!   (min(m, 64) + min(n, 1024))` floats per product, so small packs peak at a wide GEMM and
//!   large ones at the most live tensors; and while a sample's last slice runs its backward,
//!   that slice's own dK/dV rows ([`MemoryModel::own_kv_grad_bytes`]: the runtime accumulates
//!   into every position's rows); the attention's score buffers count at the instant they are
//!   live: `64 × keys` floats per buffer, `keys` the end position of the pack's longest-reaching
//!   slice (one buffer in the forward, probabilities and their gradients in the backward);
//! - no workspace: every buffer the runtime allocates is one of the above.

use slimpack_ir::spec::{Dtype, ModelSpec, ParallelSpec, Spec};
use slimpack_ir::step::Direction;

use super::efficiency::DeviceKind;
use super::flops::gemm_params_per_layer;

/// fp32 main gradient per parameter (Megatron's `main_grad` buffers).
pub const MAIN_GRAD_BYTES: u64 = 4;
/// fp32 master copy of a low-precision parameter, sharded by the distributed optimizer.
pub const MASTER_WEIGHT_BYTES: u64 = 4;
/// Adam's first and second moments, fp32 each, sharded by the distributed optimizer.
pub const ADAM_STATE_BYTES: u64 = 8;
/// dK/dV accumulator element (fp32).
pub const KV_GRAD_BYTES: u64 = 4;
/// FlashAttention's log-sum-exp per head per token (fp32).
pub const LSE_BYTES: u64 = 4;
/// Fp32 softmax of the loss kept for the backward, per logit.
pub const LOSS_SOFTMAX_BYTES: u64 = 4;
/// Fixed allowance per GPU for the CUDA context, NCCL and cuBLAS buffers and fragmentation.
pub const GPU_WORKSPACE_BYTES: u64 = 3 << 30;
/// `matrixmultiply`'s sgemm blocking (`archparam_defaults.rs`: `S_KC`, `S_MC`, `S_NC`): the
/// packed panels of A are `KC × MC`, of B `KC × NC`, clipped to the matrices.
pub const CPU_GEMM_BLOCKING: (u64, u64, u64) = (256, 64, 1024);
/// Bytes per token of a pack's positions (`usize`) the CPU runtime keeps while it runs.
pub const CPU_POSITION_BYTES: u64 = 8;
/// Query rows the CPU runtime's attention scores at once (`attention.rs`, `QUERY_BLOCK`): its
/// score buffers hold `QUERY_BLOCK × keys` floats (one in the forward, two in the backward).
pub const CPU_QUERY_BLOCK: u64 = 64;

/// The fraction of device memory a configuration may use by default. A run keeps its
/// configuration for later steps, whose batches differ: one tuned to within a few percent of
/// the capacity runs out of memory on some of them. Every strategy tunes (and re-plans) with
/// the same limit, and `schedule-pipeline` fills at most this much with activations in flight.
pub const DEFAULT_MEMORY_LIMIT: f64 = 0.92;

/// Per-spec memory coefficients.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryModel {
    tp: u64,
    /// Devices sharing one copy of a stage's weights: `dp × static cp`.
    optimizer_shards: u64,
    /// The layout: pipeline stages (`pp · vpp`) and the device each runs on.
    parallel: ParallelSpec,
    layers_per_stage: u64,
    /// Local parameters of each pipeline stage.
    stage_params: Vec<u64>,
    weight_bytes: u64,
    master_bytes: u64,
    /// Saved bytes per token per layer, times tp (exact before the final division).
    activation_per_token: u64,
    /// Extra saved bytes per token on the last stage, times tp.
    head_activation_per_token: u64,
    /// One layer's activations without recomputation, per token, times tp.
    full_layer_per_token: u64,
    /// Bytes per token per layer that rematerialise during a backward with recomputation, × tp.
    rematerialised_per_token: u64,
    kv_per_token: u64,
    kv_grad_per_token: u64,
    /// What a deferred weight gradient keeps per token per layer, times tp.
    weight_grad_per_token: u64,
    /// The same for the output projection on the last stage, times tp (0 on the CPU runtime,
    /// whose input gradient computes the output projection's weight gradient itself).
    head_weight_grad_per_token: u64,
    hidden_row: u64,
    logits_per_token: u64,
    /// The CPU runtime's temporaries, which replace the GPU rule above on `cpu` devices.
    cpu_temporaries: Option<CpuTemporaries>,
    workspace: u64,
    capacity: u64,
}

/// One dimension of a GEMM the CPU runtime runs: the pack's token rows, or a fixed width.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Dim {
    Rows,
    Width(u64),
}

/// An instant of a pack's run on the CPU runtime: floats per token live above what the task
/// keeps when it ends (negative while some of its saved tensors are not allocated yet), and the
/// GEMM running then (`m × k` by `k × n`), whose packing buffers are live too.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Moment {
    floats_per_token: i64,
    gemm: Option<[Dim; 3]>,
    /// Attention score buffers live (`CPU_QUERY_BLOCK × keys` floats each).
    score_buffers: u64,
}

/// The CPU runtime's transient memory of a pack, instant by instant (see the module comment):
/// the largest instant is the pack's temporary.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuTemporaries {
    /// Floats per token of the received input: hidden states (forward, every stage but the
    /// first) or their gradients (backward, every stage but the last), held through the task.
    input: i64,
    /// By direction (forward, backward), then for a middle and the last stage.
    moments: [[Vec<Moment>; 2]; 2],
}

impl CpuTemporaries {
    /// The instants that can be a pack's highest, from the order in which `forward.rs`,
    /// `layer.rs`, `head.rs` and `backward.rs` allocate and drop: in the forward, the last
    /// layer's (every earlier layer's tensors are saved by then) and the head's or the send's;
    /// in the backward, the first layer's (later ones run after its saved tensors are freed)
    /// and the head's.
    fn new(model: &ModelSpec) -> CpuTemporaries {
        let (h, q, kv, f, v, heads) = (
            i64::from(model.hidden),
            model.q_width() as i64,
            model.kv_width() as i64,
            i64::from(model.ffn),
            i64::from(model.vocab),
            i64::from(model.heads),
        );
        let w = |x: i64| Dim::Width(x as u64);
        let r = Dim::Rows;
        let at = |floats_per_token: i64, gemm: Option<[Dim; 3]>| Moment {
            floats_per_token,
            gemm,
            score_buffers: 0,
        };
        let attending = |floats_per_token: i64, score_buffers: u64| Moment {
            floats_per_token,
            gemm: None,
            score_buffers,
        };
        let head = 2 * h + 1 + v;
        // Forward, last layer: the saved tensors not allocated yet, and K, V (2kv) live.
        let unsaved = q + heads + 2 * h + 1 + 3 * f;
        let layer_forward = |extra: i64| {
            vec![
                at(extra - unsaved, Some([r, w(h), w(q)])),
                at(extra + kv - unsaved, Some([r, w(h), w(kv)])),
                at(extra + 2 * kv - unsaved, Some([r, w(h), w(kv)])),
                attending(extra + 2 * kv - (2 * h + 1 + 3 * f), 1),
                at(extra + 2 * kv - (h + 1 + 3 * f), Some([r, w(q), w(h)])),
                at(extra + 2 * kv - 2 * f, Some([r, w(h), w(f)])),
                at(extra + 2 * kv - f, Some([r, w(h), w(f)])),
            ]
        };
        let mut forward_middle = layer_forward(0);
        forward_middle.extend([at(2 * kv + h, Some([r, w(f), w(h)])), at(2 * h, None)]);
        let mut forward_last = layer_forward(-head);
        forward_last.extend([
            at(2 * kv - (h + 1 + v), Some([r, w(f), w(h)])),
            at(0, Some([r, w(h), w(v)])),
        ]);
        // Backward, first layer: `dy` and the gradients alive at each GEMM.
        let layer_backward = |dy: i64| {
            vec![
                at(dy, Some([w(f), r, w(h)])),
                at(dy + f, Some([r, w(h), w(f)])),
                at(dy + 3 * f, Some([w(h), r, w(f)])),
                at(dy + 3 * f + h, Some([r, w(f), w(h)])),
                at(dy + 3 * f + 2 * h, Some([w(q), r, w(h)])),
                at(dy + 3 * f + 2 * h + q, Some([r, w(h), w(q)])),
                attending(dy + h + 2 * q, 2),
                at(dy + h + 2 * q + 2 * kv, Some([w(h), r, w(q)])),
                at(dy + 2 * h + 2 * q + 2 * kv, Some([r, w(q), w(h)])),
                at(dy + 3 * h + 2 * q + 2 * kv, None),
            ]
        };
        let backward_middle = layer_backward(h);
        let mut backward_last = layer_backward(h - head);
        backward_last.extend([
            at(0, Some([w(v), r, w(h)])),
            at(h, Some([r, w(v), w(h)])),
            at(2 * h, None),
        ]);
        CpuTemporaries {
            input: h,
            moments: [
                [forward_middle, forward_last],
                [backward_middle, backward_last],
            ],
        }
    }

    /// Transient bytes of a pack of `rows` token rows whose slices attend to at most `keys`
    /// keys, on a stage.
    fn bytes(&self, rows: u64, keys: u64, direction: Direction, first: bool, last: bool) -> u64 {
        let (index, input) = match direction {
            Direction::Forward => (0, !first),
            Direction::Backward => (1, !last),
        };
        let dim = |d: Dim| match d {
            Dim::Rows => rows,
            Dim::Width(width) => width,
        };
        let highest = self.moments[index][usize::from(last)]
            .iter()
            .map(|moment| {
                let gemm = moment
                    .gemm
                    .map_or(0, |[m, k, n]| gemm_packing_floats(dim(m), dim(k), dim(n)));
                let scores = moment.score_buffers * rows.min(CPU_QUERY_BLOCK) * keys;
                4 * (moment.floats_per_token * rows as i64 + (gemm + scores) as i64)
            })
            .max()
            .unwrap_or(0)
            .max(0) as u64;
        let input = if input { 4 * self.input as u64 } else { 0 };
        highest + rows * (input + CPU_POSITION_BYTES)
    }
}

/// Floats of `matrixmultiply`'s packing buffers for one `m × k` by `k × n` product (single
/// thread; the 8 × 8 f32 kernel rounds `m` and `n` up to multiples of 8).
fn gemm_packing_floats(m: u64, k: u64, n: u64) -> u64 {
    let (kc, mc, nc) = CPU_GEMM_BLOCKING;
    let round = |x: u64| x.div_ceil(8) * 8;
    k.min(kc) * (round(m.min(mc)) + round(n.min(nc)))
}

impl MemoryModel {
    /// The memory model of `spec`.
    pub fn new(spec: &Spec) -> MemoryModel {
        let model = &spec.model;
        let parallel = &spec.parallel;
        let b = model.dtype.bytes();
        let (h, q, ffn) = (
            u64::from(model.hidden),
            model.q_width(),
            u64::from(model.ffn),
        );
        let heads = u64::from(model.heads);
        let none = b * (4 * h + 2 * q + 3 * ffn) + LSE_BYTES * heads;
        let attention_output = b * q + LSE_BYTES * heads;
        // Per layer, averaged over a chunk's layers (`block:K` mixes full and none); the
        // rematerialised temporaries are those of one layer at a time, so the largest of the
        // modes present.
        let mix = model.recompute.mix(spec.layers_per_chunk());
        let activation_per_token = (mix.none * none as f64
            + mix.selective * (none - attention_output) as f64
            + mix.full * (b * h) as f64)
            .round() as u64;
        let rematerialised_per_token = if mix.full > 0.0 {
            none
        } else if mix.selective > 0.0 {
            attention_output
        } else {
            0
        };
        let cpu = DeviceKind::of(&spec.cluster.gpu) == DeviceKind::Cpu;
        let workspace = match cpu {
            true => 0,
            false => GPU_WORKSPACE_BYTES,
        };
        // The CPU runtime also saves both norms' inverse RMS (fp32) per layer, and the final
        // norm's on the last stage.
        let (norm_stats, head_norm_stats) = match cpu {
            true => (2 * LSE_BYTES, LSE_BYTES),
            false => (0, 0),
        };
        let layers = u64::from(spec.layers_per_stage());
        MemoryModel {
            tp: u64::from(parallel.tp),
            optimizer_shards: u64::from(parallel.dp) * u64::from(parallel.cp_degree()),
            parallel: *parallel,
            layers_per_stage: layers,
            stage_params: (0..parallel.stages())
                .map(|s| stage_params(spec, s))
                .collect(),
            weight_bytes: b,
            master_bytes: if model.dtype == Dtype::Fp32 {
                0
            } else {
                MASTER_WEIGHT_BYTES
            },
            activation_per_token: activation_per_token + norm_stats,
            head_activation_per_token: 2 * h * b
                + LOSS_SOFTMAX_BYTES * u64::from(model.vocab)
                + head_norm_stats,
            full_layer_per_token: none,
            rematerialised_per_token,
            kv_per_token: 2 * model.kv_width() * b,
            kv_grad_per_token: 2 * model.kv_width() * KV_GRAD_BYTES,
            weight_grad_per_token: b * (4 * h + 2 * q + 2 * model.kv_width() + 3 * ffn),
            head_weight_grad_per_token: match cpu {
                true => 0,
                false => b * (h + u64::from(model.vocab)),
            },
            hidden_row: h * b,
            logits_per_token: u64::from(model.vocab) * b,
            cpu_temporaries: cpu.then(|| CpuTemporaries::new(model)),
            workspace,
            capacity: spec.cluster.gpu.hbm_bytes,
        }
    }

    /// Parameters held by one device of `stage`.
    pub fn stage_params(&self, stage: u32) -> u64 {
        self.stage_params[stage as usize]
    }

    /// Parameters held by one device of pipeline device `device`: those of every stage (model
    /// chunk) it runs.
    pub fn device_params(&self, device: u32) -> u64 {
        self.parallel
            .stages_on(device)
            .map(|stage| self.stage_params(stage))
            .sum()
    }

    /// Weights, main gradients and this device's shard of master weights and Adam state, on a
    /// device of pipeline device `device` (all its model chunks).
    pub fn model_state_bytes(&self, device: u32) -> u64 {
        let params = self.device_params(device);
        let replicated = params * (self.weight_bytes + MAIN_GRAD_BYTES);
        let sharded = params * (self.master_bytes + ADAM_STATE_BYTES);
        replicated + sharded.div_ceil(self.optimizer_shards)
    }

    /// Activations `tokens` tokens save on `stage` from their forward to their backward (K/V
    /// excluded: see [`MemoryModel::kv_bytes`]).
    pub fn activation_bytes(&self, tokens: u64, stage: u32) -> u64 {
        let mut per_token = self.activation_per_token * self.layers_per_stage;
        if self.is_last(stage) {
            per_token += self.head_activation_per_token;
        }
        self.per_device(tokens * per_token)
    }

    /// K and V of `tokens` tokens of a sample on `stage`, kept while later slices need them.
    pub fn kv_bytes(&self, tokens: u64, _stage: u32) -> u64 {
        self.per_device(tokens * self.kv_per_token * self.layers_per_stage)
    }

    /// fp32 dK/dV accumulators of `tokens` tokens of a sample on `stage`, alive from the
    /// backward of its last slice to the backward of the slice that owns those tokens.
    pub fn kv_grad_bytes(&self, tokens: u64, _stage: u32) -> u64 {
        self.per_device(tokens * self.kv_grad_per_token * self.layers_per_stage)
    }

    /// What a split backward's input gradient of `tokens` tokens holds on `stage` while it
    /// runs, beyond a whole backward's temporaries: the CPU runtime copies each layer's
    /// weight-gradient operands before it frees that layer's saved activations, so one layer's
    /// operands sit beside them (the net change, [`MemoryModel::weight_grad_bytes`] less the
    /// activations, lands at the op's end); GPU kernels are modelled by that net change alone
    /// (0).
    pub fn split_backward_temporary_bytes(&self, tokens: u64, _stage: u32) -> u64 {
        match self.cpu_temporaries {
            Some(_) => self.per_device(tokens * self.weight_grad_per_token),
            None => 0,
        }
    }

    /// dK/dV accumulators of the `tokens` tokens of a sample's last slice, held while that
    /// slice's backward runs: the CPU runtime accumulates into every position's rows, the
    /// slice's own included; fused GPU attention kernels keep those in registers (0).
    pub fn own_kv_grad_bytes(&self, tokens: u64, stage: u32) -> u64 {
        match self.cpu_temporaries {
            Some(_) => self.kv_grad_bytes(tokens, stage),
            None => 0,
        }
    }

    /// What `tokens` tokens of a backward whose weight gradient is deferred (a zero-bubble
    /// schedule) keep on `stage` from its input-gradient part to its weight-gradient part: the
    /// inputs and the output gradients of every weight-gradient GEMM. Counted apart from
    /// [`MemoryModel::activation_bytes`], which the input gradient frees as a whole backward
    /// does (see the module comment).
    pub fn weight_grad_bytes(&self, tokens: u64, stage: u32) -> u64 {
        let mut per_token = self.weight_grad_per_token * self.layers_per_stage;
        if self.is_last(stage) {
            per_token += self.head_weight_grad_per_token;
        }
        self.per_device(tokens * per_token)
    }

    /// [`MemoryModel::pack_temporary_bytes`] of a pack whose slices start their samples.
    pub fn temporary_bytes(&self, pack_tokens: u64, stage: u32, direction: Direction) -> u64 {
        self.pack_temporary_bytes(pack_tokens, pack_tokens, stage, direction)
    }

    /// Transient bytes while a pack of `pack_tokens` tokens runs one layer of `stage` in
    /// `direction` (freed when the pack finishes); `attended_keys` is the most keys one of its
    /// slices attends to (its end position in its sample), which sizes the CPU runtime's
    /// attention score buffers (fused GPU attention keeps scores on chip).
    pub fn pack_temporary_bytes(
        &self,
        pack_tokens: u64,
        attended_keys: u64,
        stage: u32,
        direction: Direction,
    ) -> u64 {
        if let Some(cpu) = &self.cpu_temporaries {
            let (first, last) = (stage == 0, self.is_last(stage));
            return cpu.bytes(pack_tokens, attended_keys, direction, first, last);
        }
        let gathered = pack_tokens * self.hidden_row;
        let mut sharded_per_token = self.rematerialised_per_token;
        if direction == Direction::Backward {
            sharded_per_token += self.full_layer_per_token;
        }
        if self.is_last(stage) {
            sharded_per_token += self.logits_per_token;
        }
        gathered + self.per_device(pack_tokens * sharded_per_token)
    }

    /// What a forward of `tokens` tokens (a device's share) keeps on `stage` until its
    /// backward: saved activations and K/V.
    pub fn held_bytes(&self, tokens: u64, stage: u32) -> u64 {
        self.activation_bytes(tokens, stage) + self.kv_bytes(tokens, stage)
    }

    /// What the forwards in flight on pipeline device `device` may take: `fraction` of device
    /// memory, less the model states and workspace.
    pub fn activation_budget(&self, device: u32, fraction: f64) -> u64 {
        let usable = (self.capacity_bytes() as f64 * fraction) as u64;
        usable.saturating_sub(self.model_state_bytes(device) + self.workspace_bytes())
    }

    /// The fixed workspace allowance.
    pub fn workspace_bytes(&self) -> u64 {
        self.workspace
    }

    /// Device memory capacity.
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity
    }

    /// Bytes per token per layer saved under the recomputation mode, per device (K/V excluded).
    pub fn activation_bytes_per_token_layer(&self) -> f64 {
        self.activation_per_token as f64 / self.tp as f64
    }

    fn is_last(&self, stage: u32) -> bool {
        stage + 1 == self.parallel.stages()
    }

    fn per_device(&self, bytes_times_tp: u64) -> u64 {
        // The simulator sums this per slice, per stage: a shift where TP is a power of two
        // (the usual case) instead of a division.
        match self.tp.is_power_of_two() {
            true => (bytes_times_tp + (self.tp - 1)) >> self.tp.trailing_zeros(),
            false => bytes_times_tp.div_ceil(self.tp),
        }
    }
}

/// Parameters one device of `stage` holds: its layers' matrices split over TP and their norm
/// vectors replicated; the vocab-parallel embedding on the first stage; the output projection
/// and final norm on the last (with tied embeddings and several stages, the last stage keeps its
/// own copy of the embedding, as Megatron does).
fn stage_params(spec: &Spec, stage: u32) -> u64 {
    let model: &ModelSpec = &spec.model;
    let tp = u64::from(spec.parallel.tp);
    let h = u64::from(model.hidden);
    let layer = gemm_params_per_layer(model) / tp + 2 * h;
    let mut params = layer * u64::from(spec.layers_per_stage());
    let embedding = u64::from(model.vocab) * h / tp;
    let (first, last) = (stage == 0, stage + 1 == spec.parallel.stages());
    if first {
        params += embedding;
    }
    if last {
        let output_copy = !model.tied_embeddings || !first;
        params += h + if output_copy { embedding } else { 0 };
    }
    params
}

#[cfg(test)]
mod tests {
    use super::*;
    use slimpack_ir::spec::Recompute;

    const GIB: f64 = (1u64 << 30) as f64;

    #[test]
    fn llama7b_model_states_at_tp8_pp4_dp4_by_hand() {
        let spec = Spec::from_presets("llama-7b", "h100-sxm", "tp=8,pp=4,dp=4").unwrap();
        let memory = MemoryModel::new(&spec);
        // A layer: 202,375,168 matrix parameters / 8 + 8,192 norm weights = 25,305,088.
        // Eight layers: 202,440,704. Embedding: 32000 · 4096 / 8 = 16,384,000.
        let middle = 202_440_704u64;
        let first = middle + 16_384_000;
        let last = middle + 16_384_000 + 4096;
        assert_eq!(memory.stage_params(0), first);
        assert_eq!(memory.stage_params(1), middle);
        assert_eq!(memory.stage_params(3), last);
        // 2 B weights + 4 B main grads + (4 + 8) B / dp 4 = 9 B per parameter.
        assert_eq!(memory.model_state_bytes(0), 9 * first);
        assert_eq!(memory.model_state_bytes(1), 9 * middle);
        assert_eq!(memory.model_state_bytes(3), 9 * last);
        // About 1.83 GiB per device on stage 0.
        assert!((memory.model_state_bytes(0) as f64 / GIB - 1.834).abs() < 0.001);
        // Every device's share sums to the whole model's 6 + 12/4 bytes per parameter,
        // counting the replicated norm weights tp times.
        let total: u64 = (0..4).map(|s| memory.stage_params(s)).sum::<u64>() * 8;
        let norms = (32 * 2 * 4096 + 4096) * 7;
        assert_eq!(total - norms, spec.model.params());
    }

    #[test]
    fn activations_per_token_by_hand() {
        let mut spec = Spec::from_presets("llama-7b", "h100-sxm", "tp=1,pp=1,dp=1").unwrap();
        // 2 · (4 · 4096 + 2 · 4096 + 3 · 11008) + 4 · 32 = 115,328 B per token per layer.
        let expected = [
            (Recompute::None, 115_328),
            (Recompute::Selective, 115_328 - 8192 - 128),
            (Recompute::Full, 8192),
            // block:8 of the stage's 32 layers: (8 · 8192 + 24 · 115,328) / 32 per layer.
            (Recompute::Block(8), 88_544),
            (Recompute::Block(32), 8192),
            (Recompute::Block(40), 8192),
        ];
        for (recompute, per_token_layer) in expected {
            spec.model.recompute = recompute;
            let memory = MemoryModel::new(&spec);
            let head = 2 * 4096 * 2 + 4 * 32000;
            assert_eq!(
                memory.activation_bytes(1000, 0),
                1000 * (32 * per_token_layer + head),
                "{recompute}"
            );
        }
    }

    #[test]
    fn kv_retention_and_gradients_by_hand() {
        let spec = Spec::from_presets("llama-70b", "h100-sxm", "tp=8,pp=4,dp=1").unwrap();
        let memory = MemoryModel::new(&spec);
        // 2 · 8 K/V heads · 128 · 2 B / tp 8 = 512 B per token per layer; 20 layers per stage.
        assert_eq!(memory.kv_bytes(4096, 1), 4096 * 512 * 20);
        assert_eq!(memory.kv_grad_bytes(4096, 1), 2 * memory.kv_bytes(4096, 1));
        // Additive over slices.
        assert_eq!(
            memory.kv_bytes(1000, 1) + memory.kv_bytes(3096, 1),
            memory.kv_bytes(4096, 1)
        );
    }

    #[test]
    fn temporaries_include_logits_on_the_last_stage() {
        let spec = Spec::from_presets("llama-7b", "h100-sxm", "tp=2,pp=2,dp=1").unwrap();
        let memory = MemoryModel::new(&spec);
        let gathered = 4096 * 4096 * 2;
        assert_eq!(
            memory.temporary_bytes(4096, 0, Direction::Forward),
            gathered
        );
        let logits = 4096 * 32000 * 2 / 2;
        assert_eq!(
            memory.temporary_bytes(4096, 1, Direction::Forward),
            gathered + logits
        );
        let layer_grads = 4096 * 115_328 / 2;
        assert_eq!(
            memory.temporary_bytes(4096, 0, Direction::Backward),
            gathered + layer_grads
        );
        assert_eq!(memory.workspace_bytes(), 3 << 30);
    }

    #[test]
    fn cpu_runtime_temporaries_of_tiny_by_hand() {
        let spec = Spec::from_presets("tiny", "cpu", "tp=1,pp=2,dp=1").unwrap();
        let memory = MemoryModel::new(&spec);
        // h 128, q 128, kv 64, f 352, v 512. Forward, stage 0, 1000 tokens: the down
        // projection of the last layer with K, V and its output live (2 · 64 + 128 floats per
        // token) and the GEMM's 256 x (64 + 128) packed floats; positions 8 B per token.
        let forward = 4 * (256 * 1000 + 256 * 192) + 8 * 1000;
        assert_eq!(memory.temporary_bytes(1000, 0, Direction::Forward), forward);
        // 10 tokens: the up projection's GEMM (128 x (16 + 352) packed floats) is higher, with
        // K and V live and SwiGLU's output not allocated yet (2 · 64 − 352 floats per token).
        let small = (4 * (-224i64 * 10 + 128 * 368) + 8 * 10) as u64;
        assert_eq!(memory.temporary_bytes(10, 0, Direction::Forward), small);
        // Backward, stage 0: dy, dSwiGLU, dgate, dup, dnormed, dmid and dattn (1568 floats)
        // while dattn's GEMM packs 128 x (64 + 128) floats; plus the input and positions.
        let backward = 4 * (1568 * 1000 + 128 * 192) + (512 + 8) * 1000;
        assert_eq!(
            memory.temporary_bytes(1000, 0, Direction::Backward),
            backward
        );
        // 100 tokens at the end of a 65,536-token sample: the backward's two 64 x 65,536 score
        // buffers with dy, dmid, dattn and dq live (512 floats per token) are the highest.
        let scores = 4 * (512 * 100 + 2 * 64 * 65_536) + (512 + 8) * 100;
        let long = memory.pack_temporary_bytes(100, 65_536, 0, Direction::Backward);
        assert_eq!(long, scores);
        // Saved: 4 · (4 · 128 + 2 + 2 · 128 + 4 + 3 · 352) = 7320 B per token per layer, and
        // the head's 4 · (2 · 128 + 1 + 512) = 3076 B.
        assert_eq!(memory.activation_bytes(10, 0), 10 * 2 * 7320);
        assert_eq!(memory.activation_bytes(10, 1), 10 * (2 * 7320 + 3076));
        assert_eq!(memory.own_kv_grad_bytes(10, 0), memory.kv_grad_bytes(10, 0));
        assert_eq!(memory.workspace_bytes(), 0);
        let gpu = Spec::from_presets("tiny", "h100-sxm", "tp=1,pp=2,dp=1").unwrap();
        assert_eq!(MemoryModel::new(&gpu).own_kv_grad_bytes(10, 0), 0);
    }

    #[test]
    fn fp32_models_keep_no_master_copy() {
        let spec = Spec::from_presets("tiny", "cpu", "tp=1,pp=1,dp=2").unwrap();
        let memory = MemoryModel::new(&spec);
        let params = spec.model.params();
        assert_eq!(memory.stage_params(0), params);
        // 4 B weights + 4 B grads + 8 B Adam / 2.
        assert_eq!(memory.model_state_bytes(0), params * 12);
    }
}
