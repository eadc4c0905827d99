//! `slimpack validate --backend cpu|cuda`: the simulator against a runtime over a fixed suite
//! of schedules (strategies and pass pipelines × batches × slice sizes × layouts of the `tiny`
//! model): the CPU backend on the `cpu` cluster, or the CUDA backend on the cluster preset of
//! this machine's GPU, with the schedules that need no more GPUs than the machine has (one per
//! worker) and that the CUDA backend runs (a schedule it refuses — e.g. one whose pipeline
//! messages NCCL could not match in order — is listed as skipped, with the reason). Without a
//! GPU `--backend cuda` fails in one line.
//!
//! Every schedule is one `slimpack run` command line (printed with its row, so that any row can
//! be reproduced on its own), executed `--repeat` times. Figures, each the mean over the suite of
//! |predicted − measured| / measured:
//! - peak memory: per worker (the counting allocator's peak of each DP rank on each stage), over
//!   every worker of every schedule;
//! - step time: the median of the runs, over the schedules with no more workers than the
//!   machine has cores (more workers than cores time-share them, which the simulator does not
//!   model);
//! - per-op time: each schedule's pack-task MAPE (`run`'s `op_time_mape`, of its fastest run).
//!
//! A shared machine preempts the workers: a run whose workers were off their cores more than
//! [`UNPREEMPTED`] of their pack time is *preempted*. The step-time figure is also given over
//! the unpreempted runs only (their median per schedule, for the schedules that had one).
//!
//! The machine's load average is recorded before and after the suite: other processes only
//! add time, so the step-time figures are only as good as the load allows.

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;
use serde::Serialize;

use super::compile::ReportFormat;
use slimpack::measure::{self, ape, MeasureError, RunReport};
use slimpack_runtime::cuda::CudaError;

use super::input::{BatchArgs, SpecArgs};
use super::run::{self, Backend, DriverArg, InterleaveArg, PrecisionArg, RunArgs};

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Backend to validate against: cpu, or cuda (this machine's GPUs).
    #[arg(long, value_enum)]
    backend: Backend,
    /// Executions per schedule; step times are their median.
    #[arg(long, value_name = "N", default_value_t = 5)]
    repeat: usize,
    /// Only the schedules whose label contains this text.
    #[arg(long, value_name = "TEXT")]
    filter: Option<String>,
    /// Also write the JSON report to this file.
    #[arg(long, value_name = "FILE.json")]
    out: Option<PathBuf>,
    /// Predict with this calibration (`slimpack calibrate`'s JSON, measured on this machine's
    /// backend) instead of the cluster preset's own rates.
    #[arg(long, value_name = "FILE.json")]
    calibration: Option<PathBuf>,
    /// Report format: text (table on stderr) or json (one object on stdout).
    #[arg(long, value_enum, default_value = "text")]
    report: ReportFormat,
}

/// Most off-core share of a run counted as unpreempted (as in `calibrate`).
const UNPREEMPTED: f64 = 0.03;

/// Batches of the suite (`--synthetic` specs; seeded by `--seed 0`).
const BATCHES: [(&str, &str); 3] = [
    ("ln256", "lognormal:median=256,sigma=1,count=16,max=2048"),
    ("ln512", "lognormal:median=512,sigma=1.2,count=12,max=4096"),
    ("par", "pareto:scale=128,shape=1.2,count=24,max=2048"),
];

/// The suite: (layout, batch, schedule) — a strategy name, or `sliceN` for the pass pipeline
/// that cuts slices of N tokens and packs them into forward and backward packs of at most N
/// tokens.
const SUITE: [(&str, &str, &str); 22] = [
    ("pp=1,dp=1", "ln256", "slimpack"),
    ("pp=1,dp=1", "ln256", "bfd"),
    ("pp=1,dp=1", "ln256", "slice256"),
    ("pp=1,dp=1", "ln512", "slice1024"),
    ("pp=1,dp=1", "ln512", "megatron"),
    ("pp=2,dp=1", "ln256", "slimpack"),
    ("pp=2,dp=1", "ln512", "slimpack"),
    ("pp=2,dp=1", "ln256", "wlb"),
    ("pp=2,dp=1", "par", "bfd"),
    ("pp=2,dp=1", "ln256", "slice256"),
    ("pp=2,dp=1", "ln512", "slice512"),
    ("pp=2,dp=1", "par", "slice1024"),
    ("pp=1,dp=2", "ln256", "slimpack"),
    ("pp=1,dp=2", "ln256", "bfd"),
    ("pp=1,dp=2", "ln256", "slice512"),
    ("pp=1,dp=2", "ln512", "wlb"),
    ("pp=1,dp=2", "par", "megatron"),
    ("pp=2,dp=2", "ln256", "slimpack"),
    ("pp=2,dp=2", "ln512", "bfd"),
    ("pp=2,dp=2", "par", "slice256"),
    ("pp=2,dp=2", "ln256", "megatron"),
    ("pp=4,dp=1", "ln512", "slimpack"),
];

