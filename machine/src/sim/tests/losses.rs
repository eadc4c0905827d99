//! Where the step goes, by hand: a 2-stage pipeline's idle, a padded pack, a recomputed pack
//! (see the `losses` definitions in `metrics.rs`).

use crate::cost::{causal_pairs, CostModel, OpKind};
use slimpack_ir::spec::Recompute;
use slimpack_ir::step::Direction;

use super::super::fixture::one_f_one_b;
use super::super::{Losses, Metrics};
use super::{assert_close, checked_run, plain, run, spec, unequal_replicas};

use Direction::{Backward, Forward};

/// The saturated rate of `op`: the analytic curve's ceiling.
fn saturated(cost: &CostModel, op: OpKind) -> f64 {
    let rate = cost.throughput().saturated_rate(op);
    let curve = cost.throughput().curve(op).unwrap();
    assert_eq!(
        rate,
        cost.spec().cluster.gpu.peak_flops * curve.max_efficiency
    );
    rate
}

fn assert_sums_to_step(m: &Metrics) {
    assert_close(m.losses.total_s(), m.step_time_s, "losses vs step");
}

#[test]
fn two_stage_pipeline_idle_by_hand() {
    // One pack of 4096 tokens through two stages: stage 1 waits for the forward (warm-up),
    // stage 0 waits for the backward to come back (warm-up: before its first backward), and
    // stage 1 idles after its DP tail while stage 0 finishes (drain). Each wait ends with the
    // pipeline send in flight (exposed PP).
    let (_, cost, result) = run(
        spec("llama-7b", "h100-sxm", "tp=8,pp=2,dp=1"),
        &plain(&[vec![vec![4096]]]),
    );
    let m = &result.metrics;
    let time = |stage, direction| {
        cost.pack_time_on(stage, &[(4096, 0)], direction, &[0])
            .critical_path_s()
    };
    let (f0, f1, b0, b1) = (
        time(0, Forward),
        time(1, Forward),
        time(0, Backward),
        time(1, Backward),
    );
    let layout = &result.layout;
    let (dev0, dev1) = (
        layout.first_device(layout.group(0, 0)),
        layout.first_device(layout.group(0, 1)),
    );
    let (send_f, send_b) = (
        cost.send_time(4096, dev0, dev1),
        cost.send_time(4096, dev1, dev0),
    );
    assert!(send_f > 0.0 && send_b > 0.0);
    // One replica: the DP collectives are empty, each stage's tail is its optimizer step.
    let (o0, o1) = (cost.optimizer_time(0), cost.optimizer_time(1));
    let stage1_done = f0 + send_f + f1 + b1;
    let step = stage1_done + send_b + b0 + o0;
    assert_close(m.step_time_s, step, "step");
    let l = &m.losses;
    // Stage 0 waits f1 + b1 (+ the forward send) before its backward; stage 1 waits f0.
    assert_close(
        l.pipeline_idle_warmup_s,
        (send_f + f1 + b1 + f0) / 2.0,
        "warm-up",
    );
    assert_close(l.exposed_pp_s, (send_f + send_b) / 2.0, "exposed pp");
    assert_eq!(l.pipeline_idle_steady_s, 0.0);
    // Stage 1's (empty) reduce-scatter waits for its communication stream, busy with the
    // backward's send; its optimizer follows; it then idles until stage 0's backward and
    // optimizer end.
    assert_close(l.dp_sync_optimizer_s, (o0 + send_b + o1) / 2.0, "DP tail");
    assert_close(l.pipeline_idle_drain_s, (b0 + o0 - o1) / 2.0, "drain");
    assert_eq!(l.dp_imbalance_wait_s, 0.0);
    let compute = (f0 + f1 + b0 + b1) / 2.0;
    let parts = l.useful_compute_s
        + l.below_saturation_s
        + l.memory_bound_s
        + l.launch_overhead_s
        + l.exposed_tp_s
        + l.exposed_cp_s;
    assert_close(parts, compute, "compute parts");
    assert!(l.memory_bound_s > 0.0 && l.launch_overhead_s > 0.0 && l.exposed_tp_s > 0.0);
    assert_sums_to_step(m);
}

#[test]
fn two_stage_one_f_one_b_has_steady_idle_only_when_a_stage_is_slower() {
    // Four packs, 1F1B: stage 0 alternates F and B after one warm-up forward; the last stage
    // (with the output layer) is slower, so stage 0 waits for each backward in its steady state.
    let (_, _, result) = run(
        spec("llama-7b", "h100-sxm", "tp=8,pp=2,dp=1"),
        &plain(&[vec![vec![4096]; 4]]),
    );
    let m = &result.metrics;
    assert!(m.losses.pipeline_idle_steady_s > 0.0, "{:?}", m.losses);
    assert!(m.losses.pipeline_idle_warmup_s > 0.0);
    assert!(m.losses.pipeline_idle_drain_s > 0.0);
    assert_sums_to_step(m);
}

