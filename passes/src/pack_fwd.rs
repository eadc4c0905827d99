//! `pack-fwd{cap=N,packs=K}`: phase 2, forward half — partition each replica's slices into
//! forward MicroPacks balanced on *forward* cost.
//!
//! Phase in: `assigned` (sliced). Phase out: unchanged (`pack-bwd` completes packing). Each
//! sample's slices enter packs first slice first (their K/V prefix must exist); costs are the
//! machine model's forward FLOPs of each slice at its offset, so a late slice of a long sample
//! (which attends to a long prefix) weighs more than an early one of the same length. The
//! algorithm is in [`crate::micropack`].
//!
//! `runs=bounded` (default `free`): packs joined by a sample's slices form a run whose
//! forwards are all in flight before its first backward; where a replica's runs would not fit
//! the `memory` fraction of its devices, the packs are partitioned again with runs bounded
//! (see [`crate::micropack::partition`]). It fits mirrored backward packs; asymmetric ones free
//! a run's memory sample by sample (docs/BENCHMARKS.md, "Forward runs bounded by memory").
//! Either way the statistic `runs_over_memory` counts the replicas whose free runs would not
//! fit: the tuner compiles its bounded fallback of a mirrored pipeline only where it is not 0.

use crate::error::Result;
use crate::micropack::{pack_direction, PackOptions, FORWARD_OPTIONS};
use crate::pass::{Pass, PassContext, PassInfo, Statistics};
use slimpack_ir::step::{Direction, Phase};
use slimpack_ir::StepIr;

pub(crate) const INFO: PassInfo = PassInfo {
    name: "pack-fwd",
    summary: "partition slices into forward MicroPacks balanced on forward cost",
    description: "Per replica: chain-constrained balanced partition of the slices (first slice \
                  first) into packs of at most `cap` tokens, balancing forward FLOPs at each \
                  slice's offset. Phase assigned -> assigned.",
    accepts: Phase::Assigned..=Phase::Assigned,
    produces: None,
    options: FORWARD_OPTIONS,
    create: |options| Ok(Box::new(PackFwd(PackOptions::parse(options)?))),
};

/// The forward packing pass.
#[derive(Debug, Clone, Copy)]
pub struct PackFwd(pub PackOptions);

impl Pass for PackFwd {
    fn info(&self) -> &'static PassInfo {
        &INFO
    }

    fn run(&mut self, ir: &mut StepIr, cx: &PassContext) -> Result<Statistics> {
        pack_direction(ir, cx.machine(), Direction::Forward, self.0, INFO.name)
    }
}
