//! From a scheduled step IR to the task graph, every task timed and sized by the cost model.
//!
//! Tasks, per replica `r`, pipeline stage `s` and pack `p` (a replica's tasks at `s` run on the
//! device groups of its DP ranks on pipeline device `s mod pp`; with model chunks, `vpp > 1`, a
//! device runs several stages):
//! - `F p` / `B p` on the compute stream, chained per device in the order of
//!   `StepIr::device_schedule(r, device)`; a DP rank in several replicas (a plain replica and
//!   a DP-Merge group) runs them as the lowered program does (`slimpack_ir::program`): in the
//!   order the IR gives the rank's device where it gives one (`StepIr::rank_order`: each task
//!   after the one before it there), otherwise one after the other in the IR's replica order
//!   (the first task of a replica on the rank's group follows the last task of the replica
//!   before it there). [`SharedRanks::FirstComeFirstServed`] leaves them unchained instead, for
//!   `interleave-ranks` to read an order off;
//! - forward `p` on `s` → send → forward `p` on `s + 1`; backward `p` on `s + 1` → send →
//!   backward `p` on `s`; a send holds the communication streams of both ends;
//! - backward `p` on the last stage after the last-stage forward of every slice it holds (so,
//!   through the chain of sends, after that forward on every stage);
//! - zero-bubble schedules (a backward split, see `slimpack_ir::step::Part`): the input
//!   gradient `B p` takes the backward's place above; the weight gradient `W p` follows it in
//!   the device's order (and after it), and only the DP sync below waits for it. `B` frees the
//!   pack's saved activations as a whole backward does less what the deferred weight gradient
//!   keeps (`MemoryModel::weight_grad_bytes`; the excess, if that is more, is allocated), which
//!   `W` frees;
//! - per pipeline device: every backward of its stages, on every replica → gradient
//!   reduce-scatter → optimizer step → parameter all-gather. A device's sync overlaps the
//!   backwards still running on other devices.
//!
//! Durations come from [`CostModel`] — under each stage's own recomputation where a pass
//! assigned one (`StepIr::stage_recompute`, [`CostModel::with_recompute`]): a pack's critical path (compute, exposed TP collectives,
//! the part of a merged group's CP exchange that the attention kernels cannot hide), sends,
//! the two halves of the DP sync, the optimizer step. Nothing here computes a cost itself.
//!
//! Each pack compute task is tagged with what its time goes to ([`ComputeParts`]): its FLOPs
//! split into useful (priced with [`CostModel::without_recompute`]), recomputed and padding
//! work at the saturated kernel rates, and the cost model's other components. [`Built`]
//! carries what the step's floor needs besides (see `metrics`).
//!
//! `pack_times` times a pack's part on a stage and splits its FLOPs (once per set of alike
//! stages); `memory_effects` sizes what it does to memory. `bounds` uses the same gathering
//! and timing without building the graph: the peak memory of each device from its schedule
//! alone, and lower bounds on the step for the tuner.

use std::ops::Range;

use crate::cost::{exposed_tp_comm, CostModel, PackTime, PackWork};
use slimpack_ir::spec::Recompute;
use slimpack_ir::step::{Direction, PackId, Part, SliceId, StepIr};

use super::layout::{GroupId, Layout};
use super::memory::MemoryEffect;
use super::result::PackInfo;
use super::task::{ComputeParts, PackIndex, Task, TaskGraph, TaskGraphBuilder, TaskId, TaskKind};
use crate::error::MachineError;

mod bounds;
mod memory_effects;
mod pack_modes;
mod pack_times;
mod shared_ranks;
pub(super) use bounds::{compute_bound, forward_bound, schedule_bound, UntimedPeaks};
pub use bounds::{Timeline, TimelineOp};
use pack_times::{SaturatedRates, StageShare};
pub use shared_ranks::SharedRanks;

/// Marks an empty slot of a node-indexed table.
const NONE: u32 = u32::MAX;