/// One schedule of the suite, measured and predicted.
#[derive(Debug, Serialize)]
struct Row {
    label: String,
    /// The `slimpack run` command that reproduces the row (one execution per `--repeat`).
    command: String,
    /// What the strategy chose, or the pipeline.
    schedule: String,
    workers: usize,
    tokens: u64,
    /// Whether the row counts towards the step-time MAPE (workers <= cores).
    timed: bool,
    step_time_median_s: f64,
    step_time_runs_s: Vec<f64>,
    predicted_step_time_s: f64,
    step_time_ape: f64,
    /// Each run's off-core share (see the module comment).
    off_core_share_runs: Vec<f64>,
    /// Median of the unpreempted runs, if any.
    step_time_unpreempted_s: Option<f64>,
    step_time_unpreempted_ape: Option<f64>,
    peak_memory_bytes: Vec<u64>,
    predicted_peak_memory_bytes: Vec<u64>,
    /// Per worker, |predicted − measured| / measured peak memory.
    peak_memory_ape: Vec<f64>,
    op_time_mape: f64,
    op_time_mape_cpu: f64,
    off_core_share: f64,
}

/// The suite's figures.
#[derive(Debug, Serialize)]
struct Summary {
    schedules: usize,
    workers: usize,
    peak_memory_mape: f64,
    peak_memory_max_ape: f64,
    timed_schedules: usize,
    step_time_mape: f64,
    step_time_max_ape: f64,
    /// Timed schedules with at least one unpreempted run, and the MAPE of their medians.
    unpreempted_schedules: usize,
    step_time_mape_unpreempted: Option<f64>,
    op_time_mape: f64,
    op_time_mape_cpu: f64,
}

#[derive(Debug, Serialize)]
struct ValidateReport {
    backend: &'static str,
    cores: usize,
    repeat: usize,
    /// `/proc/loadavg` before and after the suite (1, 5 and 15 minute averages).
    load_before: String,
    load_after: String,
    summary: Summary,
    rows: Vec<Row>,
}

pub fn run(args: ValidateArgs) -> anyhow::Result<()> {
    super::output::check_distinct(
        &[("--calibration", args.calibration.as_deref())],
        &[args.report.output(), ("--out", args.out.as_deref())],
    )?;
    let (cluster, devices) = match args.backend {
        Backend::Cpu => (
            "cpu".to_string(),
            std::thread::available_parallelism().map_or(1, |n| n.get()),
        ),
        Backend::Cuda => {
            let gpus = slimpack::gpu::gpus().map_err(|e| anyhow::anyhow!("--backend cuda: {e}"))?;
            let preset = slimpack::gpu::cluster_preset(&gpus[0].name).ok_or_else(|| {
                anyhow::anyhow!(
                    "--backend cuda: no cluster preset describes {}",
                    gpus[0].name
                )
            })?;
            (preset.to_string(), gpus.len())
        }
    };
    super::run::check_repeat(args.repeat)?;
    if let Some(path) = &args.calibration {
        // Read and checked against the suite's device once, before any schedule runs.
        let spec = slimpack_ir::Spec::from_presets("tiny", &cluster, "tp=1,pp=1,dp=1")?;
        super::input::use_calibration_file(path, &spec)?;
    }
    let cores = devices;
    let load_before = load_average();
    let mut rows = Vec::new();
    for (layout, batch, schedule) in SUITE {
        let label = format!("{layout} {batch} {schedule}");
        if args
            .filter
            .as_ref()
            .is_some_and(|f| !label.contains(f.as_str()))
        {
            continue;
        }
        let workers = workers_of(layout);
        if args.backend == Backend::Cuda && workers > devices {
            eprintln!("  {label}: skipped ({workers} workers, this machine has {devices} GPUs)");
            continue;
        }
        let (run_args, command) = suite_run(
            args.backend,
            &cluster,
            args.calibration.as_deref(),
            (layout, batch, schedule),
            args.repeat,
        );
        eprintln!("  {label} ...");
        let report = match run::measure(&run_args) {
            Ok(report) => report,
            Err(error) if unsupported_on_gpu(&error) => {
                eprintln!("  {label}: skipped ({error:#})");
                continue;
            }
            Err(error) => return Err(error.context(format!("schedule '{label}'"))),
        };
        rows.push(row(label, command, report, cores)?);
    }
    if rows.is_empty() {
        bail!("--filter matches no schedule of the suite");
    }
    let report = ValidateReport {
        backend: args.backend.kind().name(),
        cores,
        repeat: args.repeat,
        load_before,
        load_after: load_average(),
        summary: summary(&rows),
        rows,
    };
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(path) = &args.out {
        super::output::write(Some(path), &format!("{json}\n"))?;
    }
    match args.report {
        ReportFormat::Json => println!("{json}"),
        ReportFormat::Text => print_table(&report),
    }
    Ok(())
}

