//! The CPU executor runs every strategy's and every pass pipeline's compiled step as a real
//! training step, and the step equals the plain unsliced single-worker reference: the same
//! loss and every gradient within 1e-5 (`tensor_diff`), whatever the slicing, the asymmetric
//! packs, the pipeline stages, the DP ranks, the DP-Merge groups and the split backwards of
//! zero-bubble schedules.
//!
//! Small sizes so that CI stays fast: a narrow `tiny`-shaped model (4 layers, hidden 32) and a
//! few dozen samples; no timing is asserted.

use slimpack::ir::batch::Batch;
use slimpack::ir::spec::ModelSpec;
use slimpack::ir::{Spec, StepIr};
use slimpack::machine::sim;
use slimpack::runtime::cpu::exec::{check_reference, execute, DeviceOrder, Plan};
use slimpack::runtime::cpu::{AdamWConfig, ModelConfig, Params};
use slimpack::tune::autotune;
use slimpack::tune::strategy::{Choices, StrategyState, STRATEGIES};
use slimpack::{compile, CompileOptions};

const TOLERANCE: f32 = 1e-5;

/// `tiny`'s structure (grouped-query attention, tied embeddings, fp32) at test width.
fn spec(parallel: &str) -> Spec {
    let mut spec = Spec::from_presets("tiny", "cpu", parallel).unwrap();
    spec.model = ModelSpec {
        hidden: 32,
        heads: 4,
        kv_heads: 2,
        head_dim: 8,
        ffn: 64,
        vocab: 64,
        ..spec.model
    };
    spec.validate().unwrap();
    spec
}

/// Samples of the given lengths, as if cut to `context`.
fn batch(lengths: &[u32], context: u32) -> Batch {
    Batch::from_lengths(lengths, Some(context), "runtime test")
}

/// A long-tailed batch: many short samples and a few long ones.
fn long_tailed() -> Batch {
    batch(
        &[
            9, 31, 4, 120, 17, 2, 55, 70, 12, 128, 6, 40, 23, 96, 3, 64, 11, 27, 1, 45,
        ],
        128,
    )
}

/// What a step exercises: (DP-Merge groups, samples cut into several slices, packs whose
/// forward and backward slice sets differ).
fn features(ir: &StepIr) -> (usize, usize, bool) {
    let merged = ir
        .replicas()
        .iter()
        .filter(|&&r| ir.replica(r).is_merged())
        .count();
    let sliced = ir
        .samples()
        .iter()
        .filter(|&&s| ir.slices_of(s).len() > 1)
        .count();
    let slice_sets = |direction| {
        let mut sets: Vec<Vec<_>> = ir
            .all_packs()
            .into_iter()
            .filter(|&p| ir.pack(p).direction == direction)
            .map(|p| {
                let mut slices = ir.pack_slices(p);
                slices.sort();
                slices
            })
            .collect();
        sets.sort();
        sets
    };
    use slimpack::ir::step::Direction;
    let asymmetric = slice_sets(Direction::Forward) != slice_sets(Direction::Backward);
    (merged, sliced, asymmetric)
}

/// Executes `ir` and checks it against the reference — with the simulator's interleaving of
/// devices shared by a plain replica and a DP-Merge group, and with the replica-major one where
/// that differs; returns what it exercised.
fn check(ir: &StepIr, what: &str) -> (usize, usize, bool) {
    let config = ModelConfig::from_spec(&ir.spec.model).unwrap();
    let plan = Plan::new(ir, &config).unwrap();
    let batch = plan.synthetic_batch(&config, 7).unwrap();
    let params = Params::init(&config, 3);
    let adamw = AdamWConfig::default();
    let simulated = sim::simulate(ir, &slimpack::machine::machine_model(&ir.spec)).unwrap();
    let starts = slimpack::measure::task_start_times(&simulated);
    let simulated_order =
        DeviceOrder::by_start_times(&plan, |pack, stage| starts.get(&(pack, stage)).copied())
            .unwrap();
    let mut orders = vec![DeviceOrder::replica_major(&plan)];
    if simulated_order != orders[0] {
        orders.push(simulated_order);
    }
    for order in &orders {
        let execution = execute(&plan, order, &batch, &params, adamw).unwrap();
        let check = check_reference(&execution, &params, &batch, adamw).unwrap();
        assert!(
            check.loss_rel_err <= f64::from(TOLERANCE) && check.max_grad_rel_err <= TOLERANCE,
            "{what}: {check:?}"
        );
    }
    let exercised = features(ir);
    eprintln!("{what}: DP-Merge groups, sliced samples, asymmetric packs: {exercised:?}");
    exercised
}

/// One dominant sample among short ones: strategies merge DP ranks for it.
fn dominant() -> Batch {
    batch(&[480, 20, 12, 30, 9, 64, 3, 40, 100, 7], 512)
}

