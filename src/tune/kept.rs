//! The configurations a run keeps from tuning, and each step's choice among them.
//!
//! Tuning scores every candidate of a strategy ([`super::run`] on the first K steps, `plan` on
//! the first step). A run keeps the preferred configuration and, beside it, the best fitting
//! configuration of every other *family* of the strategy's candidates: slimpack's own pipelines,
//! and each plan a peer would make (`plan=megatron`, `plan=kk`, `plan=wlb`, slimpack's
//! zero-bubble and per-stage recomputation twins of them included; see
//! [`super::strategy::peer_plans`]) — at most one per family, so a handful. Where the chosen
//! configuration is a peer's plan refined by slimpack, the best of that peer's plans as the
//! peer makes them is kept too (and the other way round): a refinement that wins on the tuning
//! steps can lose on a later step (a per-stage twin's deeper warm-up), where the peer's own
//! plan, kept, still runs. The other families keep one configuration each: keeping both
//! classes of every peer family compiled about 15% more per step in `plan` (the 7B epoch), for
//! steps the tuned choice already beat. Every
//! step compiles the kept configurations re-derived for its batch
//! ([`super::strategy::kept_for_step`]), simulates each (with its own per-step variants) and
//! runs the preferred: fitting the memory limit before not fitting, then the faster, ties to
//! the configuration kept first (the tuned one). So a step where a peer's plan is faster than
//! the tuned configuration runs the peer's plan: slimpack is never slower on a step than a kept
//! peer plan. A step on which the tuned configuration goes over the memory limit is unlike the
//! tuning steps: it also compiles the tuned configuration with the strategy's other
//! recomputation modes (its recomputation twins: slimpack's per-stage and full twins of the
//! same packing), and the caller re-plans it on its own batch against the best of these that
//! fits (candidates whose bound is above it are not compiled; only a faster plan replaces it),
//! so every strategy, peers included, gets what a full re-plan of the step finds.
//!
//! Bounded: a kept configuration whose lower bound on the step
//! ([`autotune::candidate_bound`]) is above the fastest fitting step already simulated is not
//! compiled (it could not be chosen); under a tuning budget (`--tune-budget-ms`), once a
//! step's choice has spent it and a step fits the memory limit, the kept configurations not
//! yet started are skipped (the tuned one always runs); and a strategy whose candidates form
//! one family (every peer, the
//! ablations without peer plans) keeps only its tuned configuration, as before.

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;

use slimpack_ir::batch::Batch;
use slimpack_ir::Spec;

use super::autotune::{self, Evaluation, TuneError, TuneOptions};
use super::evaluate::evaluate_below;
use super::strategy::{kept_for_step, Candidate, StrategyInfo};
use crate::compile::Compiled;

/// A configuration's family: `plan=<peer>` for the plans a peer would make, empty for the
/// strategy's own pipelines.
pub fn family(label: &str) -> &str {
    match label.starts_with("plan=") {
        true => label.split(',').next().unwrap_or(label),
        false => "",
    }
}

/// Whether `label` is a peer plan refined by slimpack (a zero-bubble twin, a per-stage
/// recomputation twin) rather than one the peer itself would make.
fn refined(label: &str) -> bool {
    label
        .split(',')
        .any(|field| field == "zb" || field == "recompute=per-stage")
}

/// A configuration's class among those a run keeps one of: its family, and for a plan of the
/// chosen configuration's family (`chosen`), a peer's, whether slimpack refined it
/// ([`refined`]); slimpack's own pipelines are one class, and so is every other family.
fn class<'a>(label: &'a str, chosen: &str) -> (&'a str, bool) {
    let family = family(label);
    let split = !family.is_empty() && family == chosen;
    (family, split && refined(label))
}

/// How tuning scored one configuration: its label, its time (summed over the tuning steps)
/// and whether it fit the memory limit on every tuning step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Score<'a> {
    pub label: &'a str,
    pub time_s: f64,
    pub fits: bool,
}

