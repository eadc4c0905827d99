//! The schedule JSON (`compile --emit json`), version 3: a lowered step, self-contained, for
//! trainers.
//!
//! A document holds everything a PyTorch or Megatron trainer needs to run the step without
//! slimpack — and everything needed to read it back into the step IR ([`to_ir`]), which is how
//! `slimpack simulate schedule.json` reproduces compile's report. Top-level fields:
//! - `format` (`"slimpack.schedule"`) and `version` ([`VERSION`]; bumped on any incompatible
//!   change: a document of another version is refused with one line naming both);
//! - `spec` (model, cluster, parallel layout — `parallel.cp` is the CP degree the step uses,
//!   also when the strategy chose it, see `cp_chosen`) and `batch` (where the lengths came from);
//! - `loss`: what the loss is divided by ([`LossDocument`]);
//! - `samples` in batch order (`len`, source `doc`, context `piece`);
//! - `slices`: every slice of every sample, sample-major — its packs, the tokens its rows
//!   predict, and the order in which its dK/dV accumulate ([`SliceDocument`]);
//! - `stages` (layer ranges) and `replicas` (DP ranks and CP size);
//! - `packs`: per pack its slices with their K/V prefix and CP split, Megatron's
//!   `PackedSeqParams` fields, RoPE positions and, for a forward pack, its sub-batches along the
//!   backward packs ([`PackDocument`]);
//! - `schedules`: per replica and stage, the order of its packs;
//! - `groups`: every distinct group of global ranks a collective runs over, each written once as
//!   strided runs of ranks ([`RankGroup`]; a stage's DP sync group is one run);
//! - `devices`: per global rank (Megatron order: tp fastest, then cp, dp, pp) its coordinates and
//!   its ops in order, peers as global ranks and collectives' ranks as indices into `groups`
//!   ([`DeviceOp`]: compute, non-blocking point-to-point, CP exchanges, the tied-embedding
//!   gradient sum, the DP gradient sync);
//! - `predicted`: the simulator's metrics for this schedule, when compile simulated it.
//!
//! The document's size, and the cost of reading and checking it, are linear in its devices,
//! ops, packs and slices: no list of ranks is repeated per device (version 2 listed every rank
//! of a stage's DP group in every device's `reduce_scatter` and `all_gather`, quadratic in dp).
//!
//! Everything but `spec`, `batch`, `samples`, `stages`, the replicas' DP ranks, the packs'
//! slice lists and `schedules` is derived from those; [`to_ir`] re-derives it and refuses a
//! document whose derived fields differ (a hand-edited document is an error, not a silent
//! reinterpretation). Every object is closed (`additionalProperties: false`) except
//! `predicted`; the JSON Schema ([`schema`], `slimpack schema`, shipped as
//! `docs/schedule.schema.json`) is generated from these types and states every field's meaning
//! and integer bounds.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use slimpack_ir::batch::Sample;
use slimpack_ir::spec::{Coords, Recompute};
use slimpack_ir::step::{Direction, Part, StepIr};
use slimpack_ir::Spec;

/// The value of the `format` field.
pub const FORMAT: &str = "slimpack.schedule";
/// The document version this build writes and reads.
pub const VERSION: u32 = 3;
/// The largest value of an int32 field (Megatron's `cu_seqlens`, RoPE positions).
pub const INT32_MAX: u32 = i32::MAX as u32;

