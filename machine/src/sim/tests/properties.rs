//! Properties over random batches and layouts: whole-sample 1F1B steps with plain and
//! DP-merged replicas, and sliced samples with asymmetric forward/backward packs in GPipe
//! order.

use proptest::prelude::*;
use slimpack_ir::batch::Sample;
use slimpack_ir::step::{BatchInfo, Direction, Pack, Phase, SliceId, StepIr};

use super::super::fixture::{defer_weight_grads, one_f_one_b, schedule_gpipe, ReplicaPlan};
use super::super::{compute_bound, schedule_bound, PeakProbe, SimResult, Stream};
use super::{checked_run, spec};
use crate::cost::CostModel;
use slimpack_ir::spec::Recompute;

/// A layout and a batch: per DP rank its packs of sample lengths, and maybe a merged group.
#[derive(Debug, Clone)]
struct Case {
    tp: u32,
    pp: u32,
    ranks: Vec<Vec<Vec<u32>>>,
    merged: Option<u32>,
}

fn case() -> impl Strategy<Value = Case> {
    let pack = prop::collection::vec(1u32..16_384, 1..=3);
    let rank = prop::collection::vec(pack, 1..=3);
    (
        prop::sample::select(vec![1u32, 2]),
        prop::sample::select(vec![1u32, 2, 4]),
        prop::collection::vec(rank, 1..=3),
        prop::option::of(1u32..65_536),
    )
        .prop_map(|(tp, pp, ranks, merged)| Case {
            tp,
            pp,
            ranks,
            merged,
        })
}

fn whole_sample_step(case: &Case) -> StepIr {
    let dp = case.ranks.len() as u32;
    let spec = spec(
        "llama-7b",
        "h100-sxm",
        &format!("tp={},pp={},dp={dp}", case.tp, case.pp),
    );
    let mut replicas: Vec<ReplicaPlan> = case
        .ranks
        .iter()
        .enumerate()
        .map(|(rank, packs)| ReplicaPlan {
            ranks: vec![rank as u32],
            packs: packs.clone(),
        })
        .collect();
    if let (Some(len), true) = (case.merged, dp >= 2) {
        replicas.push(ReplicaPlan {
            ranks: vec![0, 1],
            packs: vec![vec![len]],
        });
    }
    one_f_one_b(spec, &replicas)
}

/// One replica per DP rank; its samples cut into `cuts + 1` slices; forward packs take the
/// slices in order, `width` at a time; backward packs take them in reverse, `width + 1` at a
/// time (so the two partitions differ); GPipe order.
fn sliced_step(case: &Case, cuts: u32, width: usize) -> StepIr {
    let dp = case.ranks.len() as u32;
    let spec = spec(
        "llama-7b",
        "h100-sxm",
        &format!("tp={},pp={},dp={dp}", case.tp, case.pp),
    );
    let mut ir = StepIr::new(spec, BatchInfo::default());
    let mut per_replica = Vec::new();
    for (rank, packs) in case.ranks.iter().enumerate() {
        let replica = ir.add_replica(vec![rank as u32]);
        let mut slices: Vec<SliceId> = Vec::new();
        for &len in packs.iter().flatten() {
            let sample = ir.add_sample(Sample {
                len,
                doc: 0,
                piece: 0,
            });
            ir.place_sample(sample, replica);
            let pieces = (cuts + 1).min(len);
            let mut lengths = vec![len / pieces; pieces as usize];
            lengths[0] += len % pieces;
            slices.extend(ir.set_slices(sample, &lengths));
        }
        per_replica.push((replica, slices));
    }
    ir.advance(Phase::Assigned);
    for (replica, slices) in &per_replica {
        for chunk in slices.chunks(width) {
            ir.add_pack(pack(Direction::Forward), *replica, chunk);
        }
        let reversed: Vec<SliceId> = slices.iter().rev().copied().collect();
        for chunk in reversed.chunks(width + 1) {
            ir.add_pack(pack(Direction::Backward), *replica, chunk);
        }
    }
    ir.advance(Phase::Packed);
    for (replica, _) in &per_replica {
        schedule_gpipe(&mut ir, *replica);
    }
    ir.advance(Phase::Scheduled);
    ir
}

