//! Steps small enough to compute by hand from the cost model's per-task figures.

use crate::cost::causal_pairs;
use slimpack_ir::batch::Sample;
use slimpack_ir::spec::Spec;
use slimpack_ir::step::{BatchInfo, Direction, Pack, Part, Phase, StepIr};

use super::super::fixture::{defer_weight_grads, schedule_gpipe, ReplicaPlan};
use super::super::{compute_bound, simulate, TaskKind};
use super::{assert_close, checked_run, plain, run, spec, unequal_replicas};
use crate::MachineError;

use Direction::{Backward, Forward};

#[test]
fn one_slice_on_one_device() {
    let (_, cost, result) = run(
        spec("llama-7b", "h100-sxm", "tp=1,pp=1,dp=1"),
        &plain(&[vec![vec![4096]]]),
    );
    let m = &result.metrics;
    let forward = cost.pack_time_on(0, &[(4096, 0)], Forward, &[0]);
    let backward = cost.pack_time_on(0, &[(4096, 0)], Backward, &[0]);
    // One replica: the DP collectives are empty; the optimizer follows the backward.
    assert_eq!(cost.dp_sync(0, &[0]).total_s(), 0.0);
    let step = forward.critical_path_s() + backward.critical_path_s() + cost.optimizer_time(0);
    assert_close(m.step_time_s, step, "step");
    assert_close(m.busy_per_device_s[0], step, "busy");
    assert!(m.bubble_fraction.abs() < 1e-12, "{}", m.bubble_fraction);
    assert_eq!((m.dp_imbalance, m.pp_imbalance), (1.0, 1.0));
    assert_close(m.tokens_per_s, 4096.0 / step, "tokens/s");
    let peak = 989.4e12;
    assert_close(m.mfu, cost.model_flops(4096, 0) / (peak * step), "mfu");

    // Ideal: forward GEMMs (32 layers of 2 · 202,375,168 FLOPs per token, plus the output
    // projection's 2 · 4096 · 32000) at 75% of peak, three times over (forward + 2x backward);
    // attention (16,384 FLOPs per causal pair per layer) at 65% forward and 2.5x at 58%.
    let tokens = 4096.0;
    let linear = (32.0 * 2.0 * 202_375_168.0 + 2.0 * 4096.0 * 32000.0) * tokens;
    let attention = 32.0 * 16384.0 * causal_pairs(4096, 0) as f64;
    let ideal =
        3.0 * linear / (0.75 * peak) + attention / (0.65 * peak) + 2.5 * attention / (0.58 * peak);
    assert!(
        (m.ideal_step_time_s / ideal - 1.0).abs() < 1e-5,
        "{} vs {ideal}",
        m.ideal_step_time_s
    );
    assert_close(
        m.executed_efficiency,
        m.ideal_step_time_s / m.step_time_s,
        "executed efficiency",
    );
    // Nothing recomputed, nothing padded: the useful ideal is the executed one.
    assert_close(
        m.useful_ideal_step_time_s,
        m.ideal_step_time_s,
        "useful ideal",
    );
    assert_close(m.efficiency, m.executed_efficiency, "efficiency");
    assert!(m.efficiency < 1.0);

    // Memory: model states + workspace, then the sample's activations and K/V, plus the larger
    // of the two tasks' temporaries. 6.74B parameters at 18 bytes do not fit in 80 GiB.
    let memory = cost.memory();
    let baseline = memory.model_state_bytes(0) + memory.workspace_bytes();
    let kept = memory.activation_bytes(4096, 0) + memory.kv_bytes(4096, 0);
    let temporary = memory
        .temporary_bytes(4096, 0, Forward)
        .max(memory.temporary_bytes(4096, 0, Backward));
    assert_eq!(m.peak_memory_bytes, baseline + kept + temporary);
    assert_eq!(m.peak_memory_per_device, vec![baseline + kept + temporary]);
    assert_eq!(result.memory[0].final_bytes, baseline);
    assert!(m.oom);
    assert_eq!(m.oom_device, Some(0));
}

/// A cluster whose links, HBM and output layer cost (almost) nothing, so that only the
/// layers' GEMMs and attention take time and every stage does the same work.
fn frictionless(parallel: &str) -> Spec {
    let mut spec = spec("llama-7b", "h100-sxm", parallel);
    spec.model.vocab = 8;
    spec.cluster.gpu.hbm_bandwidth = 1e30;
    for link in [&mut spec.cluster.intra_node, &mut spec.cluster.inter_node] {
        link.bandwidth = 1e30;
        link.latency = 0.0;
    }
    spec
}

