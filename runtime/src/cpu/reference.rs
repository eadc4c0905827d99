//! The reference training step: plain, unsliced, single-worker forward and backward.
//!
//! Each sample runs whole through the whole model: one block of rows, full causal attention over
//! the sample's `[n, n]` probability matrix (no K/V cache, no slices, no packs, no stages).
//! It shares the per-token layer code with the sliced path but not the attention, which is
//! written here independently in its textbook form. Sliced and packed execution must reproduce
//! its loss and gradients; the reference itself is checked against finite differences.

use super::batch::{SampleId, TokenBatch};
use super::config::ModelConfig;
use super::error::{CpuError, Result};
use super::head::{head_backward, head_forward};
use super::layer::{
    post_attention_backward, post_attention_forward, pre_attention_backward, pre_attention_forward,
    PostAttention, PreAttention,
};
use super::ops::embedding::{embed, embed_backward};
use super::ops::gemm::{gemm, Mat, MatMut};
use super::params::{Grads, LayerParams, Params};
use super::stage::LayerRange;
use super::weight_grad::WeightGrads;

/// Loss (mean over the batch's predicted tokens) and gradients of one training step over
/// `batch`, computed sample by sample without slicing. `params` must be the whole model.
pub fn reference_step(params: &Params, batch: &TokenBatch) -> Result<(f64, Grads)> {
    let config = *params.config();
    if params.stage() != LayerRange::whole(&config) {
        return Err(CpuError::StageMismatch {
            expected: LayerRange::whole(&config),
            got: params.stage(),
        });
    }
    let mut grads = params.zeros_like();
    let mut loss = 0.0;
    for sample in batch.sample_ids() {
        loss += sample_step(&config, params, &mut grads, batch, sample);
    }
    Ok((loss, grads))
}

/// What one layer keeps for the backward of a whole sample.
struct LayerRecord {
    x: Vec<f32>,
    pre: PreAttention,
    attn: Vec<f32>,
    post: PostAttention,
}

/// Forward and backward of one whole sample; returns its share of the batch loss.
fn sample_step(
    config: &ModelConfig,
    params: &Params,
    grads: &mut Grads,
    batch: &TokenBatch,
    sample: SampleId,
) -> f64 {
    let tokens = batch.tokens(sample);
    let positions: Vec<usize> = (0..tokens.len()).collect();
    let targets: Vec<Option<u32>> = batch.targets(&batch.whole_slice(sample)).collect();
    let embedding = params
        .embedding
        .as_deref()
        .expect("bug: whole model without embedding");
    let mut x = embed(
        embedding,
        config.hidden,
        tokens.len(),
        tokens.iter().copied(),
    );
    let mut records = Vec::with_capacity(params.layers.len());
    for layer in &params.layers {
        let pre = pre_attention_forward(config, layer, &x, &positions);
        let attn = causal_attention(config, &pre);
        let (y, post) = post_attention_forward(config, layer, &x, &attn);
        records.push(LayerRecord { x, pre, attn, post });
        x = y;
    }
    let final_norm = params
        .final_norm
        .as_deref()
        .expect("bug: whole model without final norm");
    let output = params.output_weight();
    let scale = batch.loss_scale();
    let (loss, head) = head_forward(config, final_norm, output, x, &targets, scale);

    let (d_final_norm, d_output) = grads.head_mut();
    let mut dy = head_backward(
        config,
        final_norm,
        output,
        head,
        &targets,
        scale,
        d_final_norm,
        d_output,
    );
    for (index, record) in records.into_iter().enumerate().rev() {
        let (layer, layer_grads) = (&params.layers[index], &mut grads.layers[index]);
        dy = layer_backward(config, layer, layer_grads, record, &positions, &dy);
    }
    let d_table = grads
        .embedding
        .as_mut()
        .expect("bug: whole model without embedding");
    embed_backward(d_table, config.hidden, tokens.iter().copied(), &dy);
    loss
}

/// Backward of one layer over a whole sample; returns the gradient of the layer input.
fn layer_backward(
    config: &ModelConfig,
    layer: &LayerParams,
    grads: &mut LayerParams,
    record: LayerRecord,
    positions: &[usize],
    dy: &[f32],
) -> Vec<f32> {
    let now = &mut WeightGrads::Now;
    let (d_attn, mut dx) = post_attention_backward(
        config,
        layer,
        grads,
        (0, now),
        &record.attn,
        &record.post,
        dy,
    );
    let (dq, dk, dv) = causal_attention_backward(config, &record.pre, &d_attn);
    let pre = &record.pre;
    let dx_pre = pre_attention_backward(
        config,
        layer,
        grads,
        (0, now),
        &record.x,
        &pre.inv_rms,
        &pre.normed,
        positions,
        dq,
        dk,
        dv,
    );
    dx.iter_mut().zip(&dx_pre).for_each(|(d, &p)| *d += p);
    dx
}

