//! `compile --emit json` and `simulate schedule.json`: the document validates against the
//! shipped schema's required fields, reads back, and simulates to exactly compile's figures.

mod common;

use common::slimpack;
use serde_json::Value;

fn compile_json(dir: &std::path::Path, extra: &[&str]) -> (Value, Value) {
    let schedule = dir.join("schedule.json");
    let mut args = vec![
        "compile",
        "--model",
        "tiny",
        "--cluster",
        "cpu",
        "--parallel",
        "tp=2,pp=2,dp=4",
        "--synthetic",
        "lognormal:median=64,sigma=1.2,count=24,max=512,seed=5",
        "--context",
        "512",
        "--emit",
        "json",
        "--report",
        "json",
        "-o",
        schedule.to_str().unwrap(),
    ];
    args.extend(extra);
    let out = slimpack(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let document: Value =
        serde_json::from_str(&std::fs::read_to_string(schedule).unwrap()).unwrap();
    (report, document)
}

#[test]
fn simulate_schedule_json_reproduces_compile_exactly() {
    for strategy in ["slimpack", "megatron", "wlb"] {
        let dir = tempfile::tempdir().unwrap();
        let (report, document) = compile_json(dir.path(), &["--strategy", strategy]);
        assert_eq!(report["phase"], "lowered");
        assert_eq!(document["format"], "slimpack.schedule");
        assert_eq!(document["devices"].as_array().unwrap().len(), 16);

        let schedule = dir.path().join("schedule.json");
        let out = slimpack(&["simulate", schedule.to_str().unwrap(), "--report", "json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let simulated: Value = serde_json::from_slice(&out.stdout).unwrap();
        let metrics = simulated.as_object().unwrap();
        assert!(metrics.len() > 5);
        for (key, value) in metrics {
            assert_eq!(&report[key], value, "{strategy}: {key}");
            assert_eq!(&document["predicted"][key], value, "{strategy}: {key}");
        }
    }
}

#[test]
fn the_document_has_what_the_schema_requires() {
    let dir = tempfile::tempdir().unwrap();
    let (_, document) = compile_json(dir.path(), &["--strategy", "slimpack"]);
    let schema: Value = serde_json::from_str(include_str!("../docs/schedule.schema.json")).unwrap();
    for field in schema["required"].as_array().unwrap() {
        assert!(
            document.get(field.as_str().unwrap()).is_some(),
            "missing {field}"
        );
    }
    for pack in document["packs"].as_array().unwrap() {
        for field in schema["$defs"]["PackDocument"]["required"]
            .as_array()
            .unwrap()
        {
            assert!(
                pack.get(field.as_str().unwrap()).is_some(),
                "pack misses {field}"
            );
        }
    }
}

#[test]
fn bad_schedule_files_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (_, mut document) = compile_json(dir.path(), &["--strategy", "slimpack"]);
    let broken = dir.path().join("broken.json");
    document["packs"][0]["cu_seqlens_q"][1] = 1.into();
    std::fs::write(&broken, document.to_string()).unwrap();
    let out = slimpack(&["simulate", broken.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("pack 0"), "{stderr}");

    std::fs::write(
        &broken,
        "{\"format\": \"slimpack.schedule\", \"version\": 1}",
    )
    .unwrap();
    let out = slimpack(&["simulate", broken.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: "));

    let out = slimpack(&[
        "compile",
        "--model",
        "tiny",
        "--cluster",
        "cpu",
        "--parallel",
        "tp=1,pp=1,dp=1",
        "--synthetic",
        "lognormal:median=64,sigma=1,count=4",
        "--passes",
        "",
        "--emit",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs a scheduled step"));
}
