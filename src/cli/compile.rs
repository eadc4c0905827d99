//! `slimpack compile`: spec + batch in, step IR out, with a report.

use anyhow::bail;
use clap::{Args, ValueEnum};
use std::io::Write;
use std::path::{Path, PathBuf};

use slimpack::tune::autotune;
use slimpack::tune::strategy::{self, StrategyState};
use slimpack::{compile, CompileOptions};
use slimpack_codegen::schedule_json;
use slimpack_ir::step::Phase;
use slimpack_ir::{text, StepIr};
use slimpack_machine::sim::{self, SimResult};
use slimpack_passes::{ManagerOptions, PassRecord, PrintOptions};

use super::input::{BatchArgs, SpecArgs};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Emit {
    /// The step IR in its canonical text form.
    Ir,
    /// The schedule JSON for trainers: per device its ops, per pack its varlen layout
    /// (docs/schedule.schema.json).
    Json,
    /// The schedule in the slimpack MLIR dialect (needs --features mlir; docs/CODEGEN.md).
    Mlir,
    /// The schedule driver as LLVM IR, calling the runtime's C ABI (needs --features mlir).
    Llvm,
    /// The GPU kernels as PTX for the cluster's GPU, sm_80 or sm_90 (needs --features llvm).
    Ptx,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    Text,
    Json,
}

impl ReportFormat {
    /// The report as an output of [`super::output::check_distinct`]: JSON goes to standard
    /// output (text to stderr).
    pub fn output(self) -> super::output::Named<'static> {
        (
            "--report json",
            super::output::stdout_if(self == ReportFormat::Json),
        )
    }
}

/// Pass-manager flags shared by `compile` and `opt`.
#[derive(Debug, Args)]
pub struct PassManagerArgs {
    /// Print the IR after every pass (to stderr).
    #[arg(long)]
    print_ir_after_all: bool,
    /// Print the IR after the named pass (repeatable).
    #[arg(long, value_name = "PASS")]
    print_ir_after: Vec<String>,
    /// Print the IR before the named pass (repeatable).
    #[arg(long, value_name = "PASS")]
    print_ir_before: Vec<String>,
    /// Write numbered before/after IR dumps of every pass into DIR.
    #[arg(long, value_name = "DIR")]
    dump_dir: Option<PathBuf>,
    /// Print each pass's wall time (to stderr).
    #[arg(long)]
    time_passes: bool,
    /// Do not run the verifier after each pass (an IR file `opt` reads is verified all the
    /// same: passes assume a valid step).
    #[arg(long)]
    no_verify: bool,
}

impl PassManagerArgs {
    /// The pass manager's options; a pass named in `--print-ir-after`/`--print-ir-before` must
    /// exist (a typo would print nothing, silently).
    pub fn options(&self) -> anyhow::Result<ManagerOptions> {
        for (flag, names) in [
            ("--print-ir-after", &self.print_ir_after),
            ("--print-ir-before", &self.print_ir_before),
        ] {
            for name in names {
                slimpack_passes::registry::lookup(name)
                    .map_err(|error| anyhow::anyhow!("{flag}: {error}"))?;
            }
        }
        Ok(ManagerOptions {
            verify: !self.no_verify,
            verify_result_only: false,
            print: PrintOptions {
                after_all: self.print_ir_after_all,
                after: self.print_ir_after.clone(),
                before: self.print_ir_before.clone(),
            },
            dump_dir: self.dump_dir.clone(),
        })
    }

    /// `--time-passes`: a table on stderr, each pass's wall time and the verifier's after it.
    pub fn report_times(&self, records: &[PassRecord]) {
        if !self.time_passes {
            return;
        }
        eprintln!("pass timing (wall):");
        print_pass_times(records);
    }

