//! `eqsat{nodes=N,iters=N,ms=N,grain=N,fanout=N,focus=N,scope=bottleneck|all}`: refine the
//! MicroPacks of the slowest replicas by equality saturation (egg), and keep the result only
//! if it is cheaper.
//!
//! Phase in: `packed` (the intended place: after `pack-fwd,pack-bwd`, before
//! `schedule-pipeline`) or `scheduled`. Phase out: unchanged. It runs before scheduling because
//! what it changes is the packs, and `schedule-pipeline` then orders the final packs with its
//! memory-aware warm-up, exactly as it orders any packs; run after scheduling, the pass re-runs
//! `schedule-pipeline` on the rebuilt step (and so replaces whatever order the input had).
//!
//! Per replica, slowest first (by its 1F1B makespan, [`makespan`]): the packs around the
//! `focus` slowest packs of each direction become a term of the schedule language
//! ([`language`]; the other packs are kept runs); the rules ([`slicing`]: split a slice of the
//! slower of two neighbouring packs where a piece would balance them, merge pieces back;
//! [`regroup`]: move and swap slices between neighbouring packs under the order, cap and
//! release rules) grow its e-graph within the node and iteration limits; extraction
//! ([`extract`]) proposes, per direction, the cheapest sequences under the bottom-up cost
//! ([`cost`]: pack = the machine model's pack time on the slowest stage, sequence = sum +
//! (pp-1) x max) for a few bounds on the largest pack; each pairing of a forward and a
//! backward proposal (or the input's packs) is refined so both directions share its slices
//! ([`rebuild`]) and timed by the replica's 1F1B makespan; the least is kept if it beats the
//! input's. The step costs the maximum over replicas, so with `scope=bottleneck` (the default)
//! the pass stops at the first replica that is no slower than what the replicas already
//! refined cost: improving it could not lower the step. `scope=all` refines every replica —
//! worth it where the simulator's slowest replica is not the makespan's (sends, memory-bound
//! warm-ups and the DP sync are not in the makespan).
//!
//! With `ranks=true` (opt-in), rank merging first ([`placement`], rules in [`rank_merge`]): a
//! rank runs its plain replica and every DP-Merge group holding it on the same streams, so per
//! aligned pair of DP ranks, slowest first, a `(pair A B M)` term of which samples the two
//! plain replicas and the pair's group run is saturated with moving a sample to the partner
//! rank, merging it onto the group (half the work per rank plus the CP exchange) and splitting
//! it out of the group; the cheapest placements are re-packed by `pack-fwd` and `pack-bwd` and
//! kept if the pair's slower rank (sum of its replicas' 1F1B makespans) gets faster. The
//! per-replica refinement then runs on the result. It is off by default: through the
//! `slimpack` strategy it moved a 5-step run by 0.00-0.18% while doubling the tuning time
//! where DP-Merge candidates are compiled (docs/BENCHMARKS.md, "eqsat: gain and cost").
//!
//! Determinism: egg is built with its `deterministic` feature (insertion-ordered maps), rules
//! and candidates are ordered, and there is no time limit unless `ms` is given (a time limit
//! makes the result depend on the machine's speed). Statistics: e-nodes and e-classes (summed
//! over the replicas' e-graphs), iterations, applications per rule (rank merging's included),
//! stop reasons, the step's cost before and after (seconds: the slowest rank, the makespans
//! of the replicas it runs summed) and the relative gain, the slowest replica's makespan
//! before and after the per-replica refinement, rank merging's own figures (`rank_merge`:
//! pairs refined and improved, samples on DP-Merge groups, e-graph sizes, its time), the
//! grain, and the time spent (setup, e-graphs with extraction, total).

mod analysis;
mod cost;
mod encode;
mod extract;
mod language;
mod makespan;
mod placement;
mod rank_merge;
mod rebuild;
mod regroup;
mod slicing;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use egg::{Analysis, RecExpr, Rewrite, Runner, StopReason};
use indexmap::IndexMap;

use crate::error::Result;
use crate::pass::{OptionInfo, Pass, PassContext, PassInfo, PassOptions, Statistics};
use analysis::{Knobs, ScheduleAnalysis};
use cost::PackTimer;
use encode::ReplicaPlan;
use language::Schedule;
use slimpack_ir::step::{Direction, Phase, ReplicaId};
use slimpack_ir::StepIr;

