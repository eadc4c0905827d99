//! The step's figures of merit, computed from the executed task graph.
//!
//! Definitions (all times in seconds; "devices" is `tp × cp × pp × dp`):
//! - `step_time_s`: when the last task (the last stage's parameter all-gather, usually) ends.
//! - `tokens_per_s`: the step's tokens over the step time.
//! - `mfu`: model FLOPs (forward + 2x-forward backward, no recomputation, causal attention:
//!   `CostModel::model_flops`) over `devices × peak FLOP/s × step time`.
//! - `ideal_step_time_s`: the physical limit of this step's compute: every FLOP the step
//!   executes (recomputation included, summed over all devices) at the *saturated* rate of its
//!   kernel kind (GEMM or attention, forward or backward: the efficiency curves of
//!   `crate::cost::Throughput` at 2^30 tokens), spread perfectly over all devices:
//!   `Σ_kinds FLOPs_kind / rate_kind / devices`. It ignores memory-bound kernels, kernel
//!   overheads, communication, small-pack inefficiency, imbalance and bubbles, so
//!   `step_time_s ≥ ideal_step_time_s` always.
//! - `efficiency`: `ideal_step_time_s / step_time_s`, in (0, 1].
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
use super::engine::Execution;
use super::layout::{GroupId, Layout};

/// Figures of one simulated step (field names are a stable contract: reports print them).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Metrics {
    pub step_time_s: f64,
    pub tokens_per_s: f64,
    pub mfu: f64,
    pub ideal_step_time_s: f64,
    pub efficiency: f64,
    pub dp_imbalance: f64,
    pub pp_imbalance: f64,
    pub bubble_fraction: f64,
    pub peak_memory_bytes: u64,
    pub peak_memory_per_device: Vec<u64>,
    pub oom: bool,
    pub oom_device: Option<u64>,
    pub busy_per_device_s: Vec<f64>,
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
    let ideal_device_s: f64 = built.graph.tasks.iter().map(|t| t.ideal_device_s).sum();
    let ideal_step_time_s = ideal_device_s / devices;
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
        ideal_step_time_s,
        efficiency: ratio(ideal_step_time_s, step_time_s),
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
