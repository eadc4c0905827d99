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

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use slimpack_ir::batch::Batch;
use slimpack_ir::spec::Recompute;
use slimpack_ir::step::Phase;
use slimpack_ir::{Spec, StepIr};
use slimpack_machine::cost::CostModel;
use slimpack_machine::sim::{self, Metrics};
use slimpack_passes::micropack::RUNS_OVER_MEMORY;
use slimpack_passes::{
    parse_pipeline, run_pipeline_in, ManagerOptions, PassContext, PassError, PassRecord,
    PipelineEntry,
};

use super::autotune::{
    candidate_spec, exceeds, preferred, within, AtomicMinF64, Evaluation, TuneError, TuneOptions,
    Verify,
};
use super::strategy::{Candidate, StrategyInfo};
use crate::compile::{compile_entries, Compiled};

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
    // Per pipeline, whether the tree deferred it (and has not run it since).
    let deferred: RefCell<Vec<bool>> = RefCell::new(vec![false; pipelines.len()]);
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
                deferred.borrow_mut()[index] = true;
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
        deferred.borrow_mut()[index] = false;
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
    let pruning = fastest.zip(least.as_ref()).map(|(fastest, least)| Pruning {
        fastest,
        cost,
        least,
        bounds: RefCell::new(Vec::new()),
    });
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
    // The deferred pipeline whose step the decision on a fallback needs: the one it falls
    // back from, where that one is deferred.
    let needs = |index: usize| -> Option<usize> {
        let of = fallback_of[index]?;
        deferred.borrow()[of].then_some(of)
    };
    let fallen_back_from: Vec<bool> = (0..pipelines.len())
        .map(|index| fallback_of.contains(&Some(index)))
        .collect();
    let fallbacks = Fallbacks {
        unwanted: &unwanted,
        needs: &needs,
        fallen_back_from: &fallen_back_from,
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

/// Whether a packing's forward runs go over memory (`pack-fwd`'s statistic in `records`): a
/// fallback of the pipeline then makes another packing.
fn runs_over_memory(records: &[PassRecord]) -> bool {
    records.iter().any(|record| {
        (record.statistics.get(RUNS_OVER_MEMORY)).and_then(|value| value.as_u64()) > Some(0)
    })
}

/// How many leading passes (name and options) every pipeline of a candidate shares.
fn shared_prefix(pipelines: &[(String, Vec<PipelineEntry>)]) -> usize {
    let first = &pipelines[0].1;
    (0..first.len())
        .take_while(|&i| {
            pipelines
                .iter()
                .all(|(_, entries)| entries.get(i).is_some_and(|e| same_pass(e, &first[i])))
        })
        .count()
}

/// Why running a [`PipelineTree`] stopped: a pass failed, or what was done with a finished
/// pipeline's step.
enum TreeError {
    Pass(PassError),
    Tune(TuneError),
}

/// A candidate's pipelines run as a prefix tree: passes that pipelines share from the start
/// run once, and the step is copied only where they part (slimpack's variants share the
/// asymmetric or mirrored `pack-bwd` their eqsat and no-eqsat forms both start from).
///
/// A pipeline whose remaining passes are those another pipeline ran on the same step is not
/// run: it makes that pipeline's step, so it takes that one's metrics. Steps are numbered as
/// passes make them, and passes that report they kept their input ([`PassRecord::kept_input`],
/// `eqsat` without a cheaper refinement) keep the number: slimpack's `...,eqsat,
/// schedule-pipeline` and `...,schedule-pipeline` variants are then one pipeline, scheduled
/// and simulated once.
struct PipelineTree<'a> {
    pipelines: &'a [(String, Vec<PipelineEntry>)],
    cx: &'a PassContext,
    options: &'a ManagerOptions,
    /// Verify the step each pipeline finishes with (its passes then run without the
    /// verifier).
    verify_results: bool,
    /// Skip scheduling packings that cannot beat the fastest step (`None`: schedule all).
    pruning: Option<Pruning<'a>>,
    fallbacks: Fallbacks<'a>,
    /// Per pipeline, where the bound deferred it ([`Fallbacks`]): the step, the depth and the
    /// path it stopped at, and its records so far.
    deferred: RefCell<Vec<Option<Deferred>>>,
    /// Pipelines run to their end after all, which are not deferred again.
    resolved: RefCell<Vec<bool>>,
    /// Steps numbered so far.
    steps: Cell<usize>,
    /// The pipelines that ran to their end, each with the steps on its way.
    ran: RefCell<Vec<RanPipeline>>,
}

