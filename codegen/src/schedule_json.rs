//! The schedule JSON (`compile --emit json`): a lowered step, self-contained, for trainers.
//!
//! A document holds everything needed to run the step without slimpack — and everything needed
//! to read it back into the step IR ([`to_ir`]), which is how `slimpack simulate schedule.json`
//! reproduces compile's report:
//! - `format` (`"slimpack.schedule"`) and `version` ([`VERSION`]; bumped on any incompatible
//!   change);
//! - `spec` (model, cluster, parallel layout) and `batch` (where the lengths came from);
//! - `samples` in batch order (`len`, source `doc`, context `piece`): packs name them by index;
//! - `stages` (layer ranges) and `replicas` (DP ranks; two or more form a DP-Merge CP group);
//! - `packs`: per pack its direction, replica, slices (`sample`, `start`, `end`, `kv_start`) and
//!   the varlen metadata of Megatron's packed THD format or a varlen-attention loop
//!   (`cu_seqlens_q/k`, `max_seqlen_q/k`, `position_offsets`, `padded_tokens`);
//! - `schedules`: per replica and stage, the order of its packs;
//! - `devices`: per global rank (Megatron order: tp fastest, then cp, dp, pp) its coordinates and
//!   its ops in order, peers as global ranks — see [`DeviceOp`];
//! - `predicted`: the simulator's metrics for this schedule, when compile simulated it.
//!
//! The JSON Schema ([`schema`], `slimpack schema` on the command line, shipped as
//! `docs/schedule.schema.json`) is generated from these types.

use std::collections::HashMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use slimpack_ir::batch::Sample;
use slimpack_ir::program::{self, Op, PackLayout, Program, Worker};
use slimpack_ir::spec::{Coords, ParallelSpec};
use slimpack_ir::step::{BatchInfo, Direction, Pack, PackId, Phase, SliceId, Stage, StepIr};
use slimpack_ir::Spec;

/// The value of the `format` field.
pub const FORMAT: &str = "slimpack.schedule";
/// The document version this build writes and reads.
pub const VERSION: u32 = 1;

/// A schedule document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleDocument {
    /// Always `"slimpack.schedule"`.
    pub format: String,
    /// The document version (see the module docs).
    pub version: u32,
    pub spec: Spec,
    pub batch: BatchDocument,
    /// Samples in batch order; packs refer to them by index.
    pub samples: Vec<Sample>,
    pub stages: Vec<StageDocument>,
    pub replicas: Vec<ReplicaDocument>,
    pub packs: Vec<PackDocument>,
    pub schedules: Vec<ScheduleEntry>,
    /// Per replica and pipeline device, how it interleaves its model chunks (`vpp > 1` only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interleave: Vec<InterleaveEntry>,
    pub devices: Vec<Device>,
    /// The simulator's metrics for this schedule (step time, memory, ...), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted: Option<serde_json::Value>,
}

/// Where the batch came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct BatchDocument {
    pub source: String,
    /// Context length longer documents were cut to, if any.
    pub context: Option<u32>,
    pub documents: u64,
    pub documents_cut: u64,
}

/// A pipeline stage: layers `[first_layer, first_layer + layers)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StageDocument {
    pub first_layer: u32,
    pub layers: u32,
}

/// A replica: its DP ranks (two or more: a DP-Merge group acting as one CP group).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ReplicaDocument {
    pub dp_ranks: Vec<u32>,
}

/// A pack: its layout and the token cap it was built under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PackDocument {
    #[serde(flatten)]
    pub layout: PackLayout,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap: Option<u32>,
}

/// The order of one replica's packs on one stage (indices into `packs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ScheduleEntry {
    pub replica: u32,
    pub stage: u32,
    pub packs: Vec<u32>,
}

/// One device and its ops in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Device {
    /// Global rank.
    pub rank: u64,
    pub coords: Coords,
    pub ops: Vec<DeviceOp>,
}

