//! `interleave-ranks`: a DP rank in several replicas (its plain replica and the DP-Merge groups
//! that hold it) runs their schedules interleaved, each op as soon as it can run, where the
//! simulator predicts that faster within the memory limit.
//!
//! Phase in and out: `scheduled` (packs and each replica's schedules unchanged; the pass
//! writes the order in which each shared rank's pipeline devices take the replicas' ops,
//! [`StepIr::set_rank_order`]).
//!
//! Why: one after the other, each replica on a shared rank fills and drains the pipeline on
//! its own, and the members of a DP-Merge group wait at its first op for the one that still
//! runs its own replica. Interleaved, one replica's ops run in the other's pipeline idle. The
//! order is read off the simulator's first-come-first-served timeline of the step
//! ([`sim::SharedRanks::FirstComeFirstServed`]) and written down, so that the lowered program
//! runs it and the simulator, following it, predicts the same step. Interleaving keeps more
//! forwards in flight (a merged sample's share on top of the rank's own), so it is kept only
//! where the interleaved step fits the memory limit and is faster, or where it fits and the
//! replica-major one does not; otherwise the ranks stay replica-major.
//!
//! Like `assign-recompute`, it reads the simulation of the one schedule it is given; choosing
//! between pipelines stays the tuner's. It runs last before `lower`: a pass that schedules the
//! step again (`schedule-pipeline`, `eqsat` on a scheduled step) drops the orders with the
//! schedules they merged.

use crate::error::{PassError, Result};
use crate::pass::{OptionInfo, Pass, PassContext, PassInfo, PassOptions, Statistics};
use slimpack_ir::step::{Phase, ReplicaId};
use slimpack_ir::StepIr;
use slimpack_machine::cost::DEFAULT_MEMORY_LIMIT;
use slimpack_machine::sim::{self, SharedRanks, SimResult};
use slimpack_machine::MachineError;

pub(crate) const INFO: PassInfo = PassInfo {
    name: "interleave-ranks",
    summary:
        "DP ranks in several replicas interleave their schedules where that is faster (simulated)",
    description: "Where a DP rank is in several replicas (a plain replica and DP-Merge groups), \
                  its pipeline devices run the replicas' ops in the order they become ready in \
                  the simulated step instead of one replica after the other, if that step fits \
                  the `memory` fraction of the device and is faster (or fits where the other \
                  does not); written as each shared rank's order (`order` in the IR). Run it \
                  last before lower: rescheduling drops the orders. Phase scheduled -> \
                  scheduled.",
    accepts: Phase::Scheduled..=Phase::Scheduled,
    produces: None,
    options: &[OptionInfo {
        name: "memory",
        help: "the fraction of device memory the interleaved step's peak may reach",
        default: Some("0.92"),
    }],
    create: |options| Ok(Box::new(InterleaveRanks::from_options(options)?)),
};

/// The interleaving pass.
#[derive(Debug, Clone, Copy)]
pub struct InterleaveRanks {
    /// The fraction of device memory the interleaved step's peak may reach.
    pub memory: f64,
}

impl Default for InterleaveRanks {
    fn default() -> InterleaveRanks {
        InterleaveRanks {
            memory: DEFAULT_MEMORY_LIMIT,
        }
    }
}

impl InterleaveRanks {
    fn from_options(options: &PassOptions) -> Result<InterleaveRanks> {
        let memory = options
            .fraction("memory")?
            .expect("declared with a default");
        Ok(InterleaveRanks { memory })
    }
}

impl Pass for InterleaveRanks {
    fn info(&self) -> &'static PassInfo {
        &INFO
    }

    fn run(&mut self, ir: &mut StepIr, cx: &PassContext) -> Result<Statistics> {
        let mut statistics = Statistics::new();
        ir.clear_rank_orders();
        let replicas_of_rank = ir.replica_counts();
        let shared = replicas_of_rank.iter().filter(|&&count| count > 1).count();
        statistics.set("shared_ranks", shared as u64);
        if shared == 0 {
            statistics.set("interleaved", 0u64);
            return Ok(statistics);
        }
        let cost = cx.machine();
        let limit = (cost.memory().capacity_bytes() as f64 * self.memory) as u64;
        let fits =
            |result: &SimResult| !result.metrics.oom && result.metrics.peak_memory_bytes <= limit;
        let interleaved = sim::simulate_with(ir, cost, SharedRanks::FirstComeFirstServed)
            .map_err(simulation_failed)?;
        let after = interleaved.metrics.step_time_s;
        statistics.set("interleaved_ms", (after * 1e3).round() as u64);
        statistics.set(
            "interleaved_peak_mib",
            interleaved.metrics.peak_memory_bytes >> 20,
        );
        // Over the limit interleaved: one after the other, whatever that step is (the
        // tuner's to judge). Within it: interleaved, unless one after the other is no slower
        // and fits too.
        let better = fits(&interleaved) && {
            let one_after_another = sim::simulate(ir, cost).map_err(simulation_failed)?;
            let before = one_after_another.metrics.step_time_s;
            statistics.set("one_after_another_ms", (before * 1e3).round() as u64);
            !fits(&one_after_another) || after < before
        };
        statistics.set("interleaved", u64::from(better));
        if better {
            for ((rank, device), order) in rank_orders(ir, &interleaved, &replicas_of_rank) {
                ir.set_rank_order(rank, device, &order);
            }
        }
        Ok(statistics)
    }
}

