//! What a simulation returns: the metrics and the timeline behind them.

use serde::Serialize;
use slimpack_ir::step::Direction;

use super::engine::Span;
use super::layout::{GroupId, Layout};
use super::memory::GroupMemory;
use super::metrics::Metrics;
use super::task::{PackIndex, Task, TaskGraph, TaskKind};

/// A pack as the simulator saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PackInfo {
    pub direction: Direction,
    /// Position among all packs of its direction, as the IR's text form numbers them (`%f3` is
    /// the forward pack numbered 3).
    pub number: u32,
    /// The replica (index into [`SimResult::replicas`]).
    pub replica: u32,
    pub tokens: u64,
    /// Number of slices.
    pub slices: u32,
}

impl PackInfo {
    /// The pack's name in the printed IR (`%f3`, `%b7`).
    pub fn name(&self) -> String {
        let prefix = match self.direction {
            Direction::Forward => 'f',
            Direction::Backward => 'b',
        };
        format!("%{prefix}{}", self.number)
    }
}

/// A simulated step: metrics, every task with the time it ran, and each group's memory.
#[derive(Debug, Clone)]
pub struct SimResult {
    pub metrics: Metrics,
    pub layout: Layout,
    /// The tasks and their dependencies.
    pub graph: TaskGraph,
    /// When each task ran, in task order.
    pub spans: Vec<Span>,
    /// The packs, in the IR's canonical order (per replica, forward then backward).
    pub packs: Vec<PackInfo>,
    /// DP ranks of each replica, in the IR's replica order.
    pub replicas: Vec<Vec<u32>>,
    /// The memory timeline of each device group (every device of a group has it).
    pub memory: Vec<GroupMemory>,
    /// HBM bytes per device.
    pub capacity_bytes: u64,
}

impl SimResult {
    /// Tasks with their spans, in task order.
    pub fn tasks(&self) -> impl Iterator<Item = (&Task, Span)> + '_ {
        self.graph.tasks.iter().zip(self.spans.iter().copied())
    }

    /// The peak memory of each pipeline device (the highest of its groups).
    pub fn device_peaks(&self) -> Vec<u64> {
        super::memory::device_peaks(&self.layout, &self.memory)
    }

    /// The groups a task runs on.
    pub fn task_groups(&self, task: &Task) -> &[GroupId] {
        self.graph.groups(task)
    }

    /// The pack a task belongs to.
    pub fn pack(&self, index: PackIndex) -> &PackInfo {
        &self.packs[index.0 as usize]
    }

    /// A short label of a task: `F %f3`, `B %b7`, `W %b7`, `send %f3`, `dp-sync`, `optimizer`,
    /// `param-gather`.
    pub fn task_label(&self, task: &Task) -> String {
        let pack = task.pack.map(|p| self.pack(p).name()).unwrap_or_default();
        match task.kind {
            TaskKind::Forward => format!("F {pack}"),
            TaskKind::Backward => format!("B {pack}"),
            TaskKind::WeightGrad => format!("W {pack}"),
            TaskKind::Send(_) => format!("send {pack}"),
            TaskKind::GradReduceScatter => "dp-sync".to_string(),
            TaskKind::Optimizer => "optimizer".to_string(),
            TaskKind::ParamAllGather => "param-gather".to_string(),
        }
    }
}
