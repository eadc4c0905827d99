//! The task graph: what the simulated machine runs, on which streams, after what.
//!
//! A task occupies one stream (compute or communication) of one or more device groups for its
//! whole duration: a pack's forward or backward on the groups of its replica at one stage (a
//! DP-Merge group spans several), a pipeline send on the communication streams of the sending
//! and the receiving groups, a stage's gradient reduce-scatter and parameter all-gather on the
//! communication streams of all its groups, its optimizer step on their compute streams.
//! Dependencies are edges of a DAG, stored compactly (successor lists in one array), so the
//! executor never allocates per event.

use std::ops::Range;

use serde::Serialize;
use slimpack_ir::step::Direction;

use super::layout::GroupId;
use super::memory::MemoryEffect;

/// A task's position in [`TaskGraph::tasks`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct TaskId(pub u32);

impl TaskId {
    /// The task's index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A pack's position in the simulator's pack table ([`super::SimResult::packs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct PackIndex(pub u32);

/// What a task does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaskKind {
    /// A pack's forward on one stage.
    Forward,
    /// A pack's backward on one stage: all of it, or (zero-bubble schedules) its
    /// input-gradient part, which the pipeline waits for.
    Backward,
    /// The deferred weight-gradient part of a pack's backward on one stage: after that
    /// pack's input gradient on the same devices; nothing but the stage's DP sync waits for it.
    WeightGrad,
    /// A pack's activations (forward) or activation gradients (backward) sent to the next
    /// (forward) or previous (backward) stage.
    Send(Direction),
    /// A stage's gradient reduce-scatter over the DP group (distributed optimizer).
    GradReduceScatter,
    /// A stage's optimizer step on every device of the stage.
    Optimizer,
    /// A stage's parameter all-gather after the optimizer step.
    ParamAllGather,
}

impl TaskKind {
    /// The stream the task occupies.
    pub fn stream(self) -> Stream {
        match self {
            TaskKind::Forward | TaskKind::Backward | TaskKind::WeightGrad | TaskKind::Optimizer => {
                Stream::Compute
            }
            TaskKind::Send(_) | TaskKind::GradReduceScatter | TaskKind::ParamAllGather => {
                Stream::Comm
            }
        }
    }

    /// True for a pack's forward or backward (or a part of it).
    pub fn is_pack_compute(self) -> bool {
        matches!(
            self,
            TaskKind::Forward | TaskKind::Backward | TaskKind::WeightGrad
        )
    }
}

/// The two streams of every device group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    /// Kernels: GEMMs, attention, element-wise, and the exposed TP collectives between them.
    Compute,
    /// Pipeline sends and receives, DP gradient sync.
    Comm,
}

/// One task of the graph.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Task {
    pub kind: TaskKind,
    /// The pipeline stage the task runs on (a send: the sending stage).
    pub stage: u32,
    /// The replica (index into the IR's replicas) for pack tasks and sends.
    pub replica: Option<u32>,
    /// The pack for pack tasks and sends.
    pub pack: Option<PackIndex>,
    /// Positions of the task's groups in [`TaskGraph::group_lists`].
    pub groups: Range<u32>,
    /// Seconds the task holds its stream.
    pub duration_s: f64,
    /// Seconds of CP K/V exchange that run beside a merged pack's attention kernels (on the
    /// CP communicator, overlapped with compute; the part the attention cannot hide is
    /// already in `duration_s`).
    pub cp_exchange_s: f64,
    /// What a pack compute task's `duration_s` goes to on each of its devices (all zero for
    /// the other tasks).
    pub parts: ComputeParts,
    /// Memory the task allocates and frees on each of its devices.
    pub memory: MemoryEffect,
}

/// A pack compute task's seconds on one of its devices, by cause; the parts add up to the
/// task's duration. The FLOP parts are priced at the saturated kernel rates (see
/// [`super::Metrics`]); what the kernels take beyond that is `below_saturation_s`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ComputeParts {
    /// The real tokens' model FLOPs (no recomputation) at the saturated rates.
    pub useful_s: f64,
    /// The real tokens' recomputed forward FLOPs at the saturated forward rates.
    pub recompute_s: f64,
    /// The pad tokens' FLOPs (recomputation included) at the saturated rates.
    pub padding_s: f64,
    /// GEMM and attention kernel time beyond the three parts above: kernels too small to
    /// reach their saturated rate.
    pub below_saturation_s: f64,
    /// Memory-bound element-wise kernels (norms, RoPE, activations, residuals, embedding,
    /// loss).
    pub memory_bound_s: f64,
    /// Fixed per-kernel launch overheads.
    pub launch_overhead_s: f64,
    /// TP collectives the GEMMs do not hide.
    pub exposed_tp_s: f64,
    /// CP K/V exchange the attention kernels do not hide.
    pub exposed_cp_s: f64,
}

