//! Every strategy on random batches and layouts: the compiled step verifies, trains every token
//! it admitted, the same input compiles to byte-identical printed IR, and the simulated step's
//! losses add up to its time (the useful efficiency never above the executed one).
//!
//! A case draws a model (the tiny CPU model or llama-7b on H100), a layout whose `tp` divides
//! the heads and whose `pp` divides the layers (sometimes with two model chunks per device),
//! with a random `dp` and, sometimes, a fixed `cp`, a context and a batch of lengths from 1 to
//! the context — uniform, long-tailed (most short, a few near the context) or a mix — and a
//! recompute mode. Every strategy of
//! [`STRATEGIES`] then compiles one of its candidates (the case picks which) twice, from
//! fresh IR, with the pass manager verifying after every pass; the final IR is checked again
//! and the two printed forms compared. 128 cases x 13 strategies: 1,664 steps, each compiled twice.

use proptest::prelude::*;

use slimpack::ir::batch::Batch;
use slimpack::ir::spec::Recompute;
use slimpack::ir::step::Phase;
use slimpack::ir::{text, verify, Spec, StepIr};
use slimpack::passes::{parse_pipeline, run_pipeline, ManagerOptions};
use slimpack::tune::strategy::{Choices, StrategyState, STRATEGIES};

/// A model preset with the cluster it runs on and the contexts drawn for it.
struct Model {
    name: &'static str,
    cluster: &'static str,
    layers: u32,
    /// What `tp` must divide: the heads and the K/V heads.
    heads: u32,
    contexts: &'static [u32],
}

const MODELS: [Model; 2] = [
    Model {
        name: "tiny",
        cluster: "cpu",
        layers: 4,
        heads: 2,
        contexts: &[64, 512, 4096],
    },
    Model {
        name: "llama-7b",
        cluster: "h100-sxm",
        layers: 32,
        heads: 32,
        contexts: &[2048, 16384],
    },
];

/// One drawn case.
#[derive(Debug, Clone)]
struct Case {
    model: usize,
    layout: String,
    context: u32,
    lengths: Vec<u32>,
    recompute: Recompute,
    /// Picks each strategy's candidate (modulo its candidate count).
    pick: u32,
}

/// Divisors of `n` among `options`.
fn dividing(n: u32, options: &[u32]) -> Vec<u32> {
    options.iter().copied().filter(|d| n % d == 0).collect()
}

/// Lengths from 1 to `context`: uniform, long-tailed (u^6 of the context: mostly short, a few
/// close to it), or whole contexts.
fn lengths(context: u32) -> impl Strategy<Value = Vec<u32>> {
    let length = prop_oneof![
        3 => 1..=context,
        4 => (0.0f64..1.0).prop_map(move |u| ((u.powi(6) * f64::from(context)) as u32).max(1)),
        1 => Just(context),
    ];
    prop::collection::vec(length, 1..48)
}

fn case() -> impl Strategy<Value = Case> {
    (0..MODELS.len())
        .prop_flat_map(|model| {
            let spec = &MODELS[model];
            let tp = prop::sample::select(dividing(spec.heads, &[1, 2, 4, 8]));
            let pp = prop::sample::select(dividing(spec.layers, &[1, 2, 4]));
            let dp = prop::sample::select(vec![1u32, 2, 3, 4, 8]);
            let cp = prop::sample::select(vec![None, None, Some(2u32)]);
            let context = prop::sample::select(spec.contexts.to_vec());
            // Sometimes two model chunks per device (interleaved 1F1B) where the layers allow.
            let vpp = prop::sample::select(vec![1u32, 1, 2]);
            (Just(model), tp, pp, dp, cp, context, vpp)
        })
        .prop_flat_map(|(model, tp, pp, dp, cp, context, vpp)| {
            let layers = MODELS[model].layers;
            let vpp = if pp > 1 && layers % (pp * vpp) == 0 {
                vpp
            } else {
                1
            };
            let chunks = if vpp > 1 {
                format!(",vpp={vpp}")
            } else {
                String::new()
            };
            let layout = match cp {
                Some(cp) => format!("tp={tp},cp={cp},pp={pp}{chunks},dp={dp}"),
                None => format!("tp={tp},pp={pp}{chunks},dp={dp}"),
            };
            (
                Just(model),
                Just(layout),
                Just(context),
                lengths(context),
                prop::sample::select(Recompute::ALL.to_vec()),
                any::<u32>(),
            )
        })
        .prop_map(|(model, layout, context, lengths, recompute, pick)| Case {
            model,
            layout,
            context,
            lengths,
            recompute,
            pick,
        })
}

fn batch(case: &Case) -> Batch {
    Batch::from_lengths(&case.lengths, Some(case.context), "proptest")
}

/// Compiles `pipeline` on `batch` from fresh IR (verifying after every pass); the printed IR.
fn compile(spec: &Spec, batch: &Batch, pipeline: &str) -> Result<(String, StepIr), String> {
    let mut ir = StepIr::from_batch(spec.clone(), batch);
    let entries = parse_pipeline(pipeline).map_err(|e| e.to_string())?;
    run_pipeline(
        &mut ir,
        &entries,
        &ManagerOptions::default(),
        &mut std::io::sink(),
    )
    .map_err(|e| e.to_string())?;
    Ok((text::print(&ir), ir))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn every_strategy_verifies_and_is_deterministic(case in case()) {
        let model = &MODELS[case.model];
        let mut spec = Spec::from_presets(model.name, model.cluster, &case.layout).unwrap();
        spec.model.recompute = case.recompute;
        let drawn = batch(&case);
        for strategy in STRATEGIES {
            let mut state = StrategyState::default();
            let admitted = match strategy.admit {
                Some(admit) => admit(&mut state, &spec, &drawn),
                None => drawn.clone(),
            };
            let candidates = (strategy.candidates)(
                &spec,
                &admitted,
                &state,
                &Choices::fixed(case.recompute),
            );
            prop_assert!(!candidates.is_empty(), "{}: no candidate", strategy.name);
            let candidate = &candidates[case.pick as usize % candidates.len()];
            let what = format!("{} ({})", strategy.name, candidate.pipeline);
            let (first, ir) = compile(&spec, &admitted, &candidate.pipeline)
                .map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
            let errors = verify::check(&ir);
            prop_assert!(errors.is_empty(), "{what}: {errors:?}");
            prop_assert_eq!(ir.phase(), Phase::Scheduled, "{}", what);
            prop_assert_eq!(ir.tokens(), admitted.tokens(), "{}", what);
            let (second, _) = compile(&spec, &admitted, &candidate.pipeline)
                .map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
            prop_assert!(first == second, "{what}: two compiles print differently");

            let model = slimpack::machine::machine_model(&spec);
            let simulated = slimpack::machine::sim::simulate(&ir, &model)
                .map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
            let m = &simulated.metrics;
            let total = m.losses.total_s();
            prop_assert!(
                (total - m.step_time_s).abs() <= 1e-3 * m.step_time_s,
                "{what}: losses {total} s vs step {} s: {:?}",
                m.step_time_s,
                m.losses
            );
            prop_assert!(m.efficiency <= m.executed_efficiency * (1.0 + 1e-9), "{}", what);
            prop_assert!(m.floor_step_time_s >= m.useful_ideal_step_time_s, "{}", what);
        }
    }
}
