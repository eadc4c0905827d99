//! Lowering a scheduled step IR to a [`Program`].

use petgraph::visit::NodeIndexable;

use super::{Op, PackLayout, Program, SliceLayout, Worker, WorkerProgram};
use crate::step::{Direction, PackId, Part, Phase, StepIr};

/// Lowers `ir` (phase `scheduled` or later) to per-worker op lists. Pure: the same IR always
/// gives the same program.
///
/// # Panics
/// If `ir` is not scheduled (callers check the phase; the `lower` pass reports it as an error).
pub fn lower(ir: &StepIr) -> Program {
    assert!(
        ir.phase() >= Phase::Scheduled,
        "lower needs a scheduled IR, got phase {} (bug in the caller)",
        ir.phase()
    );
    let order = pack_order(ir);
    // Program pack indices by node index (a table, not a map: the op lists look one up per op).
    let mut pack_index = vec![u32::MAX; ir.graph().node_bound()];
    for (index, &(pack, _)) in order.iter().enumerate() {
        pack_index[pack.node().index()] = index as u32;
    }
    let sample_slices = ir.sample_slices();
    let mut packs = Vec::with_capacity(order.len());
    // The printer's pack names (`Names::of_packs`), counted in the same order.
    let mut numbers = [0u32; 2];
    for &(pack, replica_index) in &order {
        let replica = ir.replicas()[replica_index as usize];
        let direction = ir.pack(pack).direction;
        let (prefix, number) = match direction {
            Direction::Forward => ('f', &mut numbers[0]),
            Direction::Backward => ('b', &mut numbers[1]),
        };
        let name = format!("%{prefix}{number}");
        *number += 1;
        let slices: Vec<SliceLayout> = ir
            .pack_members(pack)
            .iter()
            .map(|&slice| {
                let s = ir.slice(slice);
                SliceLayout {
                    sample: sample_slices.sample_position(slice),
                    start: s.start,
                    end: s.end(),
                    kv_start: 0,
                }
            })
            .collect();
        packs.push(layout(
            name,
            direction,
            replica_index,
            ir.replica(replica).ranks.clone(),
            slices,
            ir.padding(pack),
        ));
    }

    let parallel = ir.spec.parallel;
    let (pp, vpp, dp) = (parallel.pp, parallel.vpp, parallel.dp);
    let stages = parallel.stages();
    let mut workers: Vec<WorkerProgram> = (0..pp)
        .flat_map(|stage| {
            (0..dp).map(move |rank| WorkerProgram {
                worker: Worker {
                    dp: rank,
                    pp: stage,
                },
                ops: Vec::new(),
            })
        })
        .collect();
    // Workers whose DP rank interleaves the replicas it is in (`StepIr::rank_order`): their
    // ops are gathered per schedule entry, then merged in that order. The others take each
    // replica's ops in full, replicas in IR order, as they come.
    let mut pending: Vec<Option<Pending>> = (0..pp)
        .flat_map(|device| (0..dp).map(move |rank| (rank, device)))
        .map(|(rank, device)| {
            ir.rank_order(rank, device).map(|order| Pending {
                order: order.iter().map(|r| r.node().index()).collect(),
                entries: Vec::new(),
            })
        })
        .collect();
    for &replica in ir.replicas() {
        let ranks = &ir.replica(replica).ranks;
        let merged = ranks.len() > 1;
        for device in 0..pp {
            let order = ir.device_schedule(replica, device);
            for &rank in ranks {
                let worker_index = (device * dp + rank) as usize;
                let mut buffer = Vec::new();
                let (ops, mut gathered) = match &mut pending[worker_index] {
                    Some(gathered) => (&mut buffer, Some(gathered)),
                    None => (&mut workers[worker_index].ops, None),
                };
                // Up to a receive, an exchange, the compute and a send per entry.
                ops.reserve(order.len() * (3 + usize::from(merged)));
                for &(op, stage) in &order {
                    let start = ops.len();
                    let pack_id = op.pack;
                    let pack = pack_index[pack_id.node().index()];
                    debug_assert_ne!(pack, u32::MAX, "a scheduled pack not placed (bug)");
                    let chunk = stage / pp;
                    let direction = ir.pack(pack_id).direction;
                    // A deferred weight gradient needs nothing from another worker.
                    if op.part == Part::WeightGrad {
                        ops.push(Op::Backward {
                            pack,
                            chunk,
                            part: op.part,
                        });
                    } else {
                        // The pipeline stages the pack's input comes from and its output goes to.
                        let (from, to) = match direction {
                            Direction::Forward => (
                                stage.checked_sub(1),
                                Some(stage + 1).filter(|&s| s < stages),
                            ),
                            Direction::Backward => (
                                Some(stage + 1).filter(|&s| s < stages),
                                stage.checked_sub(1),
                            ),
                        };
                        let worker = |stage: u32| Worker {
                            dp: rank,
                            pp: parallel.device_of_stage(stage),
                        };
                        if let Some(from) = from {
                            ops.push(Op::Recv {
                                pack,
                                direction,
                                from: worker(from),
                                chunk,
                            });
                        }
                        if merged {
                            ops.push(Op::CpExchange {
                                pack,
                                direction,
                                group: ranks.clone(),
                                chunk,
                            });
                        }
                        ops.push(match direction {
                            Direction::Forward => Op::Forward { pack, chunk },
                            Direction::Backward => Op::Backward {
                                pack,
                                chunk,
                                part: op.part,
                            },
                        });
                        if let Some(to) = to {
                            ops.push(Op::Send {
                                pack,
                                direction,
                                to: worker(to),
                                chunk,
                            });
                        }
                    }
                    if let Some(gathered) = gathered.as_mut() {
                        gathered
                            .entries
                            .push((replica.node().index(), ops.drain(start..).collect()));
                    }
                }
            }
        }
    }
    for (worker, gathered) in workers.iter_mut().zip(pending) {
        if let Some(gathered) = gathered {
            worker.ops = gathered.merge();
        }
    }
    for worker in &mut workers {
        worker
            .ops
            .extend([Op::ReduceScatter, Op::Optimizer, Op::AllGather]);
    }
    Program {
        pp,
        vpp,
        dp,
        packs,
        workers,
    }
}

