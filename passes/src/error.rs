//! The one error type of `slimpack-passes`.

use slimpack_ir::step::Phase;
use slimpack_ir::IrError;

/// Errors of pipelines and passes; each renders as one line.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// A pipeline string does not parse.
    #[error("--passes '{pipeline}': column {column}: {message}")]
    PipelineSyntax {
        pipeline: String,
        column: usize,
        message: String,
    },
    #[error("unknown pass '{name}' (valid: {valid})")]
    UnknownPass { name: String, valid: String },
    #[error("unknown option '{option}' of pass '{pass}' (valid: {valid})")]
    UnknownOption {
        pass: &'static str,
        option: String,
        valid: String,
    },
    #[error("pass '{pass}': option {option}={value}: {message}")]
    BadOption {
        pass: &'static str,
        option: String,
        value: String,
        message: String,
    },
    #[error("pass '{pass}' needs option '{option}' ({help})")]
    MissingOption {
        pass: &'static str,
        option: &'static str,
        help: &'static str,
    },
    /// A pass was asked to run on an IR at a phase it does not accept.
    #[error("pass '{pass}' cannot run at phase '{phase}' (it accepts {accepts})")]
    Phase {
        pass: &'static str,
        phase: Phase,
        accepts: String,
    },
    /// A pass failed (infeasible input, for example).
    #[error("pass '{pass}': {message}")]
    Failed { pass: &'static str, message: String },
    /// The IR is broken: on input, or after a pass (`after` names it).
    #[error("{}{source}", after.map(|p| format!("after pass '{p}': ")).unwrap_or_default())]
    Invalid {
        after: Option<&'static str>,
        #[source]
        source: IrError,
    },
    #[error("cannot write IR dump {path}: {source}")]
    Dump {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Result alias for this crate.
pub type Result<T, E = PassError> = std::result::Result<T, E>;
