//! `schedule-pipeline`: order each replica's forward and backward packs on every pipeline stage
//! as a one-forward-one-backward (1F1B) schedule generalised to different forward and backward
//! units.
//!
//! Phase in: `packed`. Phase out: `scheduled`. On stage `s` of `pp`, after a warm-up of
//! `pp - 1 - s` forwards, the stage alternates: the next backward pack runs as soon as every
//! forward pack holding one of its slices has run on this stage and the stage has run
//! `warmup + 1 + (backwards so far)` forwards; otherwise the next forward runs. With identical
//! forward and backward packs this is exactly Megatron's 1F1B.
//!
//! Memory: the warm-up also bounds how many forward packs a stage holds in flight (`warmup + 1`
//! at steady state). Where the largest forward pack's saved activations and K/V times that
//! count would not fit in what the model states leave of device memory, the stage's warm-up
//! shrinks to what fits, and every later stage's warm-up is capped by it.
//!
//! Deadlock freedom: warm-ups never increase along the pipeline, so a stage never runs fewer
//! forwards before a given backward than the stage after it, and every backward a stage waits
//! for is preceded, downstream, only by forwards it has already sent (the verifier proves it on
//! every output).
//!
//! Zero bubble (`zb=true`): every stage's order (1F1B's or the list schedule's) is then split
//! by [`crate::zero_bubble::split_orders`]: each backward runs its input gradient where the
//! order runs the backward and its weight gradient later, in idle time or after the stage's
//! last backward, within the order's activation memory (ZB-H1). Not with model chunks (an
//! error).
//!
//! Interleaved 1F1B (model chunks, `vpp > 1` in the layout): pipeline device `d` holds stages
//! `d, d + pp, ...` and runs every pack once per chunk. Where a replica's forward and backward
//! packs coincide and their count is a multiple of `pp`, every device runs Megatron's
//! interleaved order ([`interleaved_order`]). Elsewhere (asymmetric packs, a ragged count,
//! which Megatron refuses) the order comes from [`list_schedule`], a list schedule in time:
//! every op lasts its pack's time on the machine model, and of the ops whose inputs have run,
//! the one that can start first runs next (a backward on a tie, the deepest chunk first). A
//! device whose forwards in flight fill its memory window (the tokens whose activations and
//! K/V fit in the `memory` fraction of device memory, default the tuner's limit, that the
//! model states leave) waits for a backward; when every device waits, the earliest ready
//! forward runs past its window. Both are executions of the pipeline's dependencies, so
//! neither deadlocks (the verifier proves it on every output). Megatron's order is not
//! reduced for memory: the tuner's memory check rejects a layout that does not fit.

use crate::error::{PassError, Result};
use crate::pass::{OptionInfo, Pass, PassContext, PassInfo, PassOptions, Statistics};
use rustc_hash::FxHashMap;
use slimpack_ir::step::{Direction, PackId, Part, Phase, ReplicaId, SliceId};
use slimpack_ir::StepIr;
use slimpack_machine::cost::{CostModel, DEFAULT_MEMORY_LIMIT};

mod list;
use list::list_schedule;

pub(crate) const INFO: PassInfo = PassInfo {
    name: "schedule-pipeline",
    summary: "order packs on every stage as a generalised 1F1B pipeline schedule",
    description: "Per replica and stage: warm-up forwards, then one backward as soon as its \
                  forwards have run, one forward otherwise; identical to 1F1B for symmetric \
                  packs. Phase packed -> scheduled.",
    accepts: Phase::Packed..=Phase::Packed,
    produces: Some(Phase::Scheduled),
    options: &[
        OptionInfo {
            name: "order",
            help: "auto: 1F1B (Megatron's interleaved order with model chunks) for symmetric \
                   packs, the list schedule in time for the others; 1f1b: the generalised \
                   1F1B for any packs without model chunks",
            default: Some("auto"),
        },
        OptionInfo {
            name: "memory",
            help: "the list schedule's window: the fraction of device memory that forwards \
                   in flight may fill",
            default: Some("0.92"),
        },
        OptionInfo {
            name: "zb",
            help: "true: split every backward into its input and weight gradients and defer \
                   the weight gradients into pipeline idle within the order's memory \
                   (zero-bubble ZB-H1)",
            default: Some("false"),
        },
    ],
    create: |options| Ok(Box::new(SchedulePipeline::from_options(options)?)),
};