#[test]
fn every_strategy_runs_equal_to_the_reference() {
    let mut seen = (false, false, false);
    for parallel in ["tp=1,pp=1,dp=2", "tp=1,pp=2,dp=2"] {
        let spec = spec(parallel);
        let batch = dominant();
        for strategy in STRATEGIES {
            if strategy.not_applicable(&spec).is_some() {
                continue; // hybrid-cp needs pp=1, as in Megatron-Core
            }
            let choices = Choices::fixed(spec.model.recompute);
            let mut state = StrategyState::default();
            let (_, choice) =
                autotune::compile_step(strategy, &spec, &batch, &mut state, &choices).unwrap();
            let label = &choice.best().candidate.label;
            let what = format!("{} ({label}) on {parallel}", strategy.name);
            any(&mut seen, check(&choice.compiled.ir, &what));
        }
    }
    assert!(seen.0, "some strategy runs a DP-Merge group");
}

/// Folds what the checked steps exercised: (any DP-Merge group, any sliced sample, any
/// asymmetric packing).
fn any(seen: &mut (bool, bool, bool), exercised: (usize, usize, bool)) {
    seen.0 |= exercised.0 > 0;
    seen.1 |= exercised.1 > 0;
    seen.2 |= exercised.2;
}

#[test]
fn pass_pipelines_run_equal_to_the_reference() {
    let pipelines = [
        "slice{size=16},assign-dp,pack-symmetric,schedule-pipeline",
        "assign-dp,slice{size=24},pack-fwd{cap=64},pack-bwd{cap=64},schedule-pipeline",
        "assign-dp,slice{size=24},pack-fwd{cap=64},pack-bwd{cap=64,mirror=true},schedule-pipeline",
        "assign-dp,dp-merge{threshold=0.5},slice{size=32},pack-fwd,pack-bwd,schedule-pipeline",
        "assign-hybrid-cp{max-tokens-per-rank=32},slice{size=32},pack-fwd,pack-bwd,schedule-pipeline",
        "assign-dp{cp=2},pack-symmetric{policy=ffd},schedule-pipeline",
        "assign-dp,slice{size=32},pack-fwd,pack-bwd,schedule-pipeline,eqsat",
        // Zero bubble: split backwards, weight gradients deferred (eqsat re-splits its packs).
        "assign-dp,slice{size=24},pack-fwd{cap=64},pack-bwd{cap=64},schedule-pipeline{zb=true}",
        "assign-dp,dp-merge{threshold=0.5},slice{size=32},pack-fwd,pack-bwd,schedule-pipeline{zb=true}",
        "assign-dp,slice{size=32},pack-fwd,pack-bwd,schedule-pipeline{zb=true},eqsat",
    ];
    let mut seen = (false, false, false);
    for parallel in ["tp=1,pp=2,dp=2", "tp=1,pp=1,dp=4"] {
        let spec = spec(parallel);
        for pipeline in pipelines {
            let options = CompileOptions {
                pipeline: pipeline.to_string(),
                ..CompileOptions::default()
            };
            let compiled = compile(&spec, &long_tailed(), &options, &mut std::io::sink())
                .unwrap_or_else(|e| panic!("{pipeline}: {e}"));
            assert_eq!(
                compiled.ir.has_split_backwards(),
                pipeline.contains("zb=true"),
                "{pipeline}"
            );
            any(
                &mut seen,
                check(&compiled.ir, &format!("{pipeline} on {parallel}")),
            );
        }
    }

    assert_eq!(
        seen,
        (true, true, true),
        "the pipelines exercise merged groups, slices and asymmetric packs"
    );
}

/// A DP rank in its plain replica and a DP-Merge group runs their schedules interleaved
/// (`interleave-ranks`): the program follows the written order, and the step still equals the
/// unsliced reference.
#[test]
fn interleaved_shared_ranks_run_equal_to_the_reference() {
    let spec = spec("tp=1,pp=2,dp=4");
    let mut interleaved = 0;
    for pipeline in [
        "assign-dp,dp-merge,pack-symmetric,schedule-pipeline,interleave-ranks",
        "assign-dp,dp-merge,slice{size=96},pack-fwd,pack-bwd,schedule-pipeline,interleave-ranks",
        "assign-dp,dp-merge,slice{size=96},pack-fwd,pack-bwd,schedule-pipeline{zb=true},interleave-ranks",
    ] {
        let options = CompileOptions {
            pipeline: pipeline.to_string(),
            ..CompileOptions::default()
        };
        let compiled = compile(&spec, &dominant(), &options, &mut std::io::sink())
            .unwrap_or_else(|e| panic!("{pipeline}: {e}"));
        interleaved += usize::from(compiled.ir.rank_orders().next().is_some());
        let (merged, _, _) = check(&compiled.ir, pipeline);
        assert!(merged > 0, "{pipeline}");
    }
    assert!(
        interleaved > 0,
        "no step interleaved a shared rank's replicas"
    );
}
