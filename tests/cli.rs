//! The command line as users and scripts see it: exit statuses, one-line errors, stdout/stderr
//! discipline, and the IR round trip through `compile` and `opt`.

use std::path::{Path, PathBuf};

mod common;
use common::{slimpack, slimpack_reading};

fn fixture(name: &str) -> String {
    format!("tests/fixtures/{name}")
}

/// Asserts exit status 2 and a single `error:` line on stderr that contains every needle.
fn assert_bad_input(args: &[&str], needles: &[&str]) {
    let output = slimpack(args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "{args:?}: not one line: {stderr}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{stderr}"
    );
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "{args:?}: '{needle}' not in: {stderr}"
        );
    }
    assert!(output.stdout.is_empty(), "{args:?}: stdout not empty");
}

const TINY: [&str; 6] = [
    "--model",
    "tiny",
    "--cluster",
    "cpu",
    "--parallel",
    "tp=1,pp=2,dp=2",
];

fn compile_with(extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec!["compile".into()];
    args.extend(TINY.iter().map(|s| s.to_string()));
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn run_compile(extra: &[&str], needles: &[&str]) {
    let args = compile_with(extra);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_bad_input(&refs, needles);
}

/// `--batch -` reads the lengths from standard input, as `opt -` reads IR, and names it
/// `<stdin>` in the report and in errors.
#[test]
fn batch_from_standard_input() {
    let args = common::on_tiny(
        "compile",
        "tp=1,pp=2,dp=2",
        &["--batch", "-", "--context", "256"],
    );
    let output = slimpack_reading(&args, b"40\n100\n7\n250\n300\n");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.starts_with("compiled 6 samples (697 tokens, 5 documents, 1 cut at context 256"),
        "{stderr}"
    );
    assert!(
        stderr.lines().next().unwrap().ends_with("from <stdin>"),
        "{stderr}"
    );
    let output = slimpack_reading(&args, b"40\nforty\n");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("error: <stdin>: line 2: length 'forty'"),
        "{stderr}"
    );
    let output = slimpack_reading(&args, b"");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("error: <stdin>: no documents"),
        "{stderr}"
    );
}

#[test]
fn missing_batch_file() {
    run_compile(&["--batch", "no/such/file.txt"], &["no/such/file.txt"]);
}

#[test]
fn empty_batch() {
    run_compile(&["--batch", &fixture("empty.txt")], &["empty.txt"]);
}

#[test]
fn zero_lengths_are_skipped_and_counted() {
    let args = compile_with(&[
        "--batch",
        &fixture("zero-length.txt"),
        "--passes",
        "",
        "--report",
        "json",
    ]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = slimpack(&refs);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["documents"], 2);
    assert_eq!(report["documents_empty"], 1);
    assert_eq!(report["tokens"], 300);
}

#[test]
fn negative_and_non_numeric_lengths() {
    run_compile(
        &["--batch", &fixture("negative-length.txt")],
        &["negative-length.txt", "line 2", "-5"],
    );
    run_compile(
        &["--batch", &fixture("non-numeric-length.txt")],
        &["non-numeric-length.txt", "line 2", "abc"],
    );
}

#[test]
fn unknown_presets() {
    let batch = fixture("lengths.txt");
    assert_bad_input(
        &[
            "compile",
            "--model",
            "gpt-9",
            "--cluster",
            "cpu",
            "--parallel",
            "tp=1",
            "--batch",
            &batch,
        ],
        &["unknown model preset 'gpt-9'", "llama-7b"],
    );
    assert_bad_input(
        &[
            "compile",
            "--model",
            "tiny",
            "--cluster",
            "tpu-v9",
            "--parallel",
            "tp=1",
            "--batch",
            &batch,
        ],
        &["unknown cluster preset 'tpu-v9'", "h100-sxm"],
    );
}

#[test]
fn unknown_pass_and_option() {
    let batch = fixture("lengths.txt");
    run_compile(
        &["--batch", &batch, "--passes", "slice{size=8},frobnicate"],
        &[
            "unknown pass 'frobnicate'",
            "valid: assign-dp,",
            "schedule-pipeline",
        ],
    );
    run_compile(
        &["--batch", &batch, "--passes", "slice{width=8}"],
        &["unknown option 'width'", "valid: size"],
    );
    // An option the policy would silently ignore.
    run_compile(
        &[
            "--batch",
            &batch,
            "--passes",
            "assign-dp,pack-symmetric{policy=padding,cap=1}",
        ],
        &["cap", "policy padding", "uses no cap"],
    );
}