pub use language::Span;

pub(crate) const INFO: PassInfo = PassInfo {
    name: "eqsat",
    summary: "refine the slowest replicas' MicroPacks by equality saturation (egg)",
    description: "With ranks=true, first per aligned pair of DP ranks, slowest first: saturate \
                  which of the two plain replicas and their DP-Merge group run each sample \
                  (move, merge, split), re-pack the cheapest placements and keep one if the \
                  pair's slower rank gets faster. Per replica, slowest first: encode the packs \
                  around the slowest ones as a term, saturate with slicing (split/merge) and regrouping (move/swap between \
                  neighbouring packs) rules under node and iteration limits, extract candidates \
                  under the machine model, and keep the one with the least 1F1B makespan if it \
                  beats the input. Phase packed (or scheduled, then re-scheduled) -> unchanged.",
    accepts: Phase::Packed..=Phase::Scheduled,
    produces: None,
    options: OPTIONS,
    create: |options| Ok(Box::new(Eqsat::from_options(options)?)),
};

const OPTIONS: &[OptionInfo] = &[
    OptionInfo {
        name: "nodes",
        help: "e-node limit per replica's e-graph",
        default: Some("1000"),
    },
    OptionInfo {
        name: "iters",
        help: "iteration limit per replica",
        default: Some("6"),
    },
    OptionInfo {
        name: "ms",
        help: "time limit per replica in milliseconds (default none; with one, results depend on the machine's speed)",
        default: None,
    },
    OptionInfo {
        name: "grain",
        help: "split slices only at multiples of this many tokens (default: the largest slice / 16, a power of two)",
        default: None,
    },
    OptionInfo {
        name: "fanout",
        help: "regroupings added per matched pair of packs, best first",
        default: Some("2"),
    },
    OptionInfo {
        name: "focus",
        help: "regroup around this many of the slowest packs of each direction",
        default: Some("3"),
    },
    OptionInfo {
        name: "scope",
        help: "bottleneck (only replicas that bound the step) or all",
        default: Some("bottleneck"),
    },
    OptionInfo {
        name: "ranks",
        help: "true: rank merging first (move, DP-Merge or split samples within aligned pairs of DP ranks); false: packs only",
        default: Some("false"),
    },
];

/// Which replicas the pass refines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Slowest first, while a replica is slower than the refined ones.
    Bottleneck,
    All,
}

/// The equality-saturation pass.
#[derive(Debug, Clone, Copy)]
pub struct Eqsat {
    pub nodes: usize,
    pub iters: usize,
    pub time_limit: Option<Duration>,
    pub grain: Option<u32>,
    pub fanout: usize,
    /// Spell out (and so regroup) only the packs around this many of the slowest packs of
    /// each direction; the others are kept runs. The step pays for a sequence's largest pack,
    /// and an e-graph over every pack of a replica grows faster than it pays.
    pub focus: usize,
    pub scope: Scope,
    /// Refine which ranks run each sample (rank merging) before the packs.
    pub ranks: bool,
}

impl Default for Eqsat {
    /// The pass with every option at its declared default.
    fn default() -> Eqsat {
        Eqsat::from_options(&PassOptions::new(INFO.name, Default::default(), OPTIONS))
            .expect("the declared defaults parse (bug)")
    }
}

impl Eqsat {
    fn from_options(options: &PassOptions) -> Result<Eqsat> {
        let declared = "declared with a default";
        // Limits well past any useful search: the e-graph's memory grows with them (a million
        // e-nodes is about a gigabyte).
        let count = |name: &str, max: u64| -> Result<usize> {
            Ok(options.bounded(name, max)?.expect(declared) as usize)
        };
        let scope = match options.choice("scope", &["bottleneck", "all"])? {
            Some("all") => Scope::All,
            _ => Scope::Bottleneck,
        };
        Ok(Eqsat {
            nodes: count("nodes", 1_000_000)?,
            iters: count("iters", 1_000)?,
            time_limit: options.positive("ms")?.map(Duration::from_millis),
            grain: options
                .positive::<u64>("grain")?
                .map(|g| g.min(u64::from(u32::MAX)) as u32),
            fanout: count("fanout", 100)?,
            focus: count("focus", 10_000)?,
            scope,
            ranks: options.get("ranks", "true or false")?.expect(declared),
        })
    }

