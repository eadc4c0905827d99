//! Model tensors: the weights ([`Params`]) and their gradients ([`Grads`], the same layout).
//!
//! A [`Params`] holds the tensors of one pipeline [`LayerRange`] (the whole model is the single stage
//! holding every layer): the embedding on the first stage, the stage's layers, the final norm and
//! output projection on the last stage. Matrices are row-major, `[in, out]` for projections
//! (`y = x · W`) and `[vocab, hidden]` for the embedding and output projection (`logits = h · Wᵀ`).
//!
//! Tied embeddings across stages follow Megatron-LM: the first stage holds the embedding, the last
//! stage holds a copy of it in `output`. Each copy collects the gradient of its own use (lookup on
//! the first stage, output projection on the last); before the optimizer step the two gradients
//! are summed and the sum given to both copies ([`sum_tied_grads`]), so that both stages apply the
//! same update and the copies stay bit-identical. [`Params::merge`] checks that they are.

use std::ops::Range;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::config::ModelConfig;
use super::error::{CpuError, Result};
use super::stage::LayerRange;

/// Gradients of a [`Params`]: the same stage, tensors and shapes.
pub type Grads = Params;

/// The tensors of one transformer layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerParams {
    /// RMSNorm gain before attention, `[hidden]`.
    pub attn_norm: Vec<f32>,
    /// Query projection, `[hidden, heads * head_dim]`.
    pub wq: Vec<f32>,
    /// Key projection, `[hidden, kv_heads * head_dim]`.
    pub wk: Vec<f32>,
    /// Value projection, `[hidden, kv_heads * head_dim]`.
    pub wv: Vec<f32>,
    /// Attention output projection, `[heads * head_dim, hidden]`.
    pub wo: Vec<f32>,
    /// RMSNorm gain before the MLP, `[hidden]`.
    pub mlp_norm: Vec<f32>,
    /// SwiGLU gate projection, `[hidden, ffn]`.
    pub w_gate: Vec<f32>,
    /// SwiGLU up projection, `[hidden, ffn]`.
    pub w_up: Vec<f32>,
    /// SwiGLU down projection, `[ffn, hidden]`.
    pub w_down: Vec<f32>,
}

/// What a tensor is, for rules that treat kinds differently (weight decay).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorKind {
    /// A projection or embedding matrix.
    Matrix,
    /// An RMSNorm gain vector.
    NormGain,
}

/// A named view of one tensor of a [`Params`].
#[derive(Debug)]
pub struct TensorRef<'a> {
    /// Stable name, e.g. `embedding`, `layers.3.wq`, `final_norm`, `output`.
    pub name: String,
    pub kind: TensorKind,
    pub data: &'a [f32],
}

/// A named mutable view of one tensor of a [`Params`].
#[derive(Debug)]
pub struct TensorMut<'a> {
    pub name: String,
    pub kind: TensorKind,
    pub data: &'a mut [f32],
}

/// All tensors of one stage of the model (weights, or gradients as [`Grads`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    config: ModelConfig,
    stage: LayerRange,
    /// Token embedding, `[vocab, hidden]`; on the first stage only.
    pub embedding: Option<Vec<f32>>,
    /// The stage's layers, in order.
    pub layers: Vec<LayerParams>,
    /// Final RMSNorm gain, `[hidden]`; on the last stage only.
    pub final_norm: Option<Vec<f32>>,
    /// Output projection, `[vocab, hidden]`; on the last stage, unless the model is tied and the
    /// stage also holds the embedding (then the embedding is used). With tied embeddings on a
    /// separate last stage this is the embedding's copy.
    pub output: Option<Vec<f32>>,
}

impl Params {
    /// Weights of the whole model, deterministic in `seed`: every matrix uniform with standard
    /// deviation `1/sqrt(fan_in)` (fan-in = `hidden` for the embedding and output projection,
    /// which the logits contract over), every norm gain 1.
    pub fn init(config: &ModelConfig, seed: u64) -> Params {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut params = Params::zeros(config, LayerRange::whole(config));
        for tensor in params.tensors_mut() {
            match tensor.kind {
                TensorKind::NormGain => tensor.data.fill(1.0),
                TensorKind::Matrix => {
                    let fan_in = fan_in(config, &tensor.name);
                    let bound = (3.0 / fan_in as f32).sqrt();
                    for value in tensor.data.iter_mut() {
                        *value = (2.0 * rng.random::<f32>() - 1.0) * bound;
                    }
                }
            }
        }
        params
    }

