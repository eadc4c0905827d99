//! Measured against predicted: executes a compiled step on a runtime backend (the CPU's, or the
//! CUDA backend's on this machine's GPUs: the same plan, program, driver and checks) and sets what it
//! measured (step time, per-pack time by term, peak memory, model states, the end-of-step sync)
//! beside what the simulator predicted on the same machine model, with the reference check of
//! loss and gradients. `slimpack run` prints one [`RunReport`]; `slimpack validate` runs a
//! suite of them. The model's terms come from the cost model itself (`CostModel::pack_time_on`),
//! never recomputed here.

use std::collections::HashMap;

use serde::Serialize;

use slimpack_ir::program::Program;
use slimpack_ir::spec::Recompute;
use slimpack_ir::StepIr;
use slimpack_machine::cost::CostModel;
use slimpack_machine::sim::{self, MemoryEffect, SimResult, TaskKind};
use slimpack_machine::MachineError;
use slimpack_runtime::cpu::exec::{
    check_reference, execute_program, DeviceOrder, Driver, Execution, Plan, ReferenceCheck,
    SyncTimes, TaskRecord,
};
use slimpack_runtime::cpu::profile::OpTimes;
use slimpack_runtime::cpu::{AdamWConfig, CpuError, ModelConfig, Params};
use slimpack_runtime::cuda::{self, CudaError, KernelSource, Precision};

/// Why a step could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    #[error("--backend cpu: {0}")]
    Cpu(#[from] CpuError),
    #[error(transparent)]
    Machine(#[from] MachineError),
    #[error("--backend cpu: {0}")]
    Unsupported(String),
    #[error("--backend cuda: {0}")]
    Cuda(#[from] CudaError),
    #[error("--driver compiled: {0}")]
    CompiledDriver(String),
    #[error(transparent)]
    OutOfHostMemory(#[from] crate::limits::OutOfHostMemory),
    /// No sample has two tokens: a token predicts the next one of its sample, so the step has
    /// no loss to train or check against the reference.
    #[error(
        "the step has no target token: none of its {0} samples is longer than one token (a \
         token predicts the next one of its sample), so there is no loss to run or check"
    )]
    NoTargets(usize),
}

/// Which runtime executes the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The CPU backend (`slimpack_runtime::cpu`).
    Cpu,
    /// The CUDA backend (`slimpack_runtime::cuda`), one GPU per worker.
    Cuda,
}

impl Backend {
    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
        }
    }
}

/// What drives each worker's ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverKind {
    /// The runtime's interpreter walks each worker's ops.
    Interpreted,
    /// The program compiled (MLIR, LLVM IR, JIT) calls each worker's ops (features mlir, llvm).
    Compiled,
}

/// How a device shared by a plain replica and a DP-Merge group interleaves them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interleave {
    /// Each device runs its packs in the order of their simulated start times.
    Simulated,
    /// Each device runs every replica's schedule in full, replicas in IR order (on a step
    /// whose shared ranks interleave, `interleave-ranks`, another program than the step's, and
    /// predicted as that one).
    ReplicaMajor,
}

/// Called after each execution with the executions done and the executions asked for (see
/// [`MeasureOptions::on_run`]); nothing by default.
#[derive(Clone, Default)]
pub struct OnRun(Option<std::sync::Arc<dyn Fn(usize, usize) + Send + Sync>>);

impl OnRun {
    pub fn new(call: impl Fn(usize, usize) + Send + Sync + 'static) -> OnRun {
        OnRun(Some(std::sync::Arc::new(call)))
    }

    fn call(&self, done: usize, asked: usize) {
        if let Some(call) = &self.0 {
            call(done, asked);
        }
    }
}

impl std::fmt::Debug for OnRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "OnRun(..)"
        } else {
            "OnRun(none)"
        })
    }
}

/// How to measure a step.
#[derive(Debug, Clone)]
pub struct MeasureOptions {
    pub backend: Backend,
    pub driver: DriverKind,
    pub interleave: Interleave,
    /// The GEMMs' precision (the CPU backend runs fp32 only).
    pub precision: Precision,
    /// Executions (from the same weights); the fastest is reported.
    pub repeat: usize,
    /// Told after each execution (a progress bar's `--repeat`).
    pub on_run: OnRun,
    /// Also run the unsliced single-worker reference step and compare loss and gradients.
    pub check_reference: bool,
    /// Include every task's measured and predicted time.
    pub tasks: bool,
    pub token_seed: u64,
    pub init_seed: u64,
}

