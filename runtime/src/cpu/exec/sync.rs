//! The end of a step on every worker, the program's last three ops: `reduce-scatter` (the tied
//! embedding's gradient summed between the pipeline's ends, then the data-parallel gradient
//! reduce-scatter), `optimizer` (AdamW over this rank's shard: ZeRO stage 1, as the simulator's
//! memory model assumes) and `all-gather` (of the updated weights). Every sum runs in rank order, so results are bit-identical on every rank and from
//! run to run.

use std::ops::Range;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use crate::cpu::adamw::ShardedAdamW;
use crate::cpu::error::{CpuError, Result};
use crate::cpu::params::{Grads, Params};
use crate::cpu::rendezvous::Rendezvous;

use super::plan::Device;
use super::result::SyncTimes;

/// The rendezvous of one step's collectives (each is used once, in round 0).
#[derive(Debug)]
pub struct Collectives {
    /// Every worker, ready to start.
    pub start: Rendezvous<()>,
    /// Per DP rank: its first and last stage (tied embeddings across stages only).
    tied: Vec<Rendezvous<Vec<f32>>>,
    /// Per stage: its DP ranks' gradients.
    grads: Vec<Rendezvous<Grads>>,
    /// Per stage: its DP ranks' updated shards.
    params: Vec<Rendezvous<Vec<f32>>>,
}

impl Collectives {
    pub fn new(dp: usize, pp: usize, abort: &Arc<AtomicBool>) -> Collectives {
        Collectives {
            start: Rendezvous::new(dp * pp, Arc::clone(abort)),
            tied: (0..dp)
                .map(|_| Rendezvous::new(2, Arc::clone(abort)))
                .collect(),
            grads: (0..pp)
                .map(|_| Rendezvous::new(dp, Arc::clone(abort)))
                .collect(),
            params: (0..pp)
                .map(|_| Rendezvous::new(dp, Arc::clone(abort)))
                .collect(),
        }
    }
}

/// Flat indices of `rank`'s shard of `numel` values split over `ranks`.
pub fn shard_range(numel: usize, ranks: usize, rank: usize) -> Range<usize> {
    rank * numel / ranks..(rank + 1) * numel / ranks
}

/// One worker's view of the end of the step.
pub struct Sync<'a> {
    pub collectives: &'a Collectives,
    pub device: Device,
    pub dp: usize,
    pub pp: usize,
}

impl Sync<'_> {
    /// The `reduce-scatter` op: sums the tied embedding's copies between the pipeline's ends,
    /// then every rank's gradients over this rank's shard (`range`); returns the shard.
    pub fn reduce_scatter_op(
        &self,
        mut grads: Grads,
        range: Range<usize>,
        times: &mut SyncTimes,
    ) -> Result<Vec<f32>> {
        let clock = Instant::now();
        self.sum_tied(&mut grads)?;
        times.tied_embedding_s = clock.elapsed().as_secs_f64();
        let clock = Instant::now();
        let shard = self.reduce_scatter(grads, range)?;
        times.grad_reduce_scatter_s = clock.elapsed().as_secs_f64();
        Ok(shard)
    }

    /// The `optimizer` op: AdamW over this rank's shard of the summed gradients.
    pub fn optimizer_op(
        &self,
        params: &mut Params,
        optimizer: &mut ShardedAdamW,
        shard: &[f32],
        times: &mut SyncTimes,
    ) -> Result<()> {
        let clock = Instant::now();
        optimizer.step(params, shard)?;
        times.optimizer_s = clock.elapsed().as_secs_f64();
        Ok(())
    }

    /// The `all-gather` op: every rank's updated shard into `params`.
    pub fn all_gather_op(&self, params: &mut Params, times: &mut SyncTimes) -> Result<()> {
        let clock = Instant::now();
        self.all_gather(params)?;
        times.param_all_gather_s = clock.elapsed().as_secs_f64();
        Ok(())
    }

    /// Sums the tied embedding's two copies (first stage's lookup table, last stage's output
    /// projection) of this rank; both get `first + last`.
    fn sum_tied(&self, grads: &mut Grads) -> Result<()> {
        let (first, last) = (self.device.stage == 0, self.device.stage + 1 == self.pp);
        if self.pp == 1 || !(first || last) {
            return Ok(());
        }
        let Some(copy) = grads.tied_copy_mut() else {
            return Ok(());
        };
        let parts = self.collectives.tied[self.device.rank]
            .all_gather(usize::from(last), 0, copy.clone())
            .map_err(|_| aborted())?;
        for ((value, a), b) in copy.iter_mut().zip(parts[0].iter()).zip(parts[1].iter()) {
            *value = a + b;
        }
        Ok(())
    }

    /// Sums every rank's gradients over this rank's shard, in rank order.
    fn reduce_scatter(&self, grads: Grads, range: Range<usize>) -> Result<Vec<f32>> {
        let parts = self.collectives.grads[self.device.stage]
            .all_gather(self.device.rank, 0, grads)
            .map_err(|_| aborted())?;
        let mut shard = vec![0.0; range.len()];
        for part in &parts {
            let mut offset = 0;
            for piece in part.flat_range(range.clone()) {
                let target = &mut shard[offset..offset + piece.data.len()];
                target
                    .iter_mut()
                    .zip(piece.data)
                    .for_each(|(s, &g)| *s += g);
                offset += piece.data.len();
            }
        }
        Ok(shard)
    }

    /// Shares this rank's updated shard and copies in every other rank's.
    fn all_gather(&self, params: &mut Params) -> Result<()> {
        let numel = params.numel();
        let mine: Vec<f32> = params
            .flat_range(shard_range(numel, self.dp, self.device.rank))
            .iter()
            .flat_map(|piece| piece.data.iter().copied())
            .collect();
        let parts = self.collectives.params[self.device.stage]
            .all_gather(self.device.rank, 0, mine)
            .map_err(|_| aborted())?;
        for (rank, part) in parts.iter().enumerate() {
            if rank == self.device.rank {
                continue;
            }
            let mut offset = 0;
            for piece in params.flat_range_mut(shard_range(numel, self.dp, rank)) {
                let len = piece.data.len();
                piece.data.copy_from_slice(&part[offset..offset + len]);
                offset += len;
            }
        }
        Ok(())
    }
}

fn aborted() -> CpuError {
    CpuError::WorkerFailed {
        worker: "peer".to_string(),
        message: "another worker stopped; the step was abandoned".to_string(),
    }
}
