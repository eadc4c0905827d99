//! [`check_reference`]: an execution against the plain, unsliced, single-worker reference step.
//!
//! Loss: relative difference. Gradients: [`tensor_diff`] (per tensor, the largest absolute error
//! over the tensor's largest reference gradient, with a floor; the worst tensor). Weights after
//! AdamW: the largest absolute difference from the reference's AdamW step, in units of the
//! learning rate (AdamW moves a weight by about `lr` per step whatever its gradient's size, so a
//! gradient that is zero up to rounding can move it by up to `lr` either way: this figure is
//! reported, not held to the gradient tolerance).

use serde::Serialize;

use super::result::Execution;
use crate::cpu::adamw::{AdamW, AdamWConfig};
use crate::cpu::batch::TokenBatch;
use crate::cpu::compare::tensor_diff;
use crate::cpu::error::Result;
use crate::cpu::params::Params;
use crate::cpu::reference::reference_step;

/// How far an execution is from the reference.
#[derive(Debug, Clone, Serialize)]
pub struct ReferenceCheck {
    pub ref_loss: f64,
    /// `|loss − ref_loss| / |ref_loss|`.
    pub loss_rel_err: f64,
    /// The worst tensor's gradient error (see [`tensor_diff`]).
    pub max_grad_rel_err: f32,
    /// The tensor it is in.
    pub worst_grad_tensor: String,
    /// Largest absolute weight difference after AdamW, over the learning rate.
    pub max_param_diff_lr: f32,
}

/// Runs the reference step from `initial` (whole model) on `batch` and compares.
pub fn check_reference(
    execution: &Execution,
    initial: &Params,
    batch: &TokenBatch,
    adamw: AdamWConfig,
) -> Result<ReferenceCheck> {
    let (ref_loss, ref_grads) = reference_step(initial, batch)?;
    let diff = tensor_diff(&execution.grads, &ref_grads)?;
    let mut ref_params = initial.clone();
    AdamW::new(adamw, &ref_params).step(&mut ref_params, &ref_grads)?;
    let params_diff = tensor_diff(&execution.params, &ref_params)?;
    let loss_rel_err = (execution.loss - ref_loss).abs() / ref_loss.abs().max(f64::MIN_POSITIVE);
    Ok(ReferenceCheck {
        ref_loss,
        loss_rel_err,
        max_grad_rel_err: diff.max_rel_error,
        worst_grad_tensor: diff.worst_tensor,
        max_param_diff_lr: params_diff.max_abs_error / adamw.lr,
    })
}
