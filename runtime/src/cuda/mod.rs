//! The CUDA backend: the same training step as [`crate::cpu`], on NVIDIA GPUs, through cudarc
//! (driver, cuBLAS, NVRTC and NCCL, all loaded at run time: the build needs no CUDA toolkit).
//!
//! # What runs where
//! - One worker per GPU: a DP rank on a pipeline stage, exactly the CPU executor's worker, on
//!   its own thread with its own CUDA context and **one stream** for everything it computes. It
//!   runs its op list of the step's lowered program, called through the runtime's C ABI
//!   ([`crate::abi`]) by the same [`Driver`](crate::cpu::exec::Driver) as the CPU backend (the
//!   interpreter, or the program compiled through MLIR and LLVM to native code).
//! - Backend-independent pieces are the CPU executor's, not copies: the [`Plan`], the lowered
//!   program and its check against the plan, the op-by-op check of every C ABI call
//!   ([`crate::cpu::exec::ProgramCursor`]), the pack layouts (rows, positions, targets, slice
//!   orders), the assembly of the workers' outcomes into an [`Execution`], and the reference
//!   check. What differs is where tensors live and which kernels run.
//! - Device memory ([`memory`]): the stage's parameters, gradients and AdamW moments (ZeRO-1:
//!   the moments of this rank's shard), the K/V cache of the samples in flight (grown slice by
//!   slice, their gradient accumulators from the sample's first backward), the activations each
//!   forward pack saves for its backward, and every temporary — all counted by the worker's
//!   meter, which gives its peak memory as the CPU backend's counting allocator does.
//! - Kernels ([`kernels`]): GEMMs in cuBLAS (fp32 or bf16, row-major through the transposition trick);
//!   RMSNorm, RoPE, SwiGLU, softmax cross-entropy (with the loss scale), add and the varlen causal attention
//!   forward and backward (a K/V prefix per continuation slice, dK/dV accumulated) from the PTX
//!   that codegen's kernel builder emits; AdamW from a small CUDA C kernel compiled by NVRTC.
//! - Several GPUs ([`nccl`]): pipeline send/receive as NCCL point-to-point on a stream per
//!   direction (a forward send and a backward send between the same two stages never wait for
//!   each other), the DP gradient sum (all-reduce), the tied embedding's sum between the
//!   pipeline's ends, the broadcast of each rank's updated shard, and the K/V all-gathers of
//!   DP-Merge groups (context parallelism: each member holds its `CpShard` of every slice;
//!   [`cp_rows`] says which rows carry which positions).
//! - Padded packs (the `padding` and `megatron` strategies' fixed-length bins) run as on the
//!   CPU backend (`cpu/padding.rs`): see [`stage`].
//! - GEMM precision ([`Precision`]): fp32 SGEMM by default; bf16 operands with fp32
//!   accumulation (`cublasGemmEx`) on compute capability 8.0 and later.
//!
//! # Dependency direction
//! The runtime does not depend on codegen (codegen dev-depends on the runtime, for its driver
//! tests). The PTX therefore comes in as data: the caller (the `slimpack` CLI, with the `cuda`
//! feature, which also turns on `llvm`) builds it with `slimpack_codegen::llvm::ptx` for the
//! GPU's architecture and hands the text and its kernel names over as a [`KernelSource`]; the
//! backend checks that every kernel it launches is there before it starts.
//!
//! # Without CUDA
//! Built without the `cuda` feature, this module has the same functions and each returns
//! [`CudaError::NotCompiled`]. Built with it, [`gpus`] first asks whether the driver library can
//! be loaded at all (cudarc panics on the first driver call otherwise), then how many devices it
//! sees: [`CudaError::NoDriver`] and [`CudaError::NoDevice`] are the two answers of a machine
//! without a GPU.

mod error;
mod precision;

pub use error::{CudaError, Result};
pub use precision::{f32_to_bf16_bits, operand_extent, Precision};

#[cfg(feature = "cuda")]
mod blas;
#[cfg(feature = "cuda")]
mod calibration;
#[cfg(feature = "cuda")]
mod cp_rows;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod exec;
#[cfg(feature = "cuda")]
mod kernels;
#[cfg(feature = "cuda")]
mod memory;
#[cfg(feature = "cuda")]
mod nccl;
#[cfg(feature = "cuda")]
mod stage;
#[cfg(feature = "cuda")]
mod tensors;

#[cfg(feature = "cuda")]
pub use calibration::measure as calibrate;
#[cfg(feature = "cuda")]
pub use device::gpus;
#[cfg(feature = "cuda")]
pub use exec::execute_program;
#[cfg(feature = "cuda")]
pub use kernels::check_launchers;

#[cfg(not(feature = "cuda"))]
mod unavailable;
#[cfg(not(feature = "cuda"))]
pub use unavailable::{calibrate, execute_program, gpus};

#[cfg(test)]
mod tests;

/// Whether this build has the CUDA backend (the `cuda` cargo feature).
pub const BUILT: bool = cfg!(feature = "cuda");

/// The GPU kernels as codegen emitted them: PTX assembly and the table of its kernels (the
/// caller copies `slimpack_codegen::llvm::kernels::KERNELS` into it).
#[derive(Debug, Clone)]
pub struct KernelSource {
    pub ptx: String,
    pub kernels: Vec<KernelSignature>,
}

/// One kernel of a [`KernelSource`]: its entry point, its parameters in order, its geometry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSignature {
    pub name: String,
    pub params: Vec<(String, ParamKind)>,
    pub grid: KernelGrid,
}

/// A kernel parameter's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    /// A device `float*`.
    F32Ptr,
    /// A device `int32_t*`.
    I32Ptr,
    /// An `int64_t` count.
    I64,
    /// A `float` scalar.
    F32,
}

/// How a kernel's work maps onto a 1-D grid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelGrid {
    /// One block per row (the value of parameter `rows`), a warp-multiple of threads that
    /// cooperate in block reductions.
    BlockPerRow { rows: String },
    /// A grid-stride loop over the product of the named integer parameters, over `divisor`,
    /// work items: any grid and block.
    GridStride { items: Vec<String>, divisor: u64 },
}

/// One GPU the driver reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    /// `(major, minor)`, e.g. `(9, 0)` for Hopper.
    pub compute_capability: (u32, u32),
    pub memory_bytes: u64,
}

/// Every kernel the backend launches from codegen's PTX.
pub const REQUIRED_KERNELS: &[&str] = &[
    "slimpack_rmsnorm_fwd",
    "slimpack_rmsnorm_bwd",
    "slimpack_rmsnorm_bwd_gain",
    "slimpack_rope_fwd",
    "slimpack_rope_bwd",
    "slimpack_swiglu_fwd",
    "slimpack_swiglu_bwd",
    "slimpack_softmax_xent",
    "slimpack_add",
    "slimpack_attention_fwd",
    "slimpack_attention_bwd_dq",
    "slimpack_attention_bwd_dkv",
];

impl KernelSource {
    /// Fails unless every kernel in [`REQUIRED_KERNELS`] is in the table.
    pub fn check(&self) -> Result<()> {
        match REQUIRED_KERNELS
            .iter()
            .find(|&&name| self.signature(name).is_none())
        {
            Some(name) => Err(CudaError::MissingKernel {
                name: name.to_string(),
            }),
            None => Ok(()),
        }
    }

    /// The table's entry for kernel `name`.
    pub fn signature(&self, name: &str) -> Option<&KernelSignature> {
        self.kernels.iter().find(|k| k.name == name)
    }
}
