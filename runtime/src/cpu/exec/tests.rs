//! The executor runs programs: its trace is the program, the replica-major order is the lowered
//! program itself, and a driver or a program that does not fit the step fails it with an error.

use slimpack_ir::program::Op;
use slimpack_ir::spec::ModelSpec;
use slimpack_ir::step::Part;

use super::{execute_program, CompiledDriver, DeviceOrder, Driver, Execution, Plan};
use crate::abi::Call;
use crate::cpu::{AdamWConfig, CpuError, ModelConfig, Params};

/// Two stages, DP 2: rank 0 in a plain replica and in a DP-Merge group with rank 1.
const STEP: &str = r#"step phase=scheduled {
  model name="tiny" layers=2 hidden=32 heads=4 kv_heads=2 head_dim=8 ffn=64 vocab=64 dtype=fp32 recompute=none tied_embeddings=true
  gpu name="cpu-2core" peak_flops=192000000000 hbm_bytes=25769803776 hbm_bandwidth=20000000000
  cluster name="cpu" gpus_per_node=2 intra_bandwidth=10000000000 intra_latency=0.000002 inter_bandwidth=1000000000 inter_latency=0.00005
  parallel tp=1 pp=2 dp=2
  batch source="test" context=40 documents=3 documents_cut=0
  %st0 = stage layers=0..1
  %st1 = stage layers=1..2
  %r0 = replica dp=[0]
  %r1 = replica dp=[0, 1]
  %d0 = sample len=10 doc=0 piece=0 on %r0
    %d0.0 = slice 0..6
    %d0.1 = slice 6..10
  %d1 = sample len=37 doc=1 piece=0 on %r1
    %d1.0 = slice 0..20
    %d1.1 = slice 20..37
  %f0 = pack fwd on %r0 [%d0.0]
  %f1 = pack fwd on %r0 [%d0.1]
  %b0 = pack bwd on %r0 [%d0.1, %d0.0]
  %f2 = pack fwd on %r1 [%d1.0]
  %f3 = pack fwd on %r1 [%d1.1]
  %b1 = pack bwd on %r1 [%d1.1]
  %b2 = pack bwd on %r1 [%d1.0]
  schedule %r0 %st0 [%f0, %f1, %b0]
  schedule %r0 %st1 [%f0, %f1, %b0]
  schedule %r1 %st0 [%f2, %f3, %b1, %b2]
  schedule %r1 %st1 [%f2, %f3, %b1, %b2]
}
"#;

fn plan() -> Plan {
    let ir = slimpack_ir::text::parse(STEP, "test").expect("test IR parses");
    Plan::new(&ir, &config()).unwrap()
}

fn config() -> ModelConfig {
    let spec = ModelSpec {
        layers: 2,
        hidden: 32,
        heads: 4,
        kv_heads: 2,
        head_dim: 8,
        ffn: 64,
        vocab: 64,
        ..ModelSpec::preset("tiny").unwrap()
    };
    ModelConfig::from_spec(&spec).unwrap()
}

fn run(
    plan: &Plan,
    program: &slimpack_ir::program::Program,
    driver: &Driver,
) -> Result<Execution, CpuError> {
    let batch = plan.synthetic_batch(&config(), 1).unwrap();
    let params = Params::init(&config(), 2);
    execute_program(
        plan,
        program,
        driver,
        &batch,
        &params,
        AdamWConfig::default(),
    )
}

#[test]
fn the_replica_major_order_is_the_lowered_program_and_the_trace_is_the_program() {
    let plan = plan();
    let program = DeviceOrder::replica_major(&plan).program(&plan).unwrap();
    assert_eq!(program, plan.lowered);
    let execution = run(&plan, &program, &Driver::Interpreted).unwrap();
    for (worker, calls) in program.workers.iter().zip(&execution.trace) {
        let (dp, pp) = (i64::from(worker.worker.dp), i64::from(worker.worker.pp));
        let expected: Vec<Call> = worker
            .ops
            .iter()
            .map(|op| slimpack_ir::program::abi::abi_call(dp, pp, op))
            .collect();
        assert_eq!(*calls, expected, "worker {:?}", worker.worker);
    }
    let exchanges = execution
        .trace
        .iter()
        .flatten()
        .filter(|call| call.function == &slimpack_ir::program::abi::CP_EXCHANGE)
        .count();
    assert_eq!(
        exchanges, 16,
        "4 packs of the group on 2 stages and 2 ranks"
    );
    assert_eq!(execution.tasks.len(), 2 * 3 + 2 * 2 * 4);
}

#[test]
fn another_interleaving_runs_another_trace_to_the_same_result() {
    let plan = plan();
    let group_first = DeviceOrder::by_start_times(&plan, |pack, _| {
        Some(if plan.packs[pack].replica == 1 {
            0.0
        } else {
            1.0
        })
    })
    .unwrap();
    let program = group_first.program(&plan).unwrap();
    assert_ne!(program, plan.lowered);
    let replica_major = run(&plan, &plan.lowered, &Driver::Interpreted).unwrap();
    let interleaved = run(&plan, &program, &Driver::Interpreted).unwrap();
    assert_ne!(replica_major.trace_hash(), interleaved.trace_hash());
    assert!((replica_major.loss - interleaved.loss).abs() <= 1e-6 * replica_major.loss.abs());
}