/// One pack task, measured and predicted.
#[derive(Debug, Serialize)]
pub struct TaskComparison {
    pub name: String,
    pub stage: usize,
    pub rank: usize,
    pub tokens: usize,
    pub measured_s: f64,
    /// CPU seconds of the task's thread (immune to other processes; below `measured_s` also
    /// when it waited for its DP-Merge group).
    pub cpu_s: f64,
    pub predicted_s: f64,
    pub ops: OpTimes,
    /// The model's time for the task, term by term (`ops` is the measurement).
    pub predicted_ops: PredictedOps,
    /// Bytes the task held only while it ran: measured, and the model's temporaries.
    pub temporary_bytes: Option<u64>,
    pub predicted_temporary_bytes: u64,
}

/// One stage's end of the step: gradient reduce-scatter (with the tied-embedding sum),
/// optimizer, weight all-gather.
#[derive(Debug, Serialize)]
pub struct SyncComparison {
    pub stage: usize,
    pub measured_reduce_scatter_s: f64,
    pub predicted_reduce_scatter_s: f64,
    pub measured_optimizer_s: f64,
    pub predicted_optimizer_s: f64,
    pub measured_all_gather_s: f64,
    pub predicted_all_gather_s: f64,
}

/// Per stage, the slowest worker's end-of-step phases beside the simulator's tasks.
fn sync_comparison(
    plan: &Plan,
    execution: &Execution,
    simulated: &SimResult,
) -> Vec<SyncComparison> {
    (0..plan.pp())
        .map(|stage| {
            let workers = execution.workers.iter().filter(|w| w.stage == stage);
            let measured = |get: fn(&SyncTimes) -> f64| {
                workers.clone().map(|w| get(&w.sync)).fold(0.0, f64::max)
            };
            let predicted = |kind: TaskKind| {
                simulated
                    .tasks()
                    .find(|(task, _)| task.kind == kind && task.stage as usize == stage)
                    .map_or(0.0, |(task, _)| task.duration_s)
            };
            SyncComparison {
                stage,
                measured_reduce_scatter_s: measured(|s| {
                    s.tied_embedding_s + s.grad_reduce_scatter_s
                }),
                predicted_reduce_scatter_s: predicted(TaskKind::GradReduceScatter),
                measured_optimizer_s: measured(|s| s.optimizer_s),
                predicted_optimizer_s: predicted(TaskKind::Optimizer),
                measured_all_gather_s: measured(|s| s.param_all_gather_s),
                predicted_all_gather_s: predicted(TaskKind::ParamAllGather),
            }
        })
        .collect()
}

/// The cost model's time of one pack task by term (`CostModel::pack_time_on`), so that a
/// disagreement with the measurement can be pinned on a term.
#[derive(Debug, Default, Serialize)]
pub struct PredictedOps {
    pub gemm_s: f64,
    pub attention_s: f64,
    pub elementwise_s: f64,
    pub kernel_overhead_s: f64,
    /// What the simulator's task adds beyond these: exposed CP exchange of a DP-Merge group.
    pub other_s: f64,
}

/// [`PredictedOps`] of `pack` on `stage`, given the simulator's task duration.
fn predicted_ops(
    cost: &CostModel,
    plan: &Plan,
    pack: usize,
    stage: usize,
    duration_s: f64,
) -> PredictedOps {
    let info = &plan.packs[pack];
    let mut slices: Vec<(u64, u64)> = info
        .slices
        .iter()
        .map(|s| (s.len as u64, s.start as u64))
        .collect();
    let tokens: u64 = slices.iter().map(|s| s.0).sum();
    if info.padding > 0 {
        slices.push((info.padding as u64, tokens));
    }
    let ranks: Vec<u32> = plan.replicas[info.replica]
        .iter()
        .map(|&rank| rank as u32)
        .collect();
    let time = cost.pack_time_on(stage as u32, &slices, info.direction, &ranks);
    PredictedOps {
        gemm_s: time.gemm_s,
        attention_s: time.attention_s,
        elementwise_s: time.elementwise_s,
        kernel_overhead_s: time.kernel_overhead_s,
        other_s: duration_s - time.compute_s,
    }
}