/// A worker's ops gathered per schedule entry, to be merged in its rank's order.
struct Pending {
    /// The replica (node index) of each op the worker runs, in order.
    order: Vec<usize>,
    /// Each schedule entry's ops with its replica (node index), replicas in IR order, each
    /// replica's entries in its schedule's order.
    entries: Vec<(usize, Vec<Op>)>,
}

impl Pending {
    /// The ops in the rank's order: the order's `i`-th replica contributes its next entry.
    /// An order that names a replica more often than it has entries stops there (the
    /// verifier rejects such an order before anything is lowered).
    fn merge(self) -> Vec<Op> {
        let mut queues: Vec<(usize, std::collections::VecDeque<Vec<Op>>)> = Vec::new();
        for (replica, ops) in self.entries {
            match queues.iter_mut().find(|(r, _)| *r == replica) {
                Some((_, queue)) => queue.push_back(ops),
                None => queues.push((replica, std::collections::VecDeque::from([ops]))),
            }
        }
        let mut merged = Vec::new();
        for replica in self.order {
            let Some(ops) = queues
                .iter_mut()
                .find(|(r, _)| *r == replica)
                .and_then(|(_, queue)| queue.pop_front())
            else {
                break;
            };
            merged.extend(ops);
        }
        merged
    }
}

/// Every pack with its replica's index, in the program's (and the printed IR's) order: per
/// replica, forward packs then backward packs. `Program::packs[i]` is `pack_order(ir)[i]`.
pub fn pack_order(ir: &StepIr) -> Vec<(PackId, u32)> {
    let mut order = Vec::new();
    for (index, &replica) in ir.replicas().iter().enumerate() {
        for direction in [Direction::Forward, Direction::Backward] {
            order.extend(
                ir.packs_on(replica, direction)
                    .into_iter()
                    .map(|pack| (pack, index as u32)),
            );
        }
    }
    order
}

/// The layout of a pack from its slices in order.
fn layout(
    name: String,
    direction: Direction,
    replica: u32,
    dp_ranks: Vec<u32>,
    slices: Vec<SliceLayout>,
    padded: Option<u32>,
) -> PackLayout {
    let mut cu_seqlens_q = Vec::with_capacity(slices.len() + 1);
    let mut cu_seqlens_k = Vec::with_capacity(slices.len() + 1);
    let (mut q, mut k) = (0u32, 0u32);
    cu_seqlens_q.push(0);
    cu_seqlens_k.push(0);
    for slice in &slices {
        q += slice.end - slice.start;
        k += slice.end - slice.kv_start;
        cu_seqlens_q.push(q);
        cu_seqlens_k.push(k);
    }
    let max_seqlen_q = slices.iter().map(|s| s.end - s.start).max().unwrap_or(0);
    let max_seqlen_k = slices.iter().map(|s| s.end - s.kv_start).max().unwrap_or(0);
    let position_offsets = slices.iter().map(|s| s.start).collect();
    PackLayout {
        name,
        direction,
        replica,
        dp_ranks,
        slices,
        padded_tokens: padded.unwrap_or(q).max(q),
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        position_offsets,
    }
}