    /// All-zero tensors of `stage` (the gradient accumulators of a step).
    pub fn zeros(config: &ModelConfig, stage: LayerRange) -> Params {
        let (h, v) = (config.hidden, config.vocab);
        let layer = LayerParams {
            attn_norm: vec![0.0; h],
            wq: vec![0.0; h * config.q_width()],
            wk: vec![0.0; h * config.kv_width()],
            wv: vec![0.0; h * config.kv_width()],
            wo: vec![0.0; config.q_width() * h],
            mlp_norm: vec![0.0; h],
            w_gate: vec![0.0; h * config.ffn],
            w_up: vec![0.0; h * config.ffn],
            w_down: vec![0.0; config.ffn * h],
        };
        let separate_output = stage.is_last() && !(config.tied_embeddings && stage.is_first());
        Params {
            config: *config,
            stage,
            embedding: stage.is_first().then(|| vec![0.0; v * h]),
            layers: vec![layer; stage.layer_count()],
            final_norm: stage.is_last().then(|| vec![0.0; h]),
            output: separate_output.then(|| vec![0.0; v * h]),
        }
    }

    /// All-zero tensors of the same stage.
    pub fn zeros_like(&self) -> Params {
        Params::zeros(&self.config, self.stage)
    }

    /// The model these tensors belong to.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The stage these tensors belong to.
    pub fn stage(&self) -> LayerRange {
        self.stage
    }

