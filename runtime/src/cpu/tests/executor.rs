//! The executor on hand-written scheduled IR: pipelines, idle ranks, a DP rank in a plain
//! replica and a DP-Merge group at once, asymmetric packs — loss, gradients and the weights
//! after AdamW against the reference; orders that would deadlock are refused.

use slimpack_ir::spec::ModelSpec;

use super::sliced::TOLERANCE;
use crate::cpu::exec::{check_reference, execute, DeviceOrder, Plan};
use crate::cpu::{AdamWConfig, CpuError, ModelConfig, Params};

const HEADER: &str = r#"
  model name="tiny" layers=4 hidden=128 heads=4 kv_heads=2 head_dim=32 ffn=352 vocab=512 dtype=fp32 recompute=none tied_embeddings=true
  gpu name="cpu-2core" peak_flops=192000000000 hbm_bytes=25769803776 hbm_bandwidth=20000000000
  cluster name="cpu" gpus_per_node=2 intra_bandwidth=10000000000 intra_latency=0.000002 inter_bandwidth=1000000000 inter_latency=0.00005
"#;

/// Two stages, DP 2: rank 0 in a plain replica and in a DP-Merge group with rank 1.
const MERGED: &str = r#"
  parallel tp=1 pp=2 dp=2
  batch source="test" context=80 documents=4 documents_cut=0
  %st0 = stage layers=0..2
  %st1 = stage layers=2..4
  %r0 = replica dp=[0]
  %r1 = replica dp=[1]
  %r2 = replica dp=[0, 1]
  %d0 = sample len=10 doc=0 piece=0 on %r0
    %d0.0 = slice 0..6
    %d0.1 = slice 6..10
  %d1 = sample len=4 doc=1 piece=0 on %r0
    %d1.0 = slice 0..4
  %d2 = sample len=3 doc=2 piece=0 on %r1
    %d2.0 = slice 0..3
  %d3 = sample len=75 doc=3 piece=0 on %r2
    %d3.0 = slice 0..40
    %d3.1 = slice 40..75
  %f0 = pack fwd on %r0 [%d0.0]
  %f1 = pack fwd on %r0 [%d0.1, %d1.0]
  %b0 = pack bwd on %r0 [%d0.1]
  %b1 = pack bwd on %r0 [%d1.0, %d0.0]
  %f2 = pack fwd on %r1 [%d2.0]
  %b2 = pack bwd on %r1 [%d2.0]
  %f3 = pack fwd on %r2 [%d3.0]
  %f4 = pack fwd on %r2 [%d3.1]
  %b3 = pack bwd on %r2 [%d3.1]
  %b4 = pack bwd on %r2 [%d3.0]
  schedule %r0 %st0 [%f0, %f1, %b0, %b1]
  schedule %r0 %st1 [%f0, %f1, %b0, %b1]
  schedule %r1 %st0 [%f2, %b2]
  schedule %r1 %st1 [%f2, %b2]
  schedule %r2 %st0 [%f3, %f4, %b3, %b4]
  schedule %r2 %st1 [%f3, %f4, %b3, %b4]
"#;

/// Two stages, DP 2 with rank 1 idle; asymmetric packs in 1F1B order.
const ASYMMETRIC: &str = r#"
  parallel tp=1 pp=2 dp=2
  batch source="test" context=64 documents=2 documents_cut=0
  %st0 = stage layers=0..2
  %st1 = stage layers=2..4
  %r0 = replica dp=[0]
  %d0 = sample len=30 doc=0 piece=0 on %r0
    %d0.0 = slice 0..10
    %d0.1 = slice 10..20
    %d0.2 = slice 20..30
  %d1 = sample len=8 doc=1 piece=0 on %r0
    %d1.0 = slice 0..8
  %f0 = pack fwd on %r0 [%d0.0, %d1.0]
  %f1 = pack fwd on %r0 [%d0.1]
  %f2 = pack fwd on %r0 [%d0.2]
  %b0 = pack bwd on %r0 [%d0.2, %d0.1]
  %b1 = pack bwd on %r0 [%d0.0, %d1.0]
  schedule %r0 %st0 [%f0, %f1, %f2, %b0, %b1]
  schedule %r0 %st1 [%f0, %f1, %f2, %b0, %b1]
"#;