/// Measured memory against the simulator's memory model, term by term (fractions are means of
/// |predicted − measured| / measured over workers or tasks).
#[derive(Debug, Serialize)]
pub struct MemoryTerms {
    /// The model's per-device workspace (on the CPU: one GEMM's packing buffers, part of
    /// every measured peak).
    pub workspace_bytes: u64,
    /// Weights, gradients and optimizer shard at the step's start (predicted: the baseline
    /// without the workspace).
    pub model_state_mape: f64,
    /// After each pack task, the bytes held above the model states (saved activations, K/V,
    /// dK/dV accumulators; measured: also activations sent and not yet consumed).
    pub held_mape: f64,
    /// While each pack task runs, the bytes it holds above what it holds before and after
    /// (measured) against the model's temporaries.
    pub temporary_mape: f64,
    /// Measured over predicted temporaries, summed over tasks.
    pub temporary_ratio: f64,
}

/// What `slimpack run --report json` prints: the execution measured beside the prediction.
#[derive(Debug, Serialize)]
pub struct RunReport {
    pub backend: &'static str,
    /// The GEMMs' precision: fp32, or bf16 (CUDA backend, `--precision bf16`).
    pub precision: &'static str,
    pub model: String,
    pub cluster: String,
    pub parallel: String,
    /// The strategy and its chosen candidate, or the pipeline, or the IR file.
    pub schedule: String,
    pub samples: usize,
    pub tokens: u64,
    pub workers: usize,
    pub loss: f64,
    pub ref_loss: Option<f64>,
    pub loss_rel_err: Option<f64>,
    pub max_grad_rel_err: Option<f32>,
    pub worst_grad_tensor: Option<String>,
    pub max_param_diff_lr: Option<f32>,
    /// The fastest run's step time (see `step_time_runs_s`).
    pub step_time_s: f64,
    /// Every run's step time, in order (`--repeat`).
    pub step_time_runs_s: Vec<f64>,
    /// Their median.
    pub step_time_median_s: f64,
    /// Each run's [`RunReport::off_core_share`], in order.
    pub off_core_share_runs: Vec<f64>,
    pub tokens_per_s: f64,
    /// Per worker (DP rank on a stage, in the simulator's device order), real peak bytes.
    pub peak_memory_bytes: Option<Vec<u64>>,
    /// Per worker, bytes held when the step started (weights, gradients, optimizer shard).
    pub model_state_bytes: Option<Vec<u64>>,
    pub predicted_step_time_s: f64,
    pub predicted_peak_memory_bytes: Vec<u64>,
    /// |predicted − measured| / measured.
    pub step_time_ape: f64,
    /// Mean over workers of |predicted − measured| / measured peak memory.
    pub peak_memory_mape: Option<f64>,
    /// Mean over pack tasks of |predicted − measured| / measured run time.
    pub op_time_mape: f64,
    /// The same against each task's thread CPU time (what the task cost when no other process
    /// shares its core).
    pub op_time_mape_cpu: f64,
    /// Share of the workers' pack time their threads were not on a core (preempted by other
    /// processes, or waiting for their DP-Merge group): 1 − CPU time / wall time.
    pub off_core_share: f64,
    /// The end of the step per stage (slowest worker), measured and predicted.
    pub sync: Vec<SyncComparison>,
    /// The memory model term by term (with the counting allocator).
    pub memory_terms: Option<MemoryTerms>,
    /// Where the workers' pack time went, summed over workers.
    pub ops: OpTimes,
    pub calibrated: bool,
    /// What drove the workers' ops: `interpreted` or `compiled`.
    pub driver: &'static str,
    /// Ops the workers executed (the fastest run's trace).
    pub trace_ops: usize,
    /// The trace's FNV-1a hash: equal for equal per-worker op sequences, whatever the driver.
    pub trace_hash: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tasks: Option<Vec<TaskComparison>>,
}

