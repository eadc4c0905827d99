//! One device worker: a thread that holds one pipeline stage's weights for one DP rank and runs
//! its op list of the step's [`Program`], driven through the runtime's C ABI by its [`Driver`]
//! (the interpreter or a compiled driver's `slimpack_run_device(index)`); the thread's C ABI
//! handler is the worker's [`DeviceRun`], which executes each op.
//!
//! Everything the worker allocates counts on its own [`MemoryMeter`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use slimpack_ir::program::{Op, Program};

use crate::abi::{self, Call};
use crate::cpu::adamw::AdamWConfig;
use crate::cpu::batch::TokenBatch;
use crate::cpu::config::ModelConfig;
use crate::cpu::counting_alloc::MemoryMeter;
use crate::cpu::cp::ThreadExchange;
use crate::cpu::error::{CpuError, Result};
use crate::cpu::params::Params;

use super::driver::Driver;
use super::mailbox::{Inbox, Outboxes};
use super::ops::DeviceRun;
use super::plan::{Device, Plan};
use super::result::{TaskRecord, WorkerReport};
use super::sync::Collectives;

/// Everything a worker starts with.
pub struct WorkerThread<'a> {
    pub device: Device,
    pub plan: &'a Plan,
    pub program: &'a Program,
    /// This worker's ops (`program.workers[index].ops`, index [`Plan::device_index`]).
    pub ops: &'a [Op],
    pub driver: &'a Driver,
    pub config: ModelConfig,
    pub batch: &'a TokenBatch,
    /// This stage's initial weights (shared; the worker copies them).
    pub weights: &'a Params,
    pub adamw: AdamWConfig,
    pub inbox: Inbox,
    pub outboxes: Outboxes,
    /// This device's ends of the exchanges of the DP-Merge groups it belongs to, by replica.
    pub exchanges: BTreeMap<usize, ThreadExchange>,
    pub collectives: &'a Collectives,
    /// The time origin shared by all workers.
    pub epoch: Instant,
    pub abort: Arc<AtomicBool>,
}

/// What a worker hands back.
pub struct Outcome {
    pub loss: f64,
    pub tasks: Vec<TaskRecord>,
    /// The C ABI calls the worker executed, in order.
    pub trace: Vec<Call>,
    pub report: WorkerReport,
    /// When the worker started the step (after everyone was ready), seconds from the epoch.
    pub started_s: f64,
    /// This rank's shard of the stage's summed gradients.
    pub grad_shard: Vec<f32>,
    /// The stage's weights after the step.
    pub params: Params,
}

/// Raises the step's abort flag unless disarmed (on an error or a panic), so that the other
/// workers stop waiting for this one.
struct AbortOnFailure(Arc<AtomicBool>);

impl Drop for AbortOnFailure {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl<'a> WorkerThread<'a> {
    /// Runs the worker to the end of the step.
    pub fn run(self) -> Result<Outcome> {
        let guard = AbortOnFailure(Arc::clone(&self.abort));
        let meter = MemoryMeter::new();
        let attached = meter.as_ref().map(MemoryMeter::attach);
        let outcome = self.run_metered(meter.as_ref());
        drop(attached);
        if outcome.is_ok() {
            std::mem::forget(guard);
        }
        outcome
    }

    fn run_metered(mut self, meter: Option<&MemoryMeter>) -> Result<Outcome> {
        let (program, driver) = (self.program, self.driver);
        let index = self.plan.device_index(self.device);
        let mut run = DeviceRun::new(&mut self, meter);
        run.start()?;
        abi::with_handler(&mut |call| run.handle(call), || {
            driver.run_device(program, index)
        });
        run.finish()
    }

    /// The worker's name in errors.
    pub fn name(&self) -> String {
        format!("rank {}, stage {}", self.device.rank, self.device.stage)
    }

    pub(super) fn aborted(&self) -> CpuError {
        CpuError::WorkerFailed {
            worker: self.name(),
            message: "another worker stopped before the step started".to_string(),
        }
    }
}
