//! Causal grouped-query attention of one slice's queries against its sample's keys so far.
//!
//! A query at position `p` of its sample attends to the keys of positions `0..=p`. A slice's
//! queries are given with their positions: `offset..offset + l` for a whole slice, or any
//! ascending positions for one context-parallel worker's share of a slice (two contiguous runs
//! under the load-balanced split of [`super::cp`]). The keys and values cover positions
//! `0..=last query position` (those of earlier slices come from the K/V cache, or from the other
//! workers of a DP-Merge group). Query head `h` reads K/V head `h / (heads / kv_heads)`; scores are
//! scaled by `1/sqrt(head_dim)`.
//!
//! Queries run in blocks of [`QUERY_BLOCK`] rows, each against only the keys its last query can
//! see, so the transient score matrix is `QUERY_BLOCK × keys` (not `queries × keys`: a
//! 65,536-token slice would need 16 GiB per head) and the masked upper triangle is mostly
//! skipped. Rows are independent, so blocking does not change any value.
//!
//! The forward keeps only the output and each query's log-sum-exp of scores; the backward
//! recomputes the probabilities from them (FlashAttention's scheme, so a slice saves `O(l)` per
//! head rather than `O(l · keys)`). The backward *adds* into the key/value gradients of all
//! positions it sees: for earlier slices these are contributions their own backward consumes.

use super::config::ModelConfig;
use super::ops::exp::exp_shifted;
use super::ops::gemm::{gemm, Mat, MatMut};
use super::profile::{self, OpClass};

/// Query rows processed together.
pub(crate) const QUERY_BLOCK: usize = 64;

/// Inputs of one slice's attention: rows are tokens, `q: [l, q_width]` at sample positions
/// `positions` (ascending), `keys`/`values`: `[n, kv_width]` for positions `0..n`, at least up to
/// the last query (keys past it are not read).
pub struct SliceAttention<'a> {
    pub positions: &'a [usize],
    pub q: &'a [f32],
    pub keys: &'a [f32],
    pub values: &'a [f32],
}

/// Floats of the largest block's scores: score buffers are allocated once at that size (growing
/// them block by block would hold up to twice it, which the machine model does not count).
fn largest(blocks: &[Block]) -> usize {
    blocks
        .iter()
        .map(|b| b.rows.len() * b.keys)
        .max()
        .unwrap_or(0)
}

/// A block of query rows and the keys they see.
struct Block {
    rows: std::ops::Range<usize>,
    /// Keys visible to the block's last query (`0..keys`).
    keys: usize,
}

/// Attention output `[l, q_width]` into `out`, per-query-head log-sum-exp `[l, heads]` into `lse`.
pub fn attention_forward(
    config: &ModelConfig,
    input: &SliceAttention<'_>,
    out: &mut [f32],
    lse: &mut [f32],
) {
    let _timer = profile::scope(OpClass::AttentionForward);
    let (d, qw, kvw) = (config.head_dim, config.q_width(), config.kv_width());
    let blocks = input.blocks(config);
    let mut probs = Vec::with_capacity(largest(&blocks));
    for block in blocks {
        let (l, n) = (block.rows.len(), block.keys);
        probs.resize(l * n, 0.0);
        let out_rows = &mut out[block.rows.start * qw..block.rows.end * qw];
        for head in 0..config.heads {
            let kv_col = head / config.group_size() * d;
            input.scores(config, &block, head, &mut probs);
            for (t, row) in probs.chunks_exact_mut(n).enumerate() {
                let visible = input.positions[block.rows.start + t] + 1;
                let max = row[..visible]
                    .iter()
                    .copied()
                    .fold(f32::NEG_INFINITY, f32::max);
                exp_shifted(&mut row[..visible], max);
                let sum: f32 = row[..visible].iter().sum();
                row[..visible].iter_mut().for_each(|p| *p /= sum);
                row[visible..].fill(0.0);
                lse[(block.rows.start + t) * config.heads + head] = max + sum.ln();
            }
            gemm(
                1.0,
                Mat::new(&probs, l, n),
                Mat::columns(&input.values[..n * kvw], kvw, kv_col, d),
                0.0,
                MatMut::columns(out_rows, qw, head * d, d),
            );
        }
    }
}

