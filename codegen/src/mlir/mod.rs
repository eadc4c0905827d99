//! The MLIR backend (feature `mlir`, melior): the `slimpack` dialect and its way down to LLVM IR.
//!
//! Phases, each a plain function whose output MLIR verifies:
//! 1. [`print_dialect`]: `Program` -> `slimpack` dialect (`--emit mlir`), checked against the
//!    dialect's IRDL definition ([`SLIMPACK_IRDL`], shipped as `codegen/dialect/`);
//! 2. [`lower_to_runtime_calls`]: `slimpack` -> `func`/`scf`/`llvm` calls into the runtime's
//!    C ABI;
//! 3. [`convert_to_llvm_dialect`] then [`translate_to_llvm_ir`]: LLVM IR (`--emit llvm`), which
//!    the `llvm` feature compiles into a host driver.

mod context;
mod lower;
mod print;
mod translate;

pub use context::{MlirContext, SLIMPACK_IRDL};
pub use lower::lower_to_runtime_calls;
pub use print::{print_dialect, DIALECT_VERSION};
pub use translate::{convert_to_llvm_dialect, translate_to_llvm_ir, TO_LLVM_DIALECT};

use slimpack_ir::program::Program;

use crate::CodegenError;

/// The dialect and the C ABI it lowers to carry one model chunk per device: an interleaved
/// program (`vpp > 1`) is refused rather than emitted without its chunks.
fn one_chunk(program: &Program) -> Result<(), CodegenError> {
    if program.vpp > 1 {
        return Err(CodegenError::Unsupported {
            backend: "MLIR",
            message: format!(
                "the slimpack dialect and the runtime's C ABI run one model chunk per device; this program interleaves vpp={} (emit ir or json instead)",
                program.vpp
            ),
        });
    }
    Ok(())
}

/// `--emit mlir`: the program in the `slimpack` dialect, verified.
pub fn emit_mlir(program: &Program) -> Result<String, CodegenError> {
    one_chunk(program)?;
    let text = print_dialect(program);
    let context = MlirContext::new()?;
    context.parse(&text, "slimpack dialect")?;
    Ok(text)
}

/// The program lowered to `func`/`scf`/`llvm` (verified), before conversion to the `llvm`
/// dialect.
pub fn emit_lowered(program: &Program) -> Result<String, CodegenError> {
    one_chunk(program)?;
    let context = MlirContext::new()?;
    let schedule = context.parse(&print_dialect(program), "slimpack dialect")?;
    let lowered = lower_to_runtime_calls(&schedule)?;
    context.parse(&lowered, "lowered module")?;
    Ok(lowered)
}

/// `--emit llvm`: the program's driver as LLVM IR.
pub fn emit_llvm_ir(program: &Program) -> Result<String, CodegenError> {
    one_chunk(program)?;
    let context = MlirContext::new()?;
    let schedule = context.parse(&print_dialect(program), "slimpack dialect")?;
    let lowered = lower_to_runtime_calls(&schedule)?;
    let mut module = context.parse(&lowered, "lowered module")?;
    convert_to_llvm_dialect(&context, &mut module)?;
    translate_to_llvm_ir(&module)
}
