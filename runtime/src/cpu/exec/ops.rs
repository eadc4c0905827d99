//! [`DeviceRun`]: one worker's run of its program — the C ABI handler of its thread.
//!
//! Every call the driver makes is first checked against the worker's next op (a driver of
//! another program fails the step instead of running something else), then executed:
//! - `recv p`: wait for `p`'s activations (forward) or output gradients (backward) in the inbox
//!   (from the same DP rank's previous or next stage);
//! - `cp-exchange p`: join `p`'s DP-Merge group for its next compute op; the K/V (and dK/dV)
//!   exchange itself runs inside that op's attention, through the group's
//!   [`ThreadExchange`](crate::cpu::ThreadExchange), as the kernels overlap it;
//! - `fwd p` / `bwd p`: run the pack on the stage (a group member runs its share of the tokens),
//!   slices with K/V carried across slices, on the state of the pack's replica;
//! - `send p`: post the compute op's output to the neighbour's inbox;
//! - `reduce-scatter`, `optimizer`, `all-gather`: the step's end ([`super::sync`]), in this
//!   order, after every pack.
//!
//! The ops of one pack in a row (`recv`, `cp-exchange`, compute, `send`) form one pack task,
//! timed and metered as a whole as the simulator's task is ([`TaskRecord`]).

use std::any::Any;
use std::collections::BTreeMap;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

use slimpack_ir::program::{Op, Worker as ProgramWorker};
use slimpack_ir::step::{Direction, Part};

use crate::abi::Call;
use crate::cpu::adamw::ShardedAdamW;
use crate::cpu::counting_alloc::MemoryMeter;
use crate::cpu::cp::{KvExchange, LocalExchange};
use crate::cpu::error::{CpuError, Result};
use crate::cpu::params::{Grads, Params};
use crate::cpu::profile::{self, OpTimes};
use crate::cpu::stage_state::StageState;
use crate::cpu::weight_grad::DeferredWeightGrads;

use super::cursor::{direction_keyword, neighbour, ProgramCursor};
use super::mailbox::{Tag, Tensors};
use super::plan::Device;
use super::result::{SyncTimes, TaskMemory, TaskRecord, WorkerReport};
use super::sync::{shard_range, Sync};
use super::worker::{Outcome, WorkerThread};

/// A meter's bytes now (never negative: blocks freed by others are taken off their meters).
fn bytes_now(meter: &MemoryMeter) -> u64 {
    meter.current_bytes().max(0) as u64
}

/// Why a worker stopped early.
enum Failure {
    Error(CpuError),
    /// A panic in an op (a bug), resumed once the driver has returned: it cannot unwind
    /// through the C ABI.
    Panic(Box<dyn Any + Send>),
}

/// The pack task in progress: its first op's time and the worker's state then.
struct OpenTask {
    /// The task ([`super::Plan::task_of`]).
    pack: usize,
    start_s: f64,
    wait_s: f64,
    cpu_start_s: f64,
    before_bytes: Option<u64>,
}

/// A worker's state while its program runs.
pub(super) struct DeviceRun<'w, 'a> {
    worker: &'w mut WorkerThread<'a>,
    meter: Option<&'w MemoryMeter>,
    params: Params,
    /// The stage's gradients until `reduce-scatter` takes them.
    grads: Option<Grads>,
    optimizer: ShardedAdamW,
    /// This rank's shard of the summed gradients, after `reduce-scatter`.
    shard: Option<Vec<f32>>,
    /// Where the worker is in its ops.
    cursor: ProgramCursor<'a>,
    /// Per replica, the stage's state for its packs (saved activations, K/V).
    states: BTreeMap<usize, StageState>,
    loss: f64,
    /// A received tensor its compute op has not taken yet.
    input: Option<(Tag, Tensors)>,
    /// A computed tensor not sent yet.
    output: Option<(Tag, Tensors)>,
    /// The pack whose DP-Merge group the last `cp-exchange` joined.
    joined: Option<Tag>,
    /// Split backwards whose weight gradient has not run yet, by pack.
    deferred_weight_grads: BTreeMap<usize, DeferredWeightGrads>,
    task: Option<OpenTask>,
    tasks: Vec<TaskRecord>,
    trace: Vec<Call>,
    failure: Option<Failure>,
    sync_times: SyncTimes,
    model_state_bytes: Option<u64>,
    peak_bytes: u64,
    started_s: f64,
    started_cpu_s: f64,
}

