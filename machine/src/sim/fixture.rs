//! Small scheduled steps built directly with the [`StepIr`] API, for the simulator's tests,
//! its benchmark and examples. Not a compilation strategy: whole samples, the same packs in
//! both directions, textbook pipeline orders.
//!
//! [`one_f_one_b`] builds a whole step from a plan per replica; [`schedule_one_f_one_b`] and
//! [`schedule_gpipe`] order the packs of an already packed replica; [`defer_weight_grads`]
//! splits a scheduled replica's backwards (a zero-bubble order).

use slimpack_ir::batch::Sample;
use slimpack_ir::spec::Spec;
use slimpack_ir::step::{
    BatchInfo, Direction, Pack, PackId, Part, Phase, ReplicaId, StageOp, StepIr,
};

/// One replica of a fixture: its DP ranks (several: a DP-Merge group) and its packs, each
/// given as the lengths of the whole samples it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaPlan {
    pub ranks: Vec<u32>,
    pub packs: Vec<Vec<u32>>,
}

/// A scheduled step: per replica, one single-slice sample per length, a forward and a backward
/// pack per entry of `packs` (the same samples both ways), in 1F1B order on every stage.
pub fn one_f_one_b(spec: Spec, replicas: &[ReplicaPlan]) -> StepIr {
    let mut ir = StepIr::new(
        spec,
        BatchInfo {
            source: "sim fixture".to_string(),
            ..BatchInfo::default()
        },
    );
    let mut document = 0u64;
    let mut placed = Vec::with_capacity(replicas.len());
    for plan in replicas {
        let replica = ir.add_replica(plan.ranks.clone());
        let mut packs = Vec::with_capacity(plan.packs.len());
        for lengths in &plan.packs {
            let mut slices = Vec::with_capacity(lengths.len());
            for &len in lengths {
                let sample = ir.add_sample(Sample {
                    len,
                    doc: document,
                    piece: 0,
                });
                document += 1;
                ir.place_sample(sample, replica);
                slices.extend(ir.slices_of(sample));
            }
            packs.push(slices);
        }
        placed.push((replica, packs));
    }
    ir.advance(Phase::Assigned);
    for (replica, packs) in &placed {
        for direction in [Direction::Forward, Direction::Backward] {
            for slices in packs {
                ir.add_pack(
                    Pack {
                        direction,
                        cap: None,
                    },
                    *replica,
                    slices,
                );
            }
        }
    }
    ir.advance(Phase::Packed);
    for (replica, _) in &placed {
        schedule_one_f_one_b(&mut ir, *replica);
    }
    ir.advance(Phase::Scheduled);
    ir
}

/// Megatron's non-interleaved 1F1B order on every stage: stage `s` runs `min(pp − 1 − s, m)`
/// warm-up forwards, then alternates one forward and one backward, then drains the remaining
/// backwards. Deadlock-free when backward pack `i` holds only slices of forward packs `≤ i`;
/// the replica must have as many backward packs as forward ones.
pub fn schedule_one_f_one_b(ir: &mut StepIr, replica: ReplicaId) {
    let forward = ir.packs_on(replica, Direction::Forward);
    let backward = ir.packs_on(replica, Direction::Backward);
    assert_eq!(
        forward.len(),
        backward.len(),
        "1F1B needs as many backward packs as forward packs (fixture misuse)"
    );
    let pp = ir.spec.parallel.pp;
    for stage in 0..pp {
        let warmup = ((pp - 1 - stage) as usize).min(forward.len());
        let mut order: Vec<PackId> = forward[..warmup].to_vec();
        for (i, &pack) in backward.iter().enumerate() {
            if let Some(&next) = forward.get(warmup + i) {
                order.push(next);
            }
            order.push(pack);
        }
        ir.set_schedule(replica, stage, &order);
    }
}

/// GPipe order on every stage: all forward packs, then all backward packs. Deadlock-free for
/// any packing that satisfies the IR's order invariants.
pub fn schedule_gpipe(ir: &mut StepIr, replica: ReplicaId) {
    let mut order = ir.packs_on(replica, Direction::Forward);
    order.extend(ir.packs_on(replica, Direction::Backward));
    for stage in 0..ir.spec.parallel.pp {
        ir.set_schedule(replica, stage, &order);
    }
}

/// Splits every backward of a scheduled replica on every stage: its input gradient where the
/// backward ran, its weight gradient after the stage's last input gradient (all of them in
/// backward order): the simplest zero-bubble order, which takes the weight gradients off the
/// pipeline's critical path and runs them in the drain.
pub fn defer_weight_grads(ir: &mut StepIr, replica: ReplicaId) {
    for stage in 0..ir.spec.parallel.pp {
        let order = ir.schedule(replica, stage).to_vec();
        let mut ops = Vec::with_capacity(order.len() * 3 / 2);
        let mut deferred = Vec::new();
        for pack in order {
            if ir.pack(pack).direction == Direction::Backward {
                ops.push(StageOp {
                    pack,
                    part: Part::InputGrad,
                });
                deferred.push(StageOp {
                    pack,
                    part: Part::WeightGrad,
                });
            } else {
                ops.push(StageOp::whole(pack));
            }
        }
        ops.extend(deferred);
        ir.set_stage_ops(replica, stage, &ops);
    }
}