    /// `--time-passes` of a strategy compile: every candidate's passes (the chosen one is
    /// marked), then the chosen step's passes as [`PassManagerArgs::report_times`] prints them.
    pub fn report_candidate_times(&self, choice: &autotune::Choice) {
        if !self.time_passes {
            return;
        }
        for (index, evaluation) in choice.evaluations.iter().enumerate() {
            let chosen = if index == choice.chosen {
                " (chosen)"
            } else {
                ""
            };
            eprintln!(
                "candidate {}{}{chosen}: {:.3} ms compiled, step {:.6} s, peak {:.2} GiB",
                evaluation.candidate.label,
                match evaluation.variant.as_str() {
                    "" => String::new(),
                    variant => format!(",{variant}"),
                },
                evaluation.compile_ms,
                evaluation.metrics.step_time_s,
                evaluation.metrics.peak_memory_bytes as f64 / f64::from(1u32 << 30)
            );
            print_pass_times(&evaluation.passes);
        }
        if choice.pruned > 0 {
            eprintln!(
                "{} candidates pruned: their lower bound was above the best fitting step",
                choice.pruned
            );
        }
        if choice.skipped > 0 {
            eprintln!(
                "{} candidates skipped: the tuning budget was spent",
                choice.skipped
            );
        }
    }
}

fn print_pass_times(records: &[PassRecord]) {
    let total: f64 = records.iter().map(|r| r.ms).sum();
    let verify: f64 = records.iter().map(|r| r.verify_ms).sum();
    for record in records {
        eprintln!(
            "  {:>10.3} ms  {:>10.3} ms verify  {}",
            record.ms, record.verify_ms, record.pipeline_entry
        );
    }
    eprintln!("  {total:>10.3} ms  {verify:>10.3} ms verify  total");
}

/// Simulation outputs shared by `compile` and `simulate`.
#[derive(Debug, Args)]
pub struct SimulationArgs {
    /// Write a Chrome-trace / Perfetto JSON timeline of the simulated step.
    #[arg(long, value_name = "FILE.json")]
    trace: Option<PathBuf>,
    /// Draw the simulated step as an SVG timeline (one row per device group).
    #[arg(long, value_name = "FILE.svg")]
    timeline: Option<PathBuf>,
}

impl SimulationArgs {
    /// The files these flags write (for [`super::output::check_distinct`]).
    pub fn outputs(&self) -> [super::output::Named<'_>; 2] {
        [
            ("--trace", self.trace.as_deref()),
            ("--timeline", self.timeline.as_deref()),
        ]
    }

    /// True when a picture was asked for.
    pub fn wanted(&self) -> bool {
        self.trace.is_some() || self.timeline.is_some()
    }

    /// Simulates `ir`, timed (milliseconds); the pictures are written by [`Self::write`].
    pub fn simulate(&self, ir: &StepIr) -> anyhow::Result<(SimResult, f64)> {
        let start = std::time::Instant::now();
        let result = sim::simulate(ir, &slimpack::machine::machine_model(&ir.spec))?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        Ok((result, ms))
    }

    /// Writes the trace and timeline asked for.
    pub fn write(&self, result: &SimResult) -> anyhow::Result<()> {
        if let Some(path) = &self.trace {
            super::output::write(Some(path), &sim::trace::chrome_trace(result))?;
        }
        if let Some(path) = &self.timeline {
            super::output::write(Some(path), &sim::svg::timeline(result))?;
        }
        Ok(())
    }
}

