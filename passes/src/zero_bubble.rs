//! Zero-bubble stage orders: a replica's 1F1B orders with every backward split into its input
//! gradient (B, on the pipeline's critical path) and its weight gradient (W, deferred), the
//! ZB-H1 schedule of Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), for slimpack's
//! variable-length and asymmetric packs. `schedule-pipeline{zb=true}` runs it.
//!
//! The forwards and input gradients keep their 1F1B order on every stage; only the weight
//! gradients move. The stages are played forward in time with the cost model's durations (a
//! forward needs its forward on the previous stage, an input gradient its input gradient on
//! the next stage, on the last stage the forwards of its slices; sends are not timed). Before
//! each forward or input gradient a stage runs its oldest pending weight gradients:
//! - where one fits whole in the idle gap before that op can start (it delays nothing), and
//! - where the op would otherwise take the stage past its memory bound: the highest memory the
//!   stage's fused 1F1B order reaches, counted as a forward's saved activations and K/V (freed
//!   by the input gradient) and a deferred weight gradient's inputs and output gradients
//!   (freed by the weight gradient, [`MemoryModel::weight_grad_bytes`]). So the schedule keeps
//!   1F1B's activation memory, as ZB-H1 does. A backward that exceeds the bound with no
//!   weight gradient pending stays whole.
//!
//! The remaining weight gradients run after the stage's last input gradient, where 1F1B's
//! drain left the later stages idle. A weight gradient right after its own input gradient is
//! still a split worth keeping: the gradient leaves for the previous stage when the input
//! gradient ends, and the weight gradient runs beside that send (running such pairs whole
//! measured 0.7-2.3% slower steps in S4, S6 and H1). The result is a list of stage orders for
//! `StepIr::set_stage_ops`; deadlock-free because the forward/backward order is 1F1B's and a
//! weight gradient only waits for its own input gradient.
//!
//! [`MemoryModel::weight_grad_bytes`]: slimpack_machine::cost::MemoryModel::weight_grad_bytes

use std::collections::VecDeque;

use rustc_hash::FxHashMap as HashMap;

use slimpack_ir::step::{Direction, PackId, Part, ReplicaId, StageOp};
use slimpack_ir::StepIr;
use slimpack_machine::cost::{CostModel, PackWork, StageEnds};

/// Durations and memory of one pack on one stage.
#[derive(Debug, Clone, Copy, Default)]
struct PackCost {
    /// Forward, or input gradient of a split backward.
    critical_s: f64,
    /// The weight gradient of a split backward (0 for a forward).
    weight_s: f64,
    /// Saved activations and K/V: allocated by the forward, freed by the backward.
    saved_bytes: u64,
    /// What a deferred weight gradient keeps.
    deferred_bytes: u64,
}

