//! Deferred weight gradients: the CPU runtime's side of a zero-bubble schedule.
//!
//! A split backward runs in two ops (see `slimpack_ir::step::Part`). The input gradient (`bwd
//! %bN.dx`) is the whole backward but for the layers' weight-gradient GEMMs (`dW += xᵀ · dy` of
//! the Q, K, V, output, gate, up and down projections): it keeps each GEMM's input rows and
//! output gradient instead ([`WeightGrads::Deferred`]), and sends its input gradients on. The
//! weight gradient (`bwd %bN.dw`), later on the same worker, runs those GEMMs
//! ([`DeferredWeightGrads::add_into`]). The norms' gains and the output projection keep their
//! gradients in the input-gradient op. Each weight's gradient still receives one GEMM per
//! pack, in the stage's backward order (weight gradients run in the order of their input
//! gradients), so a split step adds exactly what the whole one does, in the same order.
//!
//! Memory: the kept operands are copies, each input once for the GEMMs that read it (the
//! attention's normed input for Q, K and V, the MLP's for gate and up): `4 · (4h + 2q + 2kv +
//! 3f)` bytes per token and layer, what the machine model counts for a deferred weight
//! gradient (`MemoryModel::weight_grad_bytes`).

use std::sync::Arc;

use super::ops::linear::linear_weight_grad;
use super::params::{Grads, LayerParams};

/// One of a layer's weight matrices fed by a weight-gradient GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LinearWeight {
    Query,
    Key,
    Value,
    Output,
    Gate,
    Up,
    Down,
}

impl LinearWeight {
    fn of(self, layer: &mut LayerParams) -> &mut [f32] {
        match self {
            LinearWeight::Query => &mut layer.wq,
            LinearWeight::Key => &mut layer.wk,
            LinearWeight::Value => &mut layer.wv,
            LinearWeight::Output => &mut layer.wo,
            LinearWeight::Gate => &mut layer.w_gate,
            LinearWeight::Up => &mut layer.w_up,
            LinearWeight::Down => &mut layer.w_down,
        }
    }
}

/// One weight-gradient GEMM kept for later: `layers[layer].weight += inputᵀ · d_out`.
#[derive(Debug)]
pub(crate) struct DeferredGemm {
    layer: usize,
    weight: LinearWeight,
    /// Shared with the layer's other GEMMs that read the same input rows.
    input: Arc<[f32]>,
    /// Where the input rows were read from (address and length): a GEMM that reads the same
    /// rows as the one kept just before it, in the same layer, shares its copy.
    source: (usize, usize),
    d_out: Vec<f32>,
    in_dim: usize,
    out_dim: usize,
}

/// Where a backward's weight-gradient GEMMs go: into the gradients now (a whole backward), or
/// kept with their operands for a later weight-gradient op (a split backward's input gradient).
#[derive(Debug)]
pub(crate) enum WeightGrads {
    Now,
    Deferred(Vec<DeferredGemm>),
}

/// The operands of one weight-gradient GEMM of local layer `layer`: input rows `[rows,
/// in_dim]` and output gradient `[rows, out_dim]`.
pub(crate) struct GemmOperands<'a> {
    pub layer: usize,
    pub weight: LinearWeight,
    pub input: &'a [f32],
    pub d_out: &'a [f32],
    pub in_dim: usize,
    pub out_dim: usize,
}

impl WeightGrads {
    /// A sink that keeps every GEMM for later.
    pub(crate) fn deferred() -> WeightGrads {
        WeightGrads::Deferred(Vec::new())
    }

    /// Runs the GEMM into `grads` (the layer's gradients) now, or keeps copies of its operands
    /// (the input rows shared with the GEMM kept just before, where it read the same rows).
    pub(crate) fn add(&mut self, grads: &mut LayerParams, gemm: GemmOperands<'_>) {
        match self {
            WeightGrads::Now => linear_weight_grad(
                gemm.input,
                gemm.d_out,
                gemm.in_dim,
                gemm.out_dim,
                gemm.weight.of(grads),
            ),
            WeightGrads::Deferred(kept) => {
                let source = (gemm.input.as_ptr() as usize, gemm.input.len());
                // The rows are the layer's saved activations, alive through its backward, so
                // an address seen in this layer is the same rows.
                let input = match kept.last() {
                    Some(last) if last.layer == gemm.layer && last.source == source => {
                        Arc::clone(&last.input)
                    }
                    _ => Arc::from(gemm.input),
                };
                kept.push(DeferredGemm {
                    layer: gemm.layer,
                    weight: gemm.weight,
                    input,
                    source,
                    d_out: gemm.d_out.to_vec(),
                    in_dim: gemm.in_dim,
                    out_dim: gemm.out_dim,
                })
            }
        }
    }

    /// What a split backward kept (nothing for [`WeightGrads::Now`]).
    pub(crate) fn into_deferred(self) -> DeferredWeightGrads {
        match self {
            WeightGrads::Now => DeferredWeightGrads(Vec::new()),
            WeightGrads::Deferred(kept) => DeferredWeightGrads(kept),
        }
    }
}

/// The weight-gradient GEMMs a split backward's input gradient kept for its weight gradient.
#[derive(Debug)]
pub struct DeferredWeightGrads(Vec<DeferredGemm>);

impl DeferredWeightGrads {
    /// Runs the kept GEMMs into the stage's gradients, in the order the backward met them.
    pub fn add_into(self, grads: &mut Grads) {
        for gemm in self.0 {
            linear_weight_grad(
                &gemm.input,
                &gemm.d_out,
                gemm.in_dim,
                gemm.out_dim,
                gemm.weight.of(&mut grads.layers[gemm.layer]),
            );
        }
    }
}
