//! The CPU backend's error type.
//!
//! Every variant is a mistake of the caller (a model the backend cannot run, a batch with bad
//! tokens, a schedule that breaks the slice order, tensors of the wrong stage or shape) and renders
//! as one line naming what was wrong. Broken internal invariants panic instead, saying it is a bug.

use slimpack_ir::spec::Dtype;

use super::batch::TokenSlice;
use super::stage::LayerRange;

/// Errors of the CPU backend.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    /// The model spec itself is invalid.
    #[error(transparent)]
    Spec(#[from] slimpack_ir::IrError),
    /// The CPU backend computes in fp32 only, so that its memory matches what the simulator predicts.
    #[error("model '{model}': the CPU backend runs fp32 models only, got {dtype}", dtype = dtype.as_str())]
    UnsupportedDtype { model: String, dtype: Dtype },
    /// The model shape is valid but cannot be run by the CPU backend.
    #[error("model '{model}': {reason}")]
    UnsupportedModel { model: String, reason: String },
    /// A sample has no tokens.
    #[error("sample {sample} is empty")]
    EmptySample { sample: usize },
    /// A token id is not in the vocabulary.
    #[error(
        "sample {sample}, position {position}: token {token} is outside the vocabulary of {vocab}"
    )]
    TokenOutOfVocab {
        sample: usize,
        position: usize,
        token: u32,
        vocab: usize,
    },
    /// A slice names a sample that is not in the batch, is empty, or runs past its sample's end.
    #[error("slice {slice} does not fit its sample (batch of {samples} samples, sample length {sample_len})")]
    SliceOutOfRange {
        slice: TokenSlice,
        samples: usize,
        sample_len: usize,
    },
    /// A forward pack skips or repeats tokens of a sample: slices are forwarded in increasing order.
    #[error("forward of slice {slice} out of order: the next slice of its sample starts at {expected_start}")]
    ForwardOutOfOrder {
        slice: TokenSlice,
        expected_start: usize,
    },
    /// A sample was forwarded again after its backward finished.
    #[error("forward of slice {slice}: its sample already finished its backward in this step")]
    SampleRetired { slice: TokenSlice },
    /// A backward pack runs before every slice of the sample was forwarded on this stage.
    #[error("backward of slice {slice} before its sample was fully forwarded ({forwarded} of {sample_len} tokens)")]
    BackwardBeforeForward {
        slice: TokenSlice,
        forwarded: usize,
        sample_len: usize,
    },
    /// A backward pack breaks the decreasing slice order of a sample.
    #[error("backward of slice {slice} out of order: the next slice of its sample must end at {expected_end}")]
    BackwardOutOfOrder {
        slice: TokenSlice,
        expected_end: usize,
    },
    /// A backward pack names a slice whose forward (with exactly these bounds) did not run here.
    #[error("backward of slice {slice}: no forward of this slice is pending on this stage")]
    NotForwarded { slice: TokenSlice },
    /// A padded pack cannot run: its padding does not match a forward pack's.
    #[error("padded pack: {reason}")]
    Padding { reason: String },
    /// The per-slice tensors given to a pack do not match its slices.
    #[error("{what}: expected {expected}, got {got}")]
    PackInput {
        what: String,
        expected: usize,
        got: usize,
    },
    /// Parameters or gradients of one stage were handed to another stage's worker.
    #[error("tensors of stage {got} given to the worker of stage {expected}")]
    StageMismatch {
        expected: LayerRange,
        got: LayerRange,
    },
    /// A list of stages does not partition the model's layers, or a stage range is invalid.
    #[error("invalid pipeline stages: {reason}")]
    InvalidStages { reason: String },
    /// A context-parallel exchange failed: another worker of the group stopped.
    #[error("context-parallel exchange aborted: {reason}")]
    ExchangeAborted { reason: String },
    /// The executor was given a step IR that is not scheduled yet.
    #[error("the CPU executor runs scheduled step IR, got phase '{phase}' (run a pipeline that ends in schedule-pipeline)")]
    NotScheduled { phase: String },
    /// The executor runs data and pipeline parallelism with DP-Merge, without TP, static CP or
    /// model chunks (interleaved pipelines are simulated and emitted, not executed).
    #[error("the CPU executor runs layouts with tp=1, no static cp and vpp=1, got {layout}")]
    UnsupportedLayout { layout: String },
    /// The step's schedule cannot be executed as given.
    #[error("schedule: {message}")]
    Schedule { message: String },
    /// A worker of the executor failed; the step was abandoned.
    #[error("worker {worker}: {message}")]
    WorkerFailed { worker: String, message: String },
    /// Two tensor sets that must have the same layout differ.
    #[error("tensor layouts differ: {reason}")]
    LayoutMismatch { reason: String },
}

/// Result type of the CPU backend.
pub type Result<T, E = CpuError> = std::result::Result<T, E>;
