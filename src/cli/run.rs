//! `slimpack run --backend cpu`: compile a step (or read one), execute it for real on the CPU
//! backend, and set what it measured beside what the simulator predicted; with
//! `--check-reference`, compare the loss and every gradient with the unsliced reference step.
//!
//! The step runs as compiled: as its lowered program, one worker per (DP rank, stage) running
//! its op list (see `slimpack_runtime::cpu::exec`), driven through the runtime's C ABI by the
//! interpreter or, with `--driver compiled`, by the program compiled through MLIR and LLVM IR to
//! native code (JIT; needs the `mlir` and `llvm` features). Devices that a plain replica and a
//! DP-Merge group share interleave the two as the simulator predicted (`--interleave simulated`,
//! the default), so that measurement and prediction describe the same execution. The step comes
//! from a strategy, a pass pipeline, an IR file or a schedule JSON (`compile --emit json`).
//! Token ids are seeded random (`--token-seed`); the weights come from `--init-seed`.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use serde::Serialize;

use slimpack::{compile, driver, CompileOptions};
use slimpack_ir::cost::{
    causal_pairs, CostModel, OpKind, Traffic, BACKWARD_ATTENTION_FACTOR, BACKWARD_LINEAR_FACTOR,
    EMBEDDING_KERNELS, HEAD_KERNELS, KERNELS_PER_LAYER_BACKWARD, KERNELS_PER_LAYER_FORWARD,
};
use slimpack_ir::program::Program;
use slimpack_ir::spec::Recompute;
use slimpack_ir::step::Direction;
use slimpack_ir::{text, Spec, StepIr};
use slimpack_passes::strategy::{self, Choices, StrategyState};
use slimpack_runtime::cpu::exec::{
    check_reference, execute_program, DeviceOrder, Driver, Execution, Plan, ReferenceCheck,
    SyncTimes, TaskRecord,
};
use slimpack_runtime::cpu::profile::OpTimes;
use slimpack_runtime::cpu::{AdamWConfig, ModelConfig, Params};
use slimpack_runtime::sim::{self, MemoryEffect, SimResult, TaskKind};

