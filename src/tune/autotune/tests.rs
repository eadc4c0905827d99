//! The tuner's tests: lower bounds, pruning, shared variants, fallbacks, choosing below a
//! step, a broken step caught, candidates compiled together, refinement, per-step variants.

use super::*;
use crate::tune::strategy;
use slimpack_machine::sim;

/// `count` long-tailed lengths (most short, a few near `context`), seeded.
fn long_tailed(seed: u64, count: usize, context: u32) -> Vec<u32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let unit = (state >> 11) as f64 / (1u64 << 53) as f64;
            // Cubing skews towards short documents with a tail up to the context.
            1 + (unit.powi(3) * f64::from(context - 1)) as u32
        })
        .collect()
}

/// (spec, context) pairs the pruning tests run on: the CPU machine (a calibrated model),
/// an H100 layout whose DP pool allows static CP degrees across nodes, one with model
/// chunks, and one without a pipeline (where `hybrid-cp` applies).
fn layouts() -> Vec<(Spec, u32)> {
    vec![
        (
            Spec::from_presets("tiny", "cpu", "tp=1,pp=2,dp=4").unwrap(),
            256,
        ),
        (
            Spec::from_presets("llama-7b", "h100-sxm", "tp=8,pp=2,dp=4").unwrap(),
            32768,
        ),
        (
            Spec::from_presets("llama-7b", "h100-sxm", "tp=4,pp=4,vpp=2,dp=2").unwrap(),
            16384,
        ),
        (
            Spec::from_presets("llama-7b", "h100-sxm", "tp=8,pp=1,dp=4").unwrap(),
            32768,
        ),
    ]
}

/// The llama-7b layout of [`layouts`] (tp=8, pp=2, dp=4 at 32K) with `count` long-tailed
/// lengths drawn from `seed`, and the slimpack strategy.
fn slimpack_on_7b(seed: u64, count: usize) -> (Spec, Batch, &'static StrategyInfo) {
    let (spec, context) = layouts().swap_remove(1);
    let batch = Batch::from_lengths(&long_tailed(seed, count, context), Some(context), "test");
    (spec, batch, strategy::lookup("slimpack").unwrap())
}

