//! An MLIR context with every upstream dialect, the LLVM IR translations and the `slimpack`
//! dialect (loaded from its IRDL definition), and parsing that reports MLIR's diagnostics.

use std::cell::RefCell;
use std::rc::Rc;

use melior::dialect::DialectRegistry;
use melior::ir::operation::OperationLike;
use melior::ir::Module;
use melior::utility::{
    load_irdl_dialects, register_all_dialects, register_all_llvm_translations, register_all_passes,
};
use melior::Context;

use crate::CodegenError;

/// The dialect's IRDL definition, as shipped for `mlir-opt-22 --irdl-file=`.
pub const SLIMPACK_IRDL: &str = include_str!("../../dialect/slimpack.irdl.mlir");

/// A context ready for slimpack's modules.
pub struct MlirContext {
    pub context: Context,
    diagnostics: Rc<RefCell<Vec<String>>>,
}

fn mlir_error(stage: &'static str, message: impl Into<String>) -> CodegenError {
    CodegenError::Mlir {
        stage,
        message: message.into(),
    }
}

impl MlirContext {
    pub fn new() -> Result<Self, CodegenError> {
        let registry = DialectRegistry::new();
        register_all_dialects(&registry);
        register_all_passes();
        let context = Context::new();
        context.append_dialect_registry(&registry);
        context.load_all_available_dialects();
        register_all_llvm_translations(&context);
        let diagnostics = Rc::new(RefCell::new(Vec::new()));
        let sink = Rc::clone(&diagnostics);
        context.attach_diagnostic_handler(move |diagnostic| {
            sink.borrow_mut().push(diagnostic.to_string());
            true
        });
        let session = MlirContext {
            context,
            diagnostics,
        };
        session.load_slimpack_dialect()?;
        Ok(session)
    }

    /// Registers the dialect from its IRDL definition. The definition module is dropped after
    /// loading: the dynamic dialect keeps its own copy of the constraints.
    fn load_slimpack_dialect(&self) -> Result<(), CodegenError> {
        let irdl = self.parse(SLIMPACK_IRDL, "dialect definition")?;
        if !load_irdl_dialects(&irdl) {
            return Err(mlir_error("dialect definition", self.take_diagnostics()));
        }
        Ok(())
    }

    /// What MLIR reported since the last call, one message per line.
    pub fn take_diagnostics(&self) -> String {
        self.diagnostics
            .borrow_mut()
            .drain(..)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Parses and verifies `source`.
    pub fn parse(&self, source: &str, stage: &'static str) -> Result<Module<'_>, CodegenError> {
        let module = Module::parse(&self.context, source)
            .ok_or_else(|| mlir_error(stage, self.take_diagnostics()))?;
        if !module.as_operation().verify() {
            return Err(mlir_error(stage, self.take_diagnostics()));
        }
        Ok(module)
    }
}
