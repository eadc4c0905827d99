//! The step graph's edges as the verifier reads them, gathered by passes over the edge table
//! (this one, and [`StepIr::sample_slices`]'s) into rows keyed by node index, instead of a
//! walk of each node's edge list: on a million-sample step the walks' pointer chasing missed
//! the caches on almost every edge. Each list keeps the order of the [`StepIr`] accessor it
//! stands for, except a slice's packs, which are ascending (the least first, as
//! [`StepIr::pack_of`] takes it), where the graph lists the newest first: on a step with a
//! slice in two packs of one direction the verifier now keys its order check on the pack it
//! names.

use petgraph::graph::NodeIndex;
use petgraph::visit::{EdgeRef, IntoEdgeReferences, NodeIndexable};

use crate::step::{
    Direction, Edge, Node, PackId, ReplicaId, Rows, SampleId, SampleSlices, SliceId, StepIr,
};

/// A slice with no `Next` edge.
const NONE: u32 = u32::MAX;
/// A slice with several `Next` edges.
const MANY: u32 = u32::MAX - 1;

/// The edges of one step, by node.
pub(super) struct Index {
    /// Each slice's `Next` target (`NONE`, or `MANY` with several).
    next_of: Vec<u32>,
    /// Each sample's slices by offset, by batch position, and each slice's sample.
    slices: SampleSlices,
    /// Each pack's slices by position (as [`StepIr::pack_slices`]).
    members: Rows<(u32, SliceId)>,
    /// Each slice's packs, ascending (as [`StepIr::pack_of`] takes the least), with their
    /// direction (read here in edge order, where a pack's member edges are together, rather
    /// than from the pack node at each lookup, in slice order).
    packs: Rows<(PackId, Direction)>,
    /// Each replica's packs by position (as [`StepIr::packs_on`], both directions).
    placed: Rows<(u32, PackId)>,
    /// Pack nodes with no replica, in node order (as [`StepIr::unplaced_packs`]).
    unplaced: Vec<PackId>,
}

impl Index {
    /// The index of `ir`'s edges; with `parallel`, the samples' slices are gathered on a
    /// second thread while this one reads the other edges.
    pub fn new(ir: &StepIr, parallel: bool) -> Index {
        let (slices, index) = super::both(
            parallel,
            || ir.sample_slices_by_edges(),
            || Index::others(ir),
        );
        Index { slices, ..index }
    }

    /// The index without the samples' slices.
    fn others(ir: &StepIr) -> Index {
        let graph = ir.graph();
        let bound = graph.node_bound();
        let mut next_of = vec![NONE; bound];
        let mut has_replica = vec![false; bound];
        let (mut members, mut packs, mut placed) = (Vec::new(), Vec::new(), Vec::new());
        for edge in graph.edge_references() {
            let (source, target) = (edge.source(), edge.target());
            let from = source.index() as u32;
            match *edge.weight() {
                Edge::Next => {
                    let next = &mut next_of[source.index()];
                    *next = if *next == NONE {
                        target.index() as u32
                    } else {
                        MANY
                    };
                }
                Edge::Member { position } => {
                    members.push((target.index() as u32, (position, SliceId(source))));
                    // A member edge into a node that is no pack makes no membership.
                    if let Node::Pack(pack) = &graph[target] {
                        packs.push((from, (PackId(target), pack.direction)));
                    }
                }
                Edge::Placed { position } => {
                    if matches!(graph[source], Node::Pack(_)) {
                        placed.push((target.index() as u32, (position, PackId(source))));
                        has_replica[source.index()] = true;
                    }
                }
                Edge::Contains => {}
            }
        }
        let mut members = Rows::new(bound, &members);
        members.sort_rows_by_key(|&member| member);
        let mut packs = Rows::new(bound, &packs);
        packs.sort_rows_by_key(|&(pack, _)| pack);
        let mut placed = Rows::new(bound, &placed);
        placed.sort_rows_by_key(|&pack| pack);
        let unplaced = graph
            .node_indices()
            .filter(|&n| matches!(graph[n], Node::Pack(_)) && !has_replica[n.index()])
            .map(PackId)
            .collect();
        Index {
            next_of,
            slices: SampleSlices::default(),
            members,
            packs,
            placed,
            unplaced,
        }
    }

    /// The slice `slice`'s dependency edge leads to: `None` with no edge, `Some(None)` with
    /// several, `Some(Some(next))` with one.
    pub fn next_slice(&self, slice: SliceId) -> Option<Option<NodeIndex>> {
        match self.next_of[slice.node().index()] {
            NONE => None,
            MANY => Some(None),
            next => Some(Some(NodeIndex::new(next as usize))),
        }
    }

    pub fn sample_of(&self, ir: &StepIr, slice: SliceId) -> SampleId {
        ir.samples()[self.slices.sample_position(slice) as usize]
    }

    pub fn slices_of(&self, ir: &StepIr, sample: SampleId) -> &[SliceId] {
        self.slices.at(ir.position_of(sample))
    }

    pub fn pack_slices(&self, pack: PackId) -> impl Iterator<Item = SliceId> + '_ {
        self.members
            .row(pack.node().index())
            .iter()
            .map(|&(_, slice)| slice)
    }

    /// A slice's packs of one direction, ascending.
    pub fn packs_of(
        &self,
        slice: SliceId,
        direction: Direction,
    ) -> impl Iterator<Item = PackId> + '_ {
        (self.packs.row(slice.node().index()).iter())
            .filter(move |&&(_, of)| of == direction)
            .map(|&(pack, _)| pack)
    }

    pub fn pack_of(&self, slice: SliceId, direction: Direction) -> Option<PackId> {
        self.packs_of(slice, direction).next()
    }

    pub fn packs_on(&self, ir: &StepIr, replica: ReplicaId, direction: Direction) -> Vec<PackId> {
        (self.placed.row(replica.node().index()).iter())
            .map(|&(_, pack)| pack)
            .filter(|&p| ir.pack(p).direction == direction)
            .collect()
    }

    pub fn unplaced_packs(&self) -> &[PackId] {
        &self.unplaced
    }
}
