//! The tuner: the autotuner above the compiler.
//!
//! - [`strategy`]: the strategies — the peers reproduced in the step IR and slimpack's own —
//!   each a table row with its source, deviations and candidate configurations;
//! - [`method`]: the candidates of the SlimPack method and its ablations;
//! - [`stage_recompute`]: the per-stage recomputation twins of its candidates;
//! - [`autotune`]: compiles every candidate of a strategy on a batch (but those a lower bound
//!   from the machine model proves slower than a fitting step already found), scores each
//!   with the simulator on the machine model, keeps the fastest that fits memory;
//! - [`evaluate`]: one candidate (or a group compiled together) compiled and simulated, its
//!   variants as a prefix tree;
//! - [`kept`]: the configurations a run keeps from tuning (the tuned one and the best of each
//!   other family: slimpack's own pipelines, each peer's plan) and each step's choice among
//!   them by simulation;
//! - [`verify`]: what a tuning verifies, and the check of the step it hands on;
//! - [`run`]: the multi-step run policy, the same for every strategy (tune on the first K
//!   steps, keep the configuration, re-plan a step over the memory limit, optionally drain what
//!   a strategy held back) that `slimpack bench` measures.
//!
//! Passes never tune: they plan with the machine model they are handed; choosing among
//! pipelines by simulating them happens here only.

pub mod autotune;
pub mod evaluate;
pub mod kept;
pub mod method;
pub mod run;
pub mod stage_recompute;
pub mod strategy;
pub mod verify;