use super::compile::ReportFormat;
use super::input::{BatchArgs, SpecArgs};
use super::report::gib;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The CPU backend (fp32 models such as `tiny`).
    Cpu,
    /// The CUDA backend.
    Cuda,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Interleave {
    /// Each device runs its packs in the order of their simulated start times.
    Simulated,
    /// Each device runs every replica's schedule in full, replicas in IR order.
    ReplicaMajor,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DriverKind {
    /// The runtime's interpreter walks each worker's ops.
    Interpreted,
    /// The program compiled (MLIR, LLVM IR, JIT) calls each worker's ops (features mlir, llvm).
    Compiled,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Backend to execute on: cpu, or cuda (where built with it).
    #[arg(long, value_enum)]
    backend: Backend,
    #[command(flatten)]
    spec: SpecArgs,
    #[command(flatten)]
    batch: BatchArgs,
    /// Run this scheduled step IR as is (its own spec) instead of compiling one.
    #[arg(long, value_name = "FILE.sir", conflicts_with_all = ["strategy", "passes"])]
    ir: Option<PathBuf>,
    /// Run this schedule JSON (`compile --emit json`; its own spec) instead of compiling one.
    #[arg(long, value_name = "FILE.json", conflicts_with_all = ["ir", "strategy", "passes"])]
    schedule: Option<PathBuf>,
    /// What drives each worker's ops: the interpreter, or the program compiled to native code.
    #[arg(long, value_enum, default_value = "interpreted")]
    driver: DriverKind,
    /// Compile with this strategy (slimpack, an ablation such as slimpack-no-eqsat, or a peer).
    #[arg(long, value_name = "NAME", conflicts_with = "passes")]
    strategy: Option<String>,
    /// Compile with this pass pipeline, e.g. 'slice{size=64},assign-dp,pack-symmetric,schedule-pipeline'.
    #[arg(long, value_name = "PIPELINE")]
    passes: Option<String>,
    /// Also run the unsliced single-worker reference step and compare loss and gradients.
    #[arg(long)]
    check_reference: bool,
    /// Seed of the batch's random token ids.
    #[arg(long, value_name = "S", default_value_t = 0)]
    token_seed: u64,
    /// Seed of the initial weights.
    #[arg(long, value_name = "S", default_value_t = 0)]
    init_seed: u64,
    /// How a device shared by a plain replica and a DP-Merge group interleaves them.
    #[arg(long, value_enum, default_value = "simulated")]
    interleave: Interleave,
    /// Execute the step this many times (from the same weights) and report the fastest run:
    /// other processes on the machine only ever add time.
    #[arg(long, value_name = "N", default_value_t = 1)]
    repeat: usize,
    /// Include every task's measured and predicted time in the JSON report.
    #[arg(long)]
    tasks: bool,
    /// Report format: text (stderr) or json (one object on stdout).
    #[arg(long, value_enum, default_value = "text")]
    report: ReportFormat,
}

/// One pack task, measured and predicted.
#[derive(Debug, Serialize)]
struct TaskComparison {
    name: String,
    stage: usize,
    rank: usize,
    tokens: usize,
    measured_s: f64,
    /// CPU seconds of the task's thread (immune to other processes; below `measured_s` also
    /// when it waited for its DP-Merge group).
    cpu_s: f64,
    predicted_s: f64,
    ops: OpTimes,
    /// The model's time for the task, term by term (`ops` is the measurement).
    predicted_ops: PredictedOps,
    /// Bytes the task held only while it ran: measured, and the model's temporaries.
    temporary_bytes: Option<u64>,
    predicted_temporary_bytes: u64,
}

/// One stage's end of the step: gradient reduce-scatter (with the tied-embedding sum),
/// optimizer, weight all-gather.
#[derive(Debug, Serialize)]
struct SyncComparison {
    stage: usize,
    measured_reduce_scatter_s: f64,
    predicted_reduce_scatter_s: f64,
    measured_optimizer_s: f64,
    predicted_optimizer_s: f64,
    measured_all_gather_s: f64,
    predicted_all_gather_s: f64,
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

/// The cost model's time of one pack task by term, recomputed from its public pieces (FLOPs,
/// traffic, achieved rates, kernel counts) the way `CostModel::pack_time` composes them, so that
/// a disagreement with the measurement can be pinned on a term. Recomputation is not modelled
/// here (the CPU backend runs without it).
#[derive(Debug, Default, Serialize)]
struct PredictedOps {
    gemm_s: f64,
    attention_s: f64,
    elementwise_s: f64,
    kernel_overhead_s: f64,
    /// What the simulator's task adds beyond these: exposed CP exchange of a DP-Merge group.
    other_s: f64,
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
    let direction = info.direction;
    let split = plan.replicas[info.replica].len() as f64;
    let flops = cost.flop_model();
    let rates = cost.throughput();
    let traffic = Traffic::new(&cost.spec().model, 1);
    let layers = plan.stages[stage].layer_count() as f64;
    let (first, last) = (stage == 0, stage + 1 == plan.pp());
    let mut slices: Vec<(u64, u64)> = info
        .slices
        .iter()
        .map(|s| (s.len as u64, s.start as u64))
        .collect();
    let tokens: u64 = slices.iter().map(|s| s.0).sum();
    if info.padding > 0 {
        slices.push((info.padding as u64, tokens));
    }
    let tokens = (tokens + info.padding as u64) as f64 / split;
    let (gemm_op, linear_factor) = match direction {
        Direction::Forward => (OpKind::GemmForward, 1.0),
        Direction::Backward => (OpKind::GemmBackward, BACKWARD_LINEAR_FACTOR),
    };
    let mut linear = flops.linear_per_token() * layers * tokens;
    if last {
        linear += flops.head_per_token() * tokens;
    }
    let gemm_s = rates.time(gemm_op, linear * linear_factor, tokens);
    let mut attention_s = 0.0;
    for &(len, prefix) in &slices {
        let work = flops.attention_per_pair() * causal_pairs(len, prefix) as f64 / split;
        let query = len as f64 / split;
        attention_s += layers
            * match direction {
                Direction::Forward => rates.time(OpKind::AttentionForward, work, query),
                Direction::Backward => rates.time(
                    OpKind::AttentionBackward,
                    BACKWARD_ATTENTION_FACTOR * work,
                    query,
                ),
            };
    }
    let mut bytes = traffic.layer(direction) * layers;
    let mut kernels = layers
        * match direction {
            Direction::Forward => KERNELS_PER_LAYER_FORWARD,
            Direction::Backward => KERNELS_PER_LAYER_BACKWARD,
        };
    if first {
        bytes += traffic.embedding(direction);
        kernels += EMBEDDING_KERNELS;
    }
    if last {
        bytes += traffic.head(direction);
        kernels += HEAD_KERNELS;
    }
    let elementwise_s = rates.time(OpKind::Elementwise, bytes * tokens, tokens);
    let kernel_overhead_s = kernels * rates.profile().kernel_overhead_s;
    let modelled = gemm_s + attention_s + elementwise_s + kernel_overhead_s;
    PredictedOps {
        gemm_s,
        attention_s,
        elementwise_s,
        kernel_overhead_s,
        other_s: duration_s - modelled,
    }
}

/// Measured memory against the simulator's memory model, term by term (fractions are means of
/// |predicted − measured| / measured over workers or tasks).
#[derive(Debug, Serialize)]
struct MemoryTerms {
    /// The model's per-device workspace (on the CPU: one GEMM's packing buffers, part of
    /// every measured peak).
    workspace_bytes: u64,
    /// Weights, gradients and optimizer shard at the step's start (predicted: the baseline
    /// without the workspace).
    model_state_mape: f64,
    /// After each pack task, the bytes held above the model states (saved activations, K/V,
    /// dK/dV accumulators; measured: also activations sent and not yet consumed).
    held_mape: f64,
    /// While each pack task runs, the bytes it holds above what it holds before and after
    /// (measured) against the model's temporaries.
    temporary_mape: f64,
    /// Measured over predicted temporaries, summed over tasks.
    temporary_ratio: f64,
}

/// `run --report json`.
#[derive(Debug, Serialize)]
pub(crate) struct RunReport {
    pub(crate) backend: &'static str,
    pub(crate) model: String,
    pub(crate) cluster: String,
    pub(crate) parallel: String,
    /// The strategy and its chosen candidate, or the pipeline, or the IR file.
    pub(crate) schedule: String,
    pub(crate) samples: usize,
    pub(crate) tokens: u64,
    pub(crate) workers: usize,
    pub(crate) loss: f64,
    pub(crate) ref_loss: Option<f64>,
    pub(crate) loss_rel_err: Option<f64>,
    pub(crate) max_grad_rel_err: Option<f32>,
    pub(crate) worst_grad_tensor: Option<String>,
    pub(crate) max_param_diff_lr: Option<f32>,
    /// The fastest run's step time (see `step_time_runs_s`).
    pub(crate) step_time_s: f64,
    /// Every run's step time, in order (`--repeat`).
    pub(crate) step_time_runs_s: Vec<f64>,
    /// Their median.
    pub(crate) step_time_median_s: f64,
    /// Each run's [`RunReport::off_core_share`], in order.
    pub(crate) off_core_share_runs: Vec<f64>,
    pub(crate) tokens_per_s: f64,
    /// Per worker (DP rank on a stage, in the simulator's device order), real peak bytes.
    pub(crate) peak_memory_bytes: Option<Vec<u64>>,
    /// Per worker, bytes held when the step started (weights, gradients, optimizer shard).
    pub(crate) model_state_bytes: Option<Vec<u64>>,
    pub(crate) predicted_step_time_s: f64,
    pub(crate) predicted_peak_memory_bytes: Vec<u64>,
    /// |predicted − measured| / measured.
    pub(crate) step_time_ape: f64,
    /// Mean over workers of |predicted − measured| / measured peak memory.
    pub(crate) peak_memory_mape: Option<f64>,
    /// Mean over pack tasks of |predicted − measured| / measured run time.
    pub(crate) op_time_mape: f64,
    /// The same against each task's thread CPU time (what the task cost when no other process
    /// shares its core).
    pub(crate) op_time_mape_cpu: f64,
    /// Share of the workers' pack time their threads were not on a core (preempted by other
    /// processes, or waiting for their DP-Merge group): 1 − CPU time / wall time.
    pub(crate) off_core_share: f64,
    /// The end of the step per stage (slowest worker), measured and predicted.
    sync: Vec<SyncComparison>,
    /// The memory model term by term (with the counting allocator).
    memory_terms: Option<MemoryTerms>,
    /// Where the workers' pack time went, summed over workers.
    pub(crate) ops: OpTimes,
    pub(crate) calibrated: bool,
    /// What drove the workers' ops: `interpreted` or `compiled`.
    pub(crate) driver: &'static str,
    /// Ops the workers executed (the fastest run's trace).
    pub(crate) trace_ops: usize,
    /// The trace's FNV-1a hash: equal for equal per-worker op sequences, whatever the driver.
    pub(crate) trace_hash: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    tasks: Option<Vec<TaskComparison>>,
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let format = args.report;
    let report = measure(args)?;
    match format {
        ReportFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        ReportFormat::Text => print_text(&report),
    }
    Ok(())
}

/// Compiles (or reads), simulates and executes the step of `args`: the report `run` prints.
pub(crate) fn measure(args: RunArgs) -> anyhow::Result<RunReport> {
    if args.backend == Backend::Cuda {
        bail!(cuda_unavailable());
    }
    if args.repeat == 0 {
        bail!("--repeat 0: give at least 1 run");
    }
    if args.driver == DriverKind::Compiled && !COMPILED_DRIVER {
        bail!(compiled_driver_unavailable());
    }
    let (ir, schedule) = step(&args)?;
    let config = ModelConfig::from_spec(&ir.spec.model).context("--backend cpu")?;
    if ir.spec.model.recompute != Recompute::None {
        bail!(
            "--backend cpu runs recompute=none only; the step was compiled with recompute={}",
            ir.spec.model.recompute.as_str()
        );
    }
    let (cost, calibrated) = cost_model(&ir.spec)?;
    let simulated = sim::simulate(&ir, &cost)?;
    let workers = slimpack::limits::workers_peak_bytes(&simulated.metrics);
    slimpack::limits::check_fits(&format!("run --backend cpu ({schedule})"), workers)?;
    let plan = Plan::new(&ir, &config)?;
    let order = match args.interleave {
        Interleave::ReplicaMajor => DeviceOrder::replica_major(&plan),
        Interleave::Simulated => {
            let starts = compute_task_map(&simulated, |_, span| span.start_s);
            DeviceOrder::by_start_times(&plan, |pack, stage| starts.get(&(pack, stage)).copied())?
        }
    };
    let program = order.program(&plan)?;
    let batch = plan.synthetic_batch(&config, args.token_seed)?;
    let params = Params::init(&config, args.init_seed);
    let adamw = AdamWConfig::default();
    let runs = |driver: &Driver| -> anyhow::Result<(Execution, Vec<f64>, Vec<f64>)> {
        let mut runs_s = Vec::with_capacity(args.repeat.max(1));
        let mut off_core = Vec::with_capacity(args.repeat.max(1));
        let mut fastest: Option<Execution> = None;
        for _ in 0..args.repeat.max(1) {
            let execution = execute_program(&plan, &program, driver, &batch, &params, adamw)?;
            runs_s.push(execution.step_time_s);
            off_core.push(off_core_share(&execution));
            if fastest
                .as_ref()
                .is_none_or(|f| execution.step_time_s < f.step_time_s)
            {
                fastest = Some(execution);
            }
        }
        Ok((fastest.expect("at least one run"), runs_s, off_core))
    };
    let (execution, runs_s, off_core) = match args.driver {
        DriverKind::Interpreted => runs(&Driver::Interpreted)?,
        DriverKind::Compiled => with_compiled_driver(&program, runs)??,
    };
    let check = match args.check_reference {
        true => Some(check_reference(&execution, &params, &batch, adamw)?),
        false => None,
    };
    let driver = match args.driver {
        DriverKind::Interpreted => "interpreted",
        DriverKind::Compiled => "compiled",
    };
    let mut report = compare(
        &ir, &plan, schedule, driver, &execution, check, &simulated, &cost, calibrated, args.tasks,
    );
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

/// The median of `values` (the mean of the middle two for an even count).
pub(crate) fn median(values: &[f64]) -> f64 {
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
const COMPILED_DRIVER: bool = cfg!(all(feature = "mlir", feature = "llvm"));

fn compiled_driver_unavailable() -> &'static str {
    "--driver compiled: not available in this build (slimpack was compiled without the `mlir` and `llvm` features; rebuild with --features mlir,llvm)"
}

/// Compiles `program` to native code (MLIR, LLVM IR, JIT) and runs `body` with its driver.
#[cfg(all(feature = "mlir", feature = "llvm"))]
fn with_compiled_driver<R>(
    program: &Program,
    body: impl FnOnce(&Driver) -> R,
) -> anyhow::Result<R> {
    use slimpack_runtime::cpu::exec::CompiledDriver;
    let llvm_ir = slimpack_codegen::mlir::emit_llvm_ir(program).context("--driver compiled")?;
    let symbols = slimpack_runtime::abi::symbols();
    let result = slimpack_codegen::llvm::driver::with_run_device(&llvm_ir, &symbols, |entry| {
        // SAFETY: the JIT keeps `entry` (the program's `slimpack_run_device`, which only calls
        // the runtime's C ABI) alive while `body` runs its executions.
        let driver = Driver::Compiled(unsafe { CompiledDriver::new(entry) });
        body(&driver)
    });
    result.context("--driver compiled")
}

#[cfg(not(all(feature = "mlir", feature = "llvm")))]
fn with_compiled_driver<R>(_: &Program, _: impl FnOnce(&Driver) -> R) -> anyhow::Result<R> {
    bail!(compiled_driver_unavailable())
}

/// What `--backend cuda` says in this build.
fn cuda_unavailable() -> String {
    if cfg!(feature = "cuda") {
        "--backend cuda: no CUDA device (the CUDA backend found none on this machine)".to_string()
    } else {
        "--backend cuda: not available in this build (slimpack was compiled without the `cuda` feature; rebuild with --features cuda on a machine with a CUDA device)".to_string()
    }
}

/// The step to run and how it was made.
fn step(args: &RunArgs) -> anyhow::Result<(StepIr, String)> {
    let file = args
        .ir
        .as_ref()
        .map(|_| "--ir")
        .or(args.schedule.as_ref().map(|_| "--schedule"));
    if let (Some(file), Some(flag)) = (file, super::input::first_job_flag(&args.spec, &args.batch))
    {
        bail!(
            "{flag} cannot be combined with {file}: the step file carries its own spec and batch"
        );
    }
    if let Some(path) = &args.ir {
        let source = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let ir = text::parse(&source, &path.display().to_string())?;
        slimpack_ir::verify::verify(&ir)?;
        return Ok((ir, format!("ir {}", path.display())));
    }
    if let Some(path) = &args.schedule {
        let source = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let document = slimpack_codegen::schedule_json::parse(&source)
            .with_context(|| format!("{}", path.display()))?;
        let ir = slimpack_codegen::schedule_json::to_ir(&document)
            .with_context(|| format!("{}", path.display()))?;
        slimpack_ir::verify::verify(&ir).with_context(|| format!("{}", path.display()))?;
        return Ok((ir, format!("schedule {}", path.display())));
    }
    let job = args.spec.job()?;
    let batch = job.batch(&args.batch)?;
    match (&args.strategy, &args.passes) {
        (Some(name), _) => {
            let info = strategy::lookup(name).map_err(|e| anyhow::anyhow!("--strategy: {e}"))?;
            // The CPU backend executes without recomputation: only those candidates.
            let choices = Choices::fixed(job.spec.model.recompute);
            let mut state = StrategyState::default();
            let (_, choice) = driver::compile_step(info, &job.spec, &batch, &mut state, &choices)?;
            let label = choice.best().candidate.label.clone();
            Ok((
                choice.compiled.ir,
                format!("strategy {} ({label})", info.name),
            ))
        }
        (None, Some(pipeline)) => {
            let options = CompileOptions {
                pipeline: pipeline.clone(),
                ..CompileOptions::default()
            };
            let compiled = compile(&job.spec, &batch, &options, &mut std::io::stderr())?;
            Ok((compiled.ir, format!("passes {pipeline}")))
        }
        (None, None) => {
            bail!("give --strategy NAME, --passes PIPELINE, --ir FILE.sir or --schedule FILE.json")
        }
    }
}

/// The machine model of `spec`: the shipped measurement of this machine where there is one
/// for the spec's device, the facade's model otherwise.
fn cost_model(spec: &Spec) -> anyhow::Result<(CostModel, bool)> {
    Ok((
        slimpack::machine::cost_model(spec),
        slimpack::machine::is_calibrated(spec),
    ))
}

/// A value per pack compute task of the simulation, by (pack, stage).
fn compute_task_map(
    simulated: &SimResult,
    value: impl Fn(&sim::Task, sim::Span) -> f64,
) -> HashMap<(usize, usize), f64> {
    simulated
        .tasks()
        .filter(|(task, _)| matches!(task.kind, TaskKind::Forward | TaskKind::Backward))
        .filter_map(|(task, span)| {
            let pack = task.pack?.0 as usize;
            Some(((pack, task.stage as usize), value(task, span)))
        })
        .collect()
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
        let slot = measured
            .entry((record.pack, record.stage))
            .or_insert(record);
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
            predicted_s: durations[&(record.pack, record.stage)],
            predicted_ops: predicted_ops(
                cost,
                plan,
                record.pack,
                record.stage,
                durations[&(record.pack, record.stage)],
            ),
            ops: record.ops,
            temporary_bytes: record.memory.map(|m| m.temporary_bytes()),
            predicted_temporary_bytes: temporaries[&(record.pack, record.stage)],
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
        .filter(|(task, _)| matches!(task.kind, TaskKind::Forward | TaskKind::Backward))
        .filter_map(|(task, _)| Some(((task.pack?.0 as usize, task.stage as usize), task.memory)))
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
            let effect = effects[&(record.pack, record.stage)];
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
        model_state_mape: mean(states.into_iter()),
        held_mape: mean(held.into_iter()),
        temporary_mape: mean(temporary.into_iter()),
        temporary_ratio: measured_temporary as f64 / predicted_temporary.max(1) as f64,
    })
}

/// Absolute percentage error of a prediction, as a fraction.
fn ape(predicted: f64, measured: f64) -> f64 {
    (predicted - measured).abs() / measured
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, count) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if count == 0 {
        0.0
    } else {
        sum / count as f64
    }
}

