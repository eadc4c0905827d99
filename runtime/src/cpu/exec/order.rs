//! [`DeviceOrder`]: the order in which each device runs its pack tasks.
//!
//! Each replica's schedule fixes the order of its packs on each stage. A DP rank can belong to a
//! plain replica and to a DP-Merge group at once; its device then runs both replicas' tasks,
//! and something must order them. The lowered program and the simulator run them in the
//! rank's order where the step gives one (`interleave-ranks`), otherwise one after the other,
//! in IR order; the executor takes the order as a [`DeviceOrder`], either
//! - [`DeviceOrder::replica_major`]: each replica's tasks in full, replicas in IR order (always
//!   deadlock-free: every device meets the replicas in the same order), or
//! - [`DeviceOrder::by_start_times`]: tasks sorted by predicted start times (the simulator's),
//!   so that the execution interleaves exactly as the prediction it is compared with (the
//!   simulator follows the program's order, so on its predictions the two agree).
//!
//! The executor runs programs: [`DeviceOrder::program`] reorders the step's lowered program
//! so that each worker runs its pack tasks — a pack's `recv`, `cp-exchange`,
//! compute and `send`, and a zero-bubble schedule's deferred weight gradients ([`Plan::task_of`])
//! — in this order, before the step's collectives. The order is checked: on
//! every device it must keep each replica's schedule, and the program must be able to run to
//! the end ([`program::check`]: no worker waits forever for a message or its DP-Merge group).

use std::collections::HashMap;

use slimpack_ir::program::{self, Op, Program};

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

    /// Every device's tasks sorted by `start(task, stage)` (ties by task index; tasks as
    /// [`Plan::task_of`] numbers them); fails unless `start` knows every task and the order is
    /// executable.
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
                        plan.task_pack(pack).name,
                        device.stage
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
        self.program(plan).map(|_| ())
    }

    /// The step's program with every worker's pack tasks in this order, checked.
    pub fn program(&self, plan: &Plan) -> Result<Program> {
        self.check_schedules(plan)?;
        let mut ordered = plan.lowered.clone();
        for (index, worker) in ordered.workers.iter_mut().enumerate() {
            worker.ops = reorder(plan, &worker.ops, &self.per_device[index]).ok_or_else(|| {
                CpuError::Schedule {
                    message: format!(
                        "device (rank {}, stage {}): the order does not list the program's pack tasks",
                        worker.worker.dp, worker.worker.pp
                    ),
                }
            })?;
        }
        program::check(&ordered).map_err(|e| CpuError::Schedule {
            message: format!("the device order is not executable: {e}"),
        })?;
        Ok(ordered)
    }

    /// Every device runs each of its replicas' schedules, in order, and nothing else.
    fn check_schedules(&self, plan: &Plan) -> Result<()> {
        for (index, device) in plan.devices().into_iter().enumerate() {
            for (replica, ranks) in plan.replicas.iter().enumerate() {
                let expected: &[usize] = match ranks.contains(&device.rank) {
                    true => &plan.schedules[replica][device.stage],
                    false => &[],
                };
                let kept: Vec<usize> = self.per_device[index]
                    .iter()
                    .copied()
                    .filter(|&task| plan.task_pack(task).replica == replica)
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
        Ok(())
    }
}

/// `ops` with its pack tasks (the runs of consecutive ops on one pack) in the order `packs`,
/// followed by its other ops; `None` unless `packs` lists every task exactly once.
fn reorder(plan: &Plan, ops: &[Op], packs: &[usize]) -> Option<Vec<Op>> {
    let mut tasks: HashMap<usize, &[Op]> = HashMap::new();
    let mut rest = Vec::new();
    let mut start = 0;
    while start < ops.len() {
        let Some(task) = plan.task_of(&ops[start]) else {
            rest.push(ops[start].clone());
            start += 1;
            continue;
        };
        let end = start
            + ops[start..]
                .iter()
                .take_while(|op| plan.task_of(op) == Some(task))
                .count();
        if tasks.insert(task, &ops[start..end]).is_some() {
            return None;
        }
        start = end;
    }
    if packs.len() != tasks.len() {
        return None;
    }
    let mut ordered = Vec::with_capacity(ops.len());
    for pack in packs {
        ordered.extend_from_slice(tasks.remove(pack)?);
    }
    ordered.extend(rest);
    Some(ordered)
}
