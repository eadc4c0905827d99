//! `slimpack plan`: one epoch of a dataset planned step by step (see [`slimpack::plan`]),
//! each step's schedule streamed out as soon as it is planned.
//!
//! Output: `--out-dir DIR` writes one file per step (`step-000001.json`, or `.sir` with
//! `--emit ir`); `--jsonl FILE` writes one schedule JSON document per line. The summary
//! (steps, tokens, predicted time per step and for the epoch) goes to stderr, or as one JSON
//! object to stdout with `--report json`. A progress bar shows on a terminal only.

use anyhow::{bail, Context};
use clap::Args;
use indicatif::ProgressBar;
use std::io::Write;
use std::path::{Path, PathBuf};

use slimpack::plan::{plan_epoch, PlanOptions, PlannedStep};
use slimpack::tune::autotune::{TuneOptions, Verify};
use slimpack::tune::strategy;
use slimpack_codegen::schedule_json;
use slimpack_ir::text;

use super::compile::{Emitted, ReportFormat};
use super::input::{BatchArgs, SpecArgs};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PlanEmit {
    /// The schedule JSON of each step (as `compile --emit json`).
    Json,
    /// The step IR text of each step (as `compile --emit ir`; --out-dir only).
    Ir,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    spec: SpecArgs,
    #[command(flatten)]
    batch: BatchArgs,
    /// Strategy (default: slimpack), tuned on the first step and kept for the epoch.
    #[arg(long, value_name = "NAME")]
    strategy: Option<String>,
    /// Write one file per step into DIR (`step-000001.json`, ...); an earlier plan's step
    /// files of the same form (json or ir) are removed when the first step is written, so that
    /// none can be taken for this plan's, even if it is interrupted (the summary says how many
    /// were past its last step).
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
    /// Write one schedule JSON document per line into FILE (`-`: standard output).
    #[arg(long, value_name = "FILE")]
    jsonl: Option<PathBuf>,
    /// What each step's file holds: json or ir.
    #[arg(long, value_enum, default_value = "json")]
    emit: PlanEmit,
    /// Plan at most N steps (default: the whole epoch).
    #[arg(long, value_name = "N")]
    steps: Option<usize>,
    /// Summary format: text (stderr) or json (one object on stdout).
    #[arg(long, value_enum, default_value = "text")]
    report: ReportFormat,
    /// Do not run the verifier (by default it checks each planned step).
    #[arg(long)]
    no_verify: bool,
    /// Verify every candidate of the tunings, not only the chosen steps (see `compile
    /// --verify-candidates`).
    #[arg(long, conflicts_with = "no_verify")]
    verify_candidates: bool,
    /// Wall-clock budget of the tuning on the first step (see `compile --tune-budget-ms`).
    #[arg(long, value_name = "MS")]
    tune_budget_ms: Option<u64>,
    /// Compile every candidate when tuning (see `compile --no-prune`).
    #[arg(long)]
    no_prune: bool,
    /// The fraction of device memory a step may peak at (default 0.92): tuning keeps the
    /// fastest candidate within it, and a later step over it is re-tuned.
    #[arg(long, value_name = "FRACTION")]
    memory_limit: Option<String>,
    /// Worker threads planning the steps after the first (default: one per core; at most two
    /// steps per worker are in memory). The output is the same on any number.
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Exit 0 even when some step's plan does not fit device memory (without it such a plan
    /// is written whole, then the command exits 3, as `compile` does).
    #[arg(long)]
    allow_oom: bool,
}

/// Where the steps go.
enum Output {
    /// Step files in a directory; `removed`: the step numbers of an earlier plan's files the
    /// first write removed (`None` before it).
    Directory {
        dir: PathBuf,
        removed: Option<Vec<usize>>,
    },
    /// JSON lines, to a file or standard output (named for errors).
    Lines(String, std::io::BufWriter<Box<dyn Write>>),
    Nowhere,
}