#[derive(Debug, Args)]
pub struct CompileArgs {
    #[command(flatten)]
    spec: SpecArgs,
    #[command(flatten)]
    batch: BatchArgs,
    /// Strategy to compile with (default: slimpack): slimpack or a peer (padding, megatron,
    /// bfd, ff, kk, wlb, hybrid-cp); its candidate configurations are simulated and the fastest
    /// that fits memory is kept. Give --passes instead to run an explicit pipeline.
    #[arg(long, value_name = "NAME")]
    strategy: Option<String>,
    /// slimpack ablation: backward packs mirror the forward packs.
    #[arg(long)]
    no_asymmetric: bool,
    /// slimpack ablation: no DP-Merge groups.
    #[arg(long)]
    no_dp_merge: bool,
    /// slimpack ablation: whole samples, no slices.
    #[arg(long)]
    no_slicing: bool,
    /// slimpack ablation: no e-graph refinement.
    #[arg(long)]
    no_eqsat: bool,
    /// slimpack ablation: whole backwards (no zero-bubble schedules).
    #[arg(long)]
    no_zero_bubble: bool,
    /// slimpack ablation: one recomputation mode per step (no per-stage modes).
    #[arg(long)]
    no_stage_recompute: bool,
    /// slimpack ablation: per-stage recomputation without per-pack rungs.
    #[arg(long)]
    no_pack_recompute: bool,
    /// slimpack ablation: a DP rank's plain replica and DP-Merge group run one after the other.
    #[arg(long)]
    no_interleave: bool,
    /// Run this explicit pass pipeline instead of a strategy, e.g. 'slice{size=8192}' (see
    /// `slimpack passes`); an empty pipeline (--passes '') gives the logical IR.
    #[arg(long, value_name = "PIPELINE")]
    passes: Option<String>,
    /// Write the plan and exit 0 even when it does not fit device memory or, for a strategy, the
    /// memory limit (otherwise: exit 3).
    #[arg(long)]
    allow_oom: bool,
    /// Compile the N-th global batch of the seeded stream (1: the first, as `plan` numbers its
    /// steps) instead of the first.
    #[arg(long, value_name = "N")]
    step: Option<usize>,
    /// Wall-clock budget of a strategy's tuning: candidates not started when it is spent are
    /// skipped (the first always runs; the choice then depends on the machine's speed).
    #[arg(long, value_name = "MS")]
    tune_budget_ms: Option<u64>,
    /// Verify every candidate of a strategy's tuning, not only the chosen step (for testing the
    /// passes: a broken candidate fails the compile though it would not have been chosen).
    #[arg(long, conflicts_with = "no_verify")]
    verify_candidates: bool,
    /// Compile and simulate every candidate of a strategy; by default a candidate whose lower
    /// bound on the step time (from the machine model) is above the best fitting step found
    /// is skipped, which chooses the same candidate.
    #[arg(long)]
    no_prune: bool,
    /// The fraction of device memory a strategy's chosen configuration may peak at (default
    /// 0.92): tuning keeps the fastest candidate within it.
    #[arg(long, value_name = "FRACTION")]
    memory_limit: Option<String>,
    /// What to emit: ir, json; mlir, llvm (feature `mlir`); ptx (feature `llvm`).
    #[arg(long, value_enum)]
    emit: Option<Emit>,
    /// Write the emitted form here (default: standard output).
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Report format: text (stderr) or json (one object on stdout).
    #[arg(long, value_enum, default_value = "text")]
    report: ReportFormat,
    #[command(flatten)]
    manager: PassManagerArgs,
    #[command(flatten)]
    pictures: SimulationArgs,
}

impl CompileArgs {
    /// The strategy to run, ablations applied (`slimpack` + `--no-eqsat` is
    /// `slimpack-no-eqsat`): `--strategy`, or slimpack when neither it nor `--passes` is given;
    /// `None` with `--passes`.
    fn strategy_name(&self) -> anyhow::Result<Option<String>> {
        let ablations: Vec<&str> = [
            (self.no_asymmetric, "asymmetric"),
            (self.no_dp_merge, "dp-merge"),
            (self.no_slicing, "slicing"),
            (self.no_eqsat, "eqsat"),
            (self.no_zero_bubble, "zero-bubble"),
            (self.no_stage_recompute, "stage-recompute"),
            (self.no_pack_recompute, "pack-recompute"),
            (self.no_interleave, "interleave"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, idea)| *idea)
        .collect();
        if let Some(pipeline) = &self.passes {
            if let Some(strategy) = &self.strategy {
                bail!("--strategy {strategy} and --passes '{pipeline}' both say what to run; give one");
            }
            if let Some(idea) = ablations.first() {
                bail!("--no-{idea} applies to --strategy slimpack, not to --passes");
            }
            return Ok(None);
        }
        match (
            self.strategy.as_deref().or(Some("slimpack")),
            ablations.as_slice(),
        ) {
            (strategy, []) => Ok(strategy.map(str::to_string)),
            (Some("slimpack"), [idea]) => Ok(Some(format!("slimpack-no-{idea}"))),
            (Some("slimpack"), _) => bail!(
                "give one ablation flag at a time (--no-{})",
                ablations.join(", --no-")
            ),
            _ => bail!("--no-{} applies to --strategy slimpack", ablations[0]),
        }
    }
}

