//! [`StepIr`]: the graph, its ordered views and its mutations.
//!
//! petgraph's `StableGraph` keeps node indices valid across removals (slices are replaced when a
//! sample is re-sliced). Orders that reach output never come from node indices: samples, stages
//! and replicas are kept in creation order, slices in offset order, a pack's slices and a
//! replica's packs by the `position` on their edges.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use rustc_hash::FxHashMap;

use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::{EdgeRef, IntoEdgeReferences, NodeIndexable};
use petgraph::Direction::Outgoing;

use super::ids::{PackId, ReplicaId, SampleId, SliceId, StageId};
use super::node::{
    BatchInfo, Direction, Edge, Node, Pack, Part, Phase, Replica, Sample, Slice, Stage, StageOp,
};
use super::slices::{SliceRow, NO_NODE};
use super::{Rows, SampleSlices};
use crate::program::Program;
use crate::spec::{Recompute, Spec};

/// One training step, from samples to schedule.
#[derive(Debug, Clone)]
pub struct StepIr {
    pub spec: Spec,
    pub batch: BatchInfo,
    phase: Phase,
    graph: StableDiGraph<Node, Edge>,
    samples: Vec<SampleId>,
    stages: Vec<StageId>,
    replicas: Vec<ReplicaId>,
    /// Padded length of the packs that are padded (see [`StepIr::set_padding`]).
    padding: BTreeMap<PackId, u32>,
    /// Per (replica, direction), its packs in position order: what the `Placed` edges say,
    /// kept as a list because passes read it whole many times (a walk of a replica's edge list
    /// misses the caches once per pack on a large step). Packs are only ever appended, by
    /// [`StepIr::add_pack`], which adds the edge and the entry together.
    placed_packs: HashMap<(ReplicaId, Direction), Vec<PackId>>,
    /// Every pack's slices in their order, packs one after another: what the `Member` edges
    /// say, kept together because passes, the simulator and the lowering read packs whole (a
    /// walk of a pack's edge list misses the caches once per slice on a large step). Like
    /// `placed_packs`, only [`StepIr::add_pack`] writes it, with the edges; the verifier checks
    /// the two agree.
    pack_members: Vec<SliceId>,
    /// The range of `pack_members` of each pack, indexed by node index (`(0, 0)` for others).
    member_ranges: Vec<(u32, u32)>,
    /// The lowered program, stored by [`crate::program::lower_into`] (phase `lowered`).
    program: Option<Program>,
    /// With model chunks (`vpp > 1`): per (replica, pipeline device), the chunk of each pack
    /// the device runs, in order (see [`StepIr::device_schedule`]).
    interleave: BTreeMap<(ReplicaId, u32), Vec<u32>>,
    /// Per (replica, stage), the order its packs run in there ([`StepIr::set_schedule`]): a
    /// list, not a chain of edges, since the simulator, the lowering and the verifier read
    /// whole orders (a walk of each pack's edge list per op missed the caches, and replacing
    /// an order removed edges one by one).
    schedules: FxHashMap<(ReplicaId, u32), Vec<PackId>>,
    /// Zero-bubble schedules: per (replica, stage), the backward packs whose weight-gradient
    /// part is deferred, in the order they run, each with the number of ops of the stage's
    /// order chain that run before it (see [`StepIr::stage_ops`]).
    weight_grads: BTreeMap<(ReplicaId, u32), Vec<(PackId, u32)>>,
    /// Per (DP rank, pipeline device) in several replicas (a plain replica and DP-Merge
    /// groups), the replica of each op the device runs, in order, where the replicas'
    /// schedules interleave (see [`StepIr::rank_schedule`]); absent: one after the other.
    rank_orders: BTreeMap<(u32, u32), Vec<ReplicaId>>,
    /// Per (forward pack, stage index), the recomputation its activations are saved under
    /// where it is not the stage's (see [`StepIr::saved_recompute`]).
    pub(super) pack_recompute: BTreeMap<(PackId, u32), Recompute>,
    /// Position of each sample in `samples` (batch order), indexed by node index.
    sample_position: Vec<u32>,
    /// The replica of each sample, indexed by batch position (`None`: not placed).
    sample_replica: Vec<Option<ReplicaId>>,
    /// Per replica, the batch positions of the samples placed on it.
    replica_samples: FxHashMap<ReplicaId, BTreeSet<u32>>,
    /// Every slice's tokens, sample and next slice, indexed by node index: what its node and
    /// its `Contains` and `Next` edges say, kept in one dense table because passes, the
    /// simulator and the lowering read slices one by one in pack order (on a large step each
    /// read of a node, and each walk of its edge list, missed the caches). Only the methods
    /// that add and remove slices write it, with the graph; the verifier checks the two agree.
    slice_rows: Vec<SliceRow>,
}