/// A schedule document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleDocument {
    /// Always `"slimpack.schedule"`.
    pub format: String,
    /// The document version: 3. Readers refuse any other version.
    #[schemars(range(min = 3, max = 3))]
    pub version: u32,
    /// Model, cluster and the parallel layout the step runs on. `parallel.cp` is always present:
    /// the static CP degree every replica runs with (1: none), also when the strategy chose it
    /// out of the DP pool (`cp_chosen`); global ranks and `coords` follow this layout.
    pub spec: Spec,
    /// Whether the strategy chose `spec.parallel.cp` (the input layout named no cp: the strategy
    /// ran a pool of `cp × dp` data-parallel ranks as `dp` replicas of `cp` consecutive ranks);
    /// false when the layout fixed it.
    pub cp_chosen: bool,
    pub batch: BatchDocument,
    pub loss: LossDocument,
    /// Samples in batch order; slices and packs refer to them by index.
    pub samples: Vec<Sample>,
    /// Every slice, sample by sample in batch order, each sample's slices in increasing start.
    pub slices: Vec<SliceDocument>,
    pub stages: Vec<StageDocument>,
    pub replicas: Vec<ReplicaDocument>,
    /// Every pack: per replica, its forward packs, then its backward packs.
    pub packs: Vec<PackDocument>,
    pub schedules: Vec<ScheduleEntry>,
    /// Per replica and pipeline device, how it interleaves its model chunks (`vpp > 1` only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interleave: Vec<InterleaveEntry>,
    /// Per DP rank in several replicas (a plain replica and DP-Merge groups) and pipeline
    /// device, where the replicas' schedules interleave: the replica of each op it runs, in
    /// order; entries in increasing (`dp`, `pp`). A rank without an entry runs its replicas one
    /// after the other, in `replicas` order. The devices' op lists follow it. (Added within
    /// version 3: a reader that does not know it refuses a document that has it.)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rank_orders: Vec<RankOrderEntry>,
    /// Forward packs that save their activations on a stage under another recomputation than
    /// the stage's (`stages[s].recompute`, else the model's): per stage in increasing order,
    /// one entry per mode, in the order of its first pack, packs in increasing index. A
    /// backward pack replays its slices under the mode their forward pack saved them under
    /// (the same for all its slices on a stage). (Added within version 3: a reader that does
    /// not know it refuses a document that has it.)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pack_recompute: Vec<PackRecomputeEntry>,
    /// Every group of ranks a collective op runs over, each distinct group once, in the order
    /// the devices (by rank, each op in order) first name them; ops refer to them by index.
    /// Creating one process group per entry in this order (`torch.distributed.new_group`, on
    /// every process, as it requires) gives a trainer every communicator the step uses.
    pub groups: Vec<RankGroup>,
    pub devices: Vec<Device>,
    /// The simulator's metrics for this schedule (step time, memory, ...), when known; the one
    /// open object of the document (its fields are those of `compile --report json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted: Option<serde_json::Value>,
}

/// Where the batch came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchDocument {
    pub source: String,
    /// Context length longer documents were cut to, if any.
    pub context: Option<u32>,
    pub documents: u64,
    pub documents_cut: u64,
}

/// The loss of the step and its normalization.
///
/// Every row with a target contributes `cross_entropy(logits(row), target) / target_tokens`;
/// rows without one (a sample's last token, padding) contribute nothing. The losses of every
/// pack on every rank add up to the batch's mean token loss, and the gradients it gives are
/// sums: the DP `reduce_scatter` sums (never averages) over ranks, and the CP members of a
/// pack each contribute the gradient of their own rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LossDocument {
    /// Always `"sum_over_global_target_tokens"`: the sum over rows, divided by `target_tokens`.
    pub normalization: LossNormalization,
    /// Rows with a target in the whole global batch: `Σ (len − 1)` over the samples.
    pub target_tokens: u64,
}

/// How the loss is normalized (one way today; named so that a reader can check it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LossNormalization {
    /// Summed over rows, divided by the global batch's target tokens.
    SumOverGlobalTargetTokens,
}

/// One slice of a sample: its tokens `[start, end)`, the packs that run it, its targets and
/// its dK/dV accumulation.
///
/// Lifetimes, on every stage: the slice's keys and values (per layer, kept in its sample's K/V
/// cache from its forward), their gradient accumulators (from the first backward that adds into
/// them) and the activations its forward saved may be freed when that stage's `backward` of
/// `backward_pack` finished; its sample's cache is empty once its first slice is backwarded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SliceDocument {
    /// The sample's index in `samples`.
    pub sample: u32,
    /// First token (sample position) of the slice.
    #[schemars(range(max = 2147483647))]
    pub start: u32,
    /// One past its last token.
    #[schemars(range(min = 1, max = 2147483647))]
    pub end: u32,
    /// The forward pack that runs it (index into `packs`).
    pub forward_pack: u32,
    /// The backward pack that runs it (index into `packs`).
    pub backward_pack: u32,
    /// Row `start + i` predicts the sample's token at `target_start + i`: targets are the
    /// positions `[start + 1, min(end + 1, len))`, so a slice's last target is the next
    /// slice's first token and the sample's last token has none.
    #[schemars(range(min = 1, max = 2147483647))]
    pub target_start: u32,
    /// One past the last target position (`target_end − target_start` rows have a target).
    #[schemars(range(min = 1, max = 2147483647))]
    pub target_end: u32,
    /// The slices (indices into `slices`) whose backward adds into this slice's dK/dV, in the
    /// order they run: its sample's later slices from the last down, then itself. Its dK/dV
    /// are complete, and consumed, in its own backward (the last entry). In a CP group each
    /// contribution is the sum of the members' contributions, added in member order.
    pub dkv_from: Vec<u32>,
}

