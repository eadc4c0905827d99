//! slimpack-passes: transformations of the step IR and the machinery that runs them.
//!
//! - [`Pass`]: the trait every pass implements (name, accepted phases, produced phase, run);
//! - [`registry`]: every pass by name, with summary, description and options;
//! - [`pipeline`]: pipeline strings (`slice{size=8192},...`);
//! - [`manager`]: runs a pipeline, verifying, timing, printing and dumping;
//! - one file per pass: [`assign_dp`], [`slice`], [`pack_symmetric`], [`schedule_pipeline`].

pub mod assign_dp;
pub mod assign_hybrid_cp;
mod balance;
pub mod dp_merge;
pub mod eqsat;
mod error;
pub mod lower;
pub mod manager;
pub mod micropack;
#[cfg(feature = "milp")]
pub mod milp;
pub mod pack_bwd;
pub mod pack_fwd;
pub mod pack_symmetric;
mod pass;
pub mod pipeline;
pub mod registry;
pub mod schedule_pipeline;
pub mod slice;

pub use error::{PassError, Result};
pub use manager::{run_pipeline, run_pipeline_in, ManagerOptions, PassRecord, PrintOptions};
pub use pass::{OptionInfo, Pass, PassContext, PassInfo, PassOptions, Statistics};
pub use pipeline::{parse_pipeline, render_pipeline, PipelineEntry};
