//! The hostile-input catalogue (issue 16): every input that once crashed, hung or was silently
//! accepted, and the bad input that was already handled, each asserting its exit status
//! (`src/cli/exit.rs`: 2 bad input, 3 the plan does not fit memory), one `error:` line on
//! stderr naming what was wrong, and nothing on stdout.
//!
//! The binary runs without `RUST_BACKTRACE`, so that a panic would show as the one-line
//! "internal error" of the panic hook, and fail these tests.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};

mod common;
use common::{on_tiny, slimpack};

/// Asserts exit status `code`, one `error:` line on stderr holding every needle, and an empty
/// stdout.
fn refused(code: i32, args: &[&str], needles: &[&str]) {
    let output = slimpack(args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(code), "{args:?}: {stderr}");
    assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
    assert!(!stderr.contains("internal error"), "{args:?}: {stderr}");
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "{args:?}: '{needle}' not in {stderr}"
        );
    }
    assert!(output.stdout.is_empty(), "{args:?}: stdout not empty");
}

fn bad_input(args: &[&str], needles: &[&str]) {
    refused(2, args, needles);
}

/// Runs `args`, expecting success; returns stdout and stderr.
fn ok(args: &[&str]) -> (String, String) {
    let output = slimpack(args);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{args:?}: {stderr}");
    (String::from_utf8(output.stdout).unwrap(), stderr)
}

fn json(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout).expect("stdout is one JSON object")
}

const LENGTHS: &str = "tests/fixtures/lengths.txt";

/// `compile` of the tiny model on the cpu preset with `parallel`, then `extra`.
fn tiny<'a>(parallel: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    on_tiny("compile", parallel, extra)
}

fn write(dir: &Path, name: &str, content: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path.to_str().unwrap().to_string()
}

/// A scheduled step of the tiny model as schedule JSON, parsed.
fn schedule_json(dir: &Path) -> serde_json::Value {
    let path = dir.join("step.json");
    let path = path.to_str().unwrap();
    ok(&tiny(
        "tp=1,pp=2,dp=2",
        &[
            "--batch",
            LENGTHS,
            "--context",
            "4096",
            "--emit",
            "json",
            "-o",
            path,
        ],
    ));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

// ---- crashes (panic or abort) on user input ----

#[test]
fn heavy_tailed_pareto_batch_does_not_overflow_token_counts() {
    // Lengths up to 2^32-1: two slices of one sample once summed past u32::MAX in eqsat, and
    // a pack's keys past the 32-bit varlen offsets. The batch is now refused by its size...
    bad_input(
        &tiny(
            "tp=1,pp=1,dp=1",
            &["--synthetic", "pareto:scale=256,shape=0.01,count=64"],
        ),
        &["pareto", "more than 4294967295 tokens"],
    );
    // ...and the heaviest tail within the bound compiles: it does not fit memory (exit 3),
    // and --allow-oom keeps every token.
    let args = tiny(
        "tp=1,pp=1,dp=1",
        &[
            "--synthetic",
            "pareto:scale=256,shape=0.01,count=64,max=60000000",
            "--strategy",
            "slimpack",
        ],
    );
    refused(
        3,
        &args,
        &["does not fit device memory", "capacity 24.00 GiB"],
    );
    let mut allowed = args.clone();
    allowed.extend(["--allow-oom", "--report", "json"]);
    let report = json(&ok(&allowed).0);
    let drawn = ok(&tiny(
        "tp=1,pp=1,dp=1",
        &[
            "--synthetic",
            "pareto:scale=256,shape=0.01,count=64,max=60000000",
            "--passes",
            "",
            "--report",
            "json",
        ],
    ));
    assert_eq!(report["tokens"], json(&drawn.0)["tokens"]);
    assert_eq!(report["oom"], true);
}

#[test]
fn schedule_json_without_stages() {
    let dir = tempfile::tempdir().unwrap();
    let mut document = schedule_json(dir.path());
    document["stages"] = serde_json::json!([]);
    let path = write(dir.path(), "nostages.json", &document.to_string());
    bad_input(
        &["simulate", &path],
        &["nostages.json", "stages: 0 given", "pp=2"],
    );
}

#[test]
fn schedule_json_references_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    let original = schedule_json(dir.path());
    let mut document = original.clone();
    document["replicas"][0]["dp_ranks"] = serde_json::json!([7]);
    let path = write(dir.path(), "rank.json", &document.to_string());
    bad_input(
        &["simulate", &path],
        &["replica 0 names DP rank 7", "but the layout has dp="],
    );
    let mut document = original.clone();
    document["packs"][0]["slices"][0]["sample"] = serde_json::json!(4000000000u64);
    let path = write(dir.path(), "sample.json", &document.to_string());
    bad_input(&["simulate", &path], &["names sample 4000000000"]);
    let mut document = original.clone();
    document["schedules"][0]["packs"] = serde_json::json!([99999]);
    let path = write(dir.path(), "pack.json", &document.to_string());
    bad_input(&["simulate", &path], &["schedule names pack 99999"]);
    let mut document = original.clone();
    document["groups"][0]["runs"][0]["first"] = serde_json::json!(1000);
    let path = write(dir.path(), "group.json", &document.to_string());
    bad_input(
        &["simulate", &path],
        &["group.json", "group 0: runs[0]", "goes past rank 3"],
    );
    let mut document = original.clone();
    let ops = document["devices"][0]["ops"].as_array_mut().unwrap();
    let all_gather = ops.len() - 1;
    ops[all_gather]["group"] = serde_json::json!(99);
    let path = write(dir.path(), "index.json", &document.to_string());
    bad_input(
        &["run", "--backend", "cpu", "--schedule", &path],
        &["devices (rank 0)", "names group 99"],
    );
    let mut document = original;
    document["devices"] = serde_json::json!([]);
    let path = write(dir.path(), "devices.json", &document.to_string());
    bad_input(
        &["run", "--backend", "cpu", "--schedule", &path],
        &["devices: 0 given"],
    );
}

#[test]
fn schedule_json_with_a_million_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let mut document = schedule_json(dir.path());
    document["spec"]["parallel"]["dp"] = serde_json::json!(1000000);
    let path = write(dir.path(), "dp.json", &document.to_string());
    bad_input(&["simulate", &path], &["at most 16384 devices"]);
}

#[test]
fn ir_text_with_a_million_nested_brackets() {
    let dir = tempfile::tempdir().unwrap();
    let ir = dir.path().join("step.sir");
    ok(&tiny(
        "tp=1,pp=2,dp=2",
        &[
            "--batch",
            LENGTHS,
            "--emit",
            "ir",
            "-o",
            ir.to_str().unwrap(),
        ],
    ));
    let text = std::fs::read_to_string(&ir).unwrap();
    assert!(text.contains("dp=["), "{text}");
    let deep = text.replacen("dp=[", &format!("dp={}", "[".repeat(1_000_000)), 1);
    let path = write(dir.path(), "deep.sir", &deep);
    bad_input(&["opt", &path], &["deep.sir:", "lists do not nest"]);
}

/// Runs `args` with stdout a pipe closed after one byte: the process ends quietly (status 0
/// or killed by SIGPIPE, as `cat` is), with nothing on stderr.
fn quiet_on_closed_pipe(args: &[&str]) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_slimpack"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("RUST_BACKTRACE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut byte = [0u8; 1];
    stdout.read_exact(&mut byte).unwrap();
    drop(stdout);
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.is_empty(), "{args:?}: {stderr}");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        let quiet = output.status.success() || output.status.signal() == Some(libc::SIGPIPE);
        assert!(quiet, "{args:?}: {:?}", output.status);
    }
}

#[test]
fn closed_stdout_pipe_exits_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let ir = dir.path().join("big.sir");
    // Far more than a pipe buffer holds, so that the writer meets the closed pipe.
    ok(&tiny(
        "tp=1,pp=1,dp=1",
        &[
            "--synthetic",
            "lognormal:median=64,sigma=1,count=20000",
            "--passes",
            "",
            "--emit",
            "ir",
            "-o",
            ir.to_str().unwrap(),
        ],
    ));
    assert!(std::fs::metadata(&ir).unwrap().len() > 1 << 20);
    quiet_on_closed_pipe(&["opt", ir.to_str().unwrap()]);
    quiet_on_closed_pipe(&["passes", "--verbose"]);
    quiet_on_closed_pipe(&["schema"]);
}

