//! The LLVM backend (feature `llvm`, inkwell): PTX kernels for the CUDA backend, and the host
//! schedule driver compiled from the MLIR backend's LLVM IR (JIT or object file).

pub mod driver;
pub mod kernels;
pub mod ptx;