/// A pipeline stage: layers `[first_layer, first_layer + layers)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StageDocument {
    pub first_layer: u32,
    #[schemars(range(min = 1))]
    pub layers: u32,
    /// The stage's own activation recomputation (`none`, `selective`, `full`, `block:K`),
    /// replacing `spec.model.recompute` for its layers; absent: the model's mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recompute: Option<Recompute>,
}

/// A replica: the DP ranks that run its samples and the size of its CP group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplicaDocument {
    /// DP ranks (two or more: a DP-Merge group, whose members act as one CP group).
    pub dp_ranks: Vec<u32>,
    /// CP members that run each of its packs: `len(dp_ranks) × spec.parallel.cp`. Member
    /// `i · cp + c` is the device with the `i`-th of `dp_ranks` and cp coordinate `c`.
    #[schemars(range(min = 1))]
    pub cp_size: u32,
}

/// A pack: its slices and what a varlen attention call and a trainer need to run it.
///
/// Rows: the pack's tensors (hidden states, Q) hold its slices' tokens in the order of
/// `slices` (`packed_seq_params.cu_seqlens_q`), then `padded_tokens − tokens` padding rows
/// (token 0, no target, RoPE positions `tokens..padded_tokens`, attending causally only to
/// themselves). Row `cu_seqlens_q[i] + j` is token `slices[i].start + j` of its sample, at RoPE
/// position `position_offsets[i] + j` (positions continue across slices: they are positions in
/// the sample, not in the pack).
///
/// Attention, per slice and layer: queries are the slice's own rows; keys and values are the
/// rows of positions `[kv_start, end)` of its sample — the cached prefix `[kv_start, start)`
/// (written by earlier slices' forwards on this stage) followed by the slice's own new rows —
/// causal with the diagonal aligned bottom-right (query `start + j` sees keys up to
/// `start + j`). `cu_seqlens_kv` describes that K/V operand: per slice its prefix and its rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PackDocument {
    /// The pack's name in the printed IR (`%f3`, `%b7`).
    pub name: String,
    pub direction: Direction,
    /// The replica's index in `replicas`.
    pub replica: u32,
    /// DP ranks that run it (more than one: a DP-Merge group, as one CP group).
    pub dp_ranks: Vec<u32>,
    /// The token cap it was built under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap: Option<u32>,
    /// Real tokens (rows with a token of a sample).
    #[schemars(range(max = 2147483647))]
    pub tokens: u32,
    /// Rows, padding included (padding follows the slices).
    #[schemars(range(max = 2147483647))]
    pub padded_tokens: u32,
    pub slices: Vec<PackSlice>,
    /// RoPE position of each slice's first row (its `start`).
    #[schemars(inner(range(max = 2147483647)))]
    pub position_offsets: Vec<u32>,
    /// Megatron-Core's `PackedSeqParams`, field for field (lists become int32 tensors).
    pub packed_seq_params: PackedSeqParams,
    /// Members of the CP group that runs the pack (1: no context parallelism); the same as its
    /// replica's `cp_size`.
    #[schemars(range(min = 1))]
    pub cp_size: u32,
    /// CP member `m`'s share of the padding rows, as positions `tokens..padded_tokens` (two
    /// runs, by the rule of `PackSlice::cp_runs`); empty when the pack is not padded.
    #[schemars(inner(inner(inner(range(max = 2147483647)))))]
    pub padding_cp_runs: Vec<[[u32; 2]; 2]>,
    /// Forward packs: the pack's slices grouped by the backward pack that runs them, so that a
    /// trainer can run the forward as one autograd graph per group and each backward pack
    /// backwards exactly its own graphs. Listed in an order that runs each sample's slices by
    /// increasing start (the reverse of their backward packs' order); a later group reads the
    /// K/V an earlier one wrote. Empty for backward packs.
    pub sub_batches: Vec<SubBatch>,
}

