//! `slimpack bench`: the strategies side by side on N global batches of a dataset, every one
//! compiled in the same IR, scored by the same simulator, and run by the same rules
//! (`slimpack::tune::run`): tuned on the first K steps (`--tune-steps`), that configuration kept,
//! any step over the memory limit (`--memory-limit`, a fraction of HBM) re-planned and counted,
//! and with `--drain` extra steps until no drawn document is left waiting. A strategy the
//! layout does not support (hybrid-cp with pp > 1) is reported as not applicable.
//!
//! Figures describe the whole run. Every figure of the simulator's `Metrics` is carried into the
//! report, turned into a run figure by its unit (the field name says it): rates and fractions
//! (`mfu`, `efficiency`, `*_per_s`, imbalances, ...) are weighted by step time, so a run figure
//! is a total over a total (a slow step weighs what it costs); seconds (`*_s`, and nested
//! breakdowns of seconds) are means per step; `*_bytes` the highest step; flags (`oom`) any
//! step; per-device figures are left out.
//!
//! Headline: `useful_flops_per_s`, the model FLOPs of the tokens trained (forward and backward,
//! no recomputation, no padding) over the summed step time, all devices together (MFU is the
//! same over the cluster's peak); `speedup_vs_best_peer`, its ratio to the best peer's — the
//! fastest by useful FLOP/s among the strategies that are not slimpack's (`slimpack`,
//! `slimpack-*`) and fit memory on every step; `speedup_vs_megatron_paper`, to `megatron-paper`'s.
//! Speedups are given for runs that fit memory only. Without `--drain`, a strategy that delays
//! documents (wlb) is scored on what it trained, and what it left waiting is reported as its
//! backlog; with `--drain`, every strategy trains the same tokens and useful FLOP/s compares
//! equal work.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::bail;
use clap::Args;
use indicatif::ProgressBar;
use serde::Serialize;
use serde_json::{Map, Value};

use slimpack::tune::run::{
    run_strategy, Progress, RunRules, StepFigures, StrategyRun, DEFAULT_TUNE_STEPS,
};
use slimpack::tune::strategy::{self, StrategyInfo, STRATEGIES};

use super::compile::ReportFormat;
use super::exit::Failure;
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
    /// Number of global batches (steps), drawn in a seeded order (--seed). Default 10.
    #[arg(long, value_name = "N")]
    steps: Option<usize>,
    /// Steps every strategy tunes its configuration on: each candidate is scored on these
    /// steps together (total step time, fitting the memory limit on each). Default 3.
    #[arg(long, value_name = "K")]
    tune_steps: Option<usize>,
    /// The fraction of device memory a step may peak at: tuning keeps configurations within
    /// it, and a step over it is re-planned.
    #[arg(long, default_value = "0.92", value_name = "FRACTION")]
    memory_limit: String,
    /// Add steps that draw nothing new until no strategy holds a drawn document back (wlb's
    /// outlier queues), so every strategy trains the same tokens.
    #[arg(long)]
    drain: bool,
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
    /// Print every candidate configuration tried on the tuning steps, and how it scored (to
    /// stderr).
    #[arg(long, short)]
    verbose: bool,
    /// Instead of the side-by-side run: how planning one step grows with the batch, at
    /// --planning-sizes samples (strategies: --strategies, default megatron,slimpack).
    #[arg(long)]
    planning: bool,
    /// Batch sizes in samples of --planning, comma-separated (default 1000,10000,100000,1000000).
    #[arg(long, value_name = "N,N,..", value_delimiter = ',')]
    planning_sizes: Option<Vec<usize>>,
    /// Runs of each --planning cell (fewer once a cell has taken 10 s); the table gives their
    /// median. Default 3.
    #[arg(long, value_name = "N")]
    planning_repeats: Option<usize>,
}

/// Global batches a side-by-side run draws unless --steps says.
const DEFAULT_STEPS: usize = 10;

