//! The strategy driver: compiles every candidate configuration of a strategy, scores each with
//! the simulator, and keeps the fastest that fits memory — the autotuner above the compiler.
//!
//! A strategy (`slimpack_passes::strategy`) offers candidates: pipelines with a recompute mode
//! and a label (`cp=2,recompute=selective`). [`choose`] compiles each on the batch (with the
//! model's recompute mode replaced by the candidate's), simulates it, and returns the fastest
//! candidate whose predicted peak memory fits the device; if none fits, the one with the least
//! peak memory, marked OOM. Candidates run on parallel threads; the choice is deterministic
//! (ties go to the earlier candidate). [`admit`] applies a strategy's admission hook (the steps
//! a run carries over, e.g. WLB-LLM's delayed outliers) before a batch is compiled.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use slimpack_ir::batch::Batch;
use slimpack_ir::{Spec, StepIr};
use slimpack_passes::strategy::{Candidate, Choices, StrategyInfo, StrategyState};
use slimpack_passes::{parse_pipeline, run_pipeline, ManagerOptions, PassError};
use slimpack_runtime::sim::{self, Metrics, SimError};

use crate::compile::Compiled;

/// Why a strategy could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("strategy '{strategy}', candidate {candidate}: {source}")]
    Compile {
        strategy: &'static str,
        candidate: String,
        #[source]
        source: Box<PassError>,
    },
    #[error("strategy '{strategy}', candidate {candidate}: {source}")]
    Simulate {
        strategy: &'static str,
        candidate: String,
        #[source]
        source: Box<SimError>,
    },
    #[error("strategy '{strategy}' offers no candidate for this spec and batch")]
    NoCandidate { strategy: &'static str },
}

/// One candidate compiled and simulated.
#[derive(Debug)]
pub struct Evaluation {
    pub candidate: Candidate,
    pub metrics: Metrics,
    /// Wall time of building the IR and running the candidate's pipeline.
    pub compile_ms: f64,
}

/// The outcome of [`choose`].
#[derive(Debug)]
pub struct Choice {
    /// Every candidate, in the strategy's order.
    pub evaluations: Vec<Evaluation>,
    /// Index of the chosen candidate in `evaluations`.
    pub chosen: usize,
    /// The chosen candidate's compiled step.
    pub compiled: Compiled,
}

impl Choice {
    /// The chosen candidate's evaluation.
    pub fn best(&self) -> &Evaluation {
        &self.evaluations[self.chosen]
    }
}

/// The spec a candidate runs with: `spec` with the candidate's recompute mode.
pub fn candidate_spec(spec: &Spec, candidate: &Candidate) -> Spec {
    let mut spec = spec.clone();
    spec.model.recompute = candidate.recompute;
    spec
}

/// The batch a step of `strategy` trains on: `batch` itself, or what its admission hook makes
/// of it (updating `state`).
pub fn admit(
    strategy: &StrategyInfo,
    state: &mut StrategyState,
    spec: &Spec,
    batch: &Batch,
) -> Batch {
    match strategy.admit {
        Some(admit) => admit(state, spec, batch),
        None => batch.clone(),
    }
}

/// One step of `strategy` on a drawn `batch`: admits it (updating `state`, which a caller
/// compiling several steps of one run keeps between them) and [`choose`]s among the candidates.
/// Returns the batch the step trained on with the choice.
pub fn compile_step(
    strategy: &StrategyInfo,
    spec: &Spec,
    batch: &Batch,
    state: &mut StrategyState,
    choices: &Choices,
) -> Result<(Batch, Choice), DriverError> {
    let admitted = admit(strategy, state, spec, batch);
    let choice = choose(strategy, spec, &admitted, state, choices)?;
    Ok((admitted, choice))
}