impl ComputeParts {
    /// The sum of the parts: the task's duration.
    pub fn total_s(&self) -> f64 {
        self.useful_s
            + self.recompute_s
            + self.padding_s
            + self.below_saturation_s
            + self.memory_bound_s
            + self.launch_overhead_s
            + self.exposed_tp_s
            + self.exposed_cp_s
    }

    /// FLOPs the task executes (useful, recomputed, padding) at the saturated rates.
    pub fn saturated_s(&self) -> f64 {
        self.useful_s + self.recompute_s + self.padding_s
    }
}

/// The DAG of tasks.
#[derive(Debug, Clone, Default)]
pub struct TaskGraph {
    pub tasks: Vec<Task>,
    /// Concatenated group lists of all tasks (see [`Task::groups`]).
    pub group_lists: Vec<GroupId>,
    /// Concatenated successor lists; task `t`'s are `successors[successor_start[t]..successor_start[t + 1]]`.
    successors: Vec<TaskId>,
    successor_start: Vec<u32>,
}

impl TaskGraph {
    /// The groups a task runs on.
    pub fn groups(&self, task: &Task) -> &[GroupId] {
        &self.group_lists[task.groups.start as usize..task.groups.end as usize]
    }

    /// Tasks that depend on `task`.
    pub fn successors(&self, task: TaskId) -> &[TaskId] {
        let start = self.successor_start[task.index()] as usize;
        let end = self.successor_start[task.index() + 1] as usize;
        &self.successors[start..end]
    }

    /// Number of dependencies of each task.
    pub fn indegrees(&self) -> Vec<u32> {
        let mut indegree = vec![0u32; self.tasks.len()];
        for successor in &self.successors {
            indegree[successor.index()] += 1;
        }
        indegree
    }

    /// Number of dependency edges.
    pub fn edge_count(&self) -> usize {
        self.successors.len()
    }
}

/// Accumulates tasks and edges, then freezes them into a [`TaskGraph`].
#[derive(Debug, Default)]
pub(super) struct TaskGraphBuilder {
    tasks: Vec<Task>,
    group_lists: Vec<GroupId>,
    edges: Vec<(TaskId, TaskId)>,
}

impl TaskGraphBuilder {
    /// A builder with room for about `tasks` tasks.
    pub fn with_capacity(tasks: usize) -> TaskGraphBuilder {
        TaskGraphBuilder {
            tasks: Vec::with_capacity(tasks),
            group_lists: Vec::with_capacity(tasks * 2),
            edges: Vec::with_capacity(tasks * 2),
        }
    }

    /// Appends a group list and returns its range, for [`Task::groups`].
    pub fn add_groups(&mut self, groups: impl IntoIterator<Item = GroupId>) -> Range<u32> {
        let start = self.group_lists.len() as u32;
        self.group_lists.extend(groups);
        start..self.group_lists.len() as u32
    }

    /// Adds a task.
    pub fn add_task(&mut self, task: Task) -> TaskId {
        let id = TaskId(u32::try_from(self.tasks.len()).expect("fewer than 2^32 tasks"));
        self.tasks.push(task);
        id
    }

    /// `to` runs only after `from` has finished.
    pub fn add_edge(&mut self, from: TaskId, to: TaskId) {
        self.edges.push((from, to));
    }

    /// The frozen graph (successor lists by counting sort on the source task: no hashing).
    pub fn finish(self) -> TaskGraph {
        let count = self.tasks.len();
        let mut successor_start = vec![0u32; count + 1];
        for &(from, _) in &self.edges {
            successor_start[from.index() + 1] += 1;
        }
        for i in 0..count {
            successor_start[i + 1] += successor_start[i];
        }
        let mut fill = successor_start.clone();
        let mut successors = vec![TaskId(0); self.edges.len()];
        for &(from, to) in &self.edges {
            let slot = &mut fill[from.index()];
            successors[*slot as usize] = to;
            *slot += 1;
        }
        TaskGraph {
            tasks: self.tasks,
            group_lists: self.group_lists,
            successors,
            successor_start,
        }
    }
}
