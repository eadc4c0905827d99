//! Writing a document: everything a trainer needs, derived from a scheduled step and its
//! lowered program.
//!
//! The step gives the inputs (spec, samples, stages, replicas, pack members, schedules); this
//! module derives the rest — the slice table (targets, packs, dK/dV order), each pack's varlen
//! metadata, CP split and sub-batches, and (in [`super::devices`]) every rank's ops. Reading
//! ([`super::read`]) calls it again on the step it rebuilt and compares, so there is one
//! derivation of every field.

use rustc_hash::FxHashMap as HashMap;

use slimpack_ir::program::{self, CpShard, PackLayout, Program};
use slimpack_ir::spec::Recompute;
use slimpack_ir::step::{Direction, PackId, StepIr};

use super::devices::devices;
use super::layout::Layout;
use super::{
    BatchDocument, DeferredWeightGrad, InterleaveEntry, LossDocument, LossNormalization,
    PackDocument, PackRecomputeEntry, PackSlice, PackedSeqParams, QkvFormat, RankOrderEntry,
    ReplicaDocument, ScheduleDocument, ScheduleEntry, ScheduleError, SliceDocument, StageDocument,
    SubBatch, FORMAT, INT32_MAX, VERSION,
};

/// The document of `ir` (see [`super::document`]).
pub(super) fn document(
    ir: &StepIr,
    predicted: Option<serde_json::Value>,
) -> Result<ScheduleDocument, ScheduleError> {
    let program = program::program_of(ir);
    let order = program::pack_order(ir);
    let index: HashMap<PackId, u32> = order
        .iter()
        .enumerate()
        .map(|(i, &(id, _))| (id, i as u32))
        .collect();
    let layout = Layout::of_ir(ir);
    let slices = slice_table(ir, &program);
    let slice_index: HashMap<(u32, u32), u32> = slices
        .iter()
        .enumerate()
        .map(|(i, s)| ((s.sample, s.start), i as u32))
        .collect();
    let positions = backward_positions(ir, &index);
    let mut packs = Vec::with_capacity(program.packs.len());
    for (p, (pack, &(id, _))) in program.packs.iter().zip(&order).enumerate() {
        let mut document = pack_document(pack, &layout, &slice_index, &slices);
        document.cap = ir.pack(id).cap;
        if pack.direction == Direction::Forward {
            let position = |backward: u32| match positions[backward as usize] {
                Some((replica, position)) if replica == pack.replica => Some(position),
                _ => None,
            };
            document.sub_batches = sub_batches(&document, &slices, position);
        }
        check_int32(p, &document)?;
        packs.push(document);
    }
    let mut schedules = Vec::new();
    for (r, &replica) in ir.replicas().iter().enumerate() {
        for &stage in ir.stages() {
            let stage = ir.stage(stage).index;
            let order = ir.schedule(replica, stage);
            if !order.is_empty() {
                let weight_grads = ir
                    .weight_grads(replica, stage)
                    .iter()
                    .map(|&(pack, after)| DeferredWeightGrad {
                        pack: index[&pack],
                        after,
                    })
                    .collect();
                schedules.push(ScheduleEntry {
                    replica: r as u32,
                    stage,
                    packs: order.iter().map(|id| index[id]).collect(),
                    weight_grads,
                });
            }
        }
    }
    let mut interleave = Vec::new();
    for (r, &replica) in ir.replicas().iter().enumerate() {
        for device in 0..ir.spec.parallel.pp {
            if let Some(chunks) = ir.interleave(replica, device) {
                interleave.push(InterleaveEntry {
                    replica: r as u32,
                    pp: device,
                    chunks: chunks.to_vec(),
                });
            }
        }
    }
    let replica_index: HashMap<_, u32> = ir
        .replicas()
        .iter()
        .enumerate()
        .map(|(r, &replica)| (replica, r as u32))
        .collect();
    let rank_orders = ir
        .rank_orders()
        .map(|((rank, device), order)| RankOrderEntry {
            // DP-Merge runs without static CP: an IR rank is a document DP rank.
            dp: layout.dp_ranks_of_ir(&[rank])[0],
            pp: device,
            replicas: order.iter().map(|replica| replica_index[replica]).collect(),
        })
        .collect();
    let pack_recompute = pack_recompute(ir, &index);
    let samples: Vec<_> = ir.samples().iter().map(|&s| *ir.sample(s)).collect();
    let replicas = ir
        .replicas()
        .iter()
        .map(|&r| {
            let dp_ranks = layout.dp_ranks_of_ir(&ir.replica(r).ranks);
            ReplicaDocument {
                cp_size: layout.cp_size(dp_ranks.len()),
                dp_ranks,
            }
        })
        .collect();
    let (devices, groups) = devices(ir, &layout, &program, &packs);
    Ok(ScheduleDocument {
        format: FORMAT.to_string(),
        version: VERSION,
        spec: slimpack_ir::Spec {
            parallel: layout.parallel,
            ..ir.spec.clone()
        },
        cp_chosen: layout.cp_chosen,
        batch: BatchDocument {
            source: ir.batch.source.clone(),
            context: ir.batch.context,
            documents: ir.batch.documents,
            documents_cut: ir.batch.documents_cut,
        },
        loss: LossDocument {
            normalization: LossNormalization::SumOverGlobalTargetTokens,
            target_tokens: samples
                .iter()
                .map(|s| u64::from(s.len.saturating_sub(1)))
                .sum(),
        },
        samples,
        slices,
        stages: ir
            .stages()
            .iter()
            .map(|&s| {
                let stage = ir.stage(s);
                StageDocument {
                    first_layer: stage.first_layer,
                    layers: stage.layers,
                    recompute: stage.recompute,
                }
            })
            .collect(),
        replicas,
        packs,
        schedules,
        interleave,
        rank_orders,
        pack_recompute,
        groups,
        devices,
        predicted,
    })
}