/// Simulates and executes `ir` on the runtime `options.backend` names (`schedule` says how the
/// step was made, for the report) and compares the two. For the CUDA backend the GPUs are found
/// and the kernels built first: a machine without one fails before anything else.
pub fn measure(
    ir: &StepIr,
    schedule: String,
    options: &MeasureOptions,
) -> Result<RunReport, MeasureError> {
    if options.backend == Backend::Cpu && options.precision != Precision::Fp32 {
        return Err(MeasureError::Unsupported(cpu_precision_message(
            options.precision,
        )));
    }
    let kernels: Option<KernelSource> = match options.backend {
        Backend::Cpu => None,
        Backend::Cuda => Some(crate::gpu::first_gpu()?.1),
    };
    let config = ModelConfig::from_spec(&ir.spec.model)?;
    if ir.spec.model.recompute != Recompute::None {
        return Err(MeasureError::Unsupported(format!(
            "the runtimes run recompute=none only; the step was compiled with recompute={}",
            ir.spec.model.recompute
        )));
    }
    // What each forward pack saves under on each stage: its own mode, or its stage's.
    for stage in 0..ir.spec.parallel.stages() {
        for &replica in ir.replicas() {
            let packs = ir.packs_on(replica, slimpack_ir::step::Direction::Forward);
            if let Some(mode) = packs
                .iter()
                .map(|&pack| ir.saved_recompute(pack, stage))
                .find(|&mode| mode != Recompute::None)
            {
                return Err(MeasureError::Unsupported(format!(
                    "the runtimes run recompute=none only; packs of stage {stage} of the step \
                     recompute with recompute={mode}"
                )));
            }
        }
    }
    if ir.samples().iter().all(|&sample| ir.sample(sample).len < 2) {
        return Err(MeasureError::NoTargets(ir.samples().len()));
    }
    let cost = slimpack_machine::machine_model(&ir.spec);
    let calibrated = slimpack_machine::is_calibrated(&ir.spec);
    // Replica-major on a step whose shared ranks interleave runs another program than the
    // step's: the prediction is of that one.
    let simulated = match options.interleave {
        Interleave::ReplicaMajor if ir.rank_orders().next().is_some() => {
            let mut replica_major = ir.clone();
            replica_major.clear_rank_orders();
            sim::simulate(&replica_major, &cost)?
        }
        _ => sim::simulate(ir, &cost)?,
    };
    if options.backend == Backend::Cpu {
        let workers = crate::limits::workers_peak_bytes(&simulated.metrics);
        crate::limits::check_fits(&format!("run --backend cpu ({schedule})"), workers)?;
    }
    let plan = Plan::new(ir, &config)?;
    let order = match options.interleave {
        Interleave::ReplicaMajor => DeviceOrder::replica_major(&plan),
        Interleave::Simulated => {
            let starts = task_start_times(&simulated);
            DeviceOrder::by_start_times(&plan, |pack, stage| starts.get(&(pack, stage)).copied())?
        }
    };
    let program = order.program(&plan)?;
    let batch = plan.synthetic_batch(&config, options.token_seed)?;
    let params = Params::init(&config, options.init_seed);
    let adamw = AdamWConfig::default();
    let runs = |driver: &Driver| -> Result<(Execution, Vec<f64>, Vec<f64>), MeasureError> {
        let mut runs_s = Vec::with_capacity(options.repeat.max(1));
        let mut off_core = Vec::with_capacity(options.repeat.max(1));
        let mut fastest: Option<Execution> = None;
        let asked = options.repeat.max(1);
        for done in 1..=asked {
            let execution = match &kernels {
                None => execute_program(&plan, &program, driver, &batch, &params, adamw)?,
                Some(kernels) => cuda::execute_program(
                    &plan,
                    &program,
                    driver,
                    &batch,
                    &params,
                    adamw,
                    kernels,
                    options.precision,
                )?,
            };
            runs_s.push(execution.step_time_s);
            off_core.push(off_core_share(&execution));
            options.on_run.call(done, asked);
            if fastest
                .as_ref()
                .is_none_or(|f| execution.step_time_s < f.step_time_s)
            {
                fastest = Some(execution);
            }
        }
        Ok((fastest.expect("at least one run"), runs_s, off_core))
    };
    let (execution, runs_s, off_core) = match options.driver {
        DriverKind::Interpreted => runs(&Driver::Interpreted)?,
        DriverKind::Compiled => with_compiled_driver(&program, runs)??,
    };
    let check = match options.check_reference {
        true => Some(check_reference(&execution, &params, &batch, adamw)?),
        false => None,
    };
    let driver = match options.driver {
        DriverKind::Interpreted => "interpreted",
        DriverKind::Compiled => "compiled",
    };
    let mut report = compare(
        ir,
        &plan,
        schedule,
        driver,
        &execution,
        check,
        &simulated,
        &cost,
        calibrated,
        options.tasks,
    );
    report.backend = options.backend.name();
    report.precision = options.precision.name();
    report.step_time_median_s = median(&runs_s);
    report.step_time_runs_s = runs_s;
    report.off_core_share_runs = off_core;
    Ok(report)
}