impl StepIr {
    /// An empty step for `spec`: one stage node per pipeline stage (`pp · vpp` of them, layers
    /// split evenly; stage `k` runs on pipeline device `k mod pp`), no samples.
    pub fn new(spec: Spec, batch: BatchInfo) -> StepIr {
        let per_stage = spec.layers_per_stage();
        let stages: Vec<Stage> = (0..spec.parallel.stages())
            .map(|index| Stage {
                index,
                first_layer: index * per_stage,
                layers: per_stage,
                recompute: None,
            })
            .collect();
        StepIr::with_stages(spec, batch, &stages)
    }

    /// An IR whose stages are given explicitly (the parser uses this; the verifier checks them).
    pub fn with_stages(spec: Spec, batch: BatchInfo, stages: &[Stage]) -> StepIr {
        let mut ir = StepIr {
            spec,
            batch,
            phase: Phase::Logical,
            graph: StableDiGraph::new(),
            samples: Vec::new(),
            stages: Vec::new(),
            replicas: Vec::new(),
            padding: BTreeMap::new(),
            placed_packs: HashMap::new(),
            pack_members: Vec::new(),
            member_ranges: Vec::new(),
            program: None,
            interleave: BTreeMap::new(),
            schedules: FxHashMap::default(),
            weight_grads: BTreeMap::new(),
            rank_orders: BTreeMap::new(),
            pack_recompute: BTreeMap::new(),
            sample_position: Vec::new(),
            sample_replica: Vec::new(),
            replica_samples: FxHashMap::default(),
            slice_rows: Vec::new(),
        };
        for stage in stages {
            // A stage's own mode equal to the model's is no mode of its own (as
            // `set_stage_recompute` stores it): one step, one text form, one document.
            let recompute = stage
                .recompute
                .filter(|&mode| mode != ir.spec.model.recompute);
            ir.add_stage(Stage {
                recompute,
                ..*stage
            });
        }
        ir
    }

    fn add_stage(&mut self, stage: Stage) -> StageId {
        let id = StageId(self.graph.add_node(Node::Stage(stage)));
        self.stages.push(id);
        id
    }

    // ---- phase ----

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Moves the phase forward. Moving it backward is a bug in the caller.
    pub fn advance(&mut self, phase: Phase) {
        assert!(
            phase >= self.phase,
            "phase may only move forward ({} -> {phase}); this is a bug",
            self.phase
        );
        self.phase = phase;
    }

    // ---- the lowered program ----

    /// The per-worker op lists and pack layouts of a lowered step (`None` before `lower`).
    pub fn program(&self) -> Option<&Program> {
        self.program.as_ref()
    }

    pub(crate) fn set_program(&mut self, program: Program) {
        self.program = Some(program);
    }

    // ---- samples and slices ----

    /// Adds a sample with one slice covering it.
    pub fn add_sample(&mut self, sample: Sample) -> SampleId {
        assert!(sample.len > 0, "a sample of no tokens; this is a bug");
        let id = self.add_bare_sample(sample);
        // A new sample has no slices to replace or to chain after.
        self.add_slice_node(
            id,
            Slice {
                start: 0,
                len: sample.len,
            },
            None,
        );
        id
    }

    /// Room for `samples` more samples, each with one slice and a forward and a backward pack
    /// (what the packers add for them at most), so that building a large step does not grow
    /// and copy its tables again and again.
    pub fn reserve_samples(&mut self, samples: usize) {
        self.graph.reserve_nodes(samples.saturating_mul(4));
        // Contains, two Member edges, two Placed edges.
        self.graph.reserve_edges(samples.saturating_mul(5));
        self.samples.reserve(samples);
        self.sample_replica.reserve(samples);
        self.sample_position
            .reserve(self.graph.node_bound() + samples.saturating_mul(2));
        self.slice_rows
            .reserve(self.graph.node_bound() + samples.saturating_mul(2));
    }

    /// Adds a sample without slices (the parser adds them one by one).
    pub fn add_bare_sample(&mut self, sample: Sample) -> SampleId {
        let id = SampleId(self.graph.add_node(Node::Sample(sample)));
        let index = id.0.index();
        if self.sample_position.len() <= index {
            self.sample_position.resize(index + 1, u32::MAX);
        }
        self.sample_position[index] = self.samples.len() as u32;
        self.sample_replica.push(None);
        self.samples.push(id);
        id
    }

    /// A sample's position in batch order, its index in [`StepIr::samples`] (a node that is no
    /// sample is a bug in the caller).
    pub fn position_of(&self, sample: SampleId) -> u32 {
        match self.sample_position.get(sample.0.index()) {
            Some(&position) if position != u32::MAX => position,
            _ => panic!("{sample:?} is not a sample; this is a bug"),
        }
    }

    /// Samples in batch order.
    pub fn samples(&self) -> &[SampleId] {
        &self.samples
    }

