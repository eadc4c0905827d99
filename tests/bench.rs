//! `slimpack bench` from the command line: the JSON report's contract, the strategy selection,
//! the rules every strategy runs by (tuning steps, drain, hybrid-cp where it applies), and bad
//! input.

use std::process::Output;

mod common;
use common::slimpack;

const TINY: [&str; 14] = [
    "bench",
    "--model",
    "tiny",
    "--cluster",
    "cpu",
    "--parallel",
    "tp=1,pp=2,dp=4",
    "--synthetic",
    "lognormal:median=40,sigma=1.2,count=400,seed=3",
    "--context",
    "256",
    "--global-batch",
    "48",
    "--steps",
];

fn bench(extra: &[&str]) -> Output {
    let mut args: Vec<&str> = TINY.to_vec();
    args.extend_from_slice(extra);
    slimpack(&args)
}

/// The row fields every report has, in order (the simulator's other figures follow them).
const FIELDS: [&str; 15] = [
    "name",
    "steps",
    "drain_steps",
    "tokens",
    "time_s",
    "useful_flops_per_s",
    "mfu",
    "efficiency",
    "speedup_vs_best_peer",
    "speedup_vs_megatron_paper",
    "replans",
    "over_limit",
    "compile_ms_p50",
    "compile_ms_p95",
    "bubble_fraction",
];