/// The forward packs' own modes by stage (increasing), one entry per mode in the order of its
/// first pack, packs by increasing document index (`index`).
fn pack_recompute(ir: &StepIr, index: &HashMap<PackId, u32>) -> Vec<PackRecomputeEntry> {
    let mut own: Vec<(u32, u32, Recompute)> = ir
        .pack_recomputes()
        .map(|((pack, stage), mode)| (stage, index[&pack], mode))
        .collect();
    own.sort_unstable_by_key(|&(stage, pack, _)| (stage, pack));
    let mut entries: Vec<PackRecomputeEntry> = Vec::new();
    let mut stage_start = 0;
    for (stage, pack, recompute) in own {
        if entries.last().is_some_and(|last| last.stage != stage) {
            stage_start = entries.len();
        }
        match entries[stage_start..]
            .iter_mut()
            .find(|entry| entry.stage == stage && entry.recompute == recompute)
        {
            Some(entry) => entry.packs.push(pack),
            None => entries.push(PackRecomputeEntry {
                stage,
                recompute,
                packs: vec![pack],
            }),
        }
    }
    entries
}

/// Every slice, sample-major in increasing start, with its packs, targets and dK/dV order.
fn slice_table(ir: &StepIr, program: &Program) -> Vec<SliceDocument> {
    let mut packs_of: HashMap<(u32, u32), [u32; 2]> = HashMap::default();
    for (p, pack) in program.packs.iter().enumerate() {
        let which = match pack.direction {
            Direction::Forward => 0,
            Direction::Backward => 1,
        };
        for slice in &pack.slices {
            packs_of.entry((slice.sample, slice.start)).or_default()[which] = p as u32;
        }
    }
    let mut table = Vec::new();
    for (sample_index, &sample) in ir.samples().iter().enumerate() {
        let len = ir.sample(sample).len;
        let first = table.len() as u32;
        let slices = ir.slices_of(sample);
        if slices.is_empty() {
            continue;
        }
        let last = first + slices.len() as u32 - 1;
        for (j, &id) in slices.iter().enumerate() {
            let slice = ir.slice(id);
            let (start, end) = (slice.start, slice.end());
            let [forward_pack, backward_pack] = packs_of[&(sample_index as u32, start)];
            let this = first + j as u32;
            table.push(SliceDocument {
                sample: sample_index as u32,
                start,
                end,
                forward_pack,
                backward_pack,
                target_start: start + 1,
                target_end: end.saturating_add(1).min(len),
                dkv_from: (this..=last).rev().collect(),
            });
        }
    }
    table
}

/// A pack's document, without its cap and sub-batches.
fn pack_document(
    pack: &PackLayout,
    layout: &Layout,
    slice_index: &HashMap<(u32, u32), u32>,
    slices: &[SliceDocument],
) -> PackDocument {
    let dp_ranks = layout.dp_ranks_of_ir(&pack.dp_ranks);
    let cp_size = layout.cp_size(dp_ranks.len());
    let tokens = pack.tokens();
    let padding = pack.padded_tokens - tokens;
    let members = |start: u32, len: u32| -> Vec<[[u32; 2]; 2]> {
        (0..cp_size as usize)
            .map(|rank| {
                let shard = CpShard {
                    rank,
                    size: cp_size as usize,
                };
                shard
                    .runs(start as usize, len as usize)
                    .map(|run| [run.start as u32, run.end as u32])
            })
            .collect()
    };
    let pack_slices = pack
        .slices
        .iter()
        .map(|s| {
            let slice = slice_index[&(s.sample, s.start)];
            debug_assert_eq!(slices[slice as usize].end, s.end);
            PackSlice {
                slice,
                sample: s.sample,
                start: s.start,
                end: s.end,
                kv_start: s.kv_start,
                cp_runs: members(s.start, s.end - s.start),
            }
        })
        .collect();
    PackDocument {
        name: pack.name.clone(),
        direction: pack.direction,
        replica: pack.replica,
        dp_ranks,
        cap: None,
        tokens,
        padded_tokens: pack.padded_tokens,
        slices: pack_slices,
        position_offsets: pack.position_offsets.clone(),
        packed_seq_params: packed_seq_params(pack, pad_multiple(cp_size)),
        cp_size,
        padding_cp_runs: if padding > 0 {
            members(tokens, padding)
        } else {
            Vec::new()
        },
        sub_batches: Vec::new(),
    }
}

