//! Every global rank's ops: its worker's program with peers resolved to global ranks, a
//! `cp_exchange` before each forward and backward of a pack run by a CP group (a DP-Merge group,
//! a static CP group, or both), and the tied embedding's gradient sum between the pipeline's
//! ends before the DP gradient sync.
//!
//! The step IR's program has one op list per worker (DP rank, stage); the devices of a worker
//! (its TP peers, and with a static CP degree its CP peers) run the same list. Global ranks are
//! the same numbers in the IR's layout and the document's (see [`super::layout`]), so peers are
//! resolved in the IR's layout and coordinates reported in the document's.
//!
//! Collectives name their ranks by an index into the document's `groups` ([`GroupTable`]):
//! each group's ranks are listed once, by the first device that needs it, so the devices cost
//! time and space linear in their ops however large the groups.

use slimpack_ir::program::{Op, Program, Worker};
use slimpack_ir::spec::Coords;
use slimpack_ir::step::{Direction, Part, StepIr};

use super::groups::GroupTable;
use super::layout::Layout;
use super::{Device, DeviceOp, PackDocument, RankGroup};

/// What a group of ranks is, as the devices name it: the key under which it is built once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum GroupKey {
    /// The DP and CP peers of pipeline device `pp` with tp coordinate `tp` (the gradient sync).
    Stage { pp: u32, tp: u32 },
    /// The CP group of `replica`'s packs on pipeline device `pp`, tp coordinate `tp`.
    Cp { replica: u32, pp: u32, tp: u32 },
    /// The first and last pipeline device at these coordinates (the tied embedding's sum).
    Tied { tp: u32, cp: u32, dp: u32 },
}

/// The op lists of every global rank of `layout`, and the groups of ranks their collectives
/// refer to.
pub(super) fn devices(
    ir: &StepIr,
    layout: &Layout,
    program: &Program,
    packs: &[PackDocument],
) -> (Vec<Device>, Vec<RankGroup>) {
    let ir_parallel = ir.spec.parallel;
    let parallel = layout.parallel;
    let pp = parallel.pp;
    let ties_stages = ir.spec.model.tied_embeddings && pp > 1;
    let mut groups = GroupTable::new();
    let devices = (0..parallel.world())
        .map(|rank| {
            let coords = parallel.coords(rank);
            let ir_coords = ir_parallel.coords(rank);
            let at = |worker: Worker| {
                ir_parallel.rank(Coords {
                    dp: worker.dp,
                    pp: worker.pp,
                    ..ir_coords
                })
            };
            let on_stage = |pp: u32| parallel.rank(Coords { pp, ..coords });
            // The ranks of these DP ranks' devices on this stage with this tp coordinate, each
            // DP rank's CP members in order.
            let members = |dp_ranks: &mut dyn Iterator<Item = u32>| -> Vec<u64> {
                dp_ranks
                    .flat_map(|dp| {
                        (0..layout.cp()).map(move |cp| parallel.rank(Coords { cp, dp, ..coords }))
                    })
                    .collect()
            };
            let stage_group = GroupKey::Stage {
                pp: coords.pp,
                tp: coords.tp,
            };
            let worker = program.worker(Worker {
                dp: ir_coords.dp,
                pp: ir_coords.pp,
            });
            let mut ops = Vec::with_capacity(worker.ops.len());
            for op in &worker.ops {
                match op {
                    &Op::Backward {
                        pack,
                        chunk,
                        part: Part::WeightGrad,
                    } => ops.push(DeviceOp::Backward {
                        pack,
                        chunk,
                        part: Part::WeightGrad,
                    }),
                    &Op::Forward { pack, chunk } | &Op::Backward { pack, chunk, .. } => {
                        let pack = &pack;
                        let document = &packs[*pack as usize];
                        let part = match op {
                            Op::Backward { part, .. } => *part,
                            _ => Part::Whole,
                        };
                        if document.cp_size > 1 {
                            // Every pack of a replica runs on the replica's DP ranks.
                            let key = GroupKey::Cp {
                                replica: document.replica,
                                pp: coords.pp,
                                tp: coords.tp,
                            };
                            let group = groups
                                .index(key, || members(&mut document.dp_ranks.iter().copied()));
                            ops.push(DeviceOp::CpExchange {
                                pack: *pack,
                                direction: document.direction,
                                group,
                                chunk,
                            });
                        }
                        ops.push(match document.direction {
                            Direction::Forward => DeviceOp::Forward { pack: *pack, chunk },
                            Direction::Backward => DeviceOp::Backward {
                                pack: *pack,
                                chunk,
                                part,
                            },
                        });
                    }
                    // Re-emitted above for every CP group, merged or static.
                    Op::CpExchange { .. } => {}
                    Op::Send {
                        pack,
                        direction,
                        to,
                        chunk,
                    } => ops.push(DeviceOp::Send {
                        pack: *pack,
                        direction: *direction,
                        to: at(*to),
                        chunk: *chunk,
                    }),
                    Op::Recv {
                        pack,
                        direction,
                        from,
                        chunk,
                    } => ops.push(DeviceOp::Recv {
                        pack: *pack,
                        direction: *direction,
                        from: at(*from),
                        chunk: *chunk,
                    }),
                    Op::ReduceScatter => {
                        if ties_stages && (coords.pp == 0 || coords.pp + 1 == pp) {
                            let key = GroupKey::Tied {
                                tp: coords.tp,
                                cp: coords.cp,
                                dp: coords.dp,
                            };
                            let group = groups.index(key, || vec![on_stage(0), on_stage(pp - 1)]);
                            ops.push(DeviceOp::TiedEmbeddingAllReduce { group });
                        }
                        let group = groups.index(stage_group, || members(&mut (0..parallel.dp)));
                        ops.push(DeviceOp::ReduceScatter { group });
                    }
                    Op::Optimizer => ops.push(DeviceOp::Optimizer),
                    Op::AllGather => {
                        let group = groups.index(stage_group, || members(&mut (0..parallel.dp)));
                        ops.push(DeviceOp::AllGather { group });
                    }
                }
            }
            Device { rank, coords, ops }
        })
        .collect();
    (devices, groups.into_groups())
}