    /// Runs the rules over `term` within `nodes` e-nodes and the iteration (and time) limits.
    ///
    /// egg times its phases with quanta, whose first use in a process calibrates the TSC for
    /// 0.5 to 200 ms, longer than the whole pass; so egg runs under a mock quanta clock (its
    /// time limit then never fires: the result depends on the limits only), and the pass's
    /// own time limit, if any, is checked with `std::time` by a hook between iterations.
    fn saturate<N: Analysis<Schedule>>(
        &self,
        analysis: N,
        term: RecExpr<Schedule>,
        rules: &[Rewrite<Schedule, N>],
        nodes: usize,
    ) -> Runner<Schedule, N> {
        let (clock, _) = quanta::Clock::mock();
        let start = Instant::now();
        let time_limit = self.time_limit;
        quanta::with_clock(&clock, || {
            Runner::new(analysis)
                .with_expr(&term)
                .with_node_limit(nodes)
                .with_iter_limit(self.iters)
                .with_hook(move |_| match time_limit {
                    Some(limit) if start.elapsed() > limit => Err("time-limit".into()),
                    _ => Ok(()),
                })
                .run(rules)
        })
    }

    fn rules() -> Vec<Rewrite<Schedule, ScheduleAnalysis>> {
        let mut rules = slicing::rules();
        rules.extend(regroup::rules());
        rules
    }
}

/// One replica to refine: its plan, its timer and its input cost.
struct Job {
    replica: ReplicaId,
    plan: ReplicaPlan,
    timer: Rc<RefCell<PackTimer>>,
    cost_before: f64,
}

/// What saturating one replica gave.
struct Outcome {
    cost_after: f64,
    /// The refined plan, when it is cheaper than the input.
    plan: Option<ReplicaPlan>,
    nodes: usize,
    classes: usize,
    iterations: usize,
    stop: String,
}

/// Totals over the replicas, for the statistics.
#[derive(Default)]
struct Totals {
    optimized: usize,
    improved: usize,
    nodes: usize,
    classes: usize,
    iterations: usize,
    applied: IndexMap<String, usize>,
    stops: IndexMap<String, usize>,
}

impl Eqsat {
    /// Saturates one replica and extracts its cheapest schedule.
    fn optimize(&self, ir: &StepIr, job: &Job, grain: u32, totals: &mut Totals) -> Outcome {
        let Job {
            replica,
            plan,
            timer,
            cost_before,
        } = job;
        let (replica, cost_before) = (*replica, *cost_before);
        let caps = [Direction::Forward, Direction::Backward].map(|direction| {
            ir.packs_on(replica, direction)
                .iter()
                .map(|&p| ir.pack(p).cap.map_or(u64::MAX, u64::from))
                .max()
                .unwrap_or(u64::MAX)
        });
        let knobs = Knobs {
            grain,
            fanout: self.fanout,
        };
        let facts = Rc::new(plan.facts(ir, caps, knobs, &mut timer.borrow_mut()));
        let focus = facts
            .kept_seconds
            .each_ref()
            .map(|seconds| ReplicaPlan::focus(seconds, self.focus));
        let analysis = ScheduleAnalysis {
            facts: Rc::clone(&facts),
            timer: Rc::clone(timer),
        };
        let rules = Eqsat::rules();
        let runner = self.saturate(analysis, plan.term(&focus), &rules, self.nodes);
        for rule in &rules {
            let count: usize = runner
                .iterations
                .iter()
                .filter_map(|i| i.applied.get(&rule.name))
                .sum();
            *totals.applied.entry(rule.name.to_string()).or_default() += count;
        }
        let input_max = facts
            .kept_seconds
            .each_ref()
            .map(|seconds| seconds.iter().copied().fold(0.0, f64::max));
        let sequences = extract::sequences(&runner.egraph, runner.roots[0]);
        let candidates =
            extract::candidate_sequences(&runner.egraph, sequences, input_max, timer, &facts);
        let (candidate, cost_after) = cheapest_combination(ir, plan, &candidates, timer);
        let cheaper = cost_after < cost_before * (1.0 - 1e-9);
        Outcome {
            cost_after: if cheaper { cost_after } else { cost_before },
            plan: (cheaper && candidate != *plan).then_some(candidate),
            nodes: runner.egraph.total_size(),
            classes: runner.egraph.number_of_classes(),
            iterations: runner.iterations.len(),
            stop: stop_reason(runner.stop_reason.as_ref()),
        }
    }
}

