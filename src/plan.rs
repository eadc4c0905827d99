//! Epoch planning: every step of a dataset's epoch, planned and handed on one at a time.
//!
//! [`plan_epoch`] walks the dataset in seeded global batches ([`Dataset::batch_stream`], the
//! same batches `compile` and `bench` draw), tunes the strategy once on the first step (every
//! candidate compiled and simulated, as `compile --strategy` does), then plans every later step
//! with the best of the configurations the tuning kept (the chosen one and the best fitting of
//! each other class, [`crate::tune::kept`]) — a step whose best kept configuration is over the
//! memory limit is re-tuned on its own batch, for every strategy, as a run does
//! ([`crate::tune::run`]). Each step is lowered and given to the
//! caller's sink with its predicted metrics, in step order, then dropped: memory holds the
//! dataset and at most two steps per worker thread, whatever the number of steps.
//!
//! [`plan_batch`] plans one batch on its own the same way (tuned on itself), and
//! [`plan_pipeline`] with an explicit pass pipeline instead of a strategy: the library calls
//! behind the Python package's `slimpack.plan`.
//!
//! Steps after the first are admitted in step order (admissions carry the strategy's state)
//! and compiled on worker threads, each step from what its admission gave it, while the
//! calling thread hands the finished ones to the sink in order ([`plan_in_parallel`]): the
//! output is the same on any number of cores, and the sink's writing overlaps the planning.
//! The first step's tuning runs its candidates on every core.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Instant;

use slimpack_ir::batch::{Batch, BatchOptions, BatchStream, Dataset};
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
    /// The tokens drawn beyond the dataset's (trained, or held back by the strategy): the last
    /// global batch is completed from the next epoch's order (as a trainer's sampler wraps
    /// around), so `tokens` can exceed the epoch's by up to a batch.
    pub next_epoch_tokens: u64,
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
    /// Worker threads planning the steps after the first (default: one per available core).
    pub threads: Option<usize>,
}

/// Errors of an epoch plan.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Batch(#[from] slimpack_ir::IrError),
    /// Drawing the batch of a step after the first failed (the steps before it were planned).
    #[error("step {step}: {source}")]
    Draw {
        step: usize,
        source: slimpack_ir::IrError,
    },
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
    // No more workers than later steps can use.
    let threads = options
        .threads
        .unwrap_or_else(autotune::available_threads)
        .min(max_steps.saturating_sub(1))
        .max(1);
    let context = StepContext {
        strategy,
        spec,
        kept: &kept,
        options,
        manager: &manager,
        limit,
    };
    let mut admission = Admission {
        strategy,
        spec,
        choices: options.choices,
        stream,
        state,
        like,
        next_step: 2,
        max_steps,
    };
    if threads == 1 {
        plan_in_order(&context, &mut admission, &mut summary, sink)?;
    } else {
        plan_in_parallel(&context, &mut admission, threads, &mut summary, sink)?;
    }
    let state = admission.state;
    if let Some(wlb) = &state.wlb {
        let (samples, tokens) = wlb.delay.backlog();
        summary.delayed_samples = Some(samples as u64);
        summary.delayed_tokens = Some(tokens);
    }
    // The tokens drawn: those trained and those a strategy still held back (`--steps` cut
    // its drain short).
    let drawn = summary.tokens + summary.delayed_tokens.unwrap_or(0);
    summary.next_epoch_tokens = drawn.saturating_sub(dataset.total_tokens());
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
    /// fitting of each other class ([`crate::tune::kept`]).
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

/// What every later step is planned with.
struct StepContext<'a> {
    strategy: &'static StrategyInfo,
    spec: &'a Spec,
    /// The configurations the tuning kept.
    kept: &'a [strategy::Candidate],
    options: &'a PlanOptions<'a>,
    manager: &'a ManagerOptions,
    limit: u64,
}

/// A later step admitted in step order, waiting to be planned.
struct Admitted {
    step: usize,
    batch: Batch,
    /// The candidates a re-plan of this step offers.
    offered: Vec<strategy::Candidate>,
    /// The strategy's state as this step's admission left it.
    state: StrategyState,
}

/// A planned step: the lowered step, its metrics and whether it was re-tuned.
type StepOutcome = Result<(Compiled, Metrics, bool), PlanError>;

/// The admissions of the later steps, in step order (they carry the strategy's state): the
/// epoch's batches, then drain steps until nothing waits, up to the step limit.
struct Admission<'a> {
    strategy: &'static StrategyInfo,
    spec: &'a Spec,
    choices: &'a Choices,
    stream: BatchStream<'a>,
    state: StrategyState,
    /// A batch of the run for the drain steps (its context and source).
    like: Batch,
    /// The number of the next step.
    next_step: usize,
    max_steps: usize,
}

