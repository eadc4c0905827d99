//! The step's figures of merit, computed from the executed task graph.
//!
//! Definitions (all times in seconds; "devices" is `tp × cp × pp × dp`; "saturated rates" are
//! the highest rates each kernel kind — GEMM or attention, forward or backward — reaches at
//! any size, `crate::cost::Throughput::saturated_rate`: the analytic curve's ceiling or a
//! calibration table's best point):
//! - `step_time_s`: when the last task (the last stage's parameter all-gather, usually) ends.
//! - `tokens_per_s`: the step's tokens over the step time.
//! - `mfu`: model FLOPs (forward + 2x-forward backward, no recomputation, causal attention:
//!   `CostModel::model_flops`) over `devices × peak FLOP/s × step time`.
//! - `useful_ideal_step_time_s`: the batch's real tokens' model FLOPs — forward, and backward
//!   at the cost model's ratios (GEMMs 2x, attention 2.5x: FlashAttention's backward), no
//!   recomputation, no pad tokens — at the saturated rates of their kernels, spread perfectly
//!   over all devices: `Σ useful device-seconds / devices`.
//! - `efficiency`: `useful_ideal_step_time_s / step_time_s`, in (0, 1]: how much of the step
//!   does the work the batch asks for. Recomputation and padding count as losses.
//! - `ideal_step_time_s`: the same for every *executed* FLOP (recomputation and pad tokens
//!   included); `executed_efficiency` = `ideal_step_time_s / step_time_s`. It ignores the
//!   cost of recomputing and padding, so a wasteful plan can score well on it.
//! - `floor_step_time_s`: what no schedule of this batch on this layout avoids in the machine
//!   model: the useful ideal, plus the per-token work no packing removes — the memory-bound
//!   kernels and the first of the `tp` ring steps of each TP collective (which no GEMM can
//!   hide), priced as one pack of all real tokens per stage and direction without
//!   recomputation and spread over all devices — plus the shortest DP tail of any stage
//!   (gradient reduce-scatter, optimizer, parameter all-gather: some stage finishes last and
//!   syncs after its last backward). The device with the most pack work ends its packs no
//!   earlier than the spread figure and then waits for its stage's tail, so
//!   `floor_step_time_s ≤ step_time_s` under the analytic model.
//! - `schedule_efficiency`: `floor_step_time_s / step_time_s`: how close the schedule comes
//!   to what the layout allows.
//! - `losses` ([`Losses`]): where the step goes, device-averaged, summing to `step_time_s`.
//!   Every device of a group runs the group's timeline, so the average is over groups. A
//!   group's timeline `[0, step]` is cut into:
//!   - its pack compute tasks (forward and backward), each split by the task's
//!     [`ComputeParts`](super::ComputeParts): `useful_compute_s`, `recompute_s`, `padding_s`
//!     (FLOPs at the saturated rates), `below_saturation_s` (GEMM and attention time beyond
//!     that), `memory_bound_s`, `launch_overhead_s`, `exposed_tp_s`, `exposed_cp_s`;
//!   - the idle gaps before and between them. The part of a gap before pack task `X` during
//!     which the pipeline send `X` receives was in flight (from the sending task's end to the
//!     send's end) is `exposed_pp_s`; the rest is pipeline idle by position on the group's
//!     timeline: before its first backward starts (the pipeline filling, until the first
//!     gradient arrives) `pipeline_idle_warmup_s`; from then until its last forward ends
//!     (1F1B's steady state) `pipeline_idle_steady_s`; after both `pipeline_idle_drain_s`;
//!   - the tail after its last pack: until the last pack of its stage on any replica ends
//!     `dp_imbalance_wait_s` (the gradient reduce-scatter waits for the slowest replica; a
//!     group without packs waits there from the start); from then until the stage's
//!     parameter all-gather ends `dp_sync_optimizer_s` (reduce-scatter, optimizer step,
//!     all-gather, and any wait for the communication stream); after that, until the step
//!     ends, `pipeline_idle_drain_s` (other stages are still draining).
//! - `dp_imbalance`: max over DP ranks of the rank's pack compute time (forward and backward
//!   tasks on its groups of every stage; a DP-Merge group's pack counts on each of its ranks)
//!   over the mean; 1 is perfect balance.
//! - `pp_imbalance`: WLB-LLM's pipeline imbalance, `max_s L_s · pp / Σ_s L_s`, where the
//!   latency `L_s` of stage `s` is its pack compute time summed over DP ranks; 1 is perfect.
//! - `bubble_fraction`: idle compute-stream time over total device time,
//!   `Σ_devices (step − compute busy) / (devices · step)`.
//! - `peak_memory_bytes`, `peak_memory_per_device` (by global rank): the memory timeline's
//!   highest point; `oom` when a device's peak exceeds its HBM, `oom_device` the lowest such
//!   global rank.
//! - `busy_per_device_s`: seconds each device's compute stream was busy (pack forwards and
//!   backwards, optimizer step), by global rank.