fn schedule_error(message: String) -> CpuError {
    CpuError::Schedule { message }
}

impl<'w, 'a> DeviceRun<'w, 'a> {
    pub fn new(
        worker: &'w mut WorkerThread<'a>,
        meter: Option<&'w MemoryMeter>,
    ) -> DeviceRun<'w, 'a> {
        let params = worker.weights.clone();
        let grads = params.zeros_like();
        let range = shard_range(params.numel(), worker.plan.dp, worker.device.rank);
        let optimizer = ShardedAdamW::new(worker.adamw, &params, range);
        let trace = Vec::with_capacity(worker.ops.len());
        let cursor = ProgramCursor::new(worker.ops, worker.device);
        DeviceRun {
            worker,
            meter,
            params,
            grads: Some(grads),
            optimizer,
            shard: None,
            cursor,
            states: BTreeMap::new(),
            loss: 0.0,
            input: None,
            output: None,
            joined: None,
            deferred_weight_grads: BTreeMap::new(),
            task: None,
            tasks: Vec::new(),
            trace,
            failure: None,
            sync_times: SyncTimes::default(),
            model_state_bytes: None,
            peak_bytes: 0,
            started_s: 0.0,
            started_cpu_s: 0.0,
        }
    }

    /// Waits for every worker to be ready and starts the step's clocks and meters.
    pub fn start(&mut self) -> Result<()> {
        self.model_state_bytes = self.meter.map(bytes_now);
        let index = self.worker.plan.device_index(self.worker.device);
        self.worker
            .collectives
            .start
            .all_gather(index, 0, ())
            .map_err(|_| self.worker.aborted())?;
        if let Some(meter) = self.meter {
            meter.reset_peak();
        }
        self.started_s = self.worker.epoch.elapsed().as_secs_f64();
        self.started_cpu_s = profile::thread_cpu_s();
        profile::take();
        self.peak_bytes = self.meter.map_or(0, bytes_now);
        Ok(())
    }

    /// The C ABI handler: runs the op `call` stands for, or records why it cannot. After a
    /// failure the driver's remaining calls are skipped (the step is abandoned).
    pub fn handle(&mut self, call: Call) {
        if self.failure.is_some() {
            return;
        }
        let failure = match catch_unwind(AssertUnwindSafe(|| self.run_call(&call))) {
            Ok(Ok(())) => {
                self.trace.push(call);
                return;
            }
            Ok(Err(error)) => Failure::Error(error),
            Err(panic) => Failure::Panic(panic),
        };
        self.worker.abort.store(true, Ordering::Relaxed);
        self.failure = Some(failure);
    }

    fn run_call(&mut self, call: &Call) -> Result<()> {
        let op = self.cursor.advance(call).map_err(schedule_error)?;
        // A task is the run of ops on one pack; a deferred weight gradient is one of its own.
        let task = self.worker.plan.task_of(op);
        if task != self.task.as_ref().map(|t| t.pack) {
            self.close_task();
            if let Some(task) = task {
                self.open_task(task);
            }
        }
        match *op {
            Op::Recv {
                pack,
                direction,
                from,
                ..
            } => self.recv(pack as usize, direction, from),
            Op::CpExchange {
                pack,
                direction,
                ref group,
                ..
            } => self.cp_exchange(pack as usize, direction, group),
            Op::Forward { pack, .. } => {
                self.compute(pack as usize, Direction::Forward, Part::Whole)
            }
            Op::Backward {
                pack,
                part: Part::WeightGrad,
                ..
            } => self.weight_grad(pack as usize),
            Op::Backward { pack, part, .. } => {
                self.compute(pack as usize, Direction::Backward, part)
            }
            Op::Send {
                pack,
                direction,
                to,
                ..
            } => self.send(pack as usize, direction, to),
            Op::ReduceScatter => self.reduce_scatter(),
            Op::Optimizer => self.optimizer(),
            Op::AllGather => self.all_gather(),
        }
    }