/// The `slimpack run` arguments of one schedule of the suite, and the command line that
/// reproduces them (printed with the row).
fn suite_run(
    backend: Backend,
    cluster: &str,
    calibration: Option<&std::path::Path>,
    (layout, batch, schedule): (&str, &str, &str),
    repeat: usize,
) -> (RunArgs, String) {
    let synthetic = BATCHES
        .iter()
        .find(|(name, _)| *name == batch)
        .map(|(_, spec)| *spec)
        .expect("the suite names its own batches (bug)");
    let parallel = format!("tp=1,{layout}");
    let (strategy, passes) = match schedule.strip_prefix("slice") {
        Some(size) => (
            None,
            Some(format!(
                "slice{{size={size}}},assign-dp,pack-fwd{{cap={size}}},pack-bwd{{cap={size}}},schedule-pipeline"
            )),
        ),
        None => (Some(schedule.to_string()), None),
    };
    let command = format!(
        "slimpack run --backend {} --model tiny --cluster {cluster} --parallel {parallel} \
         --synthetic {synthetic} --seed 0 --repeat {repeat} {}{}",
        backend.kind().name(),
        match (&strategy, &passes) {
            (Some(name), _) => format!("--strategy {name}"),
            (_, Some(pipeline)) => format!("--passes '{pipeline}'"),
            _ => unreachable!("a suite schedule is a strategy or a pipeline"),
        },
        calibration.map_or(String::new(), |path| format!(
            " --calibration {}",
            path.display()
        ))
    );
    let args = RunArgs {
        backend,
        precision: PrecisionArg::Fp32,
        spec: SpecArgs {
            model: Some("tiny".into()),
            cluster: Some(cluster.into()),
            parallel: Some(parallel),
            calibration: calibration.map(std::path::Path::to_path_buf),
            ..SpecArgs::default()
        },
        batch: BatchArgs {
            synthetic: Some(synthetic.into()),
            seed: Some(0),
            ..BatchArgs::default()
        },
        ir: None,
        schedule: None,
        driver: DriverArg::Interpreted,
        strategy,
        passes,
        check_reference: false,
        token_seed: 0,
        init_seed: 0,
        interleave: InterleaveArg::Simulated,
        repeat,
        tasks: false,
        report: ReportFormat::Text,
    };
    (args, command)
}

/// Workers of a suite layout (`pp=P,dp=D`): one per DP rank and stage.
fn workers_of(layout: &str) -> usize {
    layout
        .split(',')
        .filter_map(|part| part.split_once('=')?.1.parse::<usize>().ok())
        .product()
}

/// Whether `error` is the CUDA backend refusing what it does not run yet.
fn unsupported_on_gpu(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<MeasureError>(),
            Some(MeasureError::Cuda(CudaError::Unsupported { .. }))
        )
    })
}

