//! FLOP counts: what a slice costs in arithmetic, forward and backward, before any notion of time.
//!
//! Contract: counts are exact functions of the model shape and of a slice's `(len, prefix)`, and
//! they are additive: cutting a sample into slices and summing their counts gives the count of
//! the whole sample, exactly (the causal pair count below is an integer identity). Counts are
//! *per transformer layer* unless a function says otherwise; the output projection (last
//! pipeline stage) is counted separately by [`FlopModel::head`].
//!
//! - Linear part: every GEMM weight costs one multiply-add (2 FLOPs) per token, so a layer costs
//!   `2·P_gemm` FLOPs per token forward (Kaplan et al. 2020, "Scaling Laws", §2.1; Narayanan et
//!   al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters", §5.1). With
//!   grouped-query attention the K and V projections are `hidden × kv_heads·head_dim` each, which
//!   [`ModelSpec::params_per_layer`] already reflects.
//! - Attention: causal; a query at position `τ` sees `τ + 1` keys, and each (query, key) pair
//!   costs `2·heads·head_dim` FLOPs for the scores `QKᵀ` and as much for the context `PV`. A slice
//!   of `len` tokens after `prefix` tokens of its sample therefore has
//!   `Σ_{τ=prefix}^{prefix+len-1} (τ+1) = len·prefix + len(len+1)/2` pairs: the `l·o + l²/2`
//!   shape. This is the convention of the FlashAttention papers' causal FLOP counts.
//! - Backward: the linear part costs 2x the forward (the input-gradient and the weight-gradient
//!   GEMMs); attention costs 2.5x (FlashAttention-2 backward runs five GEMM-shaped products —
//!   recomputed `QKᵀ`, `dV`, `dP`, `dQ`, `dK` — against the forward's two; Dao 2023, §3.1.2).
//!   Recomputation adds forward work to the backward: `selective` re-runs the attention core
//!   (+1x attention forward), `full` re-runs the whole layer (+1x forward of both parts); see
//!   Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models".

use std::ops::{Add, AddAssign, Mul};

use slimpack_ir::spec::{ModelSpec, RecomputeMix};
use slimpack_ir::step::Direction;

/// Backward over forward FLOPs of the GEMMs: input gradient plus weight gradient, each as large
/// as the forward GEMM (Narayanan et al. 2021, §5.1: "the backward pass ... 2x the forward").
pub const BACKWARD_LINEAR_FACTOR: f64 = 2.0;

/// Backward over forward FLOPs of causal attention with FlashAttention-2-style kernels: five
/// matmuls against two (Dao 2023, "FlashAttention-2", §3.1.2 and its benchmark FLOP counts,
/// which use `bwd = 2.5 · fwd`).
pub const BACKWARD_ATTENTION_FACTOR: f64 = 2.5;

/// Model FLOPs per forward FLOP for MFU: forward plus a backward counted as twice the forward,
/// no recomputation (PaLM, Chowdhery et al. 2022, Appendix B: "6N + 12LHQT" per token;
/// Narayanan et al. 2021, eq. 3). Attention is counted causally (half of PaLM's full `T²`), so
/// long contexts do not inflate MFU.
pub const MODEL_FLOPS_PER_FORWARD_FLOP: f64 = 3.0;

/// FLOPs split into the two parts whose costs scale differently: linear in tokens (GEMMs) and
/// quadratic in the sample's length (attention scores and context).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Flops {
    /// GEMM FLOPs: projections, MLP, output projection.
    pub linear: f64,
    /// Attention-core FLOPs: `QKᵀ` and `PV` (and their gradients).
    pub attention: f64,
}

impl Flops {
    /// Linear plus attention.
    pub fn total(self) -> f64 {
        self.linear + self.attention
    }

    /// Share of attention in the total (0 when the total is 0).
    pub fn attention_share(self) -> f64 {
        let total = self.total();
        if total > 0.0 {
            self.attention / total
        } else {
            0.0
        }
    }
}

impl Add for Flops {
    type Output = Flops;
    fn add(self, other: Flops) -> Flops {
        Flops {
            linear: self.linear + other.linear,
            attention: self.attention + other.attention,
        }
    }
}

impl AddAssign for Flops {
    fn add_assign(&mut self, other: Flops) {
        *self = *self + other;
    }
}

impl Mul<f64> for Flops {
    type Output = Flops;
    fn mul(self, factor: f64) -> Flops {
        Flops {
            linear: self.linear * factor,
            attention: self.attention * factor,
        }
    }
}

/// Causal (query, key) pairs of a slice: `Σ_{τ=prefix}^{prefix+len-1} (τ+1)`.
///
/// Exact integer identity, so pair counts of slices add up to the count of their sample.
pub fn causal_pairs(len: u64, prefix: u64) -> u64 {
    len * prefix + len * (len + 1) / 2
}

/// How much of each part one direction executes, as multiples of the forward FLOPs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DirectionFactors {
    /// Executed linear FLOPs over forward linear FLOPs.
    pub linear: f64,
    /// Executed attention FLOPs over forward attention FLOPs.
    pub attention: f64,
}

