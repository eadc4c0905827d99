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
//! error names the pass.

use std::cell::{Cell, RefCell};
use std::time::Instant;

use slimpack_ir::batch::Batch;
use slimpack_ir::spec::Recompute;
use slimpack_ir::{Spec, StepIr};
use slimpack_machine::sim::{self, Metrics};
use slimpack_passes::{
    parse_pipeline, run_pipeline_in, ManagerOptions, PassContext, PassError, PassRecord,
    PipelineEntry,
};

use super::autotune::{candidate_spec, preferred, Evaluation, TuneError, TuneOptions, Verify};
use super::strategy::{Candidate, StrategyInfo};
use crate::compile::{compile_entries, Compiled};

/// Compiles and simulates one candidate: its pipeline and each of its variants (the passes they
/// share run once), keeping the best step — fitting (within `limit` bytes, see
/// [`Choices::memory_limit_bytes`]) before not fitting, then the faster (ties to the earlier
/// pipeline).
pub fn evaluate(
    strategy: &StrategyInfo,
    spec: &Spec,
    batch: &Batch,
    candidate: &Candidate,
    limit: u64,
) -> Result<(Evaluation, Compiled), TuneError> {
    evaluate_with(
        strategy,
        spec,
        batch,
        candidate,
        limit,
        &TuneOptions::default(),
    )
}

/// [`evaluate`] with the caller's options (verification: with [`Verify::Candidates`] the
/// verifier checks each pipeline's result, otherwise the candidate is not verified here); when one is broken, the candidate is compiled again verifying every pass, so that
/// the error names the pass that broke it.
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
            verify,
            verify_result_only,
        )
        .map(|mut evaluated| evaluated.remove(0))
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
    if members.len() > 1 {
        if let Ok(evaluated) = evaluate_verifying(
            strategy,
            spec,
            batch,
            members,
            limit,
            tune.verify == Verify::Candidates,
            true,
        ) {
            return evaluated.into_iter().map(Ok).collect();
        }
    }
    members
        .iter()
        .map(|candidate| evaluate_with(strategy, spec, batch, candidate, limit, tune))
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
/// verifying their pipelines' results or every pass; each member's best step.
fn evaluate_verifying(
    strategy: &StrategyInfo,
    spec: &Spec,
    batch: &Batch,
    members: &[&Candidate],
    limit: u64,
    verify: bool,
    verify_result_only: bool,
) -> Result<Vec<(Evaluation, Compiled)>, TuneError> {
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
    for (member, candidate) in members.iter().enumerate() {
        debug_assert_eq!(candidate_spec(&spec, candidate), spec, "one spec per group");
        pipelines.push((
            String::new(),
            parse_pipeline(&candidate.pipeline).map_err(compile_error)?,
        ));
        member_of.push(member);
        for variant in &candidate.variants {
            let entries = parse_pipeline(&variant.pipeline).map_err(compile_error)?;
            pipelines.push((variant.label.clone(), entries));
            member_of.push(member);
        }
    }
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
    let mut best: Vec<Best> = (0..members.len()).map(|_| None).collect();
    // The metrics of every pipeline finished so far, and how many of each member's were shared.
    let mut scored: Vec<Option<Metrics>> = vec![None; pipelines.len()];
    let mut shared_count = vec![0; members.len()];
    let mut keep = |index: usize, finished: Finished| {
        let member = member_of[index];
        let (metrics, ir, records, same_as) = match finished {
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
        let best = &mut best[member];
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
    let tree = PipelineTree::new(&pipelines, &cx, &options, verify_results);
    let all: Vec<usize> = (0..pipelines.len()).collect();
    tree.run(base.ir, (0, shared), &[], &all, base.passes, &mut keep)
        .map_err(|error| match error {
            TreeError::Pass(source) => compile_error(source),
            TreeError::Tune(error) => error,
        })?;
    let compile_ms = start.elapsed().as_secs_f64() * 1e3 / members.len() as f64;
    let evaluated = members
        .iter()
        .zip(best)
        .zip(shared_count)
        .map(|((candidate, best), variants_shared)| {
            let (index, ir, passes, metrics) = best.expect("a candidate has a pipeline");
            let evaluation = Evaluation {
                candidate: (*candidate).clone(),
                variant: pipelines[index].0.clone(),
                metrics,
                compile_ms,
                passes: passes.clone(),
                variants_shared,
            };
            let compiled = Compiled {
                ir,
                passes,
                compile_ms,
            };
            (evaluation, compiled)
        })
        .collect();
    Ok(evaluated)
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
    /// Steps numbered so far.
    steps: Cell<usize>,
    /// The pipelines that ran to their end, each with the steps on its way.
    ran: RefCell<Vec<RanPipeline>>,
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
    ) -> PipelineTree<'a> {
        PipelineTree {
            pipelines,
            cx,
            options,
            verify_results,
            steps: Cell::new(1),
            ran: RefCell::new(Vec::new()),
        }
    }

    /// Runs the pipelines `members` (indices, ascending), whose first `depth` passes made
    /// `ir` (step number `step`, recorded in `records`, the steps before it on `path`), to
    /// their ends, handing each finished pipeline to `finish` with its index, in the order of
    /// `members` where pipelines sharing a pass are adjacent. `finish` answers whether it
    /// took a [`Finished::Same`] pipeline; one it did not take is run.
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
        for (position, mut branch) in branches.into_iter().enumerate() {
            // Pipelines whose rest another ran on this step (an earlier branch) are finished
            // at once.
            let mut to_run = Vec::with_capacity(branch.len());
            for member in branch {
                if let Some((same_as, rest)) = self.ran_the_same(member, step, depth) {
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
            // The passes the branch's pipelines share from here, run at once.
            let end = (depth..entries.len())
                .take_while(|&at| {
                    branch.iter().all(|&member| {
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

/// Two pipeline entries run the same pass with the same options.
fn same_pass(a: &PipelineEntry, b: &PipelineEntry) -> bool {
    a.info.name == b.info.name && a.options == b.options
}