/// Compiles and simulates one candidate.
pub fn evaluate(
    strategy: &StrategyInfo,
    spec: &Spec,
    batch: &Batch,
    candidate: &Candidate,
) -> Result<(Evaluation, Compiled), DriverError> {
    let spec = candidate_spec(spec, candidate);
    let compile_error = |source| DriverError::Compile {
        strategy: strategy.name,
        candidate: candidate.label.clone(),
        source: Box::new(source),
    };
    let simulate = |ir: &StepIr| {
        sim::simulate(ir, &crate::machine::cost_model(&spec)).map_err(|source| {
            DriverError::Simulate {
                strategy: strategy.name,
                candidate: candidate.label.clone(),
                source: Box::new(source),
            }
        })
    };
    let entries = parse_pipeline(&candidate.pipeline).map_err(compile_error)?;
    let options = ManagerOptions::default();
    let sink = &mut std::io::sink();
    let start = Instant::now();
    let mut ir = StepIr::from_batch(spec.clone(), batch);
    let refine = entries.iter().position(|e| e.info.name == EQSAT);
    let prefix = refine.unwrap_or(entries.len());
    let mut passes =
        run_pipeline(&mut ir, &entries[..prefix], &options, sink).map_err(compile_error)?;
    let (ir, passes, metrics) = match refine {
        None => {
            let metrics = simulate(&ir)?.metrics;
            (ir, passes, metrics)
        }
        Some(at) => {
            // The egg layer judges rewrites with its own estimate; the simulator has the last
            // word: the step with eqsat is kept only if it is no slower (nor bigger) than the
            // same pipeline without it.
            let mut without = ir.clone();
            let refined =
                run_pipeline(&mut ir, &entries[at..], &options, sink).map_err(compile_error)?;
            let plain = run_pipeline(&mut without, &entries[at + 1..], &options, sink)
                .map_err(compile_error)?;
            let with_metrics = simulate(&ir)?.metrics;
            let without_metrics = simulate(&without)?.metrics;
            let keep = !worse(&with_metrics, &without_metrics);
            let mut eqsat = refined[0].clone();
            eqsat
                .statistics
                .set("simulated_step_s", with_metrics.step_time_s);
            eqsat
                .statistics
                .set("simulated_step_without_s", without_metrics.step_time_s);
            eqsat.statistics.set("kept_by_simulator", keep);
            passes.push(eqsat);
            if keep {
                passes.extend(refined.into_iter().skip(1));
                (ir, passes, with_metrics)
            } else {
                passes.extend(plain);
                (without, passes, without_metrics)
            }
        }
    };
    let compile_ms = start.elapsed().as_secs_f64() * 1e3;
    let evaluation = Evaluation {
        candidate: candidate.clone(),
        metrics,
        compile_ms,
    };
    let compiled = Compiled {
        ir,
        passes,
        compile_ms,
    };
    Ok((evaluation, compiled))
}

/// The refinement pass the driver double-checks with the simulator.
const EQSAT: &str = "eqsat";

/// Whether `refined` is worse than `plain`: an OOM the refinement introduces, a longer step,
/// or the same step with more peak memory.
fn worse(refined: &Metrics, plain: &Metrics) -> bool {
    (refined.oom && !plain.oom)
        || refined.step_time_s > plain.step_time_s
        || (refined.step_time_s == plain.step_time_s
            && refined.peak_memory_bytes > plain.peak_memory_bytes)
}

/// Compiles and simulates every candidate `strategy` offers for `batch` (already admitted) and
/// keeps the fastest that fits memory, or the least memory-hungry when none fits.
pub fn choose(
    strategy: &StrategyInfo,
    spec: &Spec,
    batch: &Batch,
    state: &StrategyState,
    choices: &Choices,
) -> Result<Choice, DriverError> {
    let candidates = (strategy.candidates)(spec, batch, state, choices);
    if candidates.is_empty() {
        return Err(DriverError::NoCandidate {
            strategy: strategy.name,
        });
    }
    let outcomes = evaluate_all(strategy, spec, batch, &candidates);
    let limit = (crate::machine::cost_model(spec).memory().capacity_bytes() as f64
        * TUNING_HEADROOM) as u64;
    let mut evaluations = Vec::with_capacity(outcomes.len());
    let mut best: Option<(usize, Compiled)> = None;
    for outcome in outcomes {
        let (evaluation, compiled) = outcome?;
        let index = evaluations.len();
        let better = match &best {
            None => true,
            Some((current, _)) => preferred(&evaluation.metrics, &evaluations[*current], limit),
        };
        evaluations.push(evaluation);
        if better {
            best = Some((index, compiled));
        }
    }
    let (chosen, compiled) = best.expect("at least one candidate was evaluated");
    Ok(Choice {
        evaluations,
        chosen,
        compiled,
    })
}

/// The fraction of device memory a configuration may use on the batch it is tuned on. A run
/// keeps the configuration for every later step, whose batches differ: a candidate tuned to
/// within a few percent of the capacity runs out of memory on some of them. Every strategy
/// is tuned with the same headroom.
pub const TUNING_HEADROOM: f64 = 0.92;

