//! The CUDA executor: runs a scheduled step's lowered program with one worker per GPU, the
//! CPU executor's structure on device memory.
//!
//! [`execute_program`] checks what the CPU executor checks (whole-model weights, the batch
//! against the plan, the program against the plan), finds the GPUs, makes each worker's context, compute
//! stream and NCCL links, and starts one thread per worker. A worker's thread uploads its
//! stage's weights, allocates its gradients and its shard's AdamW moments, waits for every
//! worker to be ready, then lets the [`Driver`] call its ops through the C ABI; the handler
//! ([`GpuRun`]) checks each call with the shared [`ProgramCursor`] and runs it on the GPU:
//! - `recv`/`send`: the pack's `[rows, hidden]` tensor over NCCL from/to the same DP rank's
//!   neighbouring stage;
//! - `fwd`/`bwd`: [`DeviceStage::forward`]/[`DeviceStage::backward`] on the state of the
//!   pack's replica;
//! - `reduce-scatter`: the tied embedding's sum between the pipeline's ends, then the
//!   gradients summed over the stage's DP ranks, of which the rank keeps its shard (ZeRO-1, the
//!   CPU backend's flat shard ranges);
//! - `optimizer`: AdamW on the shard (device kernel, the CPU's formula);
//! - `all-gather`: every rank's updated shard broadcast to the stage's other ranks.
//!
//! Measured as on the CPU: every pack task's wall time (the stream is synchronised at the
//! task's end, so a task's time is its GPU time plus launch overhead; the split by op class is
//! not measured on the GPU and reads 0), every worker's peak device memory (its meter), the
//! step time from the moment all workers are ready to the last one's end, and the trace of the
//! ops each worker executed. The outcomes are joined by the CPU executor's own assembly.

use std::any::Any;
use std::collections::BTreeMap;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaStream};

use slimpack_ir::program::{Op, Program, Worker as ProgramWorker};
use slimpack_ir::step::Direction;

use crate::abi::{self, Call};
use crate::cpu::exec::{
    assemble, collect_outcomes, direction_keyword, neighbour, shard_range, Device, Driver,
    Execution, Outcome, Plan, ProgramCursor, SyncTimes, TaskRecord, WorkerReport,
};
use crate::cpu::pack_layout::PackLayout;
use crate::cpu::profile::OpTimes;
use crate::cpu::{
    AdamWConfig, CpShard, CpuError, LayerRange, ModelConfig, Params, Rendezvous, StepRates,
    TensorKind, TokenBatch,
};

use super::device::{context, gpus, require_cublas, require_nccl, Gpu};
use super::error::{CudaError, Result};
use super::memory::DeviceVec;
use super::nccl::{check_fifo, links, Links};
use super::stage::{DeviceStage, RopeTables};
use super::tensors::{DeviceTensors, Layout};
use super::{KernelSource, Precision};

