//! The per-token parts of a transformer layer, around the attention that mixes tokens.
//!
//! A layer is `mid = x + Attn(RoPE(norm(x)·Wq), RoPE(norm(x)·Wk), norm(x)·Wv)·Wo` followed by
//! `y = mid + SwiGLU(norm(mid))`. Everything but the attention itself works row by row, so it
//! runs on any block of token rows at once: a whole pack in the sliced path, a whole sample in
//! the reference. The attention in between is the caller's ([`super::attention`] for slices,
//! [`super::reference`] for whole samples).

use super::config::ModelConfig;
use super::ops::linear::{linear, linear_input_grad_add};
use super::ops::rmsnorm::{rmsnorm_backward, rmsnorm_forward};
use super::ops::rope::{rope_backward, rope_forward};
use super::ops::swiglu::{swiglu_backward, swiglu_forward};
use super::params::LayerParams;
use super::weight_grad::{GemmOperands, LinearWeight, WeightGrads};

/// Output of the pre-attention half: the normed input and the attention's Q, K, V (after RoPE).
pub(crate) struct PreAttention {
    pub inv_rms: Vec<f32>,
    pub normed: Vec<f32>,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// What the post-attention half saves for its backward.
pub(crate) struct PostAttention {
    /// The residual stream after attention.
    pub mid: Vec<f32>,
    pub inv_rms: Vec<f32>,
    pub normed: Vec<f32>,
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    /// SwiGLU's output, the down projection's input.
    pub activation: Vec<f32>,
}

/// RMSNorm, Q/K/V projections and RoPE of the rows `x`, at sample positions `positions`.
pub(crate) fn pre_attention_forward(
    config: &ModelConfig,
    layer: &LayerParams,
    x: &[f32],
    positions: &[usize],
) -> PreAttention {
    let (h, qw, kvw) = (config.hidden, config.q_width(), config.kv_width());
    let (normed, inv_rms) = rmsnorm_forward(x, &layer.attn_norm, config.norm_eps);
    let mut q = linear(&normed, &layer.wq, h, qw);
    let mut k = linear(&normed, &layer.wk, h, kvw);
    let v = linear(&normed, &layer.wv, h, kvw);
    rope_forward(&mut q, qw, config.head_dim, positions, config.rope_theta);
    rope_forward(&mut k, kvw, config.head_dim, positions, config.rope_theta);
    PreAttention {
        inv_rms,
        normed,
        q,
        k,
        v,
    }
}

/// Backward of [`pre_attention_forward`] from the gradients of Q, K, V (after RoPE): adds the
/// gradients of local layer `local` into `grads` (its projections' through `weight_grads`),
/// returns the gradient of `x` through this branch only.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pre_attention_backward(
    config: &ModelConfig,
    layer: &LayerParams,
    grads: &mut LayerParams,
    (local, weight_grads): (usize, &mut WeightGrads),
    x: &[f32],
    saved_inv_rms: &[f32],
    saved_normed: &[f32],
    positions: &[usize],
    mut dq: Vec<f32>,
    mut dk: Vec<f32>,
    dv: Vec<f32>,
) -> Vec<f32> {
    let (h, qw, kvw) = (config.hidden, config.q_width(), config.kv_width());
    rope_backward(&mut dq, qw, config.head_dim, positions, config.rope_theta);
    rope_backward(&mut dk, kvw, config.head_dim, positions, config.rope_theta);
    let gemm = |weight, d_out, out_dim| GemmOperands {
        layer: local,
        weight,
        input: saved_normed,
        d_out,
        in_dim: h,
        out_dim,
    };
    weight_grads.add(grads, gemm(LinearWeight::Query, &dq, qw));
    weight_grads.add(grads, gemm(LinearWeight::Key, &dk, kvw));
    weight_grads.add(grads, gemm(LinearWeight::Value, &dv, kvw));
    let mut d_normed = vec![0.0; x.len()];
    linear_input_grad_add(&dq, &layer.wq, h, qw, &mut d_normed);
    linear_input_grad_add(&dk, &layer.wk, h, kvw, &mut d_normed);
    linear_input_grad_add(&dv, &layer.wv, h, kvw, &mut d_normed);
    rmsnorm_backward(
        x,
        &layer.attn_norm,
        saved_inv_rms,
        &d_normed,
        &mut grads.attn_norm,
    )
}

