//! Reading a document back into the step IR.
//!
//! The step is rebuilt from the document's inputs alone — spec, batch, samples, stages, the
//! replicas' DP ranks, the packs' slices (sample, start, end) and padding, and the schedules —
//! verified and lowered, and its document derived again ([`super::build`]). Every other field
//! (slice table, pack metadata, CP split, sub-batches, op lists, loss) must equal that
//! derivation; the first field that differs is named, so a tampered document is an error.

use serde_json::Value;

use slimpack_ir::step::{BatchInfo, Direction, Pack, Part, Phase, SliceId, Stage, StageOp, StepIr};
use slimpack_ir::{program, Spec};

use super::check;
use super::layout::Layout;
use super::{ScheduleDocument, ScheduleError};

/// The lowered, verified step of `doc` (see [`super::to_ir`]).
pub(super) fn to_ir(doc: &ScheduleDocument) -> Result<StepIr, ScheduleError> {
    let invalid = |message: String| ScheduleError::Invalid(message);
    doc.spec.validate()?;
    let layout = Layout::of_document(doc.spec.parallel, doc.cp_chosen)?;
    check::check(doc)?;
    let spec = Spec {
        parallel: layout.ir_parallel(),
        ..doc.spec.clone()
    };
    let stages: Vec<Stage> = doc
        .stages
        .iter()
        .enumerate()
        .map(|(index, s)| Stage {
            index: index as u32,
            first_layer: s.first_layer,
            layers: s.layers,
            recompute: s.recompute,
        })
        .collect();
    let batch = BatchInfo {
        source: doc.batch.source.clone(),
        context: doc.batch.context,
        documents: doc.batch.documents,
        documents_cut: doc.batch.documents_cut,
    };
    let mut ir = StepIr::with_stages(spec, batch, &stages);
    let samples: Vec<_> = doc.samples.iter().map(|&s| ir.add_bare_sample(s)).collect();

    // Slices: each sample's forward-pack slices, in offset order.
    let mut bounds: Vec<Vec<(u32, u32)>> = vec![Vec::new(); samples.len()];
    for pack in doc
        .packs
        .iter()
        .filter(|p| p.direction == slimpack_ir::step::Direction::Forward)
    {
        for slice in &pack.slices {
            bounds[slice.sample as usize].push((slice.start, slice.end));
        }
    }
    let mut slice_ids: Vec<Vec<(u32, SliceId)>> = Vec::with_capacity(samples.len());
    for (index, list) in bounds.iter_mut().enumerate() {
        list.sort_unstable();
        let mut ids = Vec::with_capacity(list.len());
        for &(start, end) in list.iter() {
            let slice = slimpack_ir::step::Slice {
                start,
                len: end - start,
            };
            ids.push((start, ir.add_slice(samples[index], slice)));
        }
        slice_ids.push(ids);
    }

    let replicas: Vec<_> = doc
        .replicas
        .iter()
        .map(|r| ir.add_replica(layout.ir_dp_ranks(&r.dp_ranks)))
        .collect();
    let mut pack_ids = Vec::with_capacity(doc.packs.len());
    for (p, pack) in doc.packs.iter().enumerate() {
        let replica = *replicas.get(pack.replica as usize).ok_or_else(|| {
            invalid(format!(
                "pack {p} ({}) is on replica {}, but there are {}",
                pack.name,
                pack.replica,
                replicas.len()
            ))
        })?;
        let mut members = Vec::with_capacity(pack.slices.len());
        for slice in &pack.slices {
            let id = slice_ids[slice.sample as usize]
                .iter()
                .find(|(start, _)| *start == slice.start)
                .filter(|&&(_, id)| ir.slice(id).end() == slice.end)
                .map(|&(_, id)| id)
                .ok_or_else(|| {
                    invalid(format!(
                        "pack {p} ({}): slice {}..{} of sample {} is in no forward pack",
                        pack.name, slice.start, slice.end, slice.sample
                    ))
                })?;
            let sample = samples[slice.sample as usize];
            if ir.replica_of_sample(sample).is_none() {
                ir.place_sample(sample, replica);
            }
            members.push(id);
        }
        let id = ir.add_pack(
            Pack {
                direction: pack.direction,
                cap: pack.cap,
            },
            replica,
            &members,
        );
        let tokens: u64 = pack.slices.iter().map(|s| u64::from(s.end - s.start)).sum();
        if u64::from(pack.padded_tokens) > tokens {
            ir.set_padding(id, pack.padded_tokens);
        }
        pack_ids.push(id);
    }
    let weight_grad_op = |pack: u32| {
        pack_ids
            .get(pack as usize)
            .map(|&pack| StageOp {
                pack,
                part: Part::WeightGrad,
            })
            .ok_or_else(|| {
                invalid(format!(
                    "schedule defers the weight gradient of pack {pack}"
                ))
            })
    };
    for entry in &doc.schedules {
        let replica = *replicas
            .get(entry.replica as usize)
            .ok_or_else(|| invalid(format!("schedule names replica {}", entry.replica)))?;
        let order = entry
            .packs
            .iter()
            .map(|&p| {
                pack_ids
                    .get(p as usize)
                    .copied()
                    .ok_or_else(|| invalid(format!("schedule names pack {p}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if entry.stage >= doc.spec.parallel.stages() {
            return Err(invalid(format!("schedule names stage {}", entry.stage)));
        }
        // The chain with each deferred weight gradient after its first `after` entries.
        let mut ops: Vec<StageOp> = Vec::with_capacity(order.len() + entry.weight_grads.len());
        let mut next = entry.weight_grads.iter().peekable();
        for (position, &pack) in order.iter().enumerate() {
            while let Some(weight) = next.next_if(|w| w.after as usize <= position) {
                ops.push(weight_grad_op(weight.pack)?);
            }
            ops.push(StageOp::whole(pack));
        }
        for weight in next {
            if weight.after as usize > order.len() {
                return Err(invalid(format!(
                    "schedule defers the weight gradient of pack {} after {} of its {} packs",
                    weight.pack,
                    weight.after,
                    order.len()
                )));
            }
            ops.push(weight_grad_op(weight.pack)?);
        }
        ir.set_stage_ops(replica, entry.stage, &ops);
    }
    for entry in &doc.interleave {
        let replica = *replicas
            .get(entry.replica as usize)
            .ok_or_else(|| invalid(format!("interleave names replica {}", entry.replica)))?;
        if doc.spec.parallel.vpp == 1 || entry.pp >= doc.spec.parallel.pp {
            return Err(invalid(format!(
                "interleave names pipeline device {} of {} (interleaves need vpp > 1)",
                entry.pp, doc.spec.parallel
            )));
        }
        ir.set_interleave(replica, entry.pp, &entry.chunks);
    }
    let mut own = std::collections::HashSet::new();
    for (at, entry) in doc.pack_recompute.iter().enumerate() {
        if entry.stage >= doc.spec.parallel.stages() {
            return Err(invalid(format!(
                "pack_recompute names stage {} of {}",
                entry.stage,
                doc.spec.parallel.stages()
            )));
        }
        // The canonical form, checked here so that an error says what is wrong with it.
        let before = &doc.pack_recompute[..at];
        let previous = before.last();
        let canonical = !entry.packs.is_empty()
            && entry.packs.windows(2).all(|pair| pair[0] < pair[1])
            && previous.is_none_or(|previous| {
                previous.stage < entry.stage
                    || (previous.stage == entry.stage
                        && previous.packs.first() < entry.packs.first())
            })
            && !before
                .iter()
                .any(|other| other.stage == entry.stage && other.recompute == entry.recompute);
        if !canonical {
            return Err(invalid(format!(
                "pack_recompute entry {at} (stage {}, {}): entries go by increasing stage, one \
                 per mode of a stage in the order of their first pack, each with its packs \
                 increasing, none empty",
                entry.stage, entry.recompute
            )));
        }
        let stage_mode = doc
            .stages
            .get(entry.stage as usize)
            .and_then(|stage| stage.recompute)
            .unwrap_or(doc.spec.model.recompute);
        if entry.recompute == stage_mode {
            return Err(invalid(format!(
                "pack_recompute entry {at} names stage {}'s own mode {}: an entry names packs \
                 that save under another mode than their stage's",
                entry.stage, entry.recompute
            )));
        }
        for &p in &entry.packs {
            let pack = pack_ids
                .get(p as usize)
                .copied()
                .filter(|&pack| ir.pack(pack).direction == Direction::Forward)
                .ok_or_else(|| {
                    invalid(format!("pack_recompute names pack {p}, no forward pack"))
                })?;
            if !own.insert((p, entry.stage)) {
                return Err(invalid(format!(
                    "pack_recompute names pack {p} on stage {} twice",
                    entry.stage
                )));
            }
            ir.set_pack_recompute(pack, entry.stage, Some(entry.recompute));
        }
    }
    if let Some(pair) = doc
        .rank_orders
        .windows(2)
        .find(|pair| (pair[0].dp, pair[0].pp) >= (pair[1].dp, pair[1].pp))
    {
        return Err(invalid(format!(
            "rank_orders lists dp={} pp={} after dp={} pp={}: entries go in increasing (dp, pp), each once",
            pair[1].dp, pair[1].pp, pair[0].dp, pair[0].pp
        )));
    }
    for entry in &doc.rank_orders {
        let order = entry
            .replicas
            .iter()
            .map(|&r| {
                replicas
                    .get(r as usize)
                    .copied()
                    .ok_or_else(|| invalid(format!("rank_orders names replica {r}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let rank = match layout.ir_dp_ranks(&[entry.dp])[..] {
            [rank] if entry.dp < doc.spec.parallel.dp && entry.pp < doc.spec.parallel.pp => rank,
            _ => {
                return Err(invalid(format!(
                    "rank_orders names dp={} pp={}, which is no DP rank and pipeline device of {}",
                    entry.dp, entry.pp, doc.spec.parallel
                )))
            }
        };
        ir.set_rank_order(rank, entry.pp, &order);
    }
    ir.advance(Phase::Scheduled);
    slimpack_ir::verify::verify(&ir)?;
    program::lower_into(&mut ir).map_err(|e| invalid(e.message))?;
    ir.advance(Phase::Lowered);
    let again = super::build::document(&ir, doc.predicted.clone())?;
    if again != *doc {
        let expected = serde_json::to_value(&again)?;
        let found = serde_json::to_value(doc)?;
        return Err(invalid(difference(&expected, &found)));
    }
    Ok(ir)
}

/// Names the first field where `found` (the document) differs from `expected` (what its
/// schedule gives), e.g. `pack 3: packed_seq_params.cu_seqlens_kv[2] is 9, but the schedule
/// gives 12`.
fn difference(expected: &Value, found: &Value) -> String {
    let mut path = Vec::new();
    let (mut expected, mut found) = (expected, found);
    loop {
        let next = match (expected, found) {
            (Value::Object(e), Value::Object(f)) => e
                .iter()
                .find(|(key, value)| f.get(*key) != Some(*value))
                .map(|(key, value)| (key.clone(), value, f.get(key).unwrap_or(&Value::Null)))
                .or_else(|| {
                    f.iter()
                        .find(|(key, _)| !e.contains_key(*key))
                        .map(|(key, value)| (key.clone(), &Value::Null, value))
                }),
            (Value::Array(e), Value::Array(f)) if e.len() == f.len() => e
                .iter()
                .zip(f)
                .enumerate()
                .find(|(_, (a, b))| a != b)
                .map(|(i, (a, b))| (i.to_string(), a, b)),
            _ => None,
        };
        match next {
            Some((step, e, f)) => {
                path.push(step);
                (expected, found) = (e, f);
            }
            None => break,
        }
    }
    let place = describe(&path);
    let shown = |value: &Value| {
        let text = value.to_string();
        if text.chars().count() > 60 {
            format!("{}…", text.chars().take(60).collect::<String>())
        } else {
            text
        }
    };
    format!(
        "{place} is {}, but the schedule gives {} (derived fields must not be edited)",
        shown(found),
        shown(expected)
    )
}

/// A readable place from a JSON path: `pack 3: packed_seq_params.cu_seqlens_kv[2]`,
/// `devices (rank 5): ops[0]`.
fn describe(path: &[String]) -> String {
    let mut parts = path.iter();
    let head = match (parts.next(), path.get(1)) {
        (Some(field), Some(index)) if index.parse::<usize>().is_ok() => {
            parts.next();
            match field.as_str() {
                "packs" => format!("pack {index}"),
                "devices" => format!("devices (rank {index})"),
                "slices" => format!("slice {index}"),
                "replicas" => format!("replica {index}"),
                "groups" => format!("group {index}"),
                other => format!("{other}[{index}]"),
            }
        }
        (Some(field), _) => field.clone(),
        (None, _) => return "the document".to_string(),
    };
    let mut rest = String::new();
    for part in parts {
        if part.parse::<usize>().is_ok() {
            rest.push_str(&format!("[{part}]"));
        } else {
            if !rest.is_empty() {
                rest.push('.');
            }
            rest.push_str(part);
        }
    }
    if rest.is_empty() {
        head
    } else {
        format!("{head}: {rest}")
    }
}
