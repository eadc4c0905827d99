//! slimpack-runtime: executors of compiled schedules.
//!
//! - [`cpu`]: a real training step of a small Llama-style model on the CPU.
//! - [`cuda`]: the same step on NVIDIA GPUs (cargo feature `cuda`; without it, the same functions
//!   say the build has no CUDA backend).

pub mod abi;
pub mod cpu;
pub mod cuda;