impl Output {
    fn open(args: &PlanArgs) -> anyhow::Result<Output> {
        match (&args.out_dir, &args.jsonl) {
            (Some(dir), Some(file)) => bail!(
                "--out-dir {} and --jsonl {} both say where the steps go; give one",
                dir.display(),
                file.display()
            ),
            (Some(dir), None) => {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("--out-dir: cannot create {}", dir.display()))?;
                Ok(Output::Directory {
                    dir: dir.clone(),
                    removed: None,
                })
            }
            (None, Some(file)) => {
                if args.emit == PlanEmit::Ir {
                    bail!("--jsonl holds schedule JSON; --emit ir needs --out-dir");
                }
                if super::output::is_stdout(Some(file)) {
                    let stdout: Box<dyn Write> = Box::new(std::io::stdout());
                    return Ok(Output::Lines(
                        "standard output".into(),
                        std::io::BufWriter::new(stdout),
                    ));
                }
                let handle = std::fs::File::create(file)
                    .with_context(|| format!("--jsonl: cannot create {}", file.display()))?;
                let handle: Box<dyn Write> = Box::new(handle);
                Ok(Output::Lines(
                    file.display().to_string(),
                    std::io::BufWriter::new(handle),
                ))
            }
            (None, None) => Ok(Output::Nowhere),
        }
    }

    fn write(&mut self, emit: PlanEmit, planned: &PlannedStep) -> Result<(), String> {
        let predicted = || serde_json::to_value(&planned.metrics).ok();
        match self {
            Output::Directory { dir, removed } => {
                let (file, extension) = match emit {
                    PlanEmit::Json => {
                        let document = schedule_json::document(&planned.compiled.ir, predicted())
                            .map_err(|e| format!("step {}: {e}", planned.step))?;
                        (Emitted::Schedule(Box::new(document)), "json")
                    }
                    PlanEmit::Ir => (Emitted::Text(text::print(&planned.compiled.ir)), "sir"),
                };
                if removed.is_none() {
                    // The first step clears the directory of an earlier plan's step files of
                    // this form, so that an interrupted run leaves no mix of two plans.
                    *removed = Some(clear_steps(dir, extension).map_err(|e| format!("{e:#}"))?);
                }
                // Written aside and renamed into place: a step file that is a link (to an
                // input, say) is replaced, not written through.
                let name = format!("step-{:06}.{extension}", planned.step);
                let path = dir.join(&name);
                let partial = dir.join(format!(".{name}.partial"));
                let write = |handle| {
                    let mut out = std::io::BufWriter::new(handle);
                    file.write_to(&mut out).and_then(|()| out.flush())
                };
                std::fs::File::create(&partial)
                    .and_then(write)
                    .and_then(|()| std::fs::rename(&partial, &path))
                    .map_err(|e| {
                        // What was written of it (a full disk, a directory in its place).
                        let _ = std::fs::remove_file(&partial);
                        format!("cannot write {}: {e}", path.display())
                    })
            }
            Output::Lines(path, writer) => {
                let document = schedule_json::document(&planned.compiled.ir, predicted())
                    .map_err(|e| format!("step {}: {e}", planned.step))?;
                serde_json::to_writer(&mut *writer, &document)
                    .map_err(|e| format!("cannot write {path}: {e}"))?;
                writeln!(writer).map_err(|e| format!("cannot write {path}: {e}"))
            }
            Output::Nowhere => Ok(()),
        }
    }

    /// Flushes; in a directory, returns how many step files of an earlier, longer plan (past
    /// `steps`) the first write removed.
    fn finish(&mut self, steps: usize) -> anyhow::Result<usize> {
        match self {
            Output::Lines(path, writer) => {
                writer
                    .flush()
                    .with_context(|| format!("cannot write {path}"))?;
                Ok(0)
            }
            Output::Directory { removed, .. } => Ok(removed
                .iter()
                .flatten()
                .filter(|&&step| step > steps)
                .count()),
            Output::Nowhere => Ok(0),
        }
    }
}

/// Removes the step files of form `extension` from `dir`; returns their step numbers.
fn clear_steps(dir: &Path, extension: &str) -> anyhow::Result<Vec<usize>> {
    let mut removed = Vec::new();
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("--out-dir: cannot read {}", dir.display()))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        // A step being written (left by an interrupted plan) is removed too, not counted.
        let partial = partial_step(name);
        let Some((step, ext)) = step_file(partial.unwrap_or(name)) else {
            continue;
        };
        let is_file = entry
            .file_type()
            .is_ok_and(|t| t.is_file() || t.is_symlink());
        if is_file && ext == extension {
            std::fs::remove_file(entry.path())
                .with_context(|| format!("--out-dir: cannot remove {}", entry.path().display()))?;
            if partial.is_none() {
                removed.push(step);
            }
        }
    }
    Ok(removed)
}

/// The step file name a step being written stands for (`.step-000012.json.partial`).
fn partial_step(name: &str) -> Option<&str> {
    name.strip_prefix('.')?.strip_suffix(".partial")
}

/// The step number and extension of a file named exactly as plan names them
/// (`step-000012.json`; not `step-0000012.json`, which plan never writes).
fn step_file(name: &str) -> Option<(usize, &str)> {
    let (stem, extension) = name.strip_prefix("step-")?.split_once('.')?;
    let step = stem
        .parse()
        .ok()
        .filter(|step: &usize| format!("{step:06}") == stem)?;
    matches!(extension, "json" | "sir").then_some((step, extension))
}

