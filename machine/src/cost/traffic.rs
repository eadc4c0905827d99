//! HBM traffic of the memory-bound kernels: RMSNorm, RoPE, SwiGLU, residual adds, the embedding
//! lookup and the cross-entropy loss. Their time is bytes over achieved bandwidth, not FLOPs.
//!
//! Contract: bytes per token *per device*, with TP + sequence parallelism dividing the work by
//! `tp` (norms and residual adds run on `tokens / tp`, RoPE on `heads / tp`, SwiGLU on
//! `ffn / tp`, the loss on `vocab / tp`); the embedding lookup writes full-width rows on every TP
//! rank (Megatron's vocab-parallel embedding, followed by a reduce-scatter). Counts follow a
//! Megatron-Core + Transformer Engine layer with its usual fusions (norm kernels separate from
//! the GEMMs, fused RoPE, fused SwiGLU, fused bias-dropout-add).

use slimpack_ir::spec::{ModelSpec, RecomputeMix};
use slimpack_ir::step::Direction;

/// Element-wise backward over forward traffic: each backward kernel reads the saved input and
/// the upstream gradient and writes the input gradient (RMSNorm also reduces its weight
/// gradient): about twice the forward's reads and writes.
pub const BACKWARD_ELEMENTWISE_FACTOR: f64 = 2.0;

/// Bytes of the fp32 logits the loss works on.
const LOSS_LOGIT_BYTES: f64 = 4.0;

/// Forward fp32 passes over the logits in Megatron's `_VocabParallelCrossEntropy.forward`
/// (`tensor_parallel/cross_entropy.py`): max (read), subtract max (read + write), exp (read +
/// write), sum (read), normalise to the softmax kept for backward (read + write): 8 accesses.
const LOSS_FORWARD_ACCESSES: f64 = 8.0;

/// Backward fp32 passes: scale the saved softmax by the incoming gradient (read + write).
const LOSS_BACKWARD_ACCESSES: f64 = 2.0;

/// Bytes per token of the memory-bound kernels, per device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Traffic {
    layer_forward: f64,
    embedding_forward: f64,
    embedding_backward: f64,
    head_forward: f64,
    head_backward: f64,
    recompute: RecomputeMix,
}

impl Traffic {
    /// Traffic of `model` with tensor-parallel degree `tp`, in model chunks of
    /// `layers_per_chunk` layers (what `block:K` recomputation counts against).
    pub fn new(model: &ModelSpec, tp: u32, layers_per_chunk: u32) -> Traffic {
        let tp = f64::from(tp);
        let b = model.dtype.bytes() as f64;
        let h = f64::from(model.hidden);
        let (q, kv, ffn) = (
            model.q_width() as f64,
            model.kv_width() as f64,
            f64::from(model.ffn),
        );
        let vocab = f64::from(model.vocab);
        // Two RMSNorms (read + write h), RoPE on q and k (read + write), SwiGLU (read gate and
        // up, write the product), two residual adds (read 2h, write h).
        let layer_elements = 2.0 * 2.0 * h + 2.0 * (q + kv) + 3.0 * ffn + 2.0 * 3.0 * h;
        // Cast of the low-precision logits to fp32 (read b, write 4), skipped for fp32 models.
        let cast = if b < LOSS_LOGIT_BYTES {
            b + LOSS_LOGIT_BYTES
        } else {
            0.0
        };
        let loss_forward = vocab * (cast + LOSS_FORWARD_ACCESSES * LOSS_LOGIT_BYTES);
        let loss_backward = vocab * (LOSS_BACKWARD_ACCESSES * LOSS_LOGIT_BYTES + cast);
        let final_norm = 2.0 * h * b;
        Traffic {
            layer_forward: layer_elements * b / tp,
            // Gather a row (read h), write it.
            embedding_forward: 2.0 * h * b,
            // Read the row gradient, read-modify-write the fp32 main gradient row.
            embedding_backward: h * b + 2.0 * h * super::memory::MAIN_GRAD_BYTES as f64,
            head_forward: (final_norm + loss_forward) / tp,
            head_backward: (BACKWARD_ELEMENTWISE_FACTOR * final_norm + loss_backward) / tp,
            recompute: model.recompute.mix(layers_per_chunk),
        }
    }

    /// Bytes per token per layer in `direction`; a backward under full recomputation also
    /// re-runs the forward's kernels.
    pub fn layer(&self, direction: Direction) -> f64 {
        match direction {
            Direction::Forward => self.layer_forward,
            Direction::Backward => {
                let recomputed = self.recompute.full * self.layer_forward;
                BACKWARD_ELEMENTWISE_FACTOR * self.layer_forward + recomputed
            }
        }
    }

    /// Bytes per token of the embedding lookup (first stage).
    pub fn embedding(&self, direction: Direction) -> f64 {
        match direction {
            Direction::Forward => self.embedding_forward,
            Direction::Backward => self.embedding_backward,
        }
    }

    /// Bytes per token of the final norm and the cross-entropy loss (last stage).
    pub fn head(&self, direction: Direction) -> f64 {
        match direction {
            Direction::Forward => self.head_forward,
            Direction::Backward => self.head_backward,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slimpack_ir::spec::Recompute;

    #[test]
    fn llama7b_layer_traffic_by_hand() {
        let model = ModelSpec::preset("llama-7b").unwrap();
        // 4·4096 + 2·8192 + 3·11008 + 6·4096 = 90,368 elements of 2 bytes.
        let traffic = Traffic::new(&model, 1, 4);
        assert_eq!(traffic.layer(Direction::Forward), 180_736.0);
        assert_eq!(traffic.layer(Direction::Backward), 361_472.0);
        assert_eq!(
            Traffic::new(&model, 8, 4).layer(Direction::Forward),
            180_736.0 / 8.0
        );
        // Loss: 32000 logits · (2 + 4 cast + 8 · 4) bytes, plus the final norm.
        assert_eq!(
            traffic.head(Direction::Forward),
            32000.0 * 38.0 + 4.0 * 4096.0
        );
    }

    #[test]
    fn full_recomputation_replays_the_forward_traffic() {
        let mut model = ModelSpec::preset("llama-7b").unwrap();
        model.recompute = Recompute::Full;
        let traffic = Traffic::new(&model, 2, 4);
        let forward = traffic.layer(Direction::Forward);
        assert_eq!(traffic.layer(Direction::Backward), 3.0 * forward);
        // block:1 on chunks of 4 layers replays a quarter of the forward traffic.
        model.recompute = Recompute::Block(1);
        let traffic = Traffic::new(&model, 2, 4);
        assert_eq!(traffic.layer(Direction::Backward), 2.25 * forward);
    }
}
