//! `slimpack bench`: the strategies side by side on N global batches of a dataset, every one
//! compiled in the same IR and scored by the same simulator.
//!
//! Each strategy's run follows the tuner's run policy (`slimpack::tune::run`): tuned once on the
//! first step (every candidate configuration compiled and simulated, the fastest that fits
//! kept), then that configuration on every later step. Strategies that carry state between
//! steps (wlb) get one state per run.
//! Figures describe the whole run: `tokens_per_s` is the tokens of all steps over their summed
//! step time, and `mfu`, `efficiency` and `bubble_fraction` are weighted by step time the same
//! way (a slow step weighs what it costs, never less); `step_time_s` and the imbalances are
//! plain means over the steps, `peak_memory_bytes` the highest step, `oom` any step, compile
//! time p50/p95 over the steps (the chosen configuration's), and the speedup the ratio of run
//! throughputs (tokens/s over megatron's: fair to a strategy that trains fewer tokens in a
//! step, as wlb does when it delays outliers).

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use slimpack::tune::run::{run_strategy, Progress, StepFigures, StrategyRun};
use slimpack::tune::strategy::{self, Choices, StrategyInfo, STRATEGIES};

use super::compile::ReportFormat;
use super::input::{BatchArgs, SpecArgs};

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    spec: SpecArgs,
    #[command(flatten)]
    batch: BatchArgs,
    /// The dataset to draw global batches from (the same as --batch).
    #[arg(long, value_name = "FILE")]
    dataset: Option<PathBuf>,
    /// Number of global batches (steps), drawn in a seeded order (--seed).
    #[arg(long, default_value_t = 10, value_name = "N")]
    steps: usize,
    /// Strategies to run, comma-separated (default: every peer and slimpack; its ablations
    /// run when named, e.g. slimpack-no-eqsat).
    #[arg(long, value_name = "a,b,..")]
    strategies: Option<String>,
    /// Report format: text (a table on stdout) or json (one object on stdout).
    #[arg(long, value_enum, default_value = "text")]
    report: ReportFormat,
    /// Also write the JSON report to this file (whatever --report prints).
    #[arg(long, value_name = "FILE.json")]
    json: Option<std::path::PathBuf>,
    /// Print every candidate configuration tried on step 1, and how it scored (to stderr).
    #[arg(long, short)]
    verbose: bool,
    /// Instead of the side-by-side run: how planning one step grows with the batch, at
    /// --planning-sizes samples (strategies: --strategies, default megatron,slimpack).
    #[arg(long)]
    planning: bool,
    /// Batch sizes in samples of --planning, comma-separated.
    #[arg(long, value_name = "N,N,..", value_delimiter = ',', default_values_t = super::bench_planning::DEFAULT_SIZES)]
    planning_sizes: Vec<usize>,
}

