//! The multi-step run policy: how a strategy runs a sequence of global batches, the way a user
//! runs a job (`slimpack bench` measures runs with it).
//!
//! A run is tuned once: on the first step the autotuner compiles and simulates every candidate
//! configuration and keeps the fastest that fits memory; the later steps run that
//! configuration (compiled in parallel; the admissions, which carry state, run in step order
//! first). A strategy that plans every step (`StrategyInfo::replans`) re-tunes a step its kept
//! configuration does not fit.

use slimpack_ir::batch::Batch;
use slimpack_ir::Spec;
use slimpack_machine::sim::Metrics;

use super::autotune::{self, Evaluation, TuneError};
use super::strategy::{Choices, StrategyInfo, StrategyState};

/// One step of a run.
#[derive(Debug, Clone)]
pub struct StepFigures {
    pub metrics: Metrics,
    pub compile_ms: f64,
}

/// One strategy's run.
pub struct StrategyRun {
    pub strategy: &'static StrategyInfo,
    /// The label of the configuration the run kept.
    pub chosen: String,
    /// Every candidate tried on step 1.
    pub tuning: Vec<Evaluation>,
    pub steps: Vec<StepFigures>,
    /// Samples and tokens still delayed at the end of the run (strategies that delay).
    pub backlog: (usize, u64),
    /// Steps on which a re-planning strategy left its kept configuration to fit memory.
    pub replanned: usize,
}

/// Progress of a run, for a progress bar: `grow` adds units of work as they become known,
/// `advance` marks units done.
pub struct Progress<'a> {
    pub grow: &'a dyn Fn(u64),
    pub advance: &'a dyn Fn(u64),
}

/// Tunes `strategy` on the first batch, then runs the chosen configuration on every batch.
pub fn run_strategy(
    strategy: &'static StrategyInfo,
    spec: &Spec,
    batches: &[Batch],
    choices: &Choices,
    progress: &Progress,
) -> Result<StrategyRun, TuneError> {
    let mut state = StrategyState::default();
    let first = autotune::admit(strategy, &mut state, spec, &batches[0]);
    let candidates = (strategy.candidates)(spec, &first, &state, choices).len() as u64;
    (progress.grow)(candidates + batches.len() as u64 - 1);
    let choice = autotune::choose(strategy, spec, &first, &state, choices)?;
    (progress.advance)(candidates);
    let tuning = choice.evaluations;
    let chosen = tuning[choice.chosen].candidate.label.clone();
    let mut later = Vec::with_capacity(batches.len() - 1);
    for (index, drawn) in batches.iter().enumerate().skip(1) {
        let batch = autotune::admit(strategy, &mut state, spec, drawn);
        let candidate = (strategy.candidates)(spec, &batch, &state, choices)
            .into_iter()
            .find(|c| c.label == chosen)
            .ok_or_else(|| TuneError::Withdrawn {
                strategy: strategy.name,
                candidate: chosen.clone(),
                step: index + 1,
            })?;
        later.push((batch, candidate));
    }
    let best = &tuning[choice.chosen];
    let mut steps = vec![StepFigures {
        metrics: best.metrics.clone(),
        compile_ms: best.compile_ms,
    }];
    let mut replanned = 0;
    for (evaluation, (batch, _)) in autotune::evaluate_steps(strategy, spec, &later)?
        .into_iter()
        .zip(&later)
    {
        let evaluation = if evaluation.metrics.oom && strategy.replans {
            replanned += 1;
            replan(strategy, spec, batch, &state, choices)?.unwrap_or(evaluation)
        } else {
            evaluation
        };
        steps.push(StepFigures {
            metrics: evaluation.metrics,
            compile_ms: evaluation.compile_ms,
        });
    }
    (progress.advance)(later.len() as u64);
    Ok(StrategyRun {
        strategy,
        chosen,
        tuning,
        steps,
        backlog: state.backlog(),
        replanned,
    })
}

/// A step of a re-planning strategy whose kept configuration does not fit: re-tuned on this
/// batch as on the first step — every configuration compiled and simulated, the fastest that
/// fits kept (a strategy that compiles every step can; taking the first configuration that
/// fits, in the tuning step's order, kept configurations many times slower than the best).
fn replan(
    strategy: &'static StrategyInfo,
    spec: &Spec,
    batch: &Batch,
    state: &StrategyState,
    choices: &Choices,
) -> Result<Option<Evaluation>, TuneError> {
    let mut choice = autotune::choose(strategy, spec, batch, state, choices)?;
    let best = choice.evaluations.swap_remove(choice.chosen);
    Ok((!best.metrics.oom).then_some(best))
}