impl Admission<'_> {
    fn next(&mut self, summary: &mut PlanSummary) -> Result<Option<Admitted>, PlanError> {
        if self.next_step > self.max_steps {
            return Ok(None);
        }
        let (strategy, spec) = (self.strategy, self.spec);
        let batch = if !self.stream.epoch_done() {
            let drawn = (self.stream.next_batch()).map_err(|source| PlanError::Draw {
                step: self.next_step,
                source,
            })?;
            autotune::admit(strategy, &mut self.state, spec, &drawn)
        } else if let Some(batch) = self.state.drain_step(spec, &self.like) {
            summary.drain_steps += 1;
            batch
        } else {
            return Ok(None);
        };
        let offered = (strategy.candidates)(spec, &batch, &self.state, self.choices);
        let step = self.next_step;
        self.next_step += 1;
        Ok(Some(Admitted {
            step,
            batch,
            offered,
            state: self.state.clone(),
        }))
    }
}

/// Plans the later steps one after the other on this thread.
fn plan_in_order(
    context: &StepContext,
    admission: &mut Admission,
    summary: &mut PlanSummary,
    sink: &mut dyn FnMut(PlannedStep) -> Result<(), String>,
) -> Result<(), PlanError> {
    while let Some(admitted) = admission.next(summary)? {
        let outcome = context.plan(&admitted);
        hand_on_outcome(summary, sink, admitted, outcome)?;
    }
    Ok(())
}

/// Plans the later steps on `threads` workers while this thread admits them and hands them
/// on in step order: at most two steps per worker are admitted and not yet handed on (memory
/// stays bounded), and no worker waits for a slower step or for the sink, which writes the
/// schedules. Every step is planned from what its admission gave it, so the steps are those
/// of a plan on one thread. An error ends the plan once the steps before it are handed on
/// and the workers finished the steps they were planning (a step is not interrupted). A
/// worker's panic (a bug) is resumed here as soon as it arrives, once the workers stopped.
fn plan_in_parallel(
    context: &StepContext,
    admission: &mut Admission,
    threads: usize,
    summary: &mut PlanSummary,
    sink: &mut dyn FnMut(PlannedStep) -> Result<(), String>,
) -> Result<(), PlanError> {
    let stop = AtomicBool::new(false);
    let (work, jobs) = mpsc::channel::<Admitted>();
    let jobs = Mutex::new(jobs);
    let ended = std::thread::scope(|scope| {
        // Owned here, so that the workers waiting for work end when this ends (or unwinds).
        let work = work;
        let (finished, results) = mpsc::channel::<Finished>();
        let (jobs, stop) = (&jobs, &stop);
        let mut started = 0;
        for _ in 0..threads {
            let finished = finished.clone();
            let worker = move || loop {
                let job = match jobs.lock() {
                    Ok(jobs) => jobs.recv(),
                    Err(_) => return,
                };
                let Ok(admitted) = job else { return };
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let outcome =
                    std::panic::catch_unwind(AssertUnwindSafe(|| context.plan(&admitted)));
                let (message, panicked) = match outcome {
                    Ok(outcome) => (Finished::Step(Box::new((admitted, outcome))), false),
                    Err(panic) => (Finished::Panicked(panic), true),
                };
                if finished.send(message).is_err() || panicked {
                    return;
                }
            };
            // Threads the system will not start (a process limit) leave the work to the others.
            match std::thread::Builder::new().spawn_scoped(scope, worker) {
                Ok(_) => started += 1,
                Err(_) => break,
            }
        }
        drop(finished);
        if started == 0 {
            return Err(Ended::NoWorker);
        }
        // However this side ends (a panic in the sink included), the workers drop what is
        // still queued and stop after the step they plan.
        let _stop = StopOnDrop(stop);
        hand_on_in_order(admission, 2 * started, &work, &results, summary, sink)
    });
    match ended {
        Ok(()) => Ok(()),
        Err(Ended::NoWorker) => plan_in_order(context, admission, summary, sink),
        Err(Ended::Failed(error)) => Err(error),
        Err(Ended::Panicked(panic)) => std::panic::resume_unwind(panic),
    }
}

/// Tells [`plan_in_parallel`]'s workers to stop when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What a worker of [`plan_in_parallel`] sends back.
enum Finished {
    Step(Box<(Admitted, StepOutcome)>),
    Panicked(Box<dyn std::any::Any + Send>),
}

/// Why [`hand_on_in_order`] stopped before the last step, or [`plan_in_parallel`] did not
/// start it.
enum Ended {
    /// No worker thread could start.
    NoWorker,
    Failed(PlanError),
    Panicked(Box<dyn std::any::Any + Send>),
}