    pub fn sample(&self, id: SampleId) -> &Sample {
        match &self.graph[id.0] {
            Node::Sample(sample) => sample,
            other => panic!("{id:?} is not a sample but {other:?}; this is a bug"),
        }
    }

    pub fn slice(&self, id: SliceId) -> &Slice {
        match self.slice_rows.get(id.0.index()) {
            Some(row) if row.sample != NO_NODE => &row.slice,
            _ => self.not_a_slice(id),
        }
    }

    #[cold]
    fn not_a_slice(&self, id: SliceId) -> ! {
        match self.graph.node_weight(id.0) {
            Some(other) => panic!("{id:?} is not a slice but {other:?}; this is a bug"),
            None => panic!("{id:?} is no node; this is a bug"),
        }
    }

    /// Slices of a sample in offset order.
    pub fn slices_of(&self, sample: SampleId) -> Vec<SliceId> {
        let mut slices: Vec<SliceId> = self
            .graph
            .edges_directed(sample.0, Outgoing)
            .filter(|e| matches!(e.weight(), Edge::Contains))
            .map(|e| SliceId(e.target()))
            .collect();
        slices.sort_by_key(|&s| (self.node_start(s), s));
        slices
    }

    /// A slice as its graph node says (`None` for a node that is no slice), not as the slice
    /// table beside the graph does: what the verifier checks the table against.
    pub(crate) fn slice_node(&self, slice: SliceId) -> Option<Slice> {
        match self.graph.node_weight(slice.0) {
            Some(Node::Slice(node)) => Some(*node),
            _ => None,
        }
    }

    /// A slice's offset as its graph node says (`u32::MAX` for a node that is no slice): the
    /// edge-walking readers order by the graph, not the table beside it, so that the verifier
    /// (and its error messages' names) can read an IR whose table is broken.
    fn node_start(&self, slice: SliceId) -> u32 {
        self.slice_node(slice).map_or(u32::MAX, |node| node.start)
    }

    /// Every sample's slices in offset order (as [`StepIr::slices_of`]), by batch position,
    /// and every slice's sample position, gathered in one pass over the slice table: for
    /// passes that visit every sample or slice, where a walk of each node's edge list misses
    /// the caches on a large step.
    pub fn sample_slices(&self) -> SampleSlices {
        let slices = (self.slice_rows.iter().enumerate())
            .filter(|(_, row)| row.sample != NO_NODE)
            .map(|(index, row)| {
                let sample = SampleId(NodeIndex::new(row.sample as usize));
                (sample, SliceId(NodeIndex::new(index)))
            });
        self.gather_sample_slices(slices, |slice| self.slice(slice).start)
    }

    /// As [`StepIr::sample_slices`], read from the `Contains` edges instead of the slice table
    /// (for the verifier, which checks the two agree).
    pub(crate) fn sample_slices_by_edges(&self) -> SampleSlices {
        let slices = (self.graph.edge_references())
            .filter(|edge| *edge.weight() == Edge::Contains)
            .map(|edge| (SampleId(edge.source()), SliceId(edge.target())));
        // Offsets from the slice nodes: the table may be what is broken.
        self.gather_sample_slices(slices, |slice| self.node_start(slice))
    }

    /// `slices` grouped by sample, each sample's in the order of `start`.
    fn gather_sample_slices(
        &self,
        slices: impl Iterator<Item = (SampleId, SliceId)>,
        start: impl Fn(SliceId) -> u32,
    ) -> SampleSlices {
        let mut contains: Vec<(u32, SliceId)> = Vec::with_capacity(self.samples.len());
        let mut sample_at = vec![u32::MAX; self.graph.node_bound()];
        for (sample, slice) in slices {
            let position = self.position_of(sample);
            contains.push((position, slice));
            sample_at[slice.0.index()] = position;
        }
        let mut slices = Rows::new(self.samples.len(), &contains);
        slices.sort_rows_by_key(|&s| (start(s), s));
        SampleSlices { slices, sample_at }
    }

    /// The sample a slice belongs to.
    pub fn sample_of(&self, slice: SliceId) -> SampleId {
        match self.slice_rows.get(slice.0.index()) {
            Some(row) if row.sample != NO_NODE => SampleId(NodeIndex::new(row.sample as usize)),
            _ => panic!("{slice:?} has no sample; this is a bug"),
        }
    }

    /// `slice`'s row of the slice table — its span (start and length), its sample and the
    /// next slice — or `None` where the table has none: what the verifier compares with the
    /// graph, which must not panic on the IR it checks ([`StepIr::slice`] and
    /// [`StepIr::sample_of`] do, for the passes).
    pub(crate) fn slice_row(&self, slice: SliceId) -> Option<(Slice, SampleId, Option<SliceId>)> {
        let row = self.slice_rows.get(slice.0.index())?;
        (row.sample != NO_NODE).then(|| {
            let next = (row.next != NO_NODE).then(|| SliceId(NodeIndex::new(row.next as usize)));
            (
                row.slice,
                SampleId(NodeIndex::new(row.sample as usize)),
                next,
            )
        })
    }

