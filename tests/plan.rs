//! `slimpack plan`: an epoch planned step by step is the same as compiling each step's batch
//! on its own (`compile --step N`), its summary counts the whole epoch, and nothing but the
//! summary reaches stderr when it is not a terminal (no progress bar).

mod common;
use common::{on_tiny, slimpack};

/// A job with one candidate (recompute and CP fixed), so tuning once on the first step and
/// tuning every step choose the same configuration.
const JOB: [&str; 14] = [
    "--model",
    "llama-7b",
    "--cluster",
    "h100-sxm",
    "--parallel",
    "tp=8,cp=1,pp=2,dp=4",
    "--recompute",
    "selective",
    "--batch",
    "tests/fixtures/wikipedia-100k.lengths.txt",
    "--context",
    "32768",
    "--strategy",
    "megatron",
];

/// Runs `slimpack` with `args`, which must succeed (its stderr shown where it does not).
fn succeed(args: &[&str]) -> std::process::Output {
    let output = slimpack(args);
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The names of the files in `dir`, sorted.
fn names_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// A directory for one test's outputs, removed when the test ends (an epoch's JSONL is ~80 MB).
fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("slimpack-plan-")
        .tempdir()
        .unwrap()
}

#[test]
fn every_planned_step_is_the_compile_of_its_batch() {
    let scratch = scratch();
    let dir = scratch.path();
    let out = dir.join("steps");
    let out_arg = out.to_str().unwrap().to_string();
    let mut args: Vec<&str> = vec!["plan"];
    args.extend(JOB);
    args.extend(["--global-batch-tokens", "2000000"]);
    args.extend(["--steps", "3", "--out-dir", &out_arg, "--report", "json"]);
    let output = succeed(&args);
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(summary["steps"], 3);
    for step in 1..=3 {
        let planned = std::fs::read_to_string(out.join(format!("step-{step:06}.json"))).unwrap();
        let single = dir.join(format!("compiled-{step}.json"));
        let step_arg = step.to_string();
        let single_arg = single.to_str().unwrap().to_string();
        let mut args: Vec<&str> = vec!["compile"];
        args.extend(JOB);
        args.extend(["--global-batch-tokens", "2000000"]);
        args.extend(["--step", &step_arg, "--emit", "json", "-o", &single_arg]);
        succeed(&args);
        let compiled = std::fs::read_to_string(&single).unwrap();
        assert!(planned == compiled, "step {step}: plan and compile differ");
    }
    // Consecutive steps are different batches.
    let first = std::fs::read_to_string(out.join("step-000001.json")).unwrap();
    let second = std::fs::read_to_string(out.join("step-000002.json")).unwrap();
    assert_ne!(first, second);
}

