//! Schedules, batches and models the backend must refuse, with the error that names the problem;
//! and a refused pack leaves the worker's state as it was.

use super::harness::{batch_of, small_config};
use super::sliced::TOLERANCE;
use crate::cpu::{
    reference_step, tensor_diff, CpuError, LayerRange, ModelConfig, Params, SampleId, StageState,
    TokenBatch, TokenSlice,
};

fn slice(sample: usize, start: usize, len: usize) -> TokenSlice {
    TokenSlice {
        sample: SampleId(sample),
        start,
        len,
    }
}

#[test]
fn schedule_order_violations_are_refused_and_leave_the_state_untouched() {
    let config = small_config(2, true);
    let params = Params::init(&config, 2);
    let batch = batch_of(&config, &[6, 4], 3);
    let mut state = StageState::new(&config, LayerRange::whole(&config));
    let mut grads = params.zeros_like();

    let error = state
        .forward_pack(&params, &batch, &[slice(0, 3, 3)], &[])
        .unwrap_err();
    assert!(
        matches!(
            error,
            CpuError::ForwardOutOfOrder {
                expected_start: 0,
                ..
            }
        ),
        "{error}"
    );
    let error = state
        .forward_pack(&params, &batch, &[slice(1, 0, 2), slice(1, 3, 1)], &[])
        .unwrap_err();
    assert!(
        matches!(
            error,
            CpuError::ForwardOutOfOrder {
                expected_start: 2,
                ..
            }
        ),
        "{error}"
    );
    let error = state
        .forward_pack(&params, &batch, &[slice(0, 4, 3)], &[])
        .unwrap_err();
    assert!(
        matches!(error, CpuError::SliceOutOfRange { sample_len: 6, .. }),
        "{error}"
    );
    let error = state
        .forward_pack(&params, &batch, &[slice(2, 0, 1)], &[])
        .unwrap_err();
    assert!(
        matches!(error, CpuError::SliceOutOfRange { samples: 2, .. }),
        "{error}"
    );

    let loss_a = state
        .forward_pack(&params, &batch, &[slice(0, 0, 3), slice(1, 0, 4)], &[])
        .unwrap()
        .loss;
    let error = state
        .backward_pack(&params, &mut grads, &batch, &[slice(0, 0, 3)], &[])
        .unwrap_err();
    assert!(
        matches!(
            error,
            CpuError::BackwardBeforeForward {
                forwarded: 3,
                sample_len: 6,
                ..
            }
        ),
        "{error}"
    );
    let loss_b = state
        .forward_pack(&params, &batch, &[slice(0, 3, 3)], &[])
        .unwrap()
        .loss;
    let error = state
        .backward_pack(&params, &mut grads, &batch, &[slice(0, 0, 3)], &[])
        .unwrap_err();
    assert!(
        matches!(
            error,
            CpuError::BackwardOutOfOrder {
                expected_end: 6,
                ..
            }
        ),
        "{error}"
    );
    let error = state
        .backward_pack(&params, &mut grads, &batch, &[slice(1, 2, 2)], &[])
        .unwrap_err();
    assert!(matches!(error, CpuError::NotForwarded { .. }), "{error}");
    let error = state
        .backward_pack(
            &params,
            &mut grads,
            &batch,
            &[slice(1, 0, 4), slice(1, 0, 4)],
            &[],
        )
        .unwrap_err();
    assert!(
        matches!(
            error,
            CpuError::BackwardOutOfOrder {
                expected_end: 0,
                ..
            }
        ),
        "{error}"
    );

    state
        .backward_pack(
            &params,
            &mut grads,
            &batch,
            &[slice(0, 3, 3), slice(1, 0, 4)],
            &[],
        )
        .unwrap();
    state
        .backward_pack(&params, &mut grads, &batch, &[slice(0, 0, 3)], &[])
        .unwrap();
    assert!(state.is_drained());
    let error = state
        .forward_pack(&params, &batch, &[slice(1, 0, 4)], &[])
        .unwrap_err();
    assert!(matches!(error, CpuError::SampleRetired { .. }), "{error}");

    let (expected_loss, expected) = reference_step(&params, &batch).unwrap();
    assert!(((loss_a + loss_b - expected_loss) / expected_loss).abs() <= f64::from(TOLERANCE));
    assert!(tensor_diff(&grads, &expected).unwrap().max_rel_error <= TOLERANCE);
}

