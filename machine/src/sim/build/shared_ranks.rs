//! A DP rank in several replicas (a plain replica and DP-Merge groups): how its pipeline
//! devices order the replicas' tasks — [`SharedRanks`] — and the chaining in a rank's own
//! order (`StepIr::rank_order`, written by `interleave-ranks`).

use std::collections::{HashMap, VecDeque};

use super::super::task::TaskId;
use super::Builder;
use crate::error::MachineError;

/// How a DP rank in several replicas (a plain replica and DP-Merge groups) orders their ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedRanks {
    /// As the lowered program runs them: in the rank's order where the IR gives one
    /// (`StepIr::rank_order`), otherwise one replica after the other, in IR order.
    AsProgram,
    /// Whichever op is ready first, first (the engine's order): what an interleaving pass
    /// reads a rank's order from. No program runs this until the order is written down.
    FirstComeFirstServed,
}

impl Builder<'_> {
    /// Chains the tasks of each group whose DP rank orders its replicas itself
    /// (`StepIr::rank_order`) in that order: the order's `i`-th replica runs its next task.
    pub(super) fn chain_rank_orders(
        &mut self,
        mut ordered: Vec<Option<Vec<(usize, TaskId)>>>,
    ) -> Result<(), MachineError> {
        let ir = self.ir;
        let index_of: HashMap<_, usize> = ir
            .replicas()
            .iter()
            .enumerate()
            .map(|(index, &replica)| (replica, index))
            .collect();
        for ((rank, device), order) in ir.rank_orders() {
            let group = self.layout.group(rank, device).index();
            let Some(tasks) = ordered.get_mut(group).and_then(Option::take) else {
                continue;
            };
            let error = |message: String| MachineError::Schedule {
                replica: tasks.first().map_or(0, |&(replica, _)| replica),
                stage: device,
                message: format!("DP rank {rank}'s order on pipeline device {device}: {message}"),
            };
            // The rank's few replicas, each with its tasks in order (not one queue per replica
            // of the step: a rank is in two or three, a step can have thousands).
            let mut queues: Vec<(usize, VecDeque<TaskId>)> = Vec::new();
            for &(replica, task) in &tasks {
                match queues.iter_mut().find(|(r, _)| *r == replica) {
                    Some((_, queue)) => queue.push_back(task),
                    None => queues.push((replica, VecDeque::from([task]))),
                }
            }
            let mut previous: Option<TaskId> = None;
            for replica in order {
                let next = index_of.get(replica).and_then(|&index| {
                    queues
                        .iter_mut()
                        .find(|(r, _)| *r == index)
                        .and_then(|(_, queue)| queue.pop_front())
                });
                let Some(task) = next else {
                    return Err(error(
                        "it names a replica more often than it has ops there, or one the rank \
                         is not in"
                            .into(),
                    ));
                };
                if let Some(previous) = previous {
                    self.tasks.add_edge(previous, task);
                }
                previous = Some(task);
            }
            if let Some(left) = queues.iter().map(|(_, queue)| queue.len()).find(|&n| n > 0) {
                return Err(error(format!("{left} ops of a replica are not in it")));
            }
        }
        Ok(())
    }
}