/// The zero-bubble orders of `replica` on each of its stages, from `orders`, its 1F1B orders
/// (one per stage, forwards and backwards each once), given its forward and backward packs and
/// the forwards each backward needs (`schedule_pipeline::forwards_needed`). Needs one model
/// chunk per device.
pub(crate) fn split_orders(
    ir: &StepIr,
    replica: ReplicaId,
    orders: &[Vec<PackId>],
    (forward, backward, needed): (&[PackId], &[PackId], &[Vec<usize>]),
    cost: &CostModel,
) -> Vec<Vec<StageOp>> {
    let stages = orders.len();
    let packs: &[PackId] = orders.first().map_or(&[], Vec::as_slice);
    let costs = pack_costs(ir, replica, packs, stages, cost);
    let index: HashMap<PackId, usize> = packs.iter().enumerate().map(|(i, &p)| (p, i)).collect();
    // The forwards each backward needs on the last stage.
    let needs: HashMap<PackId, Vec<PackId>> = backward
        .iter()
        .zip(needed)
        .map(|(&b, positions)| {
            let mut forwards: Vec<PackId> = positions.iter().map(|&i| forward[i]).collect();
            forwards.sort_unstable();
            (b, forwards)
        })
        .collect();
    let cost_of = |stage: usize, pack: PackId| costs[stage][index[&pack]];
    let bounds: Vec<u64> = (0..stages)
        .map(|stage| fused_peak(ir, &orders[stage], |p| cost_of(stage, p)))
        .collect();

    let mut stage_states: Vec<StageState> = (0..stages).map(|_| StageState::default()).collect();
    let mut done: Vec<Vec<Option<f64>>> = vec![vec![None; packs.len()]; stages];
    let mut remaining = orders.iter().map(Vec::len).sum::<usize>();
    while remaining > 0 {
        let mut progressed = false;
        for stage in 0..stages {
            let state = &mut stage_states[stage];
            let Some(&pack) = orders[stage].get(state.next) else {
                continue;
            };
            let forward = ir.pack(pack).direction == Direction::Forward;
            let ready = if forward {
                match stage {
                    0 => Some(0.0),
                    _ => done[stage - 1][index[&pack]],
                }
            } else if stage + 1 == stages {
                needs[&pack]
                    .iter()
                    .map(|f| done[stage][index[f]])
                    .try_fold(0.0f64, |latest, end| end.map(|end| latest.max(end)))
            } else {
                done[stage + 1][index[&pack]]
            };
            let Some(ready) = ready else {
                continue;
            };
            let this = cost_of(stage, pack);
            state.run_deferred(ready, bounds[stage], this, forward, |p| cost_of(stage, p));
            let start = state.clock.max(ready);
            let split = !forward && state.fits_split(bounds[stage], this);
            let duration = match forward || split {
                true => this.critical_s,
                false => this.critical_s + this.weight_s,
            };
            state.clock = start + duration;
            done[stage][index[&pack]] = Some(state.clock);
            if forward {
                state.held += this.saved_bytes;
                state.ops.push(StageOp::whole(pack));
            } else if split {
                state.held = state.held.saturating_sub(this.saved_bytes) + this.deferred_bytes;
                state.pending.push_back(pack);
                state.ops.push(StageOp {
                    pack,
                    part: Part::InputGrad,
                });
            } else {
                state.held = state.held.saturating_sub(this.saved_bytes);
                state.ops.push(StageOp::whole(pack));
            }
            state.next += 1;
            remaining -= 1;
            progressed = true;
        }
        assert!(
            progressed,
            "a 1F1B order always has a ready op on some stage (bug in schedule-pipeline)"
        );
    }
    stage_states
        .into_iter()
        .map(|mut state| {
            let rest: Vec<PackId> = state.pending.drain(..).collect();
            state.ops.extend(rest.into_iter().map(|pack| StageOp {
                pack,
                part: Part::WeightGrad,
            }));
            state.ops
        })
        .collect()
}

/// One stage while its order is played.
#[derive(Debug, Default)]
struct StageState {
    /// The next op of its 1F1B order.
    next: usize,
    /// When the stage is next free.
    clock: f64,
    /// Bytes held by forwards not yet backwarded and weight gradients not yet run.
    held: u64,
    /// Backwards whose weight gradient is deferred, oldest first.
    pending: VecDeque<PackId>,
    ops: Vec<StageOp>,
}

impl StageState {
    /// Runs pending weight gradients before the next op (`this`, ready at `ready`): those that
    /// fit in the idle time before it, then those its memory needs.
    fn run_deferred(
        &mut self,
        ready: f64,
        bound: u64,
        this: PackCost,
        forward: bool,
        cost_of: impl Fn(PackId) -> PackCost,
    ) {
        while let Some(&oldest) = self.pending.front() {
            let weight = cost_of(oldest);
            let fits_gap = self.clock + weight.weight_s <= ready;
            let over = match forward {
                true => self.held + this.saved_bytes > bound,
                false => !self.fits_split(bound, this),
            };
            if !fits_gap && !over {
                break;
            }
            self.pending.pop_front();
            self.clock += weight.weight_s;
            self.held = self.held.saturating_sub(weight.deferred_bytes);
            self.ops.push(StageOp {
                pack: oldest,
                part: Part::WeightGrad,
            });
        }
    }

