//! The autotuner: compiles every candidate configuration of a strategy, scores each with the
//! simulator, and keeps the fastest that fits memory.
//!
//! A strategy ([`super::strategy`]) offers candidates: pipelines with a recompute mode
//! and a label (`cp=2,recompute=selective`). [`choose`] compiles each on the batch (with the
//! model's recompute mode replaced by the candidate's), simulates it, and returns the fastest
//! candidate whose predicted peak memory fits the device; if none fits, the one with the least
//! peak memory, marked OOM. Candidates run on parallel threads; the choice is deterministic
//! (ties go to the earlier candidate). [`admit`] applies a strategy's admission hook (the steps
//! a run carries over, e.g. WLB-LLM's delayed outliers) before a batch is compiled.
//!
//! Pruning: before compiling anything, [`choose`] bounds every candidate's step time from below
//! with the machine model ([`candidate_bound`]: the batch's work under the candidate's
//! recompute mode and layout at the best rates any packing reaches, spread perfectly over the
//! devices, plus the DP sync tail; no schedule the simulator runs is faster), starts the
//! candidates in the order of their bounds (the strategy's order among equal bounds), and skips
//! without compiling every candidate whose bound is above the fastest fitting step simulated
//! so far in its family ([`super::kept::family`]: slimpack's own pipelines, each peer's plans;
//! for a single step, [`TuneOptions::per_family`] off, the fastest of all).
//! Compiled candidates are bounded again as they go (`super::evaluate`): forward packs by
//! their compute and the least backward of their replicas' samples
//! ([`slimpack_machine::sim::forward_bound`]) before the backward is packed, a packing by the
//! compute its devices must run after the pipeline fill
//! ([`slimpack_machine::sim::compute_bound`]) before it is scheduled, a schedule by one
//! replica's run without contention
//! ([`slimpack_machine::sim::schedule_bound`]) before it is simulated. A skipped candidate
//! simulates slower than that step, so it could not have been chosen: the choice is the one an
//! exhaustive tuning makes (ties still go to the earlier candidate in the strategy's order,
//! since only a bound strictly above the best prunes), and so, pruning per family, is each
//! family's best fitting candidate, which `plan` keeps beside the choice ([`super::kept`]).
//! Which candidates are pruned depends on the order threads finish in; the choice does not.
//!
//! Each candidate is compiled and simulated by [`super::evaluate`] (its variants as a prefix
//! tree; candidates that differ only from `schedule-pipeline` on compiled together).
//!
//! [`TuneOptions`] carry what the command line asks of the tuning: what is verified
//! ([`Verify`]: the chosen step by default, every candidate's with `--verify-candidates`,
//! nothing with `--no-verify`; the step handed on is checked either way), whether candidates are pruned by their
//! bounds, and an optional wall-clock budget (`--tune-budget-ms`): once it is spent, candidates
//! not yet started are skipped (the first one started always runs) — once one fits the memory
//! limit: until then the search goes on, since a budget must not turn a step that fits into
//! one reported as not fitting. A budget makes the choice depend on the machine's speed;
//! without one the choice is deterministic.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::strategy::{Candidate, Choices, StrategyInfo, StrategyState};
use slimpack_ir::batch::Batch;
use slimpack_ir::Spec;
use slimpack_machine::cost::BatchAttention;
use slimpack_machine::sim::Metrics;
use slimpack_machine::MachineError;
use slimpack_passes::{parse_pipeline, PassError, PassRecord};

use super::evaluate::evaluate_below;
pub use super::evaluate::{compiled_together, evaluate, evaluate_together, evaluate_with};
pub use super::verify::{verify_chosen, Verify};
use crate::compile::Compiled;

/// Why a strategy could not be tuned.
#[derive(Debug, thiserror::Error)]
pub enum TuneError {
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
        source: Box<MachineError>,
    },
    #[error("strategy '{strategy}' is not applicable ({needs})")]
    NotApplicable {
        strategy: &'static str,
        needs: &'static str,
    },
    #[error("strategy '{strategy}' offers no candidate for this spec and batch")]
    NoCandidate { strategy: &'static str },
}

