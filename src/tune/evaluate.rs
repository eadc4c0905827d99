//! One candidate (or a group of candidates) compiled and simulated: what the tuner scores.
//!
//! A candidate's pipelines (its variants) run as a prefix tree ([`PipelineTree`]): shared
//! passes run once, and a variant whose remaining passes another variant ran on the same step
//! takes that variant's metrics instead of being scheduled and simulated again (the same
//! choice as running it). Candidates that differ only from `schedule-pipeline` on (slimpack's
//! zero-bubble and per-stage recomputation twins: [`compiled_together`]) run in one tree, so
//! their packing and refinement run once for the group; each keeps the best of its own
//! pipelines, as it would alone. With result-only verification the tree verifies the step each
//! pipeline finishes with; a broken one is compiled again verifying every pass, so that the
//! error names the pass. Against the fastest fitting step found so far ([`evaluate_below`]:
//! by other candidates, or by the tree's own pipelines as they finish), the tree bounds
//! forward packs before packing their backward, a packing before scheduling it and a schedule
//! before simulating it, and takes neither further where the bound is above that step (a
//! pipeline whose step decides on a fallback is deferred instead: [`Fallbacks`]).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use slimpack_ir::batch::Batch;
use slimpack_ir::spec::Recompute;
use slimpack_ir::{Spec, StepIr};
use slimpack_machine::sim::{self, Metrics};
use slimpack_passes::{parse_pipeline, ManagerOptions, PassContext, PassError, PassRecord};

use super::autotune::{
    candidate_spec, preferred, within, AtomicMinF64, Evaluation, TuneError, TuneOptions, Verify,
};
use super::strategy::{Candidate, StrategyInfo};
use crate::compile::{compile_entries, Compiled};

mod tree;
use tree::{
    runs_over_memory, shared_prefix, Fallbacks, Finished, PipelineTree, Pruning, TreeError,
};

/// Compiles and simulates one candidate: its pipeline and each of its variants (the passes they
/// share run once), keeping the best step — fitting (within `limit` bytes, see
/// [`super::strategy::Choices::memory_limit_bytes`]) before not fitting, then the faster (ties to the earlier
/// pipeline).
pub fn evaluate(
    strategy: &StrategyInfo,
    spec: &Spec,
    batch: &Batch,
    candidate: &Candidate,
    limit: u64,
) -> Result<(Evaluation, Compiled), TuneError> {
    let verified = TuneOptions {
        verify: Verify::Candidates,
        ..TuneOptions::default()
    };
    evaluate_with(strategy, spec, batch, candidate, limit, &verified)
}

/// [`evaluate`] (which verifies) with the caller's options: with [`Verify::Candidates`] the
/// verifier checks each pipeline's result, otherwise the candidate is not verified here (the
/// caller verifies the step it hands on, [`super::autotune::verify_chosen`]); when one is
/// broken, the candidate is compiled again verifying every pass, so that the error names the
/// pass that broke it.
pub fn evaluate_with(
    strategy: &StrategyInfo,
    spec: &Spec,
    batch: &Batch,
    candidate: &Candidate,
    limit: u64,
    tune: &TuneOptions,
) -> Result<(Evaluation, Compiled), TuneError> {
    let alone = [candidate];
    let evaluate = |verify, verify_result_only| {
        evaluate_verifying(
            strategy,
            spec,
            batch,
            &alone,
            limit,
            (verify, verify_result_only),
            None,
        )
        .map(|mut evaluated| {
            evaluated
                .remove(0)
                .expect("nothing is pruned without a step to beat")
        })
    };
    match evaluate(tune.verify == Verify::Candidates, true) {
        Err(TuneError::Compile { source, .. }) if matches!(*source, PassError::Invalid { .. }) => {
            evaluate(true, false)
        }
        outcome => outcome,
    }
}

