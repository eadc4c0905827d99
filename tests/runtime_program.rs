//! The CPU runtime executes a step's lowered program: every worker runs its op list, driven
//! through the runtime's C ABI by the interpreter or by the program compiled to native code
//! (MLIR → LLVM IR → JIT, features `mlir` and `llvm`). On small schedules — a DP-Merge group
//! beside plain replicas over two stages and two DP ranks, and every strategy's step — the
//! interpreted program equals the unsliced reference (loss and every gradient within 1e-5),
//! also when read back from its schedule JSON, and the compiled driver runs the same trace to
//! bitwise the same loss, gradients and weights. `run --schedule` and `--driver` are checked
//! through the binary.

mod common;

use slimpack::codegen::schedule_json;
use slimpack::ir::batch::Batch;
use slimpack::ir::program::abi::abi_call;
use slimpack::ir::program::Program;
use slimpack::ir::spec::ModelSpec;
use slimpack::ir::{Spec, StepIr};
use slimpack::machine::sim;
use slimpack::runtime::abi::Call;
use slimpack::runtime::cpu::exec::{
    check_reference, execute_program, DeviceOrder, Driver, Execution, Plan,
};
use slimpack::runtime::cpu::{AdamWConfig, ModelConfig, Params};
use slimpack::tune::autotune;
use slimpack::tune::strategy::{Choices, StrategyState, STRATEGIES};
use slimpack::{compile, CompileOptions};

const TOLERANCE: f32 = 1e-5;

/// `tiny`'s structure (grouped-query attention, tied embeddings, fp32) at test width.
fn spec() -> Spec {
    let mut spec = Spec::from_presets("tiny", "cpu", "tp=1,pp=2,dp=2").unwrap();
    spec.model = ModelSpec {
        hidden: 32,
        heads: 4,
        kv_heads: 2,
        head_dim: 8,
        ffn: 64,
        vocab: 64,
        ..spec.model
    };
    spec.validate().unwrap();
    spec
}

/// One dominant sample among short ones: DP-Merge merges both ranks for it.
fn dominant() -> Batch {
    Batch::from_lengths(
        &[480, 20, 12, 30, 9, 64, 3, 40, 100, 7],
        Some(512),
        "runtime program test",
    )
}

/// The steps checked: a DP-Merge pipeline, then every strategy's step, on pp=2, dp=2.
fn steps() -> Vec<(String, StepIr)> {
    let spec = spec();
    let pipeline =
        "assign-dp,dp-merge{threshold=0.5},slice{size=64},pack-fwd{cap=128},pack-bwd{cap=128},schedule-pipeline";
    let options = CompileOptions {
        pipeline: pipeline.to_string(),
        ..CompileOptions::default()
    };
    let compiled = compile(&spec, &dominant(), &options, &mut std::io::sink()).unwrap();
    let ir = compiled.ir;
    assert!(
        ir.replicas().iter().any(|&r| ir.replica(r).is_merged()),
        "{pipeline} merges DP ranks"
    );
    let mut steps = vec![(pipeline.to_string(), ir)];
    for strategy in STRATEGIES {
        if strategy.not_applicable(&spec).is_some() {
            continue; // hybrid-cp needs pp=1, as in Megatron-Core
        }
        let choices = Choices::fixed(spec.model.recompute);
        let mut state = StrategyState::default();
        let (_, choice) =
            autotune::compile_step(strategy, &spec, &dominant(), &mut state, &choices).unwrap();
        steps.push((strategy.name.to_string(), choice.compiled.ir));
    }
    steps
}

/// The program `run` executes by default: replicas interleaved by simulated start times.
fn simulated_program(ir: &StepIr, plan: &Plan) -> Program {
    let simulated = sim::simulate(ir, &slimpack::machine::machine_model(&ir.spec)).unwrap();
    let starts = slimpack::measure::task_start_times(&simulated);
    DeviceOrder::by_start_times(plan, |pack, stage| starts.get(&(pack, stage)).copied())
        .unwrap()
        .program(plan)
        .unwrap()
}

fn run(plan: &Plan, program: &Program, driver: &Driver) -> (Execution, Params) {
    let config = ModelConfig::from_spec(&spec().model).unwrap();
    let batch = plan.synthetic_batch(&config, 5).unwrap();
    let params = Params::init(&config, 11);
    let execution = execute_program(
        plan,
        program,
        driver,
        &batch,
        &params,
        AdamWConfig::default(),
    )
    .unwrap();
    let check = check_reference(&execution, &params, &batch, AdamWConfig::default()).unwrap();
    assert!(
        check.loss_rel_err <= f64::from(TOLERANCE) && check.max_grad_rel_err <= TOLERANCE,
        "{check:?}"
    );
    (execution, params)
}

/// The calls a worker's ops stand for, per worker.
fn program_calls(program: &Program) -> Vec<Vec<Call>> {
    program
        .workers
        .iter()
        .map(|w| {
            let (dp, pp) = (i64::from(w.worker.dp), i64::from(w.worker.pp));
            w.ops.iter().map(|op| abi_call(dp, pp, op)).collect()
        })
        .collect()
}

