//! slimpack-codegen: what slimpack emits from a lowered program.
//!
//! - [`schedule_json`]: the schedule JSON for trainers (`compile --emit json`, version 3: Megatron
//!   `PackedSeqParams`, K/V prefixes, CP split, sub-batches, per-rank ops, a table of the rank
//!   groups collectives use), its JSON Schema, and reading it back into the step IR.
//! - [`mlir`] (feature `mlir`): the `slimpack` MLIR dialect, its lowering to `func`/`scf`/`llvm`
//!   calls into the runtime's C ABI, and translation to LLVM IR.
//! - [`llvm`] (feature `llvm`): the GPU kernels as PTX, and the host schedule driver (JIT or
//!   object file).
//!
//! The default build has neither and needs no LLVM.

mod error;
#[cfg(feature = "llvm")]
pub mod llvm;
#[cfg(feature = "mlir")]
pub mod mlir;
pub mod schedule_json;

pub use error::CodegenError;
