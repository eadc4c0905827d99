//! [`ThreadExchange`]: the K/V exchange of a context-parallel group whose workers are threads of
//! one process.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::exchange::KvExchange;
use super::CpShard;
use crate::cpu::error::{CpuError, Result};
use crate::cpu::rendezvous::Rendezvous;

/// One worker's end of an in-process context-parallel group.
#[derive(Debug)]
pub struct ThreadExchange {
    shard: CpShard,
    rendezvous: Arc<Rendezvous<Vec<f32>>>,
    round: u64,
}

impl ThreadExchange {
    /// The `size` ends of one group (rank order), giving up when `abort` is raised.
    pub fn group(size: usize, abort: Arc<AtomicBool>) -> Vec<ThreadExchange> {
        let rendezvous = Arc::new(Rendezvous::new(size, abort));
        (0..size)
            .map(|rank| ThreadExchange {
                shard: CpShard { rank, size },
                rendezvous: Arc::clone(&rendezvous),
                round: 0,
            })
            .collect()
    }
}

impl KvExchange for ThreadExchange {
    fn shard(&self) -> CpShard {
        self.shard
    }

    fn all_gather(&mut self, mine: Vec<f32>) -> Result<Vec<Arc<Vec<f32>>>> {
        let round = self.round;
        self.round += 1;
        self.rendezvous
            .all_gather(self.shard.rank, round, mine)
            .map_err(|_| CpuError::ExchangeAborted {
                reason: "another worker of the DP-Merge group stopped".to_string(),
            })
    }
}
