//! How far apart two tensor sets are: the metric the differential tests (and an executor's
//! reference check) use.
//!
//! For each tensor `T` with expected values `e` and actual values `a`, the error is
//! `max_i |a_i − e_i| / max(max_i |e_i|, SCALE_FLOOR · S)`, where `S` is the largest `|e|` over all
//! tensors. The result is the worst tensor. Relative to the tensor's own scale, small gradients
//! are held to the same standard as large ones; the floor keeps the metric meaningful for a
//! tensor whose gradient is nearly zero by cancellation (the key projection's, for a batch of
//! very short samples: a softmax over one key has no gradient), where fp32 noise of the summed
//! terms — sized like the other gradients — would otherwise be divided by almost nothing.
//! In other words: `|a − e| ≤ tol · max_T|e|` per tensor, or `≤ tol · SCALE_FLOOR · S` absolutely.

use super::error::Result;
use super::params::Params;

/// Fraction of the largest gradient below which a tensor's scale is not trusted as a yardstick.
pub const SCALE_FLOOR: f32 = 0.1;

/// The worst per-tensor relative error between two tensor sets.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorDiff {
    /// The worst tensor's `max |a − e| / max(max |e|, SCALE_FLOOR · scale)`.
    pub max_rel_error: f32,
    /// Name of the worst tensor.
    pub worst_tensor: String,
    /// Largest absolute difference over all tensors.
    pub max_abs_error: f32,
    /// Largest absolute expected value over all tensors.
    pub scale: f32,
}

/// Compares `actual` against `expected` (same model and stage). NaNs count as infinite errors.
pub fn tensor_diff(actual: &Params, expected: &Params) -> Result<TensorDiff> {
    expected.check_same_layout(actual)?;
    let max_abs = |data: &[f32]| data.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let scale = expected
        .tensors()
        .iter()
        .map(|t| max_abs(t.data))
        .fold(0.0, f32::max);
    let mut diff = TensorDiff {
        max_rel_error: 0.0,
        worst_tensor: String::new(),
        max_abs_error: 0.0,
        scale,
    };
    for (a, e) in actual.tensors().into_iter().zip(expected.tensors()) {
        let yardstick = max_abs(e.data).max(SCALE_FLOOR * scale);
        let abs = a
            .data
            .iter()
            .zip(e.data)
            .fold(0.0f32, |m, (x, y)| m.max(distance(*x, *y)));
        let rel = if yardstick > 0.0 {
            abs / yardstick
        } else {
            abs
        };
        if rel >= diff.max_rel_error {
            diff.max_rel_error = rel;
            diff.worst_tensor = e.name;
        }
        diff.max_abs_error = diff.max_abs_error.max(abs);
    }
    Ok(diff)
}

/// `|x − y|`, infinite when either is NaN (`f32::max` would silently skip a NaN).
fn distance(x: f32, y: f32) -> f32 {
    let d = (x - y).abs();
    if d.is_nan() {
        f32::INFINITY
    } else {
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::config::ModelConfig;
    use crate::cpu::stage::LayerRange;

    #[test]
    fn errors_are_relative_to_the_tensor_scale_with_a_floor_and_nan_is_infinite() {
        let config = ModelConfig {
            layers: 1,
            hidden: 2,
            heads: 1,
            kv_heads: 1,
            head_dim: 2,
            ffn: 2,
            vocab: 2,
            tied_embeddings: true,
            norm_eps: 1e-5,
            rope_theta: 1e4,
        };
        let mut expected = Params::zeros(&config, LayerRange::whole(&config));
        expected.embedding.as_mut().unwrap()[0] = 100.0;
        expected.layers[0].wq[0] = 20.0;
        expected.layers[0].wk[0] = 1e-3;
        let mut actual = expected.clone();
        actual.layers[0].wq[1] = 0.2;
        let diff = tensor_diff(&actual, &expected).unwrap();
        assert_eq!(
            (diff.max_rel_error, diff.worst_tensor.as_str()),
            (0.01, "layers.0.wq")
        );
        // wk's own scale (1e-3) is below the floor (0.1 · 100): judged against 10.
        actual.layers[0].wk[0] = 1.0;
        let diff = tensor_diff(&actual, &expected).unwrap();
        assert!((diff.max_rel_error - 0.0999).abs() < 1e-6, "{diff:?}");
        actual.layers[0].w_up[0] = f32::NAN;
        assert_eq!(
            tensor_diff(&actual, &expected).unwrap().max_rel_error,
            f32::INFINITY
        );
    }
}