/// What the tree asks about fallbacks (pipelines that run only where the pipeline they fall
/// back from made a step over the memory limit, its forward runs over memory).
///
/// A pipeline a fallback falls back from, whose forward runs go over memory, decides by its
/// step whether the fallback runs; where its bound is above the fastest step, it is deferred
/// rather than pruned: not run further unless a fallback's decision needs its step (`needs`),
/// which is when that fallback is not pruned by its own bound, reaches its end, or would take
/// another pipeline's step. So a fallback whose own bound rules it out costs neither its
/// pipeline's scheduling nor its simulation, and the tree runs the fallbacks it would run
/// unpruned (the decision depends on that one step alone) and chooses the same.
struct Fallbacks<'a> {
    /// Pipelines not to run after all (a fallback whose pipeline fit, kept its forward runs
    /// within memory, or was pruned), asked where a branch starts, and again once what it
    /// needs was run.
    unwanted: &'a dyn Fn(usize) -> bool,
    /// The deferred pipeline whose step the decision on this one needs.
    needs: &'a dyn Fn(usize) -> Option<usize>,
    /// Per pipeline, whether a fallback falls back from it.
    fallen_back_from: &'a [bool],
}

/// A pipeline the bound deferred, as [`PipelineTree::resolve`] runs it on.
struct Deferred {
    ir: Rc<StepIr>,
    step: usize,
    depth: usize,
    /// The steps on its way before `step`.
    path: Vec<(usize, usize)>,
    records: Vec<PassRecord>,
}

/// A pipeline that ran to its end: its index, its pass records, and each (step number,
/// depth) on its way — running its passes from that depth on that step made its step.
struct RanPipeline {
    index: usize,
    records: Vec<PassRecord>,
    path: Vec<(usize, usize)>,
}

/// A finished pipeline as [`PipelineTree::run`] hands it on.
enum Finished {
    /// Its passes ran and made `ir`.
    Ran {
        ir: Box<StepIr>,
        records: Vec<PassRecord>,
    },
    /// Its packing's compute bound is above the fastest fitting step found: not scheduled
    /// nor simulated ([`Pruning`]).
    Pruned,
    /// Its bound is above the fastest fitting step, but a fallback may need its step: not run
    /// further unless one does ([`Fallbacks`]); then it finishes again, run.
    Deferred,
    /// Its remaining passes are those the finished pipeline `same_as` ran on the same step;
    /// `records` are its passes' records (the other pipeline's for the passes not run).
    Same {
        same_as: usize,
        records: Vec<PassRecord>,
    },
}