/// Whether `metrics` beats `current`: fitting (within `limit` bytes) beats not fitting; then
/// the shorter step (when both fit) or the smaller peak (when neither does).
fn preferred(metrics: &Metrics, current: &Evaluation, limit: u64) -> bool {
    let other = &current.metrics;
    let over = |m: &Metrics| m.oom || m.peak_memory_bytes > limit;
    match (over(metrics), over(other)) {
        (false, true) => true,
        (true, false) => false,
        (false, false) => metrics.step_time_s < other.step_time_s,
        (true, true) => metrics.peak_memory_bytes < other.peak_memory_bytes,
    }
}

/// Evaluates the candidates in parallel, results in candidate order.
fn evaluate_all(
    strategy: &StrategyInfo,
    spec: &Spec,
    batch: &Batch,
    candidates: &[Candidate],
) -> Vec<Result<(Evaluation, Compiled), DriverError>> {
    parallel_map(candidates, |candidate| {
        evaluate(strategy, spec, batch, candidate)
    })
}

/// Compiles and simulates the steps of a run whose configuration is chosen — each step's
/// (admitted) batch with its candidate — in parallel; evaluations in step order.
pub fn evaluate_steps(
    strategy: &StrategyInfo,
    spec: &Spec,
    steps: &[(Batch, Candidate)],
) -> Result<Vec<Evaluation>, DriverError> {
    parallel_map(steps, |(batch, candidate)| {
        evaluate(strategy, spec, batch, candidate).map(|(evaluation, _)| evaluation)
    })
    .into_iter()
    .collect()
}

/// `f` over `items` on up to `available_parallelism` threads; results in item order. A panic
/// in `f` is re-raised here.
fn parallel_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(items.len())
        .max(1);
    if threads == 1 {
        return items.iter().map(&f).collect();
    }
    let next = AtomicUsize::new(0);
    let mut slots: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let index = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(index) else {
                            return done;
                        };
                        done.push((index, f(item)));
                    }
                })
            })
            .collect();
        for worker in workers {
            let done = worker
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            for (index, result) in done {
                slots[index] = Some(result);
            }
        }
    });
    slots
        .into_iter()
        .map(|slot| slot.expect("every item was processed"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use slimpack_ir::batch::Sample;
    use slimpack_passes::strategy;

    fn batch(lengths: &[u32]) -> Batch {
        let samples: Vec<Sample> = lengths
            .iter()
            .enumerate()
            .map(|(doc, &len)| Sample {
                len,
                doc: doc as u64,
                piece: 0,
            })
            .collect();
        Batch {
            source: "test".into(),
            context: Some(4096),
            documents: samples.len(),
            documents_cut: 0,
            samples,
        }
    }

    #[test]
    fn eqsat_is_kept_only_when_the_simulator_agrees() {
        let spec = Spec::from_presets("llama-7b", "h100-sxm", "tp=8,pp=2,dp=4").unwrap();
        let batch = batch(&[
            4096, 3000, 2500, 900, 700, 512, 300, 260, 128, 100, 64, 2048,
        ]);
        let info = strategy::lookup("slimpack").unwrap();
        let state = StrategyState::default();
        let choices = Choices::fixed(spec.model.recompute);
        for candidate in (info.candidates)(&spec, &batch, &state, &choices) {
            let (evaluation, compiled) = evaluate(info, &spec, &batch, &candidate).unwrap();
            let eqsat = compiled
                .passes
                .iter()
                .find(|p| p.name == EQSAT)
                .expect("slimpack refines with eqsat");
            let with = eqsat
                .statistics
                .get("simulated_step_s")
                .unwrap()
                .as_f64()
                .unwrap();
            let without = eqsat
                .statistics
                .get("simulated_step_without_s")
                .unwrap()
                .as_f64()
                .unwrap();
            let kept = eqsat
                .statistics
                .get("kept_by_simulator")
                .unwrap()
                .as_bool()
                .unwrap();
            assert_eq!(kept, with <= without, "{}", candidate.label);
            assert_eq!(evaluation.metrics.step_time_s, with.min(without));
            // The step handed on is the one that was scored.
            let again = sim::simulate(&compiled.ir, &crate::machine::cost_model(&compiled.ir.spec));
            assert_eq!(
                again.unwrap().metrics.step_time_s,
                evaluation.metrics.step_time_s
            );
        }
    }
}
