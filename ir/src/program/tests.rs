//! Lowering and checking hand-built steps.

use super::*;
use crate::step::Phase;
use crate::text::{parse, print};

/// Two stages, a plain replica on DP rank 0 and a DP-Merge group of ranks 1 and 2; one sample
/// of two slices on the group.
const STEP: &str = r#"step phase=scheduled {
  model name="tiny" layers=4 hidden=128 heads=4 kv_heads=2 head_dim=32 ffn=344 vocab=512 dtype=fp32 recompute=none tied_embeddings=false
  gpu name="cpu-2core" peak_flops=192000000000 hbm_bytes=25769803776 hbm_bandwidth=20000000000
  cluster name="cpu" gpus_per_node=2 intra_bandwidth=10000000000 intra_latency=0.000001 inter_bandwidth=10000000000 inter_latency=0.000001
  parallel tp=1 pp=2 dp=3
  batch source="test" documents=3 documents_cut=0
  %st0 = stage layers=0..2
  %st1 = stage layers=2..4
  %r0 = replica dp=[0]
  %r1 = replica dp=[1, 2]
  %d0 = sample len=100 doc=0 piece=0 on %r0
    %d0.0 = slice 0..100
  %d1 = sample len=300 doc=1 piece=0 on %r1
    %d1.0 = slice 0..200
    %d1.1 = slice 200..300
  %f0 = pack fwd on %r0 [%d0.0]
  %b0 = pack bwd on %r0 [%d0.0]
  %f1 = pack fwd on %r1 [%d1.0, %d1.1]
  %b1 = pack bwd on %r1 [%d1.1]
  %b2 = pack bwd on %r1 [%d1.0]
  schedule %r0 %st0 [%f0, %b0]
  schedule %r0 %st1 [%f0, %b0]
  schedule %r1 %st0 [%f1, %b1, %b2]
  schedule %r1 %st1 [%f1, %b1, %b2]
}
"#;

fn program() -> Program {
    lower(&parse(STEP, "test").unwrap())
}

#[test]
fn pack_layouts_carry_varlen_metadata() {
    let program = program();
    let f1 = &program.packs[2];
    assert_eq!(f1.name, "%f1");
    assert_eq!(f1.dp_ranks, vec![1, 2]);
    assert_eq!(f1.cu_seqlens_q, vec![0, 200, 300]);
    // The second slice attends to its 200-token prefix as well as itself.
    assert_eq!(f1.cu_seqlens_k, vec![0, 200, 500]);
    assert_eq!((f1.max_seqlen_q, f1.max_seqlen_k), (200, 300));
    assert_eq!(f1.position_offsets, vec![0, 200]);
    assert_eq!(f1.padded_tokens, 300);
}

#[test]
fn stages_exchange_activations_and_gradients() {
    let program = program();
    let first = &program.worker(Worker { dp: 0, pp: 0 }).ops;
    let last = &program.worker(Worker { dp: 0, pp: 1 }).ops;
    let to_last = Worker { dp: 0, pp: 1 };
    let to_first = Worker { dp: 0, pp: 0 };
    assert_eq!(
        first[..4],
        [
            Op::Forward { pack: 0, chunk: 0 },
            Op::Send {
                pack: 0,
                direction: Direction::Forward,
                to: to_last,
                chunk: 0,
            },
            Op::Recv {
                pack: 1,
                direction: Direction::Backward,
                from: to_last,
                chunk: 0,
            },
            Op::Backward {
                pack: 1,
                chunk: 0,
                part: Part::Whole,
            },
        ]
    );
    assert_eq!(
        last[..4],
        [
            Op::Recv {
                pack: 0,
                direction: Direction::Forward,
                from: to_first,
                chunk: 0,
            },
            Op::Forward { pack: 0, chunk: 0 },
            Op::Backward {
                pack: 1,
                chunk: 0,
                part: Part::Whole,
            },
            Op::Send {
                pack: 1,
                direction: Direction::Backward,
                to: to_first,
                chunk: 0,
            },
        ]
    );
    assert_eq!(last[4..], [Op::ReduceScatter, Op::Optimizer, Op::AllGather]);
}

#[test]
fn merged_groups_exchange_before_each_pack() {
    let program = program();
    let ops = &program.worker(Worker { dp: 2, pp: 0 }).ops;
    assert_eq!(
        ops[0],
        Op::CpExchange {
            pack: 2,
            direction: Direction::Forward,
            group: vec![1, 2],
            chunk: 0,
        }
    );
    assert_eq!(ops[1], Op::Forward { pack: 2, chunk: 0 });
    assert_eq!(check(&program), Ok(()));
}

#[test]
fn a_receive_without_its_send_deadlocks() {
    let mut program = program();
    let ops = &mut program.workers[0].ops; // dp=0 pp=0
    let send = ops
        .iter()
        .position(|op| matches!(op, Op::Send { .. }))
        .unwrap();
    ops.remove(send);
    let message = check(&program).unwrap_err().message;
    assert!(message.contains("deadlocks"), "{message}");
    assert!(
        message.contains("worker dp=0 pp=1 at recv %f0"),
        "{message}"
    );
}

#[test]
fn a_collective_with_a_missing_member_deadlocks() {
    let mut program = program();
    program.workers[1].ops.retain(|op| *op != Op::AllGather);
    let message = check(&program).unwrap_err().message;
    assert!(message.contains("at all-gather"), "{message}");
}

#[test]
fn crossed_receives_deadlock() {
    let mut program = program();
    // Stage 0 waits for the backward gradient before sending the forward activations.
    let ops = &mut program.workers[0].ops;
    ops.swap(1, 2);
    assert!(check(&program).unwrap_err().message.contains("deadlocks"));
}

#[test]
fn an_unreceived_send_is_reported() {
    let mut program = program();
    let extra = Op::Send {
        pack: 0,
        direction: Direction::Forward,
        to: Worker { dp: 0, pp: 1 },
        chunk: 0,
    };
    program.workers[0].ops.insert(2, extra);
    assert!(check(&program)
        .unwrap_err()
        .message
        .contains("never receives"));
}

#[test]
fn lowered_text_round_trips_and_is_checked() {
    let mut ir = parse(STEP, "test").unwrap();
    super::lower_into(&mut ir).unwrap();
    ir.advance(Phase::Lowered);
    let text = print(&ir);
    assert!(text.contains("  worker dp=1 pp=1 {\n    recv fwd %f1 from dp=1 pp=0\n"));
    let again = parse(&text, "test").unwrap();
    assert_eq!(print(&again), text);
    crate::verify::verify(&again).unwrap();

    let edited = text.replacen("    bwd %b2\n", "    bwd %b1\n", 1);
    let error = parse(&edited, "test").unwrap_err().to_string();
    assert!(error.contains("derived from the schedule"), "{error}");

    // A lowered step must carry its program, and exactly the schedule's.
    let mut bare = parse(STEP, "test").unwrap();
    bare.advance(Phase::Lowered);
    let invariants: Vec<_> = crate::verify::check(&bare)
        .iter()
        .map(|e| e.invariant)
        .collect();
    assert_eq!(invariants, ["program-stored"]);
    let mut stale = ir.clone();
    let other = parse(STEP, "test").unwrap();
    let mut program = lower(&other);
    program.workers.swap(0, 1);
    stale.set_program(program);
    let invariants: Vec<_> = crate::verify::check(&stale)
        .iter()
        .map(|e| e.invariant)
        .collect();
    assert_eq!(invariants, ["program-derived"]);
}
