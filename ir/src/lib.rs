//! slimpack-ir: the data slimpack compiles.
//!
//! - [`spec`]: model, cluster and parallel layout (presets, TOML, validation);
//! - [`batch`]: the global batch (length files, tokenized corpora, synthetic distributions);
//! - [`step`]: the step IR, a petgraph graph of samples, slices, packs, stages and replicas;
//! - [`text`]: its canonical text form (printer and parser);
//! - [`program`]: the lowered step, per-worker op lists and pack layouts;
//! - [`verify`]: the invariants every pass must preserve.

pub mod batch;
mod error;
pub mod file;
pub mod program;
pub mod spec;
pub mod step;
pub mod text;
pub mod verify;

pub use error::{clip, quote, IrError, Result};
pub use spec::Spec;
pub use step::StepIr;
