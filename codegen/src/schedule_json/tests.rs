//! Schedule documents of small steps, checked field by field against values worked out by hand:
//! - `hand-pp2-dp2.sir`: two stages, DP ranks 0 and 1 plus a DP-Merge group of both; a sample
//!   cut into two slices whose forward packs and backward packs differ, a padded pack, a sample
//!   of 7 tokens split over a CP group of 2;
//! - `tiny-pp2-dp4.sir`: two stages, TP 2, four DP ranks with a DP-Merge group (read-back,
//!   golden file);
//! - one-stage steps with a static CP degree, chosen from the DP pool or fixed by the layout;
//! - the rank-group table: its runs, and one-line errors for groups and indices out of range.

use serde_json::{json, Value};

use super::*;
use slimpack_ir::program;
use slimpack_ir::step::Phase;
use slimpack_ir::text;

const TINY: &str = include_str!("../../tests/data/tiny-pp2-dp4.sir");
const HAND: &str = include_str!("../../tests/data/hand-pp2-dp2.sir");
const V2: &str = include_str!("../../tests/data/tiny-pp2-dp4.v2.schedule.json");

fn step(source: &str) -> StepIr {
    text::parse(source, "step.sir").unwrap()
}

fn doc(source: &str) -> ScheduleDocument {
    document(&step(source), None).unwrap()
}

/// The ranks of the group a collective op names.
fn ranks(doc: &ScheduleDocument, op: &DeviceOp) -> Vec<u64> {
    doc.groups[op.group().expect("a collective op") as usize]
        .ranks()
        .collect()
}

/// Every op of `doc` with its group's ranks in place of the group index, as JSON.
fn ops_with_ranks(doc: &ScheduleDocument, rank: usize) -> Value {
    doc.devices[rank]
        .ops
        .iter()
        .map(|op| {
            let mut json = serde_json::to_value(op).unwrap();
            if op.group().is_some() {
                let object = json.as_object_mut().unwrap();
                object.remove("group");
                object.insert("ranks".into(), json!(ranks(doc, op)));
            }
            json
        })
        .collect()
}

/// A one-stage step of two samples (16 and 9 tokens, one slice each) on `replicas`, in the
/// layout `parallel`.
fn one_stage(parallel: &str, replicas: &[&str]) -> String {
    let mut text = String::from(
        r#"step phase=scheduled {
  model name="tiny" layers=4 hidden=128 heads=4 kv_heads=2 head_dim=32 ffn=352 vocab=512 dtype=fp32 recompute=none tied_embeddings=true
  gpu name="cpu-2core" peak_flops=192000000000 hbm_bytes=25769803776 hbm_bandwidth=20000000000
  cluster name="cpu" gpus_per_node=2 intra_bandwidth=10000000000 intra_latency=0.000002 inter_bandwidth=1000000000 inter_latency=0.00005
"#,
    );
    text.push_str(&format!("  parallel {parallel}\n"));
    text.push_str("  batch source=\"hand\" context=16 documents=2 documents_cut=0\n");
    text.push_str("  %st0 = stage layers=0..4\n");
    for (r, ranks) in replicas.iter().enumerate() {
        text.push_str(&format!("  %r{r} = replica dp=[{ranks}]\n"));
    }
    let last = replicas.len() - 1;
    text.push_str(&format!(
        "  %d0 = sample len=16 doc=0 piece=0 on %r0\n    %d0.0 = slice 0..16\n  %d1 = sample len=9 doc=1 piece=0 on %r{last}\n    %d1.0 = slice 0..9\n"
    ));
    text.push_str("  %f0 = pack fwd on %r0 [%d0.0]\n  %b0 = pack bwd on %r0 [%d0.0]\n");
    text.push_str(&format!(
        "  %f1 = pack fwd on %r{last} [%d1.0]\n  %b1 = pack bwd on %r{last} [%d1.0]\n"
    ));
    text.push_str("  schedule %r0 %st0 [%f0, %b0]\n");
    text.push_str(&format!("  schedule %r{last} %st0 [%f1, %b1]\n}}\n"));
    text
}