    /// The slice that follows `slice` in its sample (by the dependency edge).
    pub fn next_slice(&self, slice: SliceId) -> Option<SliceId> {
        match self.slice_rows.get(slice.0.index()) {
            Some(row) if row.next != NO_NODE => Some(SliceId(NodeIndex::new(row.next as usize))),
            _ => None,
        }
    }

    /// All slices, grouped by sample in batch order, each sample's in offset order.
    pub fn all_slices(&self) -> Vec<SliceId> {
        self.samples
            .iter()
            .flat_map(|&sample| self.slices_of(sample))
            .collect()
    }

    /// Replaces a sample's slices by consecutive slices of the given lengths, chained by
    /// dependency edges. Lengths must be positive and sum to the sample length; the old slices
    /// must not be in packs (both are bugs in the caller).
    pub fn set_slices(&mut self, sample: SampleId, lengths: &[u32]) -> Vec<SliceId> {
        let total: u64 = lengths.iter().map(|&l| u64::from(l)).sum();
        assert!(
            total == u64::from(self.sample(sample).len) && lengths.iter().all(|&l| l > 0),
            "set_slices({sample:?}, {lengths:?}) does not cover the sample exactly; this is a bug"
        );
        for old in self.slices_of(sample) {
            assert!(
                self.packs_of(old).next().is_none(),
                "re-slicing a packed slice; this is a bug"
            );
            self.graph.remove_node(old.0);
            self.slice_rows[old.0.index()] = SliceRow::ABSENT;
        }
        let (mut start, mut previous) = (0, None);
        let mut created = Vec::with_capacity(lengths.len());
        for &len in lengths {
            let id = self.add_slice_node(sample, Slice { start, len }, previous);
            created.push(id);
            (start, previous) = (start + len, Some(id));
        }
        created
    }

    /// Adds one slice to a sample and chains it after the sample's last slice so far (the
    /// parser adds slices in offset order).
    pub fn add_slice(&mut self, sample: SampleId, slice: Slice) -> SliceId {
        let previous = self.slices_of(sample).last().copied();
        self.add_slice_node(sample, slice, previous)
    }

    /// Adds a slice node of `sample`, with its `Contains` edge, its row, and its `Next` edge
    /// from `previous` (the sample's last slice so far, if any).
    fn add_slice_node(
        &mut self,
        sample: SampleId,
        slice: Slice,
        previous: Option<SliceId>,
    ) -> SliceId {
        let id = SliceId(self.graph.add_node(Node::Slice(slice)));
        self.graph.add_edge(sample.0, id.0, Edge::Contains);
        let index = id.0.index();
        if self.slice_rows.len() <= index {
            self.slice_rows.resize(index + 1, SliceRow::ABSENT);
        }
        self.slice_rows[index] = SliceRow {
            slice,
            sample: sample.0.index() as u32,
            next: NO_NODE,
        };
        if let Some(previous) = previous {
            self.graph.add_edge(previous.0, id.0, Edge::Next);
            self.slice_rows[previous.0.index()].next = index as u32;
        }
        id
    }

    // ---- stages and replicas ----

    /// Stages in pipeline order.
    pub fn stages(&self) -> &[StageId] {
        &self.stages
    }

    pub fn stage(&self, id: StageId) -> &Stage {
        match &self.graph[id.0] {
            Node::Stage(stage) => stage,
            other => panic!("{id:?} is not a stage but {other:?}; this is a bug"),
        }
    }

    /// The activation recomputation stage `index` (in pipeline order) runs: its own mode where
    /// one was assigned ([`Stage::recompute`]), the model's otherwise.
    pub fn stage_recompute(&self, index: u32) -> Recompute {
        let stage = self.stage(self.stages[index as usize]);
        stage.recompute.unwrap_or(self.spec.model.recompute)
    }

    /// True when some stage runs a recomputation of its own, other than the model's.
    pub fn has_stage_recompute(&self) -> bool {
        (0..self.stages.len() as u32)
            .any(|index| self.stage_recompute(index) != self.spec.model.recompute)
    }

    /// Sets the recomputation of stage `index` (`None`: the model's mode). A mode equal to the
    /// model's is stored as `None`, so that a step prints the same whichever way it was reached.
    /// Shared ranks' orders, read off the step's timings and memory, are cleared, and so are
    /// the stage's packs' own modes ([`StepIr::set_pack_recompute`]), chosen beside the old one.
    pub fn set_stage_recompute(&mut self, index: u32, mode: Option<Recompute>) {
        self.rank_orders.clear();
        self.pack_recompute.retain(|&(_, stage), _| stage != index);
        let mode = mode.filter(|&mode| mode != self.spec.model.recompute);
        let id = self.stages[index as usize];
        match &mut self.graph[id.0] {
            Node::Stage(stage) => stage.recompute = mode,
            other => panic!("{id:?} is not a stage but {other:?}; this is a bug"),
        }
    }