/// Megatron-Core asserts hybrid CP without pipeline parallelism: on pp=2 the strategy is
/// refused, with what it needs.
#[test]
fn hybrid_cp_is_not_applicable_with_pipeline_stages() {
    let batch = fixture("lengths.txt");
    run_compile(
        &["--batch", &batch, "--strategy", "hybrid-cp"],
        &["strategy 'hybrid-cp' is not applicable (needs pp=1)"],
    );
}

#[test]
fn layout_must_fit_the_model() {
    let batch = fixture("lengths.txt");
    assert_bad_input(
        &[
            "compile",
            "--model",
            "llama-7b",
            "--cluster",
            "h100-sxm",
            "--parallel",
            "tp=3,pp=1,dp=1",
            "--batch",
            &batch,
        ],
        &["tp=3 must divide the heads (32)"],
    );
    assert_bad_input(
        &[
            "compile",
            "--model",
            "llama-7b",
            "--cluster",
            "h100-sxm",
            "--parallel",
            "tp=8,pp=5,dp=1",
            "--batch",
            &batch,
        ],
        &["pp=5 must divide the layers (32)"],
    );
    assert_bad_input(
        &[
            "compile",
            "--model",
            "llama-7b",
            "--cluster",
            "h100-sxm",
            "--parallel",
            "tp=8,pp=0,dp=1",
            "--batch",
            &batch,
        ],
        &["pp must be a positive integer"],
    );
}

/// The input section of a filetest (above its expected output), written to a file of its own.
fn filetest_input(dir: &Path, name: &str) -> String {
    let content = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/filetests")
            .join(name),
    )
    .unwrap();
    let input = content.split("// ----- expected -----").next().unwrap();
    let path = dir.join(Path::new(name).file_name().unwrap());
    std::fs::write(&path, input).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn malformed_ir_names_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let input = filetest_input(dir.path(), "parse/unexpected-character.sir");
    assert_bad_input(
        &["opt", &input],
        &["unexpected-character.sir:12:28", "unexpected character '$'"],
    );
}

#[test]
fn ir_breaking_an_invariant_names_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let input = filetest_input(dir.path(), "verify/slice-gap.sir");
    assert_bad_input(&["opt", &input], &["%d0.1", "slice-cover"]);
}

#[test]
fn missing_ir_file() {
    assert_bad_input(&["opt", "no/such.sir"], &["cannot read no/such.sir"]);
}

#[test]
fn compile_report_json_is_one_object_on_stdout() {
    let args = compile_with(&[
        "--batch",
        &fixture("lengths.txt"),
        "--context",
        "4096",
        "--passes",
        "slice{size=1024}",
        "--report",
        "json",
    ]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = slimpack(&refs);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("stdout is one JSON object");
    assert_eq!(report["samples"], 10); // 17000 is cut into 5 context pieces
    assert_eq!(report["tokens"], 1200 + 800 + 4096 + 300 + 17000 + 650);
    assert_eq!(report["documents_cut"], 1);
    assert_eq!(report["slices"], 2 + 1 + 4 + 1 + 17 + 1);
    assert_eq!(report["passes"][0]["name"], "slice");
    assert_eq!(report["passes"][0]["statistics"]["slices_after"], 26);
    assert!(report["compile_ms"].as_f64().unwrap() >= 0.0);
}

#[test]
fn compile_then_opt_round_trips_byte_identically() {
    let dir = tempfile::tempdir().unwrap();
    let logical = dir.path().join("logical.sir");
    let args = compile_with(&[
        "--batch",
        &fixture("lengths.txt"),
        "--context",
        "4096",
        "--passes",
        "",
        "--emit",
        "ir",
        "-o",
        logical.to_str().unwrap(),
    ]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    assert!(slimpack(&refs).status.success());
    let read = |p: &Path| std::fs::read_to_string(p).unwrap();
    let opt = |input: &Path, passes: &str| -> String {
        let output = slimpack(&["opt", input.to_str().unwrap(), "--passes", passes]);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    };
    assert_eq!(opt(&logical, ""), read(&logical));
    let sliced: PathBuf = dir.path().join("sliced.sir");
    std::fs::write(&sliced, opt(&logical, "slice{size=1024}")).unwrap();
    assert_eq!(opt(&sliced, ""), read(&sliced));
}

#[test]
fn dump_dir_holds_numbered_before_and_after_files() {
    let dir = tempfile::tempdir().unwrap();
    let args = compile_with(&[
        "--batch",
        &fixture("lengths.txt"),
        "--passes",
        "slice{size=2048},slice{size=512}",
        "--dump-dir",
        dir.path().to_str().unwrap(),
    ]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    assert!(slimpack(&refs).status.success());
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "00-input.sir",
            "01-slice.after.sir",
            "01-slice.before.sir",
            "02-slice.after.sir",
            "02-slice.before.sir"
        ]
    );
}

/// With a strategy, the dumps and printed IR are those of the chosen candidate's passes (the
/// tuner compiles candidates without them; they used to show only the final lowering): the
/// last dump is the step compiled, byte for byte.
#[test]
fn a_strategy_dumps_and_prints_the_chosen_candidates_passes() {
    let dir = tempfile::tempdir().unwrap();
    let dumps = dir.path().join("dumps");
    let step = dir.path().join("step.sir");
    let args = compile_with(&[
        "--batch",
        &fixture("lengths.txt"),
        "--strategy",
        "slimpack",
        "--dump-dir",
        dumps.to_str().unwrap(),
        "--print-ir-after",
        "schedule-pipeline",
        "-o",
        step.to_str().unwrap(),
    ]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = slimpack(&refs);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("IR after schedule-pipeline"), "{stderr}");
    assert!(!stderr.contains("note:"), "{stderr}");
    let mut names: Vec<String> = std::fs::read_dir(&dumps)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names[0], "00-input.sir");
    assert!(
        names.iter().any(|n| n.ends_with("-assign-dp.after.sir")),
        "{names:?}"
    );
    assert!(
        names
            .iter()
            .any(|n| n.ends_with("-schedule-pipeline.after.sir")),
        "{names:?}"
    );
    let last = names.iter().rfind(|n| n.ends_with(".after.sir")).unwrap();
    assert!(last.ends_with("-lower.after.sir"), "{names:?}");
    assert_eq!(
        std::fs::read_to_string(dumps.join(last)).unwrap(),
        std::fs::read_to_string(&step).unwrap()
    );
}