#[test]
fn tensors_and_inputs_of_the_wrong_stage_are_refused() {
    let config = small_config(2, false);
    let params = Params::init(&config, 1);
    let stages = LayerRange::split_even(&config, 2).unwrap();
    let parts = params.split(&stages).unwrap();
    let batch = batch_of(&config, &[5], 1);
    let whole = [batch.whole_slice(SampleId(0))];
    let mut first = StageState::new(&config, stages[0]);
    let mut last = StageState::new(&config, stages[1]);

    let error = first
        .forward_pack(&parts[1], &batch, &whole, &[])
        .unwrap_err();
    assert!(matches!(error, CpuError::StageMismatch { .. }), "{error}");
    let error = first
        .forward_pack(&parts[0], &batch, &whole, &[vec![0.0; 5 * 16]])
        .unwrap_err();
    assert!(
        matches!(
            error,
            CpuError::PackInput {
                expected: 0,
                got: 1,
                ..
            }
        ),
        "{error}"
    );
    let hidden = first
        .forward_pack(&parts[0], &batch, &whole, &[])
        .unwrap()
        .hidden;
    let error = last
        .forward_pack(&parts[1], &batch, &whole, &[])
        .unwrap_err();
    assert!(
        matches!(
            error,
            CpuError::PackInput {
                expected: 1,
                got: 0,
                ..
            }
        ),
        "{error}"
    );
    let error = last
        .forward_pack(&parts[1], &batch, &whole, &[vec![0.0; 3]])
        .unwrap_err();
    assert!(
        matches!(
            error,
            CpuError::PackInput {
                expected: 80,
                got: 3,
                ..
            }
        ),
        "{error}"
    );
    last.forward_pack(&parts[1], &batch, &whole, &hidden)
        .unwrap();
    let mut wrong_grads = parts[0].zeros_like();
    let error = last
        .backward_pack(&parts[1], &mut wrong_grads, &batch, &whole, &[])
        .unwrap_err();
    assert!(matches!(error, CpuError::StageMismatch { .. }), "{error}");
    assert!(
        params.split(&stages[..1]).is_err(),
        "a partial list of stages is not a partition"
    );
}

#[test]
fn invalid_batches_and_models_are_refused() {
    let config = small_config(1, true);
    let error = TokenBatch::new(&config, vec![vec![1, 2], vec![]]).unwrap_err();
    assert!(
        matches!(error, CpuError::EmptySample { sample: 1 }),
        "{error}"
    );
    let error = TokenBatch::new(&config, vec![vec![1, 32]]).unwrap_err();
    assert_eq!(
        error.to_string(),
        "sample 0, position 1: token 32 is outside the vocabulary of 32"
    );

    let llama = slimpack_ir::spec::ModelSpec::preset("llama-7b").unwrap();
    let error = ModelConfig::from_spec(&llama).unwrap_err();
    assert_eq!(
        error.to_string(),
        "model 'llama-7b': the CPU backend runs fp32 models only, got bf16"
    );
    let mut odd = slimpack_ir::spec::ModelSpec::preset("tiny").unwrap();
    odd.head_dim = 31;
    assert!(matches!(
        ModelConfig::from_spec(&odd),
        Err(CpuError::UnsupportedModel { .. })
    ));
    assert!(
        LayerRange::split_even(&config, 2).is_err(),
        "one layer cannot make two stages"
    );
}