/// Rows each segment of a pack run by a CP group of `cp_size` is padded to a multiple of.
fn pad_multiple(cp_size: u32) -> u32 {
    if cp_size > 1 {
        2 * cp_size
    } else {
        1
    }
}

/// Megatron's fields of a pack whose segments are padded to multiples of `multiple`.
fn packed_seq_params(pack: &PackLayout, multiple: u32) -> PackedSeqParams {
    let padding = pack.padded_tokens - pack.tokens();
    let cu_seqlens_q_padded = padded_offsets(&pack.cu_seqlens_q, padding, multiple);
    let cu_seqlens_kv_padded = padded_offsets(&pack.cu_seqlens_k, padding, multiple);
    PackedSeqParams {
        qkv_format: QkvFormat::Thd,
        cu_seqlens_q: pack.cu_seqlens_q.clone(),
        cu_seqlens_kv: pack.cu_seqlens_k.clone(),
        max_seqlen_q: longest_segment(&cu_seqlens_q_padded),
        max_seqlen_kv: longest_segment(&cu_seqlens_kv_padded),
        cu_seqlens_q_padded,
        cu_seqlens_kv_padded,
    }
}

/// Offsets of the segments of `offsets`, each rounded up to a multiple of `multiple` rows, the
/// last one after adding `padding` rows. Saturates (the int32 check then refuses the pack).
pub(super) fn padded_offsets(offsets: &[u32], padding: u32, multiple: u32) -> Vec<u32> {
    let round = |rows: u32| rows.div_ceil(multiple).saturating_mul(multiple);
    let segments = offsets.len().saturating_sub(1);
    let mut padded = Vec::with_capacity(offsets.len());
    let mut at = 0u32;
    padded.push(at);
    for (i, pair) in offsets.windows(2).enumerate() {
        let mut rows = pair[1] - pair[0];
        if i + 1 == segments {
            rows = rows.saturating_add(padding);
        }
        at = at.saturating_add(round(rows));
        padded.push(at);
    }
    padded
}

/// The longest segment of `offsets` (0 for none).
fn longest_segment(offsets: &[u32]) -> u32 {
    offsets.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0)
}

/// Per pack (document index), its replica (an index of `ir.replicas()`) and its first
/// position in that replica's schedule on the last stage, which is where the backwards start:
/// the order [`sub_batches`] reverses (a replica's schedule lists its own packs only, which
/// the verifier's `schedule-complete` and the JSON reader check). One table for the step, so
/// that ordering a forward pack's sub-batches does not walk its replica's schedule (that walk
/// per forward pack made a million-sample document quadratic).
fn backward_positions(ir: &StepIr, index: &HashMap<PackId, u32>) -> Vec<Option<(u32, u32)>> {
    let mut positions = vec![None; index.len()];
    let last = ir.spec.parallel.stages() - 1;
    for (r, &replica) in ir.replicas().iter().enumerate() {
        for (position, id) in ir.schedule(replica, last).iter().enumerate() {
            let slot = &mut positions[index[id] as usize];
            if slot.is_none() {
                *slot = Some((r as u32, position as u32));
            }
        }
    }
    positions
}

/// A forward pack's slices grouped by backward pack, the groups in the reverse of their
/// `position` in the replica's pack order on the last stage (`None`: not in it, last), which
/// runs each sample's slices in increasing start.
fn sub_batches(
    pack: &PackDocument,
    slices: &[SliceDocument],
    position: impl Fn(u32) -> Option<u32>,
) -> Vec<SubBatch> {
    let mut groups: Vec<SubBatch> = Vec::new();
    for (i, slice) in pack.slices.iter().enumerate() {
        let backward_pack = slices[slice.slice as usize].backward_pack;
        match groups.iter_mut().find(|g| g.backward_pack == backward_pack) {
            Some(group) => group.slices.push(i as u32),
            None => groups.push(SubBatch {
                backward_pack,
                slices: vec![i as u32],
            }),
        }
    }
    groups.sort_by_key(|group| std::cmp::Reverse(position(group.backward_pack)));
    groups
}

/// Refuses a pack whose rows, positions or K/V operand leave the int32 range.
fn check_int32(index: usize, pack: &PackDocument) -> Result<(), ScheduleError> {
    let params = &pack.packed_seq_params;
    let largest = [
        params.cu_seqlens_q_padded.last().copied().unwrap_or(0),
        params.cu_seqlens_kv_padded.last().copied().unwrap_or(0),
        params.cu_seqlens_kv.last().copied().unwrap_or(0),
        pack.padded_tokens,
        pack.slices.iter().map(|s| s.end).max().unwrap_or(0),
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    if largest > INT32_MAX {
        return Err(ScheduleError::Invalid(format!(
            "pack {index} ({}): its rows, positions or K/V operand reach {largest}, past the int32 range ({INT32_MAX}) of trainers' cu_seqlens and positions",
            pack.name
        )));
    }
    Ok(())
}
