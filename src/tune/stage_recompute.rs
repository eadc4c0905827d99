//! Per-stage recomputation in the search: a twin of every candidate that recomputes fully,
//! whose pipeline ends in `assign-recompute` (see `slimpack_passes::assign_recompute`).
//!
//! The twin compiles and schedules the step as its original does — under `recompute=full`, so
//! that `schedule-pipeline` cuts no warm-up for memory — and then gives each pipeline device
//! the least recomputation its simulated peak memory allows (`none` on the stages that hold
//! few forwards, `block:K` or `full` where memory forces it). The originals stay in the
//! search, so it only grows; the simulator decides. Labels say `recompute=per-stage`.
//!
//! With per-pack recomputation (the full method), each of the twin's pipelines is also a
//! variant ending in `assign-recompute{packs=true}` (labelled `packs`): after each device's
//! rung, the packs whose lifetime leaves memory room save under a lower rung of their own. Each
//! step keeps the faster of the two (the device-wide rungs leave the memory a shared rank's
//! interleaving can use).
//!
//! Only where the choices allow it (`Choices::stage_recompute`: not when the user fixed a mode,
//! nor for consumers that run one mode per step).

use slimpack_ir::spec::Recompute;
use slimpack_passes::parse_pipeline;

use super::strategy::{Candidate, Choices, Variant, DEFAULT_MEMORY_LIMIT};

/// The pass that assigns the stages' recomputation.
const PASS: &str = "assign-recompute";

/// `candidates` and, where `choices` let the strategy choose its recomputation, the per-stage
/// twin of each one that recomputes fully (after them, in their order); with `per_pack`, each
/// of the twin's pipelines also as a variant whose packs take lower rungs where memory allows
/// (`assign-recompute{packs=true}`, labelled `packs`).
pub fn with_stage_recompute(
    candidates: Vec<Candidate>,
    choices: &Choices,
    per_pack: bool,
) -> Vec<Candidate> {
    if !choices.stage_recompute {
        return candidates;
    }
    let pass = |packs: bool| {
        let mut options = Vec::new();
        if choices.memory_limit != DEFAULT_MEMORY_LIMIT {
            options.push(format!("memory={}", choices.memory_limit));
        }
        if packs {
            options.push("packs=true".to_string());
        }
        match options.is_empty() {
            true => PASS.to_string(),
            false => format!("{PASS}{{{}}}", options.join(",")),
        }
    };
    let (plain, packed) = (pass(false), pass(true));
    let twins: Vec<Candidate> = candidates
        .iter()
        .filter(|candidate| candidate.recompute == Recompute::Full)
        .map(|candidate| {
            let mut twin = candidate.map_pipelines(|pipeline| format!("{pipeline},{plain}"));
            twin.label = candidate
                .label
                .replace("recompute=full", "recompute=per-stage");
            if per_pack {
                // Where the packs' own rungs fill the memory another pass would use (a
                // shared rank's interleaving), the device-wide rungs can be faster: each step
                // keeps the faster of the two.
                let with_packs = candidate.map_pipelines(|pipeline| format!("{pipeline},{packed}"));
                let packs_label = |label: &str| match label.is_empty() {
                    true => "packs".to_string(),
                    false => format!("{label},packs"),
                };
                let primary = Variant {
                    label: packs_label(""),
                    pipeline: with_packs.pipeline,
                    fallback_of: None,
                };
                let relabel = |variants: Vec<Variant>| {
                    variants.into_iter().map(|variant| Variant {
                        label: packs_label(&variant.label),
                        ..variant
                    })
                };
                twin.variants.push(primary);
                twin.variants.extend(relabel(with_packs.variants));
                twin.refinements.extend(relabel(with_packs.refinements));
            }
            twin
        })
        .collect();
    let mut all = candidates;
    all.extend(twins);
    all
}