#[test]
fn an_epoch_covers_every_document_and_only_the_summary_reaches_a_pipe() {
    let scratch = scratch();
    let dir = scratch.path();
    let lines = dir.join("plan.jsonl");
    let lines_arg = lines.to_str().unwrap().to_string();
    let mut args: Vec<&str> = vec!["plan"];
    args.extend(JOB);
    args.extend([
        "--global-batch-tokens",
        "20000000",
        "--jsonl",
        &lines_arg,
        "--report",
        "json",
    ]);
    let output = succeed(&args);
    // stderr is a pipe here: no progress bar, and the summary went to stdout.
    assert!(
        output.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let steps = summary["steps"].as_u64().unwrap();
    let text = std::fs::read_to_string(&lines).unwrap();
    assert_eq!(text.lines().count() as u64, steps);
    for line in text.lines() {
        serde_json::from_str::<serde_json::Value>(line).expect("one JSON document per line");
    }
    // The epoch holds every token of the file (cut to the context), the last step possibly a
    // few documents of the next epoch.
    let file_tokens: u64 = std::fs::read_to_string("tests/fixtures/wikipedia-100k.lengths.txt")
        .unwrap()
        .lines()
        .map(|l| l.trim().parse::<u64>().unwrap())
        .sum();
    let tokens = summary["tokens"].as_u64().unwrap();
    assert!(tokens >= file_tokens, "{tokens} < {file_tokens}");
    assert!(tokens < file_tokens + 20_000_000 + 32768, "{tokens}");
    // Every step meets its budget, and the epoch ends with the step that completes it.
    assert!(
        steps * 20_000_000 <= tokens,
        "{steps} steps, {tokens} tokens"
    );
    assert!((steps - 1) * 20_000_000 < file_tokens, "{steps} steps");
    assert_eq!(summary["over_limit_steps"], 0, "{summary}");
}

/// A memory limit no configuration meets is counted on every step, beside the limit, instead
/// of a summary that reads as if every step fitted.
#[test]
fn steps_over_the_memory_limit_are_counted() {
    let mut args: Vec<&str> = vec!["plan"];
    args.extend(JOB);
    args.extend([
        "--global-batch-tokens",
        "2000000",
        "--steps",
        "2",
        "--memory-limit",
        "0.01",
        "--report",
        "json",
    ]);
    let output = slimpack(&args);
    assert!(output.status.success());
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(summary["over_limit_steps"], 2, "{summary}");
    assert_eq!(summary["oom_steps"], 0, "{summary}");
    let limit = summary["memory_limit_bytes"].as_f64().unwrap();
    assert!(
        limit > 0.0 && limit < 0.011 * 80.0 * f64::from(1 << 30),
        "{summary}"
    );
}

#[test]
fn text_summary_goes_to_stderr_and_bad_flags_are_one_line_errors() {
    let mut args: Vec<&str> = vec!["plan"];
    args.extend(JOB);
    args.extend(["--global-batch-tokens", "2000000", "--steps", "2"]);
    let output = slimpack(&args);
    assert!(output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.starts_with("planned 2 steps"), "{stderr}");
    assert!(output.stdout.is_empty());
    for (flag, value) in [("--steps", "0"), ("--threads", "0")] {
        let mut args: Vec<&str> = vec!["plan"];
        args.extend(JOB);
        args.extend(["--global-batch-tokens", "2000000", flag, value]);
        let output = slimpack(&args);
        assert_eq!(output.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.starts_with("error: ") && stderr.contains(flag),
            "{stderr}"
        );
    }
}

#[test]
fn bench_planning_prints_one_row_per_size_and_strategy() {
    let output = succeed(&[
        "bench",
        "--model",
        "llama-7b",
        "--cluster",
        "h100-sxm",
        "--parallel",
        "tp=8,pp=2,dp=4",
        "--context",
        "32768",
        "--dataset",
        "tests/fixtures/wikipedia-100k.lengths.txt",
        "--planning",
        "--planning-sizes",
        "100,1000",
        "--planning-repeats",
        "2",
        "--strategies",
        "megatron,bfd",
        "--report",
        "json",
    ]);
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["devices"], 64, "{report}");
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    for (row, (samples, strategy)) in rows.iter().zip([
        (100, "megatron"),
        (100, "bfd"),
        (1000, "megatron"),
        (1000, "bfd"),
    ]) {
        assert!(row["samples"].as_u64().unwrap() >= samples, "{row}");
        assert_eq!(row["strategy"], strategy);
        // Two runs each (far under the cell budget): the median lies between them.
        assert_eq!(row["runs"], 2, "{row}");
        let (wall, min, max) = (
            row["wall_ms"].as_f64().unwrap(),
            row["min_ms"].as_f64().unwrap(),
            row["max_ms"].as_f64().unwrap(),
        );
        assert!(0.0 < min && min <= wall && wall <= max, "{row}");
        assert_eq!(row["growth"].is_null(), samples == 100, "{row}");
    }
}

/// Sizes past the dataset plan it whole once: later ones are skipped with a note, not timed
/// again as rows of the same batch with a growth of noise.
#[test]
fn bench_planning_sizes_past_the_dataset_plan_it_once() {
    let mut args = vec!["bench", "--model", "tiny", "--cluster", "cpu"];
    args.extend([
        "--parallel",
        "tp=1,pp=1,dp=1",
        "--dataset",
        "tests/fixtures/lengths.txt",
    ]);
    args.extend([
        "--planning",
        "--planning-sizes",
        "3,10,100",
        "--planning-repeats",
        "1",
    ]);
    args.extend(["--strategies", "megatron", "--report", "json"]);
    let output = succeed(&args);
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let samples: Vec<u64> = (report["rows"].as_array().unwrap().iter())
        .map(|row| row["samples"].as_u64().unwrap())
        .collect();
    assert_eq!(samples, [3, 6], "{report}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--planning-sizes 100: the dataset holds 6 samples"),
        "{stderr}"
    );
}

/// A later step over the memory limit is re-tuned on its own batch and counted as re-planned
/// also when nothing fits the limit (here none can): the count said 0 while every step was
/// re-tuned.
#[test]
fn steps_retuned_without_a_fitting_plan_count_as_replanned() {
    let output = succeed(&on_tiny(
        "plan",
        "tp=1,pp=2,dp=2",
        &[
            "--batch",
            "tests/fixtures/lengths.txt",
            "--global-batch",
            "2",
            "--memory-limit",
            "1e-9",
            "--report",
            "json",
        ],
    ));
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(summary["over_limit_steps"], summary["steps"], "{summary}");
    // Every step after the first (the tuning's).
    assert_eq!(
        summary["replanned"].as_u64().unwrap() + 1,
        summary["steps"].as_u64().unwrap(),
        "{summary}"
    );
}

