//! What an execution returns: the step's loss, gradients and updated weights, and what it
//! measured — every task's timing and op breakdown, every worker's memory.

use serde::Serialize;
use slimpack_ir::step::Direction;

use crate::abi::Call;
use crate::cpu::params::{Grads, Params};
use crate::cpu::profile::OpTimes;

/// One pack task as it ran on one device (a DP-Merge group's pack has one per member).
#[derive(Debug, Clone, Serialize)]
pub struct TaskRecord {
    /// Index into [`super::Plan::packs`].
    pub pack: usize,
    /// A zero-bubble schedule's deferred weight gradient of the pack (its other ops are a task
    /// of their own).
    pub weight_grad: bool,
    /// The pack's name in the printed IR.
    pub name: String,
    pub direction: Direction,
    pub replica: usize,
    pub rank: usize,
    pub stage: usize,
    /// Seconds from the step's start.
    pub start_s: f64,
    pub end_s: f64,
    /// Seconds of it spent waiting for the pipeline input.
    pub wait_s: f64,
    /// CPU seconds the worker's thread ran during the task (less than the task's wall time
    /// when it waited for its group or another process took its core).
    pub cpu_s: f64,
    /// Where the rest went.
    pub ops: OpTimes,
    /// The worker's memory around the task (with the counting allocator).
    pub memory: Option<TaskMemory>,
}

/// A worker's heap bytes around one task.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TaskMemory {
    /// Held when the task started.
    pub before_bytes: u64,
    /// Held when it ended (its input dropped, its output sent).
    pub after_bytes: u64,
    /// The most held while it ran.
    pub peak_bytes: u64,
}

impl TaskMemory {
    /// Bytes the task held only while it ran, above what it held before and after.
    pub fn temporary_bytes(&self) -> u64 {
        self.peak_bytes
            .saturating_sub(self.before_bytes.max(self.after_bytes))
    }
}

impl TaskRecord {
    /// Seconds the task ran, not counting the wait for its input.
    pub fn run_s(&self) -> f64 {
        self.end_s - self.start_s - self.wait_s
    }
}

/// Seconds of the end-of-step phases on one worker (each includes waiting for the peers).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct SyncTimes {
    /// Summing the tied embedding's gradient between the first and last stage.
    pub tied_embedding_s: f64,
    /// Data-parallel gradient reduce-scatter.
    pub grad_reduce_scatter_s: f64,
    /// AdamW over this rank's shard.
    pub optimizer_s: f64,
    /// Data-parallel all-gather of the updated weights.
    pub param_all_gather_s: f64,
}

/// One worker (device) of the step.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerReport {
    pub rank: usize,
    pub stage: usize,
    /// Bytes held when the step starts: weights, gradient buffer, optimizer shard (`None`
    /// without the counting allocator).
    pub model_state_bytes: Option<u64>,
    /// The most bytes the worker held at once during the step, those included.
    pub peak_memory_bytes: Option<u64>,
    /// When the worker finished, seconds from the step's start.
    pub finish_s: f64,
    /// Seconds spent running pack tasks (waits for inputs excluded).
    pub busy_s: f64,
    /// CPU seconds the worker's thread ran during the step.
    pub cpu_s: f64,
    /// The pack tasks' time by op class.
    pub ops: OpTimes,
    pub sync: SyncTimes,
}

/// A training step as executed.
#[derive(Debug, Clone)]
pub struct Execution {
    /// Mean loss over the batch's predicted tokens.
    pub loss: f64,
    /// Gradients of the whole model, summed over data-parallel ranks (tied copies summed).
    pub grads: Grads,
    /// The whole model after the AdamW step.
    pub params: Params,
    /// Wall time from the moment every worker was ready to the last worker's end.
    pub step_time_s: f64,
    /// Per device, by [`super::Plan::device_index`].
    pub workers: Vec<WorkerReport>,
    /// Every pack task, by device, in the order it ran.
    pub tasks: Vec<TaskRecord>,
    /// Per device, the C ABI calls (program ops) it executed, in order.
    pub trace: Vec<Vec<Call>>,
}

impl Execution {
    /// Ops executed, over all devices.
    pub fn trace_ops(&self) -> usize {
        self.trace.iter().map(Vec::len).sum()
    }

    /// A 64-bit FNV-1a hash of the trace (device by device, call by call), as 16 hex digits:
    /// equal traces hash equal in every build and on every machine.
    pub fn trace_hash(&self) -> String {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for (device, calls) in self.trace.iter().enumerate() {
            let mut text = format!("device {device}\n");
            for call in calls {
                text.push_str(&format!("{call:?}\n"));
            }
            for byte in text.bytes() {
                hash ^= u64::from(byte);
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
        }
        format!("{hash:016x}")
    }
}