/// The bound is a lower bound: over every candidate of every strategy on several layouts
/// and batches, no compiled candidate (its fastest pipeline) simulates faster.
#[test]
fn the_lower_bound_never_exceeds_the_simulated_step() {
    let mut checked = 0;
    for (layout, (spec, context)) in layouts().into_iter().enumerate() {
        for seed in 0..2u64 {
            let lengths = long_tailed(seed + 10 * layout as u64, 24, context);
            let drawn = Batch::from_lengths(&lengths, Some(context), "test");
            for info in strategy::STRATEGIES {
                if info.not_applicable(&spec).is_some() {
                    continue;
                }
                let mut state = StrategyState::default();
                let batch = admit(info, &mut state, &spec, &drawn);
                let choices = Choices::all();
                for candidate in (info.candidates)(&spec, &batch, &state, &choices) {
                    let bound = candidate_bound(&spec, &batch, &candidate);
                    // Every pipeline fits an unbounded limit: the fastest one is kept.
                    let Ok((evaluation, _)) = evaluate(info, &spec, &batch, &candidate, u64::MAX)
                    else {
                        continue;
                    };
                    let step = evaluation.metrics.step_time_s;
                    assert!(
                        bound > 0.0 && bound <= step,
                        "{} {} on {}: bound {bound} s, simulated {step} s",
                        info.name,
                        candidate.label,
                        spec.parallel
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 500, "only {checked} candidates checked");
}

/// The bound on forward packs holds for every step made from them: each of slimpack's
/// pipelines (its candidates' own and their variants), cut before `pack-bwd`, is bounded
/// there and then run to its end and simulated, on several layouts and batches; pipelines
/// that lower the recomputation later (`assign-recompute`) are bounded without any.
#[test]
fn the_forward_bound_never_exceeds_the_simulated_step() {
    use slimpack_ir::step::Phase;
    use slimpack_passes::{run_pipeline_in, ManagerOptions, PassContext};
    let info = strategy::lookup("slimpack").unwrap();
    let mut checked = 0;
    for (layout, (spec, context)) in layouts().into_iter().enumerate() {
        for seed in 0..2u64 {
            let lengths = long_tailed(seed + 20 * layout as u64, 24, context);
            let batch = Batch::from_lengths(&lengths, Some(context), "test");
            let state = StrategyState::default();
            for candidate in (info.candidates)(&spec, &batch, &state, &Choices::all()) {
                let spec = candidate_spec(&spec, &candidate);
                let cx = PassContext::for_spec(&spec);
                let options = ManagerOptions::default();
                let pipelines = std::iter::once(&candidate.pipeline)
                    .chain(candidate.variants.iter().map(|variant| &variant.pipeline));
                for pipeline in pipelines {
                    let entries = parse_pipeline(pipeline).unwrap();
                    let Some(cut) = entries.iter().position(|e| e.info.name == "pack-bwd") else {
                        continue;
                    };
                    let packed = crate::compile::compile_entries(
                        &spec,
                        &batch,
                        &entries[..cut],
                        &cx,
                        &options,
                        &mut std::io::sink(),
                    )
                    .unwrap();
                    assert_eq!(packed.ir.phase(), Phase::Assigned, "{pipeline}");
                    let lowers = entries[cut..]
                        .iter()
                        .any(|entry| entry.info.name == "assign-recompute");
                    let cost = match lowers {
                        true => cx
                            .machine()
                            .with_recompute(slimpack_ir::spec::Recompute::None),
                        false => cx.machine().clone(),
                    };
                    let bound = sim::forward_bound(&packed.ir, &cost).unwrap();
                    let mut ir = packed.ir;
                    run_pipeline_in(
                        &mut ir,
                        &entries[cut..],
                        &cx,
                        &options,
                        &mut std::io::sink(),
                    )
                    .unwrap();
                    let step = sim::simulate(&ir, cx.machine())
                        .unwrap()
                        .metrics
                        .step_time_s;
                    assert!(
                        bound > 0.0 && bound <= step * (1.0 + 1e-9),
                        "{pipeline} on {}: forward bound {bound} s, simulated {step} s",
                        spec.parallel
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 100, "only {checked} pipelines checked");
}

/// Pruning never changes the choice, per family or against the fastest of all: the same
/// candidate, variant and step as compiling every candidate, on several layouts, batches and
/// strategies, and it does prune.
#[test]
fn pruning_chooses_what_exhaustive_tuning_chooses() {
    let (mut pruned, mut pruned_together) = (0, 0);
    for (layout, (spec, context)) in layouts().into_iter().enumerate() {
        for seed in 0..3u64 {
            let lengths = long_tailed(seed + 100 * layout as u64, 40, context);
            let batch = Batch::from_lengths(&lengths, Some(context), "test");
            for name in ["slimpack", "megatron", "kk", "padding"] {
                let info = strategy::lookup(name).unwrap();
                let state = StrategyState::default();
                let choices = Choices::all();
                // Every candidate verified: the passes' output on all of them is checked.
                let run = |prune, per_family| {
                    let tune = TuneOptions {
                        prune,
                        per_family,
                        verify: Verify::Candidates,
                        ..TuneOptions::default()
                    };
                    choose_with(info, &spec, &batch, &state, &choices, &tune).unwrap()
                };
                let without = run(false, true);
                let b = without.best();
                let what = format!("{name} on {} (seed {seed})", spec.parallel);
                assert_eq!(without.pruned, 0, "{what}");
                for per_family in [true, false] {
                    let with = run(true, per_family);
                    let a = with.best();
                    let what = format!("{what}, per family: {per_family}");
                    assert_eq!(a.candidate.label, b.candidate.label, "{what}");
                    assert_eq!(a.variant, b.variant, "{what}");
                    assert_eq!(a.metrics, b.metrics, "{what}");
                    assert_eq!(with.candidates_offered(), without.candidates_offered());
                    match per_family {
                        true => pruned += with.pruned,
                        false => pruned_together += with.pruned,
                    }
                }
            }
        }
    }
    assert!(pruned > 0, "the test should exercise pruning");
    assert!(
        pruned_together > pruned,
        "against the fastest of all ({pruned_together}) prunes more than per family ({pruned})"
    );
}

/// A variant whose passes another ran on the same step (eqsat keeping its input) is
/// scored once, and the candidate's choice is that of running every pipeline alone: the
/// same variant (ties to the earlier pipeline) and the same metrics; and it does share.
#[test]
fn shared_variants_choose_what_running_every_variant_chooses() {
    let mut shared = 0;
    for (layout, (spec, context)) in layouts().into_iter().take(3).enumerate() {
        // A long-tailed batch, and one of equal lengths (balanced packs, which eqsat keeps).
        let batches = [
            long_tailed(1000 * layout as u64, 24, context),
            vec![context / 4; 32],
        ];
        for (seed, lengths) in batches.iter().enumerate() {
            let batch = Batch::from_lengths(lengths, Some(context), "test");
            let info = strategy::lookup("slimpack").unwrap();
            let state = StrategyState::default();
            let choices = Choices::fixed(spec.model.recompute);
            let limit = choices.memory_limit_for(&spec);
            let candidates = (info.candidates)(&spec, &batch, &state, &choices);
            // With their refinements (eqsat), as a step that runs them compiles them.
            let refined = candidates.iter().map(Candidate::refined);
            for candidate in refined.filter(|c| !c.label.starts_with("plan=")) {
                let candidate = &candidate;
                let Ok((evaluation, _)) = evaluate(info, &spec, &batch, candidate, limit) else {
                    continue;
                };
                let mut alone: Option<(String, Metrics)> = None;
                let pipelines = std::iter::once((String::new(), &candidate.pipeline)).chain(
                    candidate
                        .variants
                        .iter()
                        .map(|variant| (variant.label.clone(), &variant.pipeline)),
                );
                for (label, pipeline) in pipelines {
                    let single = Candidate {
                        pipeline: pipeline.clone(),
                        variants: Vec::new(),
                        ..candidate.clone()
                    };
                    let (run, _) = evaluate(info, &spec, &batch, &single, limit).unwrap();
                    if alone
                        .as_ref()
                        .is_none_or(|(_, best)| preferred(&run.metrics, best, limit))
                    {
                        alone = Some((label, run.metrics));
                    }
                }
                let (label, metrics) = alone.expect("a candidate has a pipeline");
                let what = format!("{} on {} (batch {seed})", candidate.label, spec.parallel);
                assert_eq!(evaluation.variant, label, "{what}");
                assert_eq!(evaluation.metrics, metrics, "{what}");
                shared += evaluation.variants_shared;
            }
        }
    }
    assert!(shared > 0, "the test should exercise shared variants");
}

/// A fallback (forward runs bounded by memory) is compiled only after its pipeline made a
/// step over the memory limit whose runs do not fit: under a limit every step fits, none
/// runs (nor wins); where no step fits and every run is over memory, all of them run.
#[test]
fn fallbacks_run_only_where_their_pipeline_goes_over_the_limit() {
    let (spec, batch, info) = slimpack_on_7b(7, 24);
    let state = StrategyState::default();
    let fallbacks = |candidate: &Candidate| {
        (candidate.variants.iter())
            .filter(|v| v.fallback_of.is_some())
            .count()
    };
    let roomy = Choices::fixed(spec.model.recompute);
    let candidates = (info.candidates)(&spec, &batch, &state, &roomy);
    let with_fallbacks: Vec<&Candidate> = candidates.iter().filter(|c| fallbacks(c) > 0).collect();
    assert!(
        !with_fallbacks.is_empty(),
        "slimpack's own pipelines have fallbacks"
    );
    for &candidate in &with_fallbacks {
        let (evaluation, _) = evaluate(info, &spec, &batch, candidate, u64::MAX).unwrap();
        assert_eq!(
            evaluation.fallbacks_skipped,
            fallbacks(candidate),
            "{}",
            candidate.label
        );
        assert!(
            !evaluation.variant.contains("runs=bounded"),
            "{}",
            candidate.label
        );
    }
    // Runs measured against a sliver of memory (every one over it), and no step fitting.
    let tight = Choices {
        memory_limit: 0.01,
        ..roomy
    };
    let candidates = (info.candidates)(&spec, &batch, &state, &tight);
    let mut ran = 0;
    for candidate in candidates.iter().filter(|c| fallbacks(c) > 0) {
        assert!(
            candidate.pipeline.contains("memory=0.01"),
            "{}",
            candidate.pipeline
        );
        let (evaluation, _) = evaluate(info, &spec, &batch, candidate, 0).unwrap();
        assert_eq!(evaluation.fallbacks_skipped, 0, "{}", candidate.label);
        ran += fallbacks(candidate);
    }
    assert!(ran > 0);
}

/// Tuning against a step to beat: the exhaustive choice where it is faster, nothing where
/// it is not, and nothing (every candidate pruned) below every bound.
#[test]
fn choosing_below_a_step_finds_only_a_faster_one() {
    let (spec, context) = layouts().swap_remove(1);
    let batch = Batch::from_lengths(&long_tailed(5, 40, context), Some(context), "test");
    let state = StrategyState::default();
    let choices = Choices::all();
    let tune = TuneOptions::default();
    for name in ["slimpack", "kk"] {
        let info = strategy::lookup(name).unwrap();
        let full = choose_with(info, &spec, &batch, &state, &choices, &tune).unwrap();
        let best = full.best().metrics.step_time_s;
        let below = |incumbent| {
            choose_below(info, &spec, &batch, &state, &choices, &tune, incumbent).unwrap()
        };
        let faster = below(best * 1.5).expect("the best step beats a slower one");
        assert_eq!(faster.best().candidate.label, full.best().candidate.label);
        assert_eq!(faster.best().metrics, full.best().metrics);
        // Every candidate whose bound is above the incumbent is pruned from the start
        // (how many more are pruned depends on which candidates finish first, on threads).
        let candidates = (info.candidates)(&spec, &batch, &state, &choices);
        let above = candidates
            .iter()
            .filter(|candidate| candidate_bound(&spec, &batch, candidate) > best * 1.5)
            .count();
        assert!(
            faster.pruned >= above,
            "{name}: {} < {above}",
            faster.pruned
        );
        assert!(
            below(best).is_none(),
            "{name}: nothing is faster than the best"
        );
        assert!(below(0.0).is_none(), "{name}: every bound is above 0 s");
    }
}

/// A broken step is caught though the tuner verifies only the steps its pipelines finish
/// with (every candidate's, or only the chosen one's): a sample longer than the context
/// (which only the verifier rejects) fails every candidate, alone or compiled together,
/// and the tuning, with the verifier's error on the input (the re-run that verifies every
/// pass names where the step first broke).
#[test]
fn a_broken_step_is_caught_and_named() {
    let spec = Spec::from_presets("llama-7b", "h100-sxm", "tp=8,pp=2,dp=4").unwrap();
    let batch = Batch::from_lengths(&[6000, 1000, 500, 300], Some(4096), "test");
    let info = strategy::lookup("slimpack").unwrap();
    let choices = Choices::all();
    let limit = choices.memory_limit_for(&spec);
    let candidates = (info.candidates)(&spec, &batch, &StrategyState::default(), &choices);
    let tune = TuneOptions {
        verify: Verify::Candidates,
        ..TuneOptions::default()
    };
    let group = compiled_together(&candidates)
        .into_iter()
        .find(|group| group.len() > 1)
        .expect("slimpack's candidates have twins on a pipeline");
    let members: Vec<&Candidate> = group.iter().map(|&i| &candidates[i]).collect();
    let alone = members
        .iter()
        .map(|candidate| evaluate_with(info, &spec, &batch, candidate, limit, &tune));
    let together = evaluate_together(info, &spec, &batch, &members, limit, &tune);
    // The tuning, verifying only the chosen step, names it too (the method's own
    // candidates: the peers' plans, which do not slice, fail on the sample before any
    // verifier looks).
    let own = strategy::lookup("slimpack-no-eqsat").unwrap();
    let state = StrategyState::default();
    let tuned = choose_with(
        own,
        &spec,
        &batch,
        &state,
        &choices,
        &TuneOptions::default(),
    )
    .map(|choice| (choice.best().clone(), choice.compiled));
    for outcome in alone.chain(together).chain([tuned]) {
        let Err(TuneError::Compile { source, .. }) = outcome else {
            panic!(
                "a step past the context is not caught: {:?}",
                outcome.map(|_| ())
            );
        };
        assert!(
            matches!(*source, PassError::Invalid { after: None, .. }),
            "{source}"
        );
        assert!(source.to_string().contains("sample-len"), "{source}");
    }
    // Without the verifier the tuner does not look.
    let unverified = TuneOptions {
        verify: Verify::Off,
        ..TuneOptions::default()
    };
    assert!(evaluate_with(info, &spec, &batch, members[0], limit, &unverified).is_ok());
}

/// Candidates compiled together (zero-bubble and per-stage recomputation twins) each get
/// the evaluation they get alone: the same variant, metrics and passes, and the step
/// handed on is the one scored; and the groups do hold several candidates.
#[test]
fn candidates_compiled_together_evaluate_as_they_do_alone() {
    let mut grouped = 0;
    for (layout, (spec, context)) in layouts().into_iter().take(2).enumerate() {
        let lengths = long_tailed(7 + layout as u64, 24, context);
        let batch = Batch::from_lengths(&lengths, Some(context), "test");
        let info = strategy::lookup("slimpack").unwrap();
        let state = StrategyState::default();
        let choices = Choices::all();
        let limit = choices.memory_limit_for(&spec);
        let candidates = (info.candidates)(&spec, &batch, &state, &choices);
        let groups = compiled_together(&candidates);
        let mut seen: Vec<usize> = groups.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..candidates.len()).collect::<Vec<_>>());
        let tune = TuneOptions::default();
        for group in groups.iter().filter(|group| group.len() > 1) {
            let members: Vec<&Candidate> = group.iter().map(|&i| &candidates[i]).collect();
            let together = evaluate_together(info, &spec, &batch, &members, limit, &tune);
            for (candidate, together) in members.iter().zip(together) {
                let alone = evaluate(info, &spec, &batch, candidate, limit);
                let what = format!("{} on {}", candidate.label, spec.parallel);
                let ((a, compiled), (b, _)) = match (together, alone) {
                    (Ok(together), Ok(alone)) => (together, alone),
                    (Err(a), Err(b)) => {
                        assert_eq!(a.to_string(), b.to_string(), "{what}");
                        continue;
                    }
                    (a, b) => panic!("{what}: together {:?}, alone {:?}", a.err(), b.err()),
                };
                assert_eq!(a.variant, b.variant, "{what}");
                assert_eq!(a.metrics, b.metrics, "{what}");
                let names = |e: &Evaluation| -> Vec<String> {
                    e.passes.iter().map(|p| p.pipeline_entry.clone()).collect()
                };
                assert_eq!(names(&a), names(&b), "{what}");
                let cost = slimpack_machine::machine_model(&candidate_spec(&spec, candidate));
                let again = sim::simulate(&compiled.ir, &cost).unwrap();
                assert_eq!(again.metrics, a.metrics, "{what}");
            }
            grouped += 1;
        }
    }
    assert!(grouped > 10, "only {grouped} groups of several candidates");
}

/// The tuning compares candidates without their refinements, then the chosen one's step
/// is the best of its pipelines and refinements: what evaluating it refined gives.
#[test]
fn the_chosen_candidate_is_refined() {
    let mut refined_some = 0;
    for (layout, (spec, context)) in layouts().into_iter().take(3).enumerate() {
        let batch = Batch::from_lengths(
            &long_tailed(40 + layout as u64, 32, context),
            Some(context),
            "test",
        );
        let info = strategy::lookup("slimpack").unwrap();
        let choices = Choices::all();
        let limit = choices.memory_limit_for(&spec);
        let choice = choose(info, &spec, &batch, &StrategyState::default(), &choices).unwrap();
        let best = choice.best();
        if best.candidate.refinements.is_empty() {
            continue;
        }
        let (refined, _) = evaluate(info, &spec, &batch, &best.candidate.refined(), limit).unwrap();
        assert_eq!(best.metrics, refined.metrics, "{}", best.candidate.label);
        assert_eq!(best.variant, refined.variant, "{}", best.candidate.label);
        let model = slimpack_machine::machine_model(&choice.compiled.ir.spec);
        let again = sim::simulate(&choice.compiled.ir, &model).unwrap();
        assert_eq!(again.metrics, best.metrics);
        refined_some += 1;
    }
    assert!(refined_some > 0, "no chosen candidate has refinements");
}

#[test]
fn each_step_runs_the_best_variant_of_its_candidate() {
    let spec = Spec::from_presets("llama-7b", "h100-sxm", "tp=8,pp=2,dp=4").unwrap();
    let lengths = [
        4096, 3000, 2500, 900, 700, 512, 300, 260, 128, 100, 64, 2048,
    ];
    let batch = Batch::from_lengths(&lengths, Some(4096), "test");
    let info = strategy::lookup("slimpack").unwrap();
    let state = StrategyState::default();
    let choices = Choices::fixed(spec.model.recompute);
    let cost = slimpack_machine::machine_model(&spec);
    let method = (info.candidates)(&spec, &batch, &state, &choices)
        .into_iter()
        .filter(|candidate| !candidate.label.starts_with("plan="));
    for unrefined in method {
        // Asymmetric or mirrored packs, and (pp > 1) 1F1B beside the list schedule, the
        // mirrored ones with their fallbacks (forward runs bounded by memory); the same
        // refined by eqsat, tried once the candidate runs.
        assert_eq!(unrefined.variants.len(), 5, "{}", unrefined.label);
        let fallbacks = (unrefined.variants.iter())
            .filter(|v| {
                v.fallback_of
                    .as_deref()
                    .is_some_and(|of| of.contains("mirror"))
            })
            .count();
        assert_eq!(fallbacks, 2, "{}", unrefined.label);
        assert_eq!(unrefined.refinements.len(), 4, "{}", unrefined.label);
        let candidate = unrefined.refined();
        let limit = choices.memory_limit_bytes(cost.memory().capacity_bytes());
        let (evaluation, compiled) = evaluate(info, &spec, &batch, &candidate, limit).unwrap();
        let (searched, _) = evaluate(info, &spec, &batch, &unrefined, limit).unwrap();
        assert!(evaluation.metrics.step_time_s <= searched.metrics.step_time_s);
        // Each pipeline compiled on its own: the chosen one is the fastest (all fit, so
        // no fallback runs).
        assert_eq!(
            evaluation.fallbacks_skipped, fallbacks,
            "{}",
            candidate.label
        );
        let mut steps = Vec::new();
        let pipelines = (candidate.variants.iter())
            .filter(|v| v.fallback_of.is_none())
            .map(|v| &v.pipeline);
        for pipeline in std::iter::once(&candidate.pipeline).chain(pipelines) {
            let mut single = candidate.clone();
            single.pipeline = pipeline.clone();
            single.variants.clear();
            let (alone, _) = evaluate(info, &spec, &batch, &single, limit).unwrap();
            steps.push(alone.metrics.step_time_s);
        }
        let fastest = steps.iter().cloned().fold(f64::INFINITY, f64::min);
        assert_eq!(
            evaluation.metrics.step_time_s, fastest,
            "{}",
            candidate.label
        );
        // The step handed on is the one that was scored.
        let again = sim::simulate(&compiled.ir, &cost).unwrap();
        assert_eq!(again.metrics.step_time_s, evaluation.metrics.step_time_s);
    }
}

/// Against any step to beat, a group of candidates compiled together keeps each member's
/// evaluation as it is unpruned, or drops the member, and drops none whose unpruned step fits
/// no slower than the fastest fitting step at the end (that step, or one of the group's).
/// Under memory limits that forward runs go over, the pipelines whose steps decide on a
/// fallback are deferred rather than pruned (run only where a fallback's decision needs
/// them); what each member keeps is the same.
#[test]
fn deferring_what_decides_a_fallback_keeps_every_members_evaluation() {
    let (spec, batch, info) = slimpack_on_7b(21, 40);
    let state = StrategyState::default();
    let tune = TuneOptions::default();
    let (mut kept, mut dropped) = (0, 0);
    for memory_limit in [0.25, 0.5] {
        let choices = Choices {
            memory_limit,
            ..Choices::fixed(spec.model.recompute)
        };
        let limit = choices.memory_limit_for(&spec);
        let candidates = (info.candidates)(&spec, &batch, &state, &choices);
        for group in compiled_together(&candidates) {
            let members: Vec<&Candidate> = group.iter().map(|&index| &candidates[index]).collect();
            let has_fallbacks = (members.iter())
                .any(|member| member.variants.iter().any(|v| v.fallback_of.is_some()));
            if !has_fallbacks {
                continue;
            }
            let unpruned: Vec<Evaluation> =
                evaluate_below(info, &spec, &batch, &members, limit, &tune, None)
                    .into_iter()
                    .map(|outcome| outcome.unwrap().expect("nothing is pruned").0)
                    .collect();
            let mut steps: Vec<f64> = (unpruned.iter())
                .map(|evaluation| evaluation.metrics.step_time_s)
                .collect();
            steps.sort_by(f64::total_cmp);
            let below_all = steps[0] * 0.9;
            let fastest_steps = std::iter::once(below_all).chain(
                (steps.iter()).flat_map(|&step| [step * (1.0 - 1e-6), step, step * (1.0 + 1e-6)]),
            );
            for fastest in fastest_steps {
                let fastest_bits = AtomicU64::new(fastest.to_bits());
                let pruned = evaluate_below(
                    info,
                    &spec,
                    &batch,
                    &members,
                    limit,
                    &tune,
                    Some(&fastest_bits),
                );
                // Lowered by the group's own fitting steps as they are found.
                let fastest = f64::from_bits(fastest_bits.load(Ordering::Acquire));
                for (alone, outcome) in unpruned.iter().zip(pruned) {
                    let what = format!(
                        "{} below {fastest} at {memory_limit}",
                        alone.candidate.label
                    );
                    match outcome.unwrap() {
                        Some((evaluation, _)) => {
                            assert_eq!(evaluation.variant, alone.variant, "{what}");
                            assert_eq!(evaluation.metrics, alone.metrics, "{what}");
                            kept += 1;
                        }
                        None => {
                            let fits_below = within(&alone.metrics, limit)
                                && alone.metrics.step_time_s <= fastest;
                            assert!(!fits_below, "{what}");
                            dropped += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(kept > 0 && dropped > 0, "kept {kept}, dropped {dropped}");
}

/// A pipeline deferred by the bound runs after all where its fallback's decision needs its
/// step: a fallback much faster than the pipeline it falls back from (whole documents in
/// large packs, over the memory limit; the fallback cuts them finely and fits), against a
/// step to beat at the fallback's own step, keeps the fallback's step as unpruned, with the
/// pipeline's bound above that step. Pruned instead of deferred, the pipeline would leave the
/// fallback unwanted and the member dropped; left undecided, a fallback would run where the
/// pipeline fits (and unpruned none does).
#[test]
fn a_deferred_pipeline_runs_where_its_fallbacks_decision_needs_it() {
    let (spec, batch, info) = slimpack_on_7b(21, 40);
    let state = StrategyState::default();
    let choices = Choices::fixed(spec.model.recompute);
    let base = (info.candidates)(&spec, &batch, &state, &choices)
        .into_iter()
        .find(|candidate| !candidate.label.starts_with("plan="))
        .unwrap();
    let whole =
        "assign-dp{balance=none},slice{size=32768},pack-fwd{cap=65536,memory=0.01},pack-bwd,\
                 schedule-pipeline";
    let fine = "assign-dp,slice{size=4096},pack-fwd{cap=8192},pack-bwd,schedule-pipeline";
    let alone = |pipeline: &str| {
        let single = Candidate {
            pipeline: pipeline.to_string(),
            variants: Vec::new(),
            refinements: Vec::new(),
            ..base.clone()
        };
        evaluate(info, &spec, &batch, &single, u64::MAX)
            .unwrap()
            .0
            .metrics
    };
    let (slow, fast) = (alone(whole), alone(fine));
    // The limit the fine step fits and the whole one does not.
    let limit = fast.peak_memory_bytes;
    assert!(slow.peak_memory_bytes > limit, "{slow:?} {fast:?}");
    let candidate = Candidate {
        pipeline: whole.to_string(),
        variants: vec![strategy::Variant {
            label: "fine".to_string(),
            pipeline: fine.to_string(),
            fallback_of: Some(whole.to_string()),
        }],
        refinements: Vec::new(),
        ..base.clone()
    };
    let unpruned = evaluate(info, &spec, &batch, &candidate, limit).unwrap().0;
    assert_eq!(unpruned.variant, "fine");
    assert_eq!(unpruned.metrics, fast);
    // The whole packing's bound is above the fine step: it is deferred there.
    let cost = slimpack_machine::machine_model(&spec);
    let cx = slimpack_passes::PassContext::for_spec(&spec);
    let packed = crate::compile::compile_entries(
        &spec,
        &batch,
        &slimpack_passes::parse_pipeline(&whole[..whole.find(",pack-bwd").unwrap()]).unwrap(),
        &cx,
        &slimpack_passes::ManagerOptions::default(),
        &mut std::io::sink(),
    )
    .unwrap()
    .ir;
    let bound = sim::forward_bound(&packed, &cost).unwrap();
    assert!(exceeds(bound, fast.step_time_s), "{bound} {fast:?}");
    let fastest = AtomicU64::new(fast.step_time_s.to_bits());
    let tune = TuneOptions::default();
    let below = evaluate_below(
        info,
        &spec,
        &batch,
        &[&candidate],
        limit,
        &tune,
        Some(&fastest),
    )
    .remove(0)
    .unwrap()
    .expect("the fallback's step fits at the step to beat");
    assert_eq!(below.0.variant, "fine");
    assert_eq!(below.0.metrics, fast);
    // Where the whole packing fits, its fallback is not wanted: unpruned the member keeps the
    // slow step; against the fine step it is dropped, the fallback not run after all.
    let roomy = evaluate(info, &spec, &batch, &candidate, u64::MAX)
        .unwrap()
        .0;
    assert_eq!(roomy.variant, "");
    assert_eq!(roomy.metrics, slow);
    assert_eq!(roomy.fallbacks_skipped, 1);
    let fastest = AtomicU64::new(fast.step_time_s.to_bits());
    let below = evaluate_below(
        info,
        &spec,
        &batch,
        &[&candidate],
        u64::MAX,
        &tune,
        Some(&fastest),
    );
    assert!(below[0].as_ref().unwrap().is_none());
}