/// The admitting and handing-on side of [`plan_in_parallel`]: admits up to `window` steps
/// ahead of the next one to hand on.
fn hand_on_in_order(
    admission: &mut Admission,
    window: usize,
    work: &mpsc::Sender<Admitted>,
    results: &mpsc::Receiver<Finished>,
    summary: &mut PlanSummary,
    sink: &mut dyn FnMut(PlannedStep) -> Result<(), String>,
) -> Result<(), Ended> {
    let mut done: BTreeMap<usize, (Admitted, StepOutcome)> = BTreeMap::new();
    let (mut in_flight, mut admitting, mut next) = (0, true, admission.next_step);
    // An admission that failed ends the plan once the steps before it are handed on, as on
    // one thread.
    let mut failed = None;
    loop {
        while admitting && in_flight < window {
            match admission.next(summary) {
                Ok(Some(admitted)) => {
                    in_flight += 1;
                    // The workers wait for work until this side ends: the send succeeds.
                    let _ = work.send(admitted);
                }
                Ok(None) => admitting = false,
                Err(error) => (admitting, failed) = (false, Some(error)),
            }
        }
        if in_flight == 0 {
            return failed.map_or(Ok(()), |error| Err(Ended::Failed(error)));
        }
        // Workers end only when told to or when a panic was sent: the receive succeeds.
        match results.recv() {
            Ok(Finished::Step(step)) => {
                done.insert(step.0.step, *step);
            }
            Ok(Finished::Panicked(panic)) => return Err(Ended::Panicked(panic)),
            Err(_) => unreachable!("every planning worker ended with steps in flight"),
        }
        while let Some((admitted, outcome)) = done.remove(&next) {
            hand_on_outcome(summary, sink, admitted, outcome).map_err(Ended::Failed)?;
            in_flight -= 1;
            next += 1;
        }
    }
}

/// Counts a planned later step in and gives it to the sink (or returns its error).
fn hand_on_outcome(
    summary: &mut PlanSummary,
    sink: &mut dyn FnMut(PlannedStep) -> Result<(), String>,
    admitted: Admitted,
    outcome: StepOutcome,
) -> Result<(), PlanError> {
    let (compiled, metrics, replanned) = outcome?;
    let step = admitted.step;
    hand_on(
        summary,
        sink,
        step,
        admitted.batch,
        compiled,
        metrics,
        replanned,
    )
}