/// The task graph and what the executor and the metrics need besides it.
pub(super) struct Built {
    pub graph: TaskGraph,
    pub packs: Vec<PackInfo>,
    /// DP ranks of each replica, in the IR's replica order.
    pub replicas: Vec<Vec<u32>>,
    /// Model states plus workspace of each device group.
    pub baselines: Vec<u64>,
    /// Model FLOPs of the whole step (the MFU numerator).
    pub model_flops: f64,
    /// Tokens of the step.
    pub tokens: u64,
    /// Device-seconds of the per-token work no schedule avoids beside the useful FLOPs: the
    /// memory-bound kernels and the TP collectives' first ring step, priced as one pack of
    /// all the step's real tokens per stage and direction without recomputation.
    pub floor_overhead_device_s: f64,
    /// The shortest DP sync tail of any stage: gradient reduce-scatter, optimizer step and
    /// parameter all-gather, which follow the stage's last backward.
    pub min_sync_tail_s: f64,
}

/// One slice as the builder needs it.
struct SliceInfo {
    /// The tokens of it each device of its pack's CP group holds (`len / split`, rounded up).
    share: u64,
    /// The last slice of its sample: its backward is the sample's first and allocates the
    /// dK/dV accumulators of `earlier` (positions in `Builder::earlier_shares`).
    last: bool,
    earlier: Range<u32>,
    /// The slice's IR node index.
    node: usize,
    /// The pad tokens of a padded pack, not a slice of the batch.
    padding: bool,
}

/// One entry of a device's schedule ([`Builder::walk_schedules`]).
#[derive(Debug, Clone, Copy)]
struct Scheduled {
    /// The pipeline device whose schedule lists it.
    device: u32,
    /// The first entry of the device's schedule.
    first: bool,
    pack: PackIndex,
    stage: u32,
    part: Part,
}

/// Builds the task graph of `ir` (which must be scheduled) under `cost`.
pub(super) fn build(
    ir: &StepIr,
    cost: &CostModel,
    layout: Layout,
    shared: SharedRanks,
) -> Result<Built, MachineError> {
    check_stages(ir, layout)?;
    let mut builder = Builder::new(ir, cost, layout)?;
    builder.collect_packs(true, None);
    builder.read_pack_modes();
    builder.compute_tasks(shared)?;
    builder.pipeline_sends();
    builder.last_stage_edges();
    builder.dp_sync();
    Ok(builder.finish())
}

/// The IR's stages are those of the layout.
fn check_stages(ir: &StepIr, layout: Layout) -> Result<(), MachineError> {
    let stages = ir.spec.parallel.stages();
    if ir.stages().len() != stages as usize || ir.spec.parallel.pp != layout.pp {
        return Err(MachineError::Stages {
            stages: ir.stages().len(),
            pp: stages,
        });
    }
    Ok(())
}

/// Per stage of `ir`, `cost` under the stage's own recomputation where it differs from the
/// model's.
fn stage_costs(ir: &StepIr, cost: &CostModel) -> Vec<Option<CostModel>> {
    let model = ir.spec.model.recompute;
    (0..ir.spec.parallel.stages())
        .map(|stage| {
            let mode = ir.stage_recompute(stage);
            (mode != model).then(|| cost.with_recompute(mode))
        })
        .collect()
}

