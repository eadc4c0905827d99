//! slimpack-runtime: executors of compiled schedules.
//!
//! - [`cpu`]: a real training step of a small Llama-style model on the CPU.

pub mod abi;
pub mod cpu;