    /// Sets the recomputation of every stage pipeline device `device` holds (one per model
    /// chunk), as [`StepIr::set_stage_recompute`] does.
    pub fn set_device_recompute(&mut self, device: u32, mode: Option<Recompute>) {
        for stage in self.spec.parallel.stages_on(device) {
            self.set_stage_recompute(stage, mode);
        }
    }

    /// Adds a replica (DP ranks ascending).
    pub fn add_replica(&mut self, mut ranks: Vec<u32>) -> ReplicaId {
        ranks.sort_unstable();
        let id = ReplicaId(self.graph.add_node(Node::Replica(Replica { ranks })));
        self.replicas.push(id);
        id
    }

    /// Replicas in creation order.
    pub fn replicas(&self) -> &[ReplicaId] {
        &self.replicas
    }

    pub fn replica(&self, id: ReplicaId) -> &Replica {
        match &self.graph[id.0] {
            Node::Replica(replica) => replica,
            other => panic!("{id:?} is not a replica but {other:?}; this is a bug"),
        }
    }

    /// Places a sample on a replica (replacing an earlier placement).
    pub fn place_sample(&mut self, sample: SampleId, replica: ReplicaId) {
        let position = self.position_of(sample);
        if let Some(previous) = self.sample_replica[position as usize].replace(replica) {
            if let Some(placed) = self.replica_samples.get_mut(&previous) {
                placed.remove(&position);
            }
        }
        self.replica_samples
            .entry(replica)
            .or_default()
            .insert(position);
    }

    /// Places every sample of `placements` on its replica, as [`StepIr::place_sample`] one
    /// by one would; where they are many (a packer that re-places the whole batch), the
    /// replicas' sample sets are rebuilt once instead of edited per sample.
    pub fn place_samples(&mut self, placements: &[(SampleId, ReplicaId)]) {
        if placements.len() < self.samples.len() / 8 {
            for &(sample, replica) in placements {
                self.place_sample(sample, replica);
            }
            return;
        }
        for &(sample, replica) in placements {
            let position = self.position_of(sample);
            self.sample_replica[position as usize] = Some(replica);
        }
        let mut placed: FxHashMap<ReplicaId, Vec<u32>> = FxHashMap::default();
        for (position, replica) in self.sample_replica.iter().enumerate() {
            if let Some(replica) = replica {
                placed.entry(*replica).or_default().push(position as u32);
            }
        }
        // Positions come in order: each set is built from a sorted run.
        self.replica_samples = placed
            .into_iter()
            .map(|(replica, positions)| (replica, positions.into_iter().collect()))
            .collect();
    }

    /// The replica a sample is placed on.
    pub fn replica_of_sample(&self, sample: SampleId) -> Option<ReplicaId> {
        self.sample_replica[self.position_of(sample) as usize]
    }

    /// The replica a pack runs on.
    pub fn replica_of_pack(&self, pack: PackId) -> Option<ReplicaId> {
        self.graph
            .edges_directed(pack.0, Outgoing)
            .find(|e| matches!(e.weight(), Edge::Placed { .. }))
            .map(|e| ReplicaId(e.target()))
    }

    /// Samples placed on a replica, in batch order.
    pub fn samples_on(&self, replica: ReplicaId) -> Vec<SampleId> {
        self.replica_samples
            .get(&replica)
            .map(|placed| {
                placed
                    .iter()
                    .map(|&position| self.samples[position as usize])
                    .collect()
            })
            .unwrap_or_default()
    }

    // ---- packs ----

    /// Appends a pack of `slices` (in that order) to the replica's packs of its direction.
    pub fn add_pack(&mut self, pack: Pack, replica: ReplicaId, slices: &[SliceId]) -> PackId {
        let id = PackId(self.graph.add_node(Node::Pack(pack)));
        let placed = self
            .placed_packs
            .entry((replica, pack.direction))
            .or_default();
        let position = placed.len() as u32;
        placed.push(id);
        self.graph
            .add_edge(id.0, replica.0, Edge::Placed { position });
        for (position, slice) in slices.iter().enumerate() {
            self.graph.add_edge(
                slice.0,
                id.0,
                Edge::Member {
                    position: position as u32,
                },
            );
        }
        // Fewer members than edges, and petgraph's edge indices are 32-bit.
        let first = self.pack_members.len() as u32;
        self.pack_members.extend_from_slice(slices);
        let index = id.0.index();
        if self.member_ranges.len() <= index {
            self.member_ranges.resize(index + 1, (0, 0));
        }
        self.member_ranges[index] = (first, self.pack_members.len() as u32);
        id
    }