/// The pipeline scheduling pass.
#[derive(Debug, Clone, Copy)]
pub struct SchedulePipeline {
    /// Asymmetric packs without model chunks run the generalised 1F1B, not the list schedule.
    pub one_f_one_b: bool,
    /// The fraction of device memory the list schedule fills with forwards in flight (the
    /// tuner's default memory limit unless given).
    pub memory: f64,
    /// Split the backwards (zero-bubble schedule).
    pub zero_bubble: bool,
}

impl Default for SchedulePipeline {
    fn default() -> SchedulePipeline {
        SchedulePipeline {
            one_f_one_b: false,
            memory: DEFAULT_MEMORY_LIMIT,
            zero_bubble: false,
        }
    }
}

impl SchedulePipeline {
    fn from_options(options: &PassOptions) -> Result<SchedulePipeline> {
        let bad = |option: &str, value: String, message: &str| PassError::BadOption {
            pass: INFO.name,
            option: option.into(),
            value,
            message: message.into(),
        };
        let order: String = options
            .get("order", "auto or 1f1b")?
            .expect("declared with a default");
        let one_f_one_b = match order.as_str() {
            "auto" => false,
            "1f1b" => true,
            _ => return Err(bad("order", order, "expected auto or 1f1b")),
        };
        let memory: f64 = options
            .get("memory", "a fraction in (0, 1]")?
            .expect("declared with a default");
        if !(memory > 0.0 && memory <= 1.0) {
            return Err(bad("memory", memory.to_string(), "out of range"));
        }
        let zero_bubble: bool = options
            .get("zb", "true or false")?
            .expect("declared with a default");
        Ok(SchedulePipeline {
            one_f_one_b,
            memory,
            zero_bubble,
        })
    }
}

/// What a replica's 1F1B stage orders depend on, read from the IR once per replica (every
/// stage's order differs only in its warm-up): the forwards each backward pack needs, and the
/// packs' weights (indexed as `packs_on` orders the packs).
struct ReplicaPacks {
    /// needed[b]: the positions of the forward packs holding backward pack b's slices
    /// (what the zero-bubble split reads too).
    needed: Vec<Vec<usize>>,
    /// need[b]: forwards that must have run before backward pack b.
    need: Vec<usize>,
    forward_weights: Vec<u64>,
    backward_weights: Vec<u64>,
}

impl ReplicaPacks {
    fn new(ir: &StepIr, forward: &[PackId], backward: &[PackId], symmetric: bool) -> ReplicaPacks {
        let needed = forwards_needed(ir, forward, backward);
        let need: Vec<usize> = needed
            .iter()
            .map(|positions| positions.last().map_or(0, |&last| last + 1))
            .collect();
        // In-flight work is counted in packs when the backward packs are the forward packs
        // (1F1B exactly), in tokens otherwise: the stage keeps `warmup + 1` average forward
        // packs' worth of tokens in flight, however the two partitions cut them.
        let weight = |pack: PackId| if symmetric { 1 } else { ir.pack_tokens(pack) };
        let forward_weights: Vec<u64> = forward.iter().map(|&p| weight(p)).collect();
        let backward_weights: Vec<u64> = backward.iter().map(|&p| weight(p)).collect();
        ReplicaPacks {
            needed,
            need,
            forward_weights,
            backward_weights,
        }
    }

    /// The 1F1B order of a stage with `warmup` forwards of warm-up.
    fn stage_ops(&self, warmup: usize) -> Vec<ChunkOp> {
        stage_order(
            &self.need,
            &self.forward_weights,
            &self.backward_weights,
            warmup,
        )
        .into_iter()
        .map(|op| {
            let (direction, micro_batch) = match op {
                StageOp::Forward(f) => (Direction::Forward, f),
                StageOp::Backward(b) => (Direction::Backward, b),
            };
            ChunkOp {
                direction,
                micro_batch,
                chunk: 0,
            }
        })
        .collect()
    }
}