/// What `--strategy` chose: the strategy, its candidate's label, and how many were tried.
struct Chosen {
    strategy: &'static str,
    label: String,
    candidates: usize,
    pruned: usize,
    /// Candidates not started because `--tune-budget-ms` was spent.
    skipped: usize,
}

pub fn run(args: CompileArgs) -> anyhow::Result<()> {
    let [trace, timeline] = args.pictures.outputs();
    // The step goes to standard output unless -o names a file; the JSON report always does.
    let step_out = match args.output.as_deref() {
        None => super::output::stdout_if(args.emit.is_some()),
        given => given,
    };
    let job = args.spec.job()?;
    let inputs = job.inputs(&args.spec, &args.batch);
    super::output::check_distinct(
        &inputs.named(),
        &[args.report.output(), ("-o", step_out), trace, timeline],
    )?;
    let strategy = args.strategy_name()?;
    let manager = args.manager.options()?;
    super::output::check_generated(
        "--dump-dir",
        manager.dump_dir.as_deref(),
        super::output::is_dump_name,
        &[&inputs.named()[..], &[("-o", step_out), trace, timeline]].concat(),
    )?;
    // The strategy's state carried from step to step (wlb's outlier queues): `--step N` admits
    // the batches before N first, so that step N trains what `plan`'s step N trains.
    let info = match &strategy {
        Some(name) => Some(strategy::lookup(name).map_err(|e| anyhow::anyhow!("--strategy: {e}"))?),
        None => None,
    };
    let mut state = StrategyState::default();
    let batch = match args.step {
        None => job.batch(&args.batch)?,
        Some(0) => bail!("--step 0: steps are numbered from 1"),
        Some(step) => {
            let (dataset, options) = job.dataset(&args.batch)?;
            let mut stream = dataset.batch_stream(&options)?;
            let mut batch = stream.next_batch()?;
            // `plan`'s steps: the first epoch's (the stream would go on into the next).
            for drawn in 1..step {
                if let Some(info) = info.filter(|info| info.admit.is_some()) {
                    autotune::admit(info, &mut state, &job.spec, &batch);
                }
                if stream.epoch_done() {
                    let steps = match drawn {
                        1 => "1 step".to_string(),
                        n => format!("{n} steps"),
                    };
                    bail!("--step {step}: the epoch has {steps} (`slimpack plan` lists them)");
                }
                batch = stream.next_batch()?;
            }
            batch
        }
    };
    let emit = args.emit.or(args.output.as_ref().map(|_| Emit::Ir));
    // Samples and tokens a strategy delayed to a later step (wlb's outlier queues).
    let mut delayed: Option<(usize, u64)> = None;
    if strategy.is_none() && args.tune_budget_ms.is_some() {
        bail!("--tune-budget-ms applies to a strategy's tuning, not to --passes");
    }
    if strategy.is_none() && args.no_prune {
        bail!("--no-prune applies to a strategy's tuning, not to --passes");
    }
    if strategy.is_none() && args.verify_candidates {
        bail!("--verify-candidates applies to a strategy's tuning, not to --passes (which verifies every pass)");
    }
    if strategy.is_none() && args.memory_limit.is_some() {
        bail!("--memory-limit applies to a strategy's tuning, not to --passes");
    }
    // The bytes a tuned plan may peak at (`--memory-limit`, default 0.92 of HBM) and the fraction.
    let mut memory_limit: Option<(u64, f64)> = None;
    let (compiled, chosen) = match info {
        Some(info) => {
            let mut choices = super::input::tuning_choices(&job, args.memory_limit.as_deref())?;
            // The dialect and the C ABI run one model chunk per device, whole backwards and
            // one recomputation mode per step.
            if matches!(emit, Some(Emit::Mlir | Emit::Llvm)) {
                choices = choices
                    .one_chunk_per_device()
                    .whole_backwards()
                    .one_mode_per_step();
            }
            memory_limit = Some((choices.memory_limit_for(&job.spec), choices.memory_limit));
            let batch = autotune::admit(info, &mut state, &job.spec, &batch);
            delayed = state.wlb.as_ref().map(|wlb| wlb.delay.backlog());
            let tune = autotune::TuneOptions {
                verify: autotune::Verify::from_flags(!manager.verify, args.verify_candidates),
                budget: args.tune_budget_ms.map(std::time::Duration::from_millis),
                prune: !args.no_prune,
                // One step: nothing is kept beside the choice.
                per_family: false,
            };
            let choice = autotune::choose_with(info, &job.spec, &batch, &state, &choices, &tune)?;
            args.manager.report_candidate_times(&choice);
            let chosen = Chosen {
                strategy: info.name,
                label: match choice.best().variant.as_str() {
                    "" => choice.best().candidate.label.clone(),
                    variant => format!("{},{variant}", choice.best().candidate.label),
                },
                candidates: choice.candidates_offered(),
                pruned: choice.pruned,
                skipped: choice.skipped,
            };
            let mut compiled = choice.compiled;
            if manager.shows_ir() {
                compiled = slimpack::compile::replay_shown(
                    compiled,
                    &batch,
                    &manager,
                    &mut std::io::stderr(),
                )?;
            } else {
                slimpack::compile::lower(&mut compiled, &manager, &mut std::io::stderr())?;
            }
            (compiled, Some(chosen))
        }
        None => {
            let options = CompileOptions {
                pipeline: args.passes.clone().unwrap_or_default(),
                manager,
            };
            (
                compile(&job.spec, &batch, &options, &mut std::io::stderr())?,
                None,
            )
        }
    };
    args.manager.report_times(&compiled.passes);
    let simulation = if compiled.ir.phase() >= Phase::Scheduled {
        Some(args.pictures.simulate(&compiled.ir)?)
    } else if args.pictures.wanted() {
        bail!(
            "--trace/--timeline need a scheduled step, but the pipeline stops at phase '{}' (use --strategy or add the packing and scheduling passes)",
            compiled.ir.phase()
        );
    } else {
        None
    };
    if let Some((result, _)) = &simulation {
        let candidates = chosen.as_ref().map_or(1, |c| c.candidates);
        if result.metrics.oom && !args.allow_oom {
            return Err(does_not_fit(&compiled.ir, &result.metrics, candidates).into());
        }
        // Tuning keeps the fastest candidate within the limit, or the least memory-hungry when
        // none is: then the plan the user asked for does not exist.
        if let Some((limit, fraction)) = memory_limit {
            if result.metrics.peak_memory_bytes > limit && !args.allow_oom {
                // Pruning needs a fitting step, so none was pruned: some may have been skipped.
                let skipped = chosen.as_ref().map_or(0, |c| c.skipped);
                let metrics = &result.metrics;
                return Err(
                    over_limit(metrics, candidates - skipped, skipped, limit, fraction).into(),
                );
            }
        }
    }
    // A plan refused above writes nothing, pictures included.
    if let Some((result, _)) = &simulation {
        args.pictures.write(result)?;
    }
    if let Some(emit) = emit {
        let metrics = simulation.as_ref().map(|(result, _)| &result.metrics);
        emitted(emit, &compiled.ir, metrics)?.write(args.output.as_deref())?;
    }
    let mut report = compiled.report(
        simulation
            .as_ref()
            .map(|(result, ms)| (&result.metrics, *ms)),
    );
    report.documents_empty = batch.documents_empty;
    if let Some((samples, tokens)) = delayed {
        report.delayed_samples = Some(samples as u64);
        report.delayed_tokens = Some(tokens);
    }
    match args.report {
        ReportFormat::Json => {
            let mut value = serde_json::to_value(&report)?;
            if let Some(chosen) = &chosen {
                value["strategy"] = chosen.strategy.into();
                value["candidate"] = chosen.label.clone().into();
                value["candidates_tried"] = chosen.candidates.into();
                value["candidates_pruned"] = chosen.pruned.into();
            }
            println!("{}", serde_json::to_string_pretty(&value)?)
        }
        ReportFormat::Text => {
            eprintln!(
                "compiled {} samples ({} tokens, {} documents, {} cut at context {}, {} empty skipped) from {}",
                report.samples,
                report.tokens,
                report.documents,
                report.documents_cut,
                report.context.map_or("none".to_string(), |c| c.to_string()),
                report.documents_empty,
                report.source
            );
            if let (Some(samples), Some(tokens)) = (report.delayed_samples, report.delayed_tokens) {
                eprintln!(
                    "  delayed to a later step: {samples} samples ({tokens} tokens), not in this schedule"
                );
            }
            eprintln!(
                "  {} on {} ({}, {} devices): phase {}, {} slices, {} packs, {} replicas, {:.2} ms",
                report.model,
                report.cluster,
                report.parallel,
                report.world,
                report.phase,
                report.slices,
                report.packs,
                report.replicas,
                report.compile_ms
            );
            let per_node = u64::from(compiled.ir.spec.cluster.gpus_per_node);
            if report.world % per_node != 0 {
                eprintln!(
                    "  note: {} devices fill {} nodes of {} in rank order; the last node holds {}",
                    report.world,
                    compiled.ir.spec.nodes(),
                    per_node,
                    report.world % per_node
                );
            }
            if let Some(chosen) = &chosen {
                let cut = match (chosen.pruned, chosen.skipped) {
                    (0, 0) => String::new(),
                    (pruned, 0) => format!(" ({pruned} ruled out by their lower bounds)"),
                    (0, skipped) => format!(" ({skipped} skipped: the budget was spent)"),
                    (pruned, skipped) => format!(
                        " ({pruned} ruled out by their lower bounds, {skipped} skipped: the budget was spent)"
                    ),
                };
                eprintln!(
                    "  strategy {}: chose {} of {} candidates{cut}",
                    chosen.strategy, chosen.label, chosen.candidates
                );
            }
            if let Some((result, ms)) = &simulation {
                super::report::print_metrics(&result.metrics, *ms);
            }
        }
    }
    Ok(())
}