    /// Every tensor, in a fixed order (embedding, layers, final norm, output).
    pub fn tensors(&self) -> Vec<TensorRef<'_>> {
        let first_layer = self.stage.layers().start;
        let mut tensors = Vec::new();
        if let Some(embedding) = &self.embedding {
            tensors.push(tensor_ref(
                "embedding".into(),
                TensorKind::Matrix,
                embedding,
            ));
        }
        for (local, layer) in self.layers.iter().enumerate() {
            let index = first_layer + local;
            for (field, kind, data) in layer_fields(layer) {
                tensors.push(tensor_ref(format!("layers.{index}.{field}"), kind, data));
            }
        }
        if let Some(final_norm) = &self.final_norm {
            tensors.push(tensor_ref(
                "final_norm".into(),
                TensorKind::NormGain,
                final_norm,
            ));
        }
        if let Some(output) = &self.output {
            tensors.push(tensor_ref("output".into(), TensorKind::Matrix, output));
        }
        tensors
    }

    /// Every tensor, mutably, in the order of [`Params::tensors`].
    pub fn tensors_mut(&mut self) -> Vec<TensorMut<'_>> {
        let first_layer = self.stage.layers().start;
        let Params {
            embedding,
            layers,
            final_norm,
            output,
            ..
        } = self;
        let mut tensors = Vec::new();
        if let Some(embedding) = embedding {
            tensors.push(tensor_mut(
                "embedding".into(),
                TensorKind::Matrix,
                embedding,
            ));
        }
        for (local, layer) in layers.iter_mut().enumerate() {
            let index = first_layer + local;
            for (field, kind, data) in layer_fields_mut(layer) {
                tensors.push(tensor_mut(format!("layers.{index}.{field}"), kind, data));
            }
        }
        if let Some(final_norm) = final_norm {
            tensors.push(tensor_mut(
                "final_norm".into(),
                TensorKind::NormGain,
                final_norm,
            ));
        }
        if let Some(output) = output {
            tensors.push(tensor_mut("output".into(), TensorKind::Matrix, output));
        }
        tensors
    }

    /// Total number of values in all tensors.
    pub fn numel(&self) -> usize {
        self.tensors().iter().map(|t| t.data.len()).sum()
    }

    /// The values at flat indices `range` of the tensors laid end to end in
    /// [`Params::tensors`] order, as pieces of the tensors they fall in (a data-parallel shard:
    /// the distributed optimizer splits the flat parameter space into contiguous ranges).
    pub fn flat_range(&self, range: Range<usize>) -> Vec<TensorRef<'_>> {
        let mut pieces = Vec::new();
        let mut offset = 0;
        for tensor in self.tensors() {
            let (start, end) = (offset, offset + tensor.data.len());
            offset = end;
            let (lo, hi) = (range.start.max(start), range.end.min(end));
            if lo < hi {
                pieces.push(TensorRef {
                    data: &tensor.data[lo - start..hi - start],
                    ..tensor
                });
            }
        }
        pieces
    }

    /// [`Params::flat_range`], mutably.
    pub fn flat_range_mut(&mut self, range: Range<usize>) -> Vec<TensorMut<'_>> {
        let mut pieces = Vec::new();
        let mut offset = 0;
        for tensor in self.tensors_mut() {
            let (start, end) = (offset, offset + tensor.data.len());
            offset = end;
            let (lo, hi) = (range.start.max(start), range.end.min(end));
            if lo < hi {
                pieces.push(TensorMut {
                    data: &mut tensor.data[lo - start..hi - start],
                    ..tensor
                });
            }
        }
        pieces
    }

    /// Adds `other` element-wise (gradient accumulation and data-parallel all-reduce).
    pub fn add_assign(&mut self, other: &Params) -> Result<()> {
        self.check_same_layout(other)?;
        for (mine, theirs) in self.tensors_mut().into_iter().zip(other.tensors()) {
            for (a, b) in mine.data.iter_mut().zip(theirs.data) {
                *a += b;
            }
        }
        Ok(())
    }

    /// Multiplies every value by `factor`.
    pub fn scale(&mut self, factor: f32) {
        for tensor in self.tensors_mut() {
            tensor.data.iter_mut().for_each(|value| *value *= factor);
        }
    }

    /// Splits the whole model into the tensors of each of `stages` (a partition of the layers, in
    /// order). With tied embeddings, the last stage gets a copy of the embedding as `output`.
    pub fn split(&self, stages: &[LayerRange]) -> Result<Vec<Params>> {
        if self.stage != LayerRange::whole(&self.config) {
            return Err(CpuError::InvalidStages {
                reason: format!(
                    "only the whole model can be split, not stage {}",
                    self.stage
                ),
            });
        }
        LayerRange::check_partition(stages)?;
        if stages[stages.len() - 1].layers().end != self.config.layers {
            return Err(CpuError::InvalidStages {
                reason: format!(
                    "stages of another model (this one has {} layers)",
                    self.config.layers
                ),
            });
        }
        let mut parts = Vec::with_capacity(stages.len());
        for &stage in stages {
            let mut part = Params::zeros(&self.config, stage);
            part.layers = self.layers[stage.layers()].to_vec();
            if stage.is_first() {
                part.embedding = self.embedding.clone();
            }
            if stage.is_last() {
                part.final_norm = self.final_norm.clone();
                if part.output.is_some() {
                    part.output = self.output.clone().or_else(|| self.embedding.clone());
                }
            }
            parts.push(part);
        }
        Ok(parts)
    }

    /// Joins the tensors of all stages (in order) into the whole model. With tied embeddings
    /// split across stages, the two copies must be bit-identical (for gradients: call
    /// [`sum_tied_grads`] first); the first stage's copy is kept.
    pub fn merge(parts: Vec<Params>) -> Result<Params> {
        let stages: Vec<LayerRange> = parts.iter().map(Params::stage).collect();
        LayerRange::check_partition(&stages)?;
        let config = parts[0].config;
        if parts.iter().any(|part| part.config != config) {
            return Err(CpuError::LayoutMismatch {
                reason: "stages of different models".to_string(),
            });
        }
        let mut whole = Params::zeros(&config, LayerRange::whole(&config));
        whole.layers.clear();
        let count = parts.len();
        for (index, part) in parts.into_iter().enumerate() {
            if index == 0 {
                whole.embedding = part.embedding;
            }
            whole.layers.extend(part.layers);
            if index + 1 == count {
                whole.final_norm = part.final_norm;
                if config.tied_embeddings && count > 1 {
                    if part.output != whole.embedding {
                        return Err(CpuError::LayoutMismatch {
                            reason: "the tied embedding's copies on the first and last stage \
                                     differ (sum the tied gradients before merging)"
                                .to_string(),
                        });
                    }
                } else {
                    whole.output = part.output;
                }
            }
        }
        Ok(whole)
    }

    /// The output projection this stage uses (`output`, or the embedding when tied on one stage).
    pub(crate) fn output_weight(&self) -> &[f32] {
        self.output
            .as_deref()
            .or(self.embedding.as_deref())
            .expect("bug: output projection asked of a stage that is not the last")
    }

    /// The final norm and the output projection, mutably (the head's gradients).
    pub(crate) fn head_mut(&mut self) -> (&mut [f32], &mut [f32]) {
        let final_norm = self
            .final_norm
            .as_deref_mut()
            .expect("bug: head asked of a stage that is not the last");
        let output = self
            .output
            .as_deref_mut()
            .or(self.embedding.as_deref_mut())
            .expect("bug: output projection asked of a stage that is not the last");
        (final_norm, output)
    }

    /// Fails unless `other` has the same model, stage and tensor sizes.
    pub(crate) fn check_same_layout(&self, other: &Params) -> Result<()> {
        if self.config != other.config {
            return Err(CpuError::LayoutMismatch {
                reason: "tensors of different models".to_string(),
            });
        }
        if self.stage != other.stage {
            return Err(CpuError::StageMismatch {
                expected: self.stage,
                got: other.stage,
            });
        }
        Ok(())
    }

    /// The stage's copy of a tied embedding that is split across stages: the embedding on the
    /// first stage, `output` on the last; `None` otherwise.
    pub(crate) fn tied_copy_mut(&mut self) -> Option<&mut Vec<f32>> {
        if !self.config.tied_embeddings || self.stage == LayerRange::whole(&self.config) {
            return None;
        }
        if self.stage.is_first() {
            self.embedding.as_mut()
        } else {
            self.output.as_mut()
        }
    }
}

