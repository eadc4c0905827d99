//! The CPU backend's numerical core: a small Llama-style decoder in fp32 with explicit forward
//! and backward, runnable slice by slice and pack by pack across pipeline stages.
//!
//! Model: token embedding; per layer RMSNorm → Q/K/V projections (grouped-query) → RoPE →
//! causal attention → O projection → residual, RMSNorm → SwiGLU MLP → residual; final RMSNorm →
//! output projection (tied to the embedding or not) → softmax cross-entropy on next-token
//! targets, averaged over the predicted tokens of the whole global batch. GEMMs go through
//! `matrixmultiply`.
//!
//! # Driving a step
//! An executor holds, per worker (a pipeline stage of a DP replica), that stage's [`Params`] (cut
//! from the whole model with [`Params::split`] over [`LayerRange`]s), a zeroed [`Grads`]
//! ([`Params::zeros_like`]) and a fresh [`StageState`]; every worker sees the same global
//! [`TokenBatch`]. It then replays the schedule:
//! - forward of a pack (a list of [`TokenSlice`]s): on stage 0 `forward_pack(params, batch, slices,
//!   &[])`, then on each next stage `forward_pack(.., &previous.hidden)`; the last stage returns
//!   the pack's share of the loss in [`ForwardOutput::loss`] (add them up);
//! - backward of a pack: on the last stage `backward_pack(params, grads, batch, slices, &[])`,
//!   then on each earlier stage with the gradients the later stage returned; a zero-bubble
//!   schedule's split backward runs `backward_input_pack` (the same, its weight-gradient GEMMs
//!   kept) and later [`DeferredWeightGrads::add_into`];
//! - the order rules (per sample: forwards increasing, backwards decreasing and only after the
//!   sample's forward finished on that stage) are checked; forward and backward packs can be any
//!   two partitions of the same slices;
//! - at the end: sum [`Grads`] over DP replicas ([`Params::add_assign`]), sum the tied embedding
//!   copies between the first and last stage ([`sum_tied_grads`]), and step each stage's
//!   [`AdamW`]. Every [`StageState`] is then drained ([`StageState::is_drained`]).
//!
//! [`reference_step`] computes the same loss and gradients unsliced, and [`tensor_diff`] measures
//! the difference.

mod adamw;
mod attention;
mod backward;
mod batch;
pub mod calibration;
mod compare;
mod config;
mod counting_alloc;
pub mod cp;
mod error;
pub mod exec;
mod forward;
mod head;
mod kv_cache;
mod layer;
mod ops;
pub(crate) mod pack_layout;
mod padding;
mod params;
pub mod profile;
mod reference;
mod rendezvous;
mod saved;
mod saved_store;
mod stage;
mod stage_state;
mod weight_grad;

#[cfg(test)]
mod tests;

#[cfg(feature = "cuda")]
pub(crate) use adamw::StepRates;
pub use adamw::{AdamW, AdamWConfig, ShardedAdamW};

/// The numerical ops of the CPU backend (forward and backward), for checking other
/// implementations against them: `slimpack-codegen`'s tests compare the GPU kernels' host
/// emulation with these.
pub mod numerics {
    pub use super::attention::{attention_backward, attention_forward, SliceAttention};
    pub use super::ops::cross_entropy::{cross_entropy_backward, cross_entropy_softmax};
    pub use super::ops::rmsnorm::{rmsnorm_backward, rmsnorm_forward};
    pub use super::ops::rope::{rope_backward, rope_forward};
    pub use super::ops::swiglu::{swiglu_backward, swiglu_forward};
}
pub use batch::{SampleId, TokenBatch, TokenSlice};
pub use compare::{tensor_diff, TensorDiff};
pub use config::ModelConfig;
pub use counting_alloc::{AttachGuard, CountingAllocator, MemoryMeter, MAX_METERS};
pub use cp::{CpShard, KvExchange, LocalExchange, ThreadExchange};
pub use error::{CpuError, Result};
pub use forward::ForwardOutput;
pub use params::{sum_tied_grads, Grads, LayerParams, Params, TensorKind, TensorMut, TensorRef};
pub use reference::reference_step;
pub use rendezvous::{Aborted, Rendezvous};
pub use stage::LayerRange;
pub use stage_state::{LiveBytes, StageState};
pub use weight_grad::DeferredWeightGrads;