#[test]
fn synthetic_count_beyond_the_bound() {
    bad_input(
        &tiny(
            "tp=1",
            &[
                "--synthetic",
                "lognormal:median=3,sigma=1,count=1000000000000",
            ],
        ),
        &["count=1000000000000", "16777216 documents"],
    );
}

#[test]
fn context_cutting_beyond_the_sample_bound() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "long.txt", "4000000000\n");
    bad_input(
        &tiny("tp=1", &["--batch", &path, "--context", "1"]),
        &["long.txt", "more than 16777216 samples", "context 1"],
    );
}

#[test]
fn calibrate_tokens_beyond_memory() {
    bad_input(
        &["calibrate", "--backend", "cpu", "--tokens", "1000000000"],
        &["calibrate --tokens 1000000000", "needs about", "available"],
    );
}

#[test]
fn cpu_run_of_a_model_beyond_memory() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "70b.toml",
        "[model]\npreset = \"llama-70b\"\ndtype = \"fp32\"\n[cluster]\npreset = \"cpu\"\n[parallel]\ntp = 1\npp = 1\ndp = 1\n",
    );
    bad_input(
        &[
            "run",
            "--backend",
            "cpu",
            "--config",
            &config,
            "--batch",
            LENGTHS,
            "--strategy",
            "slimpack",
        ],
        &["run --backend cpu", "needs about", "available"],
    );
}

/// `run --backend cpu` of the tiny model on a batch of `lengths` (a lengths file's text) with
/// `strategy` and `extra` flags is refused with an error line holding `needles`.
fn cpu_run_refused(lengths: &str, strategy: &str, extra: &[&str], needles: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "lengths.txt", lengths);
    let mut flags = vec!["--backend", "cpu", "--batch", &path, "--strategy", strategy];
    flags.extend(extra);
    bad_input(&on_tiny("run", "tp=1,pp=1,dp=1", &flags), needles);
}

#[test]
fn cpu_run_of_a_huge_document_is_refused_up_front() {
    cpu_run_refused(
        "50000000\n",
        "slimpack",
        &[],
        &[
            "needs about",
            "GiB of memory by the simulator's estimate",
            "available",
        ],
    );
}

// ---- hangs and unbounded work ----

#[test]
fn worlds_beyond_the_bound() {
    bad_input(
        &tiny(
            "dp=1000000",
            &["--batch", LENGTHS, "--strategy", "slimpack"],
        ),
        &["--parallel", "1000000 devices", "at most 16384"],
    );
    bad_input(
        &tiny("tp=2,cp=1300,dp=1000", &["--batch", LENGTHS]),
        &["2600000 devices", "at most 16384"],
    );
}

#[test]
fn calibrate_thread_counts() {
    bad_input(
        &["calibrate", "--backend", "cpu", "--threads", "100000"],
        &["--threads 100000", "give 1 to"],
    );
    bad_input(
        &["calibrate", "--backend", "cpu", "--threads", "0"],
        &["--threads 0", "give 1 to"],
    );
}

#[test]
fn calibrate_min_seconds_not_finite() {
    for value in ["NaN", "inf", "1e9"] {
        bad_input(
            &["calibrate", "--backend", "cpu", "--min-seconds", value],
            &["--min-seconds", "from 0 to 3600"],
        );
    }
}

// ---- accepted silently before ----

#[test]
fn duplicate_parallel_degree() {
    bad_input(
        &tiny("tp=1,tp=2", &["--batch", LENGTHS]),
        &["--parallel", "degree 'tp' is given twice"],
    );
}

#[test]
fn empty_parallel_layout() {
    bad_input(
        &tiny("", &["--batch", LENGTHS]),
        &["--parallel", "empty layout"],
    );
    bad_input(
        &tiny(" , ", &["--batch", LENGTHS]),
        &["--parallel", "empty layout"],
    );
}

#[test]
fn duplicate_synthetic_key() {
    bad_input(
        &tiny(
            "tp=1",
            &["--synthetic", "lognormal:median=3,median=5,sigma=1,count=4"],
        ),
        &["--synthetic", "'median' is given twice"],
    );
}

#[test]
fn batch_with_synthetic() {
    bad_input(
        &tiny(
            "tp=1",
            &[
                "--batch",
                LENGTHS,
                "--synthetic",
                "lognormal:median=3,sigma=1,count=4",
            ],
        ),
        &["--batch", "--synthetic", "give one"],
    );
}

#[test]
fn bench_dataset_with_batch() {
    bad_input(
        &on_tiny(
            "bench",
            "tp=1,pp=1,dp=2",
            &["--dataset", LENGTHS, "--batch", LENGTHS],
        ),
        &["--dataset", "--batch", "give one"],
    );
}

#[test]
fn run_ir_with_model() {
    let dir = tempfile::tempdir().unwrap();
    let ir = dir.path().join("step.sir");
    ok(&tiny(
        "tp=1,pp=2,dp=2",
        &[
            "--batch",
            LENGTHS,
            "--emit",
            "ir",
            "-o",
            ir.to_str().unwrap(),
        ],
    ));
    bad_input(
        &[
            "run",
            "--backend",
            "cpu",
            "--ir",
            ir.to_str().unwrap(),
            "--model",
            "tiny",
        ],
        &["--model cannot be combined with --ir"],
    );
}

#[test]
fn print_ir_after_unknown_pass() {
    bad_input(
        &tiny(
            "tp=1",
            &["--batch", LENGTHS, "--print-ir-after", "frobnicate"],
        ),
        &["--print-ir-after", "unknown pass 'frobnicate'", "valid:"],
    );
    let dir = tempfile::tempdir().unwrap();
    let ir = dir.path().join("step.sir");
    ok(&tiny(
        "tp=1",
        &[
            "--batch",
            LENGTHS,
            "--passes",
            "",
            "--emit",
            "ir",
            "-o",
            ir.to_str().unwrap(),
        ],
    ));
    bad_input(
        &["opt", ir.to_str().unwrap(), "--print-ir-before", "slise"],
        &["--print-ir-before", "unknown pass 'slise'"],
    );
}

#[test]
fn world_not_a_multiple_of_the_node_is_accepted_and_said() {
    // The cpu preset has 2 devices per node: 3 devices fill 2 nodes, the last holding 1.
    let (_, stderr) = ok(&tiny(
        "tp=1,pp=1,dp=3",
        &["--batch", LENGTHS, "--passes", ""],
    ));
    assert!(
        stderr.contains("3 devices fill 2 nodes of 2 in rank order; the last node holds 1"),
        "{stderr}"
    );
    let (_, stderr) = ok(&tiny(
        "tp=1,pp=1,dp=4",
        &["--batch", LENGTHS, "--passes", ""],
    ));
    assert!(!stderr.contains("the last node holds"), "{stderr}");
}

#[test]
fn repeat_zero() {
    bad_input(
        &on_tiny(
            "run",
            "tp=1",
            &["--backend", "cpu", "--batch", LENGTHS, "--repeat", "0"],
        ),
        &["--repeat 0"],
    );
}

#[test]
fn bench_steps_beyond_the_bound() {
    bad_input(
        &on_tiny(
            "bench",
            "tp=1",
            &["--dataset", LENGTHS, "--steps", "1000000000"],
        ),
        &["--steps 1000000000", "give 1 to 100000"],
    );
}

// ---- silent loss of requested work ----

