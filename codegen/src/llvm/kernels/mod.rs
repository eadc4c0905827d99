//! The GPU kernels the CUDA backend needs, built as NVPTX LLVM IR with inkwell, fp32, and the
//! same kernels built for the host to check them on a machine without a GPU.
//!
//! Why LLVM's NVPTX target and not MLIR's gpu dialect (`gpu-module-to-binary{format=isa}`):
//! the gpu dialect's lowering of `math.exp`/`math.log` goes through libdevice, which ships with
//! the CUDA toolkit and is absent here; building the kernels directly lets them call the PTX
//! `ex2.approx`/`lg2.approx` instructions and keeps PTX generation free of the `mlir` feature.
//!
//! [`KERNELS`] is the one table of every kernel: its `.visible .entry` name in the PTX, its
//! parameters in order and its launch geometry ([`spec`]); the builder declares each kernel from
//! its entry here. Each family's file documents its buffer contract:
//! [`rmsnorm`], [`rope`], [`swiglu`], [`cross_entropy`], [`elementwise`], [`attention`].
//! [`host`] runs the host build of the same kernels (the grid turned into loops over blocks and
//! threads), which the tests compare with the CPU backend's ops.

pub mod attention;
mod builder;
pub mod cross_entropy;
pub mod elementwise;
pub mod host;
pub mod rmsnorm;
pub mod rope;
pub mod spec;
pub mod swiglu;

use inkwell::context::Context;
use inkwell::module::Module;

pub(crate) use builder::Target;
pub use spec::{Grid, Items, KernelSpec, LaunchShape, Param, ParamKind};

use crate::CodegenError;

/// Every kernel, in the order they are built (and appear in the PTX).
pub const KERNELS: &[KernelSpec] = &[
    rmsnorm::FORWARD,
    rmsnorm::BACKWARD,
    rmsnorm::BACKWARD_GAIN,
    rope::FORWARD,
    rope::BACKWARD,
    swiglu::FORWARD,
    swiglu::BACKWARD,
    cross_entropy::SOFTMAX_XENT,
    elementwise::ADD,
    elementwise::SCALE,
    attention::FORWARD,
    attention::BACKWARD_DQ,
    attention::BACKWARD_DKV,
];

/// The spec of kernel `name`, if there is one.
pub fn kernel(name: &str) -> Option<&'static KernelSpec> {
    KERNELS.iter().find(|spec| spec.name == name)
}

/// Adds every kernel of [`KERNELS`] to `module` (an empty module for `target`).
pub(crate) fn build_all<'ctx>(
    context: &'ctx Context,
    module: &Module<'ctx>,
    target: Target,
) -> Result<(), CodegenError> {
    rmsnorm::build(context, module, target)?;
    rope::build(context, module, target)?;
    swiglu::build(context, module, target)?;
    cross_entropy::build(context, module, target)?;
    elementwise::build(context, module, target)?;
    attention::build(context, module, target)
}