/// One slice of a pack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PackSlice {
    /// The slice's index in `slices`.
    pub slice: u32,
    /// The sample's index in `samples`.
    pub sample: u32,
    /// First token of the slice within its sample (its first row's RoPE position).
    #[schemars(range(max = 2147483647))]
    pub start: u32,
    /// One past its last token.
    #[schemars(range(min = 1, max = 2147483647))]
    pub end: u32,
    /// First cached K/V position it reads (0: its sample's whole prefix `[0, start)`).
    #[schemars(range(max = 2147483647))]
    pub kv_start: u32,
    /// Per CP member (in member order), the sample positions it owns of the slice: two
    /// `[start, end)` runs, chunks `m` and `2k − 1 − m` of the slice cut into `2k` chunks at
    /// `start + ⌊j · (end − start) / 2k⌋` (`k = cp_size`; no padding; a run may be empty). A
    /// member computes its rows only, keeps their K/V, and sends and receives their hidden
    /// states along the pipeline.
    #[schemars(inner(inner(inner(range(max = 2147483647)))))]
    pub cp_runs: Vec<[[u32; 2]; 2]>,
}

/// The `qkv_format` of a pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum QkvFormat {
    /// Packed sequences: `[tokens, heads, head_dim]`.
    Thd,
}

/// The pack's varlen metadata, named as Megatron-Core's `PackedSeqParams`
/// (`megatron/core/packed_seq_params.py`): `PackedSeqParams(**p)` works once the four lists
/// are int32 tensors. Every value fits int32.
///
/// `_padded` offsets lay each slice out on a multiple of `pad_multiple` rows (`2 · cp_size`
/// when the pack runs on a CP group, as Transformer Engine's THD context parallelism requires;
/// else 1), and the pack's padding rows extend its last slice: segment `i` spans
/// `ceil(len_i / m) · m` rows, the last `ceil((len_last + padding) / m) · m`. Without CP the
/// `_padded` offsets equal the plain ones except for the last entry, `padded_tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PackedSeqParams {
    /// Always `"thd"`.
    pub qkv_format: QkvFormat,
    /// Query offsets: rows `cu_seqlens_q[i]..cu_seqlens_q[i + 1]` are slice `i`'s; the last
    /// entry is `tokens`.
    #[schemars(inner(range(max = 2147483647)))]
    pub cu_seqlens_q: Vec<u32>,
    /// K/V offsets: slice `i` attends to `cu_seqlens_kv[i + 1] − cu_seqlens_kv[i] =
    /// end − kv_start` keys (its cached prefix, then its own rows).
    #[schemars(inner(range(max = 2147483647)))]
    pub cu_seqlens_kv: Vec<u32>,
    /// `cu_seqlens_q` with each segment padded (see the type's docs).
    #[schemars(inner(range(max = 2147483647)))]
    pub cu_seqlens_q_padded: Vec<u32>,
    /// `cu_seqlens_kv` with each segment padded.
    #[schemars(inner(range(max = 2147483647)))]
    pub cu_seqlens_kv_padded: Vec<u32>,
    /// The longest segment of `cu_seqlens_q_padded`.
    #[schemars(range(max = 2147483647))]
    pub max_seqlen_q: u32,
    /// The longest segment of `cu_seqlens_kv_padded`.
    #[schemars(range(max = 2147483647))]
    pub max_seqlen_kv: u32,
}

/// The slices of a forward pack that one backward pack runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SubBatch {
    /// The backward pack (index into `packs`).
    pub backward_pack: u32,
    /// Indices into the forward pack's `slices`, in pack order.
    pub slices: Vec<u32>,
}

/// The order of one replica's packs on one stage (indices into `packs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleEntry {
    pub replica: u32,
    pub stage: u32,
    pub packs: Vec<u32>,
    /// Zero-bubble schedules: the backward packs whose weight gradient this stage defers, in
    /// the order they run (the backward in `packs` then runs its input gradient only); left
    /// out when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weight_grads: Vec<DeferredWeightGrad>,
}

/// A deferred weight gradient of a [`ScheduleEntry`]: that of backward pack `pack`, run after
/// the first `after` entries of the stage's `packs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeferredWeightGrad {
    pub pack: u32,
    pub after: u32,
}

/// One device and its ops in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Device {
    /// Global rank.
    pub rank: u64,
    /// Its coordinates in `spec.parallel`.
    pub coords: Coords,
    pub ops: Vec<DeviceOp>,
}