/// [`evaluate_with`] of every one of `members` (see [`compiled_together`]: one spec, a shared
/// prefix), compiled as one prefix tree: the passes their pipelines share run once, each
/// member keeps the best of its own pipelines, and each member's evaluation is the one
/// [`evaluate_with`] makes of it alone but for `compile_ms`, the group's wall time shared
/// equally. Where the group fails, each member is evaluated alone, so an error is the one its
/// own evaluation gives.
pub fn evaluate_together(
    strategy: &StrategyInfo,
    spec: &Spec,
    batch: &Batch,
    members: &[&Candidate],
    limit: u64,
    tune: &TuneOptions,
) -> Vec<Result<(Evaluation, Compiled), TuneError>> {
    evaluate_below(strategy, spec, batch, members, limit, tune, None)
        .into_iter()
        .map(|outcome| {
            outcome.map(|evaluated| evaluated.expect("nothing is pruned without a step to beat"))
        })
        .collect()
}

/// [`evaluate_together`] against `fastest`, the fastest fitting step the tuning has found so
/// far (f64 bits, lowered by other threads meanwhile): a packing or a schedule whose bound is
/// above it goes no further ([`Pruning`]), and a member that
/// could not be chosen because of that (none of its pipelines left, or its best one not a
/// fitting step at most `fastest`) is `None`, pruned, as a candidate whose bound is above the
/// fastest step is.
pub(super) fn evaluate_below(
    strategy: &StrategyInfo,
    spec: &Spec,
    batch: &Batch,
    members: &[&Candidate],
    limit: u64,
    tune: &TuneOptions,
    fastest: Option<&AtomicU64>,
) -> Vec<Result<Option<(Evaluation, Compiled)>, TuneError>> {
    if members.len() > 1 || (members.len() == 1 && fastest.is_some()) {
        let verify = (tune.verify == Verify::Candidates, true);
        if let Ok(evaluated) =
            evaluate_verifying(strategy, spec, batch, members, limit, verify, fastest)
        {
            return evaluated.into_iter().map(Ok).collect();
        }
    }
    members
        .iter()
        .map(|candidate| evaluate_with(strategy, spec, batch, candidate, limit, tune).map(Some))
        .collect()
}

/// The candidates to compile together, as groups of indices into `candidates` (each in the
/// strategy's order, every candidate in one group): candidates that run with the same spec
/// (recompute mode and model chunks) and whose pipelines are the same up to
/// `schedule-pipeline` — slimpack's candidates, their zero-bubble twins (which differ in
/// `schedule-pipeline{zb=true}` only) and their per-stage recomputation twins (which add
/// `assign-recompute` after it) — so their packing and refinement run once.
pub fn compiled_together(candidates: &[Candidate]) -> Vec<Vec<usize>> {
    let key = |candidate: &Candidate| {
        let packed = match candidate.pipeline.find("schedule-pipeline") {
            Some(at) => &candidate.pipeline[..at],
            None => candidate.pipeline.as_str(),
        };
        (candidate.recompute, candidate.vpp, packed.to_string())
    };
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut keys: Vec<(Recompute, Option<u32>, String)> = Vec::new();
    for (index, candidate) in candidates.iter().enumerate() {
        let key = key(candidate);
        match keys.iter().position(|other| *other == key) {
            Some(group) => groups[group].push(index),
            None => {
                keys.push(key);
                groups.push(vec![index]);
            }
        }
    }
    groups
}