/// Causal attention over a whole sample of `n` tokens: the output `[n, q_width]`.
fn causal_attention(config: &ModelConfig, pre: &PreAttention) -> Vec<f32> {
    let (d, qw, kvw) = (config.head_dim, config.q_width(), config.kv_width());
    let n = pre.q.len() / qw;
    let mut out = vec![0.0; n * qw];
    for head in 0..config.heads {
        let probs = causal_probs(config, pre, head);
        gemm(
            1.0,
            Mat::new(&probs, n, n),
            Mat::columns(&pre.v, kvw, head / config.group_size() * d, d),
            0.0,
            MatMut::columns(&mut out, qw, head * d, d),
        );
    }
    out
}

/// Attention probabilities of one query head, `[n, n]`: row `i` is query `i`'s softmax over
/// keys `0..=i`, zero beyond. Recomputed by the backward rather than kept, so that the reference
/// needs `O(n²)` memory for one head at a time, not for every head of every layer.
fn causal_probs(config: &ModelConfig, pre: &PreAttention, head: usize) -> Vec<f32> {
    let (d, qw, kvw) = (config.head_dim, config.q_width(), config.kv_width());
    let n = pre.q.len() / qw;
    let mut probs = vec![0.0; n * n];
    gemm(
        1.0 / (d as f32).sqrt(),
        Mat::columns(&pre.q, qw, head * d, d),
        Mat::columns(&pre.k, kvw, head / config.group_size() * d, d).t(),
        0.0,
        MatMut::new(&mut probs, n, n),
    );
    for (i, row) in probs.chunks_exact_mut(n).enumerate() {
        softmax_in_place(&mut row[..=i]);
        row[i + 1..].fill(0.0);
    }
    probs
}

/// Backward of [`causal_attention`]: returns `(dq, dk, dv)` through the textbook softmax Jacobian
/// `dS = P ∘ (dP − rowsum(P ∘ dP))`.
fn causal_attention_backward(
    config: &ModelConfig,
    pre: &PreAttention,
    d_out: &[f32],
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (d, qw, kvw) = (config.head_dim, config.q_width(), config.kv_width());
    let n = pre.q.len() / qw;
    let scale = 1.0 / (d as f32).sqrt();
    let mut dq = vec![0.0; n * qw];
    let mut dk = vec![0.0; n * kvw];
    let mut dv = vec![0.0; n * kvw];
    let mut d_scores = vec![0.0; n * n];
    for head in 0..config.heads {
        let probs = causal_probs(config, pre, head);
        let p = &probs[..];
        let (q_col, kv_col) = (head * d, head / config.group_size() * d);
        let d_out_head = Mat::columns(d_out, qw, q_col, d);
        gemm(
            1.0,
            Mat::new(p, n, n).t(),
            d_out_head,
            1.0,
            MatMut::columns(&mut dv, kvw, kv_col, d),
        );
        gemm(
            1.0,
            d_out_head,
            Mat::columns(&pre.v, kvw, kv_col, d).t(),
            0.0,
            MatMut::new(&mut d_scores, n, n),
        );
        for (p_row, ds_row) in p.chunks_exact(n).zip(d_scores.chunks_exact_mut(n)) {
            let dot: f32 = p_row.iter().zip(ds_row.iter()).map(|(a, b)| a * b).sum();
            for (ds, &pr) in ds_row.iter_mut().zip(p_row) {
                *ds = pr * (*ds - dot);
            }
        }
        let ds = Mat::new(&d_scores, n, n);
        gemm(
            scale,
            ds,
            Mat::columns(&pre.k, kvw, kv_col, d),
            0.0,
            MatMut::columns(&mut dq, qw, q_col, d),
        );
        gemm(
            scale,
            ds.t(),
            Mat::columns(&pre.q, qw, q_col, d),
            1.0,
            MatMut::columns(&mut dk, kvw, kv_col, d),
        );
    }
    (dq, dk, dv)
}

fn softmax_in_place(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for value in row.iter_mut() {
        *value = (*value - max).exp();
        sum += *value;
    }
    row.iter_mut().for_each(|value| *value /= sum);
}
