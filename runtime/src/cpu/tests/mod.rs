//! Tests of the CPU backend: finite differences for the reference, sliced and packed execution
//! (one stage and a pipeline) against the reference, and the schedule checks.

mod errors;
mod gradcheck;
mod harness;
mod sliced;
mod stages;