#[test]
fn wlb_reports_the_samples_it_delays() {
    let args = tiny(
        "tp=1,pp=1,dp=2",
        &[
            "--synthetic",
            "lognormal:median=300,sigma=1.5,count=512",
            "--strategy",
            "wlb",
        ],
    );
    let mut with_json = args.clone();
    with_json.extend(["--report", "json"]);
    let report = json(&ok(&with_json).0);
    let delayed = report["delayed_samples"].as_u64().unwrap();
    assert!(delayed > 0, "{report}");
    assert_eq!(report["samples"].as_u64().unwrap() + delayed, 512);
    let drawn = ok(&tiny(
        "tp=1,pp=1,dp=2",
        &[
            "--synthetic",
            "lognormal:median=300,sigma=1.5,count=512",
            "--passes",
            "",
            "--report",
            "json",
        ],
    ));
    let drawn = json(&drawn.0)["tokens"].as_u64().unwrap();
    let kept = report["tokens"].as_u64().unwrap();
    assert_eq!(kept + report["delayed_tokens"].as_u64().unwrap(), drawn);
    let (_, stderr) = ok(&args);
    assert!(
        stderr.contains(&format!("delayed to a later step: {delayed} samples")),
        "{stderr}"
    );
    // A strategy that delays nothing says nothing of it.
    let mut slimpack = tiny("tp=1,pp=1,dp=2", &["--batch", LENGTHS, "--report", "json"]);
    slimpack.extend(["--strategy", "slimpack"]);
    assert!(json(&ok(&slimpack).0).get("delayed_samples").is_none());
}

// ---- real corpora contain empty documents ----

#[test]
fn zero_length_documents_are_skipped_and_counted() {
    let (stdout, _) = ok(&tiny(
        "tp=1",
        &[
            "--batch",
            "tests/fixtures/zero-length.txt",
            "--passes",
            "",
            "--report",
            "json",
        ],
    ));
    assert_eq!(json(&stdout)["documents_empty"], 1);
    let (_, stderr) = ok(&tiny(
        "tp=1",
        &["--batch", "tests/fixtures/zero-length.txt", "--passes", ""],
    ));
    assert!(stderr.contains("1 empty skipped"), "{stderr}");
    let dir = tempfile::tempdir().unwrap();
    let only_zero = write(dir.path(), "zeros.txt", "0\n0\n");
    bad_input(
        &tiny("tp=1", &["--batch", &only_zero]),
        &["zeros.txt", "only zero-length documents (2)"],
    );
    let jsonl = write(
        dir.path(),
        "c.jsonl",
        "{\"text\": \"hello\"}\n{\"text\": \"\"}\n",
    );
    let (stdout, _) = ok(&tiny(
        "tp=1",
        &["--batch", &jsonl, "--passes", "", "--report", "json"],
    ));
    assert_eq!(json(&stdout)["documents_empty"], 1);
}

#[test]
fn shared_cpython_corpus_compiles() {
    let path = "../shared/data/cpython_stdlib.lengths.txt";
    if !Path::new(env!("CARGO_MANIFEST_DIR")).join(path).exists() {
        return; // a clone without ../shared: the fixture test above covers the rule
    }
    let (stdout, _) = ok(&tiny(
        "tp=1",
        &["--batch", path, "--passes", "", "--report", "json"],
    ));
    assert_eq!(json(&stdout)["documents_empty"], 28);
}

// ---- infeasible plans ----

#[test]
fn plan_beyond_device_memory_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let long = write(dir.path(), "long.txt", "2000000\n");
    let args = [
        "compile",
        "--model",
        "llama-70b",
        "--cluster",
        "h100-sxm",
        "--parallel",
        "tp=1,pp=1,dp=1",
        "--batch",
        &long,
    ];
    refused(
        3,
        &args,
        &[
            "does not fit device memory",
            "peaks at",
            "capacity 80.00 GiB",
            "--allow-oom",
        ],
    );
    // The weights alone: a small batch does not help.
    let mut weights = args;
    weights[8] = LENGTHS;
    refused(3, &weights, &["does not fit device memory"]);
    // An epoch plan of such steps is written whole, then exits 3 as compile does (it exited 0);
    // --allow-oom accepts it.
    let lines = dir.path().join("plan.jsonl");
    let lines = lines.to_str().unwrap();
    let mut plan = weights.to_vec();
    plan[0] = "plan";
    plan.extend(["--jsonl", lines]);
    let output = slimpack(&plan);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("error: 1 of the 1 steps do not fit device memory"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(lines).unwrap().lines().count(), 1);
    plan.push("--allow-oom");
    ok(&plan);
    let out = dir.path().join("oom.json");
    let mut allowed = weights.to_vec();
    allowed.extend(["--allow-oom", "--emit", "json", "-o", out.to_str().unwrap()]);
    let (_, stderr) = ok(&allowed);
    assert!(stderr.contains("OUT OF MEMORY"), "{stderr}");
    assert!(out.exists());
}

// ---- the default strategy ----

#[test]
fn compile_defaults_to_the_slimpack_strategy() {
    let report = json(
        &ok(&tiny(
            "tp=1,pp=2,dp=2",
            &["--batch", LENGTHS, "--report", "json"],
        ))
        .0,
    );
    assert_eq!(report["strategy"], "slimpack");
    assert_eq!(report["phase"], "lowered");
    assert!(report["step_time_s"].as_f64().unwrap() > 0.0);
    let logical = json(
        &ok(&tiny(
            "tp=1,pp=2,dp=2",
            &["--batch", LENGTHS, "--passes", "", "--report", "json"],
        ))
        .0,
    );
    assert_eq!(logical["phase"], "logical");
    assert!(logical.get("strategy").is_none());
    bad_input(
        &tiny(
            "tp=1",
            &[
                "--batch",
                LENGTHS,
                "--strategy",
                "wlb",
                "--passes",
                "slice{size=8}",
            ],
        ),
        &["--strategy wlb and --passes", "give one"],
    );
    bad_input(
        &tiny("tp=1", &["--batch", LENGTHS, "--passes", "", "--no-eqsat"]),
        &["--no-eqsat applies to --strategy slimpack"],
    );
}

// ---- bad input that was already handled ----

#[test]
fn already_handled_batch_options() {
    bad_input(
        &tiny("tp=1", &["--batch", LENGTHS, "--context", "0"]),
        &["--context", "positive"],
    );
    bad_input(
        &tiny("tp=1", &["--batch", LENGTHS, "--global-batch", "0"]),
        &["--global-batch", "positive"],
    );
    bad_input(
        &tiny(
            "tp=1",
            &[
                "--batch",
                LENGTHS,
                "--global-batch",
                "4",
                "--global-batch-tokens",
                "9",
            ],
        ),
        &["not both"],
    );
    bad_input(
        &tiny("tp=1", &["--synthetic", "zipf:count=3"]),
        &["unknown distribution 'zipf'"],
    );
    bad_input(
        &tiny(
            "tp=1",
            &["--synthetic", "lognormal:median=-1,sigma=1,count=3"],
        ),
        &["median must be a positive number"],
    );
    bad_input(
        &tiny("tp=1", &["--batch", LENGTHS, "--batch-format", "xml"]),
        &["--batch-format", "unknown value 'xml'"],
    );
    bad_input(&tiny("tp=1", &[]), &["no batch"]);
}

#[test]
fn already_handled_specs() {
    bad_input(
        &tiny("tp=1", &["--batch", LENGTHS, "--recompute", "sometimes"]),
        &["--recompute"],
    );
    bad_input(
        &tiny("tp=x", &["--batch", LENGTHS]),
        &["'x' is not a positive integer"],
    );
    bad_input(&tiny("tp=4", &["--batch", LENGTHS]), &["tp=4"]);
    bad_input(
        &["compile", "--config", "no/such.toml", "--batch", LENGTHS],
        &["no/such.toml"],
    );
    let dir = tempfile::tempdir().unwrap();
    let broken = write(dir.path(), "broken.toml", "[model\npreset = 3\n");
    bad_input(
        &["compile", "--config", &broken, "--batch", LENGTHS],
        &["broken.toml"],
    );
    let duplicate = write(
        dir.path(),
        "dup.toml",
        "[model]\npreset = \"tiny\"\npreset = \"tiny\"\n[cluster]\npreset = \"cpu\"\n[parallel]\ntp = 1\n",
    );
    bad_input(
        &["compile", "--config", &duplicate, "--batch", LENGTHS],
        &["dup.toml"],
    );
}