/// What the caller asks of a tuning (see the module documentation).
#[derive(Debug, Clone)]
pub struct TuneOptions {
    /// What the verifier checks.
    pub verify: Verify,
    /// Stop starting candidates once this much wall time has passed.
    pub budget: Option<Duration>,
    /// Skip candidates whose lower bound is above the best fitting step found (see the module
    /// documentation); off: every candidate is compiled and simulated.
    pub prune: bool,
    /// Prune each family's candidates against that family's fastest fitting step, so that
    /// its best fitting configuration is found as exhaustively as the choice (what a run of
    /// several steps keeps beside it, [`super::kept`]); off: against the fastest of all, which
    /// prunes more and chooses the same (a single step keeps nothing else).
    pub per_family: bool,
}

impl Default for TuneOptions {
    fn default() -> Self {
        TuneOptions {
            verify: Verify::Chosen,
            budget: None,
            prune: true,
            per_family: true,
        }
    }
}

/// One candidate compiled and simulated.
#[derive(Debug, Clone)]
pub struct Evaluation {
    pub candidate: Candidate,
    /// The label of the candidate's variant the step runs (empty: its own pipeline).
    pub variant: String,
    pub metrics: Metrics,
    /// Wall time of building the IR and running the candidate's pipeline.
    pub compile_ms: f64,
    /// The passes of the pipeline the step runs, with their wall and verifier times.
    pub passes: Vec<PassRecord>,
    /// The candidate's pipelines not run because another ran the same passes on the same step
    /// (see [`super::evaluate`]).
    pub variants_shared: usize,
    /// The candidate's fallback pipelines not run because the pipeline each falls back from
    /// fit the memory limit, was pruned, or would make the same packing (see
    /// [`super::strategy::Variant::fallback_of`]).
    pub fallbacks_skipped: usize,
}

/// The outcome of [`choose`].
#[derive(Debug)]
pub struct Choice {
    /// Every candidate evaluated, in the strategy's order.
    pub evaluations: Vec<Evaluation>,
    /// Candidates skipped because the tuning budget was spent.
    pub skipped: usize,
    /// Candidates skipped because their lower bound was above the best fitting step found.
    pub pruned: usize,
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

    /// Every candidate the strategy offered: evaluated, skipped by the budget or pruned.
    pub fn candidates_offered(&self) -> usize {
        self.evaluations.len() + self.skipped + self.pruned
    }
}

/// A lower bound on the step time the simulator reports for `candidate` on `batch`, whatever
/// its passes make of the batch ([`slimpack_machine::cost::CostModel::step_time_lower_bound`]
/// under the candidate's spec, with the static CP degree its pipelines all start from).
pub fn candidate_bound(spec: &Spec, batch: &Batch, candidate: &Candidate) -> f64 {
    BatchBounds::new(spec, batch).of(candidate)
}

/// [`candidate_bound`]s of one batch's candidates, reading the batch once per static CP
/// degree among them: the part of a bound that visits every sample does not depend on a
/// candidate's recomputation or model chunks
/// ([`slimpack_machine::cost::CostModel::batch_attention`]).
pub struct BatchBounds<'a> {
    spec: &'a Spec,
    lengths: Vec<u64>,
    /// The batch's attention per (static CP degree, padded to the longest sample).
    by_cp: Vec<((u32, bool), BatchAttention)>,
}