/// The exit-3 error: the best plan found peaks above device memory.
fn does_not_fit(ir: &StepIr, metrics: &sim::Metrics, candidates: usize) -> super::exit::Failure {
    let capacity = slimpack::machine::machine_model(&ir.spec)
        .memory()
        .capacity_bytes();
    let tried = match candidates {
        1 => "the plan".to_string(),
        n => format!("the best of {n} candidates"),
    };
    super::exit::Failure::DoesNotFit(format!(
        "the plan does not fit device memory: {tried} peaks at {} on device {}, capacity {} of a '{}' device (--allow-oom writes it anyway)",
        super::report::gib(metrics.peak_memory_bytes),
        metrics.oom_device.unwrap_or(0),
        super::report::gib(capacity),
        ir.spec.cluster.gpu.name
    ))
}

/// The exit-3 error: no candidate of the strategy peaks within the memory limit.
fn over_limit(
    metrics: &sim::Metrics,
    candidates: usize,
    skipped: usize,
    limit: u64,
    fraction: f64,
) -> super::exit::Failure {
    let device = metrics
        .peak_memory_per_device
        .iter()
        .position(|&bytes| bytes == metrics.peak_memory_bytes)
        .unwrap_or(0);
    let tried = match candidates {
        1 => "the one candidate evaluated".to_string(),
        n => format!("the least memory-hungry of {n} candidates evaluated"),
    };
    let skipped = match skipped {
        0 => String::new(),
        n => format!(" ({n} more not tried: --tune-budget-ms was spent)"),
    };
    super::exit::Failure::DoesNotFit(format!(
        "no configuration fits the memory limit: {tried}{skipped} peaks at {} on device {device}, over the limit {} (--memory-limit {fraction} of device memory; --allow-oom writes it anyway)",
        super::report::gib(metrics.peak_memory_bytes),
        super::report::gib(limit),
    ))
}

