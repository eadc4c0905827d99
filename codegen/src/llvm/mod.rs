//! The LLVM backend (feature `llvm`, inkwell): PTX kernels for the CUDA backend (with their table
//! and a host emulation that runs them on the CPU), and the host schedule driver compiled from
//! the MLIR backend's LLVM IR (JIT or object file).

pub mod driver;
pub mod kernels;
pub mod ptx;