#[test]
fn interpreted_programs_equal_the_reference_also_read_back_from_schedule_json() {
    let config = ModelConfig::from_spec(&spec().model).unwrap();
    for (name, ir) in steps() {
        let plan = Plan::new(&ir, &config).unwrap();
        let lowered = slimpack::ir::program::lower(&ir);
        let simulated = simulated_program(&ir, &plan);
        for program in [&lowered, &simulated] {
            let (execution, _) = run(&plan, program, &Driver::Interpreted);
            assert_eq!(execution.trace, program_calls(program), "{name}");
        }
        let json = serde_json::to_string(&schedule_json::document(&ir, None).unwrap()).unwrap();
        let read = schedule_json::to_ir(&schedule_json::parse(&json).unwrap()).unwrap();
        let read_plan = Plan::new(&read, &config).unwrap();
        assert_eq!(read_plan.lowered, lowered, "{name}: the JSON's program");
        run(&read_plan, &read_plan.lowered, &Driver::Interpreted);
    }
}

#[cfg(all(feature = "mlir", feature = "llvm"))]
#[test]
fn compiled_and_interpreted_drivers_run_the_same_trace_to_bitwise_the_same_step() {
    use slimpack::codegen::llvm::driver::with_run_device;
    use slimpack::codegen::mlir::emit_llvm_ir;
    use slimpack::runtime::abi;
    use slimpack::runtime::cpu::exec::CompiledDriver;

    let config = ModelConfig::from_spec(&spec().model).unwrap();
    for (name, ir) in steps() {
        let plan = Plan::new(&ir, &config).unwrap();
        let program = simulated_program(&ir, &plan);
        let (interpreted, _) = run(&plan, &program, &Driver::Interpreted);
        let llvm_ir = emit_llvm_ir(&program).unwrap();
        let (compiled, _) = with_run_device(&llvm_ir, &abi::symbols(), |entry| {
            // SAFETY: the JIT keeps the entry point alive while the closure runs.
            let driver = Driver::Compiled(unsafe { CompiledDriver::new(entry) });
            run(&plan, &program, &driver)
        })
        .unwrap();
        assert_eq!(compiled.trace, interpreted.trace, "{name}: traces differ");
        assert_eq!(compiled.trace_hash(), interpreted.trace_hash());
        assert_eq!(
            compiled.loss.to_bits(),
            interpreted.loss.to_bits(),
            "{name}: loss"
        );
        assert!(compiled.grads == interpreted.grads, "{name}: gradients");
        assert!(compiled.params == interpreted.params, "{name}: weights");
        // A driver compiled from another order of the same step strays from this program.
        if program != plan.lowered {
            let other = emit_llvm_ir(&plan.lowered).unwrap();
            let batch = plan.synthetic_batch(&config, 5).unwrap();
            let params = Params::init(&config, 11);
            let error = with_run_device(&other, &abi::symbols(), |entry| {
                // SAFETY: as above.
                let driver = Driver::Compiled(unsafe { CompiledDriver::new(entry) });
                execute_program(
                    &plan,
                    &program,
                    &driver,
                    &batch,
                    &params,
                    AdamWConfig::default(),
                )
            })
            .unwrap()
            .unwrap_err();
            assert!(
                error.to_string().contains("the driver called"),
                "{name}: {error}"
            );
        }
    }
}

/// `run --schedule` on a schedule JSON `compile --emit json` wrote, with each driver.
#[test]
fn run_executes_a_schedule_json_with_either_driver() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("merge.json");
    let path = path.to_str().unwrap();
    let compiled = common::slimpack(&[
        "compile",
        "--model",
        "tiny",
        "--cluster",
        "cpu",
        "--parallel",
        "tp=1,pp=2,dp=2",
        "--synthetic",
        "lognormal:median=12,sigma=1.5,count=8,seed=3",
        "--context",
        "128",
        "--passes",
        "assign-dp,dp-merge{threshold=0.5},slice{size=32},pack-fwd{cap=64},pack-bwd{cap=64},schedule-pipeline",
        "--emit",
        "json",
        "-o",
        path,
    ]);
    assert!(
        compiled.status.success(),
        "{}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    let document: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let merged = document["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["dp_ranks"].as_array().unwrap().len() > 1);
    assert!(merged, "the schedule has a DP-Merge group");
    let run = |driver: &str| {
        common::slimpack(&[
            "run",
            "--backend",
            "cpu",
            "--schedule",
            path,
            "--driver",
            driver,
            "--check-reference",
            "--report",
            "json",
        ])
    };
    let interpreted = run("interpreted");
    assert!(
        interpreted.status.success(),
        "{}",
        String::from_utf8_lossy(&interpreted.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&interpreted.stdout).unwrap();
    assert!(
        report["max_grad_rel_err"].as_f64().unwrap() <= 1e-5,
        "{report}"
    );
    assert_eq!(report["driver"], "interpreted");
    assert!(report["trace_ops"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(report["trace_hash"].as_str().unwrap().len(), 16, "{report}");
    let compiled = run("compiled");
    if cfg!(all(feature = "mlir", feature = "llvm")) {
        let stderr = String::from_utf8_lossy(&compiled.stderr);
        assert!(compiled.status.success(), "{stderr}");
        let other: serde_json::Value = serde_json::from_slice(&compiled.stdout).unwrap();
        assert_eq!(other["driver"], "compiled");
        for key in ["trace_hash", "trace_ops", "loss", "max_grad_rel_err"] {
            assert_eq!(other[key], report[key], "{key}");
        }
    } else {
        assert_eq!(compiled.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&compiled.stderr);
        assert!(
            stderr.contains("--driver compiled: not available"),
            "{stderr}"
        );
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    }
}
