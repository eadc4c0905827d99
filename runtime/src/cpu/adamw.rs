//! AdamW (Loshchilov & Hutter 2019) over a [`Params`], as PyTorch's `torch.optim.AdamW` computes
//! it: decoupled weight decay `p ← p − lr·wd·p`, then the bias-corrected Adam update
//! `p ← p − (lr / (1 − β1ᵗ)) · m / (sqrt(v) / sqrt(1 − β2ᵗ) + eps)`.
//!
//! Weight decay applies to matrices only, not to RMSNorm gains (the usual Llama/Megatron-LM
//! practice). Each pipeline stage keeps its own optimizer over its own tensors; with tied
//! embeddings split across stages both copies see the same summed gradient and the same state,
//! so they stay identical.

use std::ops::Range;

use super::error::{CpuError, Result};
use super::params::{Grads, Params, TensorKind};

/// AdamW hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
}

impl Default for AdamWConfig {
    /// Llama 2's recipe: β = (0.9, 0.95), eps 1e-8, weight decay 0.1, with a small-model lr.
    fn default() -> Self {
        AdamWConfig {
            lr: 3e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        }
    }
}

/// AdamW state (first and second moments) for the tensors of one stage.
#[derive(Debug, Clone)]
pub struct AdamW {
    config: AdamWConfig,
    steps: u32,
    first_moment: Params,
    second_moment: Params,
}

impl AdamW {
    /// Fresh state (zero moments) for tensors laid out like `params`.
    pub fn new(config: AdamWConfig, params: &Params) -> AdamW {
        AdamW {
            config,
            steps: 0,
            first_moment: params.zeros_like(),
            second_moment: params.zeros_like(),
        }
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u32 {
        self.steps
    }

    /// Applies one update to `params` from `grads` (same stage and layout as the state).
    pub fn step(&mut self, params: &mut Params, grads: &Grads) -> Result<()> {
        self.first_moment.check_same_layout(params)?;
        self.first_moment.check_same_layout(grads)?;
        self.steps += 1;
        let rates = StepRates::new(&self.config, self.steps);
        let tensors = params
            .tensors_mut()
            .into_iter()
            .zip(grads.tensors())
            .zip(self.first_moment.tensors_mut())
            .zip(self.second_moment.tensors_mut());
        for (((param, grad), m), v) in tensors {
            rates.update(param.kind, param.data, grad.data, m.data, v.data);
        }
        Ok(())
    }
}

/// AdamW over one data-parallel rank's shard of a stage's tensors (ZeRO stage 1, Megatron's
/// distributed optimizer): the moments of flat indices `range` only (see
/// [`Params::flat_range`]). Every value gets exactly the update [`AdamW`] gives it.
#[derive(Debug, Clone)]
pub struct ShardedAdamW {
    config: AdamWConfig,
    steps: u32,
    range: Range<usize>,
    first_moment: Vec<f32>,
    second_moment: Vec<f32>,
}

impl ShardedAdamW {
    /// Fresh state (zero moments) for the flat indices `range` of tensors laid out like `params`.
    pub fn new(config: AdamWConfig, params: &Params, range: Range<usize>) -> ShardedAdamW {
        assert!(
            range.end <= params.numel(),
            "bug: shard {range:?} past the {} values",
            params.numel()
        );
        ShardedAdamW {
            config,
            steps: 0,
            first_moment: vec![0.0; range.len()],
            second_moment: vec![0.0; range.len()],
            range,
        }
    }

    /// The flat indices this state covers.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// Applies one update to the shard of `params` from the shard's (already summed) gradient.
    pub fn step(&mut self, params: &mut Params, grad_shard: &[f32]) -> Result<()> {
        if grad_shard.len() != self.range.len() {
            return Err(CpuError::LayoutMismatch {
                reason: format!(
                    "a gradient shard of {} values for an optimizer shard of {}",
                    grad_shard.len(),
                    self.range.len()
                ),
            });
        }
        self.steps += 1;
        let rates = StepRates::new(&self.config, self.steps);
        let mut offset = 0;
        for piece in params.flat_range_mut(self.range.clone()) {
            let part = offset..offset + piece.data.len();
            offset = part.end;
            rates.update(
                piece.kind,
                piece.data,
                &grad_shard[part.clone()],
                &mut self.first_moment[part.clone()],
                &mut self.second_moment[part],
            );
        }
        Ok(())
    }
}

/// The per-step constants of the update (the CUDA backend's AdamW kernel takes them too).
pub(crate) struct StepRates {
    config: AdamWConfig,
    pub(crate) step_size: f32,
    pub(crate) sqrt_bias2: f32,
}

impl StepRates {
    pub(crate) fn new(config: &AdamWConfig, step: u32) -> StepRates {
        let t = step as i32;
        StepRates {
            config: *config,
            step_size: config.lr / (1.0 - f64::from(config.beta1).powi(t)) as f32,
            sqrt_bias2: (1.0 - f64::from(config.beta2).powi(t)).sqrt() as f32,
        }
    }

