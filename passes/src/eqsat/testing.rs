//! Helpers for the rule tests: small e-graphs from term strings, with a real machine model.

use std::cell::RefCell;
use std::rc::Rc;

use egg::{EGraph, RecExpr, Rewrite, Runner};
use indexmap::IndexMap;

use super::analysis::{ReplicaFacts, SampleFacts, ScheduleAnalysis, ScheduleGraph};
use super::cost::PackTimer;
use super::language::Schedule;
use slimpack_ir::Spec;
use slimpack_machine::cost::CostModel;

/// Facts of a replica whose samples have `lengths`, released at forward pack 0, with no
/// token cap, merges up to the longest sample and room for every candidate.
pub fn facts(
    lengths: &[u32],
    forward_packs: usize,
    backward_packs: usize,
    grain: u32,
) -> ReplicaFacts {
    ReplicaFacts {
        samples: lengths
            .iter()
            .map(|&len| SampleFacts { len, release: 0 })
            .collect(),
        forward_packs,
        backward_packs,
        forward_cap: u64::MAX,
        backward_cap: u64::MAX,
        grain,
        largest_slice: lengths.iter().copied().max().unwrap_or(1),
        input_cuts: Vec::new(),
        fanout: 8,
        kept_seconds: [vec![0.0; forward_packs], vec![0.0; backward_packs]],
    }
}

/// The machine model the tests time packs with: the tiny model on the CPU preset.
pub fn timer() -> PackTimer {
    let spec = Spec::from_presets("tiny", "cpu", "tp=1,pp=2,dp=1").unwrap();
    PackTimer::new(CostModel::new(&spec), vec![0])
}

/// An e-graph holding `term`.
pub fn graph(facts: &ReplicaFacts, term: &str) -> ScheduleGraph {
    let mut egraph = EGraph::new(ScheduleAnalysis {
        facts: Rc::new(facts.clone()),
        timer: Rc::new(RefCell::new(timer())),
    });
    egraph.add_expr(&term.parse().unwrap());
    egraph.rebuild();
    egraph
}

/// Runs `rules` for `iterations`; the e-graph and how often each rule applied.
pub fn saturate(
    egraph: ScheduleGraph,
    rules: Vec<Rewrite<Schedule, ScheduleAnalysis>>,
    iterations: usize,
) -> (ScheduleGraph, IndexMap<String, usize>) {
    let runner: Runner<Schedule, ScheduleAnalysis> = Runner::new(egraph.analysis.clone())
        .with_egraph(egraph)
        .with_iter_limit(iterations)
        .run(&rules);
    let mut applied = IndexMap::new();
    for iteration in &runner.iterations {
        for (rule, count) in &iteration.applied {
            *applied.entry(rule.to_string()).or_default() += count;
        }
    }
    (runner.egraph, applied)
}

/// Both terms are in the e-graph, in one e-class.
pub fn equivalent(egraph: &ScheduleGraph, a: &str, b: &str) -> bool {
    let lookup = |term: &str| egraph.lookup_expr(&term.parse::<RecExpr<Schedule>>().unwrap());
    match (lookup(a), lookup(b)) {
        (Some(a), Some(b)) => egraph.find(a) == egraph.find(b),
        _ => false,
    }
}