/// Runs one training step of `plan` as `program` on this machine's GPUs (one per worker), each
/// worker's ops driven by `driver`, from the whole-model weights `params`, and updates the
/// weights with AdamW (`adamw`), its GEMMs in `precision`.
#[allow(clippy::too_many_arguments)]
pub fn execute_program(
    plan: &Plan,
    program: &Program,
    driver: &Driver,
    batch: &TokenBatch,
    params: &Params,
    adamw: AdamWConfig,
    kernels: &KernelSource,
    precision: Precision,
) -> Result<Execution> {
    let config = *params.config();
    check_inputs(plan, program, batch, params)?;
    kernels.check()?;
    let found = gpus()?;
    let devices = plan.devices();
    if devices.len() > found.len() {
        return Err(CudaError::TooFewDevices {
            needed: devices.len(),
            found: found.len(),
            hint: match found.len() {
                1 => "with one GPU only single-device steps run (--parallel tp=1,pp=1,dp=1)",
                _ => "give a --parallel layout with at most that many DP ranks x stages",
            },
        });
    }
    for gpu in &found[..devices.len()] {
        precision.check_supported(gpu)?;
    }
    require_cublas()?;
    if devices.len() > 1 {
        require_nccl()?;
        check_fifo(plan, program)?;
    }
    let weights = params.split(&plan.stages)?;
    let mut contexts = Vec::with_capacity(devices.len());
    let mut compute = Vec::with_capacity(devices.len());
    let mut messages = Vec::with_capacity(devices.len());
    for (ordinal, _) in devices.iter().enumerate() {
        let context = context(ordinal)?;
        compute.push(context.new_stream()?);
        messages.push((context.new_stream()?, context.new_stream()?));
        contexts.push(context);
    }
    let tied_split = config.tied_embeddings && plan.pp() > 1;
    let abort = Arc::new(AtomicBool::new(false));
    let mut worker_links = links(plan, tied_split, &compute, &messages, &abort)?;
    let max_len = plan.sample_lens.iter().copied().max().unwrap_or(0);
    let ready = Rendezvous::new(devices.len(), Arc::clone(&abort));
    let epoch = Instant::now();
    let outcomes: Vec<std::thread::Result<Result<Outcome>>> = std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(devices.len());
        for (index, &device) in devices.iter().enumerate() {
            let worker = GpuWorker {
                device,
                index: plan.device_index(device),
                plan,
                program,
                driver,
                config,
                batch,
                weights: &weights[device.stage],
                adamw,
                kernels,
                precision,
                context: Arc::clone(&contexts[index]),
                stream: Arc::clone(&compute[index]),
                links: std::mem::take(&mut worker_links[index]),
                max_len,
                ready: &ready,
                epoch,
                abort: Arc::clone(&abort),
            };
            let thread = std::thread::Builder::new()
                .name(format!(
                    "gpu{index}-rank{}-stage{}",
                    device.rank, device.stage
                ))
                .spawn_scoped(scope, move || worker.run())
                .expect("the OS can start a worker thread");
            handles.push(thread);
        }
        handles.into_iter().map(|h| h.join()).collect()
    });
    let is_abort = |error: &CudaError| matches!(error, CudaError::WorkerFailed { worker, .. } if worker == "peer");
    let outcomes = collect_outcomes(&devices, outcomes, is_abort, |worker, message| {
        CudaError::WorkerFailed { worker, message }
    })?;
    Ok(assemble(plan, &config, outcomes)?)
}

/// The CPU executor's checks of its inputs.
fn check_inputs(plan: &Plan, program: &Program, batch: &TokenBatch, params: &Params) -> Result<()> {
    let config = *params.config();
    if params.stage() != LayerRange::whole(&config) {
        return Err(CpuError::StageMismatch {
            expected: LayerRange::whole(&config),
            got: params.stage(),
        }
        .into());
    }
    let lens: Vec<usize> = batch.sample_ids().map(|s| batch.tokens(s).len()).collect();
    if lens != plan.sample_lens {
        return Err(CpuError::Schedule {
            message: format!(
                "the batch has {} samples of other lengths than the step's {}",
                lens.len(),
                plan.sample_lens.len()
            ),
        }
        .into());
    }
    plan.check_program(program)?;
    // The CUDA stage runs whole backwards (the CPU executor also splits them).
    let split = program.workers.iter().flat_map(|w| &w.ops).any(
        |op| matches!(op, slimpack_ir::program::Op::Backward { part, .. } if !part.is_whole()),
    );
    if split {
        return Err(CudaError::Unsupported {
            what: "split backwards (a zero-bubble schedule: compile it without zb, or run it on \
                   the CPU backend)"
                .to_string(),
        });
    }
    Ok(())
}

/// Everything a worker thread starts with.
struct GpuWorker<'a> {
    device: Device,
    index: usize,
    plan: &'a Plan,
    program: &'a Program,
    driver: &'a Driver,
    config: ModelConfig,
    batch: &'a TokenBatch,
    weights: &'a Params,
    adamw: AdamWConfig,
    kernels: &'a KernelSource,
    precision: Precision,
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    links: Links,
    max_len: usize,
    ready: &'a Rendezvous<()>,
    epoch: Instant,
    abort: Arc<AtomicBool>,
}