    /// The worker a pack's tensor comes from (`incoming`) or goes to: the same DP rank's
    /// previous or next stage, by direction.
    fn neighbour(&self, direction: Direction, incoming: bool) -> Option<ProgramWorker> {
        neighbour(
            self.worker.device,
            self.worker.plan.pp(),
            direction,
            incoming,
        )
    }

    fn pack_name(&self, pack: usize) -> &str {
        &self.worker.plan.packs[pack].name
    }

    fn recv(&mut self, pack: usize, direction: Direction, from: ProgramWorker) -> Result<()> {
        let plan = self.worker.plan;
        if let Some(why) = plan.recv_error(self.worker.device, pack, direction, from) {
            return Err(schedule_error(why));
        }
        if let Some((unused, _)) = &self.input {
            return Err(schedule_error(format!(
                "receives {} while {}'s input is unused",
                self.pack_name(pack),
                self.pack_name(unused.pack)
            )));
        }
        let tag = Tag { pack, direction };
        let clock = self.worker.epoch.elapsed().as_secs_f64();
        let tensors = self.worker.inbox.receive(tag)?;
        let waited = self.worker.epoch.elapsed().as_secs_f64() - clock;
        if let Some(task) = &mut self.task {
            task.wait_s += waited;
        }
        self.input = Some((tag, tensors));
        Ok(())
    }

    fn cp_exchange(&mut self, pack: usize, direction: Direction, group: &[u32]) -> Result<()> {
        if let Some(why) = self.worker.plan.cp_exchange_error(pack, group) {
            return Err(schedule_error(why));
        }
        self.joined = Some(Tag { pack, direction });
        Ok(())
    }

    /// Runs `part` of `pack`'s work in `direction`: a forward, a whole backward, or a split
    /// backward's input gradient, whose weight-gradient GEMMs it keeps for
    /// [`Self::weight_grad`].
    fn compute(&mut self, pack: usize, direction: Direction, part: Part) -> Result<()> {
        let worker = &mut *self.worker;
        let plan = worker.plan;
        let info = &plan.packs[pack];
        let tag = Tag { pack, direction };
        let merged = plan.replicas[info.replica].len() > 1;
        if self.joined.take() != merged.then_some(tag) {
            return Err(schedule_error(format!(
                "{} runs {} without (or apart from) its DP-Merge group's cp-exchange",
                direction_keyword(direction),
                info.name
            )));
        }
        let input = match self.neighbour_exists(direction, true) {
            false => Vec::new(),
            true => match self.input.take() {
                Some((got, tensors)) if got == tag => tensors,
                _ => {
                    return Err(schedule_error(format!(
                        "{} {} before receiving its input",
                        direction_keyword(direction),
                        info.name
                    )))
                }
            },
        };
        let worker = &mut *self.worker;
        let state = match self.states.entry(info.replica) {
            std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::btree_map::Entry::Vacant(entry) => {
                let exchange: Box<dyn KvExchange> = match worker.exchanges.remove(&info.replica) {
                    Some(exchange) => Box::new(exchange),
                    None => Box::new(LocalExchange),
                };
                let stage = plan.stages[worker.device.stage];
                entry.insert(StageState::with_exchange(&worker.config, stage, exchange))
            }
        };
        let output = match direction {
            Direction::Forward => {
                let output = state.forward_padded_pack(
                    &self.params,
                    worker.batch,
                    &info.slices,
                    info.padding,
                    &input,
                )?;
                self.loss += output.loss;
                output.hidden
            }
            Direction::Backward => {
                let grads = self.grads.as_mut().ok_or_else(|| {
                    schedule_error(format!(
                        "bwd {} after the gradients were reduce-scattered",
                        info.name
                    ))
                })?;
                let (params, batch) = (&self.params, worker.batch);
                match part {
                    Part::InputGrad => {
                        let (output, kept) = state.backward_input_padded_pack(
                            params,
                            grads,
                            batch,
                            &info.slices,
                            info.padding,
                            &input,
                        )?;
                        self.deferred_weight_grads.insert(pack, kept);
                        output
                    }
                    _ => state.backward_padded_pack(
                        params,
                        grads,
                        batch,
                        &info.slices,
                        info.padding,
                        &input,
                    )?,
                }
            }
        };
        drop(input);
        if self.neighbour_exists(direction, false) {
            if let Some((unsent, _)) = &self.output {
                return Err(schedule_error(format!(
                    "{} computed while {}'s output is unsent",
                    info.name,
                    self.pack_name(unsent.pack)
                )));
            }
            self.output = Some((tag, output));
        }
        Ok(())
    }

