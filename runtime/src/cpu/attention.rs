//! Causal grouped-query attention of one slice's queries against its sample's keys so far.
//!
//! A slice at offset `o` with `l` tokens has queries at positions `o..o+l` and sees the keys and
//! values of positions `0..o+l` (those of earlier slices come from the K/V cache): query `t`
//! attends to keys `0..=o+t`. Query head `h` reads K/V head `h / (heads / kv_heads)`; scores are
//! scaled by `1/sqrt(head_dim)`.
//!
//! The forward keeps only the output and each query's log-sum-exp of scores; the backward
//! recomputes the probabilities from them (FlashAttention's scheme, so a slice saves `O(l)` per
//! head rather than `O(l · (o+l))`). The backward *adds* into the key/value gradients of all
//! positions `0..o+l`: for earlier slices these are contributions their own backward consumes.

use super::config::ModelConfig;
use super::ops::gemm::{gemm, Mat, MatMut};

/// Inputs of one slice's attention: rows are tokens, `q: [l, q_width]`, `keys`/`values`:
/// `[offset + l, kv_width]`.
pub(crate) struct SliceAttention<'a> {
    pub offset: usize,
    pub q: &'a [f32],
    pub keys: &'a [f32],
    pub values: &'a [f32],
}

/// Attention output `[l, q_width]` into `out`, per-query-head log-sum-exp `[l, heads]` into `lse`.
pub(crate) fn attention_forward(
    config: &ModelConfig,
    input: &SliceAttention<'_>,
    out: &mut [f32],
    lse: &mut [f32],
) {
    let (d, qw, kvw) = (config.head_dim, config.q_width(), config.kv_width());
    let (l, n) = input.shape(config);
    let mut probs = vec![0.0; l * n];
    for head in 0..config.heads {
        let kv_col = head / config.group_size() * d;
        scores(config, input, head, &mut probs);
        for (t, row) in probs.chunks_exact_mut(n).enumerate() {
            let visible = input.offset + t + 1;
            let max = row[..visible]
                .iter()
                .copied()
                .fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0;
            for p in row[..visible].iter_mut() {
                *p = (*p - max).exp();
                sum += *p;
            }
            row[..visible].iter_mut().for_each(|p| *p /= sum);
            row[visible..].fill(0.0);
            lse[t * config.heads + head] = max + sum.ln();
        }
        gemm(
            1.0,
            Mat::new(&probs, l, n),
            Mat::columns(input.values, kvw, kv_col, d),
            0.0,
            MatMut::columns(out, qw, head * d, d),
        );
    }
}

/// Backward of [`attention_forward`]: writes `dq` (`[l, q_width]`) and adds into `d_keys` and
/// `d_values` (`[offset + l, kv_width]`), given the forward's `out`, `lse` and `d_out`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_backward(
    config: &ModelConfig,
    input: &SliceAttention<'_>,
    out: &[f32],
    lse: &[f32],
    d_out: &[f32],
    dq: &mut [f32],
    d_keys: &mut [f32],
    d_values: &mut [f32],
) {
    let (d, qw, kvw) = (config.head_dim, config.q_width(), config.kv_width());
    let (l, n) = input.shape(config);
    let scale = 1.0 / (d as f32).sqrt();
    let mut probs = vec![0.0; l * n];
    let mut d_scores = vec![0.0; l * n];
    for head in 0..config.heads {
        let (q_col, kv_col) = (head * d, head / config.group_size() * d);
        scores(config, input, head, &mut probs);
        for (t, row) in probs.chunks_exact_mut(n).enumerate() {
            let visible = input.offset + t + 1;
            let row_lse = lse[t * config.heads + head];
            row[..visible]
                .iter_mut()
                .for_each(|p| *p = (*p - row_lse).exp());
            row[visible..].fill(0.0);
        }
        let d_out_head = Mat::columns(d_out, qw, q_col, d);
        // dV += Pᵀ · dO
        gemm(
            1.0,
            Mat::new(&probs, l, n).t(),
            d_out_head,
            1.0,
            MatMut::columns(d_values, kvw, kv_col, d),
        );
        // dP = dO · Vᵀ, then dS = P ∘ (dP − rowsum(dO ∘ O)).
        gemm(
            1.0,
            d_out_head,
            Mat::columns(input.values, kvw, kv_col, d).t(),
            0.0,
            MatMut::new(&mut d_scores, l, n),
        );
        for t in 0..l {
            let row = t * qw + q_col;
            let delta: f32 = (0..d).map(|c| d_out[row + c] * out[row + c]).sum();
            for j in 0..n {
                d_scores[t * n + j] = probs[t * n + j] * (d_scores[t * n + j] - delta);
            }
        }
        // dQ = scale · dS · K;  dK += scale · dSᵀ · Q.
        gemm(
            scale,
            Mat::new(&d_scores, l, n),
            Mat::columns(input.keys, kvw, kv_col, d),
            0.0,
            MatMut::columns(dq, qw, q_col, d),
        );
        gemm(
            scale,
            Mat::new(&d_scores, l, n).t(),
            Mat::columns(input.q, qw, q_col, d),
            1.0,
            MatMut::columns(d_keys, kvw, kv_col, d),
        );
    }
}

impl SliceAttention<'_> {
    /// `(queries, keys)` of the slice, checking that the keys end where the queries do.
    fn shape(&self, config: &ModelConfig) -> (usize, usize) {
        let l = self.q.len() / config.q_width();
        let n = self.keys.len() / config.kv_width();
        assert_eq!(
            n,
            self.offset + l,
            "bug: keys must cover the slice's sample prefix"
        );
        (l, n)
    }
}

/// Scaled scores `q_head · k_headᵀ / sqrt(head_dim)` of one query head, `[l, offset + l]`.
fn scores(config: &ModelConfig, input: &SliceAttention<'_>, head: usize, out: &mut [f32]) {
    let (d, qw, kvw) = (config.head_dim, config.q_width(), config.kv_width());
    let (l, n) = input.shape(config);
    gemm(
        1.0 / (d as f32).sqrt(),
        Mat::columns(input.q, qw, head * d, d),
        Mat::columns(input.keys, kvw, head / config.group_size() * d, d).t(),
        0.0,
        MatMut::new(out, l, n),
    );
}