#[test]
fn dp_imbalance_wait_is_the_light_replica_waiting() {
    let (cost, result, long, short) = unequal_replicas();
    let l = &result.metrics.losses;
    assert_close(
        l.dp_imbalance_wait_s,
        (long - short) / 2.0,
        "imbalance wait",
    );
    let sync = cost.dp_sync(0, &[0, 1]);
    assert_close(
        l.dp_sync_optimizer_s,
        sync.total_s() + cost.optimizer_time(0),
        "DP tail",
    );
    assert_sums_to_step(&result.metrics);
}

#[test]
fn padded_pack_is_mostly_padding_and_useful_efficiency_is_below_one_percent() {
    // One 1000-token document padded to 131,072 tokens, as the `padding` strategy does.
    let mut ir = one_f_one_b(
        spec("llama-7b", "h100-sxm", "tp=8,pp=1,dp=1"),
        &plain(&[vec![vec![1000]]]),
    );
    let replica = ir.replicas()[0];
    for direction in [Forward, Backward] {
        for pack in ir.packs_on(replica, direction) {
            ir.set_padding(pack, 131_072);
        }
    }
    let (_, cost, result) = checked_run(ir);
    let m = &result.metrics;
    // Per device (8 TP ranks), at the saturated rates: the document's forward and backward
    // (GEMMs 1x + 2x, attention 1x + 2.5x), and the pad's 130,072 tokens after 1000.
    let (gemm_f, gemm_b) = (
        saturated(&cost, OpKind::GemmForward),
        saturated(&cost, OpKind::GemmBackward),
    );
    let (attention_f, attention_b) = (
        saturated(&cost, OpKind::AttentionForward),
        saturated(&cost, OpKind::AttentionBackward),
    );
    let seconds = |len: u64, prefix: u64| {
        let linear = (32.0 * 2.0 * 202_375_168.0 + 2.0 * 4096.0 * 32000.0) * len as f64;
        let attention = 32.0 * 16384.0 * causal_pairs(len, prefix) as f64;
        (linear / gemm_f
            + 2.0 * linear / gemm_b
            + attention / attention_f
            + 2.5 * attention / attention_b)
            / 8.0
    };
    let l = &m.losses;
    let recompute = cost.spec().model.recompute;
    assert_eq!(recompute, Recompute::None, "the preset recomputes nothing");
    assert_close(l.useful_compute_s, seconds(1000, 0), "useful");
    assert_close(l.padding_s, seconds(130_072, 1000), "padding");
    assert_close(
        m.useful_ideal_step_time_s,
        seconds(1000, 0),
        "useful ideal (one group)",
    );
    assert_close(
        m.ideal_step_time_s,
        seconds(1000, 0) + seconds(130_072, 1000),
        "executed ideal",
    );
    assert!(m.efficiency < 0.01, "useful efficiency {}", m.efficiency);
    assert!(m.executed_efficiency > 0.5, "{}", m.executed_efficiency);
    assert!(l.padding_s > 0.5 * m.step_time_s);
    assert_sums_to_step(m);
}

#[test]
fn recomputed_pack_splits_off_the_replayed_forward() {
    let run_with = |recompute| {
        let mut spec = spec("llama-7b", "h100-sxm", "tp=1,pp=1,dp=1");
        spec.model.recompute = recompute;
        run(spec, &plain(&[vec![vec![4096]]]))
    };
    let (_, _, plain_run) = run_with(Recompute::None);
    let (_, cost, full) = run_with(Recompute::Full);
    let (l, none) = (&full.metrics.losses, &plain_run.metrics.losses);
    // Full recomputation re-runs each layer's forward (not the output layer) in the backward,
    // at the forward rates.
    let linear = 32.0 * 2.0 * 202_375_168.0 * 4096.0;
    let attention = 32.0 * 16384.0 * causal_pairs(4096, 0) as f64;
    let replay = linear / saturated(&cost, OpKind::GemmForward)
        + attention / saturated(&cost, OpKind::AttentionForward);
    assert_close(l.recompute_s, replay, "recompute");
    assert_eq!(none.recompute_s, 0.0);
    // The useful work does not change with the recompute mode; the executed ideal does.
    assert_close(l.useful_compute_s, none.useful_compute_s, "useful");
    assert_close(
        full.metrics.useful_ideal_step_time_s,
        plain_run.metrics.useful_ideal_step_time_s,
        "useful ideal",
    );
    assert_close(
        full.metrics.ideal_step_time_s,
        full.metrics.useful_ideal_step_time_s + replay,
        "executed ideal",
    );
    assert!(full.metrics.efficiency < full.metrics.executed_efficiency);
    assert!(full.metrics.efficiency < plain_run.metrics.efficiency);
    // The floor knows nothing of recomputation.
    assert_close(
        full.metrics.floor_step_time_s,
        plain_run.metrics.floor_step_time_s,
        "floor",
    );
    assert_sums_to_step(&full.metrics);
}

