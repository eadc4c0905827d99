//! Tests of the CPU backend: finite differences for the reference, sliced and packed execution
//! (one stage and a pipeline) against the reference, DP-Merge groups (context parallelism across
//! worker threads) against the reference, and the schedule checks.

mod errors;
mod executor;
mod gradcheck;
mod harness;
mod memory;
mod merged;
mod sliced;
mod stages;