impl<'a> PipelineTree<'a> {
    fn new(
        pipelines: &'a [(String, Vec<PipelineEntry>)],
        cx: &'a PassContext,
        options: &'a ManagerOptions,
        verify_results: bool,
        pruning: Option<Pruning<'a>>,
        fallbacks: Fallbacks<'a>,
    ) -> PipelineTree<'a> {
        PipelineTree {
            pipelines,
            cx,
            options,
            verify_results,
            pruning,
            fallbacks,
            deferred: RefCell::new((0..pipelines.len()).map(|_| None).collect()),
            resolved: RefCell::new(vec![false; pipelines.len()]),
            steps: Cell::new(1),
            ran: RefCell::new(Vec::new()),
        }
    }

    /// Runs the pipelines `members` (indices, ascending), whose first `depth` passes made
    /// `ir` (step number `step`, recorded in `records`, the steps before it on `path`), to
    /// their ends, handing each finished pipeline to `finish` with its index, in the order of
    /// `members` where pipelines sharing a pass are adjacent. `finish` answers whether it
    /// took a [`Finished::Same`] pipeline; one it did not take is run. A deferred pipeline is
    /// handed on twice where a fallback needs it: deferred, then run or taken as the same as
    /// another's (within the fallback's branch).
    fn run(
        &self,
        ir: StepIr,
        (step, depth): (usize, usize),
        path: &[(usize, usize)],
        members: &[usize],
        records: Vec<PassRecord>,
        finish: &mut dyn FnMut(usize, Finished) -> Result<bool, TuneError>,
    ) -> Result<(), TreeError> {
        let mut path = path.to_vec();
        path.push((step, depth));
        // Each pipeline that ends here, and each group continuing with the same pass, by its
        // first member.
        let mut branches: Vec<Vec<usize>> = Vec::new();
        for &member in members {
            let next = self.pipelines[member].1.get(depth);
            let joins = next.and_then(|entry| {
                branches.iter().position(|branch| {
                    self.pipelines[branch[0]]
                        .1
                        .get(depth)
                        .is_some_and(|e| same_pass(e, entry))
                })
            });
            match joins {
                Some(branch) => branches[branch].push(member),
                None => branches.push(vec![member]),
            }
        }
        let mut ir = Some(ir);
        let count = branches.len();
        // The step the deferred pipelines of every branch stop at, shared.
        let mut snapshot: Option<Rc<StepIr>> = None;
        for (position, mut branch) in branches.into_iter().enumerate() {
            // Pipelines whose rest another ran on this step (an earlier branch) are finished
            // at once.
            let mut to_run = Vec::with_capacity(branch.len());
            for member in branch {
                if (self.fallbacks.unwanted)(member) {
                    continue;
                }
                if let Some((same_as, rest)) = self.ran_the_same(member, step, depth) {
                    // Taking another's step decides, as running to the end would.
                    if self.resolve_needs(member, finish)? {
                        continue;
                    }
                    let mut same_records = records.clone();
                    same_records.extend(rest);
                    let finished = Finished::Same {
                        same_as,
                        records: same_records,
                    };
                    if finish(member, finished).map_err(TreeError::Tune)? {
                        continue;
                    }
                }
                to_run.push(member);
            }
            branch = to_run;
            if let Some(pruning) = &self.pruning {
                let mut live = Vec::with_capacity(branch.len());
                for member in branch {
                    let entries = &self.pipelines[member].1;
                    let bound = ir
                        .as_ref()
                        .map(|ir| pruning.bound(ir, step, &entries[depth..]))
                        .transpose()
                        .map_err(TreeError::Pass)?
                        .flatten();
                    let deciding = self.fallbacks.fallen_back_from[member]
                        && runs_over_memory(&records)
                        && !self.resolved.borrow()[member];
                    match bound {
                        Some(bound) if exceeds(bound, pruning.fastest_s()) && deciding => {
                            let ir = snapshot.get_or_insert_with(|| {
                                Rc::new(ir.clone().expect("a bounded step is kept"))
                            });
                            self.deferred.borrow_mut()[member] = Some(Deferred {
                                ir: Rc::clone(ir),
                                step,
                                depth,
                                path: path[..path.len() - 1].to_vec(),
                                records: records.clone(),
                            });
                            finish(member, Finished::Deferred).map_err(TreeError::Tune)?;
                        }
                        Some(bound)
                            if exceeds(bound, pruning.fastest_s())
                                && !(self.fallbacks.fallen_back_from[member]
                                    && runs_over_memory(&records)) =>
                        {
                            finish(member, Finished::Pruned).map_err(TreeError::Tune)?;
                        }
                        // Not pruned where bounded, or at its end: what its fallback decision
                        // needs runs now.
                        _ if bound.is_some() || entries.len() == depth => {
                            if !self.resolve_needs(member, finish)? {
                                live.push(member);
                            }
                        }
                        _ => live.push(member),
                    }
                }
                branch = live;
            }
            if branch.is_empty() {
                continue;
            }
            let mut step_ir = if position + 1 == count {
                ir.take()
                    .expect("the step is moved to the last branch only")
            } else {
                ir.as_ref()
                    .expect("the step is kept until the last branch")
                    .clone()
            };
            let entries = &self.pipelines[branch[0]].1;
            if entries.len() == depth {
                let mut records = records.clone();
                if self.verify_results {
                    let verify_start = Instant::now();
                    slimpack_ir::verify::verify(&step_ir).map_err(|source| {
                        TreeError::Pass(PassError::Invalid {
                            after: records.last().map(|record| record.name),
                            source,
                        })
                    })?;
                    if let Some(last) = records.last_mut() {
                        last.verify_ms += verify_start.elapsed().as_secs_f64() * 1e3;
                    }
                }
                let finished = Finished::Ran {
                    ir: Box::new(step_ir),
                    records: records.clone(),
                };
                finish(branch[0], finished).map_err(TreeError::Tune)?;
                self.ran.borrow_mut().push(RanPipeline {
                    index: branch[0],
                    records: records.clone(),
                    path: path.clone(),
                });
                continue;
            }
            // The passes the branch's pipelines share from here, run at once; under pruning,
            // up to a pass that simulates the step, whose schedule is bounded first (the
            // recursion's check): most steps `interleave-ranks` would simulate are pruned there.
            let end = (depth..entries.len())
                .take_while(|&at| {
                    let bounded_first = at > depth
                        && self.pruning.is_some()
                        && simulates(entries[at].info.name, &step_ir);
                    !bounded_first
                        && branch.iter().all(|&member| {
                            self.pipelines[member]
                                .1
                                .get(at)
                                .is_some_and(|e| same_pass(e, &entries[at]))
                        })
                })
                .last()
                .map_or(depth, |at| at + 1);
            let run = run_pipeline_in(
                &mut step_ir,
                &entries[depth..end],
                self.cx,
                self.options,
                &mut std::io::sink(),
            )
            .map_err(TreeError::Pass)?;
            let made = match run.iter().all(PassRecord::kept_input) {
                true => step,
                false => self.steps.replace(self.steps.get() + 1),
            };
            let mut branch_records = records.clone();
            branch_records.extend(run);
            self.run(step_ir, (made, end), &path, &branch, branch_records, finish)?;
        }
        Ok(())
    }

    /// Runs the deferred pipelines the decision on `pipeline` (a fallback) needs
    /// ([`Fallbacks::needs`]); whether it is unwanted after all.
    fn resolve_needs(
        &self,
        pipeline: usize,
        finish: &mut dyn FnMut(usize, Finished) -> Result<bool, TuneError>,
    ) -> Result<bool, TreeError> {
        let Some(needs) = (self.fallbacks.needs)(pipeline) else {
            return Ok(false);
        };
        self.resolve(needs, finish)?;
        Ok((self.fallbacks.unwanted)(pipeline))
    }

    /// Runs the deferred pipeline `pipeline` to its end, from where it stopped (see
    /// [`Fallbacks`]).
    fn resolve(
        &self,
        pipeline: usize,
        finish: &mut dyn FnMut(usize, Finished) -> Result<bool, TuneError>,
    ) -> Result<(), TreeError> {
        let Some(deferred) = self.deferred.borrow_mut()[pipeline].take() else {
            return Ok(());
        };
        self.resolved.borrow_mut()[pipeline] = true;
        let ir = Rc::unwrap_or_clone(deferred.ir);
        let at = (deferred.step, deferred.depth);
        self.run(
            ir,
            at,
            &deferred.path,
            &[pipeline],
            deferred.records,
            finish,
        )
    }

    /// A pipeline that ran to its end from step number `step` with the passes `pipeline` has
    /// left from `depth`, and the records of those passes.
    fn ran_the_same(
        &self,
        pipeline: usize,
        step: usize,
        depth: usize,
    ) -> Option<(usize, Vec<PassRecord>)> {
        let rest = &self.pipelines[pipeline].1[depth..];
        let ran = self.ran.borrow();
        ran.iter().find_map(|other| {
            other.path.iter().find_map(|&(other_step, other_depth)| {
                let other_rest = &self.pipelines[other.index].1[other_depth..];
                let same = other_step == step
                    && other_rest.len() == rest.len()
                    && other_rest.iter().zip(rest).all(|(a, b)| same_pass(a, b));
                same.then(|| (other.index, other.records[other_depth..].to_vec()))
            })
        })
    }
}

