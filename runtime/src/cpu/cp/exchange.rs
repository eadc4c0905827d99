//! [`KvExchange`]: the one collective the workers of a context-parallel group need.

use std::fmt;
use std::sync::Arc;

use super::CpShard;
use crate::cpu::error::Result;

/// The link between the workers of one context-parallel group (a DP-Merge group's workers on
/// one pipeline stage). Every worker calls [`KvExchange::all_gather`] the same number of times
/// in the same order (the group runs the same packs, slices and layers in lockstep).
pub trait KvExchange: Send + fmt::Debug {
    /// This worker's place in the group.
    fn shard(&self) -> CpShard;

    /// Contributes `mine` and returns every worker's contribution, indexed by rank (`mine`
    /// among them). Fails when the group was aborted (another worker failed).
    fn all_gather(&mut self, mine: Vec<f32>) -> Result<Vec<Arc<Vec<f32>>>>;
}

/// The exchange of a group of one: gathering returns the worker's own contribution.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalExchange;

impl KvExchange for LocalExchange {
    fn shard(&self) -> CpShard {
        CpShard::WHOLE
    }

    fn all_gather(&mut self, mine: Vec<f32>) -> Result<Vec<Arc<Vec<f32>>>> {
        Ok(vec![Arc::new(mine)])
    }
}