/// `lengths` tokenizes a corpus once into the length file the other commands read; with a
/// draw flag it prints the samples of that global batch, cut as `compile` cuts them.
#[test]
fn lengths_of_a_corpus_and_of_a_global_batch() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    std::fs::write(
        &corpus,
        "{\"text\": \"hello world\"}\n{\"text\": \"\"}\n{\"text\": \"a b c d e f g h\"}\n",
    )
    .unwrap();
    let output = slimpack(&["lengths", "--batch", corpus.to_str().unwrap()]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "2\n8\n");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("2 documents") && stderr.contains("1 empty skipped"),
        "{stderr}"
    );

    let lengths = dir.path().join("lengths.txt");
    std::fs::write(&lengths, "10\n3\n25\n").unwrap();
    let output = slimpack(&[
        "lengths",
        "--batch",
        lengths.to_str().unwrap(),
        "--context",
        "8",
    ]);
    assert!(output.status.success(), "{output:?}");
    let mut samples: Vec<u32> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| line.parse().unwrap())
        .collect();
    samples.sort_unstable();
    assert_eq!(samples, [1, 2, 3, 8, 8, 8, 8]);
    assert_bad_input(
        &["lengths", "--batch", "no/such/file.txt"],
        &["no/such/file.txt"],
    );
}

#[test]
fn compile_and_simulate_report_where_the_step_goes() {
    let dir = tempfile::tempdir().unwrap();
    let step = dir.path().join("step.sir");
    let strategy = [
        "--batch",
        &fixture("lengths.txt"),
        "--context",
        "4096",
        "--strategy",
        "padding",
    ];
    let mut text = strategy.to_vec();
    text.extend(["--emit", "ir", "-o", step.to_str().unwrap()]);
    let args = compile_with(&text);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = slimpack(&refs);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("where the step goes"), "{stderr}");
    for cause in ["useful compute", "padding", "memory bound"] {
        assert!(
            stderr.contains(&format!("    {cause} ")),
            "{cause}: {stderr}"
        );
    }
    assert!(stderr.contains("schedule efficiency"), "{stderr}");

    let mut json = strategy.to_vec();
    json.extend(["--report", "json"]);
    let args = compile_with(&json);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let compiled: serde_json::Value = serde_json::from_slice(&slimpack(&refs).stdout).unwrap();
    let simulated: serde_json::Value = serde_json::from_slice(
        &slimpack(&["simulate", step.to_str().unwrap(), "--report", "json"]).stdout,
    )
    .unwrap();
    for report in [&compiled, &simulated] {
        let number = |key: &str| report[key].as_f64().unwrap();
        let losses = report["losses"].as_object().unwrap();
        assert_eq!(losses.len(), 14);
        let total: f64 = losses.values().map(|v| v.as_f64().unwrap()).sum();
        let step_time = number("step_time_s");
        assert!((total - step_time).abs() <= 1e-3 * step_time, "{report}");
        assert!(losses["padding_s"].as_f64().unwrap() > 0.0);
        // Padded micro-batches: the executed FLOPs flatter, the useful ones do not.
        assert!(number("efficiency") < number("executed_efficiency"));
        assert!(number("efficiency") <= number("schedule_efficiency"));
        assert!(number("floor_step_time_s") < step_time);
    }
    assert_eq!(compiled["losses"], simulated["losses"]);
}