/// What the tree prunes against: a step whose bound is above the fastest fitting step found
/// so far is not taken further, since nothing it makes simulates faster. Forward packs about
/// to be packed backward are bounded by their own compute and the least backward their
/// replicas' samples take ([`sim::forward_bound`]: `pack-bwd` keeps the forward packs and the
/// samples' replicas), a packing about to be scheduled by its compute after the pipeline fill
/// ([`sim::compute_bound`]), a scheduled step by its schedules ([`sim::schedule_bound`])
/// before it is simulated or handed to `assign-recompute`
/// — only where what is left of the pipeline is `pack-bwd` (for forward packs: it adds
/// backward packs of each replica's own samples), `schedule-pipeline` (which orders the packs
/// and may split backwards, no faster than whole ones), `assign-recompute` (bounded with
/// no recomputation on any stage) and `interleave-ranks` (a replica interleaved with others on
/// its ranks runs its own schedule no sooner than alone). A pipeline whose step decides
/// whether a fallback of it runs is deferred instead where its forward runs go over memory
/// ([`Fallbacks`]).
struct Pruning<'a> {
    fastest: &'a AtomicU64,
    /// The machine of the group's spec, and with no recomputation.
    cost: &'a CostModel,
    least: &'a CostModel,
    /// Bounds computed so far: (step number, what it bounds, with no recomputation, seconds).
    bounds: RefCell<Vec<(usize, Bounded, bool, f64)>>,
}

