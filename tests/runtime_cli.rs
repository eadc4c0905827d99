//! `slimpack run` and `slimpack calibrate` as scripts see them: the JSON report's contract, the
//! reference check through the binary (which installs the counting allocator, so real peak
//! memory is reported), and clear refusals.

mod common;
use common::slimpack;

const STEP: [&str; 12] = [
    "--model",
    "tiny",
    "--cluster",
    "cpu",
    "--parallel",
    "tp=1,pp=2,dp=2",
    "--synthetic",
    "lognormal:median=24,sigma=0.8,count=10,seed=3",
    "--context",
    "64",
    "--passes",
    "assign-dp,slice{size=16},pack-fwd{cap=32},pack-bwd{cap=32},schedule-pipeline",
];

#[test]
fn run_check_reference_reports_json() {
    let mut args = vec!["run", "--backend", "cpu"];
    args.extend(STEP);
    args.extend(["--check-reference", "--report", "json", "--tasks"]);
    let output = slimpack(&args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("one JSON object");
    let number = |key: &str| {
        report[key]
            .as_f64()
            .unwrap_or_else(|| panic!("'{key}' is a number in {report}"))
    };
    let (loss, ref_loss) = (number("loss"), number("ref_loss"));
    assert!(
        (loss - ref_loss).abs() <= 1e-5 * ref_loss,
        "{loss} vs {ref_loss}"
    );
    assert!(number("max_grad_rel_err") <= 1e-5, "{report}");
    assert!(number("step_time_s") > 0.0 && number("predicted_step_time_s") > 0.0);
    // Four workers (2 stages x 2 ranks): real peaks from the counting allocator, at least the
    // weights, gradients and optimizer shard each held from the start.
    let peaks = report["peak_memory_bytes"].as_array().expect("per worker");
    let states = report["model_state_bytes"].as_array().expect("per worker");
    let predicted = report["predicted_peak_memory_bytes"]
        .as_array()
        .expect("per device");
    assert_eq!(
        (peaks.len(), states.len(), predicted.len()),
        (4, 4, 4),
        "{report}"
    );
    for (peak, state) in peaks.iter().zip(states) {
        let (peak, state) = (peak.as_u64().unwrap(), state.as_u64().unwrap());
        assert!(
            state > 0 && peak > state,
            "peak {peak}, model states {state}"
        );
    }
    assert!(
        report["memory_terms"]["model_state_mape"].as_f64().unwrap() < 0.01,
        "{report}"
    );
    let tasks = report["tasks"]
        .as_array()
        .expect("--tasks lists the pack tasks");
    assert!(
        !tasks.is_empty()
            && tasks
                .iter()
                .all(|t| t["measured_s"].as_f64().unwrap() > 0.0)
    );
}

/// What `--backend cuda` must say on a machine without a GPU: which of the three reasons.
fn why_no_gpu() -> &'static [&'static str] {
    match cfg!(feature = "cuda") {
        false => &["has no CUDA backend (built without the `cuda` feature"],
        true => &["no CUDA driver found", "no CUDA device found"],
    }
}

#[test]
fn cuda_commands_without_a_gpu_say_why_in_one_line() {
    if let Ok(gpus) = slimpack::gpu::gpus() {
        eprintln!(
            "skipped: this machine has {} GPU(s); tests/cuda_gpu.rs runs the CUDA backend on them",
            gpus.len()
        );
        return;
    }
    let mut run = vec!["run", "--backend", "cuda"];
    run.extend(STEP);
    run.push("--check-reference");
    let mut run_bf16 = vec!["run", "--backend", "cuda", "--precision", "bf16"];
    run_bf16.extend(STEP);
    let calibrate = vec!["calibrate", "--backend", "cuda", "--tokens", "8,16"];
    let validate = vec!["validate", "--backend", "cuda", "--repeat", "1"];
    for args in [run, run_bf16, calibrate, validate] {
        let output = slimpack(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.starts_with("error: --backend cuda: "), "{stderr}");
        assert!(
            why_no_gpu().iter().any(|why| stderr.contains(why)),
            "{args:?}: {stderr}"
        );
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(output.stdout.is_empty());
    }
}

