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

use crate::error::Result;
use crate::pass::{Pass, PassContext, PassInfo, Statistics};
use slimpack_ir::step::{Direction, PackId, Phase, ReplicaId};
use slimpack_ir::StepIr;
use slimpack_machine::cost::CostModel;

pub(crate) const INFO: PassInfo = PassInfo {
    name: "schedule-pipeline",
    summary: "order packs on every stage as a generalised 1F1B pipeline schedule",
    description: "Per replica and stage: warm-up forwards, then one backward as soon as its \
                  forwards have run, one forward otherwise; identical to 1F1B for symmetric \
                  packs. Phase packed -> scheduled.",
    accepts: Phase::Packed..=Phase::Packed,
    produces: Some(Phase::Scheduled),
    options: &[],
    create: |_| Ok(Box::new(SchedulePipeline)),
};

/// The pipeline scheduling pass.
#[derive(Debug, Clone, Copy)]
pub struct SchedulePipeline;

/// The 1F1B order of one replica on stage `stage` of `stages`.
pub(crate) fn one_f_one_b(ir: &StepIr, replica: ReplicaId, warmup: usize) -> Vec<PackId> {
    let forward = ir.packs_on(replica, Direction::Forward);
    let backward = ir.packs_on(replica, Direction::Backward);
    // need[b]: forwards that must have run before backward pack b.
    let position: std::collections::HashMap<PackId, usize> =
        forward.iter().enumerate().map(|(i, &p)| (p, i)).collect();
    let need: Vec<usize> = backward
        .iter()
        .map(|&b| {
            ir.pack_slices(b)
                .iter()
                .filter_map(|&s| ir.pack_of(s, Direction::Forward))
                .map(|f| position[&f] + 1)
                .max()
                .unwrap_or(0)
        })
        .collect();
    // In-flight work is counted in packs when the backward packs are the forward packs (1F1B
    // exactly), in tokens otherwise: the stage keeps `warmup + 1` average forward packs' worth
    // of tokens in flight, however the two partitions cut them.
    let symmetric = forward.len() == backward.len()
        && forward
            .iter()
            .zip(&backward)
            .all(|(&f, &b)| same_slices(ir, f, b));
    let weight = |pack: PackId| if symmetric { 1 } else { ir.pack_tokens(pack) };
    let forward_weights: Vec<u64> = forward.iter().map(|&p| weight(p)).collect();
    let backward_weights: Vec<u64> = backward.iter().map(|&p| weight(p)).collect();
    stage_order(&need, &forward_weights, &backward_weights, warmup)
        .into_iter()
        .map(|op| match op {
            StageOp::Forward(f) => forward[f],
            StageOp::Backward(b) => backward[b],
        })
        .collect()
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
        Ok(schedule(ir, cx.machine()))
    }
}

/// Sets every replica's per-stage 1F1B orders (memory-aware warm-up); the pass's algorithm,
/// also run by `eqsat` on a scheduled step whose packs it changed.
pub(crate) fn schedule(ir: &mut StepIr, cost: &CostModel) -> Statistics {
    let stages = ir.spec.parallel.pp;
    let mut scheduled = 0;
    let mut max_in_flight = 0usize;
    let mut memory_limited = 0usize;
    for replica in ir.replicas().to_vec() {
        if ir.packs_on(replica, Direction::Forward).is_empty() {
            continue;
        }
        let warmups = warmups(ir, replica, cost);
        memory_limited += warmups
            .iter()
            .enumerate()
            .filter(|&(s, &w)| w < (stages - 1) as usize - s)
            .count();
        for (stage, &warmup) in warmups.iter().enumerate() {
            let order = one_f_one_b(ir, replica, warmup);
            let mut in_flight: usize = 0;
            for &pack in &order {
                match ir.pack(pack).direction {
                    Direction::Forward => in_flight += 1,
                    Direction::Backward => in_flight = in_flight.saturating_sub(1),
                }
                max_in_flight = max_in_flight.max(in_flight);
            }
            ir.set_schedule(replica, stage as u32, &order);
        }
        scheduled += 1;
    }
    Statistics::new()
        .with("replicas_scheduled", scheduled)
        .with("max_forwards_in_flight", max_in_flight)
        .with("memory_limited_stages", memory_limited)
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
        let fixed = memory.model_state_bytes(stage) + memory.workspace_bytes();
        let per_pack = memory.activation_bytes(largest, stage) + memory.kv_bytes(largest, stage);
        let fits = memory
            .capacity_bytes()
            .saturating_sub(fixed)
            .checked_div(per_pack)
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

#[cfg(test)]
mod tests {
    use super::{stage_order, StageOp};

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
}