impl<'a> BatchBounds<'a> {
    pub fn new(spec: &'a Spec, batch: &Batch) -> BatchBounds<'a> {
        BatchBounds {
            spec,
            lengths: batch.samples.iter().map(|s| u64::from(s.len)).collect(),
            by_cp: Vec::new(),
        }
    }

    /// `candidate`'s [`candidate_bound`].
    pub fn of(&mut self, candidate: &Candidate) -> f64 {
        let mut spec = candidate_spec(self.spec, candidate);
        spec.model.recompute = super::stage_recompute::least_recompute(candidate);
        let model = slimpack_machine::machine_model(&spec);
        let key = bound_key(candidate);
        let attention = match self.by_cp.iter().find(|(of, _)| *of == key) {
            Some((_, attention)) => *attention,
            None => {
                let attention = match key.1 {
                    // Every sample runs as long as the longest, pad tokens computed: as a
                    // batch of that many longest samples.
                    true => {
                        let longest = self.lengths.iter().copied().max().unwrap_or(0);
                        model.batch_attention(&vec![longest; self.lengths.len()], key.0)
                    }
                    false => model.batch_attention(&self.lengths, key.0),
                };
                self.by_cp.push((key, attention));
                attention
            }
        };
        model.step_time_lower_bound_of(&attention)
    }
}

/// What the bound of `candidate` needs from its pipelines (each parsed once): the DP replicas
/// every pack runs on at least — the static CP degree its `assign-dp{cp=K}` takes from the DP
/// pool (the smallest over its pipelines; later passes only merge replicas), 1 where a
/// pipeline has none or does not parse — and whether every pipeline pads each sample to the
/// batch's longest (`pack-symmetric{policy=padding}`), whose bound then counts the pad tokens
/// it computes.
fn bound_key(candidate: &Candidate) -> (u32, bool) {
    let (mut cp, mut pads) = (u32::MAX, true);
    for pipeline in std::iter::once(&candidate.pipeline)
        .chain(candidate.variants.iter().map(|variant| &variant.pipeline))
    {
        let entries = parse_pipeline(pipeline).unwrap_or_default();
        let static_cp = (entries.iter())
            .find(|entry| entry.info.name == "assign-dp")
            .and_then(|entry| entry.options.required_positive::<u32>("cp").ok());
        cp = cp.min(static_cp.unwrap_or(1));
        pads &= entries.iter().any(|entry| {
            entry.info.name == "pack-symmetric"
                && (entry.options.get::<String>("policy", "a packing policy"))
                    .ok()
                    .flatten()
                    .as_deref()
                    == Some("padding")
        });
    }
    (cp, pads)
}

/// The spec a candidate runs with: `spec` with the candidate's recompute mode and model
/// chunks.
pub fn candidate_spec(spec: &Spec, candidate: &Candidate) -> Spec {
    let mut spec = spec.clone();
    spec.model.recompute = candidate.recompute;
    if let Some(vpp) = candidate.vpp {
        spec.parallel.vpp = vpp;
    }
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
) -> Result<(Batch, Choice), TuneError> {
    let admitted = admit(strategy, state, spec, batch);
    let choice = choose(strategy, spec, &admitted, state, choices)?;
    Ok((admitted, choice))
}

/// A lower bound that rules a step out against the fastest fitting step found: above it by
/// more than floating-point rounding (bounds and the simulator sum the same durations in
/// different orders, so an exact tie must not prune the earlier candidate).
pub fn exceeds(bound: f64, fastest: f64) -> bool {
    bound > fastest * (1.0 + 1e-9)
}

/// The order in which `groups` of candidates start (indices into `groups`): by their least
/// bound (`bounds`, per candidate), the group of the earlier first candidate among equal ones,
/// so that a fast fitting step is found early and prunes the rest.
pub fn bound_order(groups: &[Vec<usize>], bounds: &[f64]) -> Vec<usize> {
    let least = |group: &Vec<usize>| {
        group
            .iter()
            .map(|&index| bounds[index])
            .fold(f64::INFINITY, f64::min)
    };
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by(|&a, &b| {
        least(&groups[a])
            .total_cmp(&least(&groups[b]))
            .then(groups[a][0].cmp(&groups[b][0]))
    });
    order
}

/// Compiles and simulates every candidate `strategy` offers for `batch` (already admitted) and
/// keeps the fastest that fits memory (`choices.memory_limit`), or the least memory-hungry
/// when none fits. A strategy not applicable to the layout is an error.
pub fn choose(
    strategy: &StrategyInfo,
    spec: &Spec,
    batch: &Batch,
    state: &StrategyState,
    choices: &Choices,
) -> Result<Choice, TuneError> {
    choose_with(
        strategy,
        spec,
        batch,
        state,
        choices,
        &TuneOptions::default(),
    )
}

/// [`choose`] with the caller's options (verification, pruning, budget).
pub fn choose_with(
    strategy: &StrategyInfo,
    spec: &Spec,
    batch: &Batch,
    state: &StrategyState,
    choices: &Choices,
    tune: &TuneOptions,
) -> Result<Choice, TuneError> {
    let choice = choose_seeded(strategy, spec, batch, state, choices, tune, None)?;
    Ok(choice.expect("without a step to beat, the first candidate is evaluated"))
}

/// [`choose_with`] against a fitting step of `incumbent_s` seconds found elsewhere (a kept
/// configuration's, on a step the tuned one does not fit): a candidate whose bound is above it
/// is pruned from the start (with pruning on), and the choice is returned only where its step
/// fits and is faster; `None` where no candidate beats it (an exhaustive tuning would choose
/// a step no faster than the incumbent). One deviation from exhaustive, bounded by a
/// refinement's gain: candidates are compared (and pruned) unrefined, so one whose own step is
/// above the incumbent but whose eqsat refinement would be below it is not found (eqsat's gain
/// is 0.02-0.24% per scenario).
pub fn choose_below(
    strategy: &StrategyInfo,
    spec: &Spec,
    batch: &Batch,
    state: &StrategyState,
    choices: &Choices,
    tune: &TuneOptions,
    incumbent_s: f64,
) -> Result<Option<Choice>, TuneError> {
    let limit = choices.memory_limit_for(spec);
    let choice = choose_seeded(
        strategy,
        spec,
        batch,
        state,
        choices,
        tune,
        Some(incumbent_s),
    )?;
    Ok(choice.filter(|choice| {
        let best = &choice.best().metrics;
        within(best, limit) && best.step_time_s < incumbent_s
    }))
}

/// [`choose_with`], pruning against `incumbent_s` from the start where given; `None` when
/// every candidate was pruned.
fn choose_seeded(
    strategy: &StrategyInfo,
    spec: &Spec,
    batch: &Batch,
    state: &StrategyState,
    choices: &Choices,
    tune: &TuneOptions,
    incumbent_s: Option<f64>,
) -> Result<Option<Choice>, TuneError> {
    if let Some(needs) = strategy.not_applicable(spec) {
        return Err(TuneError::NotApplicable {
            strategy: strategy.name,
            needs,
        });
    }
    let candidates = (strategy.candidates)(spec, batch, state, choices);
    if candidates.is_empty() {
        return Err(TuneError::NoCandidate {
            strategy: strategy.name,
        });
    }
    // Candidates start in the order of their bounds (the strategy's among equal ones), so that
    // a fast fitting step is found early and prunes the rest.
    let bounds: Vec<f64> = if tune.prune {
        let mut bounds = BatchBounds::new(spec, batch);
        candidates.iter().map(|c| bounds.of(c)).collect()
    } else {
        vec![0.0; candidates.len()]
    };
    // A member whose own bound is above the fastest fitting step is pruned alone.
    let groups = compiled_together(&candidates);
    let order = bound_order(&groups, &bounds);
    let start = Instant::now();
    let limit = choices.memory_limit_for(spec);
    // Only the best step so far is kept (a step of a large batch is large, and the candidates
    // are many): the first candidate, in the strategy's order, of those no other is preferred
    // to — what keeping the preferred one over the candidates in order would choose.
    let best: Mutex<Option<(usize, Metrics, Compiled)>> = Mutex::new(None);
    // The fastest fitting step simulated so far in each family (f64 bits; infinity until one
    // fits): a candidate is pruned against its own family's, so that each family's best
    // fitting configuration, which a run keeps beside the choice (`super::kept`), is found
    // as exhaustively as the choice. Against a step to beat (a re-plan, whose families are
    // not kept) or for a single step (`per_family` off), one for all.
    let mut families: Vec<&str> = Vec::new();
    let family_of: Vec<usize> = candidates
        .iter()
        .map(|candidate| {
            let family = match (incumbent_s, tune.per_family) {
                (None, true) => super::kept::family(&candidate.label),
                _ => "",
            };
            families
                .iter()
                .position(|&f| f == family)
                .unwrap_or_else(|| {
                    families.push(family);
                    families.len() - 1
                })
        })
        .collect();
    let initial = incumbent_s.unwrap_or(f64::INFINITY).to_bits();
    let fastest_fitting: Vec<AtomicU64> =
        families.iter().map(|_| AtomicU64::new(initial)).collect();
    let fits_already =
        || (fastest_fitting.iter()).any(|f| f64::from_bits(f.load(Ordering::Acquire)).is_finite());
    let within_budget = |position: usize| {
        position == 0
            || tune.budget.is_none_or(|budget| start.elapsed() < budget)
            || !fits_already()
    };
    let outcomes = parallel_map(&order, |position, &group| {
        let members = &groups[group];
        if !within_budget(position) {
            return members
                .iter()
                .map(|&index| (index, Outcome::Skipped))
                .collect();
        }
        // Candidates compiled together share their packing: one family.
        debug_assert!(
            members
                .iter()
                .all(|&m| family_of[m] == family_of[members[0]]),
            "a group of candidates compiled together spans families"
        );
        let fastest_fitting = &fastest_fitting[family_of[members[0]]];
        let fastest = f64::from_bits(fastest_fitting.load(Ordering::Acquire));
        let (live, pruned): (Vec<usize>, Vec<usize>) = members
            .iter()
            .partition(|&&index| !(tune.prune && exceeds(bounds[index], fastest)));
        let mut outcomes: Vec<(usize, Outcome)> = pruned
            .into_iter()
            .map(|index| (index, Outcome::Pruned))
            .collect();
        let live_candidates: Vec<&Candidate> =
            live.iter().map(|&index| &candidates[index]).collect();
        let below = tune.prune.then_some(fastest_fitting);
        let evaluated = evaluate_below(strategy, spec, batch, &live_candidates, limit, tune, below);
        for (index, evaluated) in live.into_iter().zip(evaluated) {
            let Some(evaluated) = evaluated.transpose() else {
                outcomes.push((index, Outcome::Pruned));
                continue;
            };
            let outcome = Outcome::Evaluated(Box::new(evaluated.map(|(evaluation, compiled)| {
                let metrics = &evaluation.metrics;
                if within(metrics, limit) {
                    fastest_fitting.fetch_min_f64(metrics.step_time_s, Ordering::AcqRel);
                }
                let mut best = best.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                let better = match &*best {
                    None => true,
                    Some((current, current_metrics, _)) => {
                        preferred(metrics, current_metrics, limit)
                            || (index < *current && !preferred(current_metrics, metrics, limit))
                    }
                };
                if better {
                    *best = Some((index, metrics.clone(), compiled));
                }
                evaluation
            })));
            outcomes.push((index, outcome));
        }
        outcomes
    });
    // Back to the strategy's order.
    let mut by_candidate: Vec<Option<Outcome>> = (0..candidates.len()).map(|_| None).collect();
    for (index, outcome) in outcomes.into_iter().flatten() {
        by_candidate[index] = Some(outcome);
    }
    let mut evaluations = Vec::with_capacity(candidates.len());
    let mut evaluated = Vec::with_capacity(candidates.len());
    let (mut skipped, mut pruned) = (0, 0);
    for (index, outcome) in by_candidate.into_iter().enumerate() {
        match outcome.expect("every candidate has an outcome") {
            Outcome::Skipped => skipped += 1,
            Outcome::Pruned => pruned += 1,
            Outcome::Evaluated(outcome) => {
                evaluations.push((*outcome)?);
                evaluated.push(index);
            }
        }
    }
    let Some((chosen_index, _, mut compiled)) = best
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
    else {
        return Ok(None);
    };
    let chosen = evaluated
        .iter()
        .position(|&index| index == chosen_index)
        .expect("the chosen candidate was evaluated");
    let chosen_candidate = &candidates[chosen_index];
    refine_chosen(
        (strategy, spec, batch, limit, tune),
        chosen_candidate,
        &mut evaluations[chosen],
        &mut compiled,
    )?;
    let candidate = chosen_candidate.refined();
    verify_chosen(strategy, spec, batch, limit, tune, &candidate, &compiled.ir)?;
    Ok(Some(Choice {
        evaluations,
        skipped,
        pruned,
        chosen,
        compiled,
    }))
}

/// Tries `candidate`'s refinements, compiled on their own, on the step it was chosen for
/// (`evaluation`, `compiled`): the best of them replaces that step where preferred to it (ties
/// to the unrefined step, which comes first in `Candidate::refined`) — what evaluating it
/// refined chooses, without compiling and simulating its unrefined pipelines again.
fn refine_chosen(
    (strategy, spec, batch, limit, tune): (&StrategyInfo, &Spec, &Batch, u64, &TuneOptions),
    candidate: &Candidate,
    evaluation: &mut Evaluation,
    compiled: &mut Compiled,
) -> Result<(), TuneError> {
    let Some((first, rest)) = candidate.refinements.split_first() else {
        return Ok(());
    };
    let refinements = Candidate {
        pipeline: first.pipeline.clone(),
        variants: rest.to_vec(),
        refinements: Vec::new(),
        ..candidate.clone()
    };
    let (refined, refined_step) = evaluate_with(strategy, spec, batch, &refinements, limit, tune)?;
    evaluation.compile_ms += refined.compile_ms;
    if preferred(&refined.metrics, &evaluation.metrics, limit) {
        let variant = match refined.variant.as_str() {
            "" => first.label.clone(),
            _ => refined.variant.clone(),
        };
        *evaluation = Evaluation {
            candidate: candidate.clone(),
            variant,
            compile_ms: evaluation.compile_ms,
            ..refined
        };
        *compiled = refined_step;
    }
    Ok(())
}

/// What became of one candidate in [`choose_with`].
enum Outcome {
    Skipped,
    Pruned,
    Evaluated(Box<Result<Evaluation, TuneError>>),
}

/// A step fits: its peak stays within `limit` bytes (and device memory).
pub(crate) fn within(metrics: &Metrics, limit: u64) -> bool {
    !metrics.oom && metrics.peak_memory_bytes <= limit
}

/// `fetch_min` for an `f64` kept as its bits in an [`AtomicU64`].
pub(crate) trait AtomicMinF64 {
    fn fetch_min_f64(&self, value: f64, order: Ordering);
}

impl AtomicMinF64 for AtomicU64 {
    fn fetch_min_f64(&self, value: f64, order: Ordering) {
        let mut current = self.load(Ordering::Acquire);
        while value < f64::from_bits(current) {
            match self.compare_exchange_weak(current, value.to_bits(), order, Ordering::Acquire) {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }
}

/// Whether `metrics` beats `current`: fitting (within `limit` bytes) beats not fitting; then
/// the shorter step (when both fit) or the smaller peak (when neither does).
pub(crate) fn preferred(metrics: &Metrics, other: &Metrics, limit: u64) -> bool {
    match (within(metrics, limit), within(other, limit)) {
        (true, false) => true,
        (false, true) => false,
        (true, true) => metrics.step_time_s < other.step_time_s,
        (false, false) => metrics.peak_memory_bytes < other.peak_memory_bytes,
    }
}

/// Compiles and simulates the steps of a run whose configuration is chosen — each step's
/// (admitted) batch with its candidate — in parallel, fitting within `limit` bytes;
/// evaluations in step order.
pub fn evaluate_steps(
    strategy: &StrategyInfo,
    spec: &Spec,
    steps: &[(&Batch, &Candidate)],
    limit: u64,
) -> Result<Vec<Evaluation>, TuneError> {
    parallel_map(steps, |_, (batch, candidate)| {
        evaluate(strategy, spec, batch, candidate, limit).map(|(evaluation, _)| evaluation)
    })
    .into_iter()
    .collect()
}

/// `f(index, item)` over `items` on up to `available_parallelism` threads, items started in
/// order; results in item order. A panic in `f` is re-raised here.
pub fn parallel_map<T: Sync, R: Send>(items: &[T], f: impl Fn(usize, &T) -> R + Sync) -> Vec<R> {
    parallel_map_on(available_threads(), items, f)
}

/// The threads [`parallel_map`] uses: one per available core.
pub fn available_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// [`parallel_map`] on at most `threads` threads (1: on the calling thread).
pub fn parallel_map_on<T: Sync, R: Send>(
    threads: usize,
    items: &[T],
    f: impl Fn(usize, &T) -> R + Sync,
) -> Vec<R> {
    let threads = threads.min(items.len()).max(1);
    if threads == 1 {
        return items
            .iter()
            .enumerate()
            .map(|(index, item)| f(index, item))
            .collect();
    }
    let next = AtomicUsize::new(0);
    let mut slots: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
    let work = || {
        let mut done = Vec::new();
        loop {
            let index = next.fetch_add(1, Ordering::Relaxed);
            let Some(item) = items.get(index) else {
                return done;
            };
            done.push((index, f(index, item)));
        }
    };
    std::thread::scope(|scope| {
        // Threads the system will not start (a process limit) leave their share to the others,
        // or to this thread when none starts.
        let workers: Vec<_> = (0..threads)
            .map_while(|_| std::thread::Builder::new().spawn_scoped(scope, work).ok())
            .collect();
        let mut finished = Vec::new();
        if workers.is_empty() {
            finished.push(work());
        }
        for worker in workers {
            finished.push(
                worker
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            );
        }
        for (index, result) in finished.into_iter().flatten() {
            slots[index] = Some(result);
        }
    });
    slots
        .into_iter()
        .map(|slot| slot.expect("every item was processed"))
        .collect()
}

#[cfg(test)]
mod tests;
