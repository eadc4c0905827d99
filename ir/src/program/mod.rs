//! The lowered program: what every device runs, in order, and the layout of every pack.
//!
//! Lowering ([`lower`]) turns a scheduled [`StepIr`] into a [`Program`]: one op
//! list per *worker* — a (DP rank, pipeline stage) pair, i.e. the TP x static-CP devices that run
//! the same ops in lockstep — and a [`PackLayout`] per pack with what a varlen attention kernel
//! needs (slices, `cu_seqlens_q/k`, `max_seqlen_q/k`, position offsets). It is what codegen and
//! the runtimes consume; the schedule JSON expands it to one entry per global rank.
//!
//! Semantics of a worker's ops:
//! - `fwd p` / `bwd p` run pack `p` on the worker's layers; a pack of a DP-Merge group runs on
//!   every member, each taking its share of the tokens, preceded by `cp-exchange p` among the
//!   group (the K/V ring of context parallelism; the kernels overlap it with attention);
//! - `recv`/`send` move a pack's activations forward (stage `s` -> `s + 1`) or its gradients
//!   backward (`s + 1` -> `s`) between workers of the same DP rank; sends are asynchronous,
//!   receives block until the matching send happened (matched by pack and direction: with
//!   model chunks a worker may use a neighbour's messages in another order than they were
//!   sent);
//! - after its last backward, each worker takes part in its stage's gradient `reduce-scatter`
//!   over every DP rank, runs the `optimizer` on its shard and `all-gather`s the parameters.
//!
//! Order: a worker runs the packs of each replica it belongs to in that replica's schedule order.
//! A DP rank in a plain replica and in a DP-Merge group runs the replicas one after the other in
//! IR order (replica-major; every worker meets the replicas in the same order, so the program is
//! deadlock-free whenever each replica's schedule is, which the verifier proves), unless the
//! step gives the rank's pipeline device an order of its own (`StepIr::rank_order`, written by
//! the `interleave-ranks` pass): then its ops interleave the replicas' in that order
//! (`StepIr::rank_schedule`), and the verifier proves the program runs to the end. [`check`]
//! proves it again on the op lists themselves.
//!
//! Under context parallelism each member of a pack's CP group holds a share of every slice
//! ([`CpShard`], the one definition of that split for the runtimes and the schedule JSON).
//!
//! A lowered step carries its program ([`StepIr::program`]), stored by [`lower_into`] — what
//! the `lower` pass, the IR text parser and the schedule JSON reader call to make a lowered
//! step. Everything else (the printer, codegen, the runtimes) reads the stored program; the
//! verifier re-derives it once to prove the stored one is the schedule's.

pub mod abi;
mod check;
mod cp_shard;
mod lower;
mod print;

pub use check::{check, ProgramError};
pub use cp_shard::CpShard;
pub use lower::{lower, pack_order};
pub use print::print_workers;

use std::borrow::Cow;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::step::{Direction, Part, StepIr};

/// The program of a scheduled step: the one it carries when lowered, else its lowering now (a
/// step compiled by a pipeline that stops at `schedule-pipeline`). Consumers — codegen, the
/// runtimes, the CLI — read programs through this, never through [`lower`].
///
/// # Panics
/// If `ir` is not scheduled (callers check the phase).
pub fn program_of(ir: &StepIr) -> Cow<'_, Program> {
    match ir.program() {
        Some(program) => Cow::Borrowed(program),
        None => Cow::Owned(lower(ir)),
    }
}

/// Lowers `ir` (phase `scheduled` or later), stores the program in `ir`, and proves it
/// executable (an error leaves the program stored, for the verifier to name).
pub fn lower_into(ir: &mut StepIr) -> Result<(), ProgramError> {
    let program = lower(ir);
    let executable = check(&program);
    ir.set_program(program);
    executable
}

/// A worker: the devices of one DP rank on one pipeline stage.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub struct Worker {
    /// DP rank, `0..dp` of the layout.
    pub dp: u32,
    /// Pipeline stage, `0..pp`.
    pub pp: u32,
}

/// One op of a worker's program. Packs are indices into [`Program::packs`]. With model
/// chunks (`vpp > 1`) a worker runs each pack once per chunk it holds: `chunk` says which
/// (pipeline stage `chunk · pp + worker.pp`); it is 0, and left out of the JSON, otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Run the forward of `pack` on this worker's layers (of model chunk `chunk`).
    Forward {
        pack: u32,
        #[serde(default, skip_serializing_if = "is_zero")]
        chunk: u32,
    },
    /// Run the backward of `pack` on this worker's layers (of model chunk `chunk`): all of it,
    /// or, in a zero-bubble schedule, its input-gradient or its weight-gradient part (`part`;
    /// left out of the JSON when whole). The input gradient receives and sends what a whole
    /// backward does; the weight gradient, later, only adds into the weight gradients.
    Backward {
        pack: u32,
        #[serde(default, skip_serializing_if = "is_zero")]
        chunk: u32,
        #[serde(default, skip_serializing_if = "Part::is_whole")]
        part: Part,
    },
    /// Exchange K/V (forward) or K/V and their gradients (backward) of `pack` among the DP ranks
    /// of its DP-Merge group (context parallelism across merged replicas).
    CpExchange {
        pack: u32,
        direction: Direction,
        group: Vec<u32>,
        #[serde(default, skip_serializing_if = "is_zero")]
        chunk: u32,
    },
    /// Send `pack`'s activations (forward) or input gradients (backward) of model chunk
    /// `chunk` to `to`.
    Send {
        pack: u32,
        direction: Direction,
        to: Worker,
        #[serde(default, skip_serializing_if = "is_zero")]
        chunk: u32,
    },
    /// Receive `pack`'s activations (forward) or output gradients (backward) for model chunk
    /// `chunk` from `from`.
    Recv {
        pack: u32,
        direction: Direction,
        from: Worker,
        #[serde(default, skip_serializing_if = "is_zero")]
        chunk: u32,
    },
    /// Reduce-scatter this stage's gradients over every DP rank (ZeRO-1 style).
    ReduceScatter,
    /// The optimizer step on this worker's shard of the stage's parameters.
    Optimizer,
    /// All-gather the updated parameters of the stage over every DP rank.
    AllGather,
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}