#[test]
fn already_handled_pipelines_and_outputs() {
    bad_input(
        &tiny("tp=1", &["--batch", LENGTHS, "--passes", "slice{size=8"]),
        &["slice{size=8"],
    );
    bad_input(
        &tiny("tp=1", &["--batch", LENGTHS, "--strategy", "best"]),
        &["--strategy", "best"],
    );
    bad_input(
        &tiny(
            "tp=1",
            &["--batch", LENGTHS, "--emit", "json", "--report", "json"],
        ),
        &["-o - and --report json would both write standard output"],
    );
    bad_input(
        &tiny(
            "tp=1",
            &["--batch", LENGTHS, "--passes", "", "--emit", "json"],
        ),
        &["needs a scheduled step"],
    );
    bad_input(
        &tiny(
            "tp=1",
            &["--batch", LENGTHS, "--strategy", "wlb", "--no-eqsat"],
        ),
        &["--no-eqsat applies to --strategy slimpack"],
    );
}

#[test]
fn already_handled_step_files() {
    let dir = tempfile::tempdir().unwrap();
    let not_json = write(dir.path(), "bad.json", "{\"format\": ");
    bad_input(&["simulate", &not_json], &["bad.json"]);
    let other = write(
        dir.path(),
        "other.json",
        "{\"format\": \"onnx\", \"version\": 1}",
    );
    bad_input(&["simulate", &other], &["not a slimpack schedule"]);
    let version = write(
        dir.path(),
        "v9.json",
        "{\"format\": \"slimpack.schedule\", \"version\": 9}",
    );
    bad_input(&["simulate", &version], &["version 9 is not supported"]);
    let ir = dir.path().join("logical.sir");
    ok(&tiny(
        "tp=1",
        &[
            "--batch",
            LENGTHS,
            "--passes",
            "",
            "--emit",
            "ir",
            "-o",
            ir.to_str().unwrap(),
        ],
    ));
    bad_input(
        &["simulate", ir.to_str().unwrap()],
        &["phase 'logical' has no schedule"],
    );
    bad_input(&["simulate", "no/such.json"], &["cannot read no/such.json"]);
    let binary = dir.path().join("binary.sir");
    std::fs::write(&binary, [0xff, 0xfe, 0x00, 0x01]).unwrap();
    bad_input(&["opt", binary.to_str().unwrap()], &["binary.sir"]);
}

#[test]
fn already_handled_backends() {
    // Without a GPU (always in CI) every cuda command is refused in one line; with one,
    // tests/cuda_gpu.rs runs them.
    if slimpack::gpu::gpus().is_err() {
        bad_input(
            &on_tiny(
                "run",
                "tp=1",
                &[
                    "--backend",
                    "cuda",
                    "--batch",
                    LENGTHS,
                    "--strategy",
                    "slimpack",
                ],
            ),
            &["--backend cuda: "],
        );
        bad_input(&["calibrate", "--backend", "cuda"], &["--backend cuda: "]);
        bad_input(&["validate", "--backend", "cuda"], &["--backend cuda: "]);
    }
    bad_input(
        &on_tiny("run", "tp=1", &["--backend", "cpu", "--batch", LENGTHS]),
        &["give --strategy NAME"],
    );
    bad_input(
        &["calibrate", "--backend", "cpu", "--tokens", "8,4"],
        &["strictly increasing"],
    );
}

#[test]
fn clap_usage_errors_keep_their_form() {
    let output = slimpack(&["compile", "--frobnicate"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("error: unexpected argument '--frobnicate'"),
        "{stderr}"
    );
    assert!(stderr.contains("Usage:"), "{stderr}");
    assert!(output.stdout.is_empty());
}

/// A recompute mode named in the config file's `[model]` is the user's choice, kept by the
/// tuning as `--recompute` is (it was read, then tuned over as if the preset's default); with
/// `--model`, which replaces the file's model, it is not.
#[test]
fn a_config_files_recompute_mode_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "c.toml",
        "[model]\npreset = \"tiny\"\nrecompute = \"full\"\n[cluster]\npreset = \"cpu\"\n\
         [parallel]\ntp = 1\npp = 2\ndp = 2\n",
    );
    let chosen = |extra: &[&str]| {
        let mut args = vec!["compile", "--config", &config, "--batch", LENGTHS];
        args.extend(extra);
        args.extend(["--report", "json"]);
        let (stdout, _) = ok(&args);
        json(&stdout)["candidate"].as_str().unwrap().to_string()
    };
    assert!(chosen(&[]).contains("recompute=full"), "{}", chosen(&[]));
    assert!(chosen(&["--recompute", "none"]).contains("recompute=none"));
    assert!(!chosen(&["--model", "tiny"]).contains("recompute=full"));
}

/// A step whose samples are all one token long has no target (a token predicts the next one
/// of its sample): `run` refuses it rather than report a loss of 0 and a reference check that
/// compared nothing.
#[test]
fn a_step_without_target_tokens_is_not_run() {
    cpu_run_refused(
        "1\n1\n1\n",
        "megatron",
        &["--check-reference"],
        &["no target token", "3 samples"],
    );
}

/// Block recomputation of more layers than a stage holds is refused (it ran as `full` under
/// the label `block:K`), as the verifier refuses a stage's own.
#[test]
fn block_recomputation_of_more_layers_than_a_stage_is_refused() {
    // tiny: 4 layers, 2 per stage at pp=2.
    bad_input(
        &tiny(
            "tp=1,pp=2,dp=1",
            &["--batch", LENGTHS, "--recompute", "block:3"],
        ),
        &["recompute block:3", "2 layers", "recompute=full"],
    );
    ok(&tiny(
        "tp=1,pp=2,dp=1",
        &["--batch", LENGTHS, "--recompute", "block:2"],
    ));
}

/// A negative number is a flag's invalid value, named as such, not an unknown flag `-5`.
#[test]
fn negative_numbers_are_invalid_values_of_their_flag() {
    for (flag, value) in [
        ("--context", "-5"),
        ("--global-batch", "-1"),
        ("--step", "-2"),
    ] {
        let mut args = tiny("tp=1,pp=1,dp=1", &[]);
        args.extend([flag, value]);
        let output = slimpack(&args);
        assert_eq!(output.status.code(), Some(2), "{flag} {value}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.starts_with(&format!("error: invalid value '{value}' for '{flag}")),
            "{stderr}"
        );
    }
}