/// A row of the report (field names and order are the `--report json` contract; `figures`
/// follow, in name order).
#[derive(Debug, Serialize)]
struct Row {
    name: &'static str,
    /// Steps run: the drawn ones and the drain steps.
    steps: usize,
    drain_steps: usize,
    /// Tokens trained over the run.
    tokens: u64,
    /// Summed step time.
    time_s: f64,
    useful_flops_per_s: f64,
    mfu: f64,
    efficiency: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    schedule_efficiency: Option<f64>,
    speedup_vs_best_peer: Option<f64>,
    speedup_vs_megatron_paper: Option<f64>,
    /// Steps re-planned because the kept configuration exceeded the memory limit.
    replans: usize,
    /// Some step peaks over the memory limit (`--memory-limit`) even after its re-plan: no
    /// configuration of the strategy fit it. (`oom`, among the figures: over device memory.)
    over_limit: bool,
    compile_ms_p50: f64,
    compile_ms_p95: f64,
    /// Every other figure of the simulator, over the run (see the module comment).
    #[serde(flatten)]
    figures: Map<String, Value>,
}

#[derive(Debug, Serialize)]
struct Backlog {
    samples: usize,
    tokens: u64,
}

#[derive(Debug, Serialize)]
struct Kept {
    configurations: Vec<String>,
    steps_run: BTreeMap<String, usize>,
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
    /// Drawn steps (drain steps come on top, per strategy).
    steps: usize,
    /// Steps every strategy was tuned on.
    tune_steps: usize,
    /// The fraction of device memory a step may peak at.
    memory_limit: f64,
    drain: bool,
    /// "search" (every mode tried) or the mode given with --recompute.
    recompute: String,
    rules: String,
    /// The peer the speedups are over (none when no peer ran and fit).
    best_peer: Option<&'static str>,
    /// The configuration each strategy ran with.
    chosen: BTreeMap<&'static str, String>,
    /// Where a strategy kept more than its chosen configuration from tuning (slimpack: the best
    /// of each other family, see `slimpack::tune::kept`): the kept ones, the chosen first, and
    /// how many steps ran each (label with variant; re-planned steps under their re-plan's).
    kept: BTreeMap<&'static str, Kept>,
    /// Samples and tokens still waiting at the end of the run (strategies that delay).
    backlog: BTreeMap<&'static str, Backlog>,
    /// Strategies the layout does not support, and what they need.
    not_applicable: BTreeMap<&'static str, &'static str>,
}

#[derive(Debug, Serialize)]
struct Report {
    config: Config,
    strategies: Vec<Row>,
}

/// The most steps one bench runs (each holds its drawn batch until the report).
const MAX_STEPS: usize = 100_000;