/// Sums the gradients of the tied embedding's two copies (first stage's embedding, last stage's
/// output projection) and stores the sum in both: the pipeline's embedding all-reduce. Does
/// nothing for untied models and single-stage gradients (which accumulate both uses in one tensor).
pub fn sum_tied_grads(first: &mut Grads, last: &mut Grads) -> Result<()> {
    if !(first.stage.is_first() && last.stage.is_last()) {
        return Err(CpuError::InvalidStages {
            reason: format!(
                "tied gradients are summed between the first and last stage, got {} and {}",
                first.stage, last.stage
            ),
        });
    }
    let (Some(a), Some(b)) = (first.tied_copy_mut(), last.tied_copy_mut()) else {
        return Ok(());
    };
    for (x, y) in a.iter_mut().zip(b.iter_mut()) {
        *x += *y;
        *y = *x;
    }
    Ok(())
}

fn tensor_ref(name: String, kind: TensorKind, data: &[f32]) -> TensorRef<'_> {
    TensorRef { name, kind, data }
}

fn tensor_mut(name: String, kind: TensorKind, data: &mut [f32]) -> TensorMut<'_> {
    TensorMut { name, kind, data }
}

fn layer_fields(layer: &LayerParams) -> [(&'static str, TensorKind, &[f32]); 9] {
    use TensorKind::{Matrix, NormGain};
    [
        ("attn_norm", NormGain, &layer.attn_norm),
        ("wq", Matrix, &layer.wq),
        ("wk", Matrix, &layer.wk),
        ("wv", Matrix, &layer.wv),
        ("wo", Matrix, &layer.wo),
        ("mlp_norm", NormGain, &layer.mlp_norm),
        ("w_gate", Matrix, &layer.w_gate),
        ("w_up", Matrix, &layer.w_up),
        ("w_down", Matrix, &layer.w_down),
    ]
}

fn layer_fields_mut(layer: &mut LayerParams) -> [(&'static str, TensorKind, &mut [f32]); 9] {
    use TensorKind::{Matrix, NormGain};
    [
        ("attn_norm", NormGain, &mut layer.attn_norm),
        ("wq", Matrix, &mut layer.wq),
        ("wk", Matrix, &mut layer.wk),
        ("wv", Matrix, &mut layer.wv),
        ("wo", Matrix, &mut layer.wo),
        ("mlp_norm", NormGain, &mut layer.mlp_norm),
        ("w_gate", Matrix, &mut layer.w_gate),
        ("w_up", Matrix, &mut layer.w_up),
        ("w_down", Matrix, &mut layer.w_down),
    ]
}

/// The dimension a matrix contracts over, from its name.
fn fan_in(config: &ModelConfig, name: &str) -> usize {
    match name.rsplit('.').next() {
        Some("wo") => config.q_width(),
        Some("w_down") => config.ffn,
        _ => config.hidden,
    }
}