#[test]
fn two_stage_pipeline_bubble_is_pp_minus_one_over_m_plus_pp_minus_one() {
    for micro_batches in [1usize, 4, 8] {
        let packs = vec![vec![4096]; micro_batches];
        let (_, _, result) = run(frictionless("tp=1,pp=2,dp=1"), &plain(&[packs]));
        let m = &result.metrics;
        let expected = 1.0 / (micro_batches as f64 + 1.0);
        // Left over: the 7 extra kernel launches (3 µs each) of the last stage's head.
        assert!(
            (m.bubble_fraction - expected).abs() < 2e-3,
            "m={micro_batches}: bubble {} vs {expected}",
            m.bubble_fraction
        );
        assert!((m.pp_imbalance - 1.0).abs() < 2e-3, "{}", m.pp_imbalance);
    }
}

/// The compute bound counts the pipeline fill: on 4 stages one pack's forward reaches the
/// last stage after its forwards on the three before it, so that stage's group runs its
/// forward and backward no earlier (its busy time alone is a quarter of the step).
#[test]
fn compute_bound_waits_for_the_fill_of_the_last_stage() {
    let spec = frictionless("tp=1,pp=4,dp=1");
    let (ir, cost, result) = run(spec, &plain(&[vec![vec![4096]]]));
    let time = |stage: u32, direction| {
        cost.pack_time_on(stage, &[(4096, 0)], direction, &[0])
            .critical_path_s()
    };
    let fill: f64 = (0..3).map(|stage| time(stage, Forward)).sum();
    let last = time(3, Forward) + time(3, Backward);
    let bound = compute_bound(&ir, &cost).unwrap();
    assert!(
        bound >= (fill + last) * (1.0 - 1e-9),
        "bound {bound} s, fill {fill} s + last stage {last} s"
    );
    assert!(
        bound <= result.metrics.step_time_s,
        "{bound} vs {:?}",
        result.metrics.step_time_s
    );
}

/// Zero bubble on 4 equal stages: with every weight gradient W deferred to the end of its
/// stage, the pipeline's critical path carries only forwards and input gradients, so the
/// 1F1B step `(m + pp − 1)(F + B + W)` becomes `(m + pp − 1)(F + B) + m·W` on the first
/// stage: the drain shrinks by `(pp − 1)·W`.
#[test]
fn deferred_weight_gradients_shrink_the_drain_by_pp_minus_one_weight_gradients() {
    let micro_batches = 6;
    let spec = frictionless("tp=1,pp=4,dp=1");
    let packs = vec![vec![4096]; micro_batches];
    let (ir, cost, fused) = run(spec, &plain(&[packs]));
    let mut split = ir.clone();
    let replica = split.replicas()[0];
    defer_weight_grads(&mut split, replica);
    let (_, _, zero_bubble) = checked_run(split);
    let weight_s = cost
        .pack_part_time_on(0, &[(4096, 0)], Backward, Part::WeightGrad, &[0])
        .critical_path_s();
    let input_s = cost
        .pack_part_time_on(0, &[(4096, 0)], Backward, Part::InputGrad, &[0])
        .critical_path_s();
    let whole_s = cost
        .pack_time_on(0, &[(4096, 0)], Backward, &[0])
        .critical_path_s();
    // tp = 1: no TP collective to expose, so the parts add up to the backward.
    assert_close(input_s + weight_s, whole_s, "B + W");
    let saved = fused.metrics.step_time_s - zero_bubble.metrics.step_time_s;
    // Left over: the first and last stages' extra kernel launches (3 µs each).
    assert!(
        (saved - 3.0 * weight_s).abs() < 1e-3 * fused.metrics.step_time_s,
        "saved {saved} s, expected 3 W = {} s",
        3.0 * weight_s
    );
    let (before, after) = (&fused.metrics.losses, &zero_bubble.metrics.losses);
    assert!(after.pipeline_idle_drain_s < before.pipeline_idle_drain_s);
    // The same work in both: only the idle time changes.
    assert_close(
        after.useful_compute_s,
        before.useful_compute_s,
        "useful compute",
    );
    let weight_grads = zero_bubble
        .graph
        .tasks
        .iter()
        .filter(|task| task.kind == TaskKind::WeightGrad)
        .count();
    assert_eq!(weight_grads, 4 * micro_batches);
}

