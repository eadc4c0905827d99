//! The verifier's checks of the schedule section: each replica's per-stage orders, their
//! zero-bubble splits and model chunks, deadlock freedom, the packs' own recomputation and the
//! shared ranks' orders.

use std::collections::{HashMap, HashSet};

use petgraph::graph::DiGraph;
use rustc_hash::FxHashMap;

use super::{At, Verifier};
use crate::step::{Direction, PackId, Part, Phase, ReplicaId};

impl Verifier<'_> {
    pub(super) fn schedules(&mut self) {
        let errors_before = self.errors.len();
        self.replica_schedules();
        self.pack_recompute();
        // Orders of shared ranks merge sound schedules only.
        if self.errors.len() == errors_before {
            self.rank_orders();
        }
    }

    /// Every forward pack's own recomputation ([`crate::step::StepIr::set_pack_recompute`]) is
    /// of a forward pack placed on a replica, on a stage of the step, recomputing at most the
    /// stage's layers; and each backward pack replays its slices under one mode per stage (its
    /// slices' forward packs saved them under the same mode there).
    fn pack_recompute(&mut self) {
        let ir = self.ir;
        if !ir.has_pack_recompute() {
            return;
        }
        let stages = ir.stages().len() as u32;
        let mut stages_named = Vec::new();
        for ((pack, stage), mode) in ir.pack_recomputes() {
            let name = self.names().pack(pack).to_string();
            let forward = ir.graph().node_weight(pack.node()).is_some_and(|node| {
                matches!(node, crate::step::Node::Pack(p) if p.direction == Direction::Forward)
            });
            if !forward || ir.replica_of_pack(pack).is_none() {
                let message = format!("{name} is no placed forward pack");
                self.report(At::Section("recompute"), "pack-recompute", message);
                continue;
            }
            if stage >= stages {
                let message = format!("{name}: stage {stage} of a step of {stages} stages");
                self.report(At::Pack(pack), "pack-recompute", message);
                continue;
            }
            let layers = ir.stage(ir.stages()[stage as usize]).layers;
            if let crate::spec::Recompute::Block(recomputed) = mode {
                if recomputed > layers {
                    let message = format!(
                        "recompute=block:{recomputed} on stage {stage} names more layers than \
                         the stage's {layers}"
                    );
                    self.report(At::Pack(pack), "pack-recompute", message);
                }
            }
            if !stages_named.contains(&stage) {
                stages_named.push(stage);
            }
        }
        for &replica in ir.replicas() {
            for backward in self.index.packs_on(ir, replica, Direction::Backward) {
                for &stage in &stages_named {
                    let mut modes = self
                        .index
                        .pack_slices(backward)
                        .filter_map(|slice| self.index.pack_of(slice, Direction::Forward))
                        .map(|forward| ir.saved_recompute(forward, stage));
                    let Some(first) = modes.next() else {
                        continue;
                    };
                    if let Some(other) = modes.find(|&mode| mode != first) {
                        let message = format!(
                            "replays slices saved under {first} and under {other} on stage \
                             {stage}: the forward packs of one backward pack save under one mode"
                        );
                        self.report(At::Pack(backward), "pack-recompute", message);
                    }
                }
            }
        }
    }

    /// Every shared DP rank's order ([`StepIr::rank_order`]) is of a rank in several replicas,
    /// names only replicas holding it, each as often as it runs ops on the device; and the
    /// step's program, which follows the orders, runs to the end (before lowering: a lowered
    /// step's stored program is checked as such).
    fn rank_orders(&mut self) {
        let ir = self.ir;
        if ir.rank_orders().next().is_none() {
            return;
        }
        let errors_before = self.errors.len();
        let parallel = ir.spec.parallel;
        let mut of_rank: Vec<Vec<ReplicaId>> = vec![Vec::new(); parallel.dp as usize];
        for &replica in ir.replicas() {
            for &rank in &ir.replica(replica).ranks {
                if let Some(held) = of_rank.get_mut(rank as usize) {
                    held.push(replica);
                }
            }
        }
        // A group's schedule is counted once per device, not once per member rank.
        let mut runs_on: HashMap<(ReplicaId, u32), usize> = HashMap::new();
        for ((rank, device), order) in ir.rank_orders() {
            let location = format!("order dp={rank} pp={device}");
            let Some(held) = of_rank.get(rank as usize).filter(|_| device < parallel.pp) else {
                self.report_located(
                    location,
                    "rank-order-complete",
                    format!("names no DP rank and pipeline device of {parallel}"),
                );
                continue;
            };
            if held.len() < 2 {
                self.report_located(
                    location,
                    "rank-order-complete",
                    "the rank is in one replica: there is nothing to interleave".into(),
                );
                continue;
            }
            if let Some(&stranger) = order.iter().find(|replica| !held.contains(replica)) {
                let message = format!(
                    "names {}, which does not hold the rank",
                    self.names().replica(stranger)
                );
                self.report_located(location, "rank-order-complete", message);
                continue;
            }
            for &replica in held {
                let runs = *runs_on
                    .entry((replica, device))
                    .or_insert_with(|| ir.device_schedule(replica, device).len());
                let listed = order.iter().filter(|&&r| r == replica).count();
                if listed != runs {
                    let message = format!(
                        "lists {} {listed} times; it runs {runs} ops on the device",
                        self.names().replica(replica)
                    );
                    self.report_located(location.clone(), "rank-order-complete", message);
                }
            }
        }
        if self.errors.len() == errors_before && ir.phase() < Phase::Lowered {
            if let Err(e) = crate::program::check(&crate::program::lower(ir)) {
                self.report(At::Section("order"), "rank-order-deadlock-free", e.message);
            }
        }
    }

    fn replica_schedules(&mut self) {
        let ir = self.ir;
        for &replica in ir.replicas() {
            let forward = self.index.packs_on(ir, replica, Direction::Forward);
            let backward = self.index.packs_on(ir, replica, Direction::Backward);
            if forward.is_empty() && backward.is_empty() {
                continue;
            }
            let mut complete = true;
            for &stage_id in ir.stages() {
                let stage = ir.stage(stage_id).index;
                let order = ir.schedule(replica, stage);
                let location = At::Schedule(replica, stage_id);
                let listed_forward: Vec<PackId> = order
                    .iter()
                    .copied()
                    .filter(|&p| ir.pack(p).direction == Direction::Forward)
                    .collect();
                let listed_backward: Vec<PackId> = order
                    .iter()
                    .copied()
                    .filter(|&p| ir.pack(p).direction == Direction::Backward)
                    .collect();
                if listed_forward != forward || listed_backward != backward {
                    complete = false;
                    self.report(
                        location,
                        "schedule-complete",
                        format!(
                            "lists {} forward and {} backward packs in its order; the replica has {} and {} (each exactly once, in pack order)",
                            listed_forward.len(),
                            listed_backward.len(),
                            forward.len(),
                            backward.len()
                        ),
                    );
                }
            }
            let split_ok = self.weight_grads_ordered(replica);
            if complete && split_ok && self.interleaves_complete(replica) {
                self.deadlock_free(replica);
            }
        }
    }

    /// Every deferred weight gradient of the replica (see [`StepIr::weight_grads`]) belongs
    /// to one of its backward packs, runs once per stage, after that pack's input gradient.
    fn weight_grads_ordered(&mut self, replica: ReplicaId) -> bool {
        let ir = self.ir;
        let mut ordered = true;
        for &stage_id in ir.stages() {
            let stage = ir.stage(stage_id).index;
            let deferred = ir.weight_grads(replica, stage);
            if deferred.is_empty() {
                continue;
            }
            let location = At::Schedule(replica, stage_id);
            if ir.spec.parallel.vpp > 1 {
                self.report(
                    location,
                    "weight-grad-order",
                    "splits backwards into input and weight gradients with model chunks \
                     (vpp > 1); zero-bubble schedules need one chunk per device"
                        .to_string(),
                );
                ordered = false;
                continue;
            }
            let chain = ir.schedule(replica, stage);
            let mut seen = HashSet::new();
            for &(pack, before) in deferred {
                let position = chain.iter().position(|&p| p == pack);
                let problem = if ir.pack(pack).direction != Direction::Backward
                    || ir.replica_of_pack(pack) != Some(replica)
                {
                    Some("is not a backward pack of the replica")
                } else if !seen.insert(pack) {
                    Some("is listed twice")
                } else if position.is_none_or(|p| p as u32 >= before) {
                    Some("does not run after its input gradient")
                } else {
                    None
                };
                if let Some(problem) = problem {
                    ordered = false;
                    let name = self.names().pack(pack).to_string();
                    self.report(
                        location,
                        "weight-grad-order",
                        format!("the weight gradient {name}.dw {problem}"),
                    );
                }
            }
        }
        ordered
    }

    /// With model chunks, every pipeline device of the replica has an interleave that runs
    /// each of its stages' packs once (see `StepIr::device_schedule`).
    fn interleaves_complete(&mut self, replica: ReplicaId) -> bool {
        let ir = self.ir;
        let parallel = ir.spec.parallel;
        if parallel.vpp == 1 {
            return true;
        }
        let packs = self.index.packs_on(ir, replica, Direction::Forward).len()
            + self.index.packs_on(ir, replica, Direction::Backward).len();
        let mut complete = true;
        for device in 0..parallel.pp {
            let chunks = ir.interleave(replica, device).unwrap_or(&[]);
            let counts: Vec<usize> = (0..parallel.vpp)
                .map(|chunk| chunks.iter().filter(|&&c| c == chunk).count())
                .collect();
            let stray = chunks.iter().any(|&c| c >= parallel.vpp);
            if stray || counts.iter().any(|&count| count != packs) {
                complete = false;
                self.report(
                    At::ReplicaSchedule(replica),
                    "schedule-complete",
                    format!(
                        "the interleave of pipeline device {device} runs its chunks {counts:?} times{}; each of its {} chunks must run the replica's {packs} packs",
                        if stray { " and names a chunk past vpp" } else { "" },
                        parallel.vpp
                    ),
                );
            }
        }
        complete
    }

    /// Builds the replica's task graph and looks for a cycle.
    fn deadlock_free(&mut self, replica: ReplicaId) {
        let ir = self.ir;
        let stages = ir.stages().len();
        if stages == 0 {
            return; // `stages` reports it
        }
        let mut graph: DiGraph<(PackId, usize), ()> = DiGraph::new();
        let mut task = FxHashMap::default();
        let mut packs = self.index.packs_on(ir, replica, Direction::Forward);
        packs.extend(self.index.packs_on(ir, replica, Direction::Backward));
        for &pack in &packs {
            for stage in 0..stages {
                task.insert((pack, stage), graph.add_node((pack, stage)));
            }
        }
        // An edge between two of the replica's tasks; a pack of another replica (a slice whose
        // packs sit on two replicas) is `pack-placement`'s to report, not an edge here.
        let edge = |graph: &mut DiGraph<(PackId, usize), ()>, from, to| {
            if let (Some(&from), Some(&to)) = (task.get(&from), task.get(&to)) {
                graph.add_edge(from, to, ());
            }
        };
        // A deferred weight gradient is a task of its own, after its input gradient; nothing
        // on another stage waits for it.
        let mut weight_task = FxHashMap::default();
        for device in 0..ir.spec.parallel.pp {
            let order = ir.device_schedule(replica, device);
            let mut previous = None;
            for &(op, stage) in &order {
                let node = match op.part {
                    Part::WeightGrad => {
                        let node = *weight_task
                            .entry((op.pack, stage))
                            .or_insert_with(|| graph.add_node((op.pack, stage as usize)));
                        if let Some(&input) = task.get(&(op.pack, stage as usize)) {
                            graph.add_edge(input, node, ());
                        }
                        Some(node)
                    }
                    _ => task.get(&(op.pack, stage as usize)).copied(),
                };
                if let (Some(from), Some(to)) = (previous, node) {
                    graph.add_edge(from, to, ());
                }
                previous = node.or(previous);
            }
        }
        for &pack in &packs {
            for stage in 1..stages {
                match ir.pack(pack).direction {
                    Direction::Forward => edge(&mut graph, (pack, stage - 1), (pack, stage)),
                    Direction::Backward => edge(&mut graph, (pack, stage), (pack, stage - 1)),
                };
            }
        }
        // Each forward pack before the backward packs of its slices, on the last stage: one
        // edge per pair of packs, not per slice.
        let last = stages - 1;
        let mut backwards = Vec::new();
        for &pack in &packs {
            if ir.pack(pack).direction != Direction::Forward {
                continue;
            }
            backwards.clear();
            backwards.extend(
                (self.index.pack_slices(pack))
                    .filter_map(|slice| self.index.pack_of(slice, Direction::Backward)),
            );
            backwards.sort_unstable();
            backwards.dedup();
            for &backward in &backwards {
                edge(&mut graph, (pack, last), (backward, last));
            }
        }
        if let Err(cycle) = petgraph::algo::toposort(&graph, None) {
            let (pack, stage) = graph[cycle.node_id()];
            self.report(
                At::ReplicaSchedule(replica),
                "deadlock-free",
                format!(
                    "the schedule deadlocks: {} on stage {stage} waits on itself through the pipeline dependencies",
                    self.names().pack(pack)
                ),
            );
        }
    }
}