#[test]
fn floor_of_one_pack_on_one_device_by_hand() {
    // One device, one pack: the floor is the useful ideal, the pack's memory-bound kernels,
    // and the optimizer step (no TP collectives, no DP peers).
    let (_, cost, result) = run(
        spec("llama-7b", "h100-sxm", "tp=1,pp=1,dp=1"),
        &plain(&[vec![vec![4096]]]),
    );
    let m = &result.metrics;
    let elementwise = cost.pack_time(0, &[(4096, 0)], Forward, 1).elementwise_s
        + cost.pack_time(0, &[(4096, 0)], Backward, 1).elementwise_s;
    assert_close(
        m.floor_step_time_s,
        m.useful_ideal_step_time_s + elementwise + cost.optimizer_time(0),
        "floor",
    );
    assert!(m.schedule_efficiency < 1.0 && m.schedule_efficiency > m.efficiency);
    let l: &Losses = &m.losses;
    assert_close(l.memory_bound_s, elementwise, "memory bound");
    assert_eq!(l.exposed_tp_s, 0.0);
    assert_sums_to_step(m);
}

#[test]
fn calibrated_kernels_never_beat_the_saturated_rates() {
    // The shipped CPU calibration measures rates that peak below its largest size; the
    // saturated rate is the best measured point, so no loss turns negative.
    let ir = one_f_one_b(
        spec("tiny", "cpu", "tp=1,pp=2,dp=2"),
        &plain(&[vec![vec![64], vec![3000]], vec![vec![700, 90]]]),
    );
    slimpack_ir::verify::verify(&ir).unwrap();
    let cost = crate::machine_model(&ir.spec);
    assert!(cost.throughput().is_calibrated(OpKind::GemmForward));
    let result = super::super::simulate(&ir, &cost).unwrap();
    let m = &result.metrics;
    for (what, seconds) in m.losses.entries() {
        assert!(seconds >= 0.0, "{what}: {seconds}");
    }
    assert!(m.losses.below_saturation_s > 0.0);
    assert!(m.efficiency <= m.schedule_efficiency && m.schedule_efficiency <= 1.0);
    assert_sums_to_step(m);
}

#[test]
fn a_stage_of_its_own_recomputation_is_priced_and_sized_as_that_mode() {
    // Two stages under recompute=full; stage 1 alone switched to none. Stage 1's tasks take
    // the times of a none model, stage 0's stay full's; stage 1's device peak grows by what
    // its forwards keep more, stage 0's does not move; the recompute loss shrinks.
    let mut full = spec("llama-7b", "h100-sxm", "tp=8,pp=2,dp=1");
    full.model.recompute = Recompute::Full;
    let mut none = full.clone();
    none.model.recompute = Recompute::None;
    let plans = plain(&[vec![vec![8192], vec![4096], vec![8192]]]);
    let (_, cost, uniform) = run(full.clone(), &plans);
    let mut ir = one_f_one_b(full, &plans);
    ir.set_stage_recompute(1, Some(Recompute::None));
    assert_eq!(ir.stage_recompute(0), Recompute::Full);
    assert_eq!(ir.stage_recompute(1), Recompute::None);
    let (_, _, mixed) = checked_run(ir);
    let none_cost = CostModel::new(&none);
    for (task, span) in mixed.tasks() {
        let Some(pack) = task.pack else { continue };
        if !matches!(task.kind, super::super::TaskKind::Backward) {
            continue;
        }
        let tokens = mixed.pack(pack).tokens;
        let model = if task.stage == 1 { &none_cost } else { &cost };
        let expected = model
            .pack_time_on(task.stage, &[(tokens, 0)], Backward, &[0])
            .critical_path_s();
        assert_close(span.end_s - span.start_s, expected, "backward time");
    }
    let peak = |result: &super::super::SimResult, stage: u32| {
        result.memory[result.layout.group(0, stage).index()].peak_bytes
    };
    assert_eq!(peak(&mixed, 0), peak(&uniform, 0));
    assert!(peak(&mixed, 1) > peak(&uniform, 1));
    assert!(mixed.metrics.losses.recompute_s < uniform.metrics.losses.recompute_s);
    assert_sums_to_step(&mixed.metrics);
}