impl GpuWorker<'_> {
    fn run(mut self) -> Result<Outcome> {
        let links = std::mem::take(&mut self.links);
        let result = self.run_with(links);
        if result.is_err() {
            self.abort.store(true, Ordering::Relaxed);
        }
        result
    }

    fn run_with(&self, links: Links) -> Result<Outcome> {
        self.context.bind_to_thread()?;
        let mut gpu = Gpu::new(
            Arc::clone(&self.context),
            Arc::clone(&self.stream),
            self.kernels,
        )?;
        gpu.precision = self.precision;
        let rope = RopeTables::new(&gpu, &self.config, self.max_len)?;
        let layout = Layout::of(self.weights);
        let params = DeviceTensors::upload(&gpu, self.weights)?;
        let grads = DeviceTensors::zeros(&gpu, &layout)?;
        let shard = shard_range(layout.numel, self.plan.dp, self.device.rank);
        let moments = (gpu.zeros(shard.len())?, gpu.zeros(shard.len())?);
        gpu.synchronize()?;
        let model_state_bytes = gpu.meter.current_bytes();
        if self.ready.all_gather(self.index, 0, ()).is_err() {
            return Err(CudaError::aborted());
        }
        gpu.meter.reset_peak();
        let mut run = GpuRun {
            worker: self,
            gpu: &gpu,
            rope: &rope,
            layout: &layout,
            params,
            grads,
            moments,
            shard,
            links,
            cursor: ProgramCursor::new(&self.program.workers[self.index].ops, self.device),
            states: BTreeMap::new(),
            loss: 0.0,
            input: None,
            output: None,
            joined: None,
            task: None,
            tasks: Vec::new(),
            trace: Vec::new(),
            failure: None,
            sync_times: SyncTimes::default(),
            grad_shard: Vec::new(),
            model_state_bytes,
            peak_bytes: model_state_bytes,
            started_s: self.epoch.elapsed().as_secs_f64(),
        };
        abi::with_handler(&mut |call| run.handle(call), || {
            self.driver.run_device(self.program, self.index)
        });
        run.finish()
    }
}

/// The tensor a pack's `recv` brought or its compute op made, not yet used or sent.
struct Pending {
    pack: usize,
    direction: Direction,
    tensor: Option<DeviceVec>,
}

/// A pack task in progress.
struct OpenTask {
    pack: usize,
    start_s: f64,
    wait_s: f64,
    before_bytes: u64,
}

/// Why a worker stopped early.
enum Failure {
    Error(CudaError),
    Panic(Box<dyn Any + Send>),
}

/// A worker's state while its program runs: the C ABI handler of its thread.
struct GpuRun<'w, 'a> {
    /// First, so that it drops first: aborting the NCCL communicators releases any collective
    /// a failed step left pending before the buffers it uses are freed.
    links: Links,
    worker: &'w GpuWorker<'a>,
    gpu: &'w Gpu,
    rope: &'w RopeTables,
    layout: &'w Layout,
    params: DeviceTensors,
    grads: DeviceTensors,
    /// AdamW's first and second moments of this rank's shard.
    moments: (DeviceVec, DeviceVec),
    shard: std::ops::Range<usize>,
    cursor: ProgramCursor<'a>,
    states: BTreeMap<usize, DeviceStage>,
    loss: f64,
    input: Option<Pending>,
    output: Option<Pending>,
    /// The pack and direction whose DP-Merge group's `cp-exchange` this worker joined, until
    /// its compute op runs.
    joined: Option<(usize, Direction)>,
    task: Option<OpenTask>,
    tasks: Vec<TaskRecord>,
    trace: Vec<Call>,
    failure: Option<Failure>,
    sync_times: SyncTimes,
    grad_shard: Vec<f32>,
    model_state_bytes: u64,
    peak_bytes: u64,
    started_s: f64,
}

fn schedule_error(message: String) -> CudaError {
    CudaError::Cpu(CpuError::Schedule { message })
}