struct Builder<'a> {
    ir: &'a StepIr,
    cost: &'a CostModel,
    layout: Layout,
    rates: SaturatedRates,
    /// The same machine without recomputation: prices the useful FLOPs and the floor.
    useful_cost: CostModel,
    /// Per stage, the machine under the stage's own recomputation where it has one other
    /// than the model's (`StepIr::stage_recompute`); `None`: `cost`.
    stage_costs: Vec<Option<CostModel>>,
    /// Per stage, its recomputation mode as an index among the step's distinct modes (the
    /// model's first), and how many there are: a pack's [`StageShare`] depends on it.
    stage_modes: Vec<usize>,
    modes: usize,
    /// The machine under each mode a pack saves under instead of its stage's
    /// (`StepIr::saved_recompute`), and per (pack, stage), `pack · stages + stage`, the index
    /// of its mode there among them (`SAME_AS_STAGE`: the stage's); empty where no pack has a
    /// mode of its own (see `pack_modes`).
    pack_costs: Vec<(Recompute, CostModel)>,
    pack_modes: Vec<u16>,
    replicas: Vec<Vec<u32>>,
    packs: Vec<PackInfo>,
    /// The sums over each pack's slices its time needs on every stage.
    works: Vec<PackWork>,
    /// Per (pack, stage ends, part), its FLOP seconds and memory effect, computed for the
    /// first stage with those ends and read for the others ([`crate::cost::StageEnds`]).
    stage_shares: Vec<Option<StageShare>>,
    /// Per replica, per stage, its class among the stages on which the replica's packs take
    /// the same time ([`CostModel::alike_stages`]), and the most classes of a replica.
    time_classes: Vec<Vec<u32>>,
    classes: usize,
    /// Per (pack, time class, part, mode) of one replica's packs, `times_replica`'s, their
    /// time ([`Builder::stage_time`]): the walk of the schedules goes replica by replica, so
    /// one replica's table at a time (sized for the largest replica, not the step: a table of
    /// every pack took tens of megabytes per simulation on a million-sample step).
    stage_times: Vec<Option<PackTime>>,
    times_replica: usize,
    /// The first pack index of each replica and its pack count (a replica's packs are
    /// consecutive).
    replica_packs: Vec<(u32, u32)>,
    /// Slices of each pack, as positions in `slices` / `pairs`.
    pack_slices: Vec<Range<u32>>,
    slices: Vec<SliceInfo>,
    /// `(len, prefix)` of each slice, the shape the cost model takes.
    pairs: Vec<(u64, u64)>,
    earlier_shares: Vec<u64>,
    /// Pack index by IR node index, and the IR's pack of each index.
    pack_of_node: Vec<u32>,
    pack_ids: Vec<PackId>,
    /// Forward pack index by slice node index.
    forward_of_node: Vec<u32>,
    /// Compute task of (pack, pipeline stage): `compute[pack · stages + stage]`.
    stages: u32,
    compute: Vec<TaskId>,
    /// Deferred weight-gradient task of (pack, pipeline stage), where the backward is split.
    weight_grads: Vec<TaskId>,
    tasks: TaskGraphBuilder,
    model_flops: f64,
    tokens: u64,
    min_sync_tail_s: f64,
}

