//! The reference step against central finite differences, on a micro model.
//!
//! fp32 finite differences are noisy: the loss (~3.5) carries ~4e-7 of rounding, and a larger
//! step trades that for truncation error. A step of 3e-3 balances the two (measured worst error
//! ~1.2e-3; 1e-2 gives ~1.3e-2 by truncation, 1e-3 ~1e-3 by rounding). The check looks at the
//! two largest-gradient entries of every tensor plus two random ones and allows an error of 0.5%
//! of the tensor's largest gradient; a missing or wrong term (sign, factor, transposition) is off
//! by far more.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::harness::{batch_of, params_with_random_gains, small_config};
use crate::cpu::{reference_step, Params, TokenBatch};

const STEP: f32 = 3e-3;
const TOLERANCE: f32 = 5e-3;

fn loss_at(params: &Params, batch: &TokenBatch) -> f64 {
    reference_step(params, batch).expect("whole model").0
}

/// Largest `|fd − analytic| / max|analytic|` over the checked entries of all tensors.
fn worst_finite_difference_error(tied: bool) -> (f32, String) {
    let config = small_config(2, tied);
    let mut params = params_with_random_gains(&config, 7);
    let batch = batch_of(&config, &[9, 6, 1], 3);
    let (_, grads) = reference_step(&params, &batch).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut worst = (0.0f32, String::new());
    let grad_tensors: Vec<(String, Vec<f32>)> = grads
        .tensors()
        .into_iter()
        .map(|t| (t.name, t.data.to_vec()))
        .collect();
    for (tensor_index, (name, grad)) in grad_tensors.iter().enumerate() {
        let scale = grad.iter().fold(0.0f32, |m, g| m.max(g.abs()));
        assert!(scale > 0.0, "gradient of {name} is identically zero");
        let mut entries: Vec<usize> = (0..grad.len()).collect();
        entries.sort_by(|&a, &b| grad[b].abs().total_cmp(&grad[a].abs()));
        entries.truncate(2);
        entries.extend((0..2).map(|_| rng.random_range(0..grad.len())));
        for entry in entries {
            let original = params.tensors()[tensor_index].data[entry];
            // The f32 values actually evaluated, so the step's own rounding does not count.
            let (up, down) = (original + STEP, original - STEP);
            params.tensors_mut()[tensor_index].data[entry] = up;
            let plus = loss_at(&params, &batch);
            params.tensors_mut()[tensor_index].data[entry] = down;
            let minus = loss_at(&params, &batch);
            params.tensors_mut()[tensor_index].data[entry] = original;
            let numeric = ((plus - minus) / f64::from(up - down)) as f32;
            let error = (numeric - grad[entry]).abs() / scale;
            if error > worst.0 {
                worst = (
                    error,
                    format!("{name}[{entry}]: fd {numeric} vs analytic {}", grad[entry]),
                );
            }
        }
    }
    worst
}

#[test]
fn reference_gradients_match_finite_differences_tied() {
    let (error, at) = worst_finite_difference_error(true);
    assert!(error <= TOLERANCE, "worst error {error} at {at}");
}

#[test]
fn reference_gradients_match_finite_differences_untied() {
    let (error, at) = worst_finite_difference_error(false);
    assert!(error <= TOLERANCE, "worst error {error} at {at}");
}