/// Consumers that run one recomputation mode per step refuse a step whose stages carry their
/// own (`assign-recompute`): `--emit mlir` and the runtimes, each with one line.
#[test]
fn per_stage_recomputation_where_one_mode_runs() {
    // llama-7b at tp=1, pp=4 holds too much on its first stages to keep every activation.
    bad_input(
        &[
            "compile",
            "--model",
            "llama-7b",
            "--cluster",
            "h100-sxm",
            "--parallel",
            "tp=1,pp=4,dp=1",
            "--context",
            "32768",
            "--synthetic",
            "lognormal:median=16384,sigma=0.3,count=16,max=32768",
            "--recompute",
            "full",
            "--passes",
            "assign-dp,pack-symmetric,schedule-pipeline,assign-recompute",
            "--allow-oom",
            "--emit",
            "mlir",
        ],
        &[
            "--emit mlir runs one recomputation mode per step",
            "assign-recompute",
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let ir = dir.path().join("step.sir");
    let (text, _) = ok(&tiny(
        "tp=1,pp=2,dp=2",
        &["--batch", LENGTHS, "--emit", "ir"],
    ));
    let edited = text.replacen(
        "%st0 = stage layers=0..2",
        "%st0 = stage layers=0..2 recompute=block:1",
        1,
    );
    assert_ne!(
        edited, text,
        "the tiny step has a first stage of two layers"
    );
    std::fs::write(&ir, edited).unwrap();
    refused(
        2,
        &["run", "--backend", "cpu", "--ir", ir.to_str().unwrap()],
        &["packs of stage 0 of the step recompute with recompute=block:1"],
    );
}

/// What the tuning verifies: `--verify-candidates` with `--passes` (which verifies every pass
/// anyway) is refused, with `--no-verify` contradicts it; with a strategy, every candidate's
/// step is verified and the choice is the default's.
#[test]
fn verify_candidates_applies_to_a_strategy_only() {
    let batch = ["--batch", LENGTHS, "--report", "json"];
    let with = |extra: &[&'static str]| {
        let mut args = tiny("tp=1,pp=2,dp=2", &batch);
        args.extend_from_slice(extra);
        args
    };
    bad_input(
        &with(&["--passes", "assign-dp", "--verify-candidates"]),
        &["--verify-candidates", "--passes"],
    );
    let contradiction = slimpack(&with(&["--verify-candidates", "--no-verify"]));
    assert_eq!(contradiction.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&contradiction.stderr).contains("cannot be used with"));
    let (every, _) = ok(&with(&["--strategy", "slimpack", "--verify-candidates"]));
    let (chosen, _) = ok(&with(&["--strategy", "slimpack"]));
    let (every, chosen) = (json(&every), json(&chosen));
    assert_eq!(every["candidate"], chosen["candidate"]);
    assert_eq!(every["step_time_s"], chosen["step_time_s"]);
}

/// `-o -` is standard output, as for Unix tools: it used to create a file named `-` (in the
/// working directory, here the repository). With `--report json` on stdout too, the emitted
/// form and the report would mix, so that is refused as it is without `-o`.
#[test]
fn dash_output_is_standard_output() {
    let (stdout, _) = ok(&["schema", "-o", "-"]);
    json(&stdout);
    let mut args = tiny(
        "tp=1,pp=1,dp=1",
        &["--batch", LENGTHS, "--emit", "json", "-o", "-"],
    );
    let (stdout, _) = ok(&args);
    assert_eq!(json(&stdout)["format"], "slimpack.schedule");
    args.extend(["--report", "json"]);
    bad_input(&args, &["-o - and --report json", "standard output"]);
    let dash = Path::new(env!("CARGO_MANIFEST_DIR")).join("-");
    assert!(!dash.exists(), "a file named - was written");
}

// ---- found by a hostile session (stop 26) ----

/// An output that names an input is refused before any work, and the input is intact: `-o
/// in.txt` beside `--batch in.txt` used to replace the dataset with the step.
#[test]
fn an_output_never_overwrites_an_input() {
    let dir = tempfile::tempdir().unwrap();
    let original = std::fs::read_to_string(LENGTHS).unwrap();
    let input = write(dir.path(), "in.txt", &original);
    let same = format!("{}/./in.txt", dir.path().display());
    bad_input(
        &[
            "lengths",
            "--batch",
            &input,
            "--context",
            "100",
            "-o",
            &same,
        ],
        &["-o", "--batch file"],
    );
    bad_input(
        &tiny("tp=1", &["--batch", &input, "--emit", "json", "-o", &input]),
        &["-o", "--batch file"],
    );
    bad_input(
        &tiny("tp=1", &["--batch", &input, "--trace", &input]),
        &["--trace", "--batch file"],
    );
    let out = dir.path().join("o.json");
    let out = out.to_str().unwrap();
    bad_input(
        &tiny("tp=1", &["--batch", &input, "-o", out, "--trace", out]),
        &["--trace", "-o writes that file too"],
    );
    assert_eq!(std::fs::read_to_string(&input).unwrap(), original);
    assert!(!Path::new(out).exists());
}

/// Counts that would allocate or spawn without bound are refused with the range.
#[test]
fn counts_beyond_the_bound() {
    let huge = "18446744073709551615";
    bad_input(
        &on_tiny(
            "plan",
            "tp=1",
            &[
                "--batch",
                LENGTHS,
                "--threads",
                huge,
                "--jsonl",
                "/dev/null",
            ],
        ),
        &["--threads", "give 1 to"],
    );
    bad_input(
        &on_tiny(
            "run",
            "tp=1",
            &["--backend", "cpu", "--batch", LENGTHS, "--repeat", huge],
        ),
        &["--repeat", "give 1 to 100000"],
    );
    bad_input(
        &tiny("tp=1", &["--batch", LENGTHS, "--step", huge]),
        &["--step", "the epoch has 1 step "],
    );
}

/// A model with as many layers as a u32 holds: the recomputation search's midpoint overflowed
/// and it never ended; such a model is now refused by its size. The most layers the tiny
/// model's widths allow end too, with the plan that does not fit.
#[test]
fn the_most_layers_a_model_can_name() {
    let dir = tempfile::tempdir().unwrap();
    let lengths = Path::new(env!("CARGO_MANIFEST_DIR")).join(LENGTHS);
    let config = |layers: u32| {
        write(
            dir.path(),
            &format!("layers-{layers}.toml"),
            &format!(
                "[model]\npreset = \"tiny\"\nlayers = {layers}\n[cluster]\npreset = \"cpu\"\n\
                 [parallel]\ntp = 1\npp = 1\ndp = 1\n[batch]\nfile = \"{}\"\n",
                lengths.display()
            ),
        )
    };
    bad_input(
        &["compile", "--config", &config(u32::MAX)],
        &["layers must be at most 65536"],
    );
    refused(3, &["compile", "--config", &config(32768)], &["memory"]);
}

/// A schedule JSON streamed to a full device (`compile --emit json`, which writes through a
/// buffer as it serialises, not one string at the end): an error line naming where, exit 2,
/// whether that is standard output or `-o`.
#[test]
fn a_streamed_schedule_on_a_full_device_is_an_error_line() {
    let Ok(full) = std::fs::File::create("/dev/full") else {
        return; // not on Linux
    };
    let compile = tiny("tp=1,pp=1,dp=1", &["--batch", LENGTHS, "--emit", "json"]);
    for (output, expected) in [
        (
            None,
            "error: cannot write to standard output: No space left on device",
        ),
        (
            Some("/dev/full"),
            "error: cannot write /dev/full: No space left on device",
        ),
    ] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_slimpack"));
        command.args(&compile).env_remove("RUST_BACKTRACE");
        match output {
            Some(path) => command.args(["-o", path]),
            None => command.stdout(Stdio::from(full.try_clone().unwrap())),
        };
        let output = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
        assert_eq!(errors.len(), 1, "{stderr}");
        assert!(errors[0].starts_with(expected), "{stderr}");
    }
}

/// Standard output on a full device is an error line and exit 2, from every subcommand (the
/// print macros' panic used to be reported as a bug in slimpack), with `RUST_BACKTRACE` set or
/// not (set, it used to show as the standard library's panic and a backtrace).
#[test]
fn a_full_standard_output_is_an_error_not_a_bug() {
    for backtrace in [None, Some("0"), Some("1")] {
        let Ok(full) = std::fs::File::create("/dev/full") else {
            return; // not on Linux
        };
        let mut command = Command::new(env!("CARGO_BIN_EXE_slimpack"));
        command.args(["passes"]).stdout(Stdio::from(full));
        match backtrace {
            Some(value) => command.env("RUST_BACKTRACE", value),
            None => command.env_remove("RUST_BACKTRACE"),
        };
        let output = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{backtrace:?}: {stderr}");
        assert!(
            stderr.starts_with("error: cannot write to standard output"),
            "{backtrace:?}: {stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "{backtrace:?}: {stderr}");
    }
}

/// Standard output closed before the process starts (`>&-`), or open for reading only
/// (`1<file`): Rust's standard library takes every write to a closed descriptor, and every
/// write failing with `EBADF`, as done, so the output was lost and the exit status 0. Now the
/// first write to it is an error line and exit 2 (the file read from is left as it was); a
/// command that writes only files runs.
#[test]
fn an_unwritable_standard_output_is_an_error_not_lost_output() {
    if !cfg!(target_os = "linux") {
        return; // seen before the standard library's start-up, on Linux only
    }
    let dir = tempfile::tempdir().unwrap();
    let readable = write(dir.path(), "readable.txt", "kept\n");
    let run = |args: &str, redirect: &str| {
        Command::new("sh")
            .args([
                "-c",
                &format!("exec \"$0\" {args} {redirect}"),
                env!("CARGO_BIN_EXE_slimpack"),
            ])
            .env_remove("RUST_BACKTRACE")
            .output()
            .unwrap()
    };
    let read_only = format!("1<{readable}");
    for (redirect, why) in [
        (">&-", "closed"),
        (read_only.as_str(), "open for reading only"),
    ] {
        for args in ["passes", "schema"] {
            let output = run(args, redirect);
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(2), "{args} {redirect}: {stderr}");
            assert_eq!(
                stderr.trim_end(),
                format!("error: cannot write to standard output: it is {why}"),
                "{args} {redirect}"
            );
        }
    }
    assert_eq!(std::fs::read_to_string(&readable).unwrap(), "kept\n");
    let out = dir.path().join("step.sir");
    let output = run(
        &format!(
            "compile --model tiny --cluster cpu --parallel tp=1,pp=1,dp=1 --batch {LENGTHS} -o {}",
            out.display()
        ),
        ">&-",
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(out.exists());
}

/// An error repeats at most 40 characters of a bad value: a 10 MB token used to make a 10 MB
/// "one-line" error.
#[test]
fn an_error_line_stays_short_whatever_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let huge = write(dir.path(), "huge.sir", &"x".repeat(10_000_000));
    let output = slimpack(&["simulate", &huge]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.len() < 1000, "{} bytes of error", stderr.len());
    assert!(
        stderr.contains("'xxxx") && stderr.contains("...'"),
        "{stderr}"
    );
}