pub fn run(args: PlanArgs) -> anyhow::Result<()> {
    let job = args.spec.job()?;
    let inputs = job.inputs(&args.spec, &args.batch);
    super::output::check_distinct(
        &inputs.named(),
        &[args.report.output(), ("--jsonl", args.jsonl.as_deref())],
    )?;
    // Writing the steps replaces, and removes past the last step, files named as steps.
    super::output::check_generated(
        "--out-dir",
        args.out_dir.as_deref(),
        |name| step_file(name).is_some(),
        &inputs.named(),
    )?;
    let name = args.strategy.as_deref().unwrap_or("slimpack");
    let info = strategy::lookup(name).map_err(|e| anyhow::anyhow!("--strategy: {e}"))?;
    if args.steps == Some(0) {
        bail!("--steps 0: plan at least one step");
    }
    if let Some(threads) = args.threads {
        super::input::check_threads(threads)?;
    }
    let (dataset, batch_options) = job.dataset(&args.batch)?;
    let choices = super::input::tuning_choices(&job, args.memory_limit.as_deref())?;
    let options = PlanOptions {
        strategy: info,
        choices: &choices,
        tune: TuneOptions {
            verify: Verify::from_flags(args.no_verify, args.verify_candidates),
            budget: args.tune_budget_ms.map(std::time::Duration::from_millis),
            prune: !args.no_prune,
            per_family: true,
        },
        max_steps: args.steps,
        threads: args.threads,
    };
    let mut output = Output::open(&args)?;
    let bar = progress_bar();
    let summary = plan_epoch(
        &job.spec,
        &dataset,
        &batch_options,
        &options,
        &mut |planned| {
            output.write(args.emit, &planned)?;
            bar.inc(1);
            bar.set_message(format!("step {}", planned.step));
            Ok(())
        },
    )?;
    bar.finish_and_clear();
    let stale = output.finish(summary.steps)?;
    match args.report {
        ReportFormat::Json => println!("{}", serde_json::to_string_pretty(&summary)?),
        ReportFormat::Text => {
            let drained = match summary.drain_steps {
                0 => String::new(),
                1 => " (the last trains what the strategy delayed)".to_string(),
                n => format!(" (the last {n} train what the strategy delayed)"),
            };
            eprintln!(
                "planned {} step{}{drained} of {} ({} samples, {} tokens) with {} ({} of {} candidates, tuned in {:.0} ms)",
                summary.steps,
                if summary.steps == 1 { "" } else { "s" },
                dataset.name,
                summary.samples,
                summary.tokens,
                summary.strategy,
                summary.candidate,
                summary.candidates_tried,
                summary.tune_ms
            );
            eprintln!(
                "  predicted step time {:.3} s mean ({:.3} .. {:.3}), epoch {:.1} s; {} steps over the memory limit of {} ({} over device memory), {} re-planned",
                summary.step_time_mean_s,
                summary.step_time_min_s,
                summary.step_time_max_s,
                summary.epoch_time_s,
                summary.over_limit_steps,
                super::report::gib(summary.memory_limit_bytes),
                summary.oom_steps,
                summary.replanned
            );
            eprintln!(
                "  planning took {:.0} ms ({:.1} ms per step)",
                summary.plan_ms,
                summary.plan_ms / summary.steps as f64
            );
            if summary.next_epoch_tokens > 0 {
                eprintln!(
                    "  the last step's batch is completed with {} tokens of the next epoch \
                     (as a sampler wraps around)",
                    summary.next_epoch_tokens
                );
            }
            if stale > 0 {
                eprintln!("  removed {stale} step files of an earlier, longer plan from --out-dir");
            }
            if let (Some(samples @ 1..), Some(tokens)) =
                (summary.delayed_samples, summary.delayed_tokens)
            {
                eprintln!(
                    "  {samples} samples ({tokens} tokens) the strategy delayed are in no step \
                     (--steps ended the plan before they were drained)"
                );
            }
            if args.out_dir.is_none() && args.jsonl.is_none() {
                eprintln!(
                    "  the steps were not written (--out-dir DIR or --jsonl FILE keeps them)"
                );
            }
        }
    }
    if summary.oom_steps > 0 && !args.allow_oom {
        let written = match args.out_dir.is_some() || args.jsonl.is_some() {
            true => "the plan was written, ",
            false => "",
        };
        return Err(super::exit::Failure::DoesNotFit(format!(
            "{} of the {} steps do not fit device memory ({} each; {written}--allow-oom \
             accepts it)",
            summary.oom_steps,
            summary.steps,
            super::report::gib(job.spec.cluster.gpu.hbm_bytes)
        ))
        .into());
    }
    Ok(())
}

/// A progress bar of steps on a terminal; nothing otherwise (the step count is not known in
/// advance: the bar counts up).
fn progress_bar() -> ProgressBar {
    super::progress::spinner("{spinner} {msg} planned {elapsed}")
}