/// Share of the workers' pack time their threads were not on a core: 1 − CPU time / wall time
/// over every pack task (other processes preempted them, or a DP-Merge group waited).
fn off_core_share(execution: &Execution) -> f64 {
    let (cpu, busy) = execution
        .tasks
        .iter()
        .fold((0.0, 0.0), |(c, b), t| (c + t.cpu_s, b + t.run_s()));
    1.0 - cpu / busy
}

/// Why the CPU backend refuses `precision` (it computes in fp32 only).
pub fn cpu_precision_message(precision: Precision) -> String {
    format!(
        "--precision {}: the CPU backend computes in fp32 only; {} GEMMs are the CUDA backend's (--backend cuda)",
        precision.name(),
        precision.name()
    )
}

/// The median of `values` (the mean of the middle two for an even count).
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Whether this build has the compiled driver (the MLIR and LLVM backends).
pub const COMPILED_DRIVER: bool = cfg!(all(feature = "mlir", feature = "llvm"));

pub fn compiled_driver_unavailable() -> &'static str {
    "--driver compiled: not available in this build (slimpack was compiled without the `mlir` and `llvm` features; rebuild with --features mlir,llvm)"
}

/// Compiles `program` to native code (MLIR, LLVM IR, JIT) and runs `body` with its driver.
#[cfg(all(feature = "mlir", feature = "llvm"))]
fn with_compiled_driver<R>(
    program: &Program,
    body: impl FnOnce(&Driver) -> R,
) -> Result<R, MeasureError> {
    use slimpack_runtime::cpu::exec::CompiledDriver;
    let compiled = |e: slimpack_codegen::CodegenError| MeasureError::CompiledDriver(e.to_string());
    let llvm_ir = slimpack_codegen::mlir::emit_llvm_ir(program).map_err(compiled)?;
    let symbols = slimpack_runtime::abi::symbols();
    let result = slimpack_codegen::llvm::driver::with_run_device(&llvm_ir, &symbols, |entry| {
        // SAFETY: the JIT keeps `entry` (the program's `slimpack_run_device`, which only calls
        // the runtime's C ABI) alive while `body` runs its executions.
        let driver = Driver::Compiled(unsafe { CompiledDriver::new(entry) });
        body(&driver)
    });
    result.map_err(compiled)
}

#[cfg(not(all(feature = "mlir", feature = "llvm")))]
fn with_compiled_driver<R>(_: &Program, _: impl FnOnce(&Driver) -> R) -> Result<R, MeasureError> {
    Err(MeasureError::CompiledDriver(
        compiled_driver_unavailable().to_string(),
    ))
}

/// When each pack compute task of the simulation starts, by (task, stage), tasks numbered as
/// the executor's ([`Plan::task_of`]): what [`DeviceOrder::by_start_times`] takes to run a step
/// interleaved as simulated.
pub fn task_start_times(simulated: &SimResult) -> HashMap<(usize, usize), f64> {
    compute_task_map(simulated, |_, span| span.start_s)
}

