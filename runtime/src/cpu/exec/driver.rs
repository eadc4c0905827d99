//! [`Driver`]: what calls a worker's ops on its thread — the runtime's interpreter, or a compiled
//! schedule driver (codegen's MLIR → LLVM IR, JIT-compiled) through its
//! `slimpack_run_device(index)` entry point. Either way every op arrives as a call through the
//! runtime's C ABI ([`crate::abi`]) and runs in the same worker method, so the two drivers run
//! the same step.

use slimpack_ir::program::Program;

use crate::abi;

/// A compiled driver's `slimpack_run_device(index)`.
#[derive(Debug, Clone, Copy)]
pub struct CompiledDriver {
    run_device: unsafe extern "C" fn(i64),
}

impl CompiledDriver {
    /// Wraps a compiled driver's entry point.
    ///
    /// # Safety
    /// `run_device` must be a compiled schedule driver's `slimpack_run_device`, stay callable
    /// while executions use this value, and be safe to call from any thread (the driver only
    /// calls the runtime's C ABI). It may be a driver of another program: each call is checked
    /// against the executed program's op, and a mismatch fails the step.
    pub unsafe fn new(run_device: unsafe extern "C" fn(i64)) -> CompiledDriver {
        CompiledDriver { run_device }
    }
}

/// How each worker's ops are driven.
#[derive(Debug, Clone, Copy)]
pub enum Driver {
    /// [`abi::interpret_worker`]: a Rust loop over the worker's ops.
    Interpreted,
    /// A compiled driver, called once per worker with the worker's index.
    Compiled(CompiledDriver),
}

impl Driver {
    /// Its name in reports: `interpreted` or `compiled`.
    pub fn name(&self) -> &'static str {
        match self {
            Driver::Interpreted => "interpreted",
            Driver::Compiled(_) => "compiled",
        }
    }

    /// Drives worker `index` of `program` on the calling thread (whose C ABI handler runs the
    /// ops).
    pub(crate) fn run_device(&self, program: &Program, index: usize) {
        match self {
            Driver::Interpreted => abi::interpret_worker(&program.workers[index]),
            // SAFETY: the contract of `CompiledDriver::new`; an index the driver does not know
            // runs nothing, which the worker reports.
            Driver::Compiled(compiled) => unsafe { (compiled.run_device)(index as i64) },
        }
    }
}
