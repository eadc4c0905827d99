//! slimpack: a compiler for variable-length LLM training steps.
//!
//! This facade ties the crates together: [`ir`] (specs, batches, the step IR, its text form and
//! verifier), [`machine`] (the cost model and the simulator), [`passes`] (passes, pipelines, the pass manager), [`codegen`] (emitters) and
//! [`runtime`] (executors). [`compile()`] is the library entry point a trainer or another compiler
//! embeds; the `slimpack` binary is a thin command line over it.

pub mod compile;
pub mod fuzz;
pub mod gpu;
pub mod limits;
pub mod measure;
pub mod plan;
pub mod tune;

pub use compile::{compile, CompileOptions, Compiled};
pub use slimpack_codegen as codegen;
pub use slimpack_ir as ir;
pub use slimpack_machine as machine;
pub use slimpack_passes as passes;
pub use slimpack_runtime as runtime;
