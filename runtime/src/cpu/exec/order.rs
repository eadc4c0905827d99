//! [`DeviceOrder`]: the order in which each device runs its pack tasks.
//!
//! Each replica's schedule fixes the order of its packs on each stage. A DP rank can belong to a
//! plain replica and to a DP-Merge group at once (the simulator's device groups work the same
//! way); its device then runs both replicas' tasks, and something must interleave them. That is
//! the runtime's decision, not the compiler's: the executor takes it as a [`DeviceOrder`], either
//! - [`DeviceOrder::replica_major`]: each replica's tasks in full, replicas in IR order (always
//!   deadlock-free: every device meets the replicas in the same order), or
//! - [`DeviceOrder::by_start_times`]: tasks sorted by predicted start times (the simulator's),
//!   so that the execution interleaves exactly as the prediction it is compared with.
//!
//! Either way the order is checked: on every device it must keep each replica's schedule, and
//! the tasks of all devices together, waiting for each other's pipeline messages and for the
//! members of their DP-Merge group, must be able to run to the end (no cycle).

use std::collections::VecDeque;

use slimpack_ir::step::Direction;

use super::plan::{Device, Plan};
use crate::cpu::error::{CpuError, Result};

/// Per device (by [`Plan::device_index`]), the packs it runs in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceOrder {
    per_device: Vec<Vec<usize>>,
}

impl DeviceOrder {
    /// Every replica's schedule in full, replicas in IR order.
    pub fn replica_major(plan: &Plan) -> DeviceOrder {
        let mut per_device = vec![Vec::new(); plan.devices().len()];
        for (replica, ranks) in plan.replicas.iter().enumerate() {
            for &rank in ranks {
                for (stage, order) in plan.schedules[replica].iter().enumerate() {
                    let device = plan.device_index(Device { rank, stage });
                    per_device[device].extend(order);
                }
            }
        }
        DeviceOrder { per_device }
    }

    /// Every device's tasks sorted by `start(pack, stage)` (ties by pack index); fails unless
    /// `start` knows every task and the order is executable.
    pub fn by_start_times(
        plan: &Plan,
        start: impl Fn(usize, usize) -> Option<f64>,
    ) -> Result<DeviceOrder> {
        let mut order = DeviceOrder::replica_major(plan);
        for (index, device) in plan.devices().into_iter().enumerate() {
            let mut keyed = Vec::with_capacity(order.per_device[index].len());
            for &pack in &order.per_device[index] {
                let time = start(pack, device.stage).ok_or_else(|| CpuError::Schedule {
                    message: format!(
                        "no start time for {} on stage {}",
                        plan.packs[pack].name, device.stage
                    ),
                })?;
                keyed.push((time, pack));
            }
            keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            order.per_device[index] = keyed.into_iter().map(|(_, pack)| pack).collect();
        }
        order.check(plan)?;
        Ok(order)
    }

    /// The packs device `index` runs, in order.
    pub fn tasks(&self, index: usize) -> &[usize] {
        &self.per_device[index]
    }

    /// Checks that every device keeps its replicas' schedules and that the whole runs to the
    /// end.
    pub fn check(&self, plan: &Plan) -> Result<()> {
        for (index, device) in plan.devices().into_iter().enumerate() {
            for (replica, ranks) in plan.replicas.iter().enumerate() {
                let expected: &[usize] = match ranks.contains(&device.rank) {
                    true => &plan.schedules[replica][device.stage],
                    false => &[],
                };
                let kept: Vec<usize> = self.per_device[index]
                    .iter()
                    .copied()
                    .filter(|&p| plan.packs[p].replica == replica)
                    .collect();
                if kept != expected {
                    return Err(CpuError::Schedule {
                        message: format!(
                            "device (rank {}, stage {}) does not run replica {replica}'s schedule in order",
                            device.rank, device.stage
                        ),
                    });
                }
            }
        }
        self.check_runs_to_end(plan)
    }

    /// Kahn's algorithm over the tasks `(pack, stage)`: a task waits for its predecessor on each
    /// of its devices (a DP-Merge group's task is one task on all its members' devices) and for
    /// its pipeline input.
    fn check_runs_to_end(&self, plan: &Plan) -> Result<()> {
        let pp = plan.pp();
        let task = |pack: usize, stage: usize| pack * pp + stage;
        let count = plan.packs.len() * pp;
        let mut successors: Vec<Vec<usize>> = vec![Vec::new(); count];
        let mut indegree = vec![0usize; count];
        let mut edge = |from: usize, to: usize, successors: &mut Vec<Vec<usize>>| {
            successors[from].push(to);
            indegree[to] += 1;
        };
        for (index, device) in plan.devices().into_iter().enumerate() {
            for pair in self.per_device[index].windows(2) {
                edge(
                    task(pair[0], device.stage),
                    task(pair[1], device.stage),
                    &mut successors,
                );
            }
        }
        for (pack, info) in plan.packs.iter().enumerate() {
            for stage in 1..pp {
                match info.direction {
                    Direction::Forward => {
                        edge(task(pack, stage - 1), task(pack, stage), &mut successors)
                    }
                    Direction::Backward => {
                        edge(task(pack, stage), task(pack, stage - 1), &mut successors)
                    }
                }
            }
        }
        let mut ready: VecDeque<usize> = (0..count).filter(|&t| indegree[t] == 0).collect();
        let mut done = 0;
        while let Some(next) = ready.pop_front() {
            done += 1;
            for &successor in &successors[next] {
                indegree[successor] -= 1;
                if indegree[successor] == 0 {
                    ready.push_back(successor);
                }
            }
        }
        if done < count {
            let stuck = (0..count)
                .find(|&t| indegree[t] > 0)
                .expect("an unfinished task");
            return Err(CpuError::Schedule {
                message: format!(
                    "the device order deadlocks: {} on stage {} waits for itself",
                    plan.packs[stuck / pp].name,
                    stuck % pp
                ),
            });
        }
        Ok(())
    }
}