/// The recomputation that bounds `candidate`'s work from below: its own mode, or `none` where
/// its pipeline assigns the stages theirs (a stage may then recompute less than the
/// candidate's mode).
pub fn least_recompute(candidate: &Candidate) -> Recompute {
    let assigns = |pipeline: &str| {
        parse_pipeline(pipeline)
            .map(|entries| entries.iter().any(|entry| entry.info.name == PASS))
            .unwrap_or(false)
    };
    let any = std::iter::once(&candidate.pipeline)
        .chain(candidate.variants.iter().map(|variant| &variant.pipeline))
        .chain(
            candidate
                .refinements
                .iter()
                .map(|variant| &variant.pipeline),
        )
        .any(|pipeline| assigns(pipeline));
    match any {
        true => Recompute::None,
        false => candidate.recompute,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(recompute: Recompute) -> Candidate {
        Candidate {
            label: format!("cp=1,recompute={recompute}"),
            pipeline: "assign-dp,pack-fwd{cap=8},pack-bwd{cap=8},schedule-pipeline".into(),
            variants: vec![Variant {
                label: "order=1f1b".into(),
                pipeline: "assign-dp,pack-fwd{cap=8},pack-bwd{cap=8},schedule-pipeline{order=1f1b}"
                    .into(),
                fallback_of: None,
            }],
            refinements: Vec::new(),
            recompute,
            vpp: None,
        }
    }

    #[test]
    fn full_candidates_get_a_per_stage_twin() {
        let candidates = vec![candidate(Recompute::None), candidate(Recompute::Full)];
        let all = with_stage_recompute(candidates.clone(), &Choices::all(), false);
        assert_eq!(all.len(), 3);
        assert_eq!(&all[..2], &candidates[..]);
        let twin = &all[2];
        assert_eq!(twin.label, "cp=1,recompute=per-stage");
        assert_eq!(twin.recompute, Recompute::Full);
        assert!(twin.pipeline.ends_with(",assign-recompute"));
        assert!(twin.variants[0]
            .pipeline
            .ends_with("order=1f1b},assign-recompute"));
        assert_eq!(least_recompute(twin), Recompute::None);
        assert_eq!(least_recompute(&all[1]), Recompute::Full);
    }

    /// On a pipeline whose first stage must recompute (llama-7b on 40 GiB devices, pp=4), each
    /// per-stage twin of slimpack's candidates (with its `packs` variants) fits wherever its
    /// uniform `full` original fits, and recomputes less (never more).
    #[test]
    fn per_stage_twins_fit_where_full_fits_and_recompute_less() {
        use super::super::autotune::evaluate;
        use super::super::strategy::{lookup, StrategyState};
        use slimpack_ir::batch::Batch;
        use slimpack_ir::Spec;

        let mut spec = Spec::from_presets("llama-7b", "h100-sxm", "tp=2,pp=4,dp=1").unwrap();
        spec.cluster.gpu.hbm_bytes = 40 << 30;
        let lengths: Vec<u32> = (0..12).map(|i| 4096 + 2048 * (i % 5)).collect();
        let batch = Batch::from_lengths(&lengths, Some(16384), "test");
        let info = lookup("slimpack").unwrap();
        let choices = Choices::all();
        let limit = choices.memory_limit_for(&spec);
        let candidates = (info.candidates)(&spec, &batch, &StrategyState::default(), &choices);
        let mut compared = 0;
        for twin in candidates
            .iter()
            .filter(|c| c.label.contains("recompute=per-stage"))
        {
            if compared == 4 {
                break;
            }
            let label = twin.label.replace("recompute=per-stage", "recompute=full");
            let original = candidates.iter().find(|c| c.label == label).unwrap();
            let (uniform, _) = evaluate(info, &spec, &batch, original, limit).unwrap();
            let (per_stage, _) = evaluate(info, &spec, &batch, twin, limit).unwrap();
            if uniform.metrics.oom || uniform.metrics.peak_memory_bytes > limit {
                continue;
            }
            assert!(
                per_stage.metrics.peak_memory_bytes <= limit,
                "{}: {} > {limit}",
                twin.label,
                per_stage.metrics.peak_memory_bytes
            );
            assert!(
                per_stage.metrics.losses.recompute_s < uniform.metrics.losses.recompute_s,
                "{}",
                twin.label
            );
            compared += 1;
        }
        assert_eq!(compared, 4, "too few fitting pairs compared");
    }

    #[test]
    fn a_fixed_mode_gets_no_twin_and_a_limit_reaches_the_pass() {
        let candidates = vec![candidate(Recompute::Full)];
        let fixed = Choices::fixed(Recompute::Full);
        assert_eq!(
            with_stage_recompute(candidates.clone(), &fixed, true),
            candidates
        );
        let one_mode = Choices::all().one_mode_per_step();
        assert_eq!(
            with_stage_recompute(candidates.clone(), &one_mode, true),
            candidates
        );
        let tight = Choices {
            memory_limit: 0.8,
            ..Choices::all()
        };
        let all = with_stage_recompute(candidates.clone(), &tight, false);
        assert!(all[1].pipeline.ends_with(",assign-recompute{memory=0.8}"));
        let all = with_stage_recompute(candidates, &tight, true);
        assert!(all[1].pipeline.ends_with(",assign-recompute{memory=0.8}"));
        assert_eq!(all[1].label, "cp=1,recompute=per-stage");
        // Every pipeline of the twin also with the packs' own rungs, as labelled variants.
        let packs: Vec<&Variant> = all[1]
            .variants
            .iter()
            .filter(|v| {
                v.pipeline
                    .ends_with(",assign-recompute{memory=0.8,packs=true}")
            })
            .collect();
        let labels: Vec<&str> = packs.iter().map(|v| v.label.as_str()).collect();
        assert_eq!(labels, ["packs", "order=1f1b,packs"]);
    }
}