/// One pack run on a stage: forward pack `i` or backward pack `j` of the replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StageOp {
    Forward(usize),
    Backward(usize),
}

/// The 1F1B order of one stage: `need[b]` forward packs must run before backward pack `b`;
/// the packs weigh `forward_weights` and `backward_weights` (1 each for symmetric packs,
/// tokens otherwise); `warmup` is the stage's warm-up. The one ordering rule, shared by this
/// pass and by `eqsat`'s makespan.
pub(crate) fn stage_order(
    need: &[usize],
    forward_weights: &[u64],
    backward_weights: &[u64],
    warmup: usize,
) -> Vec<StageOp> {
    let (forwards, backwards) = (forward_weights.len(), backward_weights.len());
    let forward_prefix = prefix_sums(forward_weights.iter().copied());
    let backward_prefix = prefix_sums(backward_weights.iter().copied());
    let mean_forward = forward_prefix.last().copied().unwrap_or(0) as f64 / forwards.max(1) as f64;
    let window = ((warmup + 1) as f64 * mean_forward).round() as u64;
    let (mut f, mut b) = (0, 0);
    let mut order = Vec::with_capacity(forwards + backwards);
    while f < forwards || b < backwards {
        // A backward runs `warmup` forwards after the last forward it needs, as in 1F1B: the
        // stage keeps the pipeline fed while that forward travels to the last stage and back.
        let backward_ready = b < backwards && f >= (need[b] + warmup).min(forwards);
        let steady = f == forwards || forward_prefix[f] >= window + backward_prefix[b];
        if backward_ready && steady {
            order.push(StageOp::Backward(b));
            b += 1;
        } else {
            order.push(StageOp::Forward(f));
            f += 1;
        }
    }
    order
}

/// `[0, w0, w0 + w1, ...]`.
fn prefix_sums(weights: impl Iterator<Item = u64>) -> Vec<u64> {
    let mut sums = vec![0];
    for weight in weights {
        sums.push(sums.last().copied().unwrap_or(0) + weight);
    }
    sums
}

/// Whether a replica's backward packs are its forward packs (the same slices, pack by pack):
/// conventional micro-batches.
fn symmetric_packs(ir: &StepIr, forward: &[PackId], backward: &[PackId]) -> bool {
    forward.len() == backward.len()
        && forward
            .iter()
            .zip(backward)
            .all(|(&f, &b)| same_slices(ir, f, b))
}

/// The position in `forward` of the pack holding each of their slices. Read from the packs'
/// members (one walk of each pack's edges), not from each slice's packs: on a million-sample
/// step the per-slice walks were a third of `schedule-pipeline`.
pub(crate) fn forward_positions(ir: &StepIr, forward: &[PackId]) -> FxHashMap<SliceId, usize> {
    let mut position: FxHashMap<SliceId, usize> = FxHashMap::default();
    for (index, &pack) in forward.iter().enumerate() {
        for &slice in ir.pack_members(pack) {
            position.entry(slice).or_insert(index);
        }
    }
    position
}

/// For each backward pack, the positions in `forward` of the packs holding its slices,
/// ascending and distinct.
pub(crate) fn forwards_needed(
    ir: &StepIr,
    forward: &[PackId],
    backward: &[PackId],
) -> Vec<Vec<usize>> {
    let position = forward_positions(ir, forward);
    backward
        .iter()
        .map(|&pack| {
            let mut positions: Vec<usize> = (ir.pack_members(pack).iter())
                .filter_map(|slice| position.get(slice).copied())
                .collect();
            positions.sort_unstable();
            positions.dedup();
            positions
        })
        .collect()
}

/// The most forwards an order holds in flight at once (each backward retires one).
fn most_forwards_in_flight(order: impl Iterator<Item = Direction>) -> usize {
    let (mut in_flight, mut most) = (0usize, 0usize);
    for direction in order {
        match direction {
            Direction::Forward => in_flight += 1,
            Direction::Backward => in_flight = in_flight.saturating_sub(1),
        }
        most = most.max(in_flight);
    }
    most
}

/// Whether two packs hold the same slices (in any order).
fn same_slices(ir: &StepIr, a: PackId, b: PackId) -> bool {
    let mut left = ir.pack_slices(a);
    let mut right = ir.pack_slices(b);
    left.sort_unstable();
    right.sort_unstable();
    left == right
}

