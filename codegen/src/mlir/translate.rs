//! From the lowered `func`/`scf`/`llvm` module to LLVM IR: the conversion passes to the `llvm`
//! dialect (run by melior's pass manager, verifying after each), then MLIR's LLVM IR export.

use std::ffi::CStr;

use melior::ir::Module;
use melior::pass::PassManager;
use melior::utility::parse_pass_pipeline;

use super::MlirContext;
use crate::CodegenError;

/// The conversion pipeline, as `mlir-opt-22 --pass-pipeline=` reads it.
pub const TO_LLVM_DIALECT: &str = "builtin.module(convert-scf-to-cf,convert-arith-to-llvm,\
convert-cf-to-llvm,convert-func-to-llvm,reconcile-unrealized-casts)";

unsafe extern "C" {
    /// MLIR's C API (mlir-c/Target/LLVMIR.h); mlir-sys does not bind it. Returns a malloc'ed
    /// string, or null on failure.
    fn mlirTranslateModuleToLLVMIRToString(
        module: mlir_sys::MlirOperation,
    ) -> *mut std::os::raw::c_char;
}

fn mlir_error(stage: &'static str, message: impl Into<String>) -> CodegenError {
    CodegenError::Mlir {
        stage,
        message: message.into(),
    }
}

/// Converts `module` to the `llvm` dialect in place.
pub fn convert_to_llvm_dialect(
    context: &MlirContext,
    module: &mut Module,
) -> Result<(), CodegenError> {
    let manager = PassManager::new(&context.context);
    manager.enable_verifier(true);
    parse_pass_pipeline(manager.as_operation_pass_manager(), TO_LLVM_DIALECT)
        .map_err(|e| mlir_error("pass pipeline", e.to_string()))?;
    manager
        .run(module)
        .map_err(|e| mlir_error("conversion to the llvm dialect", e.to_string()))
}

/// Translates an `llvm`-dialect module to LLVM IR text.
pub fn translate_to_llvm_ir(module: &Module) -> Result<String, CodegenError> {
    // SAFETY: the operation is a live module; the returned string is owned by us and freed with
    // LLVMDisposeMessage (free), as the C API documents.
    unsafe {
        let raw = mlirTranslateModuleToLLVMIRToString(module.as_operation().to_raw());
        if raw.is_null() {
            return Err(mlir_error(
                "translation to LLVM IR",
                "MLIR refused the module",
            ));
        }
        let text = CStr::from_ptr(raw).to_string_lossy().into_owned();
        mlir_sys::LLVMDisposeMessage(raw);
        Ok(text)
    }
}
