//! The model's head on the last stage: final RMSNorm, output projection and cross-entropy.
//!
//! The loss of a block of rows is `loss_scale · Σ CE(row)` over the rows that have a target;
//! with `loss_scale = 1 / (predicted tokens of the whole batch)` the per-pack losses of a step add
//! up to the batch's mean loss. The head keeps the final norm's input and output and the fp32
//! softmax of the logits (`[rows, vocab]`) for its backward — what the machine model's memory
//! counts for the last stage — so the backward runs the output projection's two gradient GEMMs
//! and no recomputation.

use super::config::ModelConfig;
use super::ops::cross_entropy::{cross_entropy_backward, cross_entropy_softmax};
use super::ops::gemm::{gemm, Mat, MatMut};
use super::ops::rmsnorm::{rmsnorm_backward, rmsnorm_forward};

/// What the head saves for its backward.
pub(crate) struct SavedHead {
    pub x: Vec<f32>,
    pub inv_rms: Vec<f32>,
    pub normed: Vec<f32>,
    /// Softmax of the logits, `[rows, vocab]`.
    pub probs: Vec<f32>,
}

/// Final norm, logits and the scaled loss of the rows `x` (`targets[r]` is row `r`'s target).
pub(crate) fn head_forward(
    config: &ModelConfig,
    final_norm: &[f32],
    output: &[f32],
    x: Vec<f32>,
    targets: &[Option<u32>],
    loss_scale: f32,
) -> (f64, SavedHead) {
    let (normed, inv_rms) = rmsnorm_forward(&x, final_norm, config.norm_eps);
    let mut probs = logits(config, output, &normed);
    let loss = cross_entropy_softmax(&mut probs, config.vocab, targets) * f64::from(loss_scale);
    let saved = SavedHead {
        x,
        inv_rms,
        normed,
        probs,
    };
    (loss, saved)
}

/// Backward of [`head_forward`]: adds into the gradients of the final norm and the output
/// projection, returns the gradient of the head's input rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn head_backward(
    config: &ModelConfig,
    final_norm: &[f32],
    output: &[f32],
    saved: SavedHead,
    targets: &[Option<u32>],
    loss_scale: f32,
    d_final_norm: &mut [f32],
    d_output: &mut [f32],
) -> Vec<f32> {
    let (h, v) = (config.hidden, config.vocab);
    let rows = saved.normed.len() / h;
    let mut d_logits = saved.probs;
    cross_entropy_backward(&mut d_logits, v, targets, loss_scale);
    gemm(
        1.0,
        Mat::new(&d_logits, rows, v).t(),
        Mat::new(&saved.normed, rows, h),
        1.0,
        MatMut::new(d_output, v, h),
    );
    let mut d_normed = vec![0.0; rows * h];
    gemm(
        1.0,
        Mat::new(&d_logits, rows, v),
        Mat::new(output, v, h),
        0.0,
        MatMut::new(&mut d_normed, rows, h),
    );
    rmsnorm_backward(
        &saved.x,
        final_norm,
        &saved.inv_rms,
        &d_normed,
        d_final_norm,
    )
}

/// `normed · outputᵀ`, `[rows, vocab]`.
fn logits(config: &ModelConfig, output: &[f32], normed: &[f32]) -> Vec<f32> {
    let (h, v) = (config.hidden, config.vocab);
    let rows = normed.len() / h;
    let mut logits = vec![0.0; rows * v];
    gemm(
        1.0,
        Mat::new(normed, rows, h),
        Mat::new(output, v, h).t(),
        0.0,
        MatMut::new(&mut logits, rows, v),
    );
    logits
}