impl Pass for SchedulePipeline {
    fn info(&self) -> &'static PassInfo {
        &INFO
    }

    fn run(&mut self, ir: &mut StepIr, cx: &PassContext) -> Result<Statistics> {
        if self.zero_bubble && ir.spec.parallel.vpp > 1 {
            return Err(PassError::Failed {
                pass: INFO.name,
                message: format!(
                    "zb=true splits backwards on one model chunk per device; the layout has vpp={}",
                    ir.spec.parallel.vpp
                ),
            });
        }
        Ok(schedule(ir, cx.machine(), *self))
    }
}

/// Sets every replica's orders: 1F1B (memory-aware warm-up) or Megatron's interleaved order
/// where its packs are symmetric, the list schedule in time elsewhere (see the module docs),
/// split into zero-bubble orders where asked; the pass's algorithm, also run by `eqsat` on a
/// scheduled step whose packs it changed.
pub(crate) fn schedule(ir: &mut StepIr, cost: &CostModel, pass: SchedulePipeline) -> Statistics {
    let parallel = ir.spec.parallel;
    let (pp, vpp) = (parallel.pp, parallel.vpp);
    let mut scheduled = 0;
    let (mut one_f_one_b_replicas, mut megatron, mut listed) = (0, 0, 0);
    let mut max_in_flight = 0usize;
    let mut memory_limited = 0usize;
    let mut split_backwards = 0usize;
    for replica in ir.replicas().to_vec() {
        let forward = ir.packs_on(replica, Direction::Forward);
        let backward = ir.packs_on(replica, Direction::Backward);
        if forward.is_empty() {
            continue;
        }
        scheduled += 1;
        let symmetric = symmetric_packs(ir, &forward, &backward);
        let packs = ReplicaPacks::new(ir, &forward, &backward, symmetric);
        // Per device, the ops in run order.
        let orders: Vec<Vec<ChunkOp>> = if vpp == 1 && (symmetric || pass.one_f_one_b) {
            one_f_one_b_replicas += 1;
            let warmups = warmups(ir, replica, cost);
            memory_limited += warmups
                .iter()
                .enumerate()
                .filter(|&(s, &w)| w < (pp - 1) as usize - s)
                .count();
            warmups
                .iter()
                .map(|&warmup| packs.stage_ops(warmup))
                .collect()
        } else {
            let exact: Option<Vec<Vec<ChunkOp>>> = if symmetric {
                (0..pp)
                    .map(|device| interleaved_order(pp, vpp, device, forward.len()))
                    .collect()
            } else {
                None
            };
            match exact {
                Some(orders) => {
                    megatron += 1;
                    orders
                }
                None => {
                    listed += 1;
                    list_schedule(
                        ir,
                        replica,
                        &forward,
                        &backward,
                        &packs.need,
                        cost,
                        pass.memory,
                    )
                }
            }
        };
        let mut stage_orders: Vec<Vec<PackId>> = vec![Vec::new(); (pp * vpp) as usize];
        for (device, order) in orders.iter().enumerate() {
            let directions = order.iter().map(|op| op.direction);
            max_in_flight = max_in_flight.max(most_forwards_in_flight(directions));
            for op in order {
                stage_orders[(op.chunk * pp) as usize + device].push(match op.direction {
                    Direction::Forward => forward[op.micro_batch],
                    Direction::Backward => backward[op.micro_batch],
                });
            }
            if vpp > 1 {
                let chunks: Vec<u32> = order.iter().map(|op| op.chunk).collect();
                ir.set_interleave(replica, device as u32, &chunks);
            }
        }
        if pass.zero_bubble && vpp == 1 {
            let split = crate::zero_bubble::split_orders(
                ir,
                replica,
                &stage_orders,
                (&forward, &backward, &packs.needed),
                cost,
            );
            for (stage, ops) in split.iter().enumerate() {
                split_backwards += ops.iter().filter(|op| op.part == Part::WeightGrad).count();
                ir.set_stage_ops(replica, stage as u32, ops);
            }
        } else {
            for (stage, order) in stage_orders.iter().enumerate() {
                ir.set_schedule(replica, stage as u32, order);
            }
        }
    }
    let mut statistics = Statistics::new().with("replicas_scheduled", scheduled);
    if vpp > 1 {
        statistics.set("replicas_megatron_interleaved", megatron);
    } else {
        statistics.set("replicas_one_f_one_b", one_f_one_b_replicas);
    }
    statistics.set("replicas_list_scheduled", listed);
    statistics.set("max_forwards_in_flight", max_in_flight);
    statistics.set("memory_limited_stages", memory_limited);
    if pass.zero_bubble {
        statistics.set("split_backwards", split_backwards);
    }
    statistics
}