/// The peer `speedup_vs_megatron_paper` is over.
const MEGATRON_PAPER: &str = "megatron-paper";

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let job = args.spec.job()?;
    super::output::check_distinct(
        &[
            &job.inputs(&args.spec, &args.batch).named()[..],
            &[("--dataset", args.dataset.as_deref())],
        ]
        .concat(),
        // The report (a table or JSON) always goes to standard output.
        &[
            ("the report", super::output::stdout_if(true)),
            ("--json", args.json.as_deref()),
        ],
    )?;
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
    if args.planning {
        // The planning table draws one batch per size and tunes on it alone.
        let side_by_side = [
            ("--steps", args.steps.is_some()),
            ("--tune-steps", args.tune_steps.is_some()),
            ("--drain", args.drain),
            ("--global-batch", batch_args.global_batch.is_some()),
            (
                "--global-batch-tokens",
                batch_args.global_batch_tokens.is_some(),
            ),
        ];
        if let Some(flag) = super::input::first_given(side_by_side) {
            bail!("{flag} applies to the side-by-side run, not to --planning (its sizes are --planning-sizes)");
        }
    } else if let Some(flag) = super::input::first_given([
        ("--planning-sizes", args.planning_sizes.is_some()),
        ("--planning-repeats", args.planning_repeats.is_some()),
    ]) {
        bail!("{flag} applies to --planning, which was not given");
    }
    let steps = args.steps.unwrap_or(DEFAULT_STEPS);
    let tune_steps = args.tune_steps.unwrap_or(DEFAULT_TUNE_STEPS);
    if !(1..=MAX_STEPS).contains(&steps) {
        bail!("--steps {steps}: give 1 to {MAX_STEPS} steps");
    }
    if tune_steps == 0 {
        bail!("--tune-steps 0: give at least 1 step to tune on");
    }
    let choices = super::input::tuning_choices(&job, Some(&args.memory_limit))?;
    let memory_limit = choices.memory_limit;
    let strategies = select(args.strategies.as_deref())?;
    let (dataset, options) = job.dataset(&batch_args)?;
    if args.planning {
        let repeats = args
            .planning_repeats
            .unwrap_or(super::bench_planning::DEFAULT_REPEATS);
        let sizes = args
            .planning_sizes
            .unwrap_or(super::bench_planning::DEFAULT_SIZES.to_vec());
        if repeats == 0 {
            bail!("--planning-repeats 0: give at least 1 run");
        }
        if sizes.contains(&0) {
            bail!("--planning-sizes: give positive sample counts, got 0");
        }
        if let Some(pair) = sizes.windows(2).find(|pair| pair[0] >= pair[1]) {
            bail!(
                "--planning-sizes: give increasing sample counts (each row's growth is over the \
                 one before), got {} then {}",
                pair[0],
                pair[1]
            );
        }
        let most = slimpack_ir::batch::MAX_SAMPLES;
        if let Some(size) = sizes.iter().find(|&&size| size > most) {
            bail!("--planning-sizes: {size} samples is more than a batch holds ({most})");
        }
        let strategies = select(Some(
            args.strategies.as_deref().unwrap_or("megatron,slimpack"),
        ))?;
        let rows = super::bench_planning::measure(
            &job.spec,
            &dataset,
            &options,
            &sizes,
            repeats,
            &strategies,
            &choices,
        )?;
        return super::bench_planning::report(&job.spec, &rows, args.report, args.json.as_deref());
    }
    let batches = dataset.global_batches(&options, steps)?;
    let rules = RunRules {
        tune_steps,
        drain: args.drain,
    };
    if let Some(needs) = strategies
        .iter()
        .map(|strategy| strategy.not_applicable(&job.spec))
        .collect::<Option<Vec<_>>>()
    {
        let names: Vec<&str> = strategies.iter().map(|s| s.name).collect();
        bail!(
            "--strategies {}: none applies to {} ({}): nothing to run",
            names.join(","),
            job.spec.parallel,
            needs.join("; ")
        );
    }
    let progress = progress_bar();
    let mut runs = Vec::with_capacity(strategies.len());
    let mut not_applicable = BTreeMap::new();
    for strategy in strategies {
        if let Some(needs) = strategy.not_applicable(&job.spec) {
            not_applicable.insert(strategy.name, needs);
            continue;
        }
        progress.set_message(strategy.name);
        let grow = |units| progress.inc_length(units);
        let advance = |units| progress.inc(units);
        let report = Progress {
            grow: &grow,
            advance: &advance,
        };
        runs.push(run_strategy(
            strategy, &job.spec, &batches, &choices, rules, &report,
        )?);
    }
    progress.finish_and_clear();
    if args.verbose {
        eprint!("{}", tuning_table(&runs));
    }
    let peak_flops = job.spec.cluster.gpu.peak_flops * job.spec.parallel.world() as f64;
    let (strategies, best_peer) = rows(&runs, peak_flops);
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
            steps,
            tune_steps: tune_steps.min(steps),
            memory_limit,
            drain: args.drain,
            recompute: match args.spec.recompute {
                Some(_) => job.spec.model.recompute.to_string(),
                None => "search".to_string(),
            },
            rules: rules_text(tune_steps.min(steps), memory_limit, args.drain),
            best_peer,
            chosen: runs
                .iter()
                .map(|r| (r.strategy.name, r.chosen.clone()))
                .collect(),
            kept: runs
                .iter()
                .filter(|r| r.kept.len() > 1)
                .map(|r| {
                    let mut steps_run = BTreeMap::new();
                    for step in &r.steps {
                        *steps_run.entry(step.configuration.clone()).or_insert(0) += 1;
                    }
                    let configurations = r.kept.clone();
                    (
                        r.strategy.name,
                        Kept {
                            configurations,
                            steps_run,
                        },
                    )
                })
                .collect(),
            backlog: runs
                .iter()
                .filter(|r| r.strategy.admit.is_some())
                .map(|r| {
                    let (samples, tokens) = r.backlog;
                    (r.strategy.name, Backlog { samples, tokens })
                })
                .collect(),
            not_applicable,
        },
        strategies,
    };
    if let Some(path) = &args.json {
        super::output::write(Some(path), &(serde_json::to_string_pretty(&report)? + "\n"))?;
    }
    match args.report {
        ReportFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        ReportFormat::Text => print!("{}", table(&report)),
    }
    none_fits(&report.strategies, memory_limit)
}

