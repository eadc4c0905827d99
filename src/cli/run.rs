//! `slimpack run --backend cpu|cuda`: compile a step (or read one), execute it for real on the
//! CPU backend or on this machine's GPUs (one per worker), and set what it measured beside what
//! the simulator predicted; with `--check-reference`, compare the loss and every gradient with
//! the unsliced reference step (on the CPU). Without a GPU (no driver, no device, or a build
//! without the `cuda` feature) `--backend cuda` fails in one line saying which, before any
//! compiling.
//!
//! The step runs as compiled: as its lowered program, one worker per (DP rank, stage) running
//! its op list (see `slimpack_runtime::cpu::exec`), driven through the runtime's C ABI by the
//! interpreter or, with `--driver compiled`, by the program compiled through MLIR and LLVM IR to
//! native code (JIT; needs the `mlir` and `llvm` features). Devices that a plain replica and a
//! DP-Merge group share run the two in the order the simulator predicted (`--interleave
//! simulated`, the default: the lowered program's, for the simulator follows it — one after
//! the other, or interleaved where the step gives a shared rank an order, `interleave-ranks`),
//! so that measurement and prediction describe the same execution. The step comes
//! from a strategy, a pass pipeline, an IR file or a schedule JSON (`compile --emit json`).
//! Token ids are seeded random (`--token-seed`); the weights come from `--init-seed`.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};

use slimpack::measure::{
    self as measuring, compiled_driver_unavailable, DriverKind, Interleave, MeasureOptions, OnRun,
    RunReport, COMPILED_DRIVER,
};
use slimpack::tune::autotune;
use slimpack::tune::strategy::{self, Choices, StrategyState};
use slimpack::{compile, CompileOptions};
use slimpack_ir::{text, StepIr};
use slimpack_runtime::cuda::Precision;

use super::compile::ReportFormat;
use super::input::{BatchArgs, SpecArgs};
use super::report::gib;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The CPU backend (fp32 models such as `tiny`).
    Cpu,
    /// The CUDA backend (feature `cuda`; one GPU per worker).
    Cuda,
}