/// Warm-up forwards of each stage of one replica: `pp - 1 - s`, reduced to what fits in
/// memory, and never larger than the previous stage's.
fn warmups(ir: &StepIr, replica: ReplicaId, cost: &CostModel) -> Vec<usize> {
    let stages = ir.spec.parallel.pp;
    let memory = cost.memory();
    let cp = ir.replica(replica).ranks.len().max(1) as u64;
    let largest = ir
        .packs_on(replica, Direction::Forward)
        .iter()
        .map(|&p| ir.pack_tokens(p))
        .max()
        .unwrap_or(0)
        .div_ceil(cp);
    let mut result: Vec<usize> = Vec::with_capacity(stages as usize);
    for stage in 0..stages {
        let fits = (memory.activation_budget(stage, 1.0))
            .checked_div(memory.held_bytes(largest, stage))
            .unwrap_or(u64::MAX);
        let by_memory = fits.saturating_sub(1) as usize;
        let mut warmup = ((stages - 1 - stage) as usize).min(by_memory);
        if let Some(&previous) = result.last() {
            warmup = warmup.min(previous);
        }
        result.push(warmup);
    }
    result
}

/// One op of an interleaved 1F1B order: `direction` of micro-batch `micro_batch` through model
/// chunk `chunk` of the device stage (virtual stage `chunk · pp + stage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkOp {
    pub direction: Direction,
    pub micro_batch: usize,
    pub chunk: u32,
}

/// Megatron-LM's interleaved 1F1B order (`forward_backward_pipelining_with_interleaving` in
/// megatron/core/pipeline_parallel/schedules.py) of device stage `stage` of `stages`, each
/// holding `chunks` model chunks, for `micro_batches` micro-batches.
///
/// Forwards run micro-batches in groups of `stages` (Megatron's default
/// `microbatch_group_size_per_vp_stage`): a group through chunk 0, then the same group through
/// chunk 1, ...; the last group takes whatever micro-batches remain. Backwards follow the same
/// table with the chunks reversed. The stage first runs `(stages - stage - 1) · 2 +
/// (chunks - 1) · stages` forwards (every forward when there are only `stages` micro-batches,
/// as Megatron does), then alternates one forward and one backward, then drains the backwards.
///
/// `None` unless there are two chunks or more and the micro-batches are a positive multiple of
/// `stages`: Megatron's long-standing requirement ("number of microbatches is not divisible by
/// pipeline-parallel size when using interleaved schedule"); with a ragged last group the
/// warm-up above can deadlock (pp = 4, 3 chunks, 5 micro-batches does). One chunk is plain
/// 1F1B ([`stage_order`]).
pub fn interleaved_order(
    stages: u32,
    chunks: u32,
    stage: u32,
    micro_batches: usize,
) -> Option<Vec<ChunkOp>> {
    let group = stages as usize;
    if chunks < 2 || group == 0 || micro_batches == 0 || micro_batches % group != 0 {
        return None;
    }
    let mut table: Vec<(usize, u32)> = Vec::with_capacity(micro_batches * chunks as usize);
    let mut first = 0;
    while first < micro_batches {
        let end = if first + group >= micro_batches {
            micro_batches
        } else {
            first + group
        };
        for chunk in 0..chunks {
            table.extend((first..end).map(|micro_batch| (micro_batch, chunk)));
        }
        first = end;
    }
    let total = table.len();
    let warmup = if micro_batches == group {
        total
    } else {
        let rest = ((stages - stage - 1) * 2 + (chunks - 1) * stages) as usize;
        rest.min(total)
    };
    let forward = |k: usize| ChunkOp {
        direction: Direction::Forward,
        micro_batch: table[k].0,
        chunk: table[k].1,
    };
    let backward = |k: usize| ChunkOp {
        direction: Direction::Backward,
        micro_batch: table[k].0,
        chunk: chunks - 1 - table[k].1,
    };
    let mut order: Vec<ChunkOp> = (0..warmup).map(forward).collect();
    for k in 0..total - warmup {
        order.push(forward(warmup + k));
        order.push(backward(k));
    }
    order.extend((total - warmup..total).map(backward));
    Some(order)
}