/// The indices (into `scores`) of the configurations a run keeps: `chosen` first, then, for
/// every other class ([`class`]), its fastest fitting configuration, fastest first (ties to the
/// earlier index). A class with no fitting configuration scored keeps none (tuning may prune a
/// peer's own plan whose bound is above a refined one's time: it was slower on the tuning steps).
pub fn keep(scores: &[Score], chosen: usize) -> Vec<usize> {
    let chosen_family = family(scores[chosen].label);
    let class = |label| class(label, chosen_family);
    let chosen_class = class(scores[chosen].label);
    let mut best: Vec<usize> = Vec::new();
    for (index, score) in scores.iter().enumerate() {
        let own = class(score.label);
        if !score.fits || own == chosen_class {
            continue;
        }
        match best
            .iter_mut()
            .find(|kept| class(scores[**kept].label) == own)
        {
            Some(kept) if score.time_s < scores[*kept].time_s => *kept = index,
            Some(_) => {}
            None => best.push(index),
        }
    }
    best.sort_by(|&a, &b| {
        scores[a]
            .time_s
            .total_cmp(&scores[b].time_s)
            .then(a.cmp(&b))
    });
    std::iter::once(chosen).chain(best).collect()
}

/// The position in `metrics` of the preferred step (fitting `limit` before not fitting, then
/// faster; ties to the earlier).
pub fn preferred_step<'a>(
    metrics: impl IntoIterator<Item = &'a slimpack_machine::sim::Metrics>,
    limit: u64,
) -> usize {
    let mut best: Option<(usize, &slimpack_machine::sim::Metrics)> = None;
    for (index, step) in metrics.into_iter().enumerate() {
        if best.is_none_or(|(_, current)| autotune::preferred(step, current, limit)) {
            best = Some((index, step));
        }
    }
    best.map_or(0, |(index, _)| index)
}

/// The candidates of `offered` that are `tuned` with another recomputation mode: the same
/// label but for its `recompute=` field (slimpack's per-stage and full twins of the same
/// packing, a peer plan's other modes), in the offer's order.
pub fn recompute_twins(offered: &[Candidate], tuned: &Candidate) -> Vec<Candidate> {
    fn fields(label: &str) -> impl Iterator<Item = &str> {
        label
            .split(',')
            .filter(|field| !field.starts_with("recompute="))
    }
    offered
        .iter()
        .filter(|candidate| {
            candidate.label != tuned.label && fields(&candidate.label).eq(fields(&tuned.label))
        })
        .cloned()
        .collect()
}

/// A step's choice among the kept configurations.
pub struct StepChoice {
    /// The preferred kept configuration's evaluation.
    pub evaluation: Evaluation,
    /// Its compiled step.
    pub compiled: Compiled,
    /// Wall time of compiling and simulating every kept configuration the step compiled.
    pub compile_ms: f64,
    /// The tuned configuration fits the memory limit on the step. Where it does not, its
    /// recomputation twins were compiled too, and the caller re-plans the step against this
    /// choice ([`autotune::choose_below`]): the step is unlike the tuning steps.
    pub tuned_fits: bool,
}

