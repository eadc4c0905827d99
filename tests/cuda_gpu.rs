//! The CUDA backend on real GPUs (`run`, `calibrate`, `validate` with `--backend cuda`). Every
//! test first looks for a GPU; where there is none — CI, or a build without the `cuda` feature —
//! it prints that it was skipped and why, and passes. (The no-GPU answers themselves are checked
//! in tests/runtime_cli.rs and tests/hostile.rs.)

mod common;
use common::slimpack;

/// The GPUs, or `None` after printing why the test is skipped.
fn gpus_or_skip(test: &str) -> Option<usize> {
    match slimpack::gpu::gpus() {
        Ok(gpus) => Some(gpus.len()),
        Err(why) => {
            eprintln!("{test}: skipped: {why}");
            None
        }
    }
}

/// The schedule of [`step`]: sliced samples, continuation slices and different forward and
/// backward packs.
const SLICED: [&str; 2] = [
    "--passes",
    "assign-dp,slice{size=32},pack-fwd{cap=64},pack-bwd{cap=48},schedule-pipeline",
];

/// A schedule of padded packs (one sample per micro-batch, padded to the longest).
const PADDED: [&str; 2] = ["--strategy", "padding"];

/// A small step of the tiny model on `parallel`, scheduled by `schedule`.
fn step(parallel: &str, schedule: [&str; 2]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--model",
        "tiny",
        "--cluster",
        "h100-sxm",
        "--parallel",
        parallel,
        "--synthetic",
        "lognormal:median=48,sigma=0.8,count=10,seed=3",
        "--context",
        "256",
    ]
    .map(String::from)
    .to_vec();
    args.extend(schedule.map(String::from));
    args
}

/// Runs `run --backend cuda --check-reference` on `parallel` and checks loss and gradients
/// against the unsliced CPU reference (fp32, relative error <= 1e-4).
fn check_reference(parallel: &str, schedule: [&str; 2]) {
    check_step(parallel, &step(parallel, schedule));
}

