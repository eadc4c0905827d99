//! The schedule document of a small step: two stages, TP 2, four DP ranks with a DP-Merge group
//! of ranks 0 and 1 beside their plain replicas, samples cut into several slices.

use super::*;
use slimpack_ir::text;

const STEP: &str = include_str!("../../tests/data/tiny-pp2-dp4.sir");

fn step() -> StepIr {
    text::parse(STEP, "tiny-pp2-dp4.sir").unwrap()
}

#[test]
fn reads_back_into_the_same_step() {
    let ir = step();
    let doc = document(&ir, None);
    let json = serde_json::to_string(&doc).unwrap();
    let back = to_ir(&parse(&json).unwrap()).unwrap();
    let mut lowered = ir.clone();
    program::lower_into(&mut lowered).unwrap();
    lowered.advance(Phase::Lowered);
    assert_eq!(text::print(&back), text::print(&lowered));
}

#[test]
fn every_global_rank_has_its_ops_with_resolved_peers() {
    let ir = step();
    let doc = document(&ir, None);
    assert_eq!(doc.devices.len(), 16);
    // Rank 3 is tp=1, dp=1, pp=0 (tp fastest, then dp, then pp): it sends activations to the
    // device with the same tp and dp on stage 1, rank 3 + 2 x 4 = 11.
    let device = &doc.devices[3];
    assert_eq!(
        (device.coords.tp, device.coords.dp, device.coords.pp),
        (1, 1, 0)
    );
    let sends: Vec<u64> = device
        .ops
        .iter()
        .filter_map(|op| match op {
            DeviceOp::Send { to, .. } => Some(*to),
            _ => None,
        })
        .collect();
    assert!(!sends.is_empty());
    assert!(sends.iter().all(|&to| to == 11), "{sends:?}");
    // Its stage's DP sync spans the tp=1 devices of stage 0.
    assert_eq!(
        device.ops.last(),
        Some(&DeviceOp::AllGather {
            ranks: vec![1, 3, 5, 7]
        })
    );
    // Ranks 0 and 1 of DP (global 1 and 3 at tp=1) form the merged group's CP exchange.
    assert!(device.ops.iter().any(|op| matches!(
        op,
        DeviceOp::CpExchange { ranks, .. } if ranks == &vec![1, 3]
    )));
}

#[test]
fn packs_carry_varlen_metadata() {
    let doc = document(&step(), None);
    for pack in &doc.packs {
        let layout = &pack.layout;
        assert_eq!(layout.cu_seqlens_q.len(), layout.slices.len() + 1);
        for (i, slice) in layout.slices.iter().enumerate() {
            let q = layout.cu_seqlens_q[i + 1] - layout.cu_seqlens_q[i];
            let k = layout.cu_seqlens_k[i + 1] - layout.cu_seqlens_k[i];
            assert_eq!(q, slice.end - slice.start);
            assert_eq!(k, slice.end - slice.kv_start);
            assert_eq!(layout.position_offsets[i], slice.start);
        }
    }
}

#[test]
fn edited_op_lists_and_wrong_versions_are_rejected() {
    let doc = document(&step(), None);
    let mut edited = doc.clone();
    edited.devices[5].ops.swap(0, 1);
    let error = to_ir(&edited).unwrap_err().to_string();
    assert!(error.contains("rank 5"), "{error}");

    let mut json: serde_json::Value = serde_json::to_value(&doc).unwrap();
    json["version"] = 99.into();
    let error = parse(&json.to_string()).unwrap_err().to_string();
    assert!(error.contains("version 99"), "{error}");
    let error = parse("{\"format\": \"other\"}").unwrap_err().to_string();
    assert!(error.contains("not a slimpack schedule"), "{error}");
}

#[test]
fn the_shipped_schema_is_up_to_date() {
    let shipped = include_str!("../../../docs/schedule.schema.json");
    assert!(
        shipped == schema(),
        "docs/schedule.schema.json is stale: run `slimpack schema -o docs/schedule.schema.json`"
    );
}

#[test]
fn golden_document() {
    let mut json = serde_json::to_string_pretty(&document(&step(), None)).unwrap();
    json.push('\n');
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/golden/tiny-pp2-dp4.schedule.json"
    );
    if std::env::var_os("SLIMPACK_BLESS").is_some() {
        std::fs::write(path, &json).unwrap();
    }
    let golden = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        golden == json,
        "{path} differs from the emitted document (SLIMPACK_BLESS=1 rewrites it; review the diff)"
    );
}