/// A value per pack compute task of the simulation, by (task, stage), tasks numbered as the
/// executor's ([`Plan::task_of`]).
fn compute_task_map(
    simulated: &SimResult,
    value: impl Fn(&sim::Task, sim::Span) -> f64,
) -> HashMap<(usize, usize), f64> {
    simulated
        .tasks()
        .filter_map(|(task, span)| Some((simulated_task_key(simulated, task)?, value(task, span))))
        .collect()
}

/// The (task, stage) of a simulated pack compute task: the pack's index, or for a deferred
/// weight gradient `packs + pack`, as [`Plan::task_of`] numbers the executor's tasks.
fn simulated_task_key(simulated: &SimResult, task: &sim::Task) -> Option<(usize, usize)> {
    let pack = task.pack?.0 as usize;
    let index = match task.kind {
        TaskKind::Forward | TaskKind::Backward => pack,
        TaskKind::WeightGrad => simulated.packs.len() + pack,
        _ => return None,
    };
    Some((index, task.stage as usize))
}

/// The (task, stage) of an executed task, as [`simulated_task_key`] numbers them.
fn record_key(plan: &Plan, record: &TaskRecord) -> (usize, usize) {
    let offset = if record.weight_grad {
        plan.packs.len()
    } else {
        0
    };
    (record.pack + offset, record.stage)
}

#[allow(clippy::too_many_arguments)]
fn compare(
    ir: &StepIr,
    plan: &Plan,
    schedule: String,
    driver: &'static str,
    execution: &Execution,
    check: Option<ReferenceCheck>,
    simulated: &SimResult,
    cost: &CostModel,
    calibrated: bool,
    with_tasks: bool,
) -> RunReport {
    let predicted = &simulated.metrics;
    let durations = compute_task_map(simulated, |task, _| task.duration_s);
    let temporaries = compute_task_map(simulated, |task, _| task.memory.temporary as f64);
    let temporaries: HashMap<(usize, usize), u64> = temporaries
        .into_iter()
        .map(|(k, v)| (k, v as u64))
        .collect();
    // A DP-Merge group's pack runs on each member: the slowest member is the task's time.
    let mut measured: HashMap<(usize, usize), &TaskRecord> = HashMap::new();
    for record in &execution.tasks {
        let slot = measured.entry(record_key(plan, record)).or_insert(record);
        if record.run_s() > slot.run_s() {
            *slot = record;
        }
    }
    let mut comparisons: Vec<TaskComparison> = measured
        .values()
        .map(|record| TaskComparison {
            name: record.name.clone(),
            stage: record.stage,
            rank: record.rank,
            tokens: plan.packs[record.pack].slices.iter().map(|s| s.len).sum(),
            measured_s: record.run_s(),
            cpu_s: record.cpu_s,
            predicted_s: durations[&record_key(plan, record)],
            predicted_ops: predicted_ops(
                cost,
                plan,
                record.pack,
                record.stage,
                durations[&record_key(plan, record)],
            ),
            ops: record.ops,
            temporary_bytes: record.memory.map(|m| m.temporary_bytes()),
            predicted_temporary_bytes: temporaries[&record_key(plan, record)],
        })
        .collect();
    comparisons.sort_by(|a, b| (a.stage, &a.name).cmp(&(b.stage, &b.name)));
    let op_time_mape = mean(comparisons.iter().map(|c| ape(c.predicted_s, c.measured_s)));
    let op_time_mape_cpu = mean(comparisons.iter().map(|c| ape(c.predicted_s, c.cpu_s)));
    let peaks: Option<Vec<u64>> = execution
        .workers
        .iter()
        .map(|w| w.peak_memory_bytes)
        .collect();
    let states: Option<Vec<u64>> = execution
        .workers
        .iter()
        .map(|w| w.model_state_bytes)
        .collect();
    let peak_memory_mape = peaks.as_ref().map(|peaks| {
        let pairs = peaks.iter().zip(&predicted.peak_memory_per_device);
        mean(pairs.map(|(&m, &p)| ape(p as f64, m as f64)))
    });
    let mut ops = OpTimes::default();
    for worker in &execution.workers {
        ops += worker.ops;
    }
    let memory_terms = memory_terms(plan, execution, simulated, cost.memory().workspace_bytes());
    RunReport {
        backend: "cpu",
        precision: Precision::Fp32.name(),
        model: ir.spec.model.name.clone(),
        cluster: ir.spec.cluster.name.clone(),
        parallel: ir.spec.parallel.to_string(),
        schedule,
        samples: ir.samples().len(),
        tokens: ir.tokens(),
        workers: execution.workers.len(),
        loss: execution.loss,
        ref_loss: check.as_ref().map(|c| c.ref_loss),
        loss_rel_err: check.as_ref().map(|c| c.loss_rel_err),
        max_grad_rel_err: check.as_ref().map(|c| c.max_grad_rel_err),
        worst_grad_tensor: check.as_ref().map(|c| c.worst_grad_tensor.clone()),
        max_param_diff_lr: check.as_ref().map(|c| c.max_param_diff_lr),
        step_time_s: execution.step_time_s,
        step_time_runs_s: Vec::new(),
        step_time_median_s: execution.step_time_s,
        off_core_share_runs: Vec::new(),
        tokens_per_s: ir.tokens() as f64 / execution.step_time_s,
        peak_memory_bytes: peaks,
        model_state_bytes: states,
        predicted_step_time_s: predicted.step_time_s,
        predicted_peak_memory_bytes: predicted.peak_memory_per_device.clone(),
        step_time_ape: ape(predicted.step_time_s, execution.step_time_s),
        peak_memory_mape,
        op_time_mape,
        op_time_mape_cpu,
        off_core_share: off_core_share(execution),
        sync: sync_comparison(plan, execution, simulated),
        memory_terms,
        ops,
        calibrated,
        driver,
        trace_ops: execution.trace_ops(),
        trace_hash: execution.trace_hash(),
        tasks: with_tasks.then_some(comparisons),
    }
}