/// The run's error where no strategy kept every step within the memory limit (exit 3, as
/// `compile` exits where nothing fits): the report was written, but it compares plans none of
/// which could run.
fn none_fits(rows: &[Row], memory_limit: f64) -> anyhow::Result<()> {
    if rows.is_empty() || rows.iter().any(Row::fits) {
        return Ok(());
    }
    let least = rows
        .iter()
        .map(|row| figure(row, "peak_memory_bytes"))
        .fold(f64::INFINITY, f64::min);
    Err(Failure::DoesNotFit(format!(
        "no strategy fits the memory limit on every step: the least peak of a run is {:.2} GiB \
         (--memory-limit {memory_limit} of device memory; the report marks each run over it)",
        least / (1u64 << 30) as f64
    ))
    .into())
}

/// The rules every strategy ran by, in words (the report's `config.rules`).
fn rules_text(tune_steps: usize, memory_limit: f64, drain: bool) -> String {
    let drain = if drain {
        "extra steps drain what a strategy held back, so every strategy trains the drawn tokens"
    } else {
        "no drain: a strategy that delays documents is scored on what it trained"
    };
    // 92%, 92.5%, 0.01%: the limit as given, to two decimals of a percent.
    let percent = (memory_limit * 1e4).round() / 100.0;
    format!(
        "every strategy tuned on the first {tune_steps} step(s) together (the fastest \
         configuration within {percent}% of device memory on each), kept for every step; a step \
         over {percent}% re-planned on its own batch; {drain}",
    )
}