impl DirectionFactors {
    /// Factors of `direction` under the recomputation `mix`: forward (1, 1); backward (2, 2.5)
    /// plus the recomputed forward work — selective (2, 3.5), full (3, 3.5), `block:K` on a
    /// chunk of `n` layers the layer average (2 + K/n, 2.5 + K/n).
    pub fn of(direction: Direction, mix: RecomputeMix) -> DirectionFactors {
        match direction {
            Direction::Forward => DirectionFactors {
                linear: 1.0,
                attention: 1.0,
            },
            Direction::Backward => {
                let (linear_extra, attention_extra) = recomputed_forward(mix);
                DirectionFactors {
                    linear: BACKWARD_LINEAR_FACTOR + linear_extra,
                    attention: BACKWARD_ATTENTION_FACTOR + attention_extra,
                }
            }
        }
    }
}

/// Forward work re-executed in the backward, as (linear, attention) multiples of the forward,
/// averaged over a chunk's layers: fully recomputed layers replay both, selective ones their
/// attention.
pub fn recomputed_forward(mix: RecomputeMix) -> (f64, f64) {
    (mix.full, mix.full + mix.selective)
}

/// Per-model FLOP coefficients, computed once per spec.
#[derive(Debug, Clone, PartialEq)]
pub struct FlopModel {
    /// Forward GEMM FLOPs per token per layer: `2 · P_gemm`.
    linear_per_token: f64,
    /// Forward attention FLOPs per causal pair per layer: `4 · heads · head_dim`.
    attention_per_pair: f64,
    /// Forward FLOPs per token of the output projection: `2 · hidden · vocab`.
    head_per_token: f64,
    /// The model's recomputation over the layers of one model chunk.
    recompute: RecomputeMix,
}

impl FlopModel {
    /// Coefficients of `model` split into model chunks (pipeline stages, or virtual stages) of
    /// `layers_per_chunk` layers (what `block:K` recomputation is counted against).
    pub fn new(model: &ModelSpec, layers_per_chunk: u32) -> FlopModel {
        FlopModel {
            linear_per_token: 2.0 * gemm_params_per_layer(model) as f64,
            attention_per_pair: 4.0 * model.q_width() as f64,
            head_per_token: 2.0 * f64::from(model.hidden) * f64::from(model.vocab),
            recompute: model.recompute.mix(layers_per_chunk),
        }
    }

    /// Forward GEMM FLOPs per token per layer (`2 · P_gemm`).
    pub fn linear_per_token(&self) -> f64 {
        self.linear_per_token
    }

    /// Forward attention FLOPs per causal pair per layer (`4 · heads · head_dim`).
    pub fn attention_per_pair(&self) -> f64 {
        self.attention_per_pair
    }

    /// Forward FLOPs per token of the output projection (`2 · hidden · vocab`).
    pub fn head_per_token(&self) -> f64 {
        self.head_per_token
    }

    /// Forward FLOPs of one layer for a slice of `len` tokens after `prefix` tokens.
    pub fn forward_layer(&self, len: u64, prefix: u64) -> Flops {
        Flops {
            linear: self.linear_per_token * len as f64,
            attention: self.attention_per_pair * causal_pairs(len, prefix) as f64,
        }
    }

    /// Executed FLOPs of one layer in `direction`, recomputation included.
    pub fn layer(&self, len: u64, prefix: u64, direction: Direction) -> Flops {
        let factors = DirectionFactors::of(direction, self.recompute);
        let forward = self.forward_layer(len, prefix);
        Flops {
            linear: forward.linear * factors.linear,
            attention: forward.attention * factors.attention,
        }
    }

    /// Executed FLOPs of the output projection for `tokens` tokens (linear only; the layer
    /// recomputation modes never recompute it).
    pub fn head(&self, tokens: u64, direction: Direction) -> f64 {
        let factor = match direction {
            Direction::Forward => 1.0,
            Direction::Backward => BACKWARD_LINEAR_FACTOR,
        };
        self.head_per_token * tokens as f64 * factor
    }

    /// Model FLOPs of a slice through the whole model (`layers` layers plus the output
    /// projection), forward and backward, without recomputation: the MFU numerator.
    pub fn model_flops(&self, layers: u32, len: u64, prefix: u64) -> f64 {
        let per_layer = self.forward_layer(len, prefix).total();
        let forward = per_layer * f64::from(layers) + self.head_per_token * len as f64;
        forward * MODEL_FLOPS_PER_FORWARD_FLOP
    }
}

/// GEMM parameters of one layer: every weight of [`ModelSpec::params_per_layer`] except the two
/// RMSNorm vectors, which are element-wise.
pub fn gemm_params_per_layer(model: &ModelSpec) -> u64 {
    model.params_per_layer() - 2 * u64::from(model.hidden)
}

#[cfg(test)]
mod tests {
    use super::*;
    use slimpack_ir::spec::Recompute;

    fn llama7b() -> FlopModel {
        FlopModel::new(&ModelSpec::preset("llama-7b").unwrap(), 8)
    }

