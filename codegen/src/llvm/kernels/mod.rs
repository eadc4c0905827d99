//! The GPU kernels the CUDA backend needs, built as NVPTX LLVM IR with inkwell, fp32.
//!
//! Why LLVM's NVPTX target and not MLIR's gpu dialect (`gpu-module-to-binary{format=isa}`):
//! the gpu dialect's lowering of `math.exp`/`math.log` goes through libdevice, which ships with
//! the CUDA toolkit and is absent here; building the kernels directly lets them call the PTX
//! `ex2.approx`/`lg2.approx` instructions and keeps PTX generation free of the `mlir` feature.
//! Each file holds one kernel family and documents its launch shape and buffer contract; the
//! names below are the `.visible .entry` symbols of the emitted PTX.

mod builder;
mod cross_entropy;
mod elementwise;
mod rmsnorm;
mod rope;
mod swiglu;

use inkwell::context::Context;
use inkwell::module::Module;

use crate::CodegenError;

/// Every kernel's entry point name, in the order they are built.
pub const KERNEL_NAMES: &[&str] = &[
    "slimpack_rmsnorm_fwd",
    "slimpack_rmsnorm_bwd",
    "slimpack_rmsnorm_bwd_gain",
    "slimpack_rope_fwd",
    "slimpack_rope_bwd",
    "slimpack_swiglu_fwd",
    "slimpack_swiglu_bwd",
    "slimpack_softmax_xent",
    "slimpack_add",
    "slimpack_scale",
];

/// Adds every kernel to `module` (an empty NVPTX module).
pub(crate) fn build_all<'ctx>(
    context: &'ctx Context,
    module: &Module<'ctx>,
) -> Result<(), CodegenError> {
    rmsnorm::build(context, module)?;
    rope::build(context, module)?;
    swiglu::build(context, module)?;
    cross_entropy::build(context, module)?;
    elementwise::build(context, module)
}
