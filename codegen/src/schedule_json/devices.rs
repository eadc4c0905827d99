//! Every global rank's ops: its worker's program with peers resolved to global ranks, a
//! `cp_exchange` before each forward and backward of a pack run by a CP group (a DP-Merge group,
//! a static CP group, or both), and the tied embedding's gradient sum between the pipeline's
//! ends before the DP gradient sync.
//!
//! The step IR's program has one op list per worker (DP rank, stage); the devices of a worker
//! (its TP peers, and with a static CP degree its CP peers) run the same list. Global ranks are
//! the same numbers in the IR's layout and the document's (see [`super::layout`]), so peers are
//! resolved in the IR's layout and coordinates reported in the document's.

use slimpack_ir::program::{Op, Program, Worker};
use slimpack_ir::spec::Coords;
use slimpack_ir::step::{Direction, Part, StepIr};

use super::layout::Layout;
use super::{Device, DeviceOp, PackDocument};

/// The op lists of every global rank of `layout`.
pub(super) fn devices(
    ir: &StepIr,
    layout: &Layout,
    program: &Program,
    packs: &[PackDocument],
) -> Vec<Device> {
    let ir_parallel = ir.spec.parallel;
    let parallel = layout.parallel;
    let pp = parallel.pp;
    let ties_stages = ir.spec.model.tied_embeddings && pp > 1;
    (0..parallel.world())
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
            // DP and CP peers of this stage with this tp coordinate, in rank order.
            let stage_ranks = || -> Vec<u64> {
                (0..parallel.dp)
                    .flat_map(|dp| {
                        (0..layout.cp()).map(move |cp| parallel.rank(Coords { cp, dp, ..coords }))
                    })
                    .collect()
            };
            let cp_group = |pack: &PackDocument| -> Vec<u64> {
                pack.dp_ranks
                    .iter()
                    .flat_map(|&dp| {
                        (0..layout.cp()).map(move |cp| parallel.rank(Coords { cp, dp, ..coords }))
                    })
                    .collect()
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
                            ops.push(DeviceOp::CpExchange {
                                pack: *pack,
                                direction: document.direction,
                                ranks: cp_group(document),
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
                            ops.push(DeviceOp::TiedEmbeddingAllReduce {
                                ranks: vec![on_stage(0), on_stage(pp - 1)],
                            });
                        }
                        ops.push(DeviceOp::ReduceScatter {
                            ranks: stage_ranks(),
                        });
                    }
                    Op::Optimizer => ops.push(DeviceOp::Optimizer),
                    Op::AllGather => ops.push(DeviceOp::AllGather {
                        ranks: stage_ranks(),
                    }),
                }
            }
            Device { rank, coords, ops }
        })
        .collect()
}