/// A row of the report (field names and order are the `--report json` contract).
#[derive(Debug, Serialize)]
struct Row {
    name: &'static str,
    step_time_s: f64,
    tokens_per_s: f64,
    mfu: f64,
    efficiency: f64,
    dp_imbalance: f64,
    pp_imbalance: f64,
    bubble_fraction: f64,
    peak_memory_bytes: u64,
    oom: bool,
    compile_ms_p50: f64,
    compile_ms_p95: f64,
    speedup_vs_megatron: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Backlog {
    samples: usize,
    tokens: u64,
}

#[derive(Debug, Serialize)]
struct Config {
    model: String,
    cluster: String,
    parallel: String,
    world: u64,
    dataset: String,
    context: Option<u32>,
    global_batch: Option<usize>,
    global_batch_tokens: Option<u64>,
    seed: u64,
    steps: usize,
    /// "search" (every mode tried) or the mode given with --recompute.
    recompute: String,
    tuning: &'static str,
    /// The configuration each strategy ran with.
    chosen: std::collections::BTreeMap<&'static str, String>,
    /// Samples and tokens still delayed at the end of the run (strategies that delay).
    backlog: std::collections::BTreeMap<&'static str, Backlog>,
    /// Steps re-planned to fit memory (strategies that plan every step).
    replanned: std::collections::BTreeMap<&'static str, usize>,
}

#[derive(Debug, Serialize)]
struct Report {
    config: Config,
    strategies: Vec<Row>,
}

const TUNING: &str =
    "per run: every candidate on step 1, the fastest that fits kept for all steps \
                      (strategies that plan every step re-plan a step it does not fit)";

/// The most steps one bench runs (each holds its drawn batch until the report).
const MAX_STEPS: usize = 100_000;

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let job = args.spec.job()?;
    let mut batch_args = args.batch;
    if let Some(dataset) = args.dataset {
        if let Some(batch) = &batch_args.batch {
            bail!(
                "--dataset {} and --batch {} both name the dataset; give one",
                dataset.display(),
                batch.display()
            );
        }
        if let Some(synthetic) = &batch_args.synthetic {
            bail!(
                "--dataset {} and --synthetic {synthetic} both name the dataset; give one",
                dataset.display()
            );
        }
        batch_args.batch = Some(dataset);
    }
    if !(1..=MAX_STEPS).contains(&args.steps) {
        bail!("--steps {}: give 1 to {MAX_STEPS} steps", args.steps);
    }
    let (dataset, options) = job.dataset(&batch_args)?;
    if args.planning {
        let strategies = select(Some(
            args.strategies.as_deref().unwrap_or("megatron,slimpack"),
        ))?;
        let choices = match args.spec.recompute {
            Some(_) => Choices::fixed(job.spec.model.recompute),
            None => Choices::all(),
        };
        return super::bench_planning::run(
            &job.spec,
            &dataset,
            &options,
            &args.planning_sizes,
            &strategies,
            &choices,
            args.report,
        );
    }
    let batches = dataset.global_batches(&options, args.steps)?;
    let strategies = select(args.strategies.as_deref())?;
    let choices = match args.spec.recompute {
        Some(_) => Choices::fixed(job.spec.model.recompute),
        None => Choices::all(),
    };
    let progress = progress_bar();
    let mut runs = Vec::with_capacity(strategies.len());
    for strategy in strategies {
        progress.set_message(strategy.name);
        let grow = |units| progress.inc_length(units);
        let advance = |units| progress.inc(units);
        let report = Progress {
            grow: &grow,
            advance: &advance,
        };
        runs.push(run_strategy(
            strategy, &job.spec, &batches, &choices, &report,
        )?);
    }
    progress.finish_and_clear();
    if args.verbose {
        eprint!("{}", tuning_table(&runs));
    }
    let report = Report {
        config: Config {
            model: job.spec.model.name.clone(),
            cluster: job.spec.cluster.name.clone(),
            parallel: job.spec.parallel.to_string(),
            world: job.spec.parallel.world(),
            dataset: dataset.name.clone(),
            context: options.context,
            global_batch: options.global_batch,
            global_batch_tokens: options.global_batch_tokens,
            seed: options.seed,
            steps: args.steps,
            recompute: match args.spec.recompute {
                Some(_) => job.spec.model.recompute.as_str().to_string(),
                None => "search".to_string(),
            },
            tuning: TUNING,
            chosen: runs
                .iter()
                .map(|r| (r.strategy.name, r.chosen.clone()))
                .collect(),
            backlog: runs
                .iter()
                .filter(|r| r.strategy.admit.is_some())
                .map(|r| {
                    let (samples, tokens) = r.backlog;
                    (r.strategy.name, Backlog { samples, tokens })
                })
                .collect(),
            replanned: runs
                .iter()
                .filter(|r| r.strategy.replans)
                .map(|r| (r.strategy.name, r.replanned))
                .collect(),
        },
        strategies: rows(&runs),
    };
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    match args.report {
        ReportFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        ReportFormat::Text => print!("{}", table(&report)),
    }
    Ok(())
}

/// The strategies named by `--strategies`, in the registry's order, or all of them.
fn select(names: Option<&str>) -> anyhow::Result<Vec<&'static StrategyInfo>> {
    let Some(names) = names else {
        // Every strategy but slimpack's ablations (name them to run them).
        return Ok(STRATEGIES
            .iter()
            .filter(|s| !s.name.starts_with("slimpack-no-"))
            .collect());
    };
    let mut wanted = Vec::new();
    for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let strategy = strategy::lookup(name).map_err(|e| anyhow::anyhow!("--strategies: {e}"))?;
        if !wanted
            .iter()
            .any(|s: &&StrategyInfo| s.name == strategy.name)
        {
            wanted.push(strategy);
        }
    }
    if wanted.is_empty() {
        bail!("--strategies: no strategy named");
    }
    Ok(STRATEGIES
        .iter()
        .filter(|s| wanted.iter().any(|w| w.name == s.name))
        .collect())
}