    /// Whether the backward `this` can defer its weight gradient within `bound`.
    fn fits_split(&self, bound: u64, this: PackCost) -> bool {
        self.held.saturating_sub(this.saved_bytes) + this.deferred_bytes <= bound
    }
}

/// The highest bytes the fused order reaches (forwards allocate, backwards free).
fn fused_peak(ir: &StepIr, order: &[PackId], cost_of: impl Fn(PackId) -> PackCost) -> u64 {
    let (mut held, mut peak) = (0u64, 0u64);
    for &pack in order {
        let bytes = cost_of(pack).saved_bytes;
        match ir.pack(pack).direction {
            Direction::Forward => held += bytes,
            Direction::Backward => held = held.saturating_sub(bytes),
        }
        peak = peak.max(held);
    }
    peak
}

/// A pack's direction and the sums its time needs on every stage.
struct PackShape {
    direction: Direction,
    work: PackWork,
    /// Saved and deferred bytes, by [`StageEnds::index`] (filled for the ends the replica's
    /// stages have): per-slice sums that depend on the stage through its ends only.
    bytes: [(u64, u64); 4],
}

/// Durations and bytes of `packs` (every pack of the replica) on every stage, per device of
/// the replica's CP group.
fn pack_costs(
    ir: &StepIr,
    replica: ReplicaId,
    packs: &[PackId],
    stages: usize,
    cost: &CostModel,
) -> Vec<Vec<PackCost>> {
    let ranks = &ir.replica(replica).ranks;
    let split = ranks.len() as u64 * u64::from(ir.spec.parallel.cp_degree());
    let merged = ranks.len() as u32;
    let memory = cost.memory();
    let share = |len: u64| len.div_ceil(split);
    // One stage of each kind of ends: the byte sums are read there for all the others.
    let mut ends_stages: Vec<(StageEnds, u32)> = Vec::new();
    for stage in 0..stages as u32 {
        let ends = cost.stage_ends(stage);
        if ends_stages.iter().all(|&(seen, _)| seen != ends) {
            ends_stages.push((ends, stage));
        }
    }
    // Each pack's slices read once for every stage.
    let shapes: Vec<PackShape> = packs
        .iter()
        .map(|&pack| {
            let direction = ir.pack(pack).direction;
            let pairs: Vec<(u64, u64)> = ir
                .pack_members(pack)
                .iter()
                .map(|&s| {
                    let slice = ir.slice(s);
                    (u64::from(slice.len), u64::from(slice.start))
                })
                .collect();
            let mut bytes = [(0u64, 0u64); 4];
            for &(ends, stage) in &ends_stages {
                let saved: u64 = (pairs.iter())
                    .map(|&(len, _)| {
                        memory.activation_bytes(share(len), stage)
                            + memory.kv_bytes(share(len), stage)
                    })
                    .sum();
                let deferred: u64 = match direction {
                    Direction::Forward => 0,
                    Direction::Backward => (pairs.iter())
                        .map(|&(len, _)| memory.weight_grad_bytes(share(len), stage))
                        .sum(),
                };
                bytes[ends.index()] = (saved, deferred);
            }
            PackShape {
                direction,
                work: cost.pack_work(&pairs, direction, merged),
                bytes,
            }
        })
        .collect();
    (0..stages as u32)
        .map(|stage| {
            let ends = cost.stage_ends(stage).index();
            shapes
                .iter()
                .map(|shape| {
                    let time = |part| {
                        cost.work_part_time_on(stage, &shape.work, part, ranks)
                            .critical_path_s()
                    };
                    let (saved_bytes, deferred_bytes) = shape.bytes[ends];
                    match shape.direction {
                        Direction::Forward => PackCost {
                            critical_s: time(Part::Whole),
                            weight_s: 0.0,
                            saved_bytes,
                            deferred_bytes: 0,
                        },
                        Direction::Backward => PackCost {
                            critical_s: time(Part::InputGrad),
                            weight_s: time(Part::WeightGrad),
                            saved_bytes,
                            deferred_bytes,
                        },
                    }
                })
                .collect()
        })
        .collect()
}