/// What `--emit` (and `plan`, per step) writes: a text, or the schedule document, streamed as
/// it is serialised (a million-sample step's is gigabytes, which a string would hold twice
/// over while it grows).
pub(super) enum Emitted {
    Text(String),
    Schedule(Box<schedule_json::ScheduleDocument>),
}

impl Emitted {
    /// Writes it to `out` (the document pretty-printed, with a final newline).
    pub(super) fn write_to(&self, out: &mut impl Write) -> std::io::Result<()> {
        match self {
            Emitted::Text(text) => out.write_all(text.as_bytes()),
            Emitted::Schedule(document) => {
                serde_json::to_writer_pretty(&mut *out, document)?;
                out.write_all(b"\n")
            }
        }
    }

    /// Writes it to `path`, or to standard output (see [`super::output::file`]).
    fn write(&self, path: Option<&Path>) -> anyhow::Result<()> {
        super::output::write_with(path, |out| self.write_to(out))
    }
}

/// The `--emit` form `emit` of `ir` (the simulator's `metrics` go into the JSON).
fn emitted(emit: Emit, ir: &StepIr, metrics: Option<&sim::Metrics>) -> anyhow::Result<Emitted> {
    let need_schedule = |form: &str| {
        if ir.phase() < Phase::Scheduled {
            bail!(
                "--emit {form} needs a scheduled step, but the pipeline stops at phase '{}' (use --strategy or add the packing and scheduling passes)",
                ir.phase()
            );
        }
        Ok(())
    };
    Ok(match emit {
        Emit::Ir => Emitted::Text(text::print(ir)),
        Emit::Json => {
            need_schedule("json")?;
            let predicted = metrics.map(serde_json::to_value).transpose()?;
            Emitted::Schedule(Box::new(schedule_json::document(ir, predicted)?))
        }
        Emit::Mlir | Emit::Llvm => {
            let form = if emit == Emit::Mlir { "mlir" } else { "llvm" };
            need_schedule(form)?;
            if ir.has_split_backwards() {
                bail!("--emit {form} runs whole backwards; this step splits them (schedule-pipeline{{zb=true}}): compile it without zb");
            }
            if ir.has_stage_recompute() || ir.has_pack_recompute() {
                bail!("--emit {form} runs one recomputation mode per step; this step gives its stages or packs their own (assign-recompute): compile it without");
            }
            Emitted::Text(backend_emitted(emit, ir)?)
        }
        Emit::Ptx => Emitted::Text(backend_emitted(emit, ir)?),
    })
}