#[test]
fn dp_imbalance_is_max_over_mean_replica_compute() {
    let (cost, result, long, short) = unequal_replicas();
    let m = &result.metrics;
    assert_close(m.dp_imbalance, 2.0 * long / (long + short), "dp imbalance");
    // The gradient reduce-scatter waits for the slower replica. Both replicas of the stage sit
    // in one node: 1/2 of 4-byte gradients of all 6,738,415,616 parameters at 450 GB/s + 5 µs.
    let sync = cost.dp_sync(0, &[0, 1]);
    let params = 6_738_415_616.0;
    assert_close(
        sync.grad_reduce_scatter_s,
        0.5 * 4.0 * params / 450e9 + 5e-6,
        "reduce-scatter",
    );
    let step = long + sync.grad_reduce_scatter_s + cost.optimizer_time(0) + sync.param_all_gather_s;
    assert_close(m.step_time_s, step, "step");
    let busy = |rank: usize| [long, short][rank] + cost.optimizer_time(0);
    assert_close(m.busy_per_device_s[0], busy(0), "busy 0");
    assert_close(m.busy_per_device_s[1], busy(1), "busy 1");
    let idle = 2.0 * step - busy(0) - busy(1);
    assert_close(m.bubble_fraction, idle / (2.0 * step), "bubble");
}

#[test]
fn cp_merged_pair_shares_streams_with_plain_replicas() {
    let replicas = [
        ReplicaPlan {
            ranks: vec![0, 1],
            packs: vec![vec![32768]],
        },
        ReplicaPlan {
            ranks: vec![0],
            packs: vec![vec![2048]],
        },
        ReplicaPlan {
            ranks: vec![1],
            packs: vec![vec![1024]],
        },
    ];
    let (_, cost, result) = run(spec("llama-7b", "h100-sxm", "tp=8,pp=1,dp=2"), &replicas);
    let time =
        |len: u64, direction, ranks: &[u32]| cost.pack_time_on(0, &[(len, 0)], direction, ranks);
    let (merged_f, merged_b) = (
        time(32768, Forward, &[0, 1]),
        time(32768, Backward, &[0, 1]),
    );
    assert!(merged_f.cp_comm_s > 0.0);
    let (a_f, a_b) = (
        time(2048, Forward, &[0]).critical_path_s(),
        time(2048, Backward, &[0]).critical_path_s(),
    );
    let (c_f, c_b) = (
        time(1024, Forward, &[1]).critical_path_s(),
        time(1024, Backward, &[1]).critical_path_s(),
    );

    // Each rank runs its replicas one after the other in IR order, as the lowered program
    // does: the merged pair's forward and backward on both groups, then each plain replica's
    // forward and backward; then the DP sync.
    let sync = cost.dp_sync(0, &[0, 1]);
    let step = merged_f.critical_path_s()
        + merged_b.critical_path_s()
        + (a_f + a_b).max(c_f + c_b)
        + sync.grad_reduce_scatter_s
        + cost.optimizer_time(0)
        + sync.param_all_gather_s;
    assert_close(result.metrics.step_time_s, step, "step");
    let merged_forward = result
        .tasks()
        .find(|(task, _)| task.kind == TaskKind::Forward && task.replica == Some(0))
        .unwrap();
    assert_eq!(result.task_groups(merged_forward.0).len(), 2);
    assert_eq!(merged_forward.0.cp_exchange_s, merged_f.cp_comm_s);

    // Each device of the merged pair holds half of the long sample, and frees it before its
    // own replica's forward.
    let memory = cost.memory();
    let kept = |tokens: u64| memory.activation_bytes(tokens, 0) + memory.kv_bytes(tokens, 0);
    let temp = |tokens: u64, direction| memory.temporary_bytes(tokens, 0, direction);
    let merged = kept(16384);
    let baseline = memory.model_state_bytes(0) + memory.workspace_bytes();
    for (group, own) in [(0usize, 2048u64), (1, 1024)] {
        let plain = kept(own);
        let expected = baseline
            + [
                merged + temp(16384, Forward),
                merged + temp(16384, Backward),
                plain + temp(own, Forward),
                plain + temp(own, Backward),
            ]
            .into_iter()
            .max()
            .unwrap();
        assert_eq!(result.memory[group].peak_bytes, expected, "group {group}");
        assert_eq!(result.memory[group].final_bytes, baseline);
    }
}