#[test]
fn reads_back_into_the_same_step() {
    for source in [TINY, HAND] {
        let ir = step(source);
        let json = serde_json::to_string(&document(&ir, None).unwrap()).unwrap();
        let back = to_ir(&parse(&json).unwrap()).unwrap();
        let mut lowered = ir.clone();
        program::lower_into(&mut lowered).unwrap();
        lowered.advance(Phase::Lowered);
        assert_eq!(text::print(&back), text::print(&lowered));
    }
}

/// Per-stage recomputation (the `assign-recompute` filetest's output): each stage's own mode
/// rides on its stage entry, the stages that run the model's have none, and it reads back.
#[test]
fn stage_recomputation_rides_on_the_stages_and_reads_back() {
    let filetest = include_str!("../../../tests/filetests/assign-recompute/per-stage.sir");
    let (_, scheduled) = filetest
        .split_once("// ----- expected -----\n")
        .expect("the filetest has its expected output");
    let ir = step(scheduled);
    let doc = document(&ir, None).unwrap();
    let modes: Vec<Option<String>> = doc
        .stages
        .iter()
        .map(|stage| stage.recompute.map(|mode| mode.to_string()))
        .collect();
    let expected = ["block:5", "block:3", "none", "none"].map(|mode| Some(mode.to_string()));
    assert_eq!(modes, expected);
    let json = serde_json::to_string(&doc).unwrap();
    assert!(json.contains(r#""recompute":"none""#));
    let back = to_ir(&parse(&json).unwrap()).unwrap();
    let mut lowered = ir.clone();
    program::lower_into(&mut lowered).unwrap();
    lowered.advance(Phase::Lowered);
    assert_eq!(text::print(&back), text::print(&lowered));
}

/// A zero-bubble schedule (the `schedule-pipeline` filetest's output): each stage's deferred
/// weight gradients, the split backwards' parts on the devices, and the same step read back.
#[test]
fn zero_bubble_schedules_carry_their_weight_gradients_and_read_back() {
    let filetest = include_str!("../../../tests/filetests/schedule-pipeline/zero-bubble.sir");
    let (_, scheduled) = filetest
        .split_once("// ----- expected -----\n")
        .expect("the filetest has its expected output");
    let ir = step(scheduled);
    let doc = document(&ir, None).unwrap();
    // %r0 on stage 0: [%f0, %f1, %b0.dx, %b0.dw, %f2, %b1.dx, %b2.dx, %b1.dw, %b2.dw]; packs
    // are numbered per replica, forward then backward (%b0 is pack 3).
    let entry = &doc.schedules[0];
    assert_eq!((entry.replica, entry.stage), (0, 0));
    assert_eq!(entry.packs, vec![0, 1, 3, 2, 4, 5]);
    let deferred: Vec<(u32, u32)> = entry
        .weight_grads
        .iter()
        .map(|w| (w.pack, w.after))
        .collect();
    assert_eq!(deferred, vec![(3, 3), (4, 6), (5, 6)]);
    let backwards: Vec<(u32, Part)> = doc.devices[0]
        .ops
        .iter()
        .filter_map(|op| match *op {
            DeviceOp::Backward { pack, part, .. } => Some((pack, part)),
            _ => None,
        })
        .collect();
    use Part::{InputGrad as B, WeightGrad as W};
    assert_eq!(
        backwards,
        vec![(3, B), (3, W), (4, B), (5, B), (4, W), (5, W)]
    );
    let json = serde_json::to_string(&doc).unwrap();
    assert!(json.contains(r#""part":"weight-grad""#));
    let back = to_ir(&parse(&json).unwrap()).unwrap();
    let mut lowered = ir.clone();
    program::lower_into(&mut lowered).unwrap();
    lowered.advance(Phase::Lowered);
    assert_eq!(text::print(&back), text::print(&lowered));
}

#[test]
fn the_slice_table_has_packs_targets_and_dkv_order() {
    let doc = doc(HAND);
    // Packs: r0's f0 f1 b0 b1 (0..4), r1's f2 b2 (4, 5), the merged group's f3 b3 (6, 7).
    let names: Vec<&str> = doc.packs.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        ["%f0", "%f1", "%b0", "%b1", "%f2", "%b2", "%f3", "%b3"]
    );
    let table: Vec<_> = doc
        .slices
        .iter()
        .map(|s| {
            (
                s.sample,
                s.start,
                s.end,
                s.forward_pack,
                s.backward_pack,
                s.target_start,
                s.target_end,
                s.dkv_from.clone(),
            )
        })
        .collect();
    assert_eq!(
        table,
        [
            // d0 [0, 6): predicts tokens 1..7 (token 6 is the next slice's first); its dK/dV
            // take slice 1's backward, then its own.
            (0, 0, 6, 0, 3, 1, 7, vec![1, 0]),
            // d0 [6, 10): the sample's last token (9) has no target.
            (0, 6, 10, 1, 2, 7, 10, vec![1]),
            (1, 0, 4, 0, 2, 1, 4, vec![2]),
            (2, 0, 7, 6, 7, 1, 7, vec![3]),
            (3, 0, 5, 4, 5, 1, 5, vec![4]),
        ]
    );
    // 9 + 3 + 6 + 4 targets.
    assert_eq!(doc.loss.target_tokens, 22);
    assert_eq!(
        serde_json::to_value(doc.loss).unwrap(),
        json!({"normalization": "sum_over_global_target_tokens", "target_tokens": 22})
    );
}

#[test]
fn packs_carry_megatron_fields_kv_prefixes_and_sub_batches() {
    let doc = doc(HAND);
    let params = |p: usize| serde_json::to_value(&doc.packs[p].packed_seq_params).unwrap();
    // f0 = [d0 0..6, d1 0..4]: no prefix, no padding.
    assert_eq!(
        params(0),
        json!({"qkv_format": "thd",
               "cu_seqlens_q": [0, 6, 10], "cu_seqlens_kv": [0, 6, 10],
               "cu_seqlens_q_padded": [0, 6, 10], "cu_seqlens_kv_padded": [0, 6, 10],
               "max_seqlen_q": 6, "max_seqlen_kv": 6})
    );
    // f1 = [d0 6..10]: 4 new rows, keys over the cached prefix 0..6 and themselves.
    assert_eq!(
        params(1),
        json!({"qkv_format": "thd",
               "cu_seqlens_q": [0, 4], "cu_seqlens_kv": [0, 10],
               "cu_seqlens_q_padded": [0, 4], "cu_seqlens_kv_padded": [0, 10],
               "max_seqlen_q": 4, "max_seqlen_kv": 10})
    );
    assert_eq!(doc.packs[1].position_offsets, [6]);
    assert_eq!(
        (
            doc.packs[1].slices[0].slice,
            doc.packs[1].slices[0].kv_start
        ),
        (1, 0)
    );
    // b0 = [d0 6..10, d1 0..4].
    assert_eq!(params(2)["cu_seqlens_kv"], json!([0, 10, 14]));
    // f2: 5 tokens padded to 8; the padding extends the last segment.
    assert_eq!(
        params(4),
        json!({"qkv_format": "thd",
               "cu_seqlens_q": [0, 5], "cu_seqlens_kv": [0, 5],
               "cu_seqlens_q_padded": [0, 8], "cu_seqlens_kv_padded": [0, 8],
               "max_seqlen_q": 8, "max_seqlen_kv": 8})
    );
    let padded = &doc.packs[4];
    assert_eq!((padded.tokens, padded.padded_tokens), (5, 8));
    // Padding positions 5..8 in 2 chunks of one member: 5 + ⌊3/2⌋ = 6.
    assert_eq!(padded.padding_cp_runs, [[[5, 6], [6, 8]]]);
    // f3: 7 tokens on a CP group of 2: chunks at 0, 1, 3, 5, 7; padded to a multiple of 4.
    let merged = &doc.packs[6];
    assert_eq!((merged.cp_size, merged.dp_ranks.clone()), (2, vec![0, 1]));
    assert_eq!(
        merged.slices[0].cp_runs,
        [[[0, 1], [5, 7]], [[1, 3], [3, 5]]]
    );
    assert_eq!(params(6)["cu_seqlens_q_padded"], json!([0, 8]));
    assert_eq!(params(6)["max_seqlen_q"], json!(8));
    assert!(merged.padding_cp_runs.is_empty());
    // One member owns every token: two runs splitting the slice at its middle.
    assert_eq!(doc.packs[0].slices[0].cp_runs, [[[0, 3], [3, 6]]]);
    // f0 splits along b1 (d0 0..6) and b0 (d1 0..4); backward runs b0 then b1, so the forward
    // sub-batches run b1's group first.
    let groups: Vec<(u32, Vec<u32>)> = doc.packs[0]
        .sub_batches
        .iter()
        .map(|g| (g.backward_pack, g.slices.clone()))
        .collect();
    assert_eq!(groups, [(3, vec![0]), (2, vec![1])]);
    assert_eq!(
        doc.packs[1].sub_batches,
        [SubBatch {
            backward_pack: 2,
            slices: vec![0]
        }]
    );
    assert!(doc.packs[2].sub_batches.is_empty());
}

#[test]
fn every_rank_has_its_ops_with_p2p_cp_exchanges_and_the_tied_embedding_sum() {
    let doc = doc(HAND);
    assert_eq!(doc.spec.parallel.cp, Some(1));
    assert!(doc.cp_chosen);
    // Rank = dp + 2 pp.
    let expected = json!([
        {"op": "forward", "pack": 0},
        {"op": "send", "pack": 0, "direction": "forward", "to": 2},
        {"op": "forward", "pack": 1},
        {"op": "send", "pack": 1, "direction": "forward", "to": 2},
        {"op": "recv", "pack": 2, "direction": "backward", "from": 2},
        {"op": "backward", "pack": 2},
        {"op": "recv", "pack": 3, "direction": "backward", "from": 2},
        {"op": "backward", "pack": 3},
        {"op": "cp_exchange", "pack": 6, "direction": "forward", "ranks": [0, 1]},
        {"op": "forward", "pack": 6},
        {"op": "send", "pack": 6, "direction": "forward", "to": 2},
        {"op": "recv", "pack": 7, "direction": "backward", "from": 2},
        {"op": "cp_exchange", "pack": 7, "direction": "backward", "ranks": [0, 1]},
        {"op": "backward", "pack": 7},
        {"op": "tied_embedding_all_reduce", "ranks": [0, 2]},
        {"op": "reduce_scatter", "ranks": [0, 1]},
        {"op": "optimizer"},
        {"op": "all_gather", "ranks": [0, 1]}
    ]);
    assert_eq!(ops_with_ranks(&doc, 0), expected);
    let tied: Vec<Vec<u64>> = doc.devices[3]
        .ops
        .iter()
        .filter(|op| matches!(op, DeviceOp::TiedEmbeddingAllReduce { .. }))
        .map(|op| ranks(&doc, op))
        .collect();
    assert_eq!(tied, [vec![1, 3]]);
    // Each group once, in order of first mention: rank 0's CP group [0, 1] is also stage 0's
    // sync group; then the tied pairs of ranks 0 and 1, and [2, 3] (stage 1's CP and sync
    // group, first named by rank 2).
    let groups: Vec<Vec<u64>> = doc.groups.iter().map(|g| g.ranks().collect()).collect();
    assert_eq!(groups, [vec![0, 1], vec![0, 2], vec![1, 3], vec![2, 3]]);
    assert_eq!(
        serde_json::to_value(&doc.groups[1]).unwrap(),
        json!({"runs": [{"first": 0, "stride": 2, "count": 2}]})
    );
    let json = serde_json::to_value(&doc.devices[0].ops).unwrap();
    assert_eq!(json[15], json!({"op": "reduce_scatter", "group": 0}));

    // Untied embeddings: no such op anywhere.
    let mut untied = step(HAND);
    untied.spec.model.tied_embeddings = false;
    let untied = document(&untied, None).unwrap();
    assert!(untied
        .devices
        .iter()
        .flat_map(|d| &d.ops)
        .all(|op| !matches!(op, DeviceOp::TiedEmbeddingAllReduce { .. })));
}

/// Every send has one matching receive, and between two ranks the receiver posts its receives
/// in the order the sender sends (so untagged transports match them).
fn assert_p2p_pairs_in_order(doc: &ScheduleDocument) {
    use std::collections::BTreeMap;
    let mut sent: BTreeMap<(u64, u64), Vec<(u32, Direction)>> = BTreeMap::new();
    let mut received: BTreeMap<(u64, u64), Vec<(u32, Direction)>> = BTreeMap::new();
    for device in &doc.devices {
        for op in &device.ops {
            match *op {
                DeviceOp::Send {
                    pack,
                    direction,
                    to,
                    ..
                } => sent
                    .entry((device.rank, to))
                    .or_default()
                    .push((pack, direction)),
                DeviceOp::Recv {
                    pack,
                    direction,
                    from,
                    ..
                } => received
                    .entry((from, device.rank))
                    .or_default()
                    .push((pack, direction)),
                _ => {}
            }
        }
    }
    assert!(!sent.is_empty());
    assert_eq!(sent, received);
}

#[test]
fn point_to_point_ops_pair_up_in_order() {
    assert_p2p_pairs_in_order(&doc(HAND));
    assert_p2p_pairs_in_order(&doc(TINY));
}

#[test]
fn a_static_cp_degree_chosen_from_the_dp_pool_shows_in_the_layout_and_coordinates() {
    let source = one_stage("tp=1 pp=1 dp=4", &["0, 1", "2, 3"]);
    let doc = doc(&source);
    assert!(doc.cp_chosen);
    assert_eq!((doc.spec.parallel.cp, doc.spec.parallel.dp), (Some(2), 2));
    let coords: Vec<(u32, u32)> = doc
        .devices
        .iter()
        .map(|d| (d.coords.cp, d.coords.dp))
        .collect();
    assert_eq!(coords, [(0, 0), (1, 0), (0, 1), (1, 1)]);
    assert_eq!(
        doc.replicas,
        [
            ReplicaDocument {
                dp_ranks: vec![0],
                cp_size: 2
            },
            ReplicaDocument {
                dp_ranks: vec![1],
                cp_size: 2
            }
        ]
    );
    assert_eq!(doc.packs[2].dp_ranks, [1]);
    assert_eq!(doc.packs[2].cp_size, 2);
    let ops = ops_with_ranks(&doc, 3);
    let ops = ops.as_array().unwrap();
    assert!(ops.contains(
        &json!({"op": "cp_exchange", "pack": 2, "direction": "forward", "ranks": [2, 3]})
    ));
    assert!(ops.contains(&json!({"op": "reduce_scatter", "ranks": [0, 1, 2, 3]})));
    // It reads back into the pool layout the IR was compiled in.
    let back = to_ir(&doc).unwrap();
    assert_eq!(back.spec.parallel.cp, None);
    assert_eq!(back.spec.parallel.dp, 4);
}

#[test]
fn a_static_cp_degree_fixed_by_the_layout_gets_cp_exchanges_and_cp_peers_in_the_sync() {
    let source = one_stage("tp=1 cp=2 pp=1 dp=2", &["0", "1"]);
    let doc = doc(&source);
    assert!(!doc.cp_chosen);
    assert_eq!(doc.replicas[1].cp_size, 2);
    // Rank 3: cp 1 of DP rank 1.
    assert_eq!((doc.devices[3].coords.cp, doc.devices[3].coords.dp), (1, 1));
    let ops = ops_with_ranks(&doc, 3);
    assert_eq!(
        ops[0],
        json!({"op": "cp_exchange", "pack": 2, "direction": "forward", "ranks": [2, 3]})
    );
    assert_eq!(ops[1], json!({"op": "forward", "pack": 2}));
    assert_eq!(
        ops.as_array().unwrap().last(),
        Some(&json!({"op": "all_gather", "ranks": [0, 1, 2, 3]}))
    );
    // 9 tokens over 2 members: chunks at 0, 2, 4, 6, 9.
    assert_eq!(
        doc.packs[2].slices[0].cp_runs,
        [[[0, 2], [6, 9]], [[2, 4], [4, 6]]]
    );
    assert_eq!(doc.packs[2].packed_seq_params.cu_seqlens_q_padded, [0, 12]);
    to_ir(&doc).unwrap();
}

#[test]
fn padded_offsets_round_each_segment_and_extend_the_last() {
    assert_eq!(build::padded_offsets(&[0, 5, 9], 0, 1), [0, 5, 9]);
    assert_eq!(build::padded_offsets(&[0, 5, 9], 3, 1), [0, 5, 12]);
    assert_eq!(build::padded_offsets(&[0, 5, 9], 0, 4), [0, 8, 12]);
    assert_eq!(build::padded_offsets(&[0, 5, 9], 3, 4), [0, 8, 16]);
    assert_eq!(build::padded_offsets(&[0], 0, 4), [0]);
}

#[test]
fn other_versions_get_one_line_naming_both() {
    // A version 2 document (this step's, as the previous build wrote it).
    let error = parse(V2).unwrap_err().to_string();
    assert_eq!(
        error,
        "schedule version 2 is not supported: this build reads and writes version 3 (compile the step again to get a version 3 document)"
    );
    let mut json: Value = serde_json::to_value(doc(TINY)).unwrap();
    for other in [1, 4] {
        json["version"] = other.into();
        let error = parse(&json.to_string()).unwrap_err().to_string();
        assert!(
            error.contains(&format!("version {other} is not supported"))
                && error.contains("version 3"),
            "{error}"
        );
        assert_eq!(error.lines().count(), 1);
    }
    let error = parse("{\"format\": \"other\"}").unwrap_err().to_string();
    assert!(error.contains("not a slimpack schedule"), "{error}");
}

#[test]
fn unknown_fields_are_rejected_everywhere() {
    let original = serde_json::to_value(doc(HAND)).unwrap();
    let places: [&[&str]; 11] = [
        &[],
        &["groups", "0"],
        &["groups", "0", "runs", "0"],
        &["spec", "model"],
        &["spec", "parallel"],
        &["loss"],
        &["samples", "0"],
        &["slices", "0"],
        &["packs", "0", "packed_seq_params"],
        &["packs", "0", "slices", "0"],
        &["devices", "0", "ops", "0"],
    ];
    for place in places {
        let mut json = original.clone();
        let mut at = &mut json;
        for key in place {
            at = match key.parse::<usize>() {
                Ok(i) => &mut at[i],
                Err(_) => &mut at[*key],
            };
        }
        at["surprise"] = 1.into();
        let error = parse(&json.to_string()).unwrap_err().to_string();
        assert!(
            error.contains("unknown field `surprise`"),
            "{place:?}: {error}"
        );
    }
}

#[test]
fn edited_derived_fields_are_named() {
    let original = serde_json::to_value(doc(HAND)).unwrap();
    let cases: [(&[&str], Value, &str); 11] = [
        // Stage 1's sync group [2, 3] made [2]: in range, but rank 3 still runs its sync
        // (refused when the document is parsed, before any derivation).
        (
            &["groups", "3", "runs", "0", "count"],
            json!(1),
            "group 3 does not list rank 3, whose ops name it",
        ),
        // Rank 0's reduce-scatter (ops[15]) over the tied pair instead of its stage's group.
        (
            &["devices", "0", "ops", "15", "group"],
            json!(1),
            "devices (rank 0): ops[15].group is 1, but the schedule gives 0",
        ),
        // The same ranks written as two runs.
        (
            &["groups", "0", "runs"],
            json!([{"first": 0, "stride": 1, "count": 1}, {"first": 1, "stride": 1, "count": 1}]),
            "group 0: runs",
        ),
        (
            &["packs", "1", "packed_seq_params", "cu_seqlens_kv"],
            json!([0, 4]),
            "pack 1: packed_seq_params.cu_seqlens_kv[1] is 4, but the schedule gives 10",
        ),
        (
            &["packs", "4", "packed_seq_params", "cu_seqlens_q_padded"],
            json!([0, 5]),
            "pack 4: packed_seq_params.cu_seqlens_q_padded[1]",
        ),
        (
            &["packs", "0", "sub_batches"],
            json!([{"backward_pack": 2, "slices": [0, 1]}]),
            "pack 0: sub_batches",
        ),
        (
            &["packs", "6", "slices", "0", "cp_runs"],
            json!([[[0, 4], [4, 4]], [[4, 7], [7, 7]]]),
            "pack 6: slices[0].cp_runs",
        ),
        (
            &["slices", "0", "dkv_from"],
            json!([0, 1]),
            "slice 0: dkv_from",
        ),
        (
            &["slices", "1", "target_end"],
            json!(11),
            "slice 1: target_end",
        ),
        (&["loss", "target_tokens"], json!(25), "loss: target_tokens"),
        (
            &["replicas", "2", "cp_size"],
            json!(1),
            "replica 2: cp_size",
        ),
    ];
    for (place, value, message) in cases {
        let mut json = original.clone();
        let mut at = &mut json;
        for key in place {
            at = match key.parse::<usize>() {
                Ok(i) => &mut at[i],
                Err(_) => &mut at[*key],
            };
        }
        *at = value;
        let error = match parse(&json.to_string()) {
            Ok(doc) => to_ir(&doc).unwrap_err().to_string(),
            Err(error) => error.to_string(),
        };
        assert!(error.contains(message), "{place:?}: {error}");
    }
    // A missing embedding sum, and swapped ops, are named by rank.
    let mut edited = doc(HAND);
    edited.devices[2]
        .ops
        .retain(|op| !matches!(op, DeviceOp::TiedEmbeddingAllReduce { .. }));
    let error = to_ir(&edited).unwrap_err().to_string();
    assert!(
        error.contains("lists rank 2, whose ops do not name it"),
        "{error}"
    );
    let mut edited = doc(TINY);
    edited.devices[5].ops.swap(0, 1);
    let error = to_ir(&edited).unwrap_err().to_string();
    assert!(error.contains("rank 5"), "{error}");
}

#[test]
fn packs_past_the_int32_range_are_refused() {
    let source = HAND
        .replace("len=5 doc=3", "len=3000000000 doc=3")
        .replace("%d3.0 = slice 0..5", "%d3.0 = slice 0..3000000000")
        .replace(" pad=8", "");
    let ir = step(&source);
    let error = document(&ir, None).unwrap_err().to_string();
    assert!(
        error.contains("pack 4 (%f2)") && error.contains("int32"),
        "{error}"
    );
}

#[test]
fn the_schema_is_closed_and_bounds_its_integers() {
    let schema: Value = serde_json::from_str(&schema()).unwrap();
    fn walk(node: &Value, path: &str, open: &mut Vec<String>) {
        match node {
            Value::Object(map) => {
                if map.get("type") == Some(&json!("object"))
                    && map.get("additionalProperties") != Some(&json!(false))
                {
                    open.push(path.to_string());
                }
                for (key, value) in map {
                    walk(value, &format!("{path}/{key}"), open);
                }
            }
            Value::Array(items) => {
                for (i, value) in items.iter().enumerate() {
                    walk(value, &format!("{path}/{i}"), open);
                }
            }
            _ => {}
        }
    }
    let mut open = Vec::new();
    walk(&schema, "", &mut open);
    assert!(open.is_empty(), "open objects: {open:?}");
    let params = &schema["$defs"]["PackedSeqParams"]["properties"];
    assert_eq!(
        params["cu_seqlens_kv"]["items"]["maximum"],
        json!(2147483647)
    );
    assert_eq!(params["cu_seqlens_kv"]["items"]["minimum"], json!(0));
    assert_eq!(params["max_seqlen_q"]["maximum"], json!(2147483647));
    assert_eq!(schema["properties"]["version"]["minimum"], json!(3));
    assert_eq!(schema["properties"]["version"]["maximum"], json!(3));
    let run = &schema["$defs"]["RankRun"]["properties"];
    assert_eq!(run["stride"]["minimum"], json!(1));
    assert_eq!(run["count"]["minimum"], json!(1));
    let op = serde_json::to_string(&schema["$defs"]["DeviceOp"]).unwrap();
    assert!(op.contains("tied_embedding_all_reduce"));
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
    let mut json = serde_json::to_string_pretty(&doc(TINY)).unwrap();
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

#[test]
fn rank_groups_are_greedy_strided_runs() {
    let runs = |ranks: &[u64]| -> Vec<(u64, u64, u64)> {
        let group = RankGroup::of_ranks(ranks);
        assert_eq!(group.ranks().collect::<Vec<_>>(), ranks, "round trip");
        assert_eq!(group.size(), ranks.len() as u64);
        group
            .runs
            .iter()
            .map(|r| (r.first, r.stride, r.count))
            .collect()
    };
    assert_eq!(runs(&[5]), [(5, 1, 1)]);
    assert_eq!(runs(&[0, 8, 16, 24]), [(0, 8, 4)]);
    assert_eq!(runs(&[0, 1, 2, 3, 8, 9]), [(0, 1, 4), (8, 1, 2)]);
    assert_eq!(runs(&[3, 7]), [(3, 4, 2)]);
    // Decreasing ranks start a new run; member order is kept.
    assert_eq!(runs(&[4, 2, 0]), [(4, 1, 1), (2, 1, 1), (0, 1, 1)]);
    assert_eq!(runs(&[0, 5, 6, 7]), [(0, 5, 2), (6, 1, 2)]);
    assert!(RankGroup::of_ranks(&[]).runs.is_empty());
}

/// A one-stage step on `dp` DP ranks of `tp` devices each, one replica per rank.
fn wide(tp: u32, dp: u32) -> ScheduleDocument {
    let ranks: Vec<String> = (0..dp).map(|r| r.to_string()).collect();
    let replicas: Vec<&str> = ranks.iter().map(String::as_str).collect();
    doc(&one_stage(&format!("tp={tp} cp=1 pp=1 dp={dp}"), &replicas))
}

#[test]
fn the_sync_group_is_one_run_so_the_document_grows_linearly_with_dp() {
    let doc = wide(2, 64);
    // One group per tp coordinate: every second rank, 64 of them.
    assert_eq!(doc.groups.len(), 2);
    assert_eq!(
        doc.groups[1].runs,
        [RankRun {
            first: 1,
            stride: 2,
            count: 64
        }]
    );
    assert!(doc.devices[127]
        .ops
        .contains(&DeviceOp::ReduceScatter { group: 1 }));
    to_ir(&doc).unwrap();
    // Twice the DP ranks, twice the text (give or take the digits of larger numbers).
    let size = |dp: u32| serde_json::to_string(&wide(1, dp)).unwrap().len() as f64;
    let growth = size(512) / size(256);
    assert!((1.9..2.2).contains(&growth), "{growth}");
}

/// `parse`'s one-line error for the document of `HAND` after `edit`.
fn parse_edited(edit: impl FnOnce(&mut Value)) -> String {
    let mut json = serde_json::to_value(doc(HAND)).unwrap();
    edit(&mut json);
    let error = parse(&json.to_string()).unwrap_err().to_string();
    assert_eq!(error.lines().count(), 1, "{error}");
    error
}

#[test]
fn groups_and_group_indices_out_of_range_are_one_line_errors() {
    // pp=2 dp=2: 4 devices.
    let error = parse_edited(|json| json["devices"][0]["ops"][17]["group"] = 4.into());
    assert_eq!(
        error,
        "devices (rank 0): ops[17] names group 4, but there are 4"
    );
    let error = parse_edited(|json| json["devices"][0]["ops"][15]["group"] = (-1).into());
    assert!(error.contains("invalid value: integer `-1`"), "{error}");
    let error = parse_edited(|json| json["groups"][3]["runs"][0]["first"] = 3.into());
    assert_eq!(
        error,
        "group 3: runs[0] (2 ranks from 3, 1 apart) goes past rank 3, the last of the layout tp=1,cp=1,pp=2,dp=2"
    );
    let error = parse_edited(|json| {
        json["groups"][0]["runs"][0] = json!({"first": 1, "stride": u64::MAX, "count": 3})
    });
    assert!(
        error.contains("group 0: runs[0] (3 ranks from 1"),
        "{error}"
    );
    let error = parse_edited(|json| json["groups"][2]["runs"][0]["stride"] = 0.into());
    assert!(
        error.contains("group 2: runs[0] has stride 0 and count 2"),
        "{error}"
    );
    let error = parse_edited(|json| json["groups"][2]["runs"][0]["count"] = 0.into());
    assert!(error.contains("count 0"), "{error}");
    let error = parse_edited(|json| json["groups"][1]["runs"] = json!([]));
    assert_eq!(error, "group 1 has no runs of ranks");
    let error = parse_edited(|json| json["groups"] = json!([]));
    assert!(error.contains("names group 0, but there are 0"), "{error}");
    // A structurally valid document built in code is checked by `to_ir` too.
    let mut edited = doc(HAND);
    edited.groups.truncate(2);
    let error = to_ir(&edited).unwrap_err().to_string();
    assert!(error.contains("names group 2, but there are 2"), "{error}");
}
