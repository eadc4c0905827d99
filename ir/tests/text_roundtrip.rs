//! Property: printing is canonical. For random IR (random layouts, samples, slicings, replicas
//! including DP-Merge groups, asymmetric packs and schedules), `print(parse(print(ir)))` equals
//! `print(ir)`, byte for byte, whether or not the IR satisfies the verifier.

use proptest::prelude::*;

use slimpack_ir::batch::Sample;
use slimpack_ir::step::{BatchInfo, Direction, Pack, Phase, StepIr};
use slimpack_ir::{text, Spec};

/// A random IR described by plain numbers, built deterministically.
#[derive(Debug, Clone)]
struct Shape {
    pp: u32,
    dp: u32,
    context: Option<u32>,
    samples: Vec<(u32, Vec<u32>)>, // length, cut points as fractions (per mille)
    replicas: u32,
    merged: bool,
    packs_per_replica: usize,
    cap: Option<u32>,
    phase: usize,
    name: String,
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        prop_oneof![Just(1u32), Just(2), Just(4)],
        1u32..5,
        prop::option::of(1u32..100_000),
        prop::collection::vec(
            (1u32..50_000, prop::collection::vec(1u32..1000, 0..4)),
            1..12,
        ),
        1u32..4,
        any::<bool>(),
        1usize..4,
        prop::option::of(1u32..100_000),
        0usize..4,
        "[a-z\\\\\" /.-]{0,12}",
    )
        .prop_map(
            |(pp, dp, context, samples, replicas, merged, packs_per_replica, cap, phase, name)| {
                Shape {
                    pp,
                    dp,
                    context,
                    samples,
                    replicas,
                    merged,
                    packs_per_replica,
                    cap,
                    phase,
                    name,
                }
            },
        )
}

fn build(shape: &Shape) -> StepIr {
    let mut spec = Spec::from_presets("tiny", "cpu", "tp=1,pp=1,dp=1").unwrap();
    spec.parallel.pp = shape.pp;
    spec.parallel.dp = shape.dp;
    let info = BatchInfo {
        source: shape.name.clone(),
        context: shape.context,
        documents: shape.samples.len() as u64,
        documents_cut: 0,
    };
    let mut ir = StepIr::new(spec, info);
    let mut sample_ids = Vec::new();
    for (doc, (len, cuts)) in shape.samples.iter().enumerate() {
        let id = ir.add_sample(Sample {
            len: *len,
            doc: doc as u64,
            piece: 0,
        });
        let mut points: Vec<u32> = cuts
            .iter()
            .map(|c| (*len as u64 * *c as u64 / 1000) as u32)
            .collect();
        points.push(*len);
        points.sort();
        points.dedup();
        let mut lengths = Vec::new();
        let mut start = 0;
        for p in points {
            if p > start {
                lengths.push(p - start);
                start = p;
            }
        }
        ir.set_slices(id, &lengths);
        sample_ids.push(id);
    }
    if shape.phase == 0 {
        return ir;
    }
    let mut replicas: Vec<_> = (0..shape.replicas)
        .map(|r| ir.add_replica(vec![r]))
        .collect();
    if shape.merged {
        replicas.push(ir.add_replica(vec![shape.replicas, shape.replicas + 1]));
    }
    for (i, &sample) in sample_ids.iter().enumerate() {
        ir.place_sample(sample, replicas[i % replicas.len()]);
    }
    ir.advance(Phase::Assigned);
    if shape.phase == 1 {
        return ir;
    }
    for &replica in &replicas {
        let slices: Vec<_> = ir
            .samples_on(replica)
            .iter()
            .flat_map(|&s| ir.slices_of(s))
            .collect();
        if slices.is_empty() {
            continue;
        }
        for direction in [Direction::Forward, Direction::Backward] {
            let chunk = slices.len().div_ceil(shape.packs_per_replica).max(1);
            let ordered: Vec<_> = match direction {
                Direction::Forward => slices.clone(),
                Direction::Backward => slices.iter().rev().copied().collect(),
            };
            for members in ordered.chunks(chunk) {
                ir.add_pack(
                    Pack {
                        direction,
                        cap: shape.cap,
                    },
                    replica,
                    members,
                );
            }
        }
    }
    ir.advance(Phase::Packed);
    if shape.phase == 2 {
        return ir;
    }
    for &replica in &replicas {
        let mut order = ir.packs_on(replica, Direction::Forward);
        order.extend(ir.packs_on(replica, Direction::Backward));
        if order.len() >= 2 {
            for stage in 0..shape.pp {
                ir.set_schedule(replica, stage, &order);
            }
        }
    }
    ir.advance(Phase::Scheduled);
    ir
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn print_parse_print_is_identity(shape in shape()) {
        let ir = build(&shape);
        let printed = text::print(&ir);
        let parsed = text::parse(&printed, "roundtrip").map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(text::print(&parsed), printed);
    }
}