/// `--memory-limit` bounds a strategy's tuning (compile, plan and bench share its parsing);
/// out of (0, 1], or beside `--passes`, it is a one-line error.
#[test]
fn memory_limit_is_a_fraction_for_a_strategy() {
    let lengths = fixture("lengths.txt");
    run_compile(
        &["--batch", &lengths, "--memory-limit", "1.5"],
        &["--memory-limit 1.5", "(0, 1]"],
    );
    run_compile(
        &["--batch", &lengths, "--memory-limit", "x"],
        &["--memory-limit x"],
    );
    run_compile(
        &["--batch", &lengths, "--passes", "", "--memory-limit", "0.5"],
        &["--memory-limit", "--passes"],
    );
    let args = compile_with(&[
        "--batch",
        &lengths,
        "--memory-limit",
        "0.9",
        "--report",
        "json",
    ]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = slimpack(&refs);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // A limit no candidate fits is exit 3 with one line naming the peak and the limit, not a
    // plan written as if it fitted; --allow-oom writes it anyway.
    let mut tight = compile_with(&["--batch", &lengths, "--memory-limit", "0.000001"]);
    let refs: Vec<&str> = tight.iter().map(String::as_str).collect();
    let output = slimpack(&refs);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("memory limit") && stderr.contains("--memory-limit 0.000001"),
        "{stderr}"
    );
    tight.push("--allow-oom".to_string());
    let refs: Vec<&str> = tight.iter().map(String::as_str).collect();
    assert!(slimpack(&refs).status.success());
}

/// `--calibration FILE` makes `compile` and `simulate` price kernels with a `slimpack
/// calibrate` table of the cluster's device; a table of another device, a missing file or bad
/// JSON is a one-line error.
#[test]
fn a_calibration_file_replaces_the_analytic_rates_of_its_device() {
    let dir = tempfile::tempdir().unwrap();
    let shipped = std::fs::read_to_string("machine/calibration/cpu.json").unwrap();
    let as_h100 = dir.path().join("h100.json");
    let relabelled = shipped.replace("\"cpu-2core\"", "\"H100-SXM5-80GB\"");
    assert_ne!(relabelled, shipped);
    std::fs::write(&as_h100, relabelled).unwrap();
    let as_h100 = as_h100.to_str().unwrap();
    let step = dir.path().join("step.json");
    let job = [
        "compile",
        "--model",
        "llama-7b",
        "--cluster",
        "h100-sxm",
        "--parallel",
        "tp=8,pp=2,dp=2",
        "--synthetic",
        "lognormal:median=2048,sigma=1,count=64,seed=1",
        "--strategy",
        "megatron",
        "--report",
        "json",
    ];
    let step_time = |args: &[&str]| -> f64 {
        let output = slimpack(args);
        assert!(output.status.success(), "{args:?}: {output:?}");
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        report["step_time_s"].as_f64().unwrap()
    };
    let mut emit = job.to_vec();
    emit.extend(["--emit", "json", "-o", step.to_str().unwrap()]);
    let analytic = step_time(&emit);
    // The shipped table holds a 2-core CPU's rates: an "H100" priced with them is far slower.
    let mut calibrated = job.to_vec();
    calibrated.extend(["--calibration", as_h100]);
    assert!(step_time(&calibrated) > 100.0 * analytic);
    let simulate = ["simulate", step.to_str().unwrap(), "--report", "json"];
    assert_eq!(step_time(&simulate), analytic);
    let mut simulate_calibrated = simulate.to_vec();
    simulate_calibrated.extend(["--calibration", as_h100]);
    assert!(step_time(&simulate_calibrated) > 100.0 * analytic);

    let mut other_device = job.to_vec();
    other_device[4] = "h200";
    other_device.extend(["--calibration", as_h100]);
    assert_bad_input(&other_device, &["measured on 'H100-SXM5-80GB'", "'h200'"]);
    let mut missing = job.to_vec();
    missing.extend(["--calibration", "no/such/calibration.json"]);
    assert_bad_input(&missing, &["--calibration no/such/calibration.json"]);
}
