//! Rank merging on a step: its aligned rank pairs, their e-graphs, and the re-packed result.
//!
//! A rank runs every replica it belongs to (its plain replica and the DP-Merge groups holding
//! it) on the same streams, so here a rank costs the sum of those replicas' 1F1B makespans
//! (`pipeline.rs`) and the step the slowest rank. Pairs `{2i, 2i + 1}` are refined slowest
//! first (with `scope=bottleneck`, only while a pair is slower than the pairs refined so far
//! and those left out). A pair qualifies when both ranks have a plain replica of their own and
//! no DP-Merge group other than the pair's own holds either (a new group must be disjoint from
//! the others, which the verifier checks), so steps with a static CP degree have none.
//!
//! Per pair: the samples of the two plain replicas and of the group become a `(pair A B M)`
//! term; the rules of [`rank_merge`](super::rank_merge) grow its e-graph; the cheapest few
//! placements by the estimate are re-packed — the changed replicas only, by `pack-fwd` and
//! `pack-bwd` themselves on a step holding just those replicas, with the input's cap (and
//! mirrored backward packs if the input's are) — and timed by their makespans; the least is
//! kept if it beats the input. A sample keeps its slices wherever it goes.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use rustc_hash::FxHashMap as HashMap;

use egg::RecExpr;
use indexmap::IndexMap;

use super::cost::PackTimer;
use super::encode::ReplicaPlan;
use super::language::{Schedule, Span, Whole};
use super::makespan;
use super::rank_merge::{self, PairFacts, RankAnalysis, UnitFacts};
use super::rebuild::{self, Layout};
use super::Eqsat;
use crate::micropack::{pack_direction, PackOptions};
use slimpack_ir::step::{Direction, Phase, ReplicaId, SampleId};
use slimpack_ir::StepIr;
use slimpack_machine::cost::CostModel;

/// Placements re-packed and timed per pair, cheapest estimate first.
const CANDIDATES: usize = 3;

/// What rank merging did, for the statistics.
#[derive(Debug, Default)]
pub struct RankOutcome {
    /// The rebuilt step, when a pair improved.
    pub ir: Option<StepIr>,
    pub pairs_optimized: usize,
    pub pairs_improved: usize,
    /// Samples the kept placements run on a DP-Merge group, before and after.
    pub merged_before: usize,
    pub merged_after: usize,
    /// The slowest rank's seconds, before and after.
    pub cost_before: f64,
    pub cost_after: f64,
    pub nodes: usize,
    pub classes: usize,
    pub iterations: usize,
    pub applied: IndexMap<String, usize>,
    pub stops: IndexMap<String, usize>,
}

/// One replica's input: its plan (empty without packs) and 1F1B makespan.
struct Timed {
    plan: ReplicaPlan,
    seconds: f64,
}

/// An aligned pair of DP ranks and its replicas.
struct Pair {
    ranks: [u32; 2],
    /// The plain replicas of the two ranks.
    plain: [ReplicaId; 2],
    /// The pair's DP-Merge group, if the input has one.
    group: Option<ReplicaId>,
}

/// The three lists of a pair's placement: rank a's plain replica, rank a + 1's, the group.
type Placement = [Vec<SampleId>; 3];

/// A re-packed placement: per list, the plan and its packs' caps (`None`: as in the input).
type Repacked = [Option<(ReplicaPlan, [Vec<Option<u32>>; 2])>; 3];