/// An op of one device; packs are indices into `packs`, peers are global ranks. TP peers run
/// the same ops; each exchanges with the peers that have its own tp coordinate.
///
/// Point-to-point: every `send` has exactly one matching `recv` (same pack and direction, the
/// two ranks swapped) and vice versa. Sends are non-blocking: post a `send` as an `isend` and
/// go on with the next op without waiting for the receiver (wait for every send before the
/// step's `reduce_scatter`, or before reusing the buffer); a `recv` blocks (`irecv`, then wait
/// before the next op). Blocking sends deadlock on pipelines (stage 0 sending a forward while
/// stage 1 sends a backward); with these semantics the op lists are deadlock-free (slimpack
/// proves it on every lowered program). A trainer may also batch each op's `recv` or `send`
/// with its neighbours' in one `batch_isend_irecv`. With one model chunk per device (`vpp` 1),
/// between two ranks the receiver posts its receives in the order the sender sends (every
/// stage runs a replica's forward packs in one order and its backward packs in one order,
/// which the verifier checks), so transports without tags (NCCL) match them; where there are
/// tags, the pack index serves as one. With model chunks (`vpp > 1`) a rank's neighbour sends
/// forwards and backwards of several chunks, and the receiver uses them in its own order (as in
/// Megatron's interleaved schedule, whose receives are posted one step ahead): match messages
/// by (pack, direction, the receiving chunk), e.g. post the `irecv`s from each neighbour in the
/// order that neighbour's op list sends them and wait on each before its `recv` here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum DeviceOp {
    /// The forward of `pack` on this device's layers (its CP member's rows in a CP group); with
    /// model chunks (`vpp > 1`), on those of chunk `chunk` (pipeline stage `chunk · pp + pp
    /// coordinate`). `chunk` is left out when 0.
    Forward {
        pack: u32,
        #[serde(default, skip_serializing_if = "is_zero")]
        chunk: u32,
    },
    /// The backward of `pack` on this device's layers (of chunk `chunk`). In a zero-bubble
    /// schedule `part` says which part it runs (left out when whole): `input-grad`, the
    /// activation gradients (what a whole backward receives, exchanges and sends is around it;
    /// its weights' input rows and output gradients stay saved), or later `weight-grad`, the
    /// weight gradients from those saved rows (no message, no CP exchange).
    Backward {
        pack: u32,
        #[serde(default, skip_serializing_if = "is_zero")]
        chunk: u32,
        #[serde(default, skip_serializing_if = "Part::is_whole")]
        part: Part,
    },
    /// The context-parallel exchange of `pack` among the ranks of `group` (the pack's CP group,
    /// in member order), before every forward and backward of a pack whose `cp_size` is above
    /// 1: in the forward, per slice and layer, the members all-gather the K/V rows they own of
    /// the slice's prefix and own rows; in the backward they gather them again and sum each
    /// other's dK/dV contributions into the owners' accumulators, in member order.
    CpExchange {
        pack: u32,
        direction: Direction,
        /// Index into `groups`.
        group: u32,
        #[serde(default, skip_serializing_if = "is_zero")]
        chunk: u32,
    },
    /// Send `pack`'s output rows (forward: hidden states to the next stage; backward: input
    /// gradients to the previous stage) to `to`; non-blocking.
    Send {
        pack: u32,
        direction: Direction,
        to: u64,
        /// The model chunk whose output this is.
        #[serde(default, skip_serializing_if = "is_zero")]
        chunk: u32,
    },
    /// Receive `pack`'s input rows (forward: hidden states; backward: output gradients) from
    /// `from`; blocks until they arrived.
    Recv {
        pack: u32,
        direction: Direction,
        from: u64,
        /// The model chunk whose input this is.
        #[serde(default, skip_serializing_if = "is_zero")]
        chunk: u32,
    },
    /// Sum the tied embedding's gradient between the first stage (input embedding) and the
    /// last stage (output projection): `group` holds those two devices (same tp, cp and dp);
    /// both get the sum. Only when the model ties its embeddings and has more than one stage
    /// (with untied embeddings, or one stage, there is no such op).
    TiedEmbeddingAllReduce {
        /// Index into `groups`.
        group: u32,
    },
    /// Reduce-scatter (sum) the stage's gradients among the ranks of `group`: every device of
    /// the stage with this tp coordinate (its DP and CP peers), in rank order.
    ReduceScatter {
        /// Index into `groups`.
        group: u32,
    },
    /// The optimizer step on this device's shard.
    Optimizer,
    /// All-gather the stage's updated parameters among the ranks of `group` (the
    /// `reduce_scatter`'s).
    AllGather {
        /// Index into `groups`.
        group: u32,
    },
}

impl DeviceOp {
    /// The index into `groups` of a collective op's ranks.
    pub fn group(&self) -> Option<u32> {
        match *self {
            DeviceOp::CpExchange { group, .. }
            | DeviceOp::TiedEmbeddingAllReduce { group }
            | DeviceOp::ReduceScatter { group }
            | DeviceOp::AllGather { group } => Some(group),
            DeviceOp::Forward { .. }
            | DeviceOp::Backward { .. }
            | DeviceOp::Send { .. }
            | DeviceOp::Recv { .. }
            | DeviceOp::Optimizer => None,
        }
    }
}