    pub fn pack(&self, id: PackId) -> &Pack {
        match &self.graph[id.0] {
            Node::Pack(pack) => pack,
            other => panic!("{id:?} is not a pack but {other:?}; this is a bug"),
        }
    }

    /// A replica's packs of one direction, in their order.
    pub fn packs_on(&self, replica: ReplicaId, direction: Direction) -> Vec<PackId> {
        self.placed_packs
            .get(&(replica, direction))
            .cloned()
            .unwrap_or_default()
    }

    /// All packs: per replica, forward ones then backward ones, each in order.
    pub fn all_packs(&self) -> Vec<PackId> {
        let mut packs = Vec::new();
        for &replica in &self.replicas {
            packs.extend(self.packs_on(replica, Direction::Forward));
            packs.extend(self.packs_on(replica, Direction::Backward));
        }
        packs
    }

    /// Packs that exist but are not placed on any replica (only a malformed IR has them).
    pub fn unplaced_packs(&self) -> Vec<PackId> {
        self.graph
            .node_indices()
            .filter(|&n| matches!(self.graph[n], Node::Pack(_)))
            .map(PackId)
            .filter(|&p| self.replica_of_pack(p).is_none())
            .collect()
    }

    /// Slices of a pack, in their order inside the pack.
    pub fn pack_members(&self, pack: PackId) -> &[SliceId] {
        match self.member_ranges.get(pack.0.index()) {
            Some(&(from, to)) => &self.pack_members[from as usize..to as usize],
            None => &[],
        }
    }

    /// Slices of a pack, in their order inside the pack, as a vector of their own.
    pub fn pack_slices(&self, pack: PackId) -> Vec<SliceId> {
        self.pack_members(pack).to_vec()
    }

