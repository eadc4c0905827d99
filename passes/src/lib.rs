//! slimpack-passes: transformations of the step IR and the machinery that runs them.
//!
//! - [`Pass`]: the trait every pass implements; [`PassInfo`] declares a pass once (name,
//!   phases, options with defaults); [`PassContext`] is what every pass receives (the machine
//!   model the manager built once);
//! - [`registry`]: every pass by name, with summary, description and options;
//! - [`pipeline`]: pipeline strings (`slice{size=8192},...`);
//! - [`manager`]: runs a pipeline, verifying, timing, printing and dumping;
//! - one file per pass: [`assign_dp`], [`assign_hybrid_cp`], [`dp_merge`], [`slice`],
//!   [`pack_fwd`], [`pack_bwd`], [`eqsat`], [`pack_symmetric`], [`schedule_pipeline`],
//!   [`assign_recompute`], [`interleave_ranks`], [`lower`];
//!   what several passes share is plain functions ([`micropack`], `balance`).
//!
//! Passes plan with the machine model's cost functions; choosing among pipelines by simulation
//! is the tuner's job (the facade's `tune` module), never a pass's. (`assign-recompute` reads
//! the simulated memory timeline of the one schedule it is given, the machine crate's memory
//! model over time, to size each stage's recomputation; `interleave-ranks` reads its
//! first-come-first-served timeline to order a shared DP rank's replicas.)

pub mod assign_dp;
pub mod assign_hybrid_cp;
pub mod assign_recompute;
mod balance;
pub mod dp_merge;
pub mod eqsat;
mod error;
pub mod interleave_ranks;
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
mod zero_bubble;

pub use error::{PassError, Result};
pub use manager::{
    run_pipeline, run_pipeline_in, ManagerOptions, PassRecord, PrintOptions, KEPT_INPUT,
};
pub use pass::{OptionInfo, Pass, PassContext, PassInfo, PassOptions, Statistics};
pub use pipeline::{parse_pipeline, render_pipeline, PipelineEntry};
