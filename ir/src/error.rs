//! The one error type of `slimpack-ir`.
//!
//! Every variant renders as a single line that names what was wrong (file, flag, value, IR
//! location) and, where it helps, what would have been valid. The CLI prints it verbatim.

use std::path::PathBuf;

/// Errors raised while reading specs, batches and IR, and by the verifier.
#[derive(Debug, thiserror::Error)]
pub enum IrError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A spec (model, cluster, parallel layout, batch options) is invalid.
    #[error("{what}: {message}")]
    Spec { what: String, message: String },
    /// A preset name is unknown.
    #[error("unknown {kind} preset '{name}' (valid: {valid})")]
    UnknownPreset {
        kind: &'static str,
        name: String,
        valid: String,
    },
    /// A batch file or batch option is invalid.
    #[error("{source_name}: {message}")]
    Batch {
        source_name: String,
        message: String,
    },
    /// The IR text could not be parsed.
    #[error("{source_name}:{line}:{column}: {message}")]
    Parse {
        source_name: String,
        line: usize,
        column: usize,
        message: String,
    },
    /// The IR breaks one or more invariants; the first is shown, the count says how many more.
    #[error("{}", render_verify(.errors))]
    Verify {
        errors: Vec<crate::verify::VerifyError>,
    },
}

fn render_verify(errors: &[crate::verify::VerifyError]) -> String {
    match errors {
        [] => "verifier failed without a message (this is a bug)".to_string(),
        [one] => format!("verifier: {one}"),
        [first, rest @ ..] => format!("verifier: {first} (and {} more)", rest.len()),
    }
}

impl IrError {
    pub(crate) fn spec(what: impl Into<String>, message: impl Into<String>) -> Self {
        IrError::Spec {
            what: what.into(),
            message: message.into(),
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        IrError::Io {
            path: path.into(),
            source,
        }
    }
}

/// Result alias for this crate.
pub type Result<T, E = IrError> = std::result::Result<T, E>;

/// The most characters of a user's value an error message repeats.
const MAX_QUOTED_CHARS: usize = 40;

/// A user's value as an error message repeats it: whole when short, else its first
/// [`MAX_QUOTED_CHARS`] characters and `...`, so that one bad token (a 10 MB line) cannot
/// flood the terminal or make a one-line error megabytes long.
pub fn clip(text: &str) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(MAX_QUOTED_CHARS) {
        None => std::borrow::Cow::Borrowed(text),
        Some((end, _)) => std::borrow::Cow::Owned(format!("{}...", &text[..end])),
    }
}

/// [`clip`] in single quotes.
pub fn quote(text: &str) -> String {
    format!("'{}'", clip(text))
}