/// Output projection and residual, then the MLP block: returns the layer output and what the
/// backward needs. `x` is the layer input, `attn` the attention output `[rows, q_width]`.
pub(crate) fn post_attention_forward(
    config: &ModelConfig,
    layer: &LayerParams,
    x: &[f32],
    attn: &[f32],
) -> (Vec<f32>, PostAttention) {
    let (h, f) = (config.hidden, config.ffn);
    let mut mid = linear(attn, &layer.wo, config.q_width(), h);
    mid.iter_mut().zip(x).for_each(|(m, &r)| *m += r);
    let (normed, inv_rms) = rmsnorm_forward(&mid, &layer.mlp_norm, config.norm_eps);
    let gate = linear(&normed, &layer.w_gate, h, f);
    let up = linear(&normed, &layer.w_up, h, f);
    let activation = swiglu_forward(&gate, &up);
    let mut y = linear(&activation, &layer.w_down, f, h);
    y.iter_mut().zip(&mid).for_each(|(o, &r)| *o += r);
    let saved = PostAttention {
        mid,
        inv_rms,
        normed,
        gate,
        up,
        activation,
    };
    (y, saved)
}

/// Backward of [`post_attention_forward`] from the output gradient `dy`: adds the gradients of
/// local layer `local` into `grads` (its projections' through `weight_grads`) and returns
/// `(d_attn, d_x)`, where `d_x` is the gradient reaching the layer input through the residual
/// (the pre-attention branch adds its own).
pub(crate) fn post_attention_backward(
    config: &ModelConfig,
    layer: &LayerParams,
    grads: &mut LayerParams,
    (local, weight_grads): (usize, &mut WeightGrads),
    attn: &[f32],
    saved: &PostAttention,
    dy: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let (h, f, qw) = (config.hidden, config.ffn, config.q_width());
    let gemm = |weight, input, d_out, in_dim, out_dim| GemmOperands {
        layer: local,
        weight,
        input,
        d_out,
        in_dim,
        out_dim,
    };
    weight_grads.add(grads, gemm(LinearWeight::Down, &saved.activation, dy, f, h));
    let mut d_activation = vec![0.0; saved.activation.len()];
    linear_input_grad_add(dy, &layer.w_down, f, h, &mut d_activation);
    let (d_gate, d_up) = swiglu_backward(&saved.gate, &saved.up, &d_activation);
    weight_grads.add(
        grads,
        gemm(LinearWeight::Gate, &saved.normed, &d_gate, h, f),
    );
    weight_grads.add(grads, gemm(LinearWeight::Up, &saved.normed, &d_up, h, f));
    let mut d_normed = vec![0.0; dy.len()];
    linear_input_grad_add(&d_gate, &layer.w_gate, h, f, &mut d_normed);
    linear_input_grad_add(&d_up, &layer.w_up, h, f, &mut d_normed);
    let mut d_mid = rmsnorm_backward(
        &saved.mid,
        &layer.mlp_norm,
        &saved.inv_rms,
        &d_normed,
        &mut grads.mlp_norm,
    );
    d_mid.iter_mut().zip(dy).for_each(|(d, &g)| *d += g);
    weight_grads.add(grads, gemm(LinearWeight::Output, attn, &d_mid, qw, h));
    let mut d_attn = vec![0.0; attn.len()];
    linear_input_grad_add(&d_mid, &layer.wo, qw, h, &mut d_attn);
    (d_attn, d_mid)
}