    /// Packs a slice belongs to (any direction).
    pub fn packs_of(&self, slice: SliceId) -> impl Iterator<Item = PackId> + '_ {
        self.graph
            .edges_directed(slice.0, Outgoing)
            .filter(|e| matches!(e.weight(), Edge::Member { .. }))
            .map(|e| PackId(e.target()))
    }

    /// The pack of one direction that holds a slice (the first if the IR is malformed).
    pub fn pack_of(&self, slice: SliceId, direction: Direction) -> Option<PackId> {
        self.graph
            .edges_directed(slice.0, Outgoing)
            .filter(|e| matches!(e.weight(), Edge::Member { .. }))
            .map(|e| PackId(e.target()))
            .filter(|&p| self.pack(p).direction == direction)
            .min()
    }

    /// Pads `pack` to `tokens` tokens: it runs as one sequence of that length — its slices, then
    /// padding tokens that attend to them — as a trainer that does not pack pads a micro-batch to
    /// a fixed shape. The padding is computed but holds no sample's tokens. The verifier checks
    /// that `tokens` is at least the pack's own tokens.
    pub fn set_padding(&mut self, pack: PackId, tokens: u32) {
        self.padding.insert(pack, tokens);
    }

    /// The length a pack is padded to, if it is padded.
    pub fn padding(&self, pack: PackId) -> Option<u32> {
        self.padding.get(&pack).copied()
    }

    /// Tokens in a pack.
    pub fn pack_tokens(&self, pack: PackId) -> u64 {
        self.pack_members(pack)
            .iter()
            .map(|&s| u64::from(self.slice(s).len))
            .sum()
    }

    // ---- schedule ----

    /// Sets the order in which the packs of `replica` run on `stage` (replacing any earlier one,
    /// deferred weight gradients included: every backward runs whole). A schedule has at least
    /// two packs (a replica with samples always has a forward and a backward pack): a shorter
    /// order clears the stage's. Whether the order lists the replica's packs, each once, is
    /// the verifier's to check.
    pub fn set_schedule(&mut self, replica: ReplicaId, stage: u32, order: &[PackId]) {
        self.weight_grads.remove(&(replica, stage));
        // The interleaving of shared ranks, and the packs' own recomputation, were chosen on
        // the schedules this one replaces.
        self.rank_orders.clear();
        self.pack_recompute.clear();
        match order.len() >= 2 {
            true => {
                let kept = self.schedules.entry((replica, stage)).or_default();
                kept.clear();
                kept.extend_from_slice(order);
            }
            false => {
                self.schedules.remove(&(replica, stage));
            }
        }
    }

    /// The order in which the packs of `replica` run on `stage`. Empty if no schedule was set.
    pub fn schedule(&self, replica: ReplicaId, stage: u32) -> &[PackId] {
        self.schedules
            .get(&(replica, stage))
            .map_or(&[], Vec::as_slice)
    }

    /// Sets the order of `replica` on `stage` op by op, with the parts of split backwards (a
    /// zero-bubble schedule): the ops other than [`Part::WeightGrad`] become the stage's chain
    /// ([`StepIr::schedule`]), each weight-gradient op is kept with its position after them.
    /// The part of a chain op is implied: a backward whose weight gradient is listed runs its
    /// input gradient there, any other runs whole.
    pub fn set_stage_ops(&mut self, replica: ReplicaId, stage: u32, ops: &[StageOp]) {
        let chain: Vec<PackId> = ops
            .iter()
            .filter(|op| op.part != Part::WeightGrad)
            .map(|op| op.pack)
            .collect();
        self.set_schedule(replica, stage, &chain);
        let mut deferred = Vec::new();
        let mut before = 0u32;
        for op in ops {
            match op.part {
                Part::WeightGrad => deferred.push((op.pack, before)),
                _ => before += 1,
            }
        }
        if !deferred.is_empty() {
            self.weight_grads.insert((replica, stage), deferred);
        }
    }

    /// The deferred weight-gradient ops of `replica` on `stage`: (backward pack, number of chain
    /// ops before it), in order. Empty unless the stage runs a zero-bubble schedule.
    pub fn weight_grads(&self, replica: ReplicaId, stage: u32) -> &[(PackId, u32)] {
        self.weight_grads
            .get(&(replica, stage))
            .map_or(&[], Vec::as_slice)
    }

    /// True when some stage of some replica defers a weight gradient.
    pub fn has_split_backwards(&self) -> bool {
        !self.weight_grads.is_empty()
    }

    /// The ops `replica` runs on `stage`, in order: the chain of [`StepIr::schedule`] with the
    /// deferred weight gradients merged in at their positions. A backward in the chain whose
    /// weight gradient is deferred runs [`Part::InputGrad`]; every other chain op runs whole.
    pub fn stage_ops(&self, replica: ReplicaId, stage: u32) -> Vec<StageOp> {
        let chain = self.schedule(replica, stage);
        let deferred = self.weight_grads(replica, stage);
        if deferred.is_empty() {
            return chain.iter().copied().map(StageOp::whole).collect();
        }
        let split: rustc_hash::FxHashSet<PackId> = deferred.iter().map(|&(pack, _)| pack).collect();
        let mut ops = Vec::with_capacity(chain.len() + deferred.len());
        let mut next = deferred.iter().peekable();
        for (index, &pack) in chain.iter().enumerate() {
            while let Some(&(weight, _)) = next.next_if(|&&(_, before)| before as usize <= index) {
                ops.push(StageOp {
                    pack: weight,
                    part: Part::WeightGrad,
                });
            }
            let part = match split.contains(&pack) {
                true => Part::InputGrad,
                false => Part::Whole,
            };
            ops.push(StageOp { pack, part });
        }
        ops.extend(next.map(|&(pack, _)| StageOp {
            pack,
            part: Part::WeightGrad,
        }));
        ops
    }

    /// With model chunks (`vpp > 1`), sets the order in which pipeline device `device` runs
    /// `replica`'s packs across its chunks: `chunks[i]` is the chunk (stage `chunk · pp +
    /// device`) of the device's `i`-th pack; each chunk's packs follow that stage's own
    /// [`StepIr::schedule`].
    pub fn set_interleave(&mut self, replica: ReplicaId, device: u32, chunks: &[u32]) {
        self.interleave.insert((replica, device), chunks.to_vec());
        self.rank_orders.clear();
        self.pack_recompute.clear();
    }

    /// The chunk sequence set by [`StepIr::set_interleave`], if any.
    pub fn interleave(&self, replica: ReplicaId, device: u32) -> Option<&[u32]> {
        self.interleave.get(&(replica, device)).map(Vec::as_slice)
    }

    /// The ops pipeline device `device` runs for `replica`, as (op, pipeline stage) pairs: with
    /// one chunk per device, that stage's [`StepIr::stage_ops`]; with `vpp > 1`, the stages'
    /// schedules merged by the device's interleave (whole ops: zero-bubble splits need one
    /// chunk per device, the verifier checks it). Stops early where the interleave and the
    /// schedules disagree (the verifier reports it).
    pub fn device_schedule(&self, replica: ReplicaId, device: u32) -> Vec<(StageOp, u32)> {
        let parallel = &self.spec.parallel;
        if parallel.vpp == 1 {
            if self.weight_grads(replica, device).is_empty() {
                return (self.schedule(replica, device).iter())
                    .map(|&pack| (StageOp::whole(pack), device))
                    .collect();
            }
            return self
                .stage_ops(replica, device)
                .into_iter()
                .map(|op| (op, device))
                .collect();
        }
        let Some(chunks) = self.interleave(replica, device) else {
            return Vec::new();
        };
        let stage = |chunk: u32| chunk * parallel.pp + device;
        let orders: Vec<&[PackId]> = (0..parallel.vpp)
            .map(|chunk| self.schedule(replica, stage(chunk)))
            .collect();
        let mut next = vec![0usize; orders.len()];
        let mut merged = Vec::with_capacity(chunks.len());
        for &chunk in chunks {
            let Some(&pack) = orders
                .get(chunk as usize)
                .and_then(|order| order.get(next[chunk as usize]))
            else {
                break;
            };
            next[chunk as usize] += 1;
            merged.push((StageOp::whole(pack), stage(chunk)));
        }
        merged
    }

    // ---- shared ranks ----

    /// Sets the order in which DP rank `rank`'s pipeline device `device` runs the replicas it
    /// is in (a plain replica and the DP-Merge groups holding the rank): `replicas[i]` is the
    /// replica of its `i`-th op, each replica's ops in its [`StepIr::device_schedule`] order.
    /// Any later change of a schedule clears every such order.
    pub fn set_rank_order(&mut self, rank: u32, device: u32, replicas: &[ReplicaId]) {
        self.rank_orders.insert((rank, device), replicas.to_vec());
    }

    /// The order set by [`StepIr::set_rank_order`], if any.
    pub fn rank_order(&self, rank: u32, device: u32) -> Option<&[ReplicaId]> {
        self.rank_orders.get(&(rank, device)).map(Vec::as_slice)
    }

    /// Every (DP rank, pipeline device) with an order of its own, and the order.
    pub fn rank_orders(&self) -> impl Iterator<Item = ((u32, u32), &[ReplicaId])> {
        self.rank_orders
            .iter()
            .map(|(&key, order)| (key, order.as_slice()))
    }

    /// Forgets every order set by [`StepIr::set_rank_order`]: shared ranks run their replicas
    /// one after the other.
    pub fn clear_rank_orders(&mut self) {
        self.rank_orders.clear();
    }

    /// Per DP rank (`0..dp`), how many replicas it is in (a plain replica and the DP-Merge
    /// groups holding it); ranks out of range are not counted.
    pub fn replica_counts(&self) -> Vec<u32> {
        let mut counts = vec![0u32; self.spec.parallel.dp as usize];
        for &replica in &self.replicas {
            for &rank in &self.replica(replica).ranks {
                if let Some(count) = counts.get_mut(rank as usize) {
                    *count += 1;
                }
            }
        }
        counts
    }

    /// The replicas `rank` is in, in IR order.
    pub fn replicas_of_rank(&self, rank: u32) -> Vec<ReplicaId> {
        self.replicas
            .iter()
            .copied()
            .filter(|&replica| self.replica(replica).ranks.contains(&rank))
            .collect()
    }

    /// What DP rank `rank`'s pipeline device `device` runs, in order, as (replica, op, stage):
    /// the [`StepIr::device_schedule`]s of the replicas holding the rank, merged by the
    /// rank's order where it has one ([`StepIr::set_rank_order`]), otherwise one after the
    /// other in IR order. Stops early where the order and the schedules disagree (the
    /// verifier reports it).
    pub fn rank_schedule(&self, rank: u32, device: u32) -> Vec<(ReplicaId, StageOp, u32)> {
        let replicas = self.replicas_of_rank(rank);
        let schedules: Vec<Vec<(StageOp, u32)>> = replicas
            .iter()
            .map(|&replica| self.device_schedule(replica, device))
            .collect();
        let Some(order) = self.rank_order(rank, device) else {
            return replicas
                .iter()
                .zip(&schedules)
                .flat_map(|(&replica, ops)| {
                    ops.iter().map(move |&(op, stage)| (replica, op, stage))
                })
                .collect();
        };
        let mut next = vec![0usize; replicas.len()];
        let mut merged = Vec::with_capacity(order.len());
        for &replica in order {
            let Some(at) = replicas.iter().position(|&r| r == replica) else {
                break;
            };
            let Some(&(op, stage)) = schedules[at].get(next[at]) else {
                break;
            };
            next[at] += 1;
            merged.push((replica, op, stage));
        }
        merged
    }

    /// Number of nodes of each kind: (samples, slices, packs, replicas).
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        let mut slices = 0;
        let mut packs = 0;
        for node in self.graph.node_weights() {
            match node {
                Node::Slice(_) => slices += 1,
                Node::Pack(_) => packs += 1,
                _ => {}
            }
        }
        (self.samples.len(), slices, packs, self.replicas.len())
    }

    /// Total tokens over all samples.
    pub fn tokens(&self) -> u64 {
        self.samples
            .iter()
            .map(|&s| u64::from(self.sample(s).len))
            .sum()
    }

    /// The underlying graph, mutable: only tests that break invariants on purpose use it.
    #[cfg(test)]
    pub(crate) fn graph_mut(&mut self) -> &mut StableDiGraph<Node, Edge> {
        &mut self.graph
    }

    /// The underlying graph, read-only (for the verifier and debugging tools).
    pub fn graph(&self) -> &StableDiGraph<Node, Edge> {
        &self.graph
    }
}