/// Per (DP rank, pipeline device) in several replicas (`replicas_of_rank`, by rank), the
/// replica of each op its compute stream ran in `result`, in the order they started.
fn rank_orders(
    ir: &StepIr,
    result: &SimResult,
    replicas_of_rank: &[u32],
) -> Vec<((u32, u32), Vec<ReplicaId>)> {
    let layout = result.layout;
    let replicas = ir.replicas();
    // Per group: (start, task index, replica index) of every pack op it ran.
    let mut started: Vec<Vec<(f64, usize, u32)>> = vec![Vec::new(); layout.groups()];
    for (index, (task, span)) in result.tasks().enumerate() {
        let Some(replica) = task.replica.filter(|_| task.kind.is_pack_compute()) else {
            continue;
        };
        for &group in result.task_groups(task) {
            if replicas_of_rank[layout.rank_of(group) as usize] > 1 {
                started[group.index()].push((span.start_s, index, replica));
            }
        }
    }
    let mut orders = Vec::new();
    for (group, mut ops) in started.into_iter().enumerate() {
        if ops.is_empty() {
            continue;
        }
        // A stream's starts only grow; ties (ops of no time) in task order, which within a
        // replica is its schedule's.
        ops.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let group = sim::GroupId(group as u32);
        orders.push((
            (layout.rank_of(group), layout.stage_of(group)),
            ops.iter()
                .map(|&(_, _, replica)| replicas[replica as usize])
                .collect(),
        ));
    }
    orders
}