/// The strategies named by `--strategies`, in the registry's order, or all of them.
fn select(names: Option<&str>) -> anyhow::Result<Vec<&'static StrategyInfo>> {
    let Some(names) = names else {
        // Every strategy but slimpack's ablations (name them to run them).
        return Ok(STRATEGIES
            .iter()
            .filter(|s| !s.name.starts_with("slimpack-"))
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

/// A peer: a strategy that is not slimpack's own (`slimpack` and its `slimpack-*` ablations).
fn is_peer(name: &str) -> bool {
    name != "slimpack" && !name.starts_with("slimpack-")
}

/// A progress bar of compiles on a terminal; nothing otherwise.
fn progress_bar() -> ProgressBar {
    super::progress::bar(0, "{msg:>10} [{bar:32}] {pos}/{len} compiles {elapsed}")
}

/// The rows of the runs (`peak_flops`: the cluster's, all devices) and the best peer.
fn rows(runs: &[StrategyRun], peak_flops: f64) -> (Vec<Row>, Option<&'static str>) {
    let mut rows: Vec<Row> = runs.iter().map(|run| row(run, peak_flops)).collect();
    let fits = |row: &Row| row.fits();
    let best_peer = rows
        .iter()
        .filter(|r| is_peer(r.name) && fits(r))
        .max_by(|a, b| a.useful_flops_per_s.total_cmp(&b.useful_flops_per_s))
        .map(|r| (r.name, r.useful_flops_per_s));
    let paper = rows
        .iter()
        .find(|r| r.name == MEGATRON_PAPER && fits(r))
        .map(|r| r.useful_flops_per_s);
    let over = |base: Option<f64>, row: &Row| {
        base.filter(|&b| b > 0.0 && fits(row))
            .map(|b| row.useful_flops_per_s / b)
    };
    for row in &mut rows {
        row.speedup_vs_best_peer = over(best_peer.map(|(_, flops)| flops), row);
        row.speedup_vs_megatron_paper = over(paper, row);
    }
    (rows, best_peer.map(|(name, _)| name))
}

/// One run's row, speedups left for [`rows`].
fn row(run: &StrategyRun, peak_flops: f64) -> Row {
    let steps: Vec<Value> = run
        .steps
        .iter()
        .map(|s| {
            serde_json::to_value(&s.metrics).expect("Metrics serializes to JSON (a bug otherwise)")
        })
        .collect();
    let times: Vec<f64> = run.steps.iter().map(|s| s.metrics.step_time_s).collect();
    let mut figures = over_run(&steps, &times);
    let mut take = |key: &str| figures.remove(key).and_then(|v| v.as_f64());
    let mfu = take("mfu").unwrap_or(0.0);
    let efficiency = take("efficiency").unwrap_or(0.0);
    let schedule_efficiency = take("schedule_efficiency");
    let mut compile: Vec<f64> = run.steps.iter().map(|s| s.compile_ms).collect();
    compile.sort_by(f64::total_cmp);
    Row {
        name: run.strategy.name,
        steps: run.steps.len(),
        drain_steps: run.steps.iter().filter(|s| s.drain).count(),
        tokens: run.steps.iter().map(|s: &StepFigures| s.tokens).sum(),
        time_s: times.iter().sum(),
        useful_flops_per_s: mfu * peak_flops,
        mfu,
        efficiency,
        schedule_efficiency,
        speedup_vs_best_peer: None,
        speedup_vs_megatron_paper: None,
        replans: run.replanned,
        over_limit: run
            .steps
            .iter()
            .any(|s| s.metrics.peak_memory_bytes > run.memory_limit_bytes),
        compile_ms_p50: percentile(&compile, 0.50),
        compile_ms_p95: percentile(&compile, 0.95),
        figures,
    }
}

impl Row {
    /// Every step within the memory limit (and so within device memory).
    fn fits(&self) -> bool {
        !self.over_limit && self.figures.get("oom") == Some(&Value::Bool(false))
    }
}

/// How a figure of a step becomes a figure of the run, by its unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OverRun {
    /// A rate or a fraction: weighted by step time (a total over a total).
    TimeWeighted,
    /// Seconds: the mean per step.
    MeanPerStep,
    /// Bytes: the highest step.
    Highest,
    /// A flag: set on any step.
    AnyStep,
    /// A breakdown: each part by its own unit.
    Parts,
    /// Per-device figures and anything else: not a run figure.
    Omitted,
}

fn over_run_rule(key: &str, value: &Value) -> OverRun {
    if key.contains("device") {
        return OverRun::Omitted;
    }
    match value {
        Value::Bool(_) => OverRun::AnyStep,
        Value::Object(_) => OverRun::Parts,
        Value::Number(_) if key.ends_with("_per_s") => OverRun::TimeWeighted,
        Value::Number(_) if key.ends_with("_s") => OverRun::MeanPerStep,
        Value::Number(_) if key.ends_with("_bytes") => OverRun::Highest,
        Value::Number(_) => OverRun::TimeWeighted,
        _ => OverRun::Omitted,
    }
}

/// The run figures of steps' figures (JSON objects of the same shape), `times` their step
/// times.
fn over_run(steps: &[Value], times: &[f64]) -> Map<String, Value> {
    let mut run = Map::new();
    let Some(Value::Object(first)) = steps.first() else {
        return run;
    };
    let total_time: f64 = times.iter().sum();
    for (key, sample) in first {
        let values: Vec<&Value> = steps.iter().filter_map(|s| s.get(key)).collect();
        let numbers = || values.iter().filter_map(|v| v.as_f64());
        let figure = match over_run_rule(key, sample) {
            OverRun::TimeWeighted => {
                let weighted: f64 = values
                    .iter()
                    .zip(times)
                    .filter_map(|(v, t)| v.as_f64().map(|v| v * t))
                    .sum();
                Some(Value::from(ratio(weighted, total_time)))
            }
            OverRun::MeanPerStep => Some(Value::from(
                numbers().sum::<f64>() / values.len().max(1) as f64,
            )),
            OverRun::Highest => values
                .iter()
                .filter_map(|v| v.as_u64())
                .max()
                .map(Value::from),
            OverRun::AnyStep => Some(Value::Bool(
                values.iter().any(|v| v.as_bool() == Some(true)),
            )),
            OverRun::Parts => {
                let parts: Vec<Value> = values.iter().map(|v| (*v).clone()).collect();
                Some(Value::Object(over_run(&parts, times)))
            }
            OverRun::Omitted => None,
        };
        if let Some(figure) = figure {
            run.insert(key.clone(), figure);
        }
    }
    run
}

fn ratio(numerator: f64, denominator: f64) -> f64 {
    if denominator > 0.0 {
        numerator / denominator
    } else {
        0.0
    }
}

/// The nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A figure of a row's `figures` (0 when absent).
fn figure(row: &Row, key: &str) -> f64 {
    row.figures.get(key).and_then(Value::as_f64).unwrap_or(0.0)
}

/// `1.23x`, or `-`.
fn times(speedup: Option<f64>) -> String {
    speedup.map_or("-".into(), |s| format!("{s:.2}x"))
}

/// The text report: a header, the table, the loss breakdown when the simulator gives one, and
/// notes.
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
        "rules: {}; recompute: {}",
        config.rules, config.recompute
    );
    let width = report
        .strategies
        .iter()
        .map(|r| r.name.len())
        .chain(config.not_applicable.keys().map(|n| n.len()))
        .max()
        .unwrap_or(0)
        .max("strategy".len());
    let _ = writeln!(
        out,
        "\n{:<width$} {:>5} {:>8} {:>8} {:>10} {:>9} {:>6} {:>6} {:>6} {:>8} {:>8} {:>8} {:>5} {:>17}  config",
        "strategy",
        "steps",
        "re-plans",
        "step s",
        "tokens/s",
        "useful PF",
        "MFU",
        "eff",
        "sched",
        "vs best",
        "vs paper",
        "peak GiB",
        "OOM",
        "compile ms p50/95",
    );
    for row in &report.strategies {
        let _ = writeln!(
            out,
            "{:<width$} {:>5} {:>8} {:>8.3} {:>10.0} {:>9.2} {:>5.1}% {:>5.1}% {:>6} {:>8} {:>8} {:>8.1} {:>5} {:>17}  {}",
            row.name,
            row.steps,
            row.replans,
            figure(row, "step_time_s"),
            figure(row, "tokens_per_s"),
            row.useful_flops_per_s / 1e15,
            100.0 * row.mfu,
            100.0 * row.efficiency,
            row.schedule_efficiency
                .map_or("-".into(), |s| format!("{:.1}%", 100.0 * s)),
            times(row.speedup_vs_best_peer),
            times(row.speedup_vs_megatron_paper),
            figure(row, "peak_memory_bytes") / (1u64 << 30) as f64,
            if row.figures.get("oom") == Some(&Value::Bool(true)) {
                "yes"
            } else if row.over_limit {
                "limit"
            } else {
                "no"
            },
            format!("{:.1}/{:.1}", row.compile_ms_p50, row.compile_ms_p95),
            config.chosen.get(row.name).map_or("", String::as_str),
        );
    }
    for (name, needs) in &config.not_applicable {
        let _ = writeln!(out, "{name:<width$} not applicable ({needs})");
    }
    out.push_str(&losses_table(report, width));
    let _ = writeln!(
        out,
        "\nuseful PF: model PFLOP/s of the tokens trained (no recompute, no padding), all devices; \
         vs best: over {}",
        config.best_peer.unwrap_or("no fitting peer")
    );
    for (name, backlog) in config.backlog.iter().filter(|(_, b)| b.samples > 0) {
        let _ = writeln!(
            out,
            "{name}: {} samples ({} tokens) still delayed at the end of the run (not in its \
             figures; --drain trains them)",
            backlog.samples, backlog.tokens
        );
    }
    out
}

