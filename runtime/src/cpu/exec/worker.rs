//! One device worker: a thread that holds one pipeline stage's weights for one DP rank, runs its
//! pack tasks in the device order, and ends the step with the collectives.
//!
//! A task of a plain replica runs on the rank's own [`StageState`]; a task of a DP-Merge group
//! runs on the state this device keeps for that group, whose exchange links it to the group's
//! other members on the same stage (each holds its share of the pack's tokens). Forward inputs
//! come from the same rank's previous stage, backward inputs from its next stage, through the
//! [`Inbox`]. Everything the worker allocates counts on its own [`MemoryMeter`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use slimpack_ir::step::Direction;

use crate::cpu::adamw::{AdamWConfig, ShardedAdamW};
use crate::cpu::batch::Batch;
use crate::cpu::config::ModelConfig;
use crate::cpu::counting_alloc::MemoryMeter;
use crate::cpu::cp::{KvExchange, LocalExchange, ThreadExchange};
use crate::cpu::error::{CpuError, Result};
use crate::cpu::params::{Grads, Params};
use crate::cpu::profile::{self, OpTimes};
use crate::cpu::stage_state::StageState;

use super::mailbox::{Inbox, Outboxes, Tag};
use super::plan::{Device, Plan};
use super::result::{SyncTimes, TaskMemory, TaskRecord, WorkerReport};
use super::sync::{shard_range, Collectives, Sync};

/// Everything a worker starts with.
pub struct Worker<'a> {
    pub device: Device,
    pub plan: &'a Plan,
    pub order: &'a [usize],
    pub config: ModelConfig,
    pub batch: &'a Batch,
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
    pub report: WorkerReport,
    /// When the worker started the step (after everyone was ready), seconds from the epoch.
    pub started_s: f64,
    /// This rank's shard of the stage's summed gradients.
    pub grad_shard: Vec<f32>,
    /// The stage's weights after the step.
    pub params: Params,
}

/// A meter's bytes now (never negative: blocks freed by others are taken off their meters).
fn bytes_now(meter: &MemoryMeter) -> u64 {
    meter.current_bytes().max(0) as u64
}

/// Raises the step's abort flag unless disarmed (on an error or a panic), so that the other
/// workers stop waiting for this one.
struct AbortOnFailure(Arc<AtomicBool>);

