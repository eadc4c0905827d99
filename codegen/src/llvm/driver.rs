//! The host schedule driver: the LLVM IR that the MLIR backend lowers a program to (`--emit
//! llvm`), verified and compiled by LLVM for this machine — run at once through a JIT, or written
//! as an object file to link into a runtime.
//!
//! The driver calls the runtime's C ABI (`slimpack_rt_*`); [`run_step`] resolves those calls to
//! the addresses its caller passes (the runtime's `abi::symbols()`), so codegen needs no
//! dependency on the runtime. Entry points: `slimpack_run_step()` (every device in worker order,
//! [`run_step`]) and `slimpack_run_device(index)` ([`with_run_device`], which a runtime calls on
//! each worker's thread).

use std::path::Path;

use inkwell::context::Context;
use inkwell::memory_buffer::MemoryBuffer;
use inkwell::module::Module;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine,
};
use inkwell::OptimizationLevel;

use crate::CodegenError;

fn llvm_error(stage: &'static str, message: impl ToString) -> CodegenError {
    CodegenError::Llvm {
        stage,
        message: message.to_string(),
    }
}

/// Parses `llvm_ir` and runs LLVM's module verifier on it.
pub fn parse_and_verify<'ctx>(
    context: &'ctx Context,
    llvm_ir: &str,
) -> Result<Module<'ctx>, CodegenError> {
    let buffer = MemoryBuffer::create_from_memory_range_copy(llvm_ir.as_bytes(), "driver");
    let module = context
        .create_module_from_ir(buffer)
        .map_err(|e| llvm_error("driver parsing", e))?;
    module
        .verify()
        .map_err(|e| llvm_error("driver verification", e))?;
    Ok(module)
}

/// Compiles the driver with a JIT and calls `slimpack_run_step()` once; `runtime_symbols` maps
/// each `slimpack_rt_*` function the driver declares to its address.
pub fn run_step(llvm_ir: &str, runtime_symbols: &[(&str, usize)]) -> Result<(), CodegenError> {
    with_entry(llvm_ir, runtime_symbols, "slimpack_run_step", |address| {
        // SAFETY: the driver's `slimpack_run_step` takes no arguments and returns nothing (the
        // lowering writes it so), and every function it calls is mapped.
        let step: unsafe extern "C" fn() = unsafe { std::mem::transmute(address) };
        unsafe { step() }
    })
}

/// Compiles the driver with a JIT and hands `body` its `slimpack_run_device(index)` entry
/// point, which stays valid while `body` runs: a runtime calls it on each worker's thread (the
/// compiled code only calls the C ABI functions of `runtime_symbols`, so any thread may).
pub fn with_run_device<R>(
    llvm_ir: &str,
    runtime_symbols: &[(&str, usize)],
    body: impl FnOnce(unsafe extern "C" fn(i64)) -> R,
) -> Result<R, CodegenError> {
    with_entry(llvm_ir, runtime_symbols, "slimpack_run_device", |address| {
        // SAFETY: the lowering writes `slimpack_run_device(index)`; `index` is an i64 on the
        // 64-bit hosts LLVM's JIT runs on here.
        let run_device: unsafe extern "C" fn(i64) = unsafe { std::mem::transmute(address) };
        body(run_device)
    })
}

/// JIT-compiles the driver, maps its runtime calls to `runtime_symbols`, and runs `body` with
/// the address of its function `entry` while the compiled code lives.
fn with_entry<R>(
    llvm_ir: &str,
    runtime_symbols: &[(&str, usize)],
    entry: &str,
    body: impl FnOnce(usize) -> R,
) -> Result<R, CodegenError> {
    Target::initialize_native(&InitializationConfig::default())
        .map_err(|e| llvm_error("native target", e))?;
    let context = Context::create();
    let module = parse_and_verify(&context, llvm_ir)?;
    let engine = module
        .create_jit_execution_engine(OptimizationLevel::Default)
        .map_err(|e| llvm_error("JIT", e))?;
    for function in module.get_functions() {
        if function.count_basic_blocks() > 0 {
            continue;
        }
        let name = function.get_name().to_string_lossy().into_owned();
        let address = runtime_symbols
            .iter()
            .find(|(symbol, _)| *symbol == name)
            .map(|&(_, address)| address)
            .ok_or_else(|| llvm_error("JIT", format!("no address given for {name}")))?;
        engine.add_global_mapping(&function, address);
    }
    let address = engine
        .get_function_address(entry)
        .map_err(|e| llvm_error("JIT", format!("{entry}: {e}")))?;
    Ok(body(address))
}

/// A target machine for this host (position-independent, so the object links into anything).
pub(crate) fn host_machine() -> Result<TargetMachine, CodegenError> {
    Target::initialize_native(&InitializationConfig::default())
        .map_err(|e| llvm_error("native target", e))?;
    let triple = TargetMachine::get_default_triple();
    let target = Target::from_triple(&triple).map_err(|e| llvm_error("host target", e))?;
    target
        .create_target_machine(
            &triple,
            &TargetMachine::get_host_cpu_name().to_string(),
            &TargetMachine::get_host_cpu_features().to_string(),
            OptimizationLevel::Default,
            RelocMode::PIC,
            CodeModel::Default,
        )
        .ok_or_else(|| llvm_error("host target", "no target machine for this host"))
}

/// Compiles the driver to a native object file at `path`.
pub fn write_object(llvm_ir: &str, path: &Path) -> Result<(), CodegenError> {
    let machine = host_machine()?;
    let context = Context::create();
    let module = parse_and_verify(&context, llvm_ir)?;
    module.set_triple(&machine.get_triple());
    module.set_data_layout(&machine.get_target_data().get_data_layout());
    machine
        .write_to_file(&module, FileType::Object, path)
        .map_err(|e| llvm_error("object emission", e))
}
