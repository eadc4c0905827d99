//! Pipeline stages: split/merge, sliced execution across stages equals the reference, and the
//! per-stage optimizer with tied embeddings equals the whole-model one.

use proptest::prelude::*;

use super::harness::{
    batch_of, deterministic_config, params_with_random_gains, random_schedule, small_config,
};
use super::sliced::check_against_reference;
use crate::cpu::{reference_step, sum_tied_grads, AdamW, AdamWConfig, LayerRange, Params};

proptest! {
    #![proptest_config(deterministic_config(24))]

    #[test]
    fn two_stages_match_the_reference(
        lengths in prop::collection::vec(1usize..64, 1..=4),
        seed in any::<u64>(),
        tied in any::<bool>(),
    ) {
        let config = small_config(3, tied);
        let params = params_with_random_gains(&config, seed);
        let batch = batch_of(&config, &lengths, seed);
        let stages = LayerRange::split_even(&config, 2).unwrap();
        check_against_reference(&params, &stages, &batch, &random_schedule(&batch, seed));
    }
}

#[test]
fn three_stages_of_one_layer_match_the_reference() {
    for tied in [true, false] {
        let config = small_config(3, tied);
        let params = params_with_random_gains(&config, 21);
        let batch = batch_of(&config, &[30, 7, 50], 8);
        let stages = LayerRange::split_even(&config, 3).unwrap();
        check_against_reference(&params, &stages, &batch, &random_schedule(&batch, 2));
    }
}

#[test]
fn split_then_merge_is_the_identity() {
    for tied in [true, false] {
        let config = small_config(3, tied);
        let params = Params::init(&config, 5);
        let stages = LayerRange::split_even(&config, 2).unwrap();
        let parts = params.split(&stages).unwrap();
        assert_eq!(parts[0].layers.len(), 2);
        assert!(
            parts[1].output.is_some(),
            "the last stage holds an output projection"
        );
        assert_eq!(Params::merge(parts).unwrap(), params);
    }
}

#[test]
fn merging_unsummed_tied_gradients_is_refused() {
    let config = small_config(2, true);
    let params = params_with_random_gains(&config, 6);
    let batch = batch_of(&config, &[12, 4], 1);
    let stages = LayerRange::split_even(&config, 2).unwrap();
    let (_, mut grads) = run_schedule_unsummed(&params, &stages, &batch);
    assert!(Params::merge(grads.clone()).is_err());
    let (first, last) = grads.split_at_mut(1);
    sum_tied_grads(&mut first[0], &mut last[0]).unwrap();
    assert!(Params::merge(grads).is_ok());
}

/// Per-stage gradients of one pack holding every sample whole, before any tied-gradient sum.
fn run_schedule_unsummed(
    params: &Params,
    stages: &[LayerRange],
    batch: &crate::cpu::TokenBatch,
) -> (f64, Vec<Params>) {
    let parts = params.split(stages).unwrap();
    let slices: Vec<_> = batch.sample_ids().map(|s| batch.whole_slice(s)).collect();
    let mut states: Vec<_> = stages
        .iter()
        .map(|&s| crate::cpu::StageState::new(params.config(), s))
        .collect();
    let mut grads: Vec<Params> = parts.iter().map(Params::zeros_like).collect();
    let hidden = states[0]
        .forward_pack(&parts[0], batch, &slices, &[])
        .unwrap()
        .hidden;
    let loss = states[1]
        .forward_pack(&parts[1], batch, &slices, &hidden)
        .unwrap()
        .loss;
    let grad = states[1]
        .backward_pack(&parts[1], &mut grads[1], batch, &slices, &[])
        .unwrap();
    states[0]
        .backward_pack(&parts[0], &mut grads[0], batch, &slices, &grad)
        .unwrap();
    (loss, grads)
}

#[test]
fn per_stage_adamw_after_summing_tied_gradients_equals_whole_model_adamw() {
    let config = small_config(2, true);
    let mut whole = params_with_random_gains(&config, 8);
    let batch = batch_of(&config, &[20, 9, 33], 4);
    let stages = LayerRange::split_even(&config, 2).unwrap();
    let mut parts = whole.split(&stages).unwrap();
    let adam = AdamWConfig {
        lr: 1e-2,
        ..AdamWConfig::default()
    };
    let mut whole_optimizer = AdamW::new(adam, &whole);
    let mut stage_optimizers: Vec<AdamW> = parts.iter().map(|p| AdamW::new(adam, p)).collect();
    for step in 0..3 {
        let (_, mut grads) =
            run_schedule_unsummed(&Params::merge(parts.clone()).unwrap(), &stages, &batch);
        let (first, last) = grads.split_at_mut(1);
        sum_tied_grads(&mut first[0], &mut last[0]).unwrap();
        for ((part, optimizer), grad) in parts.iter_mut().zip(&mut stage_optimizers).zip(&grads) {
            optimizer.step(part, grad).unwrap();
        }
        let merged_grads = Params::merge(grads).unwrap();
        whole_optimizer.step(&mut whole, &merged_grads).unwrap();
        assert_eq!(Params::merge(parts.clone()).unwrap(), whole, "step {step}");
    }
    let (loss_before, _) = reference_step(&params_with_random_gains(&config, 8), &batch).unwrap();
    let (loss_after, _) = reference_step(&whole, &batch).unwrap();
    assert!(
        loss_after < loss_before,
        "three AdamW steps should lower the loss"
    );
}