/// One sample of 8192 tokens cut into two slices; forward packs {slice 0}, {slice 1};
/// backward packs {slice 1}, {slice 0}; GPipe order on one device group.
fn sliced_sample() -> StepIr {
    let mut ir = StepIr::new(
        spec("llama-7b", "h100-sxm", "tp=8,pp=1,dp=1"),
        BatchInfo::default(),
    );
    let sample = ir.add_sample(Sample {
        len: 8192,
        doc: 0,
        piece: 0,
    });
    let slices = ir.set_slices(sample, &[4096, 4096]);
    let replica = ir.add_replica(vec![0]);
    ir.place_sample(sample, replica);
    ir.advance(Phase::Assigned);
    let pack = |direction| Pack {
        direction,
        cap: None,
    };
    ir.add_pack(pack(Forward), replica, &slices[..1]);
    ir.add_pack(pack(Forward), replica, &slices[1..]);
    ir.add_pack(pack(Backward), replica, &slices[1..]);
    ir.add_pack(pack(Backward), replica, &slices[..1]);
    ir.advance(Phase::Packed);
    schedule_gpipe(&mut ir, replica);
    ir.advance(Phase::Scheduled);
    ir
}

#[test]
fn sliced_sample_keeps_kv_and_accumulates_kv_gradients() {
    let (_, cost, result) = checked_run(sliced_sample());
    let memory = cost.memory();
    let base = memory.model_state_bytes(0) + memory.workspace_bytes();
    let (activations, kv) = (memory.activation_bytes(4096, 0), memory.kv_bytes(4096, 0));
    let kv_grad = memory.kv_grad_bytes(4096, 0);
    let (temp_f, temp_b) = (
        memory.temporary_bytes(4096, 0, Forward),
        memory.temporary_bytes(4096, 0, Backward),
    );
    let slice = activations + kv;
    // F slice 0; F slice 1 (slice 0's K/V still held); B slice 1 allocates slice 0's dK/dV
    // accumulator and frees slice 1; B slice 0 frees the rest.
    let expected = [
        base + slice + temp_f,
        base + slice,
        base + 2 * slice + temp_f,
        base + 2 * slice,
        base + 2 * slice + kv_grad + temp_b,
        base + slice + kv_grad,
        base + slice + kv_grad + temp_b,
        base,
    ];
    let timeline: Vec<u64> = result.memory[0].timeline.iter().map(|p| p.bytes).collect();
    assert_eq!(timeline, expected);
    assert_eq!(
        result.metrics.peak_memory_bytes,
        base + 2 * slice + kv_grad + temp_b
    );
    // The continuation slice's attention costs more than the first slice's.
    let compute: Vec<f64> = result
        .tasks()
        .filter(|(task, _)| task.kind == TaskKind::Forward)
        .map(|(_, span)| span.duration_s())
        .collect();
    assert!(compute[1] > compute[0], "{compute:?}");
}

#[test]
fn unscheduled_ir_is_an_error_naming_the_phase() {
    let mut ir = sliced_sample();
    let cost = crate::cost::CostModel::new(&ir.spec);
    assert!(simulate(&ir, &cost).is_ok());
    ir = StepIr::new(ir.spec.clone(), BatchInfo::default());
    ir.advance(Phase::Packed);
    let error = simulate(&ir, &cost).unwrap_err();
    assert!(matches!(
        error,
        MachineError::NotScheduled {
            phase: Phase::Packed
        }
    ));
    let message = error.to_string();
    assert!(message.contains("phase 'packed'"), "{message}");
    assert!(!message.contains('\n'));
}

#[test]
fn cost_model_of_another_spec_is_an_error() {
    let ir = sliced_sample();
    let other = crate::cost::CostModel::new(&spec("llama-13b", "h100-sxm", "tp=8,pp=1,dp=1"));
    let message = simulate(&ir, &other).unwrap_err().to_string();
    assert!(
        message.contains("llama-13b") && message.contains("llama-7b"),
        "{message}"
    );
}

#[test]
fn cyclic_schedule_is_a_deadlock_error() {
    let mut ir = super::super::fixture::one_f_one_b(
        spec("llama-7b", "h100-sxm", "tp=8,pp=2,dp=1"),
        &plain(&[vec![vec![1024]]]),
    );
    let replica = ir.replicas()[0];
    let (forward, backward) = (
        ir.packs_on(replica, Forward)[0],
        ir.packs_on(replica, Backward)[0],
    );
    // On the last stage the backward is listed before the forward it depends on.
    ir.set_schedule(replica, 1, &[backward, forward]);
    assert!(slimpack_ir::verify::verify(&ir).is_err());
    let cost = crate::cost::CostModel::new(&ir.spec);
    let error = simulate(&ir, &cost).unwrap_err();
    let message = error.to_string();
    assert!(message.starts_with("the schedule deadlocks: "), "{message}");
    assert!(matches!(error, MachineError::Deadlock { unfinished, .. } if unfinished > 0));
}