impl Backend {
    /// The library's name for it.
    pub fn kind(self) -> measuring::Backend {
        match self {
            Backend::Cpu => measuring::Backend::Cpu,
            Backend::Cuda => measuring::Backend::Cuda,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PrecisionArg {
    /// fp32 GEMMs (SGEMM): what --check-reference's 1e-4 bound holds.
    Fp32,
    /// bf16 GEMM operands, fp32 accumulation and weights (CUDA backend, compute capability 8.0+).
    Bf16,
}

impl PrecisionArg {
    /// The library's name for it.
    pub fn kind(self) -> Precision {
        match self {
            PrecisionArg::Fp32 => Precision::Fp32,
            PrecisionArg::Bf16 => Precision::Bf16,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InterleaveArg {
    /// Each device runs its packs in the order of their simulated start times.
    Simulated,
    /// Each device runs every replica's schedule in full, replicas in IR order (where the step
    /// interleaves them, the prediction is of this order too).
    ReplicaMajor,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DriverArg {
    /// The runtime's interpreter walks each worker's ops.
    Interpreted,
    /// The program compiled (MLIR, LLVM IR, JIT) calls each worker's ops (features mlir, llvm).
    Compiled,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Backend to execute on: cpu, or cuda (this machine's GPUs, one per worker).
    #[arg(long, value_enum)]
    pub(crate) backend: Backend,
    /// The GEMMs' precision: fp32, or bf16 operands with fp32 accumulation (--backend cuda only).
    #[arg(long, value_enum, default_value = "fp32")]
    pub(crate) precision: PrecisionArg,
    #[command(flatten)]
    pub(crate) spec: SpecArgs,
    #[command(flatten)]
    pub(crate) batch: BatchArgs,
    /// Run this scheduled step IR as is (its own spec) instead of compiling one.
    #[arg(long, value_name = "FILE.sir", conflicts_with_all = ["strategy", "passes"])]
    pub(crate) ir: Option<PathBuf>,
    /// Run this schedule JSON (`compile --emit json`; its own spec) instead of compiling one.
    #[arg(long, value_name = "FILE.json", conflicts_with_all = ["ir", "strategy", "passes"])]
    pub(crate) schedule: Option<PathBuf>,
    /// What drives each worker's ops: the interpreter, or the program compiled to native code.
    #[arg(long, value_enum, default_value = "interpreted")]
    pub(crate) driver: DriverArg,
    /// Compile with this strategy (slimpack, an ablation such as slimpack-no-eqsat, or a peer).
    #[arg(long, value_name = "NAME", conflicts_with = "passes")]
    pub(crate) strategy: Option<String>,
    /// Compile with this pass pipeline, e.g. 'slice{size=64},assign-dp,pack-symmetric,schedule-pipeline'.
    #[arg(long, value_name = "PIPELINE")]
    pub(crate) passes: Option<String>,
    /// Also run the unsliced single-worker reference step and compare loss and gradients.
    #[arg(long)]
    pub(crate) check_reference: bool,
    /// Seed of the batch's random token ids.
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub(crate) token_seed: u64,
    /// Seed of the initial weights.
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub(crate) init_seed: u64,
    /// How a device shared by a plain replica and a DP-Merge group interleaves them.
    #[arg(long, value_enum, default_value = "simulated")]
    pub(crate) interleave: InterleaveArg,
    /// Execute the step this many times (from the same weights) and report the fastest run:
    /// other processes on the machine only ever add time.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(crate) repeat: usize,
    /// Include every task's measured and predicted time in the JSON report.
    #[arg(long)]
    pub(crate) tasks: bool,
    /// Report format: text (stderr) or json (one object on stdout).
    #[arg(long, value_enum, default_value = "text")]
    pub(crate) report: ReportFormat,
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let format = args.report;
    let report = measure(&args)?;
    match format {
        ReportFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        ReportFormat::Text => print_text(&report),
    }
    Ok(())
}

/// The most executions `--repeat` asks for (each keeps its time for the report).
const MAX_REPEAT: usize = 100_000;

/// Refuses a `--repeat` outside 1..=[`MAX_REPEAT`] (`run` and `validate`).
pub(crate) fn check_repeat(repeat: usize) -> anyhow::Result<()> {
    if !(1..=MAX_REPEAT).contains(&repeat) {
        bail!("--repeat {repeat}: give 1 to {MAX_REPEAT} runs");
    }
    Ok(())
}

/// Compiles (or reads) the step of `args` and measures it: the report `run` prints.
pub(crate) fn measure(args: &RunArgs) -> anyhow::Result<RunReport> {
    let precision = args.precision.kind();
    if args.backend == Backend::Cpu && precision != Precision::Fp32 {
        bail!("{}", measuring::cpu_precision_message(precision));
    }
    if args.backend == Backend::Cuda {
        require_gpu()?;
    }
    check_repeat(args.repeat)?;
    if args.driver == DriverArg::Compiled && !COMPILED_DRIVER {
        bail!(compiled_driver_unavailable());
    }
    let (ir, schedule) = step(args)?;
    // Several executions show their count on a terminal.
    let bar = match args.repeat > 1 {
        true => super::progress::bar(args.repeat as u64, "[{bar:32}] {pos}/{len} runs {elapsed}"),
        false => indicatif::ProgressBar::hidden(),
    };
    let on_run = {
        let bar = bar.clone();
        OnRun::new(move |done, _| bar.set_position(done as u64))
    };
    let options = MeasureOptions {
        backend: args.backend.kind(),
        driver: match args.driver {
            DriverArg::Interpreted => DriverKind::Interpreted,
            DriverArg::Compiled => DriverKind::Compiled,
        },
        interleave: match args.interleave {
            InterleaveArg::Simulated => Interleave::Simulated,
            InterleaveArg::ReplicaMajor => Interleave::ReplicaMajor,
        },
        precision,
        repeat: args.repeat,
        on_run,
        check_reference: args.check_reference,
        tasks: args.tasks,
        token_seed: args.token_seed,
        init_seed: args.init_seed,
    };
    let report = slimpack::measure::measure(&ir, schedule, &options);
    bar.finish_and_clear();
    Ok(report?)
}

/// Fails in one line unless this machine has a GPU the CUDA backend can use (`--backend cuda:
/// no CUDA driver found ...`, `no CUDA device found ...`, or the build has no CUDA backend).
pub(crate) fn require_gpu() -> anyhow::Result<()> {
    slimpack::gpu::gpus().map_err(|e| anyhow::anyhow!("--backend cuda: {e}"))?;
    Ok(())
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
    let is_json = super::input::is_schedule_json;
    if let Some(path) = &args.ir {
        let source = slimpack_ir::file::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if is_json(&source) {
            bail!(
                "--ir {}: this is schedule JSON; give it with --schedule",
                path.display()
            );
        }
        let ir = text::parse(&source, &path.display().to_string())?;
        slimpack_ir::verify::verify(&ir)?;
        return Ok((ir, format!("ir {}", path.display())));
    }
    if let Some(path) = &args.schedule {
        let source = slimpack_ir::file::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if !is_json(&source) && source.trim_start().starts_with("step") {
            bail!(
                "--schedule {}: this is step IR (text); give it with --ir",
                path.display()
            );
        }
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
            // The executors run without recomputation and one model chunk per device, the
            // CUDA backend whole backwards: only those candidates.
            let mut choices = Choices::fixed(job.spec.model.recompute).one_chunk_per_device();
            if args.backend == Backend::Cuda {
                choices = choices.whole_backwards();
            }
            let mut state = StrategyState::default();
            let (_, choice) =
                autotune::compile_step(info, &job.spec, &batch, &mut state, &choices)?;
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

fn print_text(report: &RunReport) {
    eprintln!(
        "ran {} samples ({} tokens) of {} on the {} backend ({}, {} workers), {}",
        report.samples,
        report.tokens,
        report.model,
        report.backend,
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