// ---- the MLIR and LLVM backends (codegen's `mlir` and `llvm` features) ----

/// `--emit mlir|llvm|ptx`: the backends' forms, or a one-line error naming the cargo feature
/// the build lacks.
fn backend_emitted(emit: Emit, ir: &StepIr) -> anyhow::Result<String> {
    match emit {
        Emit::Mlir => emit_mlir_form(ir, false),
        Emit::Llvm => emit_mlir_form(ir, true),
        Emit::Ptx => emit_ptx(ir),
        Emit::Ir | Emit::Json => unreachable!("bug: {emit:?} is not a backend form"),
    }
}

#[cfg(feature = "mlir")]
fn emit_mlir_form(ir: &StepIr, llvm_ir: bool) -> anyhow::Result<String> {
    let program = slimpack_ir::program::program_of(ir);
    Ok(if llvm_ir {
        slimpack_codegen::mlir::emit_llvm_ir(&program)?
    } else {
        slimpack_codegen::mlir::emit_mlir(&program)?
    })
}

#[cfg(not(feature = "mlir"))]
fn emit_mlir_form(_: &StepIr, llvm_ir: bool) -> anyhow::Result<String> {
    let form = if llvm_ir { "llvm" } else { "mlir" };
    bail!("--emit {form} needs slimpack built with `--features mlir` (and LLVM/MLIR 22: scripts/setup.sh)")
}

#[cfg(feature = "llvm")]
fn emit_ptx(ir: &StepIr) -> anyhow::Result<String> {
    use slimpack_codegen::llvm::ptx::{compile_ptx, GpuArch};
    Ok(compile_ptx(GpuArch::for_gpu(&ir.spec.cluster.gpu.name))?)
}

#[cfg(not(feature = "llvm"))]
fn emit_ptx(_: &StepIr) -> anyhow::Result<String> {
    bail!("--emit ptx needs slimpack built with `--features llvm` (and LLVM 22: scripts/setup.sh)")
}