/// The pair of a forward and a backward candidate (extracted terms, or the input's own
/// packs) whose refined plan has the least 1F1B makespan: a cut made in one direction is a cut
/// in the other too, which that direction's extraction did not pay for, and the makespan sees
/// how the two directions' packs meet in the pipeline, which no per-direction cost does.
fn cheapest_combination(
    ir: &StepIr,
    input: &ReplicaPlan,
    candidates: &[Vec<RecExpr<Schedule>>; 2],
    timer: &RefCell<PackTimer>,
) -> (ReplicaPlan, f64) {
    let lengths: Vec<u32> = input.samples.iter().map(|&s| ir.sample(s).len).collect();
    let decoded = |d: usize| {
        let mut packs: Vec<Vec<Vec<Span>>> = candidates[d]
            .iter()
            .map(|term| input.decode_sequence(d, term))
            .collect();
        packs.push(
            input
                .packs([Direction::Forward, Direction::Backward][d])
                .to_vec(),
        );
        packs
    };
    let (forwards, backwards) = (decoded(0), decoded(1));
    let mut best: Option<(ReplicaPlan, f64)> = None;
    for forward in &forwards {
        for backward in &backwards {
            let plan = ReplicaPlan {
                samples: input.samples.clone(),
                forward: forward.clone(),
                backward: backward.clone(),
            };
            let refined = rebuild::refine(&plan, &lengths);
            let cost =
                makespan::makespan(&mut timer.borrow_mut(), &refined.forward, &refined.backward);
            if best.as_ref().is_none_or(|(_, least)| cost < *least) {
                best = Some((refined, cost));
            }
        }
    }
    best.expect("the input is a candidate")
}

fn stop_reason(reason: Option<&StopReason>) -> String {
    match reason {
        Some(StopReason::Saturated) => "saturated".into(),
        Some(StopReason::IterationLimit(_)) => "iteration-limit".into(),
        Some(StopReason::NodeLimit(_)) => "node-limit".into(),
        Some(StopReason::TimeLimit(_)) => "time-limit".into(),
        Some(StopReason::Other(reason)) => reason.clone(),
        None => "not-run".into(),
    }
}

/// The default grain: a sixteenth of the largest slice, rounded down to a power of two.
fn default_grain(ir: &StepIr) -> u32 {
    let largest = ir
        .all_slices()
        .iter()
        .map(|&s| ir.slice(s).len)
        .max()
        .unwrap_or(1);
    let sixteenth = (largest / 16).max(1);
    1 << (31 - sixteenth.leading_zeros())
}