    /// Updates `values` in place, with their gradients and moments.
    fn update(
        &self,
        kind: TensorKind,
        values: &mut [f32],
        grads: &[f32],
        m: &mut [f32],
        v: &mut [f32],
    ) {
        let AdamWConfig {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } = self.config;
        let decay = match kind {
            TensorKind::Matrix => 1.0 - lr * weight_decay,
            TensorKind::NormGain => 1.0,
        };
        let values = values
            .iter_mut()
            .zip(grads)
            .zip(m.iter_mut())
            .zip(v.iter_mut());
        for (((p, &g), m), v) in values {
            *p *= decay;
            *m = beta1 * *m + (1.0 - beta1) * g;
            *v = beta2 * *v + (1.0 - beta2) * g * g;
            *p -= self.step_size * *m / (v.sqrt() / self.sqrt_bias2 + eps);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::config::ModelConfig;
    use crate::cpu::stage::LayerRange;

    fn micro() -> ModelConfig {
        ModelConfig {
            layers: 1,
            hidden: 2,
            heads: 1,
            kv_heads: 1,
            head_dim: 2,
            ffn: 2,
            vocab: 3,
            tied_embeddings: true,
            norm_eps: 1e-5,
            rope_theta: 10_000.0,
        }
    }

    #[test]
    fn two_steps_match_the_closed_form() {
        let config = micro();
        let mut params = Params::zeros(&config, LayerRange::whole(&config));
        params.embedding.as_mut().unwrap()[0] = 1.0;
        params.layers[0].attn_norm[0] = 1.0;
        let mut grads = params.zeros_like();
        grads.embedding.as_mut().unwrap()[0] = 0.5;
        grads.layers[0].attn_norm[0] = 0.5;
        let config = AdamWConfig {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-8,
            weight_decay: 0.5,
        };
        let mut adamw = AdamW::new(config, &params);
        adamw.step(&mut params, &grads).unwrap();
        adamw.step(&mut params, &grads).unwrap();
        // A constant gradient makes both bias-corrected moments exact: each step moves by lr.
        let gain = 1.0 - 0.1 - 0.1;
        // Decay first (×0.95), then the lr-sized step, twice.
        let matrix = (1.0 * 0.95 - 0.1) * 0.95 - 0.1;
        assert!((params.layers[0].attn_norm[0] - gain).abs() < 1e-6);
        assert!((params.embedding.as_ref().unwrap()[0] - matrix).abs() < 1e-6);
        // Untouched entries with zero gradient stay zero.
        assert_eq!(params.layers[0].wq[0], 0.0);
        assert_eq!(adamw.steps(), 2);
    }

    #[test]
    fn shards_over_any_split_update_like_the_whole() {
        let config = ModelConfig {
            layers: 2,
            ..micro()
        };
        let mut params = Params::zeros(&config, LayerRange::whole(&config));
        let mut grads = params.zeros_like();
        for (index, (p, g)) in params
            .tensors_mut()
            .into_iter()
            .flat_map(|t| t.data.iter_mut())
            .zip(
                grads
                    .tensors_mut()
                    .into_iter()
                    .flat_map(|t| t.data.iter_mut()),
            )
            .enumerate()
        {
            *p = (index as f32 * 0.37).sin();
            *g = (index as f32 * 0.11).cos();
        }
        let mut whole = params.clone();
        let mut adamw = AdamW::new(AdamWConfig::default(), &whole);
        let numel = params.numel();
        // Bounds inside tensors, on tensor borders, and an empty shard.
        let bounds = [0, 5, 6, 6, 17, numel];
        let mut shards: Vec<ShardedAdamW> = bounds
            .windows(2)
            .map(|w| ShardedAdamW::new(AdamWConfig::default(), &params, w[0]..w[1]))
            .collect();
        for _ in 0..2 {
            adamw.step(&mut whole, &grads).unwrap();
            for shard in &mut shards {
                let grad: Vec<f32> = grads
                    .flat_range(shard.range())
                    .iter()
                    .flat_map(|piece| piece.data.iter().copied())
                    .collect();
                shard.step(&mut params, &grad).unwrap();
            }
        }
        assert_eq!(params, whole);
        assert!(shards[0].step(&mut params, &[1.0]).is_err());
    }
}