#[cfg(test)]
mod tests {
    use super::{interleaved_order, stage_order, ChunkOp, StageOp};
    use slimpack_ir::step::Direction;

    #[test]
    fn symmetric_packs_run_as_one_f_one_b() {
        use StageOp::{Backward as B, Forward as F};
        // Two stages, three forwards, three backwards each needing its own forward.
        let ones = [1, 1, 1];
        assert_eq!(
            stage_order(&[1, 2, 3], &ones, &ones, 1),
            vec![F(0), F(1), B(0), F(2), B(1), B(2)]
        );
        assert_eq!(
            stage_order(&[1, 2, 3], &ones, &ones, 0),
            vec![F(0), B(0), F(1), B(1), F(2), B(2)]
        );
        // A backward waits for the forwards holding its slices.
        assert_eq!(
            stage_order(&[2, 2], &[1, 1], &[1, 1], 0),
            vec![F(0), F(1), B(0), B(1)]
        );
    }

    /// Asymmetric packs count in-flight work in tokens: a backward waits until the forwards
    /// in flight hold the window's tokens (`warmup + 1` mean forward packs), however many
    /// packs that takes.
    #[test]
    fn asymmetric_packs_count_tokens_in_flight() {
        use StageOp::{Backward as B, Forward as F};
        assert_eq!(
            stage_order(&[1, 3], &[10, 10, 280], &[10, 290], 0),
            vec![F(0), F(1), F(2), B(0), B(1)]
        );
        assert_eq!(
            stage_order(&[1, 3], &[1, 1, 1], &[1, 1], 0),
            vec![F(0), B(0), F(1), F(2), B(1)]
        );
    }

    fn op(text: &str) -> ChunkOp {
        // "F2c1": forward of micro-batch 2 through chunk 1.
        let direction = match &text[..1] {
            "F" => Direction::Forward,
            _ => Direction::Backward,
        };
        let (micro_batch, chunk) = text[1..].split_once('c').unwrap();
        ChunkOp {
            direction,
            micro_batch: micro_batch.parse().unwrap(),
            chunk: chunk.parse().unwrap(),
        }
    }

    fn ops(text: &str) -> Vec<ChunkOp> {
        text.split_whitespace().map(op).collect()
    }

    /// pp = 2, two chunks, four micro-batches, worked by hand from Megatron's table: forwards
    /// (0,c0) (1,c0) (0,c1) (1,c1) (2,c0) (3,c0) (2,c1) (3,c1); stage 0 warms up with
    /// 1·2 + 1·2 = 4 forwards, stage 1 with 0 + 2.
    #[test]
    fn interleaved_order_matches_megatron_by_hand() {
        let interleaved_order = |stages, chunks, stage, micro_batches| {
            interleaved_order(stages, chunks, stage, micro_batches).unwrap()
        };
        assert_eq!(
            interleaved_order(2, 2, 0, 4),
            ops("F0c0 F1c0 F0c1 F1c1 \
                 F2c0 B0c1 F3c0 B1c1 F2c1 B0c0 F3c1 B1c0 \
                 B2c1 B3c1 B2c0 B3c0")
        );
        assert_eq!(
            interleaved_order(2, 2, 1, 4),
            ops("F0c0 F1c0 \
                 F0c1 B0c1 F1c1 B1c1 F2c0 B0c0 F3c0 B1c0 F2c1 B2c1 F3c1 B3c1 \
                 B2c0 B3c0")
        );
        // As many micro-batches as stages: every forward first (Megatron's all-warm-up case).
        assert_eq!(
            interleaved_order(2, 2, 1, 2),
            ops("F0c0 F1c0 F0c1 F1c1 B0c1 B1c1 B0c0 B1c0")
        );
    }

