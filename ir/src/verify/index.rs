//! The step graph's edges as the verifier reads them, gathered in one pass over the edge
//! table into rows keyed by node index, instead of a walk of each node's edge list: on a
//! million-sample step the walks' pointer chasing missed the caches on almost every edge.
//! Every list keeps the order of the [`StepIr`] accessor it stands for.

use petgraph::graph::NodeIndex;
use petgraph::visit::{EdgeRef, IntoEdgeReferences, NodeIndexable};

use crate::step::{
    Direction, Edge, Node, PackId, ReplicaId, SampleId, SampleSlices, SliceId, StepIr,
};

/// Items grouped by node index (compressed rows, filled by a counting sort).
struct Rows<T> {
    start: Vec<u32>,
    items: Vec<T>,
}

impl<T> Default for Rows<T> {
    fn default() -> Rows<T> {
        Rows {
            start: Vec::new(),
            items: Vec::new(),
        }
    }
}

impl<T: Copy> Rows<T> {
    fn new(node_bound: usize, pairs: &[(u32, T)]) -> Rows<T> {
        let mut start = vec![0u32; node_bound + 1];
        for &(key, _) in pairs {
            start[key as usize + 1] += 1;
        }
        for i in 0..node_bound {
            start[i + 1] += start[i];
        }
        let mut next = start.clone();
        let mut items: Vec<Option<T>> = vec![None; pairs.len()];
        for &(key, item) in pairs {
            let at = &mut next[key as usize];
            items[*at as usize] = Some(item);
            *at += 1;
        }
        let items = items.into_iter().flatten().collect();
        Rows { start, items }
    }

    fn row(&self, node: NodeIndex) -> &[T] {
        match self.start.get(node.index()..node.index() + 2) {
            Some(&[from, to]) => &self.items[from as usize..to as usize],
            _ => &[],
        }
    }

    fn sort_rows_by_key<K: Ord>(&mut self, key: impl Fn(&T) -> K) {
        for window in self.start.windows(2) {
            self.items[window[0] as usize..window[1] as usize].sort_unstable_by_key(&key);
        }
    }
}

/// A slice with no `Next` edge, or a slice with no sample.
const NONE: u32 = u32::MAX;
/// A slice with several `Next` edges.
const MANY: u32 = u32::MAX - 1;

/// The edges of one step, by node.
#[derive(Default)]
pub(super) struct Index {
    /// Each slice's `Next` target (`NONE`, or `MANY` with several).
    next_of: Vec<u32>,
    /// Each slice's sample (the first `Contains` edge into it).
    sample_of: Vec<u32>,
    /// Each sample's slices by offset, by batch position.
    slices: SampleSlices,
    /// Each pack's slices by position (as [`StepIr::pack_slices`]).
    members: Rows<(u32, SliceId)>,
    /// Each slice's packs, ascending (as [`StepIr::pack_of`] takes the least).
    packs: Rows<PackId>,
    /// Each replica's packs by position (as [`StepIr::packs_on`], both directions).
    placed: Rows<(u32, PackId)>,
    /// Pack nodes with no replica, in node order (as [`StepIr::unplaced_packs`]).
    unplaced: Vec<PackId>,
}

impl Index {
    pub fn new(ir: &StepIr) -> Index {
        let graph = ir.graph();
        let bound = graph.node_bound();
        let mut next_of = vec![NONE; bound];
        let mut sample_of = vec![NONE; bound];
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
                Edge::Contains => {
                    if sample_of[target.index()] == NONE {
                        sample_of[target.index()] = from;
                    }
                }
                Edge::Member { position } => {
                    members.push((target.index() as u32, (position, SliceId(source))));
                    packs.push((from, PackId(target)));
                }
                Edge::Placed { position } => {
                    if matches!(graph[source], Node::Pack(_)) {
                        placed.push((target.index() as u32, (position, PackId(source))));
                        has_replica[source.index()] = true;
                    }
                }
                Edge::Order { .. } => {}
            }
        }
        let slices = ir.sample_slices();
        let mut members = Rows::new(bound, &members);
        members.sort_rows_by_key(|&member| member);
        let mut packs = Rows::new(bound, &packs);
        packs.sort_rows_by_key(|&p| p);
        let mut placed = Rows::new(bound, &placed);
        placed.sort_rows_by_key(|&pack| pack);
        let unplaced = graph
            .node_indices()
            .filter(|&n| matches!(graph[n], Node::Pack(_)) && !has_replica[n.index()])
            .map(PackId)
            .collect();
        Index {
            next_of,
            sample_of,
            slices,
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

    pub fn sample_of(&self, slice: SliceId) -> Option<SampleId> {
        match self.sample_of[slice.node().index()] {
            NONE => None,
            sample => Some(SampleId(NodeIndex::new(sample as usize))),
        }
    }

    pub fn slices_of(&self, ir: &StepIr, sample: SampleId) -> &[SliceId] {
        self.slices.at(ir.position_of(sample))
    }

    pub fn pack_slices(&self, pack: PackId) -> impl Iterator<Item = SliceId> + '_ {
        self.members
            .row(pack.node())
            .iter()
            .map(|&(_, slice)| slice)
    }

    /// A slice's packs of one direction, ascending.
    pub fn packs_of<'a>(
        &'a self,
        ir: &'a StepIr,
        slice: SliceId,
        direction: Direction,
    ) -> impl Iterator<Item = PackId> + 'a {
        (self.packs.row(slice.node()).iter())
            .copied()
            .filter(move |&p| ir.pack(p).direction == direction)
    }

    pub fn pack_of(&self, ir: &StepIr, slice: SliceId, direction: Direction) -> Option<PackId> {
        self.packs_of(ir, slice, direction).next()
    }

    pub fn packs_on(&self, ir: &StepIr, replica: ReplicaId, direction: Direction) -> Vec<PackId> {
        (self.placed.row(replica.node()).iter())
            .map(|&(_, pack)| pack)
            .filter(|&p| ir.pack(p).direction == direction)
            .collect()
    }

    pub fn unplaced_packs(&self) -> &[PackId] {
        &self.unplaced
    }
}