/// The e-graph's limits are bounded: `eqsat{nodes=10000000}` grew past 9 GB on a tiny step.
#[test]
fn eqsat_limits_beyond_the_bound() {
    bad_input(
        &tiny(
            "tp=1,pp=2,dp=2",
            &[
                "--batch",
                LENGTHS,
                "--passes",
                "slice{size=2048},assign-dp,pack-fwd,pack-bwd,eqsat{nodes=10000000}",
            ],
        ),
        &["eqsat", "nodes=10000000", "expected 1 to 1000000"],
    );
}

/// A bench whose every strategy is inapplicable to the layout ran nothing and exited 0.
#[test]
fn a_bench_with_nothing_to_run() {
    bad_input(
        &on_tiny(
            "bench",
            "tp=1,pp=2,dp=1",
            &["--dataset", LENGTHS, "--strategies", "hybrid-cp"],
        ),
        &["--strategies hybrid-cp", "none applies", "needs pp=1"],
    );
}

/// `-` is standard output for every output flag, and two outputs there are refused: `--trace
/// -` and `bench --json -` used to create a file named `-`.
#[test]
fn every_output_flag_takes_dash_for_standard_output() {
    let (stdout, _) = ok(&tiny("tp=1", &["--batch", LENGTHS, "--trace", "-"]));
    assert!(json(&stdout)["traceEvents"].is_array(), "{stdout}");
    bad_input(
        &tiny(
            "tp=1",
            &["--batch", LENGTHS, "--trace", "-", "--report", "json"],
        ),
        &["--trace - and --report json would both write standard output"],
    );
    bad_input(
        &on_tiny("bench", "tp=1", &["--dataset", LENGTHS, "--json", "-"]),
        &["--json - and the report would both write standard output"],
    );
    let dash = Path::new(env!("CARGO_MANIFEST_DIR")).join("-");
    assert!(!dash.exists(), "a file named - was written");
}

/// The same for a value the parser reads whole, past the lexer: a 1 MB number in a step file.
#[test]
fn an_error_line_stays_short_for_a_huge_number() {
    let dir = tempfile::tempdir().unwrap();
    let (step, _) = ok(&tiny(
        "tp=1",
        &["--batch", LENGTHS, "--passes", "", "--emit", "ir"],
    ));
    let huge = step.replacen("len=1200", &format!("len={}", "9".repeat(1_000_000)), 1);
    let path = write(dir.path(), "huge-number.sir", &huge);
    let output = slimpack(&["opt", &path, "--passes", ""]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.len() < 1000, "{} bytes of error", stderr.len());
    assert!(stderr.contains("9999..."), "{stderr}");
}

/// bench's two modes take different flags: each refuses the other's instead of ignoring it
/// (`bench --planning --steps 5` planned as if --steps were not there).
#[test]
fn bench_flags_of_the_other_mode() {
    let bench = |extra: &[&'static str]| {
        let mut args = vec![
            "bench",
            "--model",
            "tiny",
            "--cluster",
            "cpu",
            "--parallel",
            "tp=1",
            "--dataset",
            LENGTHS,
        ];
        args.extend_from_slice(extra);
        args
    };
    bad_input(
        &bench(&["--planning", "--steps", "5"]),
        &["--steps applies to the side-by-side run, not to --planning"],
    );
    bad_input(
        &bench(&["--planning", "--drain"]),
        &["--drain applies to the side-by-side run"],
    );
    bad_input(
        &bench(&["--planning-sizes", "100"]),
        &["--planning-sizes applies to --planning"],
    );
}

// ---- found by a hostile run of this session ----

/// Model sizes past any real model overflowed the memory model's 64-bit byte counts, and the
/// simulator stopped on its own invariant (exit 1, "a task frees more bytes than held").
#[test]
fn absurd_model_sizes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = |name: &str, model: &str| {
        let lengths = std::fs::canonicalize(LENGTHS).unwrap();
        write(
            dir.path(),
            name,
            &format!(
                "[model]\npreset = \"tiny\"\n{model}\n[cluster]\npreset = \"cpu\"\n\
                 [parallel]\ntp = 1\npp = 1\ndp = 1\n[batch]\nfile = \"{}\"\n",
                lengths.display()
            ),
        )
    };
    let huge = config("huge.toml", "layers = 4294967295\nhidden = 4294967295");
    bad_input(
        &["compile", "--config", &huge],
        &["layers must be at most 65536"],
    );
    let wide = config("wide.toml", "layers = 8\nhidden = 1048576\nffn = 4194304");
    bad_input(
        &["compile", "--config", &wide],
        &["must be at most 33554432"],
    );
}

/// A rate so slow that step times overflow to infinity made the list scheduler stop on its
/// own invariant (exit 1); infinite and NaN step times were reported for others.
#[test]
fn rates_below_one_per_second_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let lengths = std::fs::canonicalize(LENGTHS).unwrap();
    let config = write(
        dir.path(),
        "slow.toml",
        &format!(
            "[model]\npreset = \"llama-7b\"\n[cluster]\npreset = \"h100-sxm\"\n\
             [cluster.gpu]\npeak_flops = 1e-300\n[parallel]\ntp = 8\npp = 2\ndp = 2\n\
             [batch]\nfile = \"{}\"\n",
            lengths.display()
        ),
    );
    bad_input(
        &["compile", "--config", &config],
        &["gpu.peak_flops must be a number of at least 1", "1e-300"],
    );
}

/// An output path that is a directory was found only when written, at the end, after the
/// other outputs (`--trace`, `--timeline`) had replaced the user's files: it is refused before
/// any work, and those files are left as they were.
#[test]
fn an_output_that_is_a_directory_is_refused_before_any_other_output_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let kept = write(dir.path(), "keep.json", "precious\n");
    let out_dir = dir.path().join("outdir");
    std::fs::create_dir(&out_dir).unwrap();
    let out_dir = out_dir.to_str().unwrap();
    for (flag, value) in [("-o", out_dir), ("--timeline", out_dir)] {
        let args = tiny(
            "tp=1,pp=1,dp=1",
            &[
                "--batch", LENGTHS, "--emit", "json", "--trace", &kept, flag, value,
            ],
        );
        bad_input(&args, &[&format!("{flag} {value}: is a directory")]);
        assert_eq!(std::fs::read_to_string(&kept).unwrap(), "precious\n");
    }
}