/// What a [`Pruning`] bound is taken on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bounded {
    /// Forward packs, before `pack-bwd` ([`sim::forward_bound`]).
    ForwardPacks,
    /// A packing, before `schedule-pipeline` ([`sim::compute_bound`]).
    Packing,
    /// A schedule ([`sim::schedule_bound`]).
    Schedule,
}

impl Pruning<'_> {
    /// The fastest fitting step found so far.
    fn fastest_s(&self) -> f64 {
        f64::from_bits(self.fastest.load(Ordering::Acquire))
    }

    /// The bound on the steps the passes `rest` make of `ir` (step number `step`), where the
    /// bound holds for what they are; `None` otherwise.
    fn bound(
        &self,
        ir: &StepIr,
        step: usize,
        rest: &[PipelineEntry],
    ) -> Result<Option<f64>, PassError> {
        // Passes that keep the forward packs and every slice on its sample's replica, and do
        // not lengthen a step past what its packs must run.
        let bounded = |name: &str| {
            matches!(
                name,
                "pack-bwd" | "schedule-pipeline" | "assign-recompute" | "interleave-ranks"
            )
        };
        if !rest.iter().all(|entry| bounded(entry.info.name)) {
            return Ok(None);
        }
        let what = match rest.first().map(|entry| entry.info.name) {
            Some("pack-bwd") if ir.phase() == Phase::Assigned => Bounded::ForwardPacks,
            Some("pack-bwd") => return Ok(None),
            Some("schedule-pipeline") => Bounded::Packing,
            _ if ir.phase() >= Phase::Scheduled => Bounded::Schedule,
            _ => return Ok(None),
        };
        let least = rest
            .iter()
            .any(|entry| entry.info.name == "assign-recompute");
        let known =
            self.bounds.borrow().iter().find_map(|&(s, w, l, bound)| {
                (s == step && w == what && l == least).then_some(bound)
            });
        if let Some(bound) = known {
            return Ok(Some(bound));
        }
        let cost = if least { self.least } else { self.cost };
        let bound = match what {
            Bounded::ForwardPacks => sim::forward_bound(ir, cost),
            Bounded::Packing => sim::compute_bound(ir, cost),
            Bounded::Schedule => sim::schedule_bound(ir, cost),
        }
        .map_err(|error| PassError::Failed {
            pass: match what {
                Bounded::ForwardPacks => "pack-bwd",
                Bounded::Packing | Bounded::Schedule => "schedule-pipeline",
            },
            message: format!("bounding the step: {error}"),
        })?;
        self.bounds.borrow_mut().push((step, what, least, bound));
        Ok(Some(bound))
    }
}

/// Whether `pass` simulates the step it is given (`assign-recompute`'s memory probe,
/// `interleave-ranks`' orders where a DP rank is in several replicas): the tree bounds a
/// schedule before running such a pass. Not before one that does not simulate: the bound of
/// the step it makes would be computed again (on a million-sample step, seconds).
fn simulates(pass: &str, ir: &StepIr) -> bool {
    match pass {
        "assign-recompute" => true,
        "interleave-ranks" => ir.replica_counts().iter().any(|&count| count > 1),
        _ => false,
    }
}

/// Two pipeline entries run the same pass with the same options.
fn same_pass(a: &PipelineEntry, b: &PipelineEntry) -> bool {
    a.info.name == b.info.name && a.options == b.options
}