/// Two stages, a DP-Merge group of both ranks; symmetric packs padded to 48 tokens (padding
/// shorter than the group, longer than a query block, and none).
const PADDED: &str = r#"
  parallel tp=1 pp=2 dp=2
  batch source="test" context=48 documents=3 documents_cut=0
  %st0 = stage layers=0..2
  %st1 = stage layers=2..4
  %r0 = replica dp=[0]
  %r1 = replica dp=[0, 1]
  %d0 = sample len=47 doc=0 piece=0 on %r0
    %d0.0 = slice 0..47
  %d1 = sample len=48 doc=1 piece=0 on %r1
    %d1.0 = slice 0..48
  %d2 = sample len=3 doc=2 piece=0 on %r1
    %d2.0 = slice 0..3
  %f0 = pack fwd on %r0 pad=48 [%d0.0]
  %b0 = pack bwd on %r0 pad=48 [%d0.0]
  %f1 = pack fwd on %r1 pad=48 [%d1.0]
  %f2 = pack fwd on %r1 pad=48 [%d2.0]
  %b1 = pack bwd on %r1 pad=48 [%d1.0]
  %b2 = pack bwd on %r1 pad=48 [%d2.0]
  schedule %r0 %st0 [%f0, %b0]
  schedule %r0 %st1 [%f0, %b0]
  schedule %r1 %st0 [%f1, %f2, %b1, %b2]
  schedule %r1 %st1 [%f1, %b1, %f2, %b2]
"#;

fn ir(body: &str) -> slimpack_ir::StepIr {
    let text = format!("step phase=scheduled {{{HEADER}{body}}}\n");
    slimpack_ir::text::parse(&text, "test").expect("test IR parses")
}

fn tiny() -> ModelConfig {
    ModelConfig::from_spec(&ModelSpec::preset("tiny").unwrap()).unwrap()
}

fn check(body: &str, order: impl Fn(&Plan) -> DeviceOrder) {
    let config = tiny();
    let plan = Plan::new(&ir(body), &config).unwrap();
    let batch = plan.synthetic_batch(&config, 3).unwrap();
    let params = Params::init(&config, 9);
    let adamw = AdamWConfig::default();
    let execution = execute(&plan, &order(&plan), &batch, &params, adamw).unwrap();
    let check = check_reference(&execution, &params, &batch, adamw).unwrap();
    assert!(check.loss_rel_err <= f64::from(TOLERANCE), "{check:?}");
    assert!(check.max_grad_rel_err <= TOLERANCE, "{check:?}");
    // A weight whose gradient is zero up to rounding may move by up to lr either way.
    assert!(check.max_param_diff_lr <= 2.0 + 1e-3, "{check:?}");
    assert_eq!(execution.workers.len(), plan.devices().len());
    let tasks: usize = (0..plan.devices().len())
        .map(|d| order(&plan).tasks(d).len())
        .sum();
    assert_eq!(execution.tasks.len(), tasks);
}

#[test]
fn a_rank_in_a_plain_replica_and_a_merged_group_matches_the_reference() {
    check(MERGED, DeviceOrder::replica_major);
    // The merged group first on rank 0, the plain replica after: another valid interleaving.
    check(MERGED, |plan| {
        DeviceOrder::by_start_times(plan, |pack, _| {
            Some(if plan.packs[pack].replica == 2 {
                0.0
            } else {
                1.0
            })
        })
        .unwrap()
    });
}

#[test]
fn padded_packs_compute_their_padding_and_match_the_reference() {
    check(PADDED, DeviceOrder::replica_major);
    let config = tiny();
    let plan = Plan::new(&ir(PADDED), &config).unwrap();
    let paddings: Vec<usize> = plan.packs.iter().map(|p| p.padding).collect();
    assert_eq!(paddings, [1, 1, 0, 45, 0, 45]);
}

#[test]
fn asymmetric_packs_over_two_stages_with_an_idle_rank_match_the_reference() {
    check(ASYMMETRIC, DeviceOrder::replica_major);
}

#[test]
fn an_interleaving_that_deadlocks_is_refused() {
    let config = tiny();
    let plan = Plan::new(&ir(MERGED), &config).unwrap();
    // The merged group's packs first on stage 0 but last on stage 1: its backward on stage 0
    // waits for its backward on stage 1, behind rank 0's plain packs there, whose forwards on
    // stage 0 are behind the group's backward.
    let error = DeviceOrder::by_start_times(&plan, |pack, stage| {
        let merged = plan.packs[pack].replica == 2;
        Some(match (merged, stage) {
            (true, 0) => 0.0,
            (true, _) => 2.0,
            (false, _) => 1.0,
        })
    });
    match error {
        Err(CpuError::Schedule { message }) => assert!(message.contains("deadlock"), "{message}"),
        other => panic!("expected a deadlock, got {other:?}"),
    }
}