fn simulation_failed(error: MachineError) -> PassError {
    PassError::Failed {
        pass: INFO.name,
        message: format!("simulating the step: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slimpack_ir::Spec;
    use slimpack_machine::sim::fixture::{one_f_one_b, ReplicaPlan};

    /// llama-7b at tp=8, pp=2, dp=2: rank 0's plain replica, rank 1's (lighter), and a DP-Merge
    /// group of both ranks after them, in IR order, as `dp-merge` adds it.
    fn step() -> StepIr {
        let spec = Spec::from_presets("llama-7b", "h100-sxm", "tp=8,pp=2,dp=2").unwrap();
        let plans = [
            ReplicaPlan {
                ranks: vec![0],
                packs: vec![vec![8192]; 6],
            },
            ReplicaPlan {
                ranks: vec![1],
                packs: vec![vec![4096]; 2],
            },
            ReplicaPlan {
                ranks: vec![0, 1],
                packs: vec![vec![32768]; 4],
            },
        ];
        one_f_one_b(spec, &plans)
    }

    fn run(ir: &mut StepIr, memory: f64) -> Statistics {
        let cx = PassContext::for_spec(&ir.spec);
        InterleaveRanks { memory }.run(ir, &cx).unwrap()
    }

    #[test]
    fn a_faster_interleaving_is_written_and_runs_as_simulated() {
        let mut ir = step();
        let cost = PassContext::for_spec(&ir.spec).machine().clone();
        let before = sim::simulate(&ir, &cost).unwrap().metrics;
        let first_come = sim::simulate_with(&ir, &cost, SharedRanks::FirstComeFirstServed)
            .unwrap()
            .metrics;
        assert!(
            first_come.step_time_s < before.step_time_s,
            "{first_come:?}"
        );
        let statistics = run(&mut ir, 1.0);
        assert_eq!(statistics.get("interleaved").unwrap(), 1u64);
        assert_eq!(statistics.get("shared_ranks").unwrap(), 2u64);
        // Both ranks on both devices have an order, each listing every op of their replicas.
        assert_eq!(ir.rank_orders().count(), 4);
        for ((rank, device), order) in ir.rank_orders() {
            let ops: usize = ir
                .replicas_of_rank(rank)
                .iter()
                .map(|&replica| ir.device_schedule(replica, device).len())
                .sum();
            assert_eq!(order.len(), ops);
            assert_eq!(ir.rank_schedule(rank, device).len(), ops);
        }
        assert!(slimpack_ir::verify::check(&ir).is_empty());
        // Following the written order, the simulator predicts the interleaved step exactly.
        let after = sim::simulate(&ir, &cost).unwrap().metrics;
        assert_eq!(after.step_time_s, first_come.step_time_s);
        assert_eq!(after.peak_memory_bytes, first_come.peak_memory_bytes);
        // The lowered program interleaves too, and runs to the end.
        let program = slimpack_ir::program::lower(&ir);
        slimpack_ir::program::check(&program).unwrap();
        let rank_0 = &program.workers[0].ops;
        let replicas_in_order: Vec<u32> = rank_0
            .iter()
            .filter_map(|op| match op {
                slimpack_ir::program::Op::Forward { pack, .. }
                | slimpack_ir::program::Op::Backward { pack, .. } => {
                    Some(program.packs[*pack as usize].replica)
                }
                _ => None,
            })
            .collect();
        let switches = replicas_in_order
            .windows(2)
            .filter(|w| w[0] != w[1])
            .count();
        assert!(switches > 1, "{replicas_in_order:?}");
        // The text form keeps the orders.
        let text = slimpack_ir::text::print(&ir);
        assert!(text.contains("  order dp=0 pp=0 ["), "{text}");
        let again = slimpack_ir::text::parse(&text, "step.ir").unwrap();
        assert_eq!(slimpack_ir::text::print(&again), text);
    }

    #[test]
    fn the_verifier_names_an_order_that_does_not_merge_the_ranks_schedules() {
        let mut ir = step();
        run(&mut ir, 1.0);
        let replicas = ir.replicas().to_vec();
        let (plain_0, plain_1, group) = (replicas[0], replicas[1], replicas[2]);
        let order = ir.rank_order(0, 0).unwrap().to_vec();
        let broken = |edit: &dyn Fn(&mut StepIr)| {
            let mut ir = ir.clone();
            edit(&mut ir);
            let errors = slimpack_ir::verify::check(&ir);
            assert!(!errors.is_empty());
            errors[0].to_string()
        };
        let short = broken(&|ir| ir.set_rank_order(0, 0, &order[1..]));
        assert!(short.contains("order dp=0 pp=0"), "{short}");
        assert!(short.contains("times; it runs"), "{short}");
        let mut stranger = order.clone();
        let at = stranger.iter().position(|&r| r == plain_0).unwrap();
        stranger[at] = plain_1;
        let stranger = broken(&|ir| ir.set_rank_order(0, 0, &stranger));
        assert!(
            stranger.contains("which does not hold the rank"),
            "{stranger}"
        );
        let nothing = broken(&|ir| {
            ir.set_rank_order(0, 0, &[group]);
            ir.set_rank_order(1, 1, &order);
        });
        assert!(nothing.contains("rank-order"), "{nothing}");
        // New recomputation changes the timings and memory the orders were read off.
        let mut recomputing = ir.clone();
        recomputing.set_device_recompute(0, Some(slimpack_ir::spec::Recompute::Full));
        assert_eq!(recomputing.rank_orders().count(), 0);
        // A schedule set anew forgets the orders, which were of the old one.
        let mut again = ir.clone();
        let stage_order = again.schedule(group, 0).to_vec();
        again.set_schedule(group, 0, &stage_order);
        assert_eq!(again.rank_orders().count(), 0);
    }

    #[test]
    fn ranks_stay_one_after_the_other_where_interleaving_needs_more_memory_than_allowed() {
        let mut ir = step();
        let cost = PassContext::for_spec(&ir.spec).machine().clone();
        let first_come = sim::simulate_with(&ir, &cost, SharedRanks::FirstComeFirstServed)
            .unwrap()
            .metrics;
        let capacity = cost.memory().capacity_bytes() as f64;
        let tight = (first_come.peak_memory_bytes as f64 - 1.0) / capacity;
        let statistics = run(&mut ir, tight);
        assert_eq!(statistics.get("interleaved").unwrap(), 0u64);
        assert_eq!(ir.rank_orders().count(), 0);
    }

    #[test]
    fn a_step_without_shared_ranks_is_left_alone_unsimulated() {
        let spec = Spec::from_presets("llama-7b", "h100-sxm", "tp=8,pp=2,dp=2").unwrap();
        let plans: Vec<ReplicaPlan> = (0..2)
            .map(|rank| ReplicaPlan {
                ranks: vec![rank],
                packs: vec![vec![4096]; 2],
            })
            .collect();
        let mut ir = one_f_one_b(spec, &plans);
        let statistics = run(&mut ir, 0.92);
        assert_eq!(statistics.get("shared_ranks").unwrap(), 0u64);
        assert!(statistics.get("interleaved_ms").is_none());
        assert_eq!(ir.rank_orders().count(), 0);
    }
}