/// A group of global ranks that collectives run over: the ranks of its `runs`, one run after
/// the other, in member order (`[r.first + i * r.stride for r in runs for i in
/// range(r.count)]`). Regular groups are one run: a stage's DP sync group is every `tp`-th rank
/// from its first, a CP group of consecutive DP ranks too. Runs are written greedily (each the
/// longest run with a positive stride starting after the previous one; a lone rank has stride
/// 1), and every rank is below the layout's world size.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RankGroup {
    #[schemars(length(min = 1))]
    pub runs: Vec<RankRun>,
}

/// `count` ranks from `first`, `stride` apart: `first, first + stride, ...`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RankRun {
    pub first: u64,
    #[schemars(range(min = 1))]
    pub stride: u64,
    #[schemars(range(min = 1))]
    pub count: u64,
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}

/// With model chunks (`vpp > 1`): the chunk of each pack pipeline device `pp` runs for
/// `replica`, in order; the device merges its stages' `schedules` by it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InterleaveEntry {
    pub replica: u32,
    pub pp: u32,
    pub chunks: Vec<u32>,
}

/// The order in which DP rank `dp`'s pipeline device `pp` runs the ops of the replicas it is
/// in: `replicas[i]` (an index into `replicas`) is the replica of its `i`-th op, each replica's
/// ops in its schedule's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RankOrderEntry {
    pub dp: u32,
    pub pp: u32,
    pub replicas: Vec<u32>,
}

/// Forward packs (indices into `packs`) that save their activations on stage `stage` under
/// `recompute` (`none`, `selective`, `full`, `block:K`) instead of the stage's mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PackRecomputeEntry {
    pub stage: u32,
    pub recompute: Recompute,
    pub packs: Vec<u32>,
}

/// Errors writing or reading a document.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("not a slimpack schedule (format '{0}', expected '{FORMAT}')")]
    Format(String),
    #[error("schedule version {0} is not supported: this build reads and writes version {VERSION} (compile the step again to get a version {VERSION} document)")]
    Version(u32),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Ir(#[from] slimpack_ir::IrError),
}

/// The document of `ir` (phase `scheduled` or later), with the simulator's metrics if given.
/// Fails only when a pack's metadata would leave the int32 range trainers' kernels take.
///
/// # Panics
/// If `ir` is not scheduled (callers check the phase).
pub fn document(
    ir: &StepIr,
    predicted: Option<serde_json::Value>,
) -> Result<ScheduleDocument, ScheduleError> {
    build::document(ir, predicted)
}

/// Reads a document from JSON text, checking its format and version first (a document of
/// another version gets one line naming both versions, not a field error), then that its
/// layout is valid and every group of ranks, and every op's group index, is in range (so that
/// a reader may expand the groups; [`to_ir`] checks the rest).
pub fn parse(text: &str) -> Result<ScheduleDocument, ScheduleError> {
    #[derive(Deserialize)]
    struct Header {
        format: Option<String>,
        version: Option<u32>,
    }
    let header: Header = serde_json::from_str(text)?;
    let format = header.format.unwrap_or_default();
    if format != FORMAT {
        return Err(ScheduleError::Format(
            slimpack_ir::clip(&format).into_owned(),
        ));
    }
    match header.version {
        Some(VERSION) => {
            let doc = serde_json::from_str(text)?;
            check::groups(&doc)?;
            Ok(doc)
        }
        other => Err(ScheduleError::Version(other.unwrap_or(0))),
    }
}

/// The step IR a document describes (phase `lowered`), verified, so that it simulates, prints
/// and lowers exactly like the IR the document was written from. Every derived field must be
/// what that IR gives: a hand-edited op list, pack metadata or slice table is an error.
pub fn to_ir(doc: &ScheduleDocument) -> Result<StepIr, ScheduleError> {
    read::to_ir(doc)
}

/// The JSON Schema of [`ScheduleDocument`], pretty-printed.
pub fn schema() -> String {
    let schema = schemars::schema_for!(ScheduleDocument);
    let mut text = serde_json::to_string_pretty(&schema).expect("a schema always serialises");
    text.push('\n');
    text
}

mod build;
mod check;
mod devices;
mod groups;
mod layout;
mod read;
#[cfg(test)]
mod tests;
