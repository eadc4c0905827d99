//! The model as the CPU backend runs it: the spec's shape plus the constants the spec leaves open.
//!
//! [`ModelConfig`] is built from a [`ModelSpec`] and fixes RMSNorm's epsilon and RoPE's base to the
//! Llama 2 values. It is small and `Copy`, so every tensor set carries its own.

use slimpack_ir::spec::{Dtype, ModelSpec};

use super::error::{CpuError, Result};

/// Shape and constants of the Llama-style decoder the CPU backend executes (fp32). Build it with
/// [`ModelConfig::from_spec`]; a hand-made value must satisfy the same checks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelConfig {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Intermediate size of the SwiGLU MLP.
    pub ffn: usize,
    pub vocab: usize,
    /// The output projection is the transposed token embedding.
    pub tied_embeddings: bool,
    /// RMSNorm's epsilon inside the square root.
    pub norm_eps: f32,
    /// RoPE base: pair `i` of a head rotates by `position * rope_theta^(-2i/head_dim)`.
    pub rope_theta: f64,
}

impl ModelConfig {
    /// Llama 2's RMSNorm epsilon.
    pub const NORM_EPS: f32 = 1e-5;
    /// Llama 2's RoPE base.
    pub const ROPE_THETA: f64 = 10_000.0;

    /// The configuration of `spec`; fails for invalid shapes, non-fp32 models and odd head sizes
    /// (RoPE rotates pairs of dimensions).
    pub fn from_spec(spec: &ModelSpec) -> Result<ModelConfig> {
        spec.validate()?;
        if spec.dtype != Dtype::Fp32 {
            return Err(CpuError::UnsupportedDtype {
                model: spec.name.clone(),
                dtype: spec.dtype,
            });
        }
        if spec.head_dim % 2 != 0 {
            return Err(CpuError::UnsupportedModel {
                model: spec.name.clone(),
                reason: format!("RoPE needs an even head_dim, got {}", spec.head_dim),
            });
        }
        Ok(ModelConfig {
            layers: spec.layers as usize,
            hidden: spec.hidden as usize,
            heads: spec.heads as usize,
            kv_heads: spec.kv_heads as usize,
            head_dim: spec.head_dim as usize,
            ffn: spec.ffn as usize,
            vocab: spec.vocab as usize,
            tied_embeddings: spec.tied_embeddings,
            norm_eps: Self::NORM_EPS,
            rope_theta: Self::ROPE_THETA,
        })
    }

    /// Width of the query projection (`heads * head_dim`).
    pub fn q_width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Width of each of the key and value projections (`kv_heads * head_dim`).
    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Query heads sharing one K/V head (grouped-query attention).
    pub fn group_size(&self) -> usize {
        self.heads / self.kv_heads
    }
}