fn one() -> u32 {
    1
}

fn is_one(value: &u32) -> bool {
    *value == 1
}

impl Op {
    /// The op's keyword in the text form and in statistics.
    pub fn keyword(&self) -> &'static str {
        match self {
            Op::Forward { .. } => "fwd",
            Op::Backward { .. } => "bwd",
            Op::CpExchange { .. } => "cp-exchange",
            Op::Send { .. } => "send",
            Op::Recv { .. } => "recv",
            Op::ReduceScatter => "reduce-scatter",
            Op::Optimizer => "optimizer",
            Op::AllGather => "all-gather",
        }
    }

    /// The pack the op works on, if any.
    pub fn pack(&self) -> Option<u32> {
        match *self {
            Op::Forward { pack, .. }
            | Op::Backward { pack, .. }
            | Op::CpExchange { pack, .. }
            | Op::Send { pack, .. }
            | Op::Recv { pack, .. } => Some(pack),
            Op::ReduceScatter | Op::Optimizer | Op::AllGather => None,
        }
    }

    /// The model chunk the op works on (0 for the stage-wide collectives).
    pub fn chunk(&self) -> u32 {
        match *self {
            Op::Forward { chunk, .. }
            | Op::Backward { chunk, .. }
            | Op::CpExchange { chunk, .. }
            | Op::Send { chunk, .. }
            | Op::Recv { chunk, .. } => chunk,
            Op::ReduceScatter | Op::Optimizer | Op::AllGather => 0,
        }
    }
}

/// A worker and its ops, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WorkerProgram {
    pub worker: Worker,
    pub ops: Vec<Op>,
}

/// One slice of a pack as a varlen attention kernel sees it: queries are the slice's tokens
/// `[start, end)` of its sample, keys and values are `[kv_start, end)` (the slice and the prefix
/// of its sample before it, carried over from earlier slices), causal with the diagonal aligned
/// bottom-right (query `start + i` sees keys up to `start + i`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SliceLayout {
    /// The sample's index in the batch (its order in the IR).
    pub sample: u32,
    /// First token of the slice within its sample.
    pub start: u32,
    /// One past its last token.
    pub end: u32,
    /// First key/value token (0: the whole prefix of the sample).
    pub kv_start: u32,
}

/// A pack: its slices in order and the varlen metadata derived from them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PackLayout {
    /// The pack's name in the printed IR (`%f3`, `%b7`).
    pub name: String,
    pub direction: Direction,
    /// The replica's index in the IR.
    pub replica: u32,
    /// DP ranks that run it (more than one: a DP-Merge group, as one CP group).
    pub dp_ranks: Vec<u32>,
    pub slices: Vec<SliceLayout>,
    /// Tokens the pack occupies, padding included (padding follows the slices).
    pub padded_tokens: u32,
    /// Query offsets: `cu_seqlens_q[i]..cu_seqlens_q[i + 1]` are slice `i`'s rows of the packed
    /// (THD) tensor; the last entry is the pack's real token count.
    pub cu_seqlens_q: Vec<u32>,
    /// Key/value offsets: slice `i` attends to `cu_seqlens_k[i + 1] - cu_seqlens_k[i]` keys.
    pub cu_seqlens_k: Vec<u32>,
    pub max_seqlen_q: u32,
    pub max_seqlen_k: u32,
    /// Position id of each slice's first token (its offset in the sample; RoPE positions).
    pub position_offsets: Vec<u32>,
}

impl PackLayout {
    /// The pack's real tokens (without padding).
    pub fn tokens(&self) -> u32 {
        self.cu_seqlens_q.last().copied().unwrap_or(0)
    }
}

/// The lowered step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Program {
    /// Pipeline devices (the `pp` coordinate of workers).
    pub pp: u32,
    /// Model chunks per pipeline device (`vpp`; 1 when the model is not interleaved).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub vpp: u32,
    /// DP ranks.
    pub dp: u32,
    /// Every pack, in the IR's canonical order (per replica, forward packs then backward).
    pub packs: Vec<PackLayout>,
    /// Every worker, DP rank fastest then stage (`workers[pp * dp + dp_rank]`).
    pub workers: Vec<WorkerProgram>,
}

impl Program {
    /// The program of `worker`.
    pub fn worker(&self, worker: Worker) -> &WorkerProgram {
        &self.workers[(worker.pp * self.dp + worker.dp) as usize]
    }

    /// Number of ops of each kind, by keyword, in a fixed order.
    pub fn op_counts(&self) -> Vec<(&'static str, usize)> {
        const KINDS: [&str; 8] = [
            "fwd",
            "bwd",
            "cp-exchange",
            "send",
            "recv",
            "reduce-scatter",
            "optimizer",
            "all-gather",
        ];
        let mut counts = [0usize; KINDS.len()];
        for op in self.workers.iter().flat_map(|w| &w.ops) {
            let index = KINDS.iter().position(|&k| k == op.keyword()).unwrap_or(0);
            counts[index] += 1;
        }
        KINDS.into_iter().zip(counts).collect()
    }
}

#[cfg(test)]
mod tests;