fn row(label: String, command: String, report: RunReport, cores: usize) -> anyhow::Result<Row> {
    let Some(peaks) = report.peak_memory_bytes else {
        bail!("no memory measured: this binary does not count its allocations");
    };
    let predicted = report.predicted_peak_memory_bytes;
    let peak_memory_ape = peaks
        .iter()
        .zip(&predicted)
        .map(|(&m, &p)| ape(p as f64, m as f64))
        .collect();
    let median = report.step_time_median_s;
    let unpreempted: Vec<f64> = report
        .step_time_runs_s
        .iter()
        .zip(&report.off_core_share_runs)
        .filter(|(_, &off)| off <= UNPREEMPTED)
        .map(|(&t, _)| t)
        .collect();
    let step_time_unpreempted_s = (!unpreempted.is_empty()).then(|| measure::median(&unpreempted));
    Ok(Row {
        label,
        command,
        schedule: report.schedule,
        workers: report.workers,
        tokens: report.tokens,
        timed: report.workers <= cores,
        step_time_median_s: median,
        step_time_runs_s: report.step_time_runs_s,
        predicted_step_time_s: report.predicted_step_time_s,
        step_time_ape: ape(report.predicted_step_time_s, median),
        off_core_share_runs: report.off_core_share_runs,
        step_time_unpreempted_s,
        step_time_unpreempted_ape: step_time_unpreempted_s
            .map(|t| ape(report.predicted_step_time_s, t)),
        peak_memory_bytes: peaks,
        predicted_peak_memory_bytes: predicted,
        peak_memory_ape,
        op_time_mape: report.op_time_mape,
        op_time_mape_cpu: report.op_time_mape_cpu,
        off_core_share: report.off_core_share,
    })
}

fn summary(rows: &[Row]) -> Summary {
    let memory: Vec<f64> = rows
        .iter()
        .flat_map(|r| r.peak_memory_ape.clone())
        .collect();
    let timed: Vec<f64> = rows
        .iter()
        .filter(|r| r.timed)
        .map(|r| r.step_time_ape)
        .collect();
    let unpreempted: Vec<f64> = rows
        .iter()
        .filter(|r| r.timed)
        .filter_map(|r| r.step_time_unpreempted_ape)
        .collect();
    Summary {
        schedules: rows.len(),
        workers: memory.len(),
        peak_memory_mape: measure::mean(memory.iter().copied()),
        peak_memory_max_ape: memory.iter().copied().fold(0.0, f64::max),
        timed_schedules: timed.len(),
        step_time_mape: measure::mean(timed.iter().copied()),
        step_time_max_ape: timed.iter().copied().fold(0.0, f64::max),
        unpreempted_schedules: unpreempted.len(),
        step_time_mape_unpreempted: (!unpreempted.is_empty())
            .then(|| measure::mean(unpreempted.iter().copied())),
        op_time_mape: measure::mean(rows.iter().map(|r| r.op_time_mape)),
        op_time_mape_cpu: measure::mean(rows.iter().map(|r| r.op_time_mape_cpu)),
    }
}

fn print_table(report: &ValidateReport) {
    eprintln!(
        "{:<28} {:>3} {:>9} {:>9} {:>7} {:>9} {:>8} {:>7} {:>7}",
        "schedule", "wk", "step s", "pred s", "err", "unpre err", "mem err", "op err", "off"
    );
    for row in &report.rows {
        let worst = row.peak_memory_ape.iter().copied().fold(0.0, f64::max);
        eprintln!(
            "{:<28} {:>3} {:>9.4} {:>9.4} {:>6.1}%{} {:>9} {:>7.2}% {:>6.1}% {:>6.1}%",
            row.label,
            row.workers,
            row.step_time_median_s,
            row.predicted_step_time_s,
            100.0 * row.step_time_ape,
            if row.timed { " " } else { "*" },
            row.step_time_unpreempted_ape
                .map_or("-".to_string(), |e| format!("{:.1}%", 100.0 * e)),
            100.0 * worst,
            100.0 * row.op_time_mape,
            100.0 * row.off_core_share,
        );
    }
    let s = &report.summary;
    eprintln!(
        "peak memory MAPE {:.2}% over {} workers of {} schedules (worst {:.2}%)",
        100.0 * s.peak_memory_mape,
        s.workers,
        s.schedules,
        100.0 * s.peak_memory_max_ape
    );
    eprintln!(
        "step time MAPE {:.1}% over {} schedules with at most {} workers (worst {:.1}%; * not counted)",
        100.0 * s.step_time_mape,
        s.timed_schedules,
        report.cores,
        100.0 * s.step_time_max_ape
    );
    match s.step_time_mape_unpreempted {
        Some(mape) => eprintln!(
            "step time MAPE over unpreempted runs {:.1}% ({} of those schedules had one)",
            100.0 * mape,
            s.unpreempted_schedules
        ),
        None => eprintln!("step time over unpreempted runs: no schedule had an unpreempted run"),
    }
    eprintln!(
        "per-op (pack task) time MAPE {:.1}% (against thread CPU time {:.1}%)",
        100.0 * s.op_time_mape,
        100.0 * s.op_time_mape_cpu
    );
    eprintln!(
        "load average before: {}; after: {}",
        report.load_before, report.load_after
    );
}

/// The first three fields of `/proc/loadavg`, or "unknown".
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".to_string())
}