    fn neighbour_exists(&self, direction: Direction, incoming: bool) -> bool {
        self.neighbour(direction, incoming).is_some()
    }

    fn send(&mut self, pack: usize, direction: Direction, to: ProgramWorker) -> Result<()> {
        let tag = Tag { pack, direction };
        if self.neighbour(direction, false) != Some(to) {
            return Err(schedule_error(format!(
                "{} cannot go to dp={} pp={}",
                self.pack_name(pack),
                to.dp,
                to.pp
            )));
        }
        match self.output.take() {
            Some((computed, tensors)) if computed == tag => {
                let to = self.worker.plan.device_index(Device {
                    rank: to.dp as usize,
                    stage: to.pp as usize,
                });
                self.worker.outboxes.send(to, tag, tensors)
            }
            other => {
                self.output = other;
                Err(schedule_error(format!(
                    "sends {} before computing it",
                    self.pack_name(pack)
                )))
            }
        }
    }

    fn sync(&self) -> Sync<'a> {
        Sync {
            collectives: self.worker.collectives,
            device: self.worker.device,
            dp: self.worker.plan.dp,
            pp: self.worker.plan.pp(),
        }
    }

    /// Fails unless the collective op `keyword` comes `position`-th among the three.
    fn collective_in_order(&mut self, position: usize, keyword: &str) -> Result<()> {
        self.cursor
            .collective_in_order(position, keyword)
            .map_err(schedule_error)
    }

    /// Runs the weight-gradient GEMMs the input gradient of `pack` kept (a zero-bubble
    /// schedule's `bwd %bN.dw`).
    fn weight_grad(&mut self, pack: usize) -> Result<()> {
        let kept = self.deferred_weight_grads.remove(&pack).ok_or_else(|| {
            schedule_error(format!(
                "bwd {}.dw before (or without) its input gradient",
                self.pack_name(pack)
            ))
        })?;
        let grads = self.grads.as_mut().ok_or_else(|| {
            schedule_error(format!(
                "bwd {}.dw after the gradients were reduce-scattered",
                self.worker.plan.packs[pack].name
            ))
        })?;
        kept.add_into(grads);
        Ok(())
    }

    fn reduce_scatter(&mut self) -> Result<()> {
        self.collective_in_order(0, "reduce-scatter")?;
        self.check_drained()?;
        self.states.clear();
        if let Some(meter) = self.meter {
            meter.reset_peak();
        }
        let grads = self
            .grads
            .take()
            .expect("gradients until the reduce-scatter");
        let range = self.optimizer.range();
        let sync = self.sync();
        self.shard = Some(sync.reduce_scatter_op(grads, range, &mut self.sync_times)?);
        Ok(())
    }

    fn optimizer(&mut self) -> Result<()> {
        self.collective_in_order(1, "optimizer")?;
        let shard = self
            .shard
            .as_deref()
            .expect("a shard after the reduce-scatter");
        let sync = self.sync();
        sync.optimizer_op(
            &mut self.params,
            &mut self.optimizer,
            shard,
            &mut self.sync_times,
        )
    }

    fn all_gather(&mut self) -> Result<()> {
        self.collective_in_order(2, "all-gather")?;
        let sync = self.sync();
        sync.all_gather_op(&mut self.params, &mut self.sync_times)
    }

    /// Fails if a pack's tensors or state are still held (before the step's end).
    fn check_drained(&self) -> Result<()> {
        if let Some((tag, _)) = &self.input {
            return Err(schedule_error(format!(
                "{}'s input is never used",
                self.pack_name(tag.pack)
            )));
        }
        if let Some((tag, _)) = &self.output {
            return Err(schedule_error(format!(
                "{}'s output is never sent",
                self.pack_name(tag.pack)
            )));
        }
        if let Some(tag) = &self.joined {
            return Err(schedule_error(format!(
                "cp-exchange of {} without its compute op",
                self.pack_name(tag.pack)
            )));
        }
        if let Some(&pack) = self.deferred_weight_grads.keys().next() {
            return Err(schedule_error(format!(
                "the weight gradient of {} never runs",
                self.pack_name(pack)
            )));
        }
        if let Some(state) = self.states.values().find(|s| !s.is_drained()) {
            return Err(schedule_error(format!(
                "the device still holds {:?} at the end of the step",
                state.live_bytes()
            )));
        }
        Ok(())
    }

    fn open_task(&mut self, pack: usize) {
        let before_bytes = self.meter.map(|meter| {
            meter.reset_peak();
            bytes_now(meter)
        });
        profile::take();
        self.task = Some(OpenTask {
            pack,
            start_s: self.worker.epoch.elapsed().as_secs_f64(),
            wait_s: 0.0,
            cpu_start_s: profile::thread_cpu_s(),
            before_bytes,
        });
    }

    fn close_task(&mut self) {
        let Some(task) = self.task.take() else {
            return;
        };
        let memory = match (self.meter, task.before_bytes) {
            (Some(meter), Some(before_bytes)) => {
                let memory = TaskMemory {
                    before_bytes,
                    after_bytes: bytes_now(meter),
                    peak_bytes: meter.peak_bytes().max(0) as u64,
                };
                self.peak_bytes = self.peak_bytes.max(memory.peak_bytes);
                Some(memory)
            }
            _ => None,
        };
        let plan = self.worker.plan;
        let info = plan.task_pack(task.pack);
        self.tasks.push(TaskRecord {
            pack: task.pack % plan.packs.len(),
            weight_grad: task.pack >= plan.packs.len(),
            name: info.name.clone(),
            direction: info.direction,
            replica: info.replica,
            rank: self.worker.device.rank,
            stage: self.worker.device.stage,
            start_s: task.start_s,
            end_s: self.worker.epoch.elapsed().as_secs_f64(),
            wait_s: task.wait_s,
            cpu_s: profile::thread_cpu_s() - task.cpu_start_s,
            ops: profile::take(),
            memory,
        });
    }

    /// Ends the run once the driver returned: the worker's outcome, or why it failed.
    pub fn finish(mut self) -> Result<Outcome> {
        self.close_task();
        match self.failure.take() {
            Some(Failure::Error(error)) => return Err(error),
            Some(Failure::Panic(panic)) => resume_unwind(panic),
            None => {}
        }
        self.cursor.finish().map_err(schedule_error)?;
        let finish_s = self.worker.epoch.elapsed().as_secs_f64();
        let mut ops = OpTimes::default();
        for task in &self.tasks {
            ops += task.ops;
        }
        let peak = self
            .meter
            .map(|m| self.peak_bytes.max(m.peak_bytes().max(0) as u64));
        let report = WorkerReport {
            rank: self.worker.device.rank,
            stage: self.worker.device.stage,
            model_state_bytes: self.model_state_bytes,
            peak_memory_bytes: peak,
            finish_s,
            busy_s: self.tasks.iter().map(TaskRecord::run_s).sum(),
            cpu_s: profile::thread_cpu_s() - self.started_cpu_s,
            ops,
            sync: self.sync_times,
        };
        Ok(Outcome {
            loss: self.loss,
            tasks: self.tasks,
            trace: self.trace,
            report,
            started_s: self.started_s,
            grad_shard: self.shard.expect("a shard after the reduce-scatter"),
            params: self.params,
        })
    }
}