/// A link latency near f64's range made step times sum to infinity and the report's ratios
/// NaN, with exit 0: latencies above a minute are refused.
#[test]
fn latencies_above_a_minute_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let lengths = std::fs::canonicalize(LENGTHS).unwrap();
    for (link, latency) in [("intra_node", "1e308"), ("inter_node", "61.0")] {
        let config = write(
            dir.path(),
            "late.toml",
            &format!(
                "[model]\npreset = \"tiny\"\n[cluster]\npreset = \"cpu\"\n\
                 {link} = {{ latency = {latency} }}\n[parallel]\ntp = 1\npp = 2\ndp = 1\n\
                 [batch]\nfile = \"{}\"\n",
                lengths.display()
            ),
        );
        bad_input(
            &["compile", "--config", &config],
            &[&format!(
                "{link}.latency must be a number of seconds from 0 to 60"
            )],
        );
    }
}

/// Samples whose slices, several in one pack, attend to more keys than the 32-bit varlen
/// offsets hold: the slimpack strategy's own sliced candidates failed its verifier, so the
/// whole compile failed (exit 2) where no plan fits memory (exit 3).
#[test]
fn a_sample_near_the_token_limit_is_planned_without_slices() {
    let dir = tempfile::tempdir().unwrap();
    for (name, length) in [("big.txt", "4294967295"), ("half.txt", "1500000000")] {
        let lengths = write(dir.path(), name, &format!("{length}\n"));
        refused(
            3,
            &tiny("tp=1,pp=1,dp=1", &["--batch", &lengths]),
            &["does not fit device memory"],
        );
    }
}

/// `opt --no-verify` let a broken step file reach the passes, which stopped on their own
/// invariants (exit 1); the file is verified whatever the flag.
#[test]
fn no_verify_still_verifies_the_file_opt_reads() {
    let dir = tempfile::tempdir().unwrap();
    let packed = dir.path().join("packed.sir");
    ok(&tiny(
        "tp=1,pp=2,dp=4",
        &[
            "--batch",
            LENGTHS,
            "--passes",
            "assign-dp,slice{size=1000},pack-fwd,pack-bwd",
            "--emit",
            "ir",
            "-o",
            packed.to_str().unwrap(),
        ],
    ));
    let text = std::fs::read_to_string(&packed).unwrap();
    // One slice named twice in the forward packs.
    let line = text
        .lines()
        .find(|l| l.contains(" fwd ") && l.contains(", "))
        .expect("a forward pack of two slices");
    let members = &line[line.find('[').unwrap() + 1..line.find(']').unwrap()];
    let first = members.split(", ").next().unwrap();
    let broken_line = line.replace(members, &format!("{first}, {first}"));
    let broken = write(dir.path(), "broken.sir", &text.replace(line, &broken_line));
    bad_input(
        &["opt", &broken, "--no-verify", "--passes", "eqsat"],
        &["verifier"],
    );
}

/// Outputs that would overwrite an input or each other, found by name: the lengths file a
/// config names, a step file `plan --out-dir` would replace or remove, a dump, and
/// `/dev/stdout` beside the JSON report. Each is refused before any work; the input is intact.
#[test]
fn outputs_that_would_overwrite_inputs_by_other_names() {
    let dir = tempfile::tempdir().unwrap();
    let lengths = std::fs::read_to_string(LENGTHS).unwrap();
    let data = write(dir.path(), "data.txt", &lengths);
    let config = write(
        dir.path(),
        "job.toml",
        "[model]\npreset = \"tiny\"\n[cluster]\npreset = \"cpu\"\n[parallel]\ntp = 1\npp = 2\n\
         dp = 2\n[batch]\nfile = \"data.txt\"\n",
    );
    bad_input(
        &["compile", "--config", &config, "--emit", "ir", "-o", &data],
        &["the --config [batch] file"],
    );
    bad_input(
        &["plan", "--config", &config, "--jsonl", &data],
        &["the --config [batch] file"],
    );
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let step = write(&out, "step-000002.json", &lengths);
    let plan = [
        "plan",
        "--model",
        "tiny",
        "--cluster",
        "cpu",
        "--parallel",
        "tp=1,pp=1,dp=2",
        "--strategy",
        "megatron",
        "--global-batch",
        "4",
        "--steps",
        "1",
        "--batch",
        &step,
        "--out-dir",
        out.to_str().unwrap(),
    ];
    bad_input(&plan, &["--out-dir", "writes files of that name"]);
    let dumps = dir.path().join("dumps");
    std::fs::create_dir(&dumps).unwrap();
    let dumped = dumps.join("00-input.sir");
    bad_input(
        &tiny(
            "tp=1,pp=2,dp=2",
            &[
                "--batch",
                LENGTHS,
                "--dump-dir",
                dumps.to_str().unwrap(),
                "-o",
                dumped.to_str().unwrap(),
            ],
        ),
        &["--dump-dir", "writes files of that name"],
    );
    bad_input(
        &tiny(
            "tp=1,pp=2,dp=2",
            &[
                "--batch",
                LENGTHS,
                "--emit",
                "ir",
                "-o",
                "/dev/stdout",
                "--report",
                "json",
            ],
        ),
        &["-o /dev/stdout and --report json would both write standard output"],
    );
    assert_eq!(std::fs::read_to_string(&data).unwrap(), lengths);
    assert_eq!(std::fs::read_to_string(&step).unwrap(), lengths);
}

/// Control characters of a bad value were echoed raw: an escape sequence restyled the
/// terminal. They are shown escaped.
#[test]
fn control_characters_in_a_bad_value_are_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let lengths = write(dir.path(), "ansi.txt", "100\n\u{1b}[31mRED\u{1b}[0m\n");
    let output = slimpack(&tiny("tp=1,pp=2,dp=2", &["--batch", &lengths]));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
    assert!(stderr.contains("\\u{1b}[31mRED"), "{stderr}");
}

/// A plan refused for memory (exit 3) wrote its --timeline all the same, over whatever the
/// file held; it writes nothing now, as it writes no step.
#[test]
fn a_refused_plan_writes_no_pictures() {
    let dir = tempfile::tempdir().unwrap();
    let lengths = write(dir.path(), "big.txt", "100000000\n");
    let timeline = write(dir.path(), "keep.svg", "keep");
    refused(
        3,
        &tiny(
            "tp=1,pp=2,dp=2",
            &["--batch", &lengths, "--timeline", &timeline],
        ),
        &["does not fit device memory"],
    );
    assert_eq!(std::fs::read_to_string(&timeline).unwrap(), "keep");
}

/// `--synthetic` without a parameter its distribution needs was reported in the config
/// table's terms (`[batch] synthetic: dist = "lognormal" needs median`), or as "count must
/// be at least 1, got 0" for a count never given.
#[test]
fn synthetic_flag_errors_speak_of_the_flag() {
    bad_input(
        &tiny("tp=1,pp=1,dp=1", &["--synthetic", "lognormal:count=5"]),
        &["--synthetic 'lognormal:count=5': lognormal needs median, sigma"],
    );
    bad_input(
        &tiny(
            "tp=1,pp=1,dp=1",
            &["--synthetic", "lognormal:median=10,sigma=1"],
        ),
        &["lognormal needs count"],
    );
    bad_input(
        &tiny(
            "tp=1,pp=1,dp=1",
            &["--synthetic", "lognormal:median=10,sigma=1,shape=2,count=3"],
        ),
        &["--synthetic: lognormal takes median and sigma, not shape"],
    );
}