/// An op of one device; packs are indices into `packs`, peers are global ranks. TP (and static
/// CP) peers run the same ops; each exchanges with the peer that has its own tp/cp coordinates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum DeviceOp {
    /// The forward of `pack` on this device's layers (its share of the tokens in a CP group);
    /// with model chunks (`vpp > 1`), on those of chunk `chunk`.
    Forward {
        pack: u32,
        #[serde(default, skip_serializing_if = "is_zero")]
        chunk: u32,
    },
    /// The backward of `pack` on this device's layers (of chunk `chunk`).
    Backward {
        pack: u32,
        #[serde(default, skip_serializing_if = "is_zero")]
        chunk: u32,
    },
    /// The context-parallel K/V exchange of `pack` among `ranks` (a DP-Merge group).
    CpExchange {
        pack: u32,
        direction: Direction,
        ranks: Vec<u64>,
        #[serde(default, skip_serializing_if = "is_zero")]
        chunk: u32,
    },
    /// Send `pack`'s activations (forward) or input gradients (backward) of chunk `chunk` to
    /// `to`.
    Send {
        pack: u32,
        direction: Direction,
        to: u64,
        #[serde(default, skip_serializing_if = "is_zero")]
        chunk: u32,
    },
    /// Receive `pack`'s activations (forward) or output gradients (backward) for chunk
    /// `chunk` from `from`.
    Recv {
        pack: u32,
        direction: Direction,
        from: u64,
        #[serde(default, skip_serializing_if = "is_zero")]
        chunk: u32,
    },
    /// Reduce-scatter the stage's gradients among `ranks` (every DP rank of the stage).
    ReduceScatter { ranks: Vec<u64> },
    /// The optimizer step on this device's shard.
    Optimizer,
    /// All-gather the stage's updated parameters among `ranks`.
    AllGather { ranks: Vec<u64> },
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}

/// With model chunks (`vpp > 1`): the chunk of each pack pipeline device `pp` runs for
/// `replica`, in order (the device merges its stages' schedules by it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InterleaveEntry {
    pub replica: u32,
    pub pp: u32,
    pub chunks: Vec<u32>,
}

/// Errors reading a document.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("not a slimpack schedule (format '{0}', expected '{FORMAT}')")]
    Format(String),
    #[error("schedule version {0} is not supported (this build reads version {VERSION})")]
    Version(u32),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Ir(#[from] slimpack_ir::IrError),
}

