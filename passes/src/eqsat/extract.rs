//! Extraction: the cheapest forward and backward sequences of a saturated replica e-graph.
//!
//! A sequence pays `sum + (pp - 1) x max`. Greedy (per e-class) extraction is exact for costs
//! that add up, and for a bottleneck, but not for their mix: a suffix that lowers its own
//! largest pack at the price of its sum is a loss under a prefix whose pack is larger still.
//! So, per direction: one extraction by [`Objective::Bottleneck`] finds the smallest largest
//! pack any term reaches, `M_min`; then extractions by [`Objective::SumWithin`] find the least
//! sum under a few bounds between `M_min` and the input's largest pack. Each bound's extraction
//! is exact for that bound, so the best of them is never worse than the input's own sequence.
//! All of them are candidates: the pass then pairs forward and backward candidates (and the
//! input's) and keeps the pair whose 1F1B makespan (`pipeline.rs`) is least, a finer judge than
//! the sum-and-max that extraction can compose.
//!
//! The e-graph is acyclic — a list's tail covers fewer tokens than the list, a sequence's tail
//! has fewer packs — so [`Extraction`] visits e-classes once, children first, instead of egg's
//! `Extractor`, which repeats passes over all e-classes until nothing changes (as many passes
//! as the longest list or sequence, here tens).

use std::cell::RefCell;

use egg::{CostFunction, Id, Language, RecExpr};
use rustc_hash::FxHashMap as HashMap;

use super::analysis::{Data, ReplicaFacts, ScheduleGraph};
use super::cost::{Objective, PackTimer, ScheduleCost, TermCost};
use super::language::Schedule;

/// Candidates kept per direction (each is paired with every candidate of the other direction).
const CANDIDATES: usize = 3;

/// Bounds tried between `M_min` and the input's largest pack, as fractions of the way.
const BOUNDS: [f64; 4] = [0.0, 1.0 / 3.0, 2.0 / 3.0, 1.0];

/// Candidate terms of the forward and backward sequence e-classes `sequences` (whose input
/// terms' largest packs take `input_max` seconds), distinct, best by the sequence cost first:
/// the least-sum term under each bound, and the term of the smallest largest pack. One
/// extraction serves both directions: their sequences share no e-class above the slice lists.
pub fn candidate_sequences(
    egraph: &ScheduleGraph,
    sequences: [Id; 2],
    input_max: [f64; 2],
    timer: &RefCell<PackTimer>,
    facts: &ReplicaFacts,
) -> [Vec<RecExpr<Schedule>>; 2] {
    let stages = timer.borrow().stages();
    let order = children_first(egraph);
    let extract = |objective| {
        let cost_function = ScheduleCost {
            timer,
            facts,
            objective,
        };
        Extraction::new(egraph, &order, cost_function)
    };
    let lowest = extract(Objective::Bottleneck);
    let lowest_max = sequences.map(|sequence| lowest.cost(sequence).sequence().max);
    let mut found: [Vec<(f64, RecExpr<Schedule>)>; 2] = [Vec::new(), Vec::new()];
    let add = |d: usize, extraction: &Extraction, found: &mut [Vec<_>; 2]| {
        let total = extraction.cost(sequences[d]).sequence().total(stages);
        let term = extraction.term(sequences[d]);
        if !found[d].iter().any(|(_, known)| *known == term) {
            found[d].push((total, term));
        }
    };
    for fraction in BOUNDS {
        let bound = |d: usize| lowest_max[d] + fraction * (input_max[d] - lowest_max[d]).max(0.0);
        let extraction = extract(Objective::SumWithin([bound(0), bound(1)]));
        for d in 0..2 {
            add(d, &extraction, &mut found);
        }
    }
    for d in 0..2 {
        add(d, &lowest, &mut found);
    }
    found.map(|mut terms| {
        // Stable sort: equal totals keep the tighter bound first.
        terms.sort_by(|a, b| a.0.total_cmp(&b.0));
        terms.truncate(CANDIDATES);
        terms.into_iter().map(|(_, term)| term).collect()
    })
}

/// The e-classes, every one after the e-classes its e-nodes point to.
fn children_first(egraph: &ScheduleGraph) -> Vec<Id> {
    let key = |data: &Data| match data {
        Data::Slice(_) | Data::Kept(_) => (0, 0),
        Data::List(members) => (1, members.load.tokens),
        Data::Pack { members, .. } => (2, members.load.tokens),
        Data::Sequence { packs } => (3, *packs as u64),
        Data::Replica => (4, 0),
    };
    let mut classes: Vec<(u32, u64, Id)> = egraph
        .classes()
        .map(|class| {
            let (kind, measure) = key(&class.data);
            (kind, measure, class.id)
        })
        .collect();
    classes.sort_unstable();
    classes.into_iter().map(|(_, _, id)| id).collect()
}

/// The least-cost e-node of every e-class under one objective.
struct Extraction<'a> {
    egraph: &'a ScheduleGraph,
    best: HashMap<Id, (TermCost, Schedule)>,
}

impl<'a> Extraction<'a> {
    fn new(
        egraph: &'a ScheduleGraph,
        order: &[Id],
        mut cost_function: ScheduleCost,
    ) -> Extraction<'a> {
        let mut best: HashMap<Id, (TermCost, Schedule)> = HashMap::default();
        for &class in order {
            let mut chosen: Option<(TermCost, Schedule)> = None;
            for node in &egraph[class].nodes {
                let cost = cost_function.cost(node, |child| best[&egraph.find(child)].0);
                if chosen.as_ref().is_none_or(|(least, _)| cost < *least) {
                    chosen = Some((cost, node.clone()));
                }
            }
            best.insert(class, chosen.expect("an e-class has an e-node"));
        }
        Extraction { egraph, best }
    }

    fn cost(&self, class: Id) -> TermCost {
        self.best[&self.egraph.find(class)].0
    }

    fn term(&self, class: Id) -> RecExpr<Schedule> {
        let root = &self.best[&self.egraph.find(class)].1;
        root.build_recexpr(|child| self.best[&self.egraph.find(child)].1.clone())
    }
}

/// The forward and backward sequence e-classes of the replica e-class `root`.
pub fn sequences(egraph: &ScheduleGraph, root: Id) -> [Id; 2] {
    let replica = egraph[root]
        .nodes
        .iter()
        .find_map(|node| match node {
            Schedule::Replica([forward, backward]) => Some((*forward, *backward)),
            _ => None,
        })
        .expect("the root e-class holds a replica; this is a bug");
    [egraph.find(replica.0), egraph.find(replica.1)]
}