#[test]
fn run_refuses_bf16_on_the_cpu_backend_and_unknown_precisions() {
    let mut args = vec!["run", "--backend", "cpu", "--precision", "bf16"];
    args.extend(STEP);
    let output = slimpack(&args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "error: --precision bf16: the CPU backend computes in fp32 only; bf16 GEMMs are the CUDA backend's (--backend cuda)"
    );
    assert!(output.stdout.is_empty());
    let mut args = vec!["run", "--backend", "cuda", "--precision", "fp16"];
    args.extend(STEP);
    let output = slimpack(&args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("invalid value 'fp16' for '--precision"),
        "{stderr}"
    );
}

#[test]
fn run_refuses_models_the_cpu_backend_cannot_execute() {
    let output = slimpack(&[
        "run",
        "--backend",
        "cpu",
        "--model",
        "llama-7b",
        "--cluster",
        "cpu",
        "--parallel",
        "dp=1",
        "--synthetic",
        "lognormal:median=24,sigma=0.8,count=2",
        "--passes",
        "assign-dp,pack-symmetric,schedule-pipeline",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("fp32"), "{stderr}");
}

#[test]
fn calibrate_writes_tables_the_cost_model_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("calibration.json");
    let path_text = path.display().to_string();
    let output = slimpack(&[
        "calibrate",
        "--backend",
        "cpu",
        "--tokens",
        "8,16",
        "--min-seconds",
        "0",
        "-o",
        &path_text,
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let calibration =
        slimpack::machine::cost::Calibration::load(&path).expect("a calibration file");
    assert_eq!(calibration.device, "cpu-2core");
    assert_eq!(calibration.tables.len(), 5);
}

/// `validate --backend cpu --repeat 1 --filter FILTER --report json` with `extra` arguments:
/// its JSON report (the command must succeed).
fn validate_report(filter: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "validate",
        "--backend",
        "cpu",
        "--repeat",
        "1",
        "--filter",
        filter,
        "--report",
        "json",
    ];
    args.extend_from_slice(extra);
    let output = slimpack(&args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    serde_json::from_slice(&output.stdout).expect("one JSON object")
}

#[test]
fn validate_predicts_every_workers_peak_memory_within_the_target() {
    let report = validate_report("ln256 slice256", &[]);
    let rows = report["rows"].as_array().expect("rows");
    // pp=1,dp=1 and pp=2,dp=1: three workers. The allocator's counts do not depend on timing.
    assert_eq!(rows.len(), 2, "{report}");
    assert_eq!(report["summary"]["workers"], 3, "{report}");
    for row in rows {
        for error in row["peak_memory_ape"].as_array().expect("per worker") {
            let error = error.as_f64().expect("a number");
            assert!(error <= 0.016, "{}: {error}", row["label"]);
        }
        assert!(row["command"]
            .as_str()
            .unwrap()
            .starts_with("slimpack run "));
    }
}

#[test]
fn validate_refuses_a_filter_that_matches_nothing() {
    let output = slimpack(&[
        "validate",
        "--backend",
        "cpu",
        "--filter",
        "no such schedule",
    ]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--filter matches no schedule"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

#[test]
fn validate_refuses_a_missing_calibration_before_running_anything() {
    let output = slimpack(&[
        "validate",
        "--backend",
        "cpu",
        "--calibration",
        "/nonexistent/gpu.json",
    ]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--calibration /nonexistent/gpu.json"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    // A table of another device: refused before the suite runs, naming both devices.
    let table = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/machine/calibration/h100-sxm-measured.json"
    );
    let output = slimpack(&["validate", "--backend", "cpu", "--calibration", table]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("H100-SXM5-80GB") && stderr.contains("cpu-2core"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

/// A calibration reaches every run of the suite: the shipped CPU table with every rate halved
/// predicts a slower step.
#[test]
fn validate_predicts_with_the_calibration_it_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("cpu.json");
    let shipped: serde_json::Value =
        serde_json::from_str(include_str!("../machine/calibration/cpu.json")).unwrap();
    let mut halved = shipped.clone();
    for points in halved["tables"].as_object_mut().unwrap().values_mut() {
        for point in points.as_array_mut().unwrap() {
            let rate = point["rate"].as_f64().unwrap();
            point["rate"] = serde_json::json!(rate / 2.0);
        }
    }
    std::fs::write(&table, serde_json::to_string(&halved).unwrap()).unwrap();
    let predicted = |extra: &[&str]| {
        let report = validate_report("pp=1,dp=1 ln256 bfd", extra);
        let row = &report["rows"][0];
        (
            row["command"].as_str().unwrap().to_string(),
            row["predicted_step_time_s"].as_f64().unwrap(),
        )
    };
    let (plain, shipped_s) = predicted(&[]);
    let (calibrated, halved_s) = predicted(&["--calibration", table.to_str().unwrap()]);
    assert!(!plain.contains("--calibration"), "{plain}");
    assert!(calibrated.contains("--calibration"), "{calibrated}");
    assert!(
        halved_s > shipped_s * 1.2,
        "{shipped_s} s, halved rates {halved_s} s"
    );
}

/// A step whose shared ranks interleave (`interleave-ranks`) runs them so by default, and its
/// prediction is the interleaved step's; `--interleave replica-major` runs the replicas one
/// after the other and predicts that step, the one compiled without the pass.
#[test]
fn run_predicts_the_order_it_executes() {
    let predicted = |pipeline: &str, interleave: &str| {
        let output = slimpack(&[
            "run",
            "--backend",
            "cpu",
            "--model",
            "tiny",
            "--cluster",
            "cpu",
            "--parallel",
            "tp=1,pp=2,dp=4",
            "--batch",
            "tests/fixtures/dominant.lengths.txt",
            "--context",
            "4096",
            "--passes",
            pipeline,
            "--interleave",
            interleave,
            "--report",
            "json",
        ]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        report["predicted_step_time_s"].as_f64().unwrap()
    };
    let base = "assign-dp,dp-merge,pack-symmetric,schedule-pipeline";
    let interleaving = format!("{base},interleave-ranks");
    let interleaved = predicted(&interleaving, "simulated");
    let one_after_another = predicted(base, "simulated");
    assert!(
        interleaved < one_after_another,
        "{interleaved} vs {one_after_another}"
    );
    assert_eq!(predicted(&interleaving, "replica-major"), one_after_another);
}

/// The runtimes run what each pack saves under: a stage whose mode is `full` but whose packs
/// all save everything (`recompute %st0 none [...]`) runs; a pack that recomputes is refused in
/// one line naming its stage and mode.
#[test]
fn run_follows_what_each_pack_saves_under() {
    let step = |stage: &str, packs: &str| {
        format!(
            "step phase=scheduled {{
  model name=\"tiny\" layers=4 hidden=128 heads=4 kv_heads=2 head_dim=32 ffn=352 vocab=512 dtype=fp32 recompute=none tied_embeddings=true
  gpu name=\"cpu-2core\" peak_flops=192000000000 hbm_bytes=25769803776 hbm_bandwidth=20000000000
  cluster name=\"cpu\" gpus_per_node=2 intra_bandwidth=10000000000 intra_latency=0.000002 inter_bandwidth=1000000000 inter_latency=0.00005
  parallel tp=1 pp=1 dp=1
  batch source=\"test\" context=64 documents=2 documents_cut=0
  %st0 = stage layers=0..4 recompute={stage}
  %r0 = replica dp=[0]
  %d0 = sample len=20 doc=0 piece=0 on %r0
    %d0.0 = slice 0..20
  %d1 = sample len=30 doc=1 piece=0 on %r0
    %d1.0 = slice 0..30
  %f0 = pack fwd on %r0 [%d0.0]
  %f1 = pack fwd on %r0 [%d1.0]
  %b0 = pack bwd on %r0 [%d1.0]
  %b1 = pack bwd on %r0 [%d0.0]
  schedule %r0 %st0 [%f0, %f1, %b0, %b1]
  {packs}
}}
"
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        slimpack(&["run", "--backend", "cpu", "--ir", path.to_str().unwrap()])
    };
    let saves_all = run(
        "saves-all.sir",
        step("full", "recompute %st0 none [%f0, %f1]"),
    );
    let stderr = String::from_utf8_lossy(&saves_all.stderr);
    assert!(saves_all.status.success(), "{stderr}");
    let recomputes = run("recomputes.sir", step("none", "recompute %st0 full [%f1]"));
    let stderr = String::from_utf8_lossy(&recomputes.stderr);
    assert_eq!(recomputes.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("stage 0") && stderr.contains("recompute=full"),
        "{stderr}"
    );
}