extern "C" fn stray_driver(index: i64) {
    // Every worker runs pack 3's forward first, whatever its program says.
    crate::abi::slimpack_rt_forward(index % 2, index / 2, 3);
}

extern "C" fn idle_driver(_index: i64) {}

#[test]
fn a_driver_that_strays_from_the_program_fails_the_step() {
    let plan = plan();
    // SAFETY: plain Rust functions, callable from any thread for the whole test.
    let stray = Driver::Compiled(unsafe { CompiledDriver::new(stray_driver) });
    let message = run(&plan, &plan.lowered, &stray).unwrap_err().to_string();
    assert!(message.contains("the driver called"), "{message}");
    let idle = Driver::Compiled(unsafe { CompiledDriver::new(idle_driver) });
    let message = run(&plan, &plan.lowered, &idle).unwrap_err().to_string();
    assert!(message.contains("the driver ran 0 of"), "{message}");
}

#[test]
fn a_program_of_another_step_or_out_of_order_is_refused() {
    let plan = plan();
    let mut other = plan.lowered.clone();
    other.packs[1].slices[0].end -= 1;
    let message = run(&plan, &other, &Driver::Interpreted)
        .unwrap_err()
        .to_string();
    assert!(message.contains("does not fit the step"), "{message}");
    // LayerRange 0's rank 0 computes its first backward before receiving its input.
    let mut swapped = plan.lowered.clone();
    let ops = &mut swapped.workers[0].ops;
    let bwd = ops
        .iter()
        .position(|op| matches!(op, Op::Backward { .. }))
        .unwrap();
    ops.swap(bwd - 1, bwd);
    let message = run(&plan, &swapped, &Driver::Interpreted)
        .unwrap_err()
        .to_string();
    assert!(message.contains("before receiving its input"), "{message}");
}

/// A zero-bubble schedule (every backward split, weight gradients deferred, the DP-Merge
/// group's too) runs to the same loss and the same gradients, bit for bit: each weight still
/// receives one weight-gradient GEMM per pack, in the stage's backward order. Its deferred
/// weight gradients are tasks of their own.
#[test]
fn split_backwards_run_to_the_same_step() {
    let split = STEP
        .replace(
            "schedule %r0 %st0 [%f0, %f1, %b0]",
            "schedule %r0 %st0 [%f0, %f1, %b0.dx, %b0.dw]",
        )
        .replace(
            "schedule %r1 %st0 [%f2, %f3, %b1, %b2]",
            "schedule %r1 %st0 [%f2, %f3, %b1.dx, %b2.dx, %b1.dw, %b2.dw]",
        )
        .replace(
            "schedule %r1 %st1 [%f2, %f3, %b1, %b2]",
            "schedule %r1 %st1 [%f2, %f3, %b1.dx, %b1.dw, %b2.dx, %b2.dw]",
        );
    let ir = slimpack_ir::text::parse(&split, "test").expect("test IR parses");
    assert!(ir.has_split_backwards());
    let split_plan = Plan::new(&ir, &config()).unwrap();
    let whole_plan = plan();
    let whole = run(&whole_plan, &whole_plan.lowered, &Driver::Interpreted).unwrap();
    let program = DeviceOrder::replica_major(&split_plan)
        .program(&split_plan)
        .unwrap();
    assert_eq!(program, split_plan.lowered);
    let split = run(&split_plan, &program, &Driver::Interpreted).unwrap();
    assert_eq!(split.loss, whole.loss);
    assert_eq!(split.grads, whole.grads);
    assert_eq!(split.params, whole.params);
    // Ranks 0 and 1 run %b1 and %b2 split on stage 0 and 1, rank 0 %b0 on stage 0: ten
    // weight-gradient tasks.
    let weight_grads = split.tasks.iter().filter(|t| t.weight_grad).count();
    assert_eq!(weight_grads, 2 * 2 * 2 + 1);
    assert_eq!(split.tasks.len(), whole.tasks.len() + weight_grads);
}

/// A weight gradient that runs before its input gradient fails the step in one line.
#[test]
fn a_weight_gradient_before_its_input_gradient_fails() {
    let split = STEP.replace(
        "schedule %r0 %st0 [%f0, %f1, %b0]",
        "schedule %r0 %st0 [%f0, %f1, %b0.dx, %b0.dw]",
    );
    let ir = slimpack_ir::text::parse(&split, "test").expect("test IR parses");
    let plan = Plan::new(&ir, &config()).unwrap();
    let mut swapped = plan.lowered.clone();
    let ops = &mut swapped.workers[0].ops;
    let input = ops
        .iter()
        .position(|op| {
            matches!(
                op,
                Op::Backward {
                    part: Part::InputGrad,
                    ..
                }
            )
        })
        .unwrap();
    let weight = ops.remove(input + 1);
    ops.insert(input, weight);
    let message = run(&plan, &swapped, &Driver::Interpreted)
        .unwrap_err()
        .to_string();
    assert!(message.contains(".dw before"), "{message}");
}
