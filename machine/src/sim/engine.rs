//! The event-driven executor: runs the task graph on per-group compute and communication
//! streams.
//!
//! A task becomes *ready* when its last dependency finishes; it *starts* when it is ready and
//! the stream it needs is free on every one of its groups (a DP-Merge group's pack, a send, a
//! DP collective hold several groups at once), and holds those streams for its duration.
//! Ready tasks are served first come, first served: a binary heap ordered by ready time (ties
//! by task id, for determinism) pops them one by one, so each group's streams are granted in
//! the order their tasks became ready. Within one replica and stage the schedule order is a
//! dependency chain, and a group that several replicas share (a DP rank in a plain replica and
//! in a DP-Merge group) runs them in the rank's order, or one after the other (the task graph
//! chains them either way), so each group's compute order is the lowered program's, kept
//! exactly. (Unchained, `SharedRanks::FirstComeFirstServed`, the groups' shared replicas
//! interleave first come, first served: the order `interleave-ranks` writes down.)
//!
//! Start times on a stream only grow (each start is at least the stream's previous end), so
//! applying memory effects as pack compute tasks start yields each group's timeline in time
//! order.
//! Nothing is allocated per event; the heap and all per-task arrays are sized up front.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::Serialize;

use super::memory::GroupMemory;
use super::task::{Stream, TaskGraph, TaskId};

/// When a task ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Span {
    pub start_s: f64,
    pub end_s: f64,
}

impl Span {
    /// Seconds between start and end.
    pub fn duration_s(&self) -> f64 {
        self.end_s - self.start_s
    }
}

/// What running the graph produced.
pub(super) struct Execution {
    /// Per task, in task order.
    pub spans: Vec<Span>,
    /// Per device group.
    pub memory: Vec<GroupMemory>,
    /// Seconds each group's compute stream was busy.
    pub compute_busy_s: Vec<f64>,
}

/// Tasks that could never run because their dependencies form a cycle.
pub(super) struct Stuck {
    /// The first of them in task order.
    pub first: TaskId,
    pub count: usize,
}

/// Runs `graph` on one device group per entry of `baselines`, each starting with that many
/// bytes.
pub(super) fn execute(graph: &TaskGraph, baselines: &[u64]) -> Result<Execution, Stuck> {
    let tasks = &graph.tasks;
    let groups = baselines.len();
    let mut indegree = graph.indegrees();
    let mut ready_at = vec![0.0f64; tasks.len()];
    let mut spans = vec![Span::default(); tasks.len()];
    let mut done = vec![false; tasks.len()];
    let mut compute_free = vec![0.0f64; groups];
    let mut comm_free = vec![0.0f64; groups];
    let mut compute_busy_s = vec![0.0f64; groups];
    let mut memory: Vec<GroupMemory> = baselines.iter().map(|&b| GroupMemory::new(b)).collect();
    // Ready times are non-negative, whose IEEE bit patterns order like the values.
    let mut heap: BinaryHeap<Reverse<(u64, u32)>> = BinaryHeap::with_capacity(tasks.len());
    for (index, &degree) in indegree.iter().enumerate() {
        if degree == 0 {
            heap.push(Reverse((0.0f64.to_bits(), index as u32)));
        }
    }
    let mut finished = 0usize;
    while let Some(Reverse((ready_bits, index))) = heap.pop() {
        let id = TaskId(index);
        let task = &tasks[id.index()];
        let task_groups = graph.groups(task);
        let free = match task.kind.stream() {
            Stream::Compute => &mut compute_free,
            Stream::Comm => &mut comm_free,
        };
        let mut start = f64::from_bits(ready_bits);
        for group in task_groups {
            start = start.max(free[group.index()]);
        }
        let end = start + task.duration_s;
        for group in task_groups {
            free[group.index()] = end;
        }
        if task.kind.stream() == Stream::Compute {
            for group in task_groups {
                compute_busy_s[group.index()] += task.duration_s;
            }
        }
        if task.kind.is_pack_compute() {
            for group in task_groups {
                memory[group.index()].apply(&task.memory, start, end);
            }
        }
        spans[id.index()] = Span {
            start_s: start,
            end_s: end,
        };
        done[id.index()] = true;
        finished += 1;
        for &successor in graph.successors(id) {
            let slot = successor.index();
            ready_at[slot] = ready_at[slot].max(end);
            indegree[slot] -= 1;
            if indegree[slot] == 0 {
                heap.push(Reverse((ready_at[slot].to_bits(), successor.0)));
            }
        }
    }
    if finished < tasks.len() {
        let first = done
            .iter()
            .position(|&d| !d)
            .expect("an unfinished task exists");
        return Err(Stuck {
            first: TaskId(first as u32),
            count: tasks.len() - finished,
        });
    }
    Ok(Execution {
        spans,
        memory,
        compute_busy_s,
    })
}