/// A step of `case`: sliced ([`sliced_step`] with `(cuts, width)`) or of whole samples, with
/// every backward split and its weight gradient deferred where `split`.
fn step(case: &Case, (cuts, width): (u32, usize), sliced: bool, split: bool) -> StepIr {
    let mut ir = match sliced {
        true => sliced_step(case, cuts, width),
        false => whole_sample_step(case),
    };
    if split {
        for replica in ir.replicas().to_vec() {
            defer_weight_grads(&mut ir, replica);
        }
    }
    ir
}

fn pack(direction: Direction) -> Pack {
    Pack {
        direction,
        cap: None,
    }
}

/// Every property, on one simulated step.
fn check(result: &SimResult) -> Result<(), TestCaseError> {
    let m = &result.metrics;
    prop_assert!(
        m.step_time_s >= m.ideal_step_time_s * (1.0 - 1e-9),
        "step {} < ideal {}",
        m.step_time_s,
        m.ideal_step_time_s
    );
    prop_assert!(m.efficiency > 0.0 && m.efficiency <= m.executed_efficiency * (1.0 + 1e-9));
    prop_assert!(m.executed_efficiency <= 1.0 + 1e-9);
    prop_assert!(m.floor_step_time_s >= m.useful_ideal_step_time_s);
    prop_assert!(
        m.schedule_efficiency > 0.0 && m.schedule_efficiency <= 1.0 + 1e-9,
        "floor {} step {}",
        m.floor_step_time_s,
        m.step_time_s
    );

    // The losses cut every device's timeline: they add up to the step, none is negative.
    let total = m.losses.total_s();
    prop_assert!(
        (total - m.step_time_s).abs() <= 1e-9 * m.step_time_s,
        "losses {total} vs step {}",
        m.step_time_s
    );
    for (what, seconds) in m.losses.entries() {
        prop_assert!(seconds >= -1e-12 * m.step_time_s, "{what}: {seconds}");
    }
    prop_assert_eq!(m.losses.recompute_s, 0.0);
    prop_assert_eq!(m.losses.padding_s, 0.0);
    let idle: f64 = m
        .busy_per_device_s
        .iter()
        .map(|busy| m.step_time_s - busy)
        .sum::<f64>()
        / m.busy_per_device_s.len() as f64;
    let losses = &m.losses;
    let waiting = losses.exposed_pp_s
        + losses.pipeline_idle_warmup_s
        + losses.pipeline_idle_steady_s
        + losses.pipeline_idle_drain_s
        + losses.dp_imbalance_wait_s
        + losses.dp_sync_optimizer_s;
    // Idle time is the waiting causes less the optimizer step, which the DP tail includes.
    prop_assert!(
        waiting >= idle * (1.0 - 1e-9) - 1e-12,
        "waiting {waiting} idle {idle}"
    );
    prop_assert!((0.0..1.0).contains(&m.bubble_fraction));
    prop_assert!(m.dp_imbalance >= 1.0 - 1e-12 && m.pp_imbalance >= 1.0 - 1e-12);

    // Busy time of a device = the durations of the compute tasks on its group.
    let layout = &result.layout;
    let mut busy = vec![0.0f64; layout.groups()];
    let mut spans: Vec<Vec<(f64, f64)>> = vec![Vec::new(); 2 * layout.groups()];
    for (task, span) in result.tasks() {
        for group in result.task_groups(task) {
            let stream = match task.kind.stream() {
                Stream::Compute => {
                    busy[group.index()] += task.duration_s;
                    0
                }
                Stream::Comm => 1,
            };
            spans[2 * group.index() + stream].push((span.start_s, span.end_s));
        }
    }
    for (device, &device_busy) in m.busy_per_device_s.iter().enumerate() {
        let group = layout.group_of_device(device as u64).index();
        prop_assert!((device_busy - busy[group]).abs() <= 1e-9 * busy[group].max(1e-12));
    }

    // A stream runs one task at a time.
    for stream in &mut spans {
        stream.sort_by(|a, b| a.partial_cmp(b).unwrap());
        for pair in stream.windows(2) {
            prop_assert!(pair[1].0 >= pair[0].1, "overlap {:?}", pair);
        }
    }

    // Dependencies are respected.
    for (index, (_, span)) in result.tasks().enumerate() {
        for successor in result.graph.successors(super::super::TaskId(index as u32)) {
            prop_assert!(result.spans[successor.index()].start_s >= span.end_s);
        }
    }

    // Memory never drops below the model states and returns to them.
    for group in &result.memory {
        for point in &group.timeline {
            prop_assert!(point.bytes >= group.baseline_bytes);
            prop_assert!(point.bytes <= group.peak_bytes);
        }
        prop_assert_eq!(group.final_bytes, group.baseline_bytes);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn whole_sample_steps_hold_the_invariants(case in case()) {
        let (_, _, result) = checked_run(whole_sample_step(&case));
        check(&result)?;
    }

    #[test]
    fn sliced_asymmetric_steps_hold_the_invariants(case in case(), cuts in 0u32..4, width in 1usize..4) {
        let (_, _, result) = checked_run(sliced_step(&case, cuts, width));
        check(&result)?;
    }

    /// The same with every backward split and its weight gradient deferred (zero bubble): the
    /// deferred weight gradients' memory is freed, the time still adds up.
    #[test]
    fn split_backward_steps_hold_the_invariants(case in case(), cuts in 0u32..4, width in 1usize..4, sliced: bool) {
        let ir = step(&case, (cuts, width), sliced, true);
        let (_, _, result) = checked_run(ir);
        check(&result)?;
    }

    /// The peak probe (what `assign-recompute` searches with) gives each pipeline device the
    /// peak a full simulation of the step gives it, under any per-device recomputation modes,
    /// stacked without timing, also where a device group runs two replicas (a DP-Merge group
    /// beside its ranks' own replicas, which run one after the other).
    #[test]
    fn the_peak_probe_gives_the_simulated_device_peaks(
        case in case(),
        cuts in 0u32..4,
        width in 1usize..4,
        sliced: bool,
        split: bool,
        levels in prop::collection::vec(0u32..=8, 4),
    ) {
        let mut ir = step(&case, (cuts, width), sliced, split);
        let top = ir.spec.layers_per_chunk();
        let mode = |level: u32| match level {
            0 => Recompute::None,
            level if level >= top => Recompute::Full,
            level => Recompute::Block(level),
        };
        let modes: Vec<Recompute> = (0..case.pp as usize).map(|d| mode(levels[d])).collect();
        let cost = CostModel::new(&ir.spec);
        let probed = {
            let mut probe = PeakProbe::new(&ir, &cost).unwrap();
            // A first set of modes, then the one compared: the probe is reused.
            probe.device_peaks(&vec![Recompute::Full; modes.len()]).unwrap();
            probe.device_peaks(&modes).unwrap()
        };
        for (device, &mode) in modes.iter().enumerate() {
            ir.set_device_recompute(device as u32, Some(mode));
        }
        let (_, _, result) = checked_run(ir);
        let simulated = result.device_peaks();
        prop_assert_eq!(probed, simulated);
    }

    /// The compute bound holds for every schedule the simulator runs, and the schedule bound
    /// for the step's own (1F1B or GPipe, split backwards or whole, with DP-Merge groups
    /// sharing devices with plain replicas), under its recomputation and, as for a pass that
    /// lowers the stages' recomputation later, under none.
    #[test]
    fn the_bounds_are_below_the_simulated_step(
        case in case(),
        cuts in 0u32..4,
        width in 1usize..4,
        sliced: bool,
        split: bool,
        full: bool,
    ) {
        let mut ir = step(&case, (cuts, width), sliced, split);
        if full {
            ir.spec.model.recompute = Recompute::Full;
        }
        let cost = CostModel::new(&ir.spec);
        let none = cost.with_recompute(Recompute::None);
        let bound = compute_bound(&ir, &cost).unwrap();
        let least = compute_bound(&ir, &none).unwrap();
        let scheduled = schedule_bound(&ir, &cost).unwrap();
        let scheduled_least = schedule_bound(&ir, &none).unwrap();
        let (_, _, result) = checked_run(ir);
        let step = result.metrics.step_time_s;
        prop_assert!(bound > 0.0 && bound <= step * (1.0 + 1e-12), "bound {bound} step {step}");
        prop_assert!(least <= bound * (1.0 + 1e-12), "least {least} bound {bound}");
        prop_assert!(
            scheduled > 0.0 && scheduled <= step * (1.0 + 1e-12),
            "schedule bound {scheduled} step {step}"
        );
        prop_assert!(scheduled_least <= scheduled * (1.0 + 1e-12));
    }
}
