//! Sliced and packed execution on one stage equals the unsliced reference.
//!
//! Random batches (1–4 samples of 1–63 tokens), random slicings, and random forward and backward
//! packs (two different partitions, interleaved as a 1F1B-like schedule would) must reproduce the
//! reference's loss and every gradient. Metric: `tensor_diff` (per tensor, max absolute error over
//! the tensor's max absolute reference gradient; worst tensor) ≤ 1e-5, and the loss's relative
//! error ≤ 1e-5.

use proptest::prelude::*;

use super::harness::{
    batch_of, deterministic_config, params_with_random_gains, random_schedule, run_schedule,
    small_config, Pack,
};
use crate::cpu::{
    reference_step, tensor_diff, LayerRange, ModelConfig, Params, StageState, TokenBatch,
};

/// Tolerance of the differential tests (fp32 sums in a different order: ~1e-7 expected).
pub const TOLERANCE: f32 = 1e-5;

/// Runs `schedule` over `stages` and checks it against the reference; returns the worst error.
pub fn check_against_reference(
    params: &Params,
    stages: &[LayerRange],
    batch: &TokenBatch,
    schedule: &[Pack],
) -> f32 {
    let (expected_loss, expected) = reference_step(params, batch).unwrap();
    let (loss, grads) = run_schedule(params, stages, batch, schedule).unwrap();
    let loss_error =
        ((loss - expected_loss).abs() / expected_loss.abs().max(f64::MIN_POSITIVE)) as f32;
    let diff = tensor_diff(&grads, &expected).unwrap();
    assert!(
        loss_error <= TOLERANCE,
        "loss {loss} vs reference {expected_loss}"
    );
    assert!(
        diff.max_rel_error <= TOLERANCE,
        "{diff:?} for schedule {schedule:?}"
    );
    diff.max_rel_error.max(loss_error)
}

fn lengths() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..64, 1..=4)
}

proptest! {
    #![proptest_config(deterministic_config(48))]

    #[test]
    fn random_slices_and_packs_match_the_reference(
        lengths in lengths(),
        seed in any::<u64>(),
        tied in any::<bool>(),
    ) {
        let config = small_config(2, tied);
        let params = params_with_random_gains(&config, seed);
        let batch = batch_of(&config, &lengths, seed);
        let schedule = random_schedule(&batch, seed);
        check_against_reference(&params, &[LayerRange::whole(&config)], &batch, &schedule);
    }
}

#[test]
fn tiny_preset_matches_the_reference_under_fine_slicing() {
    let spec = slimpack_ir::spec::ModelSpec::preset("tiny").unwrap();
    let config = ModelConfig::from_spec(&spec).unwrap();
    let params = Params::init(&config, 1);
    let batch = batch_of(&config, &[63, 17, 1, 40], 5);
    let mut worst = 0.0f32;
    for seed in 0..3 {
        let schedule = random_schedule(&batch, seed);
        worst = worst.max(check_against_reference(
            &params,
            &[LayerRange::whole(&config)],
            &batch,
            &schedule,
        ));
    }
    eprintln!("tiny preset: worst relative error {worst:e}");
}

#[test]
fn one_slice_per_sample_in_one_pack_matches_the_reference() {
    let config = small_config(2, true);
    let params = params_with_random_gains(&config, 3);
    let batch = batch_of(&config, &[5, 12, 2], 9);
    let whole: Vec<_> = batch.sample_ids().map(|s| batch.whole_slice(s)).collect();
    let schedule = [Pack::Forward(whole.clone()), Pack::Backward(whole)];
    check_against_reference(&params, &[LayerRange::whole(&config)], &batch, &schedule);
}

#[test]
fn a_batch_of_single_tokens_has_zero_loss_and_gradients() {
    let config = small_config(1, false);
    let params = Params::init(&config, 4);
    let batch = batch_of(&config, &[1, 1], 2);
    let schedule = random_schedule(&batch, 1);
    let (loss, grads) =
        run_schedule(&params, &[LayerRange::whole(&config)], &batch, &schedule).unwrap();
    assert_eq!(loss, 0.0);
    assert!(grads
        .tensors()
        .iter()
        .all(|t| t.data.iter().all(|&g| g == 0.0)));
}

#[test]
fn padding_holds_memory_like_a_slice_and_changes_no_value() {
    let config = small_config(2, true);
    let params = params_with_random_gains(&config, 8);
    let batch = batch_of(&config, &[20, 9], 4);
    let whole: Vec<_> = batch.sample_ids().map(|s| batch.whole_slice(s)).collect();
    let stages = LayerRange::split_even(&config, 2).unwrap();
    let parts = params.split(&stages).unwrap();
    let run = |padding: usize| {
        let mut states: Vec<StageState> = stages
            .iter()
            .map(|&s| StageState::new(&config, s))
            .collect();
        let mut grads: Vec<_> = parts.iter().map(Params::zeros_like).collect();
        let first = states[0]
            .forward_padded_pack(&parts[0], &batch, &whole, padding, &[])
            .unwrap();
        assert_eq!(first.hidden.len(), whole.len() + usize::from(padding > 0));
        let last = states[1]
            .forward_padded_pack(&parts[1], &batch, &whole, padding, &first.hidden)
            .unwrap();
        let held: Vec<_> = states.iter().map(StageState::live_bytes).collect();
        let grad = states[1]
            .backward_padded_pack(&parts[1], &mut grads[1], &batch, &whole, padding, &[])
            .unwrap();
        states[0]
            .backward_padded_pack(&parts[0], &mut grads[0], &batch, &whole, padding, &grad)
            .unwrap();
        assert!(states.iter().all(StageState::is_drained));
        (last.loss, grads, held)
    };
    let (loss, grads, held) = run(0);
    let (padded_loss, padded_grads, padded_held) = run(35);
    assert_eq!(loss, padded_loss);
    for (a, b) in grads.iter().zip(&padded_grads) {
        assert!(tensor_diff(b, a).unwrap().max_rel_error <= TOLERANCE);
    }
    // 35 more tokens on each stage: their activations and K/V, in proportion to the 29 real ones.
    for (plain, padded) in held.iter().zip(&padded_held) {
        let ratio = padded.activations as f64 / plain.activations as f64;
        assert!((ratio - 64.0 / 29.0).abs() < 0.05, "{ratio}");
        assert!(padded.kv > plain.kv, "{padded:?} vs {plain:?}");
    }
}