/// Runs rank merging over the step's pairs (see the module header).
pub fn merge_ranks(eqsat: &Eqsat, ir: &StepIr, model: &CostModel) -> RankOutcome {
    let mut outcome = RankOutcome::default();
    for rule in rank_merge::rules() {
        outcome.applied.insert(rule.name.to_string(), 0);
    }
    let dp = ir.spec.parallel.dp;
    let plain_timer = Rc::new(RefCell::new(PackTimer::new(model.clone(), vec![0])));
    let mut group_timers: HashMap<ReplicaId, Rc<RefCell<PackTimer>>> = HashMap::default();
    let mut inputs: HashMap<ReplicaId, Timed> = HashMap::default();
    let mut plans: HashMap<ReplicaId, ReplicaPlan> = ReplicaPlan::all(ir).into_iter().collect();
    let mut rank_seconds = vec![0.0f64; dp as usize];
    for &replica in ir.replicas() {
        let ranks = &ir.replica(replica).ranks;
        let timer = if ranks.len() > 1 {
            let timer = Rc::new(RefCell::new(PackTimer::new(model.clone(), ranks.clone())));
            group_timers.insert(replica, Rc::clone(&timer));
            timer
        } else {
            Rc::clone(&plain_timer)
        };
        let plan = plans.remove(&replica).unwrap_or_else(|| ReplicaPlan {
            samples: ir.samples_on(replica),
            forward: Vec::new(),
            backward: Vec::new(),
        });
        let seconds = makespan::makespan(&mut timer.borrow_mut(), &plan.forward, &plan.backward);
        for &rank in ranks {
            rank_seconds[rank as usize] += seconds;
        }
        inputs.insert(replica, Timed { plan, seconds });
    }
    outcome.cost_before = rank_seconds.iter().copied().fold(0.0, f64::max);
    outcome.merged_before = ir
        .replicas()
        .iter()
        .filter(|&&r| ir.replica(r).ranks.len() > 1)
        .map(|r| inputs[r].plan.samples.len())
        .sum();
    outcome.merged_after = outcome.merged_before;
    // Every pair, slowest first; `None` where the pair does not qualify.
    let mut pairs: Vec<(f64, u32, Option<Pair>)> = (0..dp / 2)
        .map(|i| {
            let ranks = [2 * i, 2 * i + 1];
            let seconds = rank_seconds[ranks[0] as usize].max(rank_seconds[ranks[1] as usize]);
            (seconds, i, qualifying_pair(ir, ranks))
        })
        .collect();
    pairs.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut bound = if dp % 2 == 1 {
        rank_seconds[dp as usize - 1]
    } else {
        0.0
    };
    let mut replans: BTreeMap<u32, (Pair, Repacked)> = BTreeMap::new();
    for (seconds, index, pair) in pairs {
        if eqsat.scope == super::Scope::Bottleneck && seconds <= bound {
            break;
        }
        let Some(pair) = pair else {
            bound = bound.max(seconds);
            continue;
        };
        let group_timer = match pair.group {
            Some(group) => Rc::clone(&group_timers[&group]),
            None => Rc::new(RefCell::new(PackTimer::new(
                model.clone(),
                pair.ranks.to_vec(),
            ))),
        };
        let (after, repacked) = optimize_pair(
            eqsat,
            ir,
            model,
            &pair,
            &inputs,
            (&plain_timer, &group_timer),
            &mut outcome,
        );
        outcome.pairs_optimized += 1;
        bound = bound.max(after);
        if let Some(repacked) = repacked {
            outcome.pairs_improved += 1;
            let group_before = pair.group.map_or(0, |g| inputs[&g].plan.samples.len());
            let group_after = repacked[2]
                .as_ref()
                .map_or(group_before, |(plan, _)| plan.samples.len());
            outcome.merged_after = outcome.merged_after + group_after - group_before;
            replans.insert(index, (pair, repacked));
        }
    }
    if replans.is_empty() {
        outcome.cost_after = outcome.cost_before;
    } else {
        let rebuilt = rebuild_step(ir, &replans, model);
        outcome.cost_after = step_seconds(&rebuilt, model);
        outcome.ir = Some(rebuilt);
    }
    outcome
}

/// The slowest rank's seconds: per rank, the makespans of the replicas it belongs to.
pub fn step_seconds(ir: &StepIr, model: &CostModel) -> f64 {
    step_seconds_knowing(ir, model, &vec![None; ir.replicas().len()])
}

/// [`step_seconds`] where `known[position]` already holds the makespan of the replica at that
/// position of the IR's order (a replica a pass left as it was): only the others are timed.
pub fn step_seconds_knowing(ir: &StepIr, model: &CostModel, known: &[Option<f64>]) -> f64 {
    let mut timed: HashMap<ReplicaId, f64> = HashMap::default();
    for (replica, plan) in ReplicaPlan::all_where(ir, |position| known[position].is_none()) {
        let ranks = ir.replica(replica).ranks.clone();
        let mut timer = PackTimer::new(model.clone(), ranks);
        timed.insert(
            replica,
            makespan::makespan(&mut timer, &plan.forward, &plan.backward),
        );
    }
    slowest_rank(ir, |position, replica| {
        known[position].or_else(|| timed.get(&replica).copied())
    })
}