/// A progress bar on a terminal; nothing otherwise.
fn progress_bar() -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(0);
    if let Ok(style) =
        ProgressStyle::with_template("{msg:>10} [{bar:32}] {pos}/{len} compiles {elapsed}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

fn rows(runs: &[StrategyRun]) -> Vec<Row> {
    let mean = |run: &StrategyRun, f: &dyn Fn(&StepFigures) -> f64| {
        run.steps.iter().map(f).sum::<f64>() / run.steps.len() as f64
    };
    // A per-step rate over the whole run: each step weighted by its time.
    let over_run = |run: &StrategyRun, f: &dyn Fn(&StepFigures) -> f64| {
        let time: f64 = run.steps.iter().map(|s| s.metrics.step_time_s).sum();
        let weighted: f64 = run.steps.iter().map(|s| f(s) * s.metrics.step_time_s).sum();
        if time > 0.0 {
            weighted / time
        } else {
            0.0
        }
    };
    let megatron = runs
        .iter()
        .find(|r| r.strategy.name == "megatron")
        .map(|r| over_run(r, &|s| s.metrics.tokens_per_s));
    runs.iter()
        .map(|run| {
            let mean = |f: &dyn Fn(&StepFigures) -> f64| mean(run, f);
            let over_run = |f: &dyn Fn(&StepFigures) -> f64| over_run(run, f);
            let mut compile: Vec<f64> = run.steps.iter().map(|s| s.compile_ms).collect();
            compile.sort_by(f64::total_cmp);
            let tokens_per_s = over_run(&|s| s.metrics.tokens_per_s);
            Row {
                name: run.strategy.name,
                step_time_s: mean(&|s| s.metrics.step_time_s),
                tokens_per_s,
                mfu: over_run(&|s| s.metrics.mfu),
                efficiency: over_run(&|s| s.metrics.efficiency),
                dp_imbalance: mean(&|s| s.metrics.dp_imbalance),
                pp_imbalance: mean(&|s| s.metrics.pp_imbalance),
                bubble_fraction: over_run(&|s| s.metrics.bubble_fraction),
                peak_memory_bytes: run
                    .steps
                    .iter()
                    .map(|s| s.metrics.peak_memory_bytes)
                    .max()
                    .unwrap_or(0),
                oom: run.steps.iter().any(|s| s.metrics.oom),
                compile_ms_p50: percentile(&compile, 0.50),
                compile_ms_p95: percentile(&compile, 0.95),
                speedup_vs_megatron: megatron.filter(|&m| m > 0.0).map(|m| tokens_per_s / m),
            }
        })
        .collect()
}

/// The nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The text report: a header, the table, and notes.
fn table(report: &Report) -> String {
    use std::fmt::Write;
    let config = &report.config;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} on {} ({}, {} devices), {} steps of {} from {} (seed {}), context {}",
        config.model,
        config.cluster,
        config.parallel,
        config.world,
        config.steps,
        budget(config),
        config.dataset,
        config.seed,
        config.context.map_or("none".into(), |c| c.to_string()),
    );
    let _ = writeln!(
        out,
        "tuning: {}; recompute: {}",
        config.tuning, config.recompute
    );
    let width = report
        .strategies
        .iter()
        .map(|r| r.name.len())
        .max()
        .unwrap_or(0)
        .max("strategy".len());
    let _ = writeln!(
        out,
        "\n{:<width$} {:>9} {:>11} {:>6} {:>6} {:>6} {:>6} {:>6} {:>9} {:>4} {:>17} {:>7}  config",
        "strategy",
        "step s",
        "tokens/s",
        "MFU",
        "eff",
        "DP imb",
        "PP imb",
        "bubble",
        "peak GiB",
        "OOM",
        "compile ms p50/95",
        "speedup",
    );
    for row in &report.strategies {
        let _ = writeln!(
            out,
            "{:<width$} {:>9.3} {:>11.0} {:>5.1}% {:>5.1}% {:>6.2} {:>6.2} {:>5.1}% {:>9.1} {:>4} {:>17} {:>7}  {}",
            row.name,
            row.step_time_s,
            row.tokens_per_s,
            100.0 * row.mfu,
            100.0 * row.efficiency,
            row.dp_imbalance,
            row.pp_imbalance,
            100.0 * row.bubble_fraction,
            row.peak_memory_bytes as f64 / (1u64 << 30) as f64,
            if row.oom { "yes" } else { "no" },
            format!("{:.1}/{:.1}", row.compile_ms_p50, row.compile_ms_p95),
            row.speedup_vs_megatron
                .map_or("-".into(), |s| format!("{s:.2}x")),
            config.chosen.get(row.name).map_or("", String::as_str),
        );
    }
    for (name, steps) in config.replanned.iter().filter(|(_, &steps)| steps > 0) {
        let _ = writeln!(
            out,
            "\n{name}: {steps} step(s) re-planned because the tuned configuration did not fit"
        );
    }
    for (name, backlog) in &config.backlog {
        let _ = writeln!(
            out,
            "\n{name}: {} samples ({} tokens) still delayed at the end of the run (not in its figures)",
            backlog.samples, backlog.tokens
        );
    }
    out
}

/// `--verbose`: every candidate of every strategy on step 1.
fn tuning_table(runs: &[StrategyRun]) -> String {
    use std::fmt::Write;
    let mut out = String::from("candidates on step 1 (* = chosen: the fastest that fits):\n");
    for run in runs {
        let _ = writeln!(out, "  {}", run.strategy.name);
        for evaluation in &run.tuning {
            let metrics = &evaluation.metrics;
            let mark = if evaluation.candidate.label == run.chosen {
                '*'
            } else {
                ' '
            };
            let _ = writeln!(
                out,
                "   {mark} {:<44} {:>9.3} s {:>7.1} GiB {:>4} {:>8.1} ms",
                evaluation.candidate.label,
                metrics.step_time_s,
                metrics.peak_memory_bytes as f64 / (1u64 << 30) as f64,
                if metrics.oom { "OOM" } else { "" },
                evaluation.compile_ms,
            );
        }
    }
    out
}

fn budget(config: &Config) -> String {
    match (config.global_batch, config.global_batch_tokens) {
        (Some(samples), _) => format!("{samples} samples"),
        (None, Some(tokens)) => format!("{tokens} tokens"),
        (None, None) => "the whole dataset".into(),
    }
}
