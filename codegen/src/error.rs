//! The codegen crate's one error type.

use thiserror::Error;

/// What can go wrong while emitting or compiling a schedule.
#[derive(Debug, Error)]
pub enum CodegenError {
    /// LLVM rejected something (building, verifying, optimising or emitting a module).
    #[error("LLVM {stage}: {message}")]
    Llvm {
        stage: &'static str,
        message: String,
    },
    /// A kernel launch of the host emulation was malformed (unknown kernel, wrong arguments or
    /// launch shape).
    #[error("kernel {kernel}: {message}")]
    KernelLaunch { kernel: String, message: String },
    /// MLIR rejected something (parsing, verifying, running passes, translating).
    #[error("MLIR {stage}: {message}")]
    Mlir {
        stage: &'static str,
        message: String,
    },
}
