//! `padding`: no packing — one sample per micro-batch, padded to the longest sample of the
//! global batch.
//!
//! Source: the trainer without sequence packing, e.g. the HF Transformers `Trainer` with a
//! `DistributedSampler`, micro-batch size 1 and a padding collator, or Megatron-LM without
//! packed sequences: every micro-batch has the same static shape, so every sample runs padded to
//! the longest one of the step. The padding tokens are computed (GEMMs and element-wise kernels
//! run on the padded shape; attention runs the padded causal sequence) but carry no sample.
//!
//! Deviations: a collator pads to the longest sample of its micro-batch, which with one sample
//! per micro-batch would be no padding at all; the step-wide length is the static-shape variant
//! the issue asks for (`padding="max_length"`, CUDA graphs, compiled shapes).

/// The length every micro-batch is padded to: the longest sample (at least 1).
pub fn padded_length(lengths: &[u32]) -> u32 {
    lengths.iter().copied().max().unwrap_or(1).max(1)
}