/// The step's cost from its replicas' makespans (`makespan(position, replica)`, `None` for a
/// replica without packs): each DP rank runs the replicas holding it one after the other, in
/// the IR's order, and the slowest rank is the step.
pub fn slowest_rank(ir: &StepIr, makespan: impl Fn(usize, ReplicaId) -> Option<f64>) -> f64 {
    let mut rank_seconds = vec![0.0f64; ir.spec.parallel.dp as usize];
    for (position, &replica) in ir.replicas().iter().enumerate() {
        let Some(seconds) = makespan(position, replica) else {
            continue;
        };
        for &rank in &ir.replica(replica).ranks {
            rank_seconds[rank as usize] += seconds;
        }
    }
    rank_seconds.into_iter().fold(0.0, f64::max)
}

/// The pair `ranks` with its replicas, if it qualifies (see the module header).
fn qualifying_pair(ir: &StepIr, ranks: [u32; 2]) -> Option<Pair> {
    let mut plain = [None, None];
    let mut group = None;
    for &replica in ir.replicas() {
        let held = &ir.replica(replica).ranks;
        if !held.iter().any(|r| ranks.contains(r)) {
            continue;
        }
        match held.as_slice() {
            [rank] => plain[(rank - ranks[0]) as usize] = Some(replica),
            both if both == ranks => group = Some(replica),
            _ => return None,
        }
    }
    Some(Pair {
        ranks,
        plain: [plain[0]?, plain[1]?],
        group,
    })
}

/// Saturates one pair and keeps the best re-packed placement if it beats the input: the
/// pair's seconds after (its slower rank) and the re-packed lists, if any.
fn optimize_pair(
    eqsat: &Eqsat,
    ir: &StepIr,
    model: &CostModel,
    pair: &Pair,
    inputs: &HashMap<ReplicaId, Timed>,
    (plain_timer, group_timer): (&Rc<RefCell<PackTimer>>, &Rc<RefCell<PackTimer>>),
    outcome: &mut RankOutcome,
) -> (f64, Option<Repacked>) {
    let input_plan = |list: usize| -> Option<&Timed> {
        match list {
            0 | 1 => Some(&inputs[&pair.plain[list]]),
            _ => pair.group.map(|g| &inputs[&g]),
        }
    };
    let placement: Placement =
        [0, 1, 2].map(|list| input_plan(list).map_or(Vec::new(), |t| t.plan.samples.clone()));
    let input_seconds = [0, 1, 2].map(|list| input_plan(list).map_or(0.0, |t| t.seconds));
    let rank_cost = |seconds: [f64; 3]| (seconds[0] + seconds[2]).max(seconds[1] + seconds[2]);
    let before = rank_cost(input_seconds);
    // The pair's samples, longest first (ties: batch order, the order of `ir.samples()`).
    let order: HashMap<SampleId, usize> = ir
        .samples()
        .iter()
        .enumerate()
        .map(|(i, &s)| (s, i))
        .collect();
    let mut samples: Vec<SampleId> = placement.iter().flatten().copied().collect();
    samples.sort_by_key(|s| (std::cmp::Reverse(ir.sample(*s).len), order[s]));
    let unit_of: HashMap<SampleId, u32> = samples
        .iter()
        .enumerate()
        .map(|(i, &s)| (s, i as u32))
        .collect();
    let units = samples
        .iter()
        .map(|&sample| {
            let spans: Vec<Span> = ir
                .slices_of(sample)
                .into_iter()
                .map(|slice| {
                    let slice = ir.slice(slice);
                    Span {
                        sample: 0,
                        start: slice.start,
                        len: slice.len,
                    }
                })
                .collect();
            UnitFacts {
                len: ir.sample(sample).len,
                plain: plain_timer.borrow_mut().list_load(&spans),
                merged: group_timer.borrow_mut().list_load(&spans),
            }
        })
        .collect();
    let analysis = RankAnalysis {
        facts: Rc::new(PairFacts {
            units,
            plain_len_limit: longest_on_plain_replicas(ir),
            fanout: eqsat.fanout,
        }),
        plain: Rc::clone(plain_timer),
        merged: Rc::clone(group_timer),
    };
    let lists = placement.clone().map(|list| {
        let mut units: Vec<u32> = list.iter().map(|s| unit_of[s]).collect();
        units.sort_unstable();
        units
    });
    let rules = rank_merge::rules();
    // The input term spells out every sample of the pair; the limit is what the rules add.
    let term = pair_term(&lists);
    let nodes = term.as_ref().len() + eqsat.nodes;
    let runner = eqsat.saturate(analysis, term, &rules, nodes);
    for rule in &rules {
        let count: usize = runner
            .iterations
            .iter()
            .filter_map(|i| i.applied.get(&rule.name))
            .sum();
        *outcome.applied.entry(rule.name.to_string()).or_default() += count;
    }
    outcome.nodes += runner.egraph.total_size();
    outcome.classes += runner.egraph.number_of_classes();
    outcome.iterations += runner.iterations.len();
    *outcome
        .stops
        .entry(super::stop_reason(runner.stop_reason.as_ref()))
        .or_default() += 1;
    let mirrored = mirrored(inputs);
    let mut best: Option<(f64, Repacked)> = None;
    for candidate in
        rank_merge::cheapest_placements(&runner.egraph, runner.roots[0], CANDIDATES + 1)
    {
        if candidate == lists {
            continue;
        }
        let chosen: Placement =
            candidate.map(|units| units.into_iter().map(|u| samples[u as usize]).collect());
        let repacked = repack(ir, model, pair, &placement, &chosen, mirrored);
        let seconds = [0, 1, 2].map(|list| match &repacked[list] {
            Some((plan, _)) => {
                let timer = if list < 2 { plain_timer } else { group_timer };
                makespan::makespan(&mut timer.borrow_mut(), &plan.forward, &plan.backward)
            }
            None => input_seconds[list],
        });
        let cost = rank_cost(seconds);
        if best.as_ref().is_none_or(|(least, _)| cost < *least) {
            best = Some((cost, repacked));
        }
    }
    match best {
        Some((cost, repacked)) if cost < before * (1.0 - 1e-9) => (cost, Some(repacked)),
        _ => (before, None),
    }
}