/// The document of `ir` (phase `scheduled` or later), with the simulator's metrics if given.
///
/// # Panics
/// If `ir` is not scheduled (callers check the phase).
pub fn document(ir: &StepIr, predicted: Option<serde_json::Value>) -> ScheduleDocument {
    let program = program::program_of(ir);
    let order = program::pack_order(ir);
    let packs = program
        .packs
        .iter()
        .zip(&order)
        .map(|(layout, &(id, _))| PackDocument {
            layout: layout.clone(),
            cap: ir.pack(id).cap,
        })
        .collect();
    let index: HashMap<PackId, u32> = order
        .iter()
        .enumerate()
        .map(|(i, &(id, _))| (id, i as u32))
        .collect();
    let mut schedules = Vec::new();
    for (r, &replica) in ir.replicas().iter().enumerate() {
        for &stage in ir.stages() {
            let stage = ir.stage(stage).index;
            let order = ir.schedule(replica, stage);
            if !order.is_empty() {
                schedules.push(ScheduleEntry {
                    replica: r as u32,
                    stage,
                    packs: order.into_iter().map(|id| index[&id]).collect(),
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
    ScheduleDocument {
        format: FORMAT.to_string(),
        version: VERSION,
        spec: ir.spec.clone(),
        batch: BatchDocument {
            source: ir.batch.source.clone(),
            context: ir.batch.context,
            documents: ir.batch.documents,
            documents_cut: ir.batch.documents_cut,
        },
        samples: ir.samples().iter().map(|&s| *ir.sample(s)).collect(),
        stages: ir
            .stages()
            .iter()
            .map(|&s| {
                let stage = ir.stage(s);
                StageDocument {
                    first_layer: stage.first_layer,
                    layers: stage.layers,
                }
            })
            .collect(),
        replicas: ir
            .replicas()
            .iter()
            .map(|&r| ReplicaDocument {
                dp_ranks: ir.replica(r).ranks.clone(),
            })
            .collect(),
        packs,
        schedules,
        interleave,
        devices: devices(&ir.spec.parallel, &program),
        predicted,
    }
}

/// Every global rank's ops: its worker's ops with peers resolved to global ranks.
fn devices(parallel: &ParallelSpec, program: &Program) -> Vec<Device> {
    (0..parallel.world())
        .map(|rank| {
            let coords = parallel.coords(rank);
            let at = |worker: Worker| {
                parallel.rank(Coords {
                    dp: worker.dp,
                    pp: worker.pp,
                    ..coords
                })
            };
            let stage_ranks = || -> Vec<u64> {
                (0..program.dp)
                    .map(|dp| at(Worker { dp, pp: coords.pp }))
                    .collect()
            };
            let worker = program.worker(Worker {
                dp: coords.dp,
                pp: coords.pp,
            });
            let ops = worker
                .ops
                .iter()
                .map(|op| match op {
                    &Op::Forward { pack, chunk } => DeviceOp::Forward { pack, chunk },
                    &Op::Backward { pack, chunk } => DeviceOp::Backward { pack, chunk },
                    Op::CpExchange {
                        pack,
                        direction,
                        group,
                        chunk,
                    } => DeviceOp::CpExchange {
                        pack: *pack,
                        direction: *direction,
                        ranks: group
                            .iter()
                            .map(|&dp| at(Worker { dp, pp: coords.pp }))
                            .collect(),
                        chunk: *chunk,
                    },
                    Op::Send {
                        pack,
                        direction,
                        to,
                        chunk,
                    } => DeviceOp::Send {
                        pack: *pack,
                        direction: *direction,
                        to: at(*to),
                        chunk: *chunk,
                    },
                    Op::Recv {
                        pack,
                        direction,
                        from,
                        chunk,
                    } => DeviceOp::Recv {
                        pack: *pack,
                        direction: *direction,
                        from: at(*from),
                        chunk: *chunk,
                    },
                    Op::ReduceScatter => DeviceOp::ReduceScatter {
                        ranks: stage_ranks(),
                    },
                    Op::Optimizer => DeviceOp::Optimizer,
                    Op::AllGather => DeviceOp::AllGather {
                        ranks: stage_ranks(),
                    },
                })
                .collect();
            Device { rank, coords, ops }
        })
        .collect()
}

/// Reads a document from JSON text, checking its format and version.
pub fn parse(text: &str) -> Result<ScheduleDocument, ScheduleError> {
    #[derive(Deserialize)]
    struct Header {
        format: Option<String>,
        version: Option<u32>,
    }
    let header: Header = serde_json::from_str(text)?;
    let format = header.format.unwrap_or_default();
    if format != FORMAT {
        return Err(ScheduleError::Format(format));
    }
    match header.version {
        Some(VERSION) => Ok(serde_json::from_str(text)?),
        other => Err(ScheduleError::Version(other.unwrap_or(0))),
    }
}

/// The step IR a document describes (phase `lowered`), verified, so that it simulates, prints
/// and lowers exactly like the IR the document was written from. The document's `devices` must
/// be what that IR lowers to: they are derived data, and a hand-edited op list is an error.
pub fn to_ir(doc: &ScheduleDocument) -> Result<StepIr, ScheduleError> {
    let invalid = |message: String| ScheduleError::Invalid(message);
    doc.spec.validate()?;
    check::check(doc)?;
    let stages: Vec<Stage> = doc
        .stages
        .iter()
        .enumerate()
        .map(|(index, s)| Stage {
            index: index as u32,
            first_layer: s.first_layer,
            layers: s.layers,
        })
        .collect();
    let batch = BatchInfo {
        source: doc.batch.source.clone(),
        context: doc.batch.context,
        documents: doc.batch.documents,
        documents_cut: doc.batch.documents_cut,
    };
    let mut ir = StepIr::with_stages(doc.spec.clone(), batch, &stages);
    let samples: Vec<_> = doc.samples.iter().map(|&s| ir.add_bare_sample(s)).collect();

    // Slices: each sample's forward-pack slices, in offset order.
    let mut bounds: Vec<Vec<(u32, u32)>> = vec![Vec::new(); samples.len()];
    for (p, pack) in doc.packs.iter().enumerate() {
        if pack.layout.direction != Direction::Forward {
            continue;
        }
        for slice in &pack.layout.slices {
            let list = bounds.get_mut(slice.sample as usize).ok_or_else(|| {
                invalid(format!(
                    "pack {p} names sample {}, but there are {}",
                    slice.sample,
                    samples.len()
                ))
            })?;
            list.push((slice.start, slice.end));
        }
    }
    let mut slice_ids: Vec<Vec<(u32, SliceId)>> = Vec::with_capacity(samples.len());
    for (index, list) in bounds.iter_mut().enumerate() {
        list.sort_unstable();
        let mut ids = Vec::with_capacity(list.len());
        for &(start, end) in list.iter() {
            if end <= start {
                return Err(invalid(format!(
                    "sample {index}: empty slice {start}..{end}"
                )));
            }
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
        .map(|r| ir.add_replica(r.dp_ranks.clone()))
        .collect();
    let mut pack_ids = Vec::with_capacity(doc.packs.len());
    for (p, pack) in doc.packs.iter().enumerate() {
        let layout = &pack.layout;
        let replica = *replicas.get(layout.replica as usize).ok_or_else(|| {
            invalid(format!(
                "pack {} is on replica {}, but there are {}",
                layout.name,
                layout.replica,
                replicas.len()
            ))
        })?;
        let mut members = Vec::with_capacity(layout.slices.len());
        for slice in &layout.slices {
            let id = slice_ids
                .get(slice.sample as usize)
                .and_then(|ids| ids.iter().find(|(start, _)| *start == slice.start))
                .filter(|&&(_, id)| ir.slice(id).end() == slice.end)
                .map(|&(_, id)| id)
                .ok_or_else(|| {
                    invalid(format!(
                        "pack {p} ({}): slice {}..{} of sample {} is in no forward pack",
                        layout.name, slice.start, slice.end, slice.sample
                    ))
                })?;
            if ir
                .replica_of_sample(samples[slice.sample as usize])
                .is_none()
            {
                ir.place_sample(samples[slice.sample as usize], replica);
            }
            members.push(id);
        }
        let id = ir.add_pack(
            Pack {
                direction: layout.direction,
                cap: pack.cap,
            },
            replica,
            &members,
        );
        if layout.padded_tokens > layout.tokens() {
            ir.set_padding(id, layout.padded_tokens);
        }
        pack_ids.push(id);
    }
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
        ir.set_schedule(replica, entry.stage, &order);
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
    ir.advance(Phase::Scheduled);
    slimpack_ir::verify::verify(&ir)?;
    program::lower_into(&mut ir).map_err(|e| invalid(e.message))?;
    ir.advance(Phase::Lowered);
    let again = document(&ir, doc.predicted.clone());
    if again.packs != doc.packs {
        let at = again
            .packs
            .iter()
            .zip(&doc.packs)
            .position(|(a, b)| a != b)
            .unwrap_or(again.packs.len().min(doc.packs.len()));
        return Err(invalid(format!(
            "pack {at}: its layout (order, names or varlen metadata) is not what its slices give"
        )));
    }
    if again.devices != doc.devices {
        let at = again
            .devices
            .iter()
            .zip(&doc.devices)
            .find(|(a, b)| a != b)
            .map_or("count".to_string(), |(a, _)| format!("rank {}", a.rank));
        return Err(invalid(format!(
            "devices ({at}): the op lists are derived from the schedules and do not match them"
        )));
    }
    Ok(ir)
}

/// The JSON Schema of [`ScheduleDocument`], pretty-printed.
pub fn schema() -> String {
    let schema = schemars::schema_for!(ScheduleDocument);
    let mut text = serde_json::to_string_pretty(&schema).expect("a schema always serialises");
    text.push('\n');
    text
}

mod check;
#[cfg(test)]
mod tests;