impl Pass for Eqsat {
    fn info(&self) -> &'static PassInfo {
        &INFO
    }

    fn run(&mut self, ir: &mut StepIr, cx: &PassContext) -> Result<Statistics> {
        let start = Instant::now();
        let mut ranks = if self.ranks {
            placement::merge_ranks(self, ir, cx.machine())
        } else {
            placement::RankOutcome::default()
        };
        let ranks_ms = start.elapsed().as_secs_f64() * 1e3;
        let mut totals = Totals::default();
        for (rule, count) in &ranks.applied {
            *totals.applied.entry(rule.clone()).or_default() += count;
        }
        let ranks_changed = ranks.ir.is_some();
        if let Some(rebuilt) = ranks.ir.take() {
            *ir = rebuilt;
        }
        let model = cx.machine();
        let grain = self.grain.unwrap_or_else(|| default_grain(ir));
        // Every replica with packs, its plan, timer and input cost; slowest first. Replicas
        // without a CP exchange share one timer (and its memo tables).
        let mut jobs: Vec<Job> = Vec::new();
        let mut shared: Option<Rc<RefCell<PackTimer>>> = None;
        for (replica, plan) in ReplicaPlan::all(ir) {
            let ranks = ir.replica(replica).ranks.clone();
            let own = PackTimer::new(model.clone(), ranks);
            let timer = match &shared {
                Some(timer) if !own.context_parallel() => Rc::clone(timer),
                _ => {
                    let timer = Rc::new(RefCell::new(own));
                    if !timer.borrow().context_parallel() {
                        shared = Some(Rc::clone(&timer));
                    }
                    timer
                }
            };
            let cost_before =
                makespan::makespan(&mut timer.borrow_mut(), &plan.forward, &plan.backward);
            jobs.push(Job {
                replica,
                plan,
                timer,
                cost_before,
            });
        }
        // The step's cost before: rank merging's, or the slowest rank from the makespans the
        // jobs hold (every replica with packs has one).
        let cost_before = if self.ranks {
            ranks.cost_before
        } else {
            let makespans: BTreeMap<ReplicaId, f64> = jobs
                .iter()
                .map(|job| (job.replica, job.cost_before))
                .collect();
            placement::slowest_rank(ir, |_, replica| makespans.get(&replica).copied())
        };
        jobs.sort_by(|a, b| b.cost_before.total_cmp(&a.cost_before));
        let setup_ms = start.elapsed().as_secs_f64() * 1e3;
        let step_before = jobs.first().map_or(0.0, |job| job.cost_before);
        let mut bound: f64 = 0.0;
        let mut plans = BTreeMap::new();
        for job in &jobs {
            if self.scope == Scope::Bottleneck && job.cost_before <= bound {
                // Sorted slowest first: no later replica bounds the step either.
                break;
            }
            let outcome = self.optimize(ir, job, grain, &mut totals);
            totals.optimized += 1;
            totals.nodes += outcome.nodes;
            totals.classes += outcome.classes;
            totals.iterations += outcome.iterations;
            *totals.stops.entry(outcome.stop).or_default() += 1;
            bound = bound.max(outcome.cost_after);
            if let Some(plan) = outcome.plan {
                totals.improved += 1;
                plans.insert(job.replica, plan);
            }
        }
        let step_after = jobs
            .iter()
            .skip(totals.optimized)
            .map(|job| job.cost_before)
            .fold(bound, f64::max);
        let egraph_ms = start.elapsed().as_secs_f64() * 1e3 - setup_ms;
        // The replicas left as they are keep their makespans (the rebuild copies them, and the
        // replica order): only the refined ones are timed again for the step's cost.
        let makespans: BTreeMap<ReplicaId, f64> = jobs
            .iter()
            .filter(|job| !plans.contains_key(&job.replica))
            .map(|job| (job.replica, job.cost_before))
            .collect();
        let known: Vec<Option<f64>> = ir
            .replicas()
            .iter()
            .map(|replica| makespans.get(replica).copied())
            .collect();
        if !plans.is_empty() {
            *ir = rebuild::rebuild(ir, &plans, model);
        }
        let result = if plans.is_empty() && !ranks_changed {
            crate::manager::KEPT_INPUT
        } else {
            "improved"
        };
        // The step's cost as the pass counts it: the slowest rank (replicas it runs, summed).
        let cost_after = if result == "improved" {
            placement::step_seconds_knowing(ir, cx.machine(), &known)
        } else {
            cost_before
        };
        let gain = if cost_before > 0.0 {
            (cost_before - cost_after) / cost_before
        } else {
            0.0
        };
        Ok(Statistics::new()
            .with("replicas_optimized", totals.optimized)
            .with("replicas_improved", totals.improved)
            .with("result", result)
            .with("e_nodes", totals.nodes)
            .with("e_classes", totals.classes)
            .with("iterations", totals.iterations)
            .with(
                "rule_applications",
                serde_json::to_value(&totals.applied).unwrap_or_default(),
            )
            .with(
                "stop_reasons",
                serde_json::to_value(&totals.stops).unwrap_or_default(),
            )
            .with(
                "rank_merge",
                serde_json::json!({
                    "pairs_optimized": ranks.pairs_optimized,
                    "pairs_improved": ranks.pairs_improved,
                    "merged_samples_before": ranks.merged_before,
                    "merged_samples_after": ranks.merged_after,
                    "rank_cost_before_s": ranks.cost_before,
                    "rank_cost_after_s": ranks.cost_after,
                    "e_nodes": ranks.nodes,
                    "e_classes": ranks.classes,
                    "iterations": ranks.iterations,
                    "stop_reasons": ranks.stops,
                    "ms": ranks_ms,
                }),
            )
            .with("grain", grain)
            .with("replica_cost_before_s", step_before)
            .with("replica_cost_after_s", step_after)
            .with("cost_before_s", cost_before)
            .with("cost_after_s", cost_after)
            .with("gain", gain)
            .with("setup_ms", setup_ms)
            .with("egraph_ms", egraph_ms)
            .with("ms", start.elapsed().as_secs_f64() * 1e3))
    }
}