fn print_text(report: &RunReport) {
    eprintln!(
        "ran {} samples ({} tokens) of {} on the CPU ({}, {} workers), {}",
        report.samples,
        report.tokens,
        report.model,
        report.parallel,
        report.workers,
        report.schedule
    );
    eprintln!(
        "  loss {:.6}, step {:.4} s ({:.0} tokens/s); predicted {:.4} s ({:+.1}%)",
        report.loss,
        report.step_time_s,
        report.tokens_per_s,
        report.predicted_step_time_s,
        100.0 * (report.predicted_step_time_s / report.step_time_s - 1.0)
    );
    if let (Some(ref_loss), Some(err)) = (report.ref_loss, report.max_grad_rel_err) {
        eprintln!(
            "  reference loss {ref_loss:.6} (relative difference {:.1e}); max gradient error {err:.1e} ({})",
            report.loss_rel_err.unwrap_or_default(),
            report.worst_grad_tensor.as_deref().unwrap_or("")
        );
    }
    eprintln!(
        "  {} driver: {} ops executed, trace {}",
        report.driver, report.trace_ops, report.trace_hash
    );
    if let Some(peaks) = &report.peak_memory_bytes {
        let worst = peaks.iter().copied().max().unwrap_or(0);
        let predicted = report
            .predicted_peak_memory_bytes
            .iter()
            .copied()
            .max()
            .unwrap_or(0);
        eprintln!(
            "  peak memory {} per worker at most; predicted {} (MAPE {:.1}%)",
            gib(worst),
            gib(predicted),
            100.0 * report.peak_memory_mape.unwrap_or_default()
        );
    }
    eprintln!(
        "  per-pack time MAPE {:.1}%{}",
        100.0 * report.op_time_mape,
        if report.calibrated {
            ""
        } else {
            " (uncalibrated machine model)"
        }
    );
}