/// `(pair A B M)` of the three lists of units.
fn pair_term(lists: &[Vec<u32>; 3]) -> RecExpr<Schedule> {
    let mut term = RecExpr::default();
    let children = lists.clone().map(|units| {
        let mut list = term.add(Schedule::Idle);
        for unit in units.into_iter().rev() {
            let leaf = term.add(Schedule::WholeSample(Whole(unit)));
            list = term.add(Schedule::Work([leaf, list]));
        }
        list
    });
    term.add(Schedule::Pair(children));
    term
}

/// The longest sample on a single-rank replica (what one rank's memory is known to hold).
fn longest_on_plain_replicas(ir: &StepIr) -> u32 {
    ir.samples()
        .iter()
        .filter(|&&s| {
            ir.replica_of_sample(s)
                .is_some_and(|r| ir.replica(r).ranks.len() == 1)
        })
        .map(|&s| ir.sample(s).len)
        .max()
        .unwrap_or(0)
}

/// Whether the input's backward packs mirror its forward packs (`pack-bwd{mirror=true}`) on
/// every replica: re-packing then mirrors too.
fn mirrored(inputs: &HashMap<ReplicaId, Timed>) -> bool {
    let sets = |packs: &[Vec<Span>]| {
        let mut packs = packs.to_vec();
        packs.sort_unstable();
        packs
    };
    inputs
        .values()
        .all(|t| sets(&t.plan.forward) == sets(&t.plan.backward))
}

