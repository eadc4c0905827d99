//! `slimpack bench` from the command line: the JSON report's contract, the strategy selection,
//! and bad input.

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

const FIELDS: [&str; 13] = [
    "name",
    "step_time_s",
    "tokens_per_s",
    "mfu",
    "efficiency",
    "dp_imbalance",
    "pp_imbalance",
    "bubble_fraction",
    "peak_memory_bytes",
    "oom",
    "compile_ms_p50",
    "compile_ms_p95",
    "speedup_vs_megatron",
];

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
    assert_eq!(report["config"]["steps"], 3);
    let strategies = report["strategies"].as_array().unwrap();
    let names: Vec<&str> = strategies
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, peers);
    // serde_json's map sorts keys; the printed order is checked on the text.
    let mut sorted_fields = FIELDS.to_vec();
    sorted_fields.sort_unstable();
    let text = String::from_utf8_lossy(&output.stdout);
    let first = &text[text.find("\"strategies\"").unwrap()..];
    let positions: Vec<usize> = FIELDS
        .iter()
        .map(|f| first.find(&format!("\"{f}\"")).unwrap())
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    for strategy in strategies {
        let keys: Vec<&str> = strategy
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, sorted_fields);
        assert!(strategy["step_time_s"].as_f64().unwrap() > 0.0);
        assert!(strategy["tokens_per_s"].as_f64().unwrap() > 0.0);
        assert!(strategy["dp_imbalance"].as_f64().unwrap() >= 1.0);
        assert!(strategy["oom"].is_boolean());
        assert!(strategy["peak_memory_bytes"].as_u64().unwrap() > 0);
        let p50 = strategy["compile_ms_p50"].as_f64().unwrap();
        assert!(p50 > 0.0 && strategy["compile_ms_p95"].as_f64().unwrap() >= p50);
        let name = strategy["name"].as_str().unwrap();
        assert!(report["config"]["chosen"][name].is_string(), "{name}");
    }
    assert_eq!(strategies[1]["speedup_vs_megatron"].as_f64(), Some(1.0));
    assert!(report["config"]["backlog"]["wlb"]["samples"].is_u64());
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
    assert_eq!(rows, vec!["megatron", "kk"]);
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
    ] {
        let output = bench(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(stderr.contains(needle), "{stderr}");
        assert!(output.stdout.is_empty());
    }
}
