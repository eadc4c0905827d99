//! `compile --emit json` and `simulate schedule.json`: the version 3 document validates against
//! the shipped schema's required fields, reads back, simulates to exactly compile's figures,
//! states the layout it runs (a chosen static CP degree included), pairs its point-to-point ops,
//! and refuses edits to its derived fields (pack metadata, tied-embedding op) with one line.

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
    document["packs"][0]["packed_seq_params"]["cu_seqlens_q"][1] = 1.into();
    std::fs::write(&broken, document.to_string()).unwrap();
    let out = slimpack(&["simulate", broken.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("pack 0: packed_seq_params.cu_seqlens_q[1] is 1"),
        "{stderr}"
    );

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

/// The document of `compile_json` with `strategy`, and the one-line error `simulate` gives
/// after `edit`.
fn simulate_edited(strategy: &str, edit: impl FnOnce(&mut Value)) -> String {
    let dir = tempfile::tempdir().unwrap();
    let (_, mut document) = compile_json(dir.path(), &["--strategy", strategy]);
    edit(&mut document);
    let edited = dir.path().join("edited.json");
    std::fs::write(&edited, document.to_string()).unwrap();
    let out = slimpack(&["simulate", edited.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    stderr
}

#[test]
fn edited_derived_fields_are_caught_by_simulate() {
    // The tiny model ties its embeddings: the first and last stage sum the gradient.
    let stderr = simulate_edited("slimpack", |document| {
        let ops = document["devices"][0]["ops"].as_array_mut().unwrap();
        let at = ops
            .iter()
            .position(|op| op["op"] == "tied_embedding_all_reduce")
            .expect("a tied-embedding op on the first stage");
        ops.remove(at);
    });
    assert!(stderr.contains("devices (rank 0)"), "{stderr}");
    let stderr = simulate_edited("wlb", |document| {
        document["packs"][1]["packed_seq_params"]["cu_seqlens_kv_padded"][1] = 7.into();
    });
    assert!(
        stderr.contains("pack 1: packed_seq_params.cu_seqlens_kv_padded[1] is 7"),
        "{stderr}"
    );
    let stderr = simulate_edited("megatron", |document| {
        document["spec"]["parallel"]["cp"] = 1.into();
        document["spec"]["parallel"]["dp"] = 4.into();
    });
    assert!(stderr.contains("error: "), "{stderr}");
    let stderr = simulate_edited("slimpack", |document| {
        document["packs"][0]["extra"] = 1.into();
    });
    assert!(stderr.contains("unknown field `extra`"), "{stderr}");
}

#[test]
fn the_document_states_the_layout_it_runs_and_megatron_fields() {
    for strategy in ["megatron", "slimpack", "padding"] {
        let dir = tempfile::tempdir().unwrap();
        let (_, document) = compile_json(dir.path(), &["--strategy", strategy]);
        let parallel = &document["spec"]["parallel"];
        let (cp, dp) = (
            parallel["cp"].as_u64().unwrap(),
            parallel["dp"].as_u64().unwrap(),
        );
        // The input pool of 4 DP ranks is cp x dp of the layout the step runs.
        assert_eq!(cp * dp, 4, "{strategy}: {parallel}");
        let devices = document["devices"].as_array().unwrap();
        for device in devices {
            let coords = &device["coords"];
            let rank = coords["tp"].as_u64().unwrap()
                + 2 * (coords["cp"].as_u64().unwrap()
                    + cp * (coords["dp"].as_u64().unwrap() + dp * coords["pp"].as_u64().unwrap()));
            assert_eq!(device["rank"].as_u64().unwrap(), rank, "{strategy}");
        }
        let cps: std::collections::BTreeSet<u64> = devices
            .iter()
            .map(|d| d["coords"]["cp"].as_u64().unwrap())
            .collect();
        assert_eq!(cps.len() as u64, cp, "{strategy}");
        for pack in document["packs"].as_array().unwrap() {
            let params = pack["packed_seq_params"].as_object().unwrap();
            let mut keys: Vec<&str> = params.keys().map(String::as_str).collect();
            keys.sort_unstable();
            let mut megatron = [
                "qkv_format",
                "cu_seqlens_q",
                "cu_seqlens_kv",
                "cu_seqlens_q_padded",
                "cu_seqlens_kv_padded",
                "max_seqlen_q",
                "max_seqlen_kv",
            ];
            megatron.sort_unstable();
            assert_eq!(keys, megatron, "Megatron-Core's PackedSeqParams fields");
            assert_eq!(params["qkv_format"], "thd");
            let cp_size = pack["cp_size"].as_u64().unwrap();
            let multiple = if cp_size > 1 { 2 * cp_size } else { 1 };
            for list in ["cu_seqlens_q_padded", "cu_seqlens_kv_padded"] {
                for offset in params[list].as_array().unwrap() {
                    let offset = offset.as_u64().unwrap();
                    assert!(offset <= i32::MAX as u64);
                    if cp_size > 1 {
                        assert_eq!(offset % multiple, 0, "{strategy}: {list}");
                    }
                }
            }
        }
    }
}

#[test]
fn sends_and_receives_pair_up_between_every_two_ranks() {
    use std::collections::BTreeMap;
    for strategy in ["slimpack", "megatron", "wlb"] {
        let dir = tempfile::tempdir().unwrap();
        let (_, document) = compile_json(dir.path(), &["--strategy", strategy]);
        let mut sent: BTreeMap<(u64, u64), Vec<(u64, String)>> = BTreeMap::new();
        let mut received: BTreeMap<(u64, u64), Vec<(u64, String)>> = BTreeMap::new();
        for device in document["devices"].as_array().unwrap() {
            let rank = device["rank"].as_u64().unwrap();
            for op in device["ops"].as_array().unwrap() {
                let message = (
                    op["pack"].as_u64().unwrap_or(0),
                    op["direction"].to_string(),
                );
                match op["op"].as_str().unwrap() {
                    "send" => sent
                        .entry((rank, op["to"].as_u64().unwrap()))
                        .or_default()
                        .push(message),
                    "recv" => received
                        .entry((op["from"].as_u64().unwrap(), rank))
                        .or_default()
                        .push(message),
                    _ => {}
                }
            }
        }
        assert!(!sent.is_empty(), "{strategy}");
        // With model chunks (a strategy may choose vpp=2 here) messages pair up by pack and
        // direction, not in order.
        if document["spec"]["parallel"]["vpp"].as_u64().unwrap_or(1) > 1 {
            for list in sent.values_mut().chain(received.values_mut()) {
                list.sort();
            }
        }
        assert_eq!(sent, received, "{strategy}");
    }
}

/// The slice table and the sub-batches agree with the packs: every forward pack's sub-batches
/// partition its slices, each group is exactly what its backward pack runs of them, and the
/// groups run each sample's slices in increasing start; `dkv_from` lists the sample's slices
/// from the last down to the slice itself.
fn assert_sub_batches_and_slice_table(document: &Value) {
    let packs = document["packs"].as_array().unwrap();
    let slices = document["slices"].as_array().unwrap();
    for (p, pack) in packs.iter().enumerate() {
        let pack_slices = pack["slices"].as_array().unwrap();
        for entry in pack_slices {
            let slice = &slices[entry["slice"].as_u64().unwrap() as usize];
            assert_eq!(
                (&slice["sample"], &slice["start"]),
                (&entry["sample"], &entry["start"])
            );
            let key = if pack["direction"] == "forward" {
                "forward_pack"
            } else {
                "backward_pack"
            };
            assert_eq!(slice[key], p);
        }
        if pack["direction"] != "forward" {
            assert!(pack["sub_batches"].as_array().unwrap().is_empty());
            continue;
        }
        let groups = pack["sub_batches"].as_array().unwrap();
        let mut seen = Vec::new();
        let mut last_start: std::collections::HashMap<u64, u64> = Default::default();
        for group in groups {
            for index in group["slices"].as_array().unwrap() {
                let index = index.as_u64().unwrap();
                seen.push(index);
                let entry = &pack_slices[index as usize];
                let slice = &slices[entry["slice"].as_u64().unwrap() as usize];
                assert_eq!(slice["backward_pack"], group["backward_pack"]);
                let (sample, start) = (
                    entry["sample"].as_u64().unwrap(),
                    entry["start"].as_u64().unwrap(),
                );
                if let Some(&before) = last_start.get(&sample) {
                    assert!(before < start, "pack {p}: sample {sample} out of order");
                }
                last_start.insert(sample, start);
            }
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..pack_slices.len() as u64).collect::<Vec<_>>());
    }
    for (i, slice) in slices.iter().enumerate() {
        let mut later: Vec<u64> = (i..slices.len())
            .take_while(|&j| slices[j]["sample"] == slice["sample"])
            .map(|j| j as u64)
            .collect();
        later.reverse();
        let dkv: Vec<u64> = slice["dkv_from"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(dkv, later, "slice {i}");
    }
}

#[test]
fn asymmetric_packs_split_forward_packs_into_sub_batches_that_simulate() {
    let dir = tempfile::tempdir().unwrap();
    let (report, document) = compile_json(
        dir.path(),
        &[
            "--passes",
            "assign-dp,slice{size=128},pack-fwd,pack-bwd,schedule-pipeline,lower",
        ],
    );
    assert_sub_batches_and_slice_table(&document);
    let split = document["packs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["sub_batches"].as_array().unwrap().len() > 1)
        .count();
    assert!(split > 0, "no forward pack split along backward packs");
    let schedule = dir.path().join("schedule.json");
    let out = slimpack(&["simulate", schedule.to_str().unwrap(), "--report", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let simulated: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(simulated["step_time_s"], report["step_time_s"]);
    for strategy in ["slimpack", "megatron"] {
        let (_, document) = compile_json(dir.path(), &["--strategy", strategy]);
        assert_sub_batches_and_slice_table(&document);
    }
}

/// `compile ARGS --emit json --report json` into `dir/schedule.json`: the document's path, the
/// report and the document.
fn compile_document(dir: &std::path::Path, args: &[&str]) -> (std::path::PathBuf, Value, Value) {
    let schedule = dir.join("schedule.json");
    let mut all = vec!["compile"];
    all.extend(args);
    all.extend(["--emit", "json", "--report", "json", "-o"]);
    all.push(schedule.to_str().unwrap());
    let out = slimpack(&all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let document: Value =
        serde_json::from_str(&std::fs::read_to_string(&schedule).unwrap()).unwrap();
    (schedule, report, document)
}

/// `simulate PATH --report json`'s report.
fn simulate_document(path: &std::path::Path) -> Value {
    let out = slimpack(&["simulate", path.to_str().unwrap(), "--report", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `edited`, written to `dir/EDIT.json`, is refused by `simulate` in one line holding
/// `expected`.
fn refused_edit(dir: &std::path::Path, edit: &str, edited: &Value, expected: &str) {
    let path = dir.join(format!("{edit}.json"));
    std::fs::write(&path, serde_json::to_string(edited).unwrap()).unwrap();
    let out = slimpack(&["simulate", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{edit}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{edit}: {stderr}");
    assert!(stderr.contains(expected), "{edit}: {stderr}");
}

/// A step whose shared ranks interleave (`interleave-ranks`) carries the orders as
/// `rank_orders`, entries in increasing (dp, pp), and simulates from the document exactly as
/// compiled; entries out of order, or one listed twice, are refused in one line.
#[test]
fn interleaved_ranks_round_trip_and_their_entries_go_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (schedule, report, document) = compile_document(
        dir.path(),
        &[
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
            "assign-dp,dp-merge,pack-symmetric,schedule-pipeline,interleave-ranks",
        ],
    );
    let orders = document["rank_orders"].as_array().expect("rank_orders");
    assert!(orders.len() >= 2, "{orders:?}");
    let simulated = simulate_document(&schedule);
    assert_eq!(simulated["step_time_s"], report["step_time_s"]);
    for edit in ["reversed", "twice"] {
        let mut edited = document.clone();
        let orders = edited["rank_orders"].as_array_mut().unwrap();
        match edit {
            "reversed" => orders.reverse(),
            _ => {
                let first = orders[0].clone();
                orders.insert(1, first);
            }
        }
        let expected = "entries go in increasing (dp, pp), each once";
        refused_edit(dir.path(), edit, &edited, expected);
    }
}

/// A step whose packs save under their own recomputation (`assign-recompute{packs=true}`: on
/// one stage, only the pack of the 64K-token document recomputes) carries it as
/// `pack_recompute` and simulates from the document exactly as compiled; an entry naming a
/// backward pack, a pack twice, no pack, or its stage's own mode is refused in one line.
#[test]
fn packs_own_recomputation_round_trips_and_bad_entries_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (schedule, report, document) = compile_document(
        dir.path(),
        &[
            "--model",
            "llama-7b",
            "--cluster",
            "h100-sxm",
            "--parallel",
            "tp=4,pp=1,dp=1",
            "--recompute",
            "full",
            "--batch",
            "tests/fixtures/one-long.lengths.txt",
            "--context",
            "65536",
            "--passes",
            "assign-dp{balance=none},pack-symmetric,schedule-pipeline,assign-recompute{packs=true}",
        ],
    );
    let own = document["pack_recompute"]
        .as_array()
        .expect("pack_recompute");
    assert_eq!(own.len(), 1, "{own:?}");
    assert_eq!(own[0]["stage"], 0);
    assert_eq!(own[0]["recompute"], "none");
    assert_eq!(own[0]["packs"].as_array().unwrap().len(), 4, "{own:?}");
    assert_ne!(document["stages"][0]["recompute"], "none");
    let simulated = simulate_document(&schedule);
    assert_eq!(simulated["step_time_s"], report["step_time_s"]);
    assert_eq!(simulated["peak_memory_bytes"], report["peak_memory_bytes"]);
    let backward = document["packs"]
        .as_array()
        .unwrap()
        .iter()
        .position(|pack| pack["direction"] == "backward")
        .unwrap();
    let stage_mode = document["stages"][0]["recompute"].clone();
    for (edit, expected) in [
        ("backward", "no forward pack"),
        ("twice", "none empty"),
        ("empty", "none empty"),
        ("stage-mode", "own mode"),
    ] {
        let mut edited = document.clone();
        let entry = &mut edited["pack_recompute"][0];
        match edit {
            "backward" => {
                // Backward packs follow the forward ones: the list stays increasing.
                let packs = entry["packs"].as_array_mut().unwrap();
                *packs.last_mut().unwrap() = Value::from(backward);
            }
            "twice" => {
                let first = entry["packs"][0].clone();
                entry["packs"].as_array_mut().unwrap().push(first);
            }
            "empty" => entry["packs"] = Value::Array(Vec::new()),
            _ => entry["recompute"] = stage_mode.clone(),
        }
        refused_edit(dir.path(), edit, &edited, expected);
    }
}