/// The memory terms of every worker and task (`None` without the counting allocator).
fn memory_terms(
    plan: &Plan,
    execution: &Execution,
    simulated: &SimResult,
    workspace: u64,
) -> Option<MemoryTerms> {
    let effects: HashMap<(usize, usize), MemoryEffect> = simulated
        .tasks()
        .filter_map(|(task, _)| Some((simulated_task_key(simulated, task)?, task.memory)))
        .collect();
    let (mut states, mut held, mut temporary) = (vec![], vec![], vec![]);
    let (mut measured_temporary, mut predicted_temporary) = (0u64, 0u64);
    for (index, worker) in execution.workers.iter().enumerate() {
        let device = plan.devices()[index];
        let group = &simulated.memory[plan.device_index(device)];
        let measured_state = worker.model_state_bytes?;
        let predicted_state = group.baseline_bytes.saturating_sub(workspace);
        states.push(ape(predicted_state as f64, measured_state as f64));
        let mut predicted_held = 0i64;
        let records = execution
            .tasks
            .iter()
            .filter(|t| t.rank == device.rank && t.stage == device.stage);
        for record in records {
            let memory = record.memory?;
            let effect = effects[&record_key(plan, record)];
            predicted_held += effect.allocated as i64 - effect.freed as i64;
            let measured_held = memory.after_bytes.saturating_sub(measured_state);
            if predicted_held > 0 && measured_held > 0 {
                held.push(ape(predicted_held as f64, measured_held as f64));
            }
            let measured = memory.temporary_bytes();
            if measured > 0 {
                temporary.push(ape(effect.temporary as f64, measured as f64));
            }
            measured_temporary += measured;
            predicted_temporary += effect.temporary;
        }
    }
    Some(MemoryTerms {
        workspace_bytes: workspace,
        model_state_mape: mean(states),
        held_mape: mean(held),
        temporary_mape: mean(temporary),
        temporary_ratio: measured_temporary as f64 / predicted_temporary.max(1) as f64,
    })
}

/// Absolute percentage error of a prediction, as a fraction.
pub fn ape(predicted: f64, measured: f64) -> f64 {
    (predicted - measured).abs() / measured
}

/// The mean of `values` (0 for none).
pub fn mean(values: impl IntoIterator<Item = f64>) -> f64 {
    let (sum, count) = values
        .into_iter()
        .fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if count == 0 {
        0.0
    } else {
        sum / count as f64
    }
}