/// The "where the step goes" table, as percentages of the step time, when the simulator's
/// figures carry a `losses` breakdown (its parts in the simulator's order, useful compute
/// first); empty otherwise.
fn losses_table(report: &Report, width: usize) -> String {
    use std::fmt::Write;
    if !report
        .strategies
        .iter()
        .any(|r| r.figures.get("losses").is_some())
    {
        return String::new();
    }
    let parts: Vec<String> = slimpack_machine::sim::Losses::default()
        .entries()
        .iter()
        .map(|(what, _)| format!("{}_s", what.replace(' ', "_")))
        .collect();
    let heading = |part: &str| part.trim_end_matches("_s").replace('_', " ");
    let mut out = String::from("\nwhere the step goes (% of step time):\n");
    let _ = write!(out, "{:<width$}", "strategy");
    for part in &parts {
        let _ = write!(
            out,
            " {:>w$}",
            heading(part),
            w = heading(part).len().max(6)
        );
    }
    out.push('\n');
    for row in &report.strategies {
        let step = figure(row, "step_time_s");
        let _ = write!(out, "{:<width$}", row.name);
        for part in &parts {
            let seconds = row
                .figures
                .get("losses")
                .and_then(|l| l.get(part.as_str()))
                .and_then(Value::as_f64)
                .unwrap_or(0.0);
            let cell = format!("{:.1}%", 100.0 * ratio(seconds, step));
            let _ = write!(out, " {:>w$}", cell, w = heading(part).len().max(6));
        }
        out.push('\n');
    }
    out
}

