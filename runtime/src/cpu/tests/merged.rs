//! DP-Merge groups: k workers, each holding its load-balanced share of every slice and
//! exchanging K/V through the group, add up to the unsliced reference — with random slicings
//! and packings, across pipeline stages, with slices shorter than the group (workers without
//! tokens) and longer than a query block.

use proptest::prelude::*;

use super::harness::{
    batch_of, deterministic_config, params_with_random_gains, random_schedule, run_schedule_merged,
    small_config,
};
use super::sliced::TOLERANCE;
use crate::cpu::{reference_step, tensor_diff, LayerRange, Params, TokenBatch};

fn check_merged(
    params: &Params,
    stages: &[LayerRange],
    batch: &TokenBatch,
    seed: u64,
    size: usize,
) -> f32 {
    let (expected_loss, expected) = reference_step(params, batch).unwrap();
    let schedule = random_schedule(batch, seed);
    let (loss, grads) = run_schedule_merged(params, stages, batch, &schedule, size).unwrap();
    let loss_error =
        ((loss - expected_loss).abs() / expected_loss.abs().max(f64::MIN_POSITIVE)) as f32;
    let diff = tensor_diff(&grads, &expected).unwrap();
    assert!(
        loss_error <= TOLERANCE,
        "loss {loss} vs reference {expected_loss}"
    );
    assert!(
        diff.max_rel_error <= TOLERANCE,
        "{size} workers: {diff:?} for schedule {schedule:?}"
    );
    diff.max_rel_error.max(loss_error)
}

proptest! {
    #![proptest_config(deterministic_config(16))]

    #[test]
    fn merged_groups_match_the_reference(
        lengths in prop::collection::vec(1usize..80, 1..=3),
        seed in any::<u64>(),
        tied in any::<bool>(),
        size in 2usize..=3,
        stages in 1usize..=2,
    ) {
        let config = small_config(2, tied);
        let params = params_with_random_gains(&config, seed);
        let batch = batch_of(&config, &lengths, seed);
        let stages = LayerRange::split_even(&config, stages).unwrap();
        check_merged(&params, &stages, &batch, seed, size);
    }
}

#[test]
fn a_long_sample_over_several_query_blocks_matches_the_reference() {
    let config = small_config(2, true);
    let params = params_with_random_gains(&config, 7);
    let batch = batch_of(&config, &[300, 5], 3);
    for size in [1, 2, 4] {
        let worst = check_merged(&params, &[LayerRange::whole(&config)], &batch, 11, size);
        eprintln!("{size} workers: worst relative error {worst:e}");
    }
}