use serde::Serialize;

use super::build::Built;
use super::engine::{Execution, Span};
use super::layout::{GroupId, Layout};
use super::task::{TaskGraph, TaskKind};

/// Figures of one simulated step (field names are a stable contract: reports print them).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Metrics {
    pub step_time_s: f64,
    pub tokens_per_s: f64,
    pub mfu: f64,
    pub useful_ideal_step_time_s: f64,
    pub efficiency: f64,
    pub ideal_step_time_s: f64,
    pub executed_efficiency: f64,
    pub floor_step_time_s: f64,
    pub schedule_efficiency: f64,
    pub losses: Losses,
    pub dp_imbalance: f64,
    pub pp_imbalance: f64,
    pub bubble_fraction: f64,
    pub peak_memory_bytes: u64,
    pub peak_memory_per_device: Vec<u64>,
    pub oom: bool,
    pub oom_device: Option<u64>,
    pub busy_per_device_s: Vec<f64>,
}

/// Where the step goes: device-averaged seconds by cause, adding up to the step time (see the
/// module documentation for how a device's timeline is cut).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Losses {
    pub useful_compute_s: f64,
    pub recompute_s: f64,
    pub below_saturation_s: f64,
    pub memory_bound_s: f64,
    pub launch_overhead_s: f64,
    pub exposed_tp_s: f64,
    pub exposed_cp_s: f64,
    pub exposed_pp_s: f64,
    pub pipeline_idle_warmup_s: f64,
    pub pipeline_idle_steady_s: f64,
    pub pipeline_idle_drain_s: f64,
    pub dp_imbalance_wait_s: f64,
    pub dp_sync_optimizer_s: f64,
    pub padding_s: f64,
}