impl Drop for AbortOnFailure {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl Worker<'_> {
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
        let mut params = self.weights.clone();
        let mut grads = params.zeros_like();
        let range = shard_range(params.numel(), self.plan.dp, self.device.rank);
        let mut optimizer = ShardedAdamW::new(self.adamw, &params, range);
        let model_state = meter.map(|m| m.current_bytes().max(0) as u64);
        self.collectives
            .start
            .all_gather(self.plan.device_index(self.device), 0, ())
            .map_err(|_| self.aborted())?;
        if let Some(meter) = meter {
            meter.reset_peak();
        }
        let started_s = self.epoch.elapsed().as_secs_f64();
        let started_cpu_s = profile::thread_cpu_s();
        profile::take();
        let mut states: BTreeMap<usize, StageState> = BTreeMap::new();
        let mut loss = 0.0;
        let mut tasks = Vec::with_capacity(self.order.len());
        let mut peak = meter.map_or(0, bytes_now);
        for &pack in self.order {
            let before = meter.map(|m| {
                m.reset_peak();
                bytes_now(m)
            });
            let mut record = self.run_task(pack, &params, &mut grads, &mut states, &mut loss)?;
            if let (Some(meter), Some(before_bytes)) = (meter, before) {
                let memory = TaskMemory {
                    before_bytes,
                    after_bytes: bytes_now(meter),
                    peak_bytes: meter.peak_bytes().max(0) as u64,
                };
                peak = peak.max(memory.peak_bytes);
                record.memory = Some(memory);
            }
            tasks.push(record);
        }
        if let Some(state) = states.values().find(|s| !s.is_drained()) {
            return Err(CpuError::Schedule {
                message: format!(
                    "device (rank {}, stage {}) still holds {:?} at the end of the step",
                    self.device.rank,
                    self.device.stage,
                    state.live_bytes()
                ),
            });
        }
        drop(states);
        let mut sync_times = SyncTimes::default();
        let sync = Sync {
            collectives: self.collectives,
            device: self.device,
            dp: self.plan.dp,
            pp: self.plan.pp(),
        };
        if let Some(meter) = meter {
            meter.reset_peak();
        }
        let grad_shard = sync.run(&mut params, grads, &mut optimizer, &mut sync_times)?;
        let finish_s = self.epoch.elapsed().as_secs_f64();
        let mut ops = OpTimes::default();
        for task in &tasks {
            ops += task.ops;
        }
        let report = WorkerReport {
            rank: self.device.rank,
            stage: self.device.stage,
            model_state_bytes: model_state,
            peak_memory_bytes: meter.map(|m| peak.max(m.peak_bytes().max(0) as u64)),
            finish_s,
            busy_s: tasks.iter().map(TaskRecord::run_s).sum(),
            cpu_s: profile::thread_cpu_s() - started_cpu_s,
            ops,
            sync: sync_times,
        };
        Ok(Outcome {
            loss,
            tasks,
            report,
            started_s,
            grad_shard,
            params,
        })
    }

    /// Runs one pack on this device and times it.
    fn run_task(
        &mut self,
        pack: usize,
        params: &Params,
        grads: &mut Grads,
        states: &mut BTreeMap<usize, StageState>,
        loss: &mut f64,
    ) -> Result<TaskRecord> {
        let info = &self.plan.packs[pack];
        let (stage, last) = (self.device.stage, self.device.stage + 1 == self.plan.pp());
        let tag = Tag {
            pack,
            direction: info.direction,
        };
        let start_s = self.epoch.elapsed().as_secs_f64();
        let (needs_input, next) = match info.direction {
            Direction::Forward => (stage > 0, (!last).then(|| stage + 1)),
            Direction::Backward => (!last, stage.checked_sub(1)),
        };
        let input = match needs_input {
            true => self.inbox.receive(tag)?,
            false => Vec::new(),
        };
        let wait_s = self.epoch.elapsed().as_secs_f64() - start_s;
        let cpu_start = profile::thread_cpu_s();
        profile::take();
        let state = match states.entry(info.replica) {
            std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::btree_map::Entry::Vacant(entry) => {
                let exchange: Box<dyn KvExchange> = match self.exchanges.remove(&info.replica) {
                    Some(exchange) => Box::new(exchange),
                    None => Box::new(LocalExchange),
                };
                let stage = self.plan.stages[stage];
                entry.insert(StageState::with_exchange(&self.config, stage, exchange))
            }
        };
        let output = match info.direction {
            Direction::Forward => {
                let output = state.forward_padded_pack(
                    params,
                    self.batch,
                    &info.slices,
                    info.padding,
                    &input,
                )?;
                *loss += output.loss;
                output.hidden
            }
            Direction::Backward => {
                let slices = &info.slices;
                state.backward_padded_pack(
                    params,
                    grads,
                    self.batch,
                    slices,
                    info.padding,
                    &input,
                )?
            }
        };
        drop(input);
        if let Some(next) = next {
            let to = self.plan.device_index(Device {
                rank: self.device.rank,
                stage: next,
            });
            self.outboxes.send(to, tag, output)?;
        }
        let ops = profile::take();
        let cpu_s = profile::thread_cpu_s() - cpu_start;
        Ok(TaskRecord {
            pack,
            name: info.name.clone(),
            direction: info.direction,
            replica: info.replica,
            rank: self.device.rank,
            stage,
            start_s,
            end_s: self.epoch.elapsed().as_secs_f64(),
            wait_s,
            cpu_s,
            ops,
            memory: None,
        })
    }

    fn aborted(&self) -> CpuError {
        CpuError::WorkerFailed {
            worker: format!("rank {}, stage {}", self.device.rank, self.device.stage),
            message: "another worker stopped before the step started".to_string(),
        }
    }
}