    /// Forward FLOPs of the single token at position `tau`, by hand from the per-token costs.
    fn token_flops(model: &FlopModel, tau: u64) -> Flops {
        Flops {
            linear: model.linear_per_token(),
            attention: model.attention_per_pair() * (tau + 1) as f64,
        }
    }

    #[test]
    fn llama7b_coefficients_by_hand() {
        let model = llama7b();
        // Q, K, V, O: 4 · 4096² = 67,108,864; SwiGLU: 3 · 4096 · 11008 = 135,266,304.
        assert_eq!(model.linear_per_token(), 2.0 * 202_375_168.0);
        assert_eq!(model.attention_per_pair(), 4.0 * 32.0 * 128.0);
        assert_eq!(model.head_per_token(), 2.0 * 4096.0 * 32000.0);
    }

    #[test]
    fn gqa_shrinks_only_the_kv_projections() {
        let model = ModelSpec::preset("llama-70b").unwrap();
        let (h, kv, ffn) = (8192u64, 8 * 128u64, 28672u64);
        assert_eq!(
            gemm_params_per_layer(&model),
            2 * h * h + 2 * h * kv + 3 * h * ffn
        );
        // Attention FLOPs follow the 64 query heads, not the 8 K/V heads.
        assert_eq!(
            FlopModel::new(&model, 10).attention_per_pair(),
            4.0 * 64.0 * 128.0
        );
    }

    #[test]
    fn slice_flops_are_the_sum_of_its_token_costs() {
        let model = llama7b();
        for (len, prefix) in [(1, 0), (7, 0), (100, 37), (513, 4096)] {
            let mut by_token = Flops::default();
            for tau in prefix..prefix + len {
                by_token += token_flops(&model, tau);
            }
            // Integer-valued terms far below 2^53: the f64 sums are exact.
            assert_eq!(
                model.forward_layer(len, prefix),
                by_token,
                "({len}, {prefix})"
            );
        }
    }

    #[test]
    fn slicing_conserves_flops_exactly() {
        let model = llama7b();
        let sample = 10_000u64;
        for cuts in [
            vec![],
            vec![1],
            vec![4096, 8192],
            vec![3, 999, 1000, 7777, 9999],
        ] {
            let mut bounds = vec![0];
            bounds.extend(&cuts);
            bounds.push(sample);
            for direction in [Direction::Forward, Direction::Backward] {
                let mut sliced = Flops::default();
                for window in bounds.windows(2) {
                    sliced += model.layer(window[1] - window[0], window[0], direction);
                }
                assert_eq!(sliced, model.layer(sample, 0, direction), "cuts {cuts:?}");
            }
            let pairs: u64 = bounds
                .windows(2)
                .map(|w| causal_pairs(w[1] - w[0], w[0]))
                .sum();
            assert_eq!(pairs, causal_pairs(sample, 0));
        }
    }

    #[test]
    fn backward_over_forward_ratios() {
        let model = llama7b();
        let forward = model.layer(1000, 3000, Direction::Forward);
        let backward = model.layer(1000, 3000, Direction::Backward);
        assert_eq!(backward.linear / forward.linear, 2.0);
        assert_eq!(backward.attention / forward.attention, 2.5);
        assert_eq!(
            model.head(1000, Direction::Backward),
            2.0 * model.head(1000, Direction::Forward)
        );
    }

    #[test]
    fn recomputation_adds_forward_work_to_the_backward() {
        let mut spec = ModelSpec::preset("llama-7b").unwrap();
        let expected = [
            (Recompute::None, 2.0, 2.5),
            (Recompute::Selective, 2.0, 3.5),
            (Recompute::Full, 3.0, 3.5),
            // Chunks of 8 layers, the first 2 recomputed fully: 2 + 2/8 and 2.5 + 2/8.
            (Recompute::Block(2), 2.25, 2.75),
            (Recompute::Block(8), 3.0, 3.5),
            // More recomputed layers than the chunk holds: all of them.
            (Recompute::Block(12), 3.0, 3.5),
        ];
        for (recompute, linear, attention) in expected {
            spec.recompute = recompute;
            let model = FlopModel::new(&spec, 8);
            let forward = model.layer(512, 512, Direction::Forward);
            let backward = model.layer(512, 512, Direction::Backward);
            assert_eq!(backward.linear / forward.linear, linear, "{recompute}");
            assert_eq!(
                backward.attention / forward.attention,
                attention,
                "{recompute}"
            );
        }
    }

    #[test]
    fn model_flops_is_six_p_plus_causal_attention() {
        let model = llama7b();
        let len = 4096u64;
        // 6 · (32 · 202,375,168 + 4096 · 32000) per token, plus 3 · 32 layers · 16384 · pairs.
        let six_p = 6.0 * (32.0 * 202_375_168.0 + 4096.0 * 32000.0) * len as f64;
        let attention = 3.0 * 32.0 * 16384.0 * causal_pairs(len, 0) as f64;
        assert_eq!(model.model_flops(32, len, 0), six_p + attention);
    }
}
