//! Epoch planning: every step of a dataset's epoch, planned and handed on one at a time.
//!
//! [`plan_epoch`] walks the dataset in seeded global batches ([`Dataset::batch_stream`], the
//! same batches `compile` and `bench` draw), tunes the strategy once on the first step (every
//! candidate compiled and simulated, as `compile --strategy` does), then plans every later step
//! with the best of the configurations the tuning kept (the chosen one and the best fitting of
//! each other family, [`crate::tune::kept`]) — a step whose best kept configuration is over the
//! memory limit is re-tuned on its own batch, for every strategy, as a run does
//! ([`crate::tune::run`]). Each step is lowered and given to the
//! caller's sink with its predicted metrics, in step order, then dropped: memory holds the
//! dataset and at most one step per worker thread, whatever the number of steps.
//!
//! [`plan_batch`] plans one batch on its own the same way (tuned on itself), and
//! [`plan_pipeline`] with an explicit pass pipeline instead of a strategy: the library calls
//! behind the Python package's `slimpack.plan`.
//!
//! Steps after the first are compiled in rounds of one step per thread (their admissions,
//! which carry state, run in step order first), so the output is the same on any number of
//! cores. The first step's tuning runs its candidates on every core.

use std::time::Instant;

use slimpack_ir::batch::{Batch, BatchOptions, Dataset};
use slimpack_ir::Spec;
use slimpack_machine::sim::Metrics;
use slimpack_passes::ManagerOptions;

use crate::compile::{lower, Compiled};
use crate::tune::autotune::{self, TuneOptions};
use crate::tune::kept::{self, Score};
use crate::tune::strategy::{self, Choices, StrategyInfo, StrategyState};

/// One planned step, handed to the sink.
pub struct PlannedStep {
    /// 1-based step number.
    pub step: usize,
    /// The batch the step trains on (after the strategy's admission).
    pub batch: Batch,
    /// The lowered step.
    pub compiled: Compiled,
    /// The simulator's prediction of the step.
    pub metrics: Metrics,
}

/// What an epoch plan did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PlanSummary {
    pub strategy: String,
    /// The configuration chosen on the first step.
    pub candidate: String,
    /// Candidates offered when tuning (evaluated, skipped by the budget or pruned).
    pub candidates_tried: usize,
    /// Of those, the candidates pruned by their lower bound without being compiled.
    pub candidates_pruned: usize,
    pub steps: usize,
    pub samples: u64,
    pub tokens: u64,
    /// Predicted step time: mean, smallest and largest over the steps, seconds.
    pub step_time_mean_s: f64,
    pub step_time_min_s: f64,
    pub step_time_max_s: f64,
    /// Predicted time of the whole epoch (the sum of the steps), seconds.
    pub epoch_time_s: f64,
    /// Of `steps`, those after the epoch's batches that drew nothing new and trained what the
    /// strategy had delayed (wlb's outlier queues), until nothing waited: every document of
    /// the epoch is planned.
    pub drain_steps: usize,
    /// Samples and tokens a strategy still held back when the plan ended (`--steps` cut it
    /// before the drain): they are in none of its steps. Absent for strategies that delay none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delayed_samples: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delayed_tokens: Option<u64>,
    /// Steps whose plan does not fit device memory.
    pub oom_steps: usize,
    /// Steps whose plan peaks above the memory limit (`memory_limit_bytes`): no kept or
    /// re-tuned configuration fitted it (the over-device-memory ones included).
    pub over_limit_steps: usize,
    /// The memory limit a step's plan may peak at, bytes per device.
    pub memory_limit_bytes: u64,
    /// Steps re-tuned on their own batch: the tuned configuration did not compile or went over
    /// the memory limit on them (a fitting kept configuration or recomputation twin still runs
    /// where no candidate beats it).
    pub replanned: usize,
    /// Wall time of the tuning on the first step, and of the whole plan, milliseconds.
    pub tune_ms: f64,
    pub plan_ms: f64,
}

/// How to plan an epoch.
pub struct PlanOptions<'a> {
    pub strategy: &'static StrategyInfo,
    pub choices: &'a Choices,
    pub tune: TuneOptions,
    /// Plan at most this many steps (default: the whole epoch).
    pub max_steps: Option<usize>,
    /// Steps compiled at once after the first (default: one per available core).
    pub threads: Option<usize>,
}