/// Runs `run --backend cuda --check-reference` on the step `step` and checks loss and
/// gradients against the unsliced CPU reference (fp32, relative error <= 1e-4).
fn check_step(label: &str, step: &[String]) {
    let mut args = vec!["run".to_string(), "--backend".into(), "cuda".into()];
    args.extend(step.iter().cloned());
    args.extend(["--check-reference", "--report", "json"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = slimpack(&args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{args:?}: {stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["backend"], "cuda");
    let loss_err = report["loss_rel_err"].as_f64().unwrap();
    let grad_err = report["max_grad_rel_err"].as_f64().unwrap();
    eprintln!(
        "{label} {step:?}: loss {} (relative error {loss_err:.1e}), max gradient error {grad_err:.1e} ({}), step {} s, peak memory {} (predicted {})",
        report["loss"], report["worst_grad_tensor"], report["step_time_s"],
        report["peak_memory_bytes"], report["predicted_peak_memory_bytes"]
    );
    assert!(loss_err <= 1e-4, "{report}");
    assert!(grad_err <= 1e-4, "{report}");
}

#[test]
fn one_gpu_step_equals_the_unsliced_reference() {
    if gpus_or_skip("one_gpu_step_equals_the_unsliced_reference").is_none() {
        return;
    }
    check_reference("tp=1,pp=1,dp=1", SLICED);
}

#[test]
fn padded_packs_equal_the_unsliced_reference() {
    if gpus_or_skip("padded_packs_equal_the_unsliced_reference").is_none() {
        return;
    }
    check_reference("tp=1,pp=1,dp=1", PADDED);
}

#[test]
fn pipeline_and_data_parallel_steps_equal_the_unsliced_reference() {
    let Some(count) = gpus_or_skip("pipeline_and_data_parallel_steps_equal_the_unsliced_reference")
    else {
        return;
    };
    if count < 2 {
        eprintln!("skipped: needs 2 GPUs (NCCL), this machine has {count}");
        return;
    }
    check_reference("tp=1,pp=2,dp=1", SLICED);
    check_reference("tp=1,pp=2,dp=1", PADDED);
    check_reference("tp=1,pp=1,dp=2", SLICED);
    let dir = tempfile::tempdir().unwrap();
    check_step(
        "dp=2, DP-Merge",
        &dp_merge_step("tp=1,pp=1,dp=2", dir.path()),
    );
    if count >= 4 {
        check_reference("tp=1,pp=2,dp=2", SLICED);
        check_step(
            "pp=2, dp=2, DP-Merge",
            &dp_merge_step("tp=1,pp=2,dp=2", dir.path()),
        );
    }
}

/// A step with a DP-Merge group (both DP ranks run the dominant sample as one CP group, with
/// continuation slices); its batch file is written to `dir`.
fn dp_merge_step(parallel: &str, dir: &std::path::Path) -> Vec<String> {
    let lengths = [480, 20, 12, 30, 9, 64, 3, 40, 100, 7];
    let path = dir.join("dp-merge.lengths.txt");
    let text: String = lengths.iter().map(|len| format!("{len}\n")).collect();
    std::fs::write(&path, text).unwrap();
    [
        "--model",
        "tiny",
        "--cluster",
        "h100-sxm",
        "--parallel",
        parallel,
        "--batch",
        path.to_str().unwrap(),
        "--context",
        "512",
        "--passes",
        "assign-dp,dp-merge{threshold=0.5},slice{size=64},pack-fwd{cap=128},pack-bwd{cap=128},schedule-pipeline",
    ]
    .map(String::from)
    .to_vec()
}

#[test]
fn calibrate_writes_a_table_the_machine_model_loads() {
    if gpus_or_skip("calibrate_writes_a_table_the_machine_model_loads").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpu.json");
    let output = slimpack(&[
        "calibrate",
        "--backend",
        "cuda",
        "--tokens",
        "64,256,1024",
        "--min-seconds",
        "0.1",
        "-o",
        path.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let text = std::fs::read_to_string(&path).unwrap();
    let calibration =
        slimpack::machine::cost::Calibration::from_json(&text, "gpu.json").expect("it parses");
    assert!(!calibration.tables.is_empty(), "{text}");
    eprintln!("{stderr}");
}

#[test]
fn validate_compares_predicted_and_measured_peak_memory_and_step_time() {
    if gpus_or_skip("validate_compares_predicted_and_measured_peak_memory_and_step_time").is_none()
    {
        return;
    }
    let output = slimpack(&[
        "validate",
        "--backend",
        "cuda",
        "--repeat",
        "2",
        "--filter",
        "pp=1,dp=1",
        "--report",
        "json",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["backend"], "cuda");
    let summary = &report["summary"];
    assert!(summary["schedules"].as_u64().unwrap() > 0, "{report}");
    eprintln!(
        "peak memory MAPE {}, step time MAPE {}",
        summary["peak_memory_mape"], summary["step_time_mape"]
    );
}

#[test]
fn bf16_gemms_run_on_ampere_and_later_and_are_refused_before() {
    let test = "bf16_gemms_run_on_ampere_and_later_and_are_refused_before";
    if gpus_or_skip(test).is_none() {
        return;
    }
    let gpu = &slimpack::gpu::gpus().unwrap()[0];
    let mut args = vec![
        "run".to_string(),
        "--backend".into(),
        "cuda".into(),
        "--precision".into(),
        "bf16".into(),
    ];
    args.extend(step("tp=1,pp=1,dp=1", SLICED));
    args.extend(["--check-reference", "--report", "json"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = slimpack(&args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if gpu.compute_capability < (8, 0) {
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("need 8.0 or later"), "{stderr}");
        eprintln!(
            "{test}: refused on compute capability {:?}",
            gpu.compute_capability
        );
        return;
    }
    assert!(output.status.success(), "{args:?}: {stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["precision"], "bf16");
    let loss_err = report["loss_rel_err"].as_f64().unwrap();
    let grad_err = report["max_grad_rel_err"].as_f64().unwrap();
    eprintln!(
        "bf16: loss {} (relative error {loss_err:.1e} vs the fp32 CPU reference), max gradient error {grad_err:.1e} ({})",
        report["loss"], report["worst_grad_tensor"]
    );
    // bf16 operands carry 8 mantissa bits: the loss stays within a percent of fp32's.
    assert!(loss_err <= 1e-2, "{report}");
}