/// A step file given with the other format's flag was reported as the other parser's
/// syntax error; unsorted `--planning-sizes` printed growth against the wrong row; `schema -o`
/// into a missing directory did not name the flag.
#[test]
fn misdirected_files_and_sizes_are_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let ir = dir.path().join("step.sir");
    let json = dir.path().join("step.json");
    for (emit, path) in [("ir", &ir), ("json", &json)] {
        ok(&tiny(
            "tp=1,pp=1,dp=1",
            &[
                "--batch",
                LENGTHS,
                "--strategy",
                "megatron",
                "--emit",
                emit,
                "-o",
                path.to_str().unwrap(),
            ],
        ));
    }
    bad_input(
        &[
            "run",
            "--backend",
            "cpu",
            "--schedule",
            ir.to_str().unwrap(),
        ],
        &["this is step IR (text); give it with --ir"],
    );
    bad_input(
        &["run", "--backend", "cpu", "--ir", json.to_str().unwrap()],
        &["this is schedule JSON; give it with --schedule"],
    );
    let mut sizes = tiny("tp=1,pp=1,dp=1", &["--batch", LENGTHS]);
    sizes[0] = "bench";
    sizes.extend(["--planning", "--planning-sizes", "100,10"]);
    bad_input(&sizes, &["give increasing sample counts", "100 then 10"]);
    bad_input(
        &["schema", "-o", "/nonexistent/schema.json"],
        &["-o /nonexistent/schema.json", "does not exist"],
    );
}

/// A cap below the longest unsliced sample: pack-fwd put that sample in a pack over the cap,
/// which the verifier refused with a message about the IR, and `--no-verify` let through as
/// a schedule (exit 0). The pass now says what to do, verifier or not.
#[test]
fn a_cap_below_the_longest_unsliced_sample_is_refused_by_the_packer() {
    for verify in [None, Some("--no-verify")] {
        let mut extra = vec![
            "--batch",
            LENGTHS,
            "--passes",
            "assign-dp,pack-fwd{cap=4096}",
        ];
        extra.extend(verify);
        bad_input(
            &tiny("tp=1,pp=1,dp=1", &extra),
            &[
                "pass 'pack-fwd'",
                "a slice of 17000 tokens is longer than the cap of 4096 tokens",
                "slice{size=4096}",
            ],
        );
    }
}

/// A tuning budget stops starting candidates once one fits the memory limit, not before: a
/// budget of 0 ms on a step that fits only with recomputation is not reported as not fitting
/// (it was, exit 3, after the one candidate it tried).
#[test]
fn a_tuning_budget_does_not_turn_a_fitting_step_into_one_that_does_not_fit() {
    let args = [
        "compile",
        "--model",
        "llama-7b",
        "--cluster",
        "h100-sxm",
        "--parallel",
        "tp=4,pp=1,dp=2",
        "--synthetic",
        "lognormal:median=32768,sigma=1,count=16",
        "--tune-budget-ms",
        "0",
    ];
    let (_, stderr) = ok(&args);
    assert!(stderr.contains("simulated step"), "{stderr}");
}

/// `compile --strategy wlb --step N` compiles the samples `plan`'s step N trains: the
/// documents wlb delayed in steps 1..N-1 are carried into its outlier queues (step 2 used to
/// admit from a fresh state, and trained other samples, or none).
#[test]
fn compile_step_n_of_a_delaying_strategy_is_plans_step_n() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("plan");
    let common = [
        "--batch",
        "../shared/data/wlbllm_like.lengths.txt",
        "--context",
        "8192",
        "--global-batch",
        "16",
        "--strategy",
        "wlb",
    ];
    if !Path::new(common[1]).exists() {
        return;
    }
    let mut plan = on_tiny("plan", "tp=1,pp=2,dp=2", &common);
    plan.extend(["--steps", "4", "--out-dir", out.to_str().unwrap()]);
    ok(&plan);
    let samples = |schedule: &serde_json::Value| -> Vec<u64> {
        let mut lengths: Vec<u64> = schedule["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["len"].as_u64().unwrap())
            .collect();
        lengths.sort_unstable();
        lengths
    };
    for step in ["2", "4"] {
        let planned: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out.join(format!("step-{:0>6}.json", step))).unwrap(),
        )
        .unwrap();
        let mut compile = tiny("tp=1,pp=2,dp=2", &common);
        compile.extend(["--step", step, "--emit", "json"]);
        let (stdout, _) = ok(&compile);
        assert_eq!(samples(&json(&stdout)), samples(&planned), "step {step}");
    }
}

/// Small messages that misled: a file where a directory is meant, a pass name with a
/// non-ASCII letter, a bad `order`, schedule JSON given to `opt`, a JSON length that is a
/// string.
#[test]
fn misleading_messages_say_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "lengths.txt", "100\n200\n");
    let inside = format!("{file}/step.sir");
    bad_input(
        &tiny("tp=1,pp=1,dp=1", &["--batch", &file, "-o", &inside]),
        &["is a file, not a directory"],
    );
    bad_input(
        &tiny(
            "tp=1,pp=1,dp=1",
            &["--batch", &file, "--passes", "assign-dp,slicé{size=8}"],
        ),
        &["'slicé' is not a pass name"],
    );
    bad_input(
        &tiny(
            "tp=1,pp=1,dp=1",
            &[
                "--batch",
                &file,
                "--passes",
                "assign-dp,pack-symmetric,schedule-pipeline{order=bogus}",
            ],
        ),
        &["expected auto or 1f1b"],
    );
    let schedule = dir.path().join("step.json");
    std::fs::write(
        &schedule,
        serde_json::to_string(&schedule_json(dir.path())).unwrap(),
    )
    .unwrap();
    bad_input(
        &["opt", schedule.to_str().unwrap(), "--passes", ""],
        &["this is schedule JSON"],
    );
    let jsonl = write(dir.path(), "d.jsonl", "{\"length\": \"5\"}\n");
    bad_input(
        &tiny("tp=1,pp=1,dp=1", &["--batch", &jsonl]),
        &["length '5' is a string, not a number"],
    );
}

/// An IR file an editor saved with a byte-order mark parses as the same file without it.
#[test]
fn ir_text_with_a_byte_order_mark_parses() {
    let dir = tempfile::tempdir().unwrap();
    let ir = dir.path().join("step.sir");
    ok(&tiny(
        "tp=1,pp=1,dp=1",
        &[
            "--batch",
            LENGTHS,
            "--context",
            "4096",
            "-o",
            ir.to_str().unwrap(),
        ],
    ));
    let text = std::fs::read_to_string(&ir).unwrap();
    let marked = write(dir.path(), "marked.sir", &format!("\u{feff}{text}"));
    let (plain, _) = ok(&["opt", ir.to_str().unwrap(), "--passes", ""]);
    let (with_mark, _) = ok(&["opt", &marked, "--passes", ""]);
    assert_eq!(plain, with_mark);
}

/// An explicit `vpp=1` is kept: megatron's tuning tries two model chunks per device only
/// where the layout leaves `vpp` open.
#[test]
fn an_explicit_vpp_is_kept_by_tuning() {
    let chosen = |parallel: &str| {
        let (stdout, _) = ok(&on_tiny(
            "compile",
            parallel,
            &[
                "--batch",
                LENGTHS,
                "--context",
                "4096",
                "--strategy",
                "megatron",
                "--report",
                "json",
            ],
        ));
        let report = json(&stdout);
        let field = |key: &str| report[key].as_str().unwrap().to_string();
        (field("candidate"), field("parallel"))
    };
    // Left open, megatron's tuning tries (and here takes) two chunks per device.
    let (candidate, parallel) = chosen("tp=1,pp=2,dp=1");
    assert!(
        candidate.starts_with("vpp=2,") && parallel.contains("vpp=2"),
        "{candidate} {parallel}"
    );
    let (candidate, parallel) = chosen("tp=1,pp=2,vpp=1,dp=1");
    assert!(
        !candidate.contains("vpp=") && !parallel.contains("vpp"),
        "{candidate} {parallel}"
    );
}

/// `calibrate --cluster` with a name that is no preset says so, before saying that the cpu
/// backend calibrates only the cpu preset.
#[test]
fn calibrate_names_an_unknown_cluster_as_unknown() {
    bad_input(
        &["calibrate", "--backend", "cpu", "--cluster", "bogus"],
        &["--cluster", "bogus"],
    );
    let output = slimpack(&["calibrate", "--backend", "cpu", "--cluster", "bogus"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("calibrates the cpu preset"), "{stderr}");
    bad_input(
        &["calibrate", "--backend", "cpu", "--cluster", "h100-sxm"],
        &["calibrates the cpu preset"],
    );
}