/// A step's best kept configuration: each of `kept` (the tuned one first) re-derived from the
/// step's `offered` candidates, compiled and simulated unless its lower bound is above the
/// fastest fitting step so far, the preferred one returned with its compiled step and whether
/// the tuned configuration fit; where it did not, its recomputation twins
/// ([`recompute_twins`]) are compiled the same way after the kept ones. `Ok(None)` when the
/// tuned configuration does not compile on the step (a document longer than megatron's bins:
/// the step is unlike the tuning steps, and the caller re-plans it, as it would without the
/// other kept configurations); another configuration that does not compile is passed over.
/// Other errors are returned.
pub fn choose_for_step(
    strategy: &StrategyInfo,
    spec: &Spec,
    batch: &Batch,
    offered: &[Candidate],
    kept: &[Candidate],
    limit: u64,
    tune: &TuneOptions,
) -> Result<Option<StepChoice>, TuneError> {
    let mut best: Option<(Evaluation, Compiled)> = None;
    let mut compile_ms = 0.0;
    let mut tuned_fits = false;
    let start = std::time::Instant::now();
    let mut queue: VecDeque<Candidate> = kept
        .iter()
        .map(|tuned| kept_for_step(offered, tuned))
        .collect();
    let mut bounds = autotune::BatchBounds::new(spec, batch);
    let mut started = 0;
    while let Some(candidate) = queue.pop_front() {
        let position = started;
        started += 1;
        // Past the budget, what is left is skipped once a step fits the memory limit.
        let spent = tune.budget.is_some_and(|budget| start.elapsed() >= budget);
        let fits =
            (best.as_ref()).is_some_and(|(current, _)| autotune::within(&current.metrics, limit));
        if position > 0 && spent && fits {
            break;
        }
        if let Some((current, _)) = &best {
            let fits = autotune::within(&current.metrics, limit);
            let bound = bounds.of(&candidate);
            if fits && bound > current.metrics.step_time_s {
                continue;
            }
        }
        // The tuned configuration runs in full; another is cut short where its packing's or
        // schedule's bound is above the best fitting step so far (`evaluate_below`).
        let refined = candidate.refined();
        let evaluated = if position == 0 || !tune.prune {
            autotune::evaluate_with(strategy, spec, batch, &refined, limit, tune).map(Some)
        } else {
            let fastest = best
                .as_ref()
                .filter(|(current, _)| autotune::within(&current.metrics, limit))
                .map_or(f64::INFINITY, |(current, _)| current.metrics.step_time_s);
            let fastest = AtomicU64::new(fastest.to_bits());
            evaluate_below(
                strategy,
                spec,
                batch,
                &[&refined],
                limit,
                tune,
                Some(&fastest),
            )
            .remove(0)
        };
        match evaluated {
            Ok(None) => {}
            Ok(Some((evaluation, compiled))) => {
                compile_ms += evaluation.compile_ms;
                if position == 0 {
                    tuned_fits = autotune::within(&evaluation.metrics, limit);
                    if !tuned_fits {
                        queue.extend(recompute_twins(offered, &candidate));
                    }
                }
                let better = best.as_ref().is_none_or(|(current, _)| {
                    autotune::preferred(&evaluation.metrics, &current.metrics, limit)
                });
                if better {
                    best = Some((evaluation, compiled));
                }
            }
            Err(TuneError::Compile { .. }) if position == 0 => return Ok(None),
            Err(error) if position == 0 => return Err(error),
            // Another kept configuration that fails on this step is not a choice for it.
            Err(_) => {}
        }
    }
    if let Some((evaluation, compiled)) = &best {
        let candidate = &evaluation.candidate;
        autotune::verify_chosen(strategy, spec, batch, limit, tune, candidate, &compiled.ir)?;
    }
    Ok(best.map(|(evaluation, compiled)| StepChoice {
        evaluation,
        compiled,
        compile_ms,
        tuned_fits,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::strategy::{lookup, Choices, StrategyState};

    /// A step on which the tuned configuration goes over the memory limit says so and also
    /// compiles its recomputation twins; within the limit it does not.
    #[test]
    fn a_tuned_configuration_over_the_limit_brings_its_recomputation_twins() {
        let spec = Spec::from_presets("llama-7b", "h100-sxm", "tp=8,pp=2,dp=4").unwrap();
        let lengths: Vec<u32> = (0..32).map(|i| 512 + 977 * (i * i % 29)).collect();
        let batch = Batch::from_lengths(&lengths, Some(32768), "test");
        let strategy = lookup("slimpack").unwrap();
        let offered =
            (strategy.candidates)(&spec, &batch, &StrategyState::default(), &Choices::all());
        let own = offered
            .iter()
            .find(|c| family(&c.label).is_empty())
            .unwrap();
        let peer = offered
            .iter()
            .find(|c| c.label.starts_with("plan="))
            .unwrap();
        let kept = [own.clone(), peer.clone()];
        let tune = TuneOptions::default();
        // A limit nothing fits: the tuned configuration's recomputation twins are compiled
        // too, and the least peak among them all is one of them (full recomputation keeps the
        // least).
        let choice = choose_for_step(strategy, &spec, &batch, &offered, &kept, 1, &tune);
        let choice = choice.unwrap().unwrap();
        assert!(!choice.tuned_fits);
        let twins = recompute_twins(&offered, own);
        assert!(!twins.is_empty(), "{} has recomputation twins", own.label);
        let ran = &choice.evaluation.candidate.label;
        assert!(twins.iter().any(|twin| &twin.label == ran), "{ran}");
        // Within the limit a kept configuration runs.
        let choice = choose_for_step(strategy, &spec, &batch, &offered, &kept, u64::MAX, &tune);
        assert!(choice.unwrap().unwrap().tuned_fits);
    }

    fn score(label: &str, time_s: f64, fits: bool) -> Score<'_> {
        Score {
            label,
            time_s,
            fits,
        }
    }

    #[test]
    fn families_are_the_peer_plans_and_the_own_pipelines() {
        assert_eq!(family("plan=kk,cp=2,recompute=none,zb"), "plan=kk");
        assert_eq!(family("plan=wlb"), "plan=wlb");
        assert_eq!(family("cp=2,slice=8192,cap=16384,recompute=none"), "");
    }

    /// The chosen one first, then the fastest fitting of each other family, fastest first; a
    /// family without a fitting configuration is left out.
    #[test]
    fn keeps_the_chosen_and_the_best_fitting_of_every_other_family() {
        let scores = [
            score("cp=1,slice=4096", 10.0, true),
            score("plan=kk,cp=2", 12.0, true),
            score("plan=kk,cp=1", 11.0, true),
            score("cp=2,slice=4096", 9.0, true),
            score("plan=megatron,bin=4096", 10.5, true),
            score("plan=wlb,cp=1", 8.0, false),
        ];
        assert_eq!(keep(&scores, 3), vec![3, 4, 2]);
        // Chosen from a peer's family: the own pipelines' best is kept beside it.
        assert_eq!(keep(&scores, 2), vec![2, 3, 4]);
    }

    /// A refined peer plan (zero-bubble, per-stage recomputation) chosen does not displace the
    /// peer's own configuration of the same plan: both are kept.
    #[test]
    fn keeps_a_peer_plan_as_the_peer_makes_it_beside_its_refinements() {
        let scores = [
            score("cp=2,slice=4096,recompute=none", 12.0, true),
            score("plan=megatron,cp=16,recompute=none", 11.31, true),
            score("plan=megatron,cp=16,recompute=per-stage", 11.26, true),
            score("plan=megatron,cp=16,recompute=none,zb", 11.28, true),
            score("plan=kk,cp=16,recompute=none,zb", 11.5, true),
            score("plan=kk,cp=16,recompute=none", 11.6, true),
            score("plan=kk,cp=8,recompute=none", 11.55, true),
        ];
        assert_eq!(
            class(scores[3].label, "plan=megatron"),
            ("plan=megatron", true)
        );
        assert_eq!(class(scores[3].label, ""), ("plan=megatron", false));
        assert_eq!(class(scores[0].label, ""), ("", false));
        // Chosen: megatron's per-stage twin. Kept beside it: megatron's own plan, kk's best
        // (its zero-bubble twin), slimpack's pipelines; not megatron's zero-bubble twin (a
        // refined megatron plan is already chosen).
        assert_eq!(keep(&scores, 2), vec![2, 1, 4, 0]);
        // Chosen: the peer's own plan; its refinements' best is kept beside it.
        assert_eq!(keep(&scores, 1), vec![1, 2, 4, 0]);
        // Chosen: slimpack's own pipeline; one per peer family, as before.
        assert_eq!(keep(&scores, 0), vec![0, 2, 4]);
    }
}