impl StepContext<'_> {
    /// One later step with the best of the kept configurations (re-tuned when none compiles or
    /// the best is over the memory limit), lowered.
    fn plan(&self, admitted: &Admitted) -> StepOutcome {
        let (strategy, spec, limit, options) = (self.strategy, self.spec, self.limit, self.options);
        let (batch, offered, state) = (&admitted.batch, &admitted.offered, &admitted.state);
        // The bench's rule, for every strategy: a step no kept configuration compiles (a
        // document longer than megatron's bins) or whose best is over the memory limit is
        // re-tuned on its own batch (and kept re-tuned only where that fits).
        let step = kept::choose_for_step(
            strategy,
            spec,
            batch,
            offered,
            self.kept,
            limit,
            &options.tune,
        )?;
        // The step tuned on its own batch, as the first step was.
        let retune = || {
            let (choices, tune) = (options.choices, &options.tune);
            autotune::choose_with(strategy, spec, batch, state, choices, tune)
        };
        let (mut compiled, mut metrics, mut replanned) = match step {
            // The tuned configuration over the limit, a kept one or a twin within it: re-planned
            // against that step (only a faster fitting plan replaces it).
            Some(choice)
                if !choice.tuned_fits && autotune::within(&choice.evaluation.metrics, limit) =>
            {
                let incumbent = choice.evaluation.metrics.step_time_s;
                let (choices, tune) = (options.choices, &options.tune);
                match autotune::choose_below(
                    strategy, spec, batch, state, choices, tune, incumbent,
                )? {
                    Some(better) => {
                        let metrics = better.best().metrics.clone();
                        (better.compiled, metrics, true)
                    }
                    None => (choice.compiled, choice.evaluation.metrics, true),
                }
            }
            Some(choice) => (choice.compiled, choice.evaluation.metrics, false),
            None => {
                let choice = retune()?;
                let metrics = choice.evaluations[choice.chosen].metrics.clone();
                (choice.compiled, metrics, true)
            }
        };
        if !replanned && (metrics.oom || metrics.peak_memory_bytes > limit) {
            // Re-tuned, and counted so, whether or not a plan within the limit comes of it.
            let choice = retune()?;
            replanned = true;
            let best = &choice.evaluations[choice.chosen];
            if !best.metrics.oom && best.metrics.peak_memory_bytes <= limit {
                metrics = best.metrics.clone();
                compiled = choice.compiled;
            }
        }
        lower(&mut compiled, self.manager, &mut std::io::sink())?;
        Ok((compiled, metrics, replanned))
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::strategy::{self, Choices};

    /// 8,000 documents of 50..2,000 tokens: about 20 steps of 400K tokens.
    fn dataset() -> Dataset {
        Dataset {
            name: "synthetic".into(),
            lengths: (0..8_000u32).map(|i| 50 + (i * 7919) % 1950).collect(),
            empty: 0,
        }
    }

    /// Plans `dataset` with megatron on `threads` threads, the sink failing at step
    /// `fail_at`: the steps the sink saw, and the plan's outcome.
    fn plan_of(
        dataset: &Dataset,
        batch_options: &BatchOptions,
        threads: usize,
        fail_at: usize,
    ) -> (Vec<usize>, Result<PlanSummary, PlanError>) {
        let spec = Spec::from_presets("llama-7b", "h100-sxm", "tp=8,cp=1,pp=2,dp=4").unwrap();
        let choices = Choices::fixed(spec.model.recompute);
        let options = PlanOptions {
            strategy: strategy::lookup("megatron").unwrap(),
            choices: &choices,
            tune: TuneOptions::default(),
            max_steps: None,
            threads: Some(threads),
        };
        let mut seen = Vec::new();
        let outcome = plan_epoch(&spec, dataset, batch_options, &options, &mut |step| {
            seen.push(step.step);
            match step.step == fail_at {
                true => Err("disk full".into()),
                false => Ok(()),
            }
        });
        (seen, outcome)
    }

    /// [`plan_of`] the synthetic dataset in steps of 400K tokens.
    fn plan_failing_at(
        threads: usize,
        fail_at: usize,
    ) -> (Vec<usize>, Result<PlanSummary, PlanError>) {
        let batch_options = BatchOptions {
            global_batch_tokens: Some(400_000),
            context: Some(32768),
            ..BatchOptions::default()
        };
        plan_of(&dataset(), &batch_options, threads, fail_at)
    }

    #[test]
    fn steps_reach_the_sink_in_order_on_any_number_of_threads() {
        for threads in [1, 3] {
            let (seen, outcome) = plan_failing_at(threads, usize::MAX);
            let summary = outcome.unwrap();
            assert!(summary.steps > 10, "{} steps", summary.steps);
            assert_eq!(
                seen,
                (1..=summary.steps).collect::<Vec<_>>(),
                "{threads} threads"
            );
        }
    }

    /// The last batch is completed from the next epoch's order, and the summary says by how
    /// many tokens its total exceeds the dataset's.
    #[test]
    fn the_tokens_of_the_next_epoch_are_counted_apart() {
        let (_, outcome) = plan_failing_at(1, usize::MAX);
        let summary = outcome.unwrap();
        let epoch = dataset().total_tokens();
        assert!(summary.tokens > epoch, "{} <= {epoch}", summary.tokens);
        assert_eq!(summary.next_epoch_tokens, summary.tokens - epoch);
        assert!(summary.next_epoch_tokens < 400_000 + 32768);
    }

    #[test]
    fn a_failing_sink_stops_the_plan_at_that_step() {
        for threads in [1, 3] {
            let (seen, outcome) = plan_failing_at(threads, 4);
            assert_eq!(seen, [1, 2, 3, 4], "{threads} threads");
            match outcome {
                Err(PlanError::Sink(message)) => assert_eq!(message, "disk full"),
                other => panic!("{threads} threads: {:?}", other.map(|s| s.steps)),
            }
        }
    }

    /// A batch that cannot be drawn ends the plan with every step before it handed on, on any
    /// number of threads (workers had planned later steps; they were dropped unsaid).
    #[test]
    fn a_batch_that_cannot_be_drawn_ends_the_plan_after_the_steps_before_it() {
        // Short documents, then one whose tokens with any others overflow a batch's count.
        let mut lengths = vec![1000; 50];
        lengths.push(u32::MAX - 295);
        let dataset = Dataset {
            name: "overflowing".into(),
            lengths,
            empty: 0,
        };
        let batch_options = BatchOptions {
            global_batch_tokens: Some(1500),
            context: Some(65536),
            seed: 3,
            ..BatchOptions::default()
        };
        let (one, outcome) = plan_of(&dataset, &batch_options, 1, usize::MAX);
        let Err(PlanError::Draw { step, .. }) = outcome else {
            panic!("{:?}", outcome.map(|s| s.steps));
        };
        assert!(step > 2, "the overflowing batch is step {step}");
        assert_eq!(one, (1..step).collect::<Vec<_>>());
        let (three, outcome) = plan_of(&dataset, &batch_options, 3, usize::MAX);
        assert!(
            matches!(outcome, Err(PlanError::Draw { step: s, .. }) if s == step),
            "{:?}",
            outcome.map(|s| s.steps)
        );
        assert_eq!(three, one);
    }
}
