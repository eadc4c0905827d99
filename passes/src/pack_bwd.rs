//! `pack-bwd{cap=N,packs=K}`: phase 2, backward half — partition each replica's slices into
//! backward MicroPacks balanced on *backward* cost, independently of the forward packs.
//!
//! Phase in: `assigned` (after `pack-fwd`). Phase out: `packed`. Each sample's slices enter
//! packs last slice first (a slice's backward produces the dK/dV of every earlier slice). The
//! backward/forward cost ratio differs between linear parts (~2x) and attention (~2.5x, more
//! with recomputation), so a partition balanced for the forward is not balanced for the
//! backward: that asymmetry is why the two partitions are built separately. The algorithm is
//! in [`crate::micropack`].

use crate::error::Result;
use crate::micropack::{pack_direction, PackOptions, BACKWARD_OPTIONS};
use crate::pass::{Pass, PassContext, PassInfo, Statistics};
use slimpack_ir::step::{Direction, Phase};
use slimpack_ir::StepIr;

pub(crate) const INFO: PassInfo = PassInfo {
    name: "pack-bwd",
    summary: "partition slices into backward MicroPacks balanced on backward cost",
    description: "Per replica: chain-constrained balanced partition of the slices (last slice \
                  first) into packs of at most `cap` tokens, balancing backward FLOPs. Phase \
                  assigned -> packed.",
    accepts: Phase::Assigned..=Phase::Assigned,
    produces: Some(Phase::Packed),
    options: BACKWARD_OPTIONS,
    create: |options| Ok(Box::new(PackBwd(PackOptions::parse(options)?))),
};

/// The backward packing pass.
#[derive(Debug, Clone, Copy)]
pub struct PackBwd(pub PackOptions);

impl Pass for PackBwd {
    fn info(&self) -> &'static PassInfo {
        &INFO
    }

    fn run(&mut self, ir: &mut StepIr, cx: &PassContext) -> Result<Statistics> {
        pack_direction(ir, cx.machine(), Direction::Backward, self.0, INFO.name)
    }
}