/// A memory limit no plan fits: the report is written with every run marked over it and no
/// best peer, and bench exits 3 with one line, as `compile` does (it exited 0 and printed "no"
/// in the OOM column: that column said only whether a step overflowed the device).
#[test]
fn a_memory_limit_nothing_fits_marks_every_run_and_exits_3() {
    let output = bench(&[
        "1",
        "--report",
        "json",
        "--strategies",
        "megatron,slimpack",
        "--memory-limit",
        "0.0001",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("error: no strategy fits the memory limit on every step"),
        "{stderr}"
    );
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("the report is still written");
    assert!(report["config"]["best_peer"].is_null());
    assert!(report["config"]["rules"]
        .as_str()
        .unwrap()
        .contains("within 0.01% of device memory"));
    for strategy in report["strategies"].as_array().unwrap() {
        assert_eq!(strategy["over_limit"], true, "{strategy}");
        assert_eq!(strategy["oom"], false, "{strategy}");
        assert!(strategy["speedup_vs_best_peer"].is_null());
    }
    // The text table says which limit a run is over.
    let output = bench(&["1", "--strategies", "megatron", "--memory-limit", "0.0001"]);
    assert_eq!(output.status.code(), Some(3));
    let text = String::from_utf8_lossy(&output.stdout);
    let row = text.lines().find(|l| l.starts_with("megatron ")).unwrap();
    assert!(row.contains(" limit "), "{row}");
}

#[test]
fn json_report_has_every_peer_with_the_contract_fields() {
    let peers = ["padding", "megatron", "bfd", "ff", "kk", "wlb", "hybrid-cp"];
    let output = bench(&["3", "--report", "json", "--strategies", &peers.join(",")]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("stdout is one JSON object");
    let object = report.as_object().unwrap();
    assert_eq!(
        object.keys().collect::<Vec<_>>(),
        vec!["config", "strategies"]
    );
    let config = &report["config"];
    assert_eq!(config["steps"], 3);
    assert_eq!(config["tune_steps"], 3);
    assert_eq!(config["memory_limit"], 0.92);
    // hybrid-cp needs pp=1 (Megatron-Core asserts it): reported, not run.
    assert_eq!(config["not_applicable"]["hybrid-cp"], "needs pp=1");
    let strategies = report["strategies"].as_array().unwrap();
    let names: Vec<&str> = strategies
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, &peers[..6]);
    let text = String::from_utf8_lossy(&output.stdout);
    let first = &text[text.find("\"strategies\"").unwrap()..];
    let positions: Vec<usize> = FIELDS
        .iter()
        .map(|f| first.find(&format!("\"{f}\"")).unwrap())
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    let best = config["best_peer"].as_str().unwrap();
    let useful = |name: &str| {
        strategies.iter().find(|s| s["name"] == name).unwrap()["useful_flops_per_s"]
            .as_f64()
            .unwrap()
    };
    for strategy in strategies {
        for field in FIELDS {
            assert!(strategy.get(field).is_some(), "{field}");
        }
        assert!(strategy["step_time_s"].as_f64().unwrap() > 0.0);
        assert!(strategy["tokens_per_s"].as_f64().unwrap() > 0.0);
        assert!(strategy["dp_imbalance"].as_f64().unwrap() >= 1.0);
        assert_eq!(strategy["oom"], false);
        assert_eq!(strategy["over_limit"], false);
        assert!(strategy["peak_memory_bytes"].as_u64().unwrap() > 0);
        assert!(strategy.get("peak_memory_per_device").is_none());
        let p50 = strategy["compile_ms_p50"].as_f64().unwrap();
        assert!(p50 > 0.0 && strategy["compile_ms_p95"].as_f64().unwrap() >= p50);
        let name = strategy["name"].as_str().unwrap();
        assert!(config["chosen"][name].is_string(), "{name}");
        // Useful FLOP/s is MFU over the cluster's peak, and the speedup is its ratio.
        let flops = strategy["useful_flops_per_s"].as_f64().unwrap();
        assert!(flops > 0.0 && useful(best) >= flops, "{name}");
        let speedup = strategy["speedup_vs_best_peer"].as_f64().unwrap();
        assert!((speedup - flops / useful(best)).abs() < 1e-12, "{name}");
        assert!(strategy["speedup_vs_megatron_paper"].is_null() || name == "megatron-paper");
    }
    assert!(config["backlog"]["wlb"]["samples"].is_u64());
}

/// slimpack is no peer of itself: the best peer is one of the others; hybrid-cp runs (and may
/// be the best peer) where pp = 1.
#[test]
fn best_peer_leaves_slimpack_out_and_hybrid_cp_runs_without_pipelines() {
    let mut args: Vec<&str> = TINY.to_vec();
    args[6] = "tp=1,pp=1,dp=4";
    args.extend_from_slice(&[
        "2",
        "--report",
        "json",
        "--strategies",
        "slimpack,hybrid-cp,megatron",
    ]);
    let output = slimpack(&args);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let best = report["config"]["best_peer"].as_str().unwrap();
    assert!(["hybrid-cp", "megatron"].contains(&best), "{best}");
    assert!(report["config"]["not_applicable"]
        .as_object()
        .unwrap()
        .is_empty());
    let names: Vec<&str> = report["strategies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["megatron", "hybrid-cp", "slimpack"]);
}

#[test]
fn drain_makes_every_strategy_train_the_same_tokens() {
    let output = bench(&[
        "4",
        "--report",
        "json",
        "--drain",
        "--tune-steps",
        "2",
        "--strategies",
        "megatron,wlb",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["config"]["drain"], true);
    assert_eq!(report["config"]["tune_steps"], 2);
    assert_eq!(report["config"]["backlog"]["wlb"]["tokens"], 0);
    let rows = report["strategies"].as_array().unwrap();
    assert_eq!(rows[0]["tokens"], rows[1]["tokens"]);
    assert_eq!(rows[0]["drain_steps"], 0);
    let wlb_steps = rows[1]["steps"].as_u64().unwrap();
    assert_eq!(wlb_steps, 4 + rows[1]["drain_steps"].as_u64().unwrap());
}

#[test]
fn strategies_can_be_chosen_and_the_text_table_names_them() {
    let output = bench(&["1", "--strategies", "kk,megatron", "--recompute", "full"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let rows: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| ["kk", "megatron", "bfd"].contains(w))
        .collect();
    // The headline table, then the "where the step goes" table, each in report order.
    assert_eq!(rows, vec!["megatron", "kk", "megatron", "kk"]);
    assert!(stdout.contains("recompute=full"), "{stdout}");
    assert!(!stdout.contains("recompute=none"), "{stdout}");
}

#[test]
fn bad_strategy_and_zero_steps_are_one_line_errors() {
    for (args, needle) in [
        (
            vec!["2", "--strategies", "megatron,lpt"],
            "unknown strategy 'lpt'",
        ),
        (vec!["0"], "--steps"),
        (vec!["1", "--tune-steps", "0"], "--tune-steps"),
        (vec!["1", "--memory-limit", "1.2"], "--memory-limit 1.2"),
        (
            vec!["1", "--memory-limit", "92%"],
            "fraction of device memory",
        ),
    ] {
        let output = bench(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(stderr.contains(needle), "{stderr}");
        assert!(output.stdout.is_empty());
    }
}