    #[test]
    fn interleaving_needs_chunks_and_whole_groups_of_micro_batches() {
        assert!(interleaved_order(2, 1, 0, 4).is_none());
        assert!(interleaved_order(4, 2, 0, 6).is_none());
        assert!(interleaved_order(4, 2, 0, 0).is_none());
        assert!(interleaved_order(4, 2, 3, 8).is_some());
    }

    /// Runs every device's interleaved order on a unit-time pipeline of `stages · chunks`
    /// virtual stages (chunk `c` of device `s` is virtual stage `c · stages + s`): a forward
    /// needs the micro-batch's forward on the previous virtual stage, a backward its backward
    /// on the next one (the last virtual stage: its own forward). Returns whether every op ran.
    fn runs_to_completion(orders: &[Vec<ChunkOp>], chunks: u32, micro_batches: usize) -> bool {
        let stages = orders.len() as u32;
        let virtual_stages = (stages * chunks) as usize;
        let mut next = vec![0usize; stages as usize];
        let mut forward_done = vec![vec![false; micro_batches]; virtual_stages];
        let mut backward_done = vec![vec![false; micro_batches]; virtual_stages];
        loop {
            let mut ran = Vec::new();
            for (stage, order) in orders.iter().enumerate() {
                let Some(op) = order.get(next[stage]) else {
                    continue;
                };
                let at = op.chunk as usize * stages as usize + stage;
                let ready = match op.direction {
                    Direction::Forward => at == 0 || forward_done[at - 1][op.micro_batch],
                    Direction::Backward if at + 1 == virtual_stages => {
                        forward_done[at][op.micro_batch]
                    }
                    Direction::Backward => backward_done[at + 1][op.micro_batch],
                };
                if ready {
                    ran.push((stage, at, *op));
                }
            }
            if ran.is_empty() {
                return next
                    .iter()
                    .zip(orders)
                    .all(|(&done, order)| done == order.len());
            }
            for (stage, at, op) in ran {
                next[stage] += 1;
                match op.direction {
                    Direction::Forward => forward_done[at][op.micro_batch] = true,
                    Direction::Backward => backward_done[at][op.micro_batch] = true,
                }
            }
        }
    }

    /// Every op of every micro-batch and chunk appears once per direction, and the schedule
    /// never deadlocks, for the layouts Megatron accepts (whole groups of `pp` micro-batches).
    #[test]
    fn interleaved_order_is_complete_and_deadlock_free() {
        for stages in 2..=4u32 {
            for chunks in 2..=3u32 {
                for groups in 1..=3usize {
                    let micro_batches = groups * stages as usize;
                    for stage in 0..stages {
                        let order =
                            interleaved_order(stages, chunks, stage, micro_batches).unwrap();
                        assert_eq!(order.len(), 2 * micro_batches * chunks as usize);
                        let mut seen = order.clone();
                        seen.sort_by_key(|o| (o.direction, o.micro_batch, o.chunk));
                        seen.dedup();
                        assert_eq!(seen.len(), order.len());
                    }
                    let orders: Vec<Vec<ChunkOp>> = (0..stages)
                        .map(|stage| interleaved_order(stages, chunks, stage, micro_batches))
                        .collect::<Option<_>>()
                        .unwrap();
                    assert!(
                        runs_to_completion(&orders, chunks, micro_batches),
                        "pp={stages} v={chunks} m={micro_batches}"
                    );
                }
            }
        }
        // The model catches a deadlock: stage 0 waiting for a backward before it sends on
        // the forwards that backward needs.
        let mut orders: Vec<Vec<ChunkOp>> = (0..2)
            .map(|stage| interleaved_order(2, 2, stage, 4))
            .collect::<Option<_>>()
            .unwrap();
        let first_backward = orders[0]
            .iter()
            .position(|o| o.direction == Direction::Backward)
            .unwrap();
        let backward = orders[0].remove(first_backward);
        orders[0].insert(1, backward);
        assert!(!runs_to_completion(&orders, 2, 4));
    }
}