/// The epoch is the same on any number of threads, also where a step is re-planned with a
/// strategy that keeps state (wlb's micro-batch count, under a memory limit its tuned
/// configuration does not fit on some steps): each step is re-planned with the state its own
/// admission left, not the round's last.
#[test]
fn replanned_steps_are_the_same_on_any_number_of_threads() {
    let scratch = scratch();
    let dir = scratch.path();
    let mut outputs = Vec::new();
    for threads in ["1", "4"] {
        let lines = dir.join(format!("plan-{threads}.jsonl"));
        let lines_arg = lines.to_str().unwrap().to_string();
        let output = succeed(&[
            "plan",
            "--model",
            "llama-7b",
            "--cluster",
            "h100-sxm",
            "--parallel",
            "tp=2,pp=2,dp=4",
            "--context",
            "16384",
            "--global-batch",
            "64",
            "--batch",
            "tests/fixtures/wikipedia-100k.lengths.txt",
            "--strategy",
            "wlb",
            "--steps",
            "12",
            "--memory-limit",
            "0.25",
            "--threads",
            threads,
            "--jsonl",
            &lines_arg,
            "--report",
            "json",
        ]);
        let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert!(summary["replanned"].as_u64().unwrap() > 0, "{summary}");
        outputs.push(std::fs::read_to_string(&lines).unwrap());
    }
    assert!(outputs[0] == outputs[1], "the epochs differ");
}