/// Errors of an epoch plan.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Batch(#[from] slimpack_ir::IrError),
    #[error(transparent)]
    Tune(#[from] autotune::TuneError),
    #[error(transparent)]
    Pass(#[from] slimpack_passes::PassError),
    #[error(transparent)]
    Simulate(#[from] slimpack_machine::MachineError),
    /// An explicit pipeline that stops before the schedule.
    #[error("--passes '{pipeline}' stops at phase '{phase}': a schedule needs the packing and scheduling passes (or use a strategy)")]
    Unscheduled { pipeline: String, phase: String },
    /// The sink failed (writing a schedule).
    #[error("{0}")]
    Sink(String),
}

/// Plans every step of one epoch of `dataset` (see the module documentation), calling `sink`
/// with each step in order. `sink` may fail (a write error); the plan stops there.
pub fn plan_epoch(
    spec: &Spec,
    dataset: &Dataset,
    batch_options: &BatchOptions,
    options: &PlanOptions,
    sink: &mut dyn FnMut(PlannedStep) -> Result<(), String>,
) -> Result<PlanSummary, PlanError> {
    let start = Instant::now();
    let strategy = options.strategy;
    let manager = ManagerOptions {
        verify: options.tune.verify.any(),
        ..ManagerOptions::default()
    };
    let mut stream = dataset.batch_stream(batch_options)?;
    let mut state = StrategyState::default();
    let mut summary = PlanSummary {
        strategy: strategy.name.to_string(),
        step_time_min_s: f64::INFINITY,
        ..PlanSummary::default()
    };
    let max_steps = options.max_steps.unwrap_or(usize::MAX);
    let limit = options.choices.memory_limit_for(spec);
    summary.memory_limit_bytes = limit;
    let first = autotune::admit(strategy, &mut state, spec, &stream.next_batch()?);
    // A batch of the run for the drain steps (its context and source).
    let like = Batch {
        samples: Vec::new(),
        documents: 0,
        documents_cut: 0,
        documents_empty: 0,
        context: first.context,
        source: first.source.clone(),
    };
    let tuned = tune_step(
        strategy,
        spec,
        first,
        &state,
        options.choices,
        &options.tune,
    )?;
    summary.tune_ms = start.elapsed().as_secs_f64() * 1e3;
    summary.candidates_tried = tuned.candidates_tried;
    summary.candidates_pruned = tuned.candidates_pruned;
    let kept = tuned.kept;
    summary.candidate = tuned.candidate.label.clone();
    let PlannedStep {
        batch,
        compiled,
        metrics,
        ..
    } = tuned.planned;
    hand_on(&mut summary, sink, 1, batch, compiled, metrics, false)?;
    let threads = options
        .threads
        .unwrap_or_else(autotune::available_threads)
        .max(1);
    while summary.steps < max_steps {
        // One round: the admissions in step order, then the compilations in parallel. After
        // the epoch's batches, drain steps until nothing waits.
        let mut round = Vec::with_capacity(threads);
        while round.len() < threads && summary.steps + round.len() < max_steps {
            let step = summary.steps + round.len() + 1;
            let batch = if !stream.epoch_done() {
                autotune::admit(strategy, &mut state, spec, &stream.next_batch()?)
            } else if let Some(batch) = state.drain_step(spec, &like) {
                summary.drain_steps += 1;
                batch
            } else {
                break;
            };
            let offered = (strategy.candidates)(spec, &batch, &state, options.choices);
            // The state as this step's admission left it: a re-plan offers the candidates of
            // this step (wlb's micro-batch count), whichever step of the round admitted last.
            round.push((step, batch, offered, state.clone()));
        }
        if round.is_empty() {
            break;
        }
        let planned =
            autotune::parallel_map_on(threads, &round, |_, (_, batch, offered, state)| {
                let step = (batch, offered.as_slice());
                plan_step(strategy, spec, step, &kept, state, options, &manager, limit)
            });
        for ((step, batch, _, _), outcome) in round.into_iter().zip(planned) {
            let (compiled, metrics, replanned) = outcome?;
            hand_on(
                &mut summary,
                sink,
                step,
                batch,
                compiled,
                metrics,
                replanned,
            )?;
        }
    }
    if let Some(wlb) = &state.wlb {
        let (samples, tokens) = wlb.delay.backlog();
        summary.delayed_samples = Some(samples as u64);
        summary.delayed_tokens = Some(tokens);
    }
    summary.step_time_mean_s = summary.epoch_time_s / summary.steps as f64;
    summary.plan_ms = start.elapsed().as_secs_f64() * 1e3;
    Ok(summary)
}

/// One global batch planned on its own, tuned on itself.
pub struct TunedStep {
    /// The step (numbered 1), lowered, with its predicted metrics.
    pub planned: PlannedStep,
    /// The configuration the tuning chose.
    pub candidate: strategy::Candidate,
    /// The configurations later steps choose among: the chosen one first, then the best
    /// fitting of each other family ([`crate::tune::kept`]).
    pub kept: Vec<strategy::Candidate>,
    /// The chosen configuration's label with its variant, as `compile` reports it.
    pub label: String,
    /// Candidates offered (evaluated, skipped by the budget or pruned).
    pub candidates_tried: usize,
    /// Candidates pruned by their lower bound.
    pub candidates_pruned: usize,
}

/// Plans `batch` on its own as `compile --strategy` does: admitted by `strategy` (from a fresh
/// state: a strategy that delays samples keeps them out of this step), tuned (every candidate
/// compiled and simulated, the fastest within the memory limit kept) and lowered. The library
/// call behind the Python package's `slimpack.plan`.
pub fn plan_batch(
    spec: &Spec,
    batch: &Batch,
    strategy: &'static StrategyInfo,
    choices: &Choices,
    tune: &TuneOptions,
) -> Result<TunedStep, PlanError> {
    let mut state = StrategyState::default();
    let batch = autotune::admit(strategy, &mut state, spec, batch);
    tune_step(strategy, spec, batch, &state, choices, tune)
}

/// Plans `batch` with an explicit pass pipeline instead of a strategy (`compile --passes`, e.g.
/// a forced slice size): compiled, simulated and lowered, without tuning.
pub fn plan_pipeline(
    spec: &Spec,
    batch: &Batch,
    pipeline: &str,
    verify: bool,
) -> Result<PlannedStep, PlanError> {
    let manager = ManagerOptions {
        verify,
        ..ManagerOptions::default()
    };
    let options = crate::CompileOptions {
        pipeline: pipeline.to_string(),
        manager: manager.clone(),
    };
    let mut compiled = crate::compile(spec, batch, &options, &mut std::io::sink())?;
    if compiled.ir.phase() < slimpack_ir::step::Phase::Scheduled {
        return Err(PlanError::Unscheduled {
            pipeline: pipeline.to_string(),
            phase: compiled.ir.phase().to_string(),
        });
    }
    let model = slimpack_machine::machine_model(&compiled.ir.spec);
    let metrics = slimpack_machine::sim::simulate(&compiled.ir, &model)?.metrics;
    lower(&mut compiled, &manager, &mut std::io::sink())?;
    Ok(PlannedStep {
        step: 1,
        batch: batch.clone(),
        compiled,
        metrics,
    })
}

/// Tunes `strategy` on an admitted `batch` and lowers the chosen step (the first step of an
/// epoch plan, and [`plan_batch`]).
fn tune_step(
    strategy: &'static StrategyInfo,
    spec: &Spec,
    batch: Batch,
    state: &StrategyState,
    choices: &Choices,
    tune: &TuneOptions,
) -> Result<TunedStep, PlanError> {
    let manager = ManagerOptions {
        verify: tune.verify.any(),
        ..ManagerOptions::default()
    };
    let choice = autotune::choose_with(strategy, spec, &batch, state, choices, tune)?;
    let best = choice.best();
    let candidate = best.candidate.clone();
    let label = match best.variant.as_str() {
        "" => candidate.label.clone(),
        variant => format!("{},{variant}", candidate.label),
    };
    let metrics = best.metrics.clone();
    let limit = choices.memory_limit_for(spec);
    let scores: Vec<Score> = choice
        .evaluations
        .iter()
        .map(|evaluation| Score {
            label: &evaluation.candidate.label,
            time_s: evaluation.metrics.step_time_s,
            fits: autotune::within(&evaluation.metrics, limit),
        })
        .collect();
    let kept = kept::keep(&scores, choice.chosen)
        .into_iter()
        .map(|index| choice.evaluations[index].candidate.clone())
        .collect();
    let candidates_tried = choice.candidates_offered();
    let candidates_pruned = choice.pruned;
    let mut compiled = choice.compiled;
    lower(&mut compiled, &manager, &mut std::io::sink())?;
    Ok(TunedStep {
        planned: PlannedStep {
            step: 1,
            batch,
            compiled,
            metrics,
        },
        candidate,
        kept,
        label,
        candidates_tried,
        candidates_pruned,
    })
}

/// One later step with the best of the kept configurations (re-tuned when none compiles or
/// the best is over the memory limit), lowered. Returns the step, its metrics and whether it
/// was re-tuned.
#[allow(clippy::too_many_arguments)]
fn plan_step(
    strategy: &'static StrategyInfo,
    spec: &Spec,
    (batch, offered): (&Batch, &[strategy::Candidate]),
    kept: &[strategy::Candidate],
    state: &StrategyState,
    options: &PlanOptions,
    manager: &ManagerOptions,
    limit: u64,
) -> Result<(Compiled, Metrics, bool), PlanError> {
    // The bench's rule, for every strategy: a step no kept configuration compiles (a document
    // longer than megatron's bins) or whose best is over the memory limit is re-tuned on its
    // own batch (and kept re-tuned only where that fits).
    let step = kept::choose_for_step(strategy, spec, batch, offered, kept, limit, &options.tune)?;
    let (mut compiled, mut metrics, mut replanned) = match step {
        // The tuned configuration over the limit, a kept one or a twin within it: re-planned
        // against that step (only a faster fitting plan replaces it).
        Some(choice)
            if !choice.tuned_fits && autotune::within(&choice.evaluation.metrics, limit) =>
        {
            let incumbent = choice.evaluation.metrics.step_time_s;
            let (choices, tune) = (options.choices, &options.tune);
            match autotune::choose_below(strategy, spec, batch, state, choices, tune, incumbent)? {
                Some(better) => {
                    let metrics = better.best().metrics.clone();
                    (better.compiled, metrics, true)
                }
                None => (choice.compiled, choice.evaluation.metrics, true),
            }
        }
        Some(choice) => (choice.compiled, choice.evaluation.metrics, false),
        None => {
            let choice = autotune::choose_with(
                strategy,
                spec,
                batch,
                state,
                options.choices,
                &options.tune,
            )?;
            let metrics = choice.evaluations[choice.chosen].metrics.clone();
            (choice.compiled, metrics, true)
        }
    };
    if !replanned && (metrics.oom || metrics.peak_memory_bytes > limit) {
        let choice =
            autotune::choose_with(strategy, spec, batch, state, options.choices, &options.tune)?;
        let best = &choice.evaluations[choice.chosen];
        if !best.metrics.oom && best.metrics.peak_memory_bytes <= limit {
            metrics = best.metrics.clone();
            compiled = choice.compiled;
            replanned = true;
        }
    }
    lower(&mut compiled, manager, &mut std::io::sink())?;
    Ok((compiled, metrics, replanned))
}

/// Counts a step into the summary and gives it to the sink.
fn hand_on(
    summary: &mut PlanSummary,
    sink: &mut dyn FnMut(PlannedStep) -> Result<(), String>,
    step: usize,
    batch: Batch,
    compiled: Compiled,
    metrics: Metrics,
    replanned: bool,
) -> Result<(), PlanError> {
    summary.steps += 1;
    summary.samples += batch.samples.len() as u64;
    summary.tokens += batch.tokens();
    summary.epoch_time_s += metrics.step_time_s;
    summary.step_time_min_s = summary.step_time_min_s.min(metrics.step_time_s);
    summary.step_time_max_s = summary.step_time_max_s.max(metrics.step_time_s);
    summary.oom_steps += usize::from(metrics.oom);
    summary.over_limit_steps +=
        usize::from(metrics.oom || metrics.peak_memory_bytes > summary.memory_limit_bytes);
    summary.replanned += usize::from(replanned);
    sink(PlannedStep {
        step,
        batch,
        compiled,
        metrics,
    })
    .map_err(PlanError::Sink)
}
