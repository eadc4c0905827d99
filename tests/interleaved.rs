//! Interleaved 1F1B (model chunks, `--parallel ...,vpp=2,...`): the pipeline pass emits it for
//! every strategy, the verifier proves it deadlock-free, the simulator prices it, the text IR
//! and the schedule JSON carry it, and the executors that cannot run it say so.

mod common;

use common::slimpack;
use serde_json::Value;
use std::path::Path;

fn run_ok(args: &[&str]) -> Vec<u8> {
    let out = slimpack(args);
    assert!(
        out.status.success(),
        "slimpack {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).expect("a JSON report")
}

/// Equal documents, one per micro-batch: `count` of `len` tokens.
fn equal_lengths(dir: &Path, count: usize, len: u32) -> String {
    let path = dir.join("lengths.txt");
    let text: String = (0..count).map(|_| format!("{len}\n")).collect();
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// Megatron-style micro-batches of one document each, plain 1F1B against interleaved.
fn megatron_step(lengths: &str, layout: &str) -> Value {
    json(&run_ok(&[
        "compile",
        "--model",
        "llama-7b",
        "--cluster",
        "h100-sxm",
        "--parallel",
        layout,
        "--batch",
        lengths,
        "--context",
        "8192",
        "--passes",
        "assign-dp{cp=1,balance=none},pack-symmetric{policy=ffd,scope=global,cap=8192},schedule-pipeline,lower",
        "--report",
        "json",
    ]))
}

/// Equal micro-batches, a multiple of pp of them: Megatron's interleaved order, whose bubble
/// is about `1 / vpp` of plain 1F1B's (warm-up and drain shrink with the chunk's time).
#[test]
fn interleaving_shrinks_the_bubble_of_equal_micro_batches() {
    let dir = tempfile::tempdir().unwrap();
    let lengths = equal_lengths(dir.path(), 16, 8192);
    let plain = megatron_step(&lengths, "tp=8,pp=4,dp=1");
    let interleaved = megatron_step(&lengths, "tp=8,pp=4,vpp=2,dp=1");
    let bubble = |report: &Value| report["bubble_fraction"].as_f64().unwrap();
    let step = |report: &Value| report["step_time_s"].as_f64().unwrap();
    assert!(
        bubble(&interleaved) < 0.75 * bubble(&plain),
        "bubble {} (vpp=2) vs {} (vpp=1)",
        bubble(&interleaved),
        bubble(&plain)
    );
    assert!(step(&interleaved) < step(&plain));
    // The same work: the useful ideal does not depend on how the layers are cut.
    let useful = |report: &Value| report["useful_ideal_step_time_s"].as_f64().unwrap();
    assert!((useful(&interleaved) / useful(&plain) - 1.0).abs() < 1e-12);
    assert_eq!(interleaved["parallel"], "tp=8,pp=4,vpp=2,dp=1");
}

/// Every strategy compiles interleaved (Megatron's order for symmetric micro-batches in
/// multiples of pp, the list schedule elsewhere), verified; the text IR and the schedule JSON
/// simulate back to compile's figures.
#[test]
fn interleaved_steps_verify_and_round_trip() {
    for (strategy, seed) in [("megatron", "1"), ("slimpack", "2"), ("kk", "3")] {
        let dir = tempfile::tempdir().unwrap();
        let ir = dir.path().join("step.sir");
        let doc = dir.path().join("step.json");
        let synthetic = format!("lognormal:median=200,sigma=1.1,count=19,max=2048,seed={seed}");
        let spec = [
            "--model",
            "tiny",
            "--cluster",
            "cpu",
            "--parallel",
            "tp=1,pp=2,vpp=2,dp=2",
            "--synthetic",
            &synthetic,
            "--strategy",
            strategy,
            "--report",
            "json",
        ];
        let mut args = vec!["compile"];
        args.extend(spec);
        args.extend(["--emit", "ir", "-o", ir.to_str().unwrap()]);
        let report = json(&run_ok(&args));
        let text = std::fs::read_to_string(&ir).unwrap();
        assert!(text.contains("interleave %r0 pp=1 ["), "{strategy}");
        assert!(text.contains(" chunk=1\n"), "{strategy}");
        let again = json(&run_ok(&[
            "simulate",
            ir.to_str().unwrap(),
            "--report",
            "json",
        ]));
        assert_eq!(again["step_time_s"], report["step_time_s"], "{strategy}");

        let mut args = vec!["compile"];
        args.extend(spec);
        args.extend(["--emit", "json", "-o", doc.to_str().unwrap()]);
        run_ok(&args);
        let document: Value =
            serde_json::from_str(&std::fs::read_to_string(&doc).unwrap()).unwrap();
        assert_eq!(document["spec"]["parallel"]["vpp"], 2);
        assert_eq!(document["stages"].as_array().unwrap().len(), 4);
        assert!(!document["interleave"].as_array().unwrap().is_empty());
        let again = json(&run_ok(&[
            "simulate",
            doc.to_str().unwrap(),
            "--report",
            "json",
        ]));
        assert_eq!(again["step_time_s"], report["step_time_s"], "{strategy}");
    }
}

/// A device that runs its second chunk's packs before its first chunk's waits on itself
/// through the pipeline: the verifier names the deadlock.
#[test]
fn a_deadlocking_interleave_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let ir = dir.path().join("step.sir");
    run_ok(&[
        "compile",
        "--model",
        "tiny",
        "--cluster",
        "cpu",
        "--parallel",
        "tp=1,pp=2,vpp=2,dp=1",
        "--synthetic",
        "lognormal:median=200,sigma=1,count=4,max=2048",
        "--passes",
        "assign-dp,pack-symmetric,schedule-pipeline",
        "--emit",
        "ir",
        "-o",
        ir.to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(&ir).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("  interleave %r0 pp=0 ["))
        .expect("device 0's interleave")
        .to_string();
    let count = line.matches(", ").count() + 1;
    let chunks: Vec<&str> = (0..count)
        .map(|i| if i < count / 2 { "1" } else { "0" })
        .collect();
    let tampered = text.replace(
        &line,
        &format!("  interleave %r0 pp=0 [{}]", chunks.join(", ")),
    );
    std::fs::write(&ir, tampered).unwrap();
    let out = slimpack(&["simulate", ir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("deadlock"), "{stderr}");
}

/// The CPU executor runs one model chunk per device and says so.
#[test]
fn the_cpu_runtime_refuses_interleaved_layouts() {
    let out = slimpack(&[
        "run",
        "--backend",
        "cpu",
        "--model",
        "tiny",
        "--cluster",
        "cpu",
        "--parallel",
        "tp=1,pp=2,vpp=2,dp=1",
        "--synthetic",
        "lognormal:median=64,sigma=1,count=4,max=256",
        "--strategy",
        "megatron",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("vpp=1"), "{stderr}");
}

/// A layout whose layers do not split into pp x vpp chunks is a one-line error.
#[test]
fn chunks_must_divide_the_layers() {
    let out = slimpack(&[
        "compile",
        "--model",
        "tiny",
        "--cluster",
        "cpu",
        "--parallel",
        "tp=1,pp=2,vpp=3,dp=1",
        "--synthetic",
        "lognormal:median=64,sigma=1,count=4,max=256",
        "--strategy",
        "megatron",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("pp=2 x vpp=3 must divide the layers (4)"),
        "{stderr}"
    );
}

/// slimpack's asymmetric packs on model chunks run the list schedule in time, whose forwards
/// in flight fill at most the `memory` fraction of device memory (after the model states):
/// with the default (the tuner's 92% limit) a batch that fits plain 1F1B fits interleaved too,
/// and runs faster than under a tight window, which idles the pipeline.
#[test]
fn the_interleaved_list_schedule_fills_its_memory_window() {
    let step = |layout: &str, schedule: &str| {
        json(&run_ok(&[
            "compile",
            "--model",
            "llama-7b",
            "--cluster",
            "h100-sxm",
            "--parallel",
            layout,
            "--synthetic",
            "lognormal:median=4096,sigma=1.2,count=60,max=65536,seed=7",
            "--context",
            "65536",
            "--passes",
            &format!(
                "assign-dp,slice{{size=16384}},pack-fwd{{cap=32768}},pack-bwd{{cap=32768}},{schedule}"
            ),
            "--report",
            "json",
        ]))
    };
    let capacity = 80.0 * f64::from(1u32 << 30);
    let peak = |report: &Value| report["peak_memory_bytes"].as_f64().unwrap() / capacity;
    let seconds = |report: &Value| report["step_time_s"].as_f64().unwrap();
    let plain = step("tp=4,pp=2,dp=2", "schedule-pipeline");
    let interleaved = step("tp=4,pp=2,vpp=2,dp=2", "schedule-pipeline");
    let tight = step("tp=4,pp=2,vpp=2,dp=2", "schedule-pipeline{memory=0.4}");
    assert!(peak(&plain) <= 0.92, "plain peak {}", peak(&plain));
    assert!(
        peak(&interleaved) <= 0.92,
        "interleaved peak {}",
        peak(&interleaved)
    );
    assert!(seconds(&interleaved) < seconds(&tight));
    let out = slimpack(&[
        "compile",
        "--model",
        "llama-7b",
        "--cluster",
        "h100-sxm",
        "--parallel",
        "tp=4,pp=2,dp=2",
        "--synthetic",
        "lognormal:median=4096,sigma=1,count=8",
        "--passes",
        "assign-dp,pack-fwd,pack-bwd,schedule-pipeline{memory=1.5}",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("memory"));
}