impl<'a> Builder<'a> {
    fn new(
        ir: &'a StepIr,
        cost: &'a CostModel,
        layout: Layout,
    ) -> Result<Builder<'a>, MachineError> {
        let mut replicas = Vec::with_capacity(ir.replicas().len());
        for (index, &replica) in ir.replicas().iter().enumerate() {
            let ranks = ir.replica(replica).ranks.clone();
            if ranks.is_empty() {
                return Err(MachineError::EmptyReplica { replica: index });
            }
            if let Some(&rank) = ranks.iter().find(|&&rank| rank >= layout.dp) {
                return Err(MachineError::RankOutOfRange {
                    replica: index,
                    rank,
                    dp: layout.dp,
                });
            }
            replicas.push(ranks);
        }
        let node_bound = ir
            .graph()
            .node_indices()
            .map(|n| n.index() + 1)
            .max()
            .unwrap_or(0);
        Ok(Builder {
            ir,
            cost,
            layout,
            rates: SaturatedRates::new(cost),
            useful_cost: cost.without_recompute(),
            stage_costs: stage_costs(ir, cost),
            stage_modes: Vec::new(),
            modes: 1,
            pack_costs: Vec::new(),
            pack_modes: Vec::new(),
            replicas,
            packs: Vec::new(),
            works: Vec::new(),
            stage_shares: Vec::new(),
            time_classes: Vec::new(),
            classes: 1,
            stage_times: Vec::new(),
            times_replica: usize::MAX,
            replica_packs: Vec::new(),
            pack_slices: Vec::new(),
            slices: Vec::new(),
            pairs: Vec::new(),
            earlier_shares: Vec::new(),
            pack_of_node: vec![NONE; node_bound],
            pack_ids: Vec::new(),
            forward_of_node: vec![NONE; node_bound],
            stages: ir.spec.parallel.stages(),
            compute: Vec::new(),
            weight_grads: Vec::new(),
            tasks: TaskGraphBuilder::default(),
            model_flops: 0.0,
            tokens: 0,
            min_sync_tail_s: f64::INFINITY,
        })
    }

    /// Numbers the packs as the IR's text form does (per replica, forward then backward) and
    /// gathers their slices (of every replica, or `only` one); with `timed`, also what their
    /// durations and the step's FLOPs need.
    fn collect_packs(&mut self, timed: bool, only: Option<usize>) {
        let ir = self.ir;
        let mut numbers = [0u32; 2];
        // Each replica's packs in both directions, and the tables sized once for them (a
        // tuning simulates hundreds of steps: growing them pack by pack copied megabytes).
        let placed: Vec<[Vec<PackId>; 2]> = (ir.replicas().iter().enumerate())
            .map(|(replica, &replica_id)| match only {
                Some(only) if only != replica => Default::default(),
                _ => [Direction::Forward, Direction::Backward]
                    .map(|direction| ir.packs_on(replica_id, direction)),
            })
            .collect();
        let packs: usize = placed.iter().flatten().map(Vec::len).sum();
        let members: usize = (placed.iter().flatten().flatten())
            .map(|&pack| ir.pack_members(pack).len())
            .sum();
        self.packs.reserve(packs);
        self.pack_ids.reserve(packs);
        self.pack_slices.reserve(packs);
        if timed {
            self.works.reserve(packs);
        }
        // A padded pack has one slice more.
        self.slices.reserve(members + packs);
        self.pairs.reserve(members + packs);
        for (replica, placed) in placed.into_iter().enumerate() {
            let split = self.split(replica as u32);
            for (slot, (direction, on_replica)) in [Direction::Forward, Direction::Backward]
                .into_iter()
                .zip(placed)
                .enumerate()
            {
                for pack in on_replica {
                    let index = self.packs.len() as u32;
                    self.pack_of_node[pack.node().index()] = index;
                    self.pack_ids.push(pack);
                    let first = self.slices.len() as u32;
                    let mut tokens = 0;
                    for &slice_id in ir.pack_members(pack) {
                        let slice = *ir.slice(slice_id);
                        let (len, prefix) = (u64::from(slice.len), u64::from(slice.start));
                        tokens += len;
                        let last = ir.next_slice(slice_id).is_none();
                        let first_backward = direction == Direction::Backward && last;
                        let earlier =
                            self.earlier_slices(slice_id, first_backward && prefix > 0, split);
                        let node = slice_id.node().index();
                        self.slices.push(SliceInfo {
                            share: len.div_ceil(split),
                            last,
                            earlier,
                            node,
                            padding: false,
                        });
                        self.pairs.push((len, prefix));
                        if direction == Direction::Forward {
                            self.forward_of_node[node] = index;
                        }
                        if direction == Direction::Forward && timed {
                            self.model_flops += self.cost.model_flops(len, prefix);
                            self.tokens += len;
                        }
                    }
                    // A padded micro-batch computes `padded - tokens` more tokens that attend
                    // causally to everything before them; they hold memory like a slice but
                    // count in no throughput or model-FLOPs figure.
                    if let Some(padded) = ir.padding(pack).map(u64::from).filter(|&p| p > tokens) {
                        let node = self.slices.last().map_or(0, |s| s.node);
                        self.slices.push(SliceInfo {
                            share: (padded - tokens).div_ceil(split),
                            last: true,
                            earlier: 0..0,
                            node,
                            padding: true,
                        });
                        self.pairs.push((padded - tokens, tokens));
                        tokens = padded;
                    }
                    self.pack_slices.push(first..self.slices.len() as u32);
                    if timed {
                        let merged = self.replicas[replica].len() as u32;
                        let pairs = &self.pairs[first as usize..];
                        self.works
                            .push(self.cost.pack_work(pairs, direction, merged));
                    }
                    self.packs.push(PackInfo {
                        direction,
                        number: numbers[slot],
                        replica: replica as u32,
                        tokens,
                        slices: self.slices.len() as u32 - first,
                    });
                    numbers[slot] += 1;
                }
            }
        }
    }

    /// Records the shares (tokens per device of a CP group of `split`) of the slices before
    /// `slice` in its sample when `wanted`.
    fn earlier_slices(&mut self, slice: SliceId, wanted: bool, split: u64) -> Range<u32> {
        let start = self.earlier_shares.len() as u32;
        if wanted {
            let ir = self.ir;
            for earlier in ir.slices_of(ir.sample_of(slice)) {
                if earlier == slice {
                    break;
                }
                self.earlier_shares
                    .push(u64::from(ir.slice(earlier).len).div_ceil(split));
            }
        }
        start..self.earlier_shares.len() as u32
    }

    /// Walks every device's schedule (`StepIr::device_schedule`), replica by replica, calling
    /// `visit` on each entry in order after checking what the simulator relies on: each entry
    /// is a pack of the replica on a stage of the device, each pack is listed once per model
    /// chunk, and a weight gradient follows the backward it belongs to, once.
    fn walk_schedules(
        &mut self,
        mut visit: impl FnMut(&mut Self, Scheduled),
    ) -> Result<(), MachineError> {
        let stages = self.stages as usize;
        let pp = self.layout.pp;
        let mut seen = vec![NONE; self.packs.len() * stages];
        let mut weight_seen = vec![false; self.packs.len() * stages];
        let mut pack_count = vec![0usize; self.replicas.len()];
        for pack in &self.packs {
            pack_count[pack.replica as usize] += 1;
        }
        let chunks = stages / pp as usize;
        let ir = self.ir;
        for (replica, &replica_id) in ir.replicas().iter().enumerate() {
            let expected = pack_count[replica] * chunks;
            if expected == 0 {
                continue;
            }
            for device in 0..pp {
                let order = ir.device_schedule(replica_id, device);
                let stamp = (replica * pp as usize + device as usize) as u32;
                let mut listed = 0;
                for (position, &(op, stage)) in order.iter().enumerate() {
                    let pack = self.pack_of_node[op.pack.node().index()];
                    let schedule_error = |message: &str| MachineError::Schedule {
                        replica,
                        stage: device,
                        message: message.into(),
                    };
                    let foreign = pack == NONE
                        || self.packs[pack as usize].replica != replica as u32
                        || stage % pp != device
                        || stage >= self.stages;
                    if foreign {
                        return Err(schedule_error("lists a pack of another replica"));
                    }
                    let slot = pack as usize * stages + stage as usize;
                    if op.part == Part::WeightGrad {
                        let backward = self.packs[pack as usize].direction == Direction::Backward;
                        if !backward || seen[slot] != stamp || weight_seen[slot] {
                            return Err(schedule_error(
                                "runs a weight gradient that is not of a backward it ran before, or twice",
                            ));
                        }
                        weight_seen[slot] = true;
                    } else {
                        if seen[slot] == stamp {
                            return Err(schedule_error("lists a pack twice"));
                        }
                        seen[slot] = stamp;
                        listed += 1;
                    }
                    visit(
                        self,
                        Scheduled {
                            device,
                            first: position == 0,
                            pack: PackIndex(pack),
                            stage,
                            part: op.part,
                        },
                    );
                }
                if listed != expected {
                    return Err(MachineError::Schedule {
                        replica,
                        stage: device,
                        message: format!(
                            "lists {listed} packs, the replica has {expected} (each exactly once per model chunk)"
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// The slices `pack` holds, in its order.
    fn slices_of(&self, pack: PackIndex) -> &[SliceInfo] {
        let range = self.pack_slices[pack.0 as usize].clone();
        &self.slices[range.start as usize..range.end as usize]
    }

    /// Per replica, whether one of its DP ranks is also in another replica (a plain replica's
    /// rank in a DP-Merge group, or in two groups).
    fn sharing(&self) -> Vec<bool> {
        let mut replicas_of_rank = vec![0u32; self.layout.dp as usize];
        for ranks in &self.replicas {
            for &rank in ranks {
                replicas_of_rank[rank as usize] += 1;
            }
        }
        self.replicas
            .iter()
            .map(|ranks| {
                ranks
                    .iter()
                    .any(|&rank| replicas_of_rank[rank as usize] > 1)
            })
            .collect()
    }

    /// One compute task per (pack, pipeline stage) — two for a split backward — chained in
    /// each device's schedule; a group whose DP rank is in several replicas runs them in the
    /// rank's order where the IR gives one, otherwise one after the other, in the IR's replica
    /// order (each replica's first task on the group after the previous one's last); with
    /// `SharedRanks::FirstComeFirstServed`, unchained.
    fn compute_tasks(&mut self, shared: SharedRanks) -> Result<(), MachineError> {
        let stages = self.stages as usize;
        self.tasks = TaskGraphBuilder::with_capacity(self.packs.len() * stages * 2 + 3 * stages);
        let unset = TaskId(u32::MAX);
        self.compute = vec![unset; self.packs.len() * stages];
        self.weight_grads = vec![unset; self.packs.len() * stages];
        self.prepare_stage_shares();
        let sharing = match shared {
            SharedRanks::AsProgram => self.sharing(),
            SharedRanks::FirstComeFirstServed => vec![false; self.replicas.len()],
        };
        // The last task so far of each group whose DP rank is in several replicas.
        let mut last_on_group = match sharing.contains(&true) {
            true => vec![unset; self.layout.groups()],
            false => Vec::new(),
        };
        // Groups whose rank orders its replicas itself: their tasks, with their replica, as
        // the walk makes them (each replica's in its schedule's order), chained afterwards.
        let ir = self.ir;
        let mut ordered: Vec<Option<Vec<(usize, TaskId)>>> = Vec::new();
        if shared == SharedRanks::AsProgram && ir.rank_orders().next().is_some() {
            ordered = vec![None; self.layout.groups()];
            for ((rank, device), _) in ir.rank_orders() {
                if rank < self.layout.dp && device < self.layout.pp {
                    ordered[self.layout.group(rank, device).index()] = Some(Vec::new());
                }
            }
        }
        let mut previous = unset;
        self.walk_schedules(|builder, entry| {
            let task = builder.compute_task(entry.pack, entry.stage, entry.part);
            let replica = builder.packs[entry.pack.0 as usize].replica as usize;
            if sharing[replica] {
                for &rank in &builder.replicas[replica] {
                    let group = builder.layout.group(rank, entry.device).index();
                    if let Some(tasks) = ordered.get_mut(group).and_then(Option::as_mut) {
                        tasks.push((replica, task));
                        continue;
                    }
                    if entry.first && last_on_group[group] != unset {
                        builder.tasks.add_edge(last_on_group[group], task);
                    }
                    last_on_group[group] = task;
                }
            }
            if entry.part == Part::WeightGrad {
                let slot = entry.pack.0 as usize * stages + entry.stage as usize;
                builder.tasks.add_edge(builder.compute[slot], task);
            }
            if !entry.first {
                builder.tasks.add_edge(previous, task);
            }
            previous = task;
        })?;
        if !ordered.is_empty() {
            self.chain_rank_orders(ordered)?;
        }
        Ok(())
    }

    /// The send of `pack`'s activations (or their gradients) from `from` to `to`.
    fn send_seconds(&self, pack: PackIndex, from: u32, to: u32) -> f64 {
        let info = self.packs[pack.0 as usize];
        let ranks = &self.replicas[info.replica as usize];
        let layout = self.layout;
        let from_device = layout.first_device(layout.group(ranks[0], from));
        let to_device = layout.first_device(layout.group(ranks[0], to));
        let tokens = info.tokens.div_ceil(self.split(info.replica));
        self.cost.send_time(tokens, from_device, to_device)
    }

    /// What follows pipeline device `device`'s last backward: the gradient reduce-scatter
    /// and the parameter all-gather over every DP rank, and the optimizer step between them.
    fn sync_tail_s(&self, device: u32) -> f64 {
        let all_ranks: Vec<u32> = (0..self.layout.dp).collect();
        self.cost.dp_sync(device, &all_ranks).total_s() + self.cost.optimizer_time(device)
    }

    /// The task running `part` of `pack` on `stage`; the compute table keeps a whole op or an
    /// input gradient, the weight-gradient table a deferred weight gradient.
    fn compute_task(&mut self, pack: PackIndex, stage: u32, part: Part) -> TaskId {
        let info = self.packs[pack.0 as usize];
        let share = self.stage_share(pack, stage, part);
        let time = self.stage_time(pack, stage, part);
        let ranks = &self.replicas[info.replica as usize];
        let parts = self.compute_parts(pack, &share, &time);
        let layout = self.layout;
        let groups = self
            .tasks
            .add_groups(ranks.iter().map(|&rank| layout.group(rank, stage)));
        let kind = match (info.direction, part) {
            (Direction::Forward, _) => TaskKind::Forward,
            (Direction::Backward, Part::WeightGrad) => TaskKind::WeightGrad,
            (Direction::Backward, _) => TaskKind::Backward,
        };
        let task = self.tasks.add_task(Task {
            kind,
            stage,
            replica: Some(info.replica),
            pack: Some(pack),
            groups,
            duration_s: time.critical_path_s(),
            cp_exchange_s: time.cp_comm_s,
            parts,
            memory: share.memory,
        });
        let slot = pack.0 as usize * self.stages as usize + stage as usize;
        match part {
            Part::WeightGrad => self.weight_grads[slot] = task,
            _ => self.compute[slot] = task,
        }
        task
    }

    /// The machine `stage` runs on: the model's, under the stage's own recomputation.
    fn stage_cost(&self, stage: u32) -> &CostModel {
        self.stage_costs[stage as usize]
            .as_ref()
            .unwrap_or(self.cost)
    }

    /// CP degree of a replica: its merged DP ranks times the static CP degree.
    fn split(&self, replica: u32) -> u64 {
        self.replicas[replica as usize].len() as u64 * u64::from(self.layout.cp)
    }

    /// Activations forward to the next stage, gradients back to the previous one.
    fn pipeline_sends(&mut self) {
        let stages = self.stages;
        for index in 0..self.packs.len() {
            let info = self.packs[index];
            for boundary in 0..stages.saturating_sub(1) {
                let (from, to) = match info.direction {
                    Direction::Forward => (boundary, boundary + 1),
                    Direction::Backward => (boundary + 1, boundary),
                };
                let duration_s = self.send_seconds(PackIndex(index as u32), from, to);
                let ranks = &self.replicas[info.replica as usize];
                let layout = self.layout;
                let groups = self.tasks.add_groups(
                    ranks
                        .iter()
                        .map(|&rank| layout.group(rank, from))
                        .chain(ranks.iter().map(|&rank| layout.group(rank, to))),
                );
                let send = self.tasks.add_task(Task {
                    kind: TaskKind::Send(info.direction),
                    stage: from,
                    replica: Some(info.replica),
                    pack: Some(PackIndex(index as u32)),
                    groups,
                    duration_s,
                    cp_exchange_s: 0.0,
                    parts: ComputeParts::default(),
                    memory: MemoryEffect::default(),
                });
                let base = index * stages as usize;
                self.tasks
                    .add_edge(self.compute[base + from as usize], send);
                self.tasks.add_edge(send, self.compute[base + to as usize]);
            }
        }
    }

    /// A backward pack on the last stage waits for the forward of each of its slices there.
    fn last_stage_edges(&mut self) {
        let stages = self.stages as usize;
        let last = stages - 1;
        let mut linked = vec![NONE; self.packs.len()];
        for index in 0..self.packs.len() {
            if self.packs[index].direction != Direction::Backward {
                continue;
            }
            let backward = self.compute[index * stages + last];
            for position in self.pack_slices[index].clone() {
                let forward = self.forward_of_node[self.slices[position as usize].node];
                if forward == NONE || linked[forward as usize] == index as u32 {
                    continue;
                }
                linked[forward as usize] = index as u32;
                self.tasks
                    .add_edge(self.compute[forward as usize * stages + last], backward);
            }
        }
    }

    /// Per pipeline device: reduce-scatter after every backward of its stages, optimizer,
    /// all-gather.
    fn dp_sync(&mut self) {
        let layout = self.layout;
        let all_ranks: Vec<u32> = (0..layout.dp).collect();
        for stage in 0..layout.pp {
            let sync = self.cost.dp_sync(stage, &all_ranks);
            self.min_sync_tail_s = self.min_sync_tail_s.min(self.sync_tail_s(stage));
            let stage_task = |kind, duration_s, groups| Task {
                kind,
                stage,
                replica: None,
                pack: None,
                groups,
                duration_s,
                cp_exchange_s: 0.0,
                parts: ComputeParts::default(),
                memory: MemoryEffect::default(),
            };
            let groups = self.stage_groups(stage);
            let reduce = self.tasks.add_task(stage_task(
                TaskKind::GradReduceScatter,
                sync.grad_reduce_scatter_s,
                groups,
            ));
            let groups = self.stage_groups(stage);
            let optimizer = self.tasks.add_task(stage_task(
                TaskKind::Optimizer,
                self.cost.optimizer_time(stage),
                groups,
            ));
            let groups = self.stage_groups(stage);
            let gather = self.tasks.add_task(stage_task(
                TaskKind::ParamAllGather,
                sync.param_all_gather_s,
                groups,
            ));
            for (index, pack) in self.packs.iter().enumerate() {
                if pack.direction == Direction::Backward {
                    for chunk_stage in self.ir.spec.parallel.stages_on(stage) {
                        let slot = index * self.stages as usize + chunk_stage as usize;
                        self.tasks.add_edge(self.compute[slot], reduce);
                        if self.weight_grads[slot] != TaskId(u32::MAX) {
                            self.tasks.add_edge(self.weight_grads[slot], reduce);
                        }
                    }
                }
            }
            self.tasks.add_edge(reduce, optimizer);
            self.tasks.add_edge(optimizer, gather);
        }
    }

    fn stage_groups(&mut self, stage: u32) -> Range<u32> {
        let layout = self.layout;
        self.tasks
            .add_groups((0..layout.dp).map(|rank| layout.group(rank, stage)))
    }

    /// Device-seconds of the memory-bound kernels and the TP collectives' first ring step
    /// (which no GEMM can hide) of all the step's real tokens: one pack per stage and
    /// direction, so that no per-pack latency counts, without recomputation.
    fn floor_overhead_device_s(&self) -> f64 {
        if self.tokens == 0 {
            return 0.0;
        }
        let devices_per_group = self.layout.devices_per_group() as f64;
        let mut device_s = 0.0;
        for stage in 0..self.stages {
            for direction in [Direction::Forward, Direction::Backward] {
                let time = self
                    .useful_cost
                    .pack_time(stage, &[(self.tokens, 0)], direction, 1);
                let unhidden_tp = exposed_tp_comm(time.tp_comm_s, f64::INFINITY, self.layout.tp);
                device_s += (time.elementwise_s + unhidden_tp) * devices_per_group;
            }
        }
        device_s
    }

    fn finish(self) -> Built {
        let floor_overhead_device_s = self.floor_overhead_device_s();
        let memory = self.cost.memory();
        let baselines = (0..self.layout.groups() as u32)
            .map(|group| {
                let stage = self.layout.stage_of(GroupId(group));
                memory.model_state_bytes(stage) + memory.workspace_bytes()
            })
            .collect();
        Built {
            graph: self.tasks.finish(),
            packs: self.packs,
            replicas: self.replicas,
            baselines,
            model_flops: self.model_flops,
            tokens: self.tokens,
            floor_overhead_device_s,
            min_sync_tail_s: self.min_sync_tail_s,
        }
    }
}