/// Re-packs the lists of `chosen` that differ from `input` with `pack-fwd` and `pack-bwd`, on
/// a step holding only those replicas (their samples with their slices), at the input's cap.
fn repack(
    ir: &StepIr,
    model: &CostModel,
    pair: &Pair,
    input: &Placement,
    chosen: &Placement,
    mirrored: bool,
) -> Repacked {
    let changed: Vec<usize> = (0..3).filter(|&l| chosen[l] != input[l]).collect();
    let cap = [pair.plain[0], pair.plain[1]]
        .into_iter()
        .chain(pair.group)
        .flat_map(|r| ir.packs_on(r, Direction::Forward))
        .filter_map(|p| ir.pack(p).cap)
        .max();
    let stages: Vec<_> = ir.stages().iter().map(|&s| *ir.stage(s)).collect();
    let mut step = StepIr::with_stages(ir.spec.clone(), ir.batch.clone(), &stages);
    let mut originals: HashMap<SampleId, SampleId> = HashMap::default();
    let mut replicas = Vec::new();
    for &list in &changed {
        let ranks = if list < 2 {
            vec![pair.ranks[list]]
        } else {
            pair.ranks.to_vec()
        };
        let replica = step.add_replica(ranks);
        replicas.push(replica);
        for &sample in &chosen[list] {
            let copy = step.add_bare_sample(*ir.sample(sample));
            for slice in ir.slices_of(sample) {
                step.add_slice(copy, *ir.slice(slice));
            }
            step.place_sample(copy, replica);
            originals.insert(copy, sample);
        }
    }
    step.advance(Phase::Assigned);
    let options = PackOptions {
        cap,
        ..PackOptions::default()
    };
    pack_direction(
        &mut step,
        model,
        Direction::Forward,
        options,
        super::INFO.name,
    )
    .expect("pack-fwd packs a step it packed before; this is a bug");
    let backward = PackOptions {
        mirror: mirrored,
        ..options
    };
    pack_direction(
        &mut step,
        model,
        Direction::Backward,
        backward,
        super::INFO.name,
    )
    .expect("pack-bwd packs a step it packed before; this is a bug");
    let mut plans: HashMap<ReplicaId, ReplicaPlan> = ReplicaPlan::all(&step).into_iter().collect();
    let mut repacked: Repacked = [None, None, None];
    for (&list, &replica) in changed.iter().zip(&replicas) {
        let mut plan = plans.remove(&replica).unwrap_or_else(|| ReplicaPlan {
            samples: Vec::new(),
            forward: Vec::new(),
            backward: Vec::new(),
        });
        plan.samples = plan.samples.iter().map(|s| originals[s]).collect();
        let caps = [Direction::Forward, Direction::Backward].map(|direction| {
            step.packs_on(replica, direction)
                .iter()
                .map(|&p| step.pack(p).cap)
                .collect()
        });
        repacked[list] = Some((plan, caps));
    }
    repacked
}

/// The step with the re-packed pairs: their replicas replaced, a group added where a pair
/// had none, and a group dropped where it runs nothing any more.
fn rebuild_step(
    ir: &StepIr,
    replans: &BTreeMap<u32, (Pair, Repacked)>,
    model: &CostModel,
) -> StepIr {
    let mut planned: HashMap<ReplicaId, Option<Layout>> = HashMap::default();
    let mut new_groups = Vec::new();
    for (pair, repacked) in replans.values() {
        for (list, layout) in repacked.iter().enumerate() {
            let Some((plan, caps)) = layout else {
                continue;
            };
            let layout =
                (!plan.samples.is_empty()).then(|| Layout::Plan(plan.clone(), caps.clone()));
            match (list, pair.group) {
                (0 | 1, _) => {
                    planned.insert(pair.plain[list], layout);
                }
                (_, Some(group)) => {
                    planned.insert(group, layout);
                }
                (_, None) => new_groups.extend(layout.map(|l| (pair.ranks.to_vec(), l))),
            }
        }
    }
    let mut replicas: Vec<(Vec<u32>, Layout)> = Vec::new();
    for &replica in ir.replicas() {
        let ranks = ir.replica(replica).ranks.clone();
        match planned.get(&replica) {
            None => replicas.push((ranks, Layout::Copy(replica))),
            Some(Some(layout)) => replicas.push((ranks, layout.clone())),
            // A plain replica stays (a rank always has one), even with nothing to run.
            Some(None) if ranks.len() == 1 => replicas.push((
                ranks,
                Layout::Plan(
                    ReplicaPlan {
                        samples: Vec::new(),
                        forward: Vec::new(),
                        backward: Vec::new(),
                    },
                    [Vec::new(), Vec::new()],
                ),
            )),
            Some(None) => {}
        }
    }
    replicas.extend(new_groups);
    rebuild::rebuild_replicas(ir, &replicas, model)
}
