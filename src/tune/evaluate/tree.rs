//! The prefix tree a group of candidates' pipelines run as ([`PipelineTree`]): shared
//! passes once, a pipeline whose rest another ran on the same step taking that one's step,
//! bounds against the fastest fitting step before packing backward, scheduling and
//! simulating ([`Pruning`]), and fallbacks decided on the step of the pipeline they fall back
//! from, deferred rather than pruned ([`Fallbacks`]). [`super::evaluate_verifying`] drives it
//! and scores what it hands on.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use slimpack_ir::step::Phase;
use slimpack_ir::StepIr;
use slimpack_machine::cost::CostModel;
use slimpack_machine::sim;
use slimpack_passes::micropack::RUNS_OVER_MEMORY;
use slimpack_passes::{
    run_pipeline_in, ManagerOptions, PassContext, PassError, PassRecord, PipelineEntry,
};

use super::super::autotune::{exceeds, TuneError};

/// Whether a packing's forward runs go over memory (`pack-fwd`'s statistic in `records`): a
/// fallback of the pipeline then makes another packing.
pub(super) fn runs_over_memory(records: &[PassRecord]) -> bool {
    records.iter().any(|record| {
        (record.statistics.get(RUNS_OVER_MEMORY)).and_then(|value| value.as_u64()) > Some(0)
    })
}

/// How many leading passes (name and options) every pipeline of a candidate shares.
pub(super) fn shared_prefix(pipelines: &[(String, Vec<PipelineEntry>)]) -> usize {
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
pub(super) enum TreeError {
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
pub(super) struct PipelineTree<'a> {
    pipelines: &'a [(String, Vec<PipelineEntry>)],
    cx: &'a PassContext,
    options: &'a ManagerOptions,
    /// Verify the step each pipeline finishes with (its passes then run without the
    /// verifier).
    verify_results: bool,
    /// Skip scheduling packings that cannot beat the fastest step (`None`: schedule all).
    pruning: Option<Pruning<'a>>,
    fallbacks: Fallbacks<'a>,
    /// Per pipeline, whether a fallback falls back from it.
    fallen_back_from: Vec<bool>,
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
/// rather than pruned: not run further unless a fallback's decision needs its step,
/// which is when that fallback is not pruned by its own bound, reaches its end, or would take
/// another pipeline's step. So a fallback whose own bound rules it out costs neither its
/// pipeline's scheduling nor its simulation, and the tree runs the fallbacks it would run
/// unpruned (the decision depends on that one step alone) and chooses the same.
pub(super) struct Fallbacks<'a> {
    /// Pipelines not to run after all (a fallback whose pipeline fit, kept its forward runs
    /// within memory, or was pruned), asked where a branch starts, and again once the
    /// pipeline it falls back from was run.
    pub(super) unwanted: &'a dyn Fn(usize) -> bool,
    /// Per pipeline, the pipeline it is a fallback of, if it is one.
    pub(super) fallback_of: &'a [Option<usize>],
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
pub(super) enum Finished {
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
    pub(super) fn new(
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
            fallen_back_from: (0..pipelines.len())
                .map(|index| fallbacks.fallback_of.contains(&Some(index)))
                .collect(),
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
    pub(super) fn run(
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
                // The pipelines whose steps decide on a fallback, where the packing so far
                // runs over memory (the same records for the whole branch).
                let runs_over = runs_over_memory(&records);
                for member in branch {
                    let entries = &self.pipelines[member].1;
                    let bound = ir
                        .as_ref()
                        .map(|ir| pruning.bound(ir, step, &entries[depth..]))
                        .transpose()
                        .map_err(TreeError::Pass)?
                        .flatten();
                    let deciding = self.fallen_back_from[member] && runs_over;
                    let deferrable = deciding && !self.resolved.borrow()[member];
                    match bound {
                        Some(bound) if exceeds(bound, pruning.fastest_s()) && deferrable => {
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
                        Some(bound) if exceeds(bound, pruning.fastest_s()) && !deciding => {
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

    /// Runs the pipeline `pipeline` (a fallback) falls back from where that one is deferred:
    /// the decision on the fallback needs its step; whether the fallback is unwanted after
    /// all.
    fn resolve_needs(
        &self,
        pipeline: usize,
        finish: &mut dyn FnMut(usize, Finished) -> Result<bool, TuneError>,
    ) -> Result<bool, TreeError> {
        let needed =
            self.fallbacks.fallback_of[pipeline].filter(|&of| self.deferred.borrow()[of].is_some());
        let Some(of) = needed else {
            return Ok(false);
        };
        self.resolve(of, finish)?;
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
pub(super) struct Pruning<'a> {
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

impl<'a> Pruning<'a> {
    /// Pruning against `fastest` (f64 bits) on `cost`, the group's machine, and `least`, the
    /// same without recomputation.
    pub(super) fn new(
        fastest: &'a AtomicU64,
        cost: &'a CostModel,
        least: &'a CostModel,
    ) -> Pruning<'a> {
        Pruning {
            fastest,
            cost,
            least,
            bounds: RefCell::new(Vec::new()),
        }
    }

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