impl Losses {
    /// `(what, seconds)` of every cause, in field order; `what` is the field's name without
    /// the `_s` unit, in words (`"useful compute"`, `"pipeline idle warmup"`).
    pub fn entries(&self) -> [(&'static str, f64); 14] {
        [
            ("useful compute", self.useful_compute_s),
            ("recompute", self.recompute_s),
            ("below saturation", self.below_saturation_s),
            ("memory bound", self.memory_bound_s),
            ("launch overhead", self.launch_overhead_s),
            ("exposed tp", self.exposed_tp_s),
            ("exposed cp", self.exposed_cp_s),
            ("exposed pp", self.exposed_pp_s),
            ("pipeline idle warmup", self.pipeline_idle_warmup_s),
            ("pipeline idle steady", self.pipeline_idle_steady_s),
            ("pipeline idle drain", self.pipeline_idle_drain_s),
            ("dp imbalance wait", self.dp_imbalance_wait_s),
            ("dp sync optimizer", self.dp_sync_optimizer_s),
            ("padding", self.padding_s),
        ]
    }

    /// The sum of all causes: the step time.
    pub fn total_s(&self) -> f64 {
        self.entries().iter().map(|(_, seconds)| seconds).sum()
    }

    fn add_compute(&mut self, parts: &super::ComputeParts) {
        self.useful_compute_s += parts.useful_s;
        self.recompute_s += parts.recompute_s;
        self.padding_s += parts.padding_s;
        self.below_saturation_s += parts.below_saturation_s;
        self.memory_bound_s += parts.memory_bound_s;
        self.launch_overhead_s += parts.launch_overhead_s;
        self.exposed_tp_s += parts.exposed_tp_s;
        self.exposed_cp_s += parts.exposed_cp_s;
    }

    fn scaled(self, factor: f64) -> Losses {
        let mut scaled = self;
        for field in [
            &mut scaled.useful_compute_s,
            &mut scaled.recompute_s,
            &mut scaled.below_saturation_s,
            &mut scaled.memory_bound_s,
            &mut scaled.launch_overhead_s,
            &mut scaled.exposed_tp_s,
            &mut scaled.exposed_cp_s,
            &mut scaled.exposed_pp_s,
            &mut scaled.pipeline_idle_warmup_s,
            &mut scaled.pipeline_idle_steady_s,
            &mut scaled.pipeline_idle_drain_s,
            &mut scaled.dp_imbalance_wait_s,
            &mut scaled.dp_sync_optimizer_s,
            &mut scaled.padding_s,
        ] {
            *field *= factor;
        }
        scaled
    }
}

/// Computes the metrics of an executed step.
pub(super) fn compute(
    built: &Built,
    execution: &Execution,
    layout: &Layout,
    peak_flops: f64,
    capacity_bytes: u64,
) -> Metrics {
    let devices = layout.devices() as f64;
    let step_time_s = execution
        .spans
        .iter()
        .fold(0.0f64, |latest, span| latest.max(span.end_s));
    let per_group = layout.devices_per_group() as f64;
    let (mut useful_device_s, mut executed_device_s) = (0.0, 0.0);
    for task in &built.graph.tasks {
        let task_devices = built.graph.groups(task).len() as f64 * per_group;
        useful_device_s += task.parts.useful_s * task_devices;
        executed_device_s += task.parts.saturated_s() * task_devices;
    }
    let useful_ideal_step_time_s = useful_device_s / devices;
    let ideal_step_time_s = executed_device_s / devices;
    let floor_step_time_s =
        (useful_device_s + built.floor_overhead_device_s) / devices + built.min_sync_tail_s;
    let losses = losses(built, execution, layout, step_time_s);
    debug_assert!(
        (losses.total_s() - step_time_s).abs() <= 1e-6 * step_time_s.max(1e-12),
        "bug: the losses add up to {} s, the step is {step_time_s} s",
        losses.total_s()
    );
    let (dp_imbalance, pp_imbalance) = imbalances(built, execution, layout);
    let per_group = layout.devices_per_group() as usize;
    let mut peak_memory_per_device = Vec::with_capacity(layout.devices());
    let mut busy_per_device_s = Vec::with_capacity(layout.devices());
    for group in 0..layout.groups() {
        let peak = execution.memory[group].peak_bytes;
        let busy = execution.compute_busy_s[group];
        peak_memory_per_device.extend(std::iter::repeat_n(peak, per_group));
        busy_per_device_s.extend(std::iter::repeat_n(busy, per_group));
    }
    let oom_device = execution
        .memory
        .iter()
        .position(|group| group.peak_bytes > capacity_bytes)
        .map(|group| layout.device_range(GroupId(group as u32)).start);
    let busy: f64 = busy_per_device_s.iter().sum();
    let ratio = |numerator: f64, denominator: f64| {
        if denominator > 0.0 {
            numerator / denominator
        } else {
            0.0
        }
    };
    Metrics {
        step_time_s,
        tokens_per_s: ratio(built.tokens as f64, step_time_s),
        mfu: ratio(built.model_flops, devices * peak_flops * step_time_s),
        useful_ideal_step_time_s,
        efficiency: ratio(useful_ideal_step_time_s, step_time_s),
        ideal_step_time_s,
        executed_efficiency: ratio(ideal_step_time_s, step_time_s),
        floor_step_time_s,
        schedule_efficiency: ratio(floor_step_time_s, step_time_s),
        losses,
        dp_imbalance,
        pp_imbalance,
        bubble_fraction: ratio(devices * step_time_s - busy, devices * step_time_s),
        peak_memory_bytes: peak_memory_per_device.iter().copied().max().unwrap_or(0),
        peak_memory_per_device,
        oom: oom_device.is_some(),
        oom_device,
        busy_per_device_s,
    }
}

/// Marks a task without an incoming pipeline send.
const NO_SEND: u32 = u32::MAX;

/// Where the step goes, device-averaged (see the module documentation).
fn losses(built: &Built, execution: &Execution, layout: &Layout, step_time_s: f64) -> Losses {
    let graph = &built.graph;
    let spans = &execution.spans;
    let stages = layout.pp as usize;
    let mut stage_work_end = vec![0.0f64; stages];
    let mut sync_end = vec![step_time_s; stages];
    // Each group's pack tasks in the order they ran (a stream runs one task at a time):
    // grouped by a counting sort (in task order), then each group's run sorted by start.
    let groups = layout.groups();
    let mut group_start = vec![0u32; groups + 1];
    for (index, task) in graph.tasks.iter().enumerate() {
        let stage = (task.stage % layout.pp) as usize;
        if task.kind.is_pack_compute() {
            stage_work_end[stage] = stage_work_end[stage].max(spans[index].end_s);
            for group in graph.groups(task) {
                group_start[group.0 as usize + 1] += 1;
            }
        } else if task.kind == TaskKind::ParamAllGather {
            sync_end[stage] = spans[index].end_s;
        }
    }
    for group in 0..groups {
        group_start[group + 1] += group_start[group];
    }
    let mut on_group = vec![0u32; group_start[groups] as usize];
    let mut next = group_start.clone();
    for (index, task) in graph.tasks.iter().enumerate() {
        if task.kind.is_pack_compute() {
            for group in graph.groups(task) {
                on_group[next[group.0 as usize] as usize] = index as u32;
                next[group.0 as usize] += 1;
            }
        }
    }
    let received = incoming_sends(graph, spans);
    let mut total = Losses::default();
    for group in 0..groups {
        let run = &mut on_group[group_start[group] as usize..group_start[group + 1] as usize];
        run.sort_unstable_by(|&a, &b| {
            let start = |task: u32| spans[task as usize].start_s;
            start(a).total_cmp(&start(b)).then(a.cmp(&b))
        });
        let stage = layout.stage_of(GroupId(group as u32)) as usize;
        let tail = Tail {
            stage_work_end: stage_work_end[stage],
            sync_end: sync_end[stage],
            step_end: step_time_s,
        };
        group_losses(graph, spans, &received, run, &tail, &mut total);
    }
    total.scaled(1.0 / layout.groups().max(1) as f64)
}

/// The pipeline send each pack task receives, with the time it became ready (the sending
/// task's end): `(send, ready)` by receiving task; `NO_SEND` where none.
fn incoming_sends(graph: &TaskGraph, spans: &[Span]) -> Vec<(u32, f64)> {
    let mut received = vec![(NO_SEND, 0.0); graph.tasks.len()];
    for (index, task) in graph.tasks.iter().enumerate() {
        if !matches!(task.kind, TaskKind::Send(_)) {
            continue;
        }
        for &receiver in graph.successors(super::TaskId(index as u32)) {
            received[receiver.index()].0 = index as u32;
        }
    }
    for (index, task) in graph.tasks.iter().enumerate() {
        if !task.kind.is_pack_compute() {
            continue;
        }
        for &successor in graph.successors(super::TaskId(index as u32)) {
            if matches!(graph.tasks[successor.index()].kind, TaskKind::Send(_)) {
                for &receiver in graph.successors(successor) {
                    received[receiver.index()].1 = spans[index].end_s;
                }
            }
        }
    }
    received
}

/// The end of a group's timeline: its stage's last pack, its stage's DP sync, the step.
struct Tail {
    stage_work_end: f64,
    sync_end: f64,
    step_end: f64,
}

/// Adds one group's timeline (its `(group, pack task)` entries in start order) to `total`.
fn group_losses(
    graph: &TaskGraph,
    spans: &[Span],
    received: &[(u32, f64)],
    tasks: &[u32],
    tail: &Tail,
    total: &mut Losses,
) {
    let mut first_backward_start = f64::INFINITY;
    let mut last_forward_end = f64::NEG_INFINITY;
    for &index in tasks {
        let span = spans[index as usize];
        match graph.tasks[index as usize].kind {
            TaskKind::Forward => last_forward_end = last_forward_end.max(span.end_s),
            _ => first_backward_start = first_backward_start.min(span.start_s),
        }
    }
    let phases = IdlePhases {
        steady_start: first_backward_start,
        drain_start: first_backward_start.max(last_forward_end),
    };
    let mut cursor = 0.0f64;
    for &index in tasks {
        let span = spans[index as usize];
        if span.start_s > cursor {
            let mut idle = phases.split(cursor, span.start_s);
            let (send, ready) = received[index as usize];
            if send != NO_SEND {
                let in_flight = (
                    cursor.max(ready),
                    span.start_s.min(spans[send as usize].end_s),
                );
                if in_flight.1 > in_flight.0 {
                    let exposed = phases.split(in_flight.0, in_flight.1);
                    for (phase, part) in idle.iter_mut().zip(exposed) {
                        *phase -= part;
                    }
                    total.exposed_pp_s += in_flight.1 - in_flight.0;
                }
            }
            total.pipeline_idle_warmup_s += idle[0];
            total.pipeline_idle_steady_s += idle[1];
            total.pipeline_idle_drain_s += idle[2];
        }
        total.add_compute(&graph.tasks[index as usize].parts);
        cursor = span.end_s;
    }
    total.dp_imbalance_wait_s += tail.stage_work_end - cursor;
    total.dp_sync_optimizer_s += tail.sync_end - tail.stage_work_end;
    total.pipeline_idle_drain_s += tail.step_end - tail.sync_end;
}

/// The positions that cut a group's idle time into warm-up, steady and drain.
struct IdlePhases {
    steady_start: f64,
    drain_start: f64,
}

impl IdlePhases {
    /// Seconds of `[from, to]` in the warm-up, steady and drain phases.
    fn split(&self, from: f64, to: f64) -> [f64; 3] {
        let overlap = |low: f64, high: f64| (to.min(high) - from.max(low)).max(0.0);
        [
            overlap(f64::NEG_INFINITY, self.steady_start),
            overlap(self.steady_start, self.drain_start),
            overlap(self.drain_start, f64::INFINITY),
        ]
    }
}

/// (DP imbalance, PP imbalance) from the pack compute time of every group.
fn imbalances(built: &Built, execution: &Execution, layout: &Layout) -> (f64, f64) {
    let mut per_group = vec![0.0f64; layout.groups()];
    for (task, span) in built.graph.tasks.iter().zip(&execution.spans) {
        if task.kind.is_pack_compute() {
            for group in built.graph.groups(task) {
                per_group[group.index()] += span.duration_s();
            }
        }
    }
    let mut per_rank = vec![0.0f64; layout.dp as usize];
    let mut per_stage = vec![0.0f64; layout.pp as usize];
    for (group, &time) in per_group.iter().enumerate() {
        let group = GroupId(group as u32);
        per_rank[layout.rank_of(group) as usize] += time;
        per_stage[layout.stage_of(group) as usize] += time;
    }
    (max_over_mean(&per_rank), max_over_mean(&per_stage))
}

/// `max / mean` of non-negative values; 1 when they are all zero.
fn max_over_mean(values: &[f64]) -> f64 {
    let total: f64 = values.iter().sum();
    if total <= 0.0 {
        return 1.0;
    }
    let max = values.iter().copied().fold(0.0f64, f64::max);
    max * values.len() as f64 / total
}
