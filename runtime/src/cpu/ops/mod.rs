//! Numerical building blocks, each with its forward and its hand-written backward.
//!
//! All tensors are row-major fp32 with one row per token. Backward functions accumulate (`+=`)
//! into weight gradients, because a step sums them over many packs; gradients with respect to
//! activations are written (`=`), unless a function says otherwise.

pub(crate) mod cross_entropy;
pub(crate) mod embedding;
pub(crate) mod exp;
pub(crate) mod gemm;
pub(crate) mod linear;
pub(crate) mod rmsnorm;
pub(crate) mod rope;
pub(crate) mod swiglu;