impl GpuRun<'_, '_> {
    fn handle(&mut self, call: Call) {
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
        if self.worker.abort.load(Ordering::Relaxed) {
            return Err(CudaError::aborted());
        }
        let op = self.cursor.advance(call).map_err(schedule_error)?;
        let pack = op.pack().map(|p| p as usize);
        if pack != self.task.as_ref().map(|t| t.pack) {
            self.close_task()?;
            if let Some(pack) = pack {
                self.open_task(pack);
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
            Op::Forward { pack, .. } => self.compute(pack as usize, Direction::Forward),
            Op::Backward { pack, .. } => self.compute(pack as usize, Direction::Backward),
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

    fn index_of(&self, worker: ProgramWorker) -> usize {
        self.worker.plan.device_index(Device {
            rank: worker.dp as usize,
            stage: worker.pp as usize,
        })
    }

    /// This worker's share of the slices of `replica`'s packs: its place in the replica's
    /// DP-Merge group (the whole of each slice outside one).
    fn shard(&self, replica: usize) -> CpShard {
        let ranks = &self.worker.plan.replicas[replica];
        match ranks
            .iter()
            .position(|&rank| rank == self.worker.device.rank)
        {
            Some(rank) if ranks.len() > 1 => CpShard {
                rank,
                size: ranks.len(),
            },
            _ => CpShard::WHOLE,
        }
    }

    /// Values of a pack's `[rows, hidden]` message: this worker's rows of its slices, then of
    /// its padding.
    fn pack_values(&self, pack: usize) -> usize {
        let info = &self.worker.plan.packs[pack];
        let layout = PackLayout::new(&info.slices, self.shard(info.replica), info.padding);
        layout.rows() * self.worker.config.hidden
    }

    /// The CPU executor's `cp-exchange` rule: the op names the pack's replica's DP ranks (a
    /// group of two or more), and the worker's next compute op is that pack's, in that
    /// direction. The exchange itself happens inside the compute op, per slice and layer.
    fn cp_exchange(&mut self, pack: usize, direction: Direction, group: &[u32]) -> Result<()> {
        if let Some(why) = self.worker.plan.cp_exchange_error(pack, group) {
            return Err(schedule_error(why));
        }
        self.joined = Some((pack, direction));
        Ok(())
    }

    fn recv(&mut self, pack: usize, direction: Direction, from: ProgramWorker) -> Result<()> {
        let plan = self.worker.plan;
        if let Some(why) = plan.recv_error(self.worker.device, pack, direction, from) {
            return Err(schedule_error(why));
        }
        if let Some(unused) = &self.input {
            return Err(schedule_error(format!(
                "receives {} while {}'s input is unused",
                self.pack_name(pack),
                self.pack_name(unused.pack)
            )));
        }
        let clock = self.worker.epoch.elapsed().as_secs_f64();
        let tensor = self.links.recv(
            self.gpu,
            direction,
            self.index_of(from),
            self.pack_values(pack),
        )?;
        if let Some(task) = &mut self.task {
            task.wait_s += self.worker.epoch.elapsed().as_secs_f64() - clock;
        }
        self.input = Some(Pending {
            pack,
            direction,
            tensor: Some(tensor),
        });
        Ok(())
    }

    fn compute(&mut self, pack: usize, direction: Direction) -> Result<()> {
        let plan = self.worker.plan;
        let info = &plan.packs[pack];
        let merged = plan.replicas[info.replica].len() > 1;
        if self.joined.take() != merged.then_some((pack, direction)) {
            return Err(schedule_error(format!(
                "{} runs {} without (or apart from) its DP-Merge group's cp-exchange",
                direction_keyword(direction),
                info.name
            )));
        }
        let input = match self.neighbour(direction, true).is_some() {
            false => None,
            true => match self.input.take() {
                Some(got) if got.pack == pack && got.direction == direction => got.tensor,
                other => {
                    self.input = other;
                    return Err(schedule_error(format!(
                        "{} {} before receiving its input",
                        direction_keyword(direction),
                        info.name
                    )));
                }
            },
        };
        let config = self.worker.config;
        let stage_range = plan.stages[self.worker.device.stage];
        let layout = self.layout;
        let shard = self.shard(info.replica);
        let exchange = match merged {
            true => Some(self.links.cp_exchange(info.replica)?),
            false => None,
        };
        let state = self
            .states
            .entry(info.replica)
            .or_insert_with(|| DeviceStage::new(&config, stage_range, layout.clone(), shard));
        let output = match direction {
            Direction::Forward => {
                let output = state.forward(
                    self.gpu,
                    self.rope,
                    &self.params,
                    self.worker.batch,
                    &info.slices,
                    info.padding,
                    input,
                    exchange,
                )?;
                self.loss += output.loss;
                output.hidden
            }
            Direction::Backward => state.backward(
                self.gpu,
                self.rope,
                &self.params,
                &self.grads,
                self.worker.batch,
                &info.slices,
                info.padding,
                input,
                exchange,
            )?,
        };
        if self.neighbour(direction, false).is_some() {
            if let Some(unsent) = &self.output {
                return Err(schedule_error(format!(
                    "{} computed while {}'s output is unsent",
                    info.name,
                    self.pack_name(unsent.pack)
                )));
            }
            self.output = Some(Pending {
                pack,
                direction,
                tensor: output,
            });
        }
        Ok(())
    }

    fn send(&mut self, pack: usize, direction: Direction, to: ProgramWorker) -> Result<()> {
        if self.neighbour(direction, false) != Some(to) {
            return Err(schedule_error(format!(
                "{} cannot go to dp={} pp={}",
                self.pack_name(pack),
                to.dp,
                to.pp
            )));
        }
        match self.output.take() {
            Some(Pending {
                pack: computed,
                direction: computed_direction,
                tensor: Some(tensor),
            }) if computed == pack && computed_direction == direction => {
                let to = self.index_of(to);
                self.links.send(self.gpu, direction, to, tensor)
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

    fn check_drained(&self) -> Result<()> {
        if let Some(pending) = &self.input {
            return Err(schedule_error(format!(
                "{}'s input is never used",
                self.pack_name(pending.pack)
            )));
        }
        if let Some(pending) = &self.output {
            return Err(schedule_error(format!(
                "{}'s output is never sent",
                self.pack_name(pending.pack)
            )));
        }
        if self.states.values().any(|s| !s.is_drained()) {
            return Err(schedule_error(
                "the device still holds K/V or activations at the end of the step".to_string(),
            ));
        }
        Ok(())
    }

    fn reduce_scatter(&mut self) -> Result<()> {
        self.cursor
            .collective_in_order(0, "reduce-scatter")
            .map_err(schedule_error)?;
        self.check_drained()?;
        self.states.clear();
        self.links.flush()?;
        let clock = Instant::now();
        if let Some(range) = self.layout.tied_copy.clone() {
            self.links.sum_tied(&mut self.grads.data, range)?;
            self.links.wait(&self.gpu.stream)?;
        }
        self.sync_times.tied_embedding_s = clock.elapsed().as_secs_f64();
        let clock = Instant::now();
        let numel = self.layout.numel;
        self.links.sum_over_stage(&mut self.grads.data, 0..numel)?;
        self.links.wait(&self.gpu.stream)?;
        self.grad_shard = self.gpu.download(&self.grads.data, self.shard.clone())?;
        self.sync_times.grad_reduce_scatter_s = clock.elapsed().as_secs_f64();
        Ok(())
    }

    fn optimizer(&mut self) -> Result<()> {
        self.cursor
            .collective_in_order(1, "optimizer")
            .map_err(schedule_error)?;
        let clock = Instant::now();
        let adamw = self.worker.adamw;
        // A fresh optimizer per step, as the CPU executor's: this is its first update.
        let rates = StepRates::new(&adamw, 1);
        for (range, kind) in &self.layout.tensors {
            let (lo, hi) = (
                range.start.max(self.shard.start),
                range.end.min(self.shard.end),
            );
            if lo >= hi {
                continue;
            }
            let decay = match kind {
                TensorKind::Matrix => 1.0 - adamw.lr * adamw.weight_decay,
                TensorKind::NormGain => 1.0,
            };
            let moment = lo - self.shard.start;
            self.gpu.adamw(
                self.params.at(lo),
                self.grads.at(lo),
                self.moments.0.at(moment),
                self.moments.1.at(moment),
                hi - lo,
                decay,
                &adamw,
                &rates,
            )?;
        }
        self.gpu.synchronize()?;
        self.sync_times.optimizer_s = clock.elapsed().as_secs_f64();
        Ok(())
    }

    fn all_gather(&mut self) -> Result<()> {
        self.cursor
            .collective_in_order(2, "all-gather")
            .map_err(schedule_error)?;
        let clock = Instant::now();
        let (numel, dp) = (self.layout.numel, self.worker.plan.dp);
        for rank in 0..dp {
            self.links
                .broadcast(&mut self.params.data, shard_range(numel, dp, rank), rank)?;
        }
        self.links.wait(&self.gpu.stream)?;
        self.sync_times.param_all_gather_s = clock.elapsed().as_secs_f64();
        Ok(())
    }

    fn open_task(&mut self, pack: usize) {
        self.gpu.meter.reset_peak();
        self.task = Some(OpenTask {
            pack,
            start_s: self.worker.epoch.elapsed().as_secs_f64(),
            wait_s: 0.0,
            before_bytes: self.gpu.meter.current_bytes(),
        });
    }

    /// Ends the open task once the GPU has finished its work.
    fn close_task(&mut self) -> Result<()> {
        let Some(task) = self.task.take() else {
            return Ok(());
        };
        self.gpu.synchronize()?;
        let end_s = self.worker.epoch.elapsed().as_secs_f64();
        let memory = crate::cpu::exec::TaskMemory {
            before_bytes: task.before_bytes,
            after_bytes: self.gpu.meter.current_bytes(),
            peak_bytes: self.gpu.meter.peak_bytes(),
        };
        self.peak_bytes = self.peak_bytes.max(memory.peak_bytes);
        let info = &self.worker.plan.packs[task.pack];
        self.tasks.push(TaskRecord {
            pack: task.pack,
            // The CUDA stage refuses split backwards (`check_inputs`).
            weight_grad: false,
            name: info.name.clone(),
            direction: info.direction,
            replica: info.replica,
            rank: self.worker.device.rank,
            stage: self.worker.device.stage,
            start_s: task.start_s,
            end_s,
            wait_s: task.wait_s,
            // The host thread drives the GPU the whole time: its "CPU time" is the task's.
            cpu_s: end_s - task.start_s - task.wait_s,
            ops: OpTimes::default(),
            memory: Some(memory),
        });
        Ok(())
    }

    fn finish(mut self) -> Result<Outcome> {
        if self.failure.is_none() {
            if let Err(error) = self.close_task() {
                self.failure = Some(Failure::Error(error));
            }
        }
        match self.failure.take() {
            Some(Failure::Error(error)) => return Err(error),
            Some(Failure::Panic(panic)) => resume_unwind(panic),
            None => {}
        }
        self.cursor.finish().map_err(schedule_error)?;
        self.links.flush()?;
        let finish_s = self.worker.epoch.elapsed().as_secs_f64();
        let mut params = self.worker.weights.clone();
        self.params.download_into(self.gpu, &mut params)?;
        let peak = self.peak_bytes.max(self.gpu.meter.peak_bytes());
        let report = WorkerReport {
            rank: self.worker.device.rank,
            stage: self.worker.device.stage,
            model_state_bytes: Some(self.model_state_bytes),
            peak_memory_bytes: Some(peak),
            finish_s,
            busy_s: self.tasks.iter().map(TaskRecord::run_s).sum(),
            cpu_s: finish_s - self.started_s,
            ops: OpTimes::default(),
            sync: self.sync_times,
        };
        Ok(Outcome {
            loss: self.loss,
            tasks: self.tasks,
            trace: self.trace,
            report,
            started_s: self.started_s,
            grad_shard: self.grad_shard,
            params,
        })
    }
}