/// `--jsonl -` streams the schedules to standard output (one document per line) instead of
/// creating a file named `-`, and refuses to mix them with a JSON summary there.
#[test]
fn jsonl_dash_is_standard_output() {
    let scratch = scratch();
    let dir = scratch.path();
    let mut args: Vec<&str> = vec!["plan"];
    args.extend(JOB);
    args.extend([
        "--global-batch-tokens",
        "2000000",
        "--steps",
        "2",
        "--jsonl",
        "-",
    ]);
    let manifest = env!("CARGO_MANIFEST_DIR");
    let batch = format!("{manifest}/tests/fixtures/wikipedia-100k.lengths.txt");
    let args: Vec<&str> = args
        .iter()
        .map(|&a| {
            if a.starts_with("tests/fixtures/") {
                batch.as_str()
            } else {
                a
            }
        })
        .collect();
    let run = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_slimpack"))
            .args(&args)
            .args(extra)
            .current_dir(dir)
            .output()
            .unwrap()
    };
    let output = run(&[]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
    for line in stdout.lines() {
        let document: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(document["format"], "slimpack.schedule");
    }
    assert!(!dir.join("-").exists(), "a file named - was written");
    let output = run(&["--report", "json"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("error: --jsonl - and --report json"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty());
}

/// A strategy that delays documents (wlb's outlier queues) gets drain steps after the epoch's
/// batches, so the plan trains every document of the epoch: it used to end with the outliers
/// still queued, and said nothing.
#[test]
fn an_epoch_plan_trains_every_document_it_drew() {
    let scratch = scratch();
    let mut plans = Vec::new();
    for threads in ["1", "3"] {
        let lines = scratch.path().join(format!("plan-{threads}.jsonl"));
        let output = succeed(&on_tiny(
            "plan",
            "tp=1,pp=1,dp=1",
            &[
                "--batch",
                "tests/fixtures/lengths.txt",
                "--context",
                "20000",
                "--global-batch",
                "2",
                "--strategy",
                "wlb",
                "--threads",
                threads,
                "--jsonl",
                lines.to_str().unwrap(),
                "--report",
                "json",
            ],
        ));
        let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let lengths = std::fs::read_to_string("tests/fixtures/lengths.txt").unwrap();
        let lengths: Vec<u64> = lengths
            .split_whitespace()
            .map(|l| l.parse().unwrap())
            .collect();
        assert_eq!(summary["samples"], lengths.len() as u64, "{summary}");
        assert_eq!(summary["tokens"], lengths.iter().sum::<u64>(), "{summary}");
        assert!(summary["drain_steps"].as_u64().unwrap() >= 1, "{summary}");
        plans.push(std::fs::read_to_string(lines).unwrap());
    }
    // The drain steps are planned in the rounds as the epoch's are: the same on any threads.
    assert_eq!(plans[0], plans[1]);
}

/// A plan written into a directory that holds an earlier, longer plan of the same form removes
/// that plan's later step files (a reader would take `step-000003.json` for this plan's), and
/// only those: other files, and step files of the other form, stay.
#[test]
fn a_shorter_plan_leaves_no_stale_steps_behind() {
    let scratch = scratch();
    let dir = scratch.path();
    let out = dir.to_str().unwrap();
    let plan = |steps: &str, emit: &str| {
        let mut args: Vec<&str> = vec!["plan"];
        args.extend(JOB);
        args.extend(["--global-batch-tokens", "2000000", "--steps", steps]);
        args.extend(["--out-dir", out, "--emit", emit]);
        succeed(&args);
    };
    plan("3", "json");
    plan("3", "ir");
    std::fs::write(dir.join("notes.txt"), "mine").unwrap();
    // Names plan never writes (it pads to six digits, no more), though they read as a step.
    for name in [
        "step-1.json",
        "step-0000001.json",
        "step-00000099.json",
        "step-+00001.json",
    ] {
        std::fs::write(dir.join(name), "mine").unwrap();
    }
    // What an interrupted plan leaves of the step it was writing.
    std::fs::write(dir.join(".step-000004.json.partial"), "{\"form").unwrap();
    plan("2", "json");
    let names = names_in(dir);
    // The ir files are another form of plan, left as they are.
    let expected = [
        "notes.txt",
        "step-+00001.json",
        "step-0000001.json",
        "step-00000099.json",
        "step-000001.json",
        "step-000001.sir",
        "step-000002.json",
        "step-000002.sir",
        "step-000003.sir",
        "step-1.json",
    ];
    assert_eq!(names, expected);
}

/// A step that cannot be written (here a directory stands where its file goes) is an error
/// line, and what was written of it aside is removed, not left beside the plan.
#[test]
fn a_step_that_cannot_be_written_leaves_nothing_aside() {
    let scratch = scratch();
    let dir = scratch.path();
    std::fs::create_dir(dir.join("step-000002.json")).unwrap();
    let mut args: Vec<&str> = vec!["plan"];
    args.extend(JOB);
    args.extend(["--global-batch-tokens", "2000000", "--steps", "3"]);
    args.extend(["--out-dir", dir.to_str().unwrap()]);
    let output = slimpack(&args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("cannot write") && stderr.contains("step-000002.json"),
        "{stderr}"
    );
    let names = names_in(dir);
    assert_eq!(names, ["step-000001.json", "step-000002.json"]);
}

/// A step file that is a link to another file (an input, say) is replaced by the new step, not
/// written through: the batch file a hard link in the directory pointed at was overwritten
/// with schedule JSON.
#[test]
fn a_step_file_that_links_elsewhere_is_replaced_not_written_through() {
    let scratch = scratch();
    let dir = scratch.path();
    let lengths = std::fs::read_to_string("tests/fixtures/lengths.txt").unwrap();
    let batch = dir.join("batch.txt");
    std::fs::write(&batch, &lengths).unwrap();
    let out = dir.join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::hard_link(&batch, out.join("step-000001.json")).unwrap();
    succeed(&on_tiny(
        "plan",
        "tp=1,pp=1,dp=1",
        &[
            "--strategy",
            "megatron",
            "--batch",
            batch.to_str().unwrap(),
            "--out-dir",
            out.to_str().unwrap(),
        ],
    ));
    assert_eq!(std::fs::read_to_string(&batch).unwrap(), lengths);
    let step = std::fs::read_to_string(out.join("step-000001.json")).unwrap();
    assert!(step.contains("slimpack.schedule"), "{step}");
}

/// A plan that `--steps` ends before wlb's drain says what it still holds back (it said
/// nothing, and those documents were in no step).
#[test]
fn a_cut_plan_reports_what_the_strategy_still_delays() {
    let output = succeed(&on_tiny(
        "plan",
        "tp=1,pp=2,dp=2",
        &[
            "--batch",
            "tests/fixtures/wikipedia-100k.lengths.txt",
            "--context",
            "4096",
            "--global-batch-tokens",
            "65536",
            "--strategy",
            "wlb",
            "--steps",
            "3",
            "--report",
            "json",
        ],
    ));
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(summary["drain_steps"], 0);
    assert!(
        summary["delayed_samples"].as_u64().unwrap() > 0,
        "{summary}"
    );
    assert!(summary["delayed_tokens"].as_u64().unwrap() > 0, "{summary}");
}