/// `members` (one spec: [`compiled_together`]) compiled and simulated as one prefix tree,
/// verifying (`(verify, verify_result_only)`) their pipelines' results or every pass; each
/// member's best step, or `None` where it was pruned against `fastest` (see
/// [`evaluate_below`]).
fn evaluate_verifying(
    strategy: &StrategyInfo,
    spec: &Spec,
    batch: &Batch,
    members: &[&Candidate],
    limit: u64,
    (verify, verify_result_only): (bool, bool),
    fastest: Option<&AtomicU64>,
) -> Result<Vec<Option<(Evaluation, Compiled)>>, TuneError> {
    let first = members[0];
    let spec = candidate_spec(spec, first);
    let cx = PassContext::for_spec(&spec);
    let cost = cx.machine();
    let compile_error = |source| TuneError::Compile {
        strategy: strategy.name,
        candidate: first.label.clone(),
        source: Box::new(source),
    };
    // Every member's pipelines, one after the other: its own, then its variants.
    let mut pipelines = Vec::new();
    let mut member_of = Vec::new();
    // Per pipeline: the pipeline (of the same member) it is the fallback of, if it is one.
    let mut fallback_of: Vec<Option<usize>> = Vec::new();
    for (member, candidate) in members.iter().enumerate() {
        debug_assert_eq!(candidate_spec(&spec, candidate), spec, "one spec per group");
        let own_first = pipelines.len();
        pipelines.push((
            String::new(),
            parse_pipeline(&candidate.pipeline).map_err(compile_error)?,
        ));
        member_of.push(member);
        fallback_of.push(None);
        let own = std::iter::once(&candidate.pipeline)
            .chain(candidate.variants.iter().map(|v| &v.pipeline))
            .collect::<Vec<_>>();
        for variant in &candidate.variants {
            let entries = parse_pipeline(&variant.pipeline).map_err(compile_error)?;
            pipelines.push((variant.label.clone(), entries));
            member_of.push(member);
            fallback_of.push(variant.fallback_of.as_ref().map(|of| {
                let at = own.iter().position(|&p| p == of);
                own_first
                    + at.expect(
                        "a fallback's pipeline is one of its candidate's (bug in the strategy)",
                    )
            }));
        }
    }
    // Per pipeline, once it finished: whether a fallback of it is wanted — its step went over
    // the memory limit, and its packing says the fallback's would differ (forward runs over
    // memory, `pack-fwd`'s statistic). A pruned pipeline wants none: nothing it makes is
    // chosen (a pipeline whose step would decide on a fallback is deferred instead, see
    // [`Fallbacks`]).
    let fallback_from: RefCell<Vec<Option<bool>>> = RefCell::new(vec![None; pipelines.len()]);
    let shared = shared_prefix(&pipelines);
    // With result-only verification the tree verifies the step each pipeline finishes with
    // ([`PipelineTree::run`]), not the steps where pipelines part.
    let options = ManagerOptions {
        verify: verify && !verify_result_only,
        ..ManagerOptions::default()
    };
    let verify_results = verify && verify_result_only;
    let start = Instant::now();
    let base = compile_entries(
        &spec,
        batch,
        &pipelines[0].1[..shared],
        &cx,
        &options,
        &mut std::io::sink(),
    )
    .map_err(compile_error)?;
    // Each member's best pipeline so far: fitting before not fitting, then faster; ties to
    // the earlier.
    type Best = Option<(usize, StepIr, Vec<PassRecord>, Metrics)>;
    let best: RefCell<Vec<Best>> = RefCell::new((0..members.len()).map(|_| None).collect());
    // The metrics of every pipeline finished so far, and how many of each member's were shared.
    let mut scored: Vec<Option<Metrics>> = vec![None; pipelines.len()];
    let mut shared_count = vec![0; members.len()];
    let mut pruned = vec![false; members.len()];
    let mut keep = |index: usize, finished: Finished| {
        let member = member_of[index];
        let (metrics, ir, records, same_as) = match finished {
            Finished::Pruned => {
                pruned[member] = true;
                fallback_from.borrow_mut()[index] = Some(false);
                return Ok(true);
            }
            Finished::Deferred => {
                pruned[member] = true;
                return Ok(true);
            }
            Finished::Ran { ir, records } => {
                let ir = *ir;
                let metrics = sim::simulate(&ir, cost)
                    .map_err(|source| TuneError::Simulate {
                        strategy: strategy.name,
                        candidate: members[member].label.clone(),
                        source: Box::new(source),
                    })?
                    .metrics;
                (metrics, Some(ir), records, index)
            }
            Finished::Same { same_as, records } => {
                let metrics = scored[same_as]
                    .clone()
                    .expect("a pipeline is the same as one that finished (bug in the tuner)");
                (metrics, None, records, same_as)
            }
        };
        // A fitting step prunes the rest of the tree (and of the other threads' candidates)
        // at once, not only after the group: the member's best is no slower.
        if let Some(fastest) = fastest.filter(|_| within(&metrics, limit)) {
            fastest.fetch_min_f64(metrics.step_time_s, Ordering::AcqRel);
        }
        fallback_from.borrow_mut()[index] =
            Some(!within(&metrics, limit) && runs_over_memory(&records));
        let mut bests = best.borrow_mut();
        let best = &mut bests[member];
        let better = best
            .as_ref()
            .is_none_or(|(current, _, _, current_metrics)| {
                preferred(&metrics, current_metrics, limit)
                    || (index < *current && !preferred(current_metrics, &metrics, limit))
            });
        let ir = match ir {
            Some(ir) => ir,
            None if !better => {
                scored[index] = Some(metrics);
                shared_count[member] += 1;
                return Ok(true);
            }
            // Preferred to the member's best step: where that is the step of the pipeline it
            // is the same as (equal metrics, an earlier index), it takes that step; otherwise
            // (a tie with a third pipeline, or the same as another member's) it is run after
            // all.
            None => match best.take() {
                Some((current, ir, _, _)) if current == same_as => {
                    shared_count[member] += 1;
                    ir
                }
                other => {
                    *best = other;
                    return Ok(false);
                }
            },
        };
        if better {
            *best = Some((index, ir, records, metrics.clone()));
        }
        scored[index] = Some(metrics);
        Ok(true)
    };
    // The machine without recomputation bounds `assign-recompute`'s steps; only for pruning.
    let least = fastest.map(|_| cost.with_recompute(Recompute::None));
    let pruning =
        (fastest.zip(least.as_ref())).map(|(fastest, least)| Pruning::new(fastest, cost, least));
    let fallbacks_skipped = RefCell::new(vec![0usize; members.len()]);
    // A fallback runs where its pipeline wants one (its step went over the memory limit and
    // its forward runs over memory): what it depends on is that pipeline's step alone, so the
    // tree (which defers a pipeline a fallback may need rather than prune it, see
    // [`Fallbacks`]) runs the same fallbacks with pruning as without. The tree asks at every
    // branch on the way; the pipeline a fallback falls back from is in an earlier branch where
    // they part (`pack-fwd`), so it has finished or been deferred by the time the fallback's
    // own branch runs (undecided before: kept).
    let unwanted = |index: usize| {
        let unwanted =
            fallback_of[index].is_some_and(|of| fallback_from.borrow()[of] == Some(false));
        // The tree drops an unwanted pipeline where it is first found so: counted once.
        if unwanted {
            fallbacks_skipped.borrow_mut()[member_of[index]] += 1;
        }
        unwanted
    };
    let fallbacks = Fallbacks {
        unwanted: &unwanted,
        fallback_of: &fallback_of,
    };
    let tree = PipelineTree::new(
        &pipelines,
        &cx,
        &options,
        verify_results,
        pruning,
        fallbacks,
    );
    let all: Vec<usize> = (0..pipelines.len()).collect();
    tree.run(base.ir, (0, shared), &[], &all, base.passes, &mut keep)
        .map_err(|error| match error {
            TreeError::Pass(source) => compile_error(source),
            TreeError::Tune(error) => error,
        })?;
    // The steps of deferred pipelines no fallback needed go now.
    drop(tree);
    let compile_ms = start.elapsed().as_secs_f64() * 1e3 / members.len() as f64;
    // A member that lost a pipeline to the bound is chosen only with a fitting step no slower
    // than the fastest (ties to the earlier candidate), which its best remaining one is not.
    let fastest_s = fastest.map_or(f64::INFINITY, |f| f64::from_bits(f.load(Ordering::Acquire)));
    let evaluated = members
        .iter()
        .zip(best.into_inner())
        .zip(shared_count)
        .zip(pruned)
        .zip(fallbacks_skipped.into_inner())
        .map(
            |((((candidate, best), variants_shared), pruned), fallbacks_skipped)| {
                let (index, ir, passes, metrics) = best?;
                if pruned && !(within(&metrics, limit) && metrics.step_time_s <= fastest_s) {
                    return None;
                }
                let evaluation = Evaluation {
                    candidate: (*candidate).clone(),
                    variant: pipelines[index].0.clone(),
                    metrics,
                    compile_ms,
                    passes: passes.clone(),
                    variants_shared,
                    fallbacks_skipped,
                };
                let compiled = Compiled {
                    ir,
                    passes,
                    compile_ms,
                };
                Some((evaluation, compiled))
            },
        )
        .collect();
    Ok(evaluated)
}