/// `--verbose`: every candidate of every strategy on the tuning steps.
fn tuning_table(runs: &[StrategyRun]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for run in runs {
        let _ = writeln!(
            out,
            "{}: candidates over the first {} step(s) (* = chosen: the fastest within {:.1} GiB \
             on each)",
            run.strategy.name,
            run.tune_steps,
            run.memory_limit_bytes as f64 / (1u64 << 30) as f64
        );
        for trial in &run.tuning {
            let mark = if trial.candidate.label == run.chosen {
                '*'
            } else {
                ' '
            };
            let _ = writeln!(
                out,
                "   {mark} {:<44} {:>9.3} s {:>7.1} GiB {:>4} {:>8.1} ms",
                trial.candidate.label,
                trial.time_s(),
                trial.peak_bytes() as f64 / (1u64 << 30) as f64,
                if trial.fits(run.memory_limit_bytes) {
                    ""
                } else {
                    "over"
                },
                trial.compile_ms(),
            );
        }
        if run.pruned > 0 {
            let _ = writeln!(
                out,
                "     ({} more not compiled: their lower bound was above the chosen total)",
                run.pruned
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_figures_follow_their_units() {
        let steps = [
            serde_json::json!({
                "step_time_s": 1.0, "tokens_per_s": 100.0, "mfu": 0.5,
                "peak_memory_bytes": 10, "oom": false, "peak_memory_per_device": [10],
                "oom_device": null, "losses": {"recompute_s": 0.25}
            }),
            serde_json::json!({
                "step_time_s": 3.0, "tokens_per_s": 300.0, "mfu": 0.1,
                "peak_memory_bytes": 30, "oom": true, "peak_memory_per_device": [30],
                "oom_device": 4, "losses": {"recompute_s": 0.75}
            }),
        ];
        let run = over_run(&steps, &[1.0, 3.0]);
        assert_eq!(run["step_time_s"], 2.0);
        // 100 tokens + 900 tokens over 4 s.
        assert_eq!(run["tokens_per_s"], 250.0);
        assert_eq!(run["mfu"].as_f64().unwrap(), (0.5 + 0.3) / 4.0);
        assert_eq!(run["peak_memory_bytes"], 30);
        assert_eq!(run["oom"], true);
        assert_eq!(run["losses"]["recompute_s"], 0.5);
        assert!(run.get("peak_memory_per_device").is_none());
        assert!(run.get("oom_device").is_none());
    }

    #[test]
    fn memory_limit_is_a_fraction_of_device_memory() {
        assert_eq!(
            super::super::input::parse_memory_limit("0.92").unwrap(),
            0.92
        );
        assert_eq!(super::super::input::parse_memory_limit("1").unwrap(), 1.0);
        for bad in ["0", "-0.5", "1.5", "92", "92%", "NaN", "lots"] {
            let error = super::super::input::parse_memory_limit(bad)
                .unwrap_err()
                .to_string();
            assert!(error.contains("--memory-limit"), "{bad}: {error}");
        }
    }

    #[test]
    fn slimpack_and_its_ablations_are_no_peers() {
        assert!(!is_peer("slimpack"));
        assert!(!is_peer("slimpack-no-eqsat"));
        assert!(is_peer("megatron"));
        assert!(is_peer("megatron-paper"));
        assert!(is_peer("wlb"));
    }
}