/// Backward of [`attention_forward`]: writes `dq` (`[l, q_width]`) and adds into `d_keys` and
/// `d_values` (shaped like the keys; rows past the last query are not touched), given the
/// forward's `out`, `lse` and `d_out`.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    config: &ModelConfig,
    input: &SliceAttention<'_>,
    out: &[f32],
    lse: &[f32],
    d_out: &[f32],
    dq: &mut [f32],
    d_keys: &mut [f32],
    d_values: &mut [f32],
) {
    let _timer = profile::scope(OpClass::AttentionBackward);
    let (d, qw, kvw) = (config.head_dim, config.q_width(), config.kv_width());
    let scale = 1.0 / (d as f32).sqrt();
    let blocks = input.blocks(config);
    let most = largest(&blocks);
    let (mut probs, mut d_scores) = (Vec::with_capacity(most), Vec::with_capacity(most));
    for block in blocks {
        let (l, n) = (block.rows.len(), block.keys);
        probs.resize(l * n, 0.0);
        d_scores.resize(l * n, 0.0);
        let rows = block.rows.start * qw..block.rows.end * qw;
        let (out, d_out, q) = (
            &out[rows.clone()],
            &d_out[rows.clone()],
            &input.q[rows.clone()],
        );
        let dq = &mut dq[rows];
        let (keys, values) = (&input.keys[..n * kvw], &input.values[..n * kvw]);
        for head in 0..config.heads {
            let (q_col, kv_col) = (head * d, head / config.group_size() * d);
            input.scores(config, &block, head, &mut probs);
            for (t, row) in probs.chunks_exact_mut(n).enumerate() {
                let query = block.rows.start + t;
                let visible = input.positions[query] + 1;
                let row_lse = lse[query * config.heads + head];
                exp_shifted(&mut row[..visible], row_lse);
                row[visible..].fill(0.0);
            }
            let d_out_head = Mat::columns(d_out, qw, q_col, d);
            // dV += Pᵀ · dO
            gemm(
                1.0,
                Mat::new(&probs, l, n).t(),
                d_out_head,
                1.0,
                MatMut::columns(&mut d_values[..n * kvw], kvw, kv_col, d),
            );
            // dP = dO · Vᵀ, then dS = P ∘ (dP − rowsum(dO ∘ O)).
            gemm(
                1.0,
                d_out_head,
                Mat::columns(values, kvw, kv_col, d).t(),
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
                Mat::columns(keys, kvw, kv_col, d),
                0.0,
                MatMut::columns(dq, qw, q_col, d),
            );
            gemm(
                scale,
                Mat::new(&d_scores, l, n).t(),
                Mat::columns(q, qw, q_col, d),
                1.0,
                MatMut::columns(&mut d_keys[..n * kvw], kvw, kv_col, d),
            );
        }
    }
}

impl SliceAttention<'_> {
    /// The query blocks, checking that the keys end where the last query's prefix does.
    fn blocks(&self, config: &ModelConfig) -> Vec<Block> {
        let l = self.q.len() / config.q_width();
        let n = self.keys.len() / config.kv_width();
        if l == 0 {
            // A context-parallel worker may hold no token of a short slice.
            return Vec::new();
        }
        assert!(
            self.positions.len() == l && self.positions.windows(2).all(|w| w[0] < w[1]),
            "bug: one ascending position per query"
        );
        assert!(
            self.positions[l - 1] < n,
            "bug: keys must cover the queries' sample prefix"
        );
        (0..l)
            .step_by(QUERY_BLOCK)
            .map(|start| {
                let end = (start + QUERY_BLOCK).min(l);
                Block {
                    rows: start..end,
                    keys: self.positions[end - 1] + 1,
                }
            })
            .collect()
    }

    /// Scaled scores `q_head · k_headᵀ / sqrt(head_dim)` of one query head for one block,
    /// `[rows, keys]`.
    fn scores(&self, config: &ModelConfig, block: &Block, head: usize, out: &mut [f32]) {
        let (d, qw, kvw) = (config.head_dim, config.q_width(), config.kv_width());
        let q = &self.q[block.rows.start * qw..block.rows.end * qw];
        gemm(
            1.0 / (d as f32).sqrt(),
            Mat::columns(q, qw, head * d, d),
            Mat::columns(
                &self.keys[..block.keys * kvw],
                kvw,
                head / config.group_size() * d,
                d,
            )
            .t(),
            0.0,
            MatMut::new(out, block.rows.len(), block.keys),
        );
    }
}
