//! The verifier's tests that break an invariant by hand (the text form and the public API
//! cannot), and check it is reported.

use super::*;
use crate::batch::Sample;
use crate::step::{BatchInfo, Direction, Edge, Node, Pack, SampleId};
use crate::Spec;

/// A tiny step with one sample cut into slices of `lengths`, which the verifier accepts.
fn one_sliced_sample(lengths: &[u32]) -> (StepIr, Vec<SliceId>) {
    let spec = Spec::from_presets("tiny", "cpu", "tp=1,pp=1,dp=1").unwrap();
    let mut ir = StepIr::new(spec, BatchInfo::default());
    let sample = ir.add_sample(Sample {
        len: lengths.iter().sum(),
        doc: 0,
        piece: 0,
    });
    let slices = ir.set_slices(sample, lengths);
    assert!(check(&ir).is_empty());
    (ir, slices)
}

/// `slice-chain` cannot be broken through the text form or the public API (both build the
/// chain from offsets), so this test cuts an edge by hand.
#[test]
fn a_missing_dependency_edge_is_reported() {
    let (mut ir, slices) = one_sliced_sample(&[4, 6]);
    let edge = ir
        .graph()
        .find_edge(slices[0].node(), slices[1].node())
        .expect("the chain edge exists");
    assert_eq!(ir.graph()[edge], Edge::Next);
    ir.graph_mut().remove_edge(edge);
    let errors = check(&ir);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].invariant, "slice-chain");
    assert_eq!(errors[0].location, "%d0.0");
}

/// The slice table the passes read (`StepIr::slice`, `next_slice`, `sample_of`) is kept
/// beside the slice nodes; the public API changes both together, so this test rewrites a
/// node by hand.
#[test]
fn a_slice_table_that_disagrees_with_the_nodes_is_reported() {
    let (mut ir, slices) = one_sliced_sample(&[4, 6]);
    ir.graph_mut()[slices[1].node()] = Node::Slice(crate::step::Slice { start: 5, len: 5 });
    reports_a_table_disagreement(&ir);
}

/// A tiny step with one sample cut into slices of `lengths`, all in one forward pack.
fn one_forward_pack(lengths: &[u32]) -> (StepIr, PackId, ReplicaId, Vec<SliceId>) {
    let (mut ir, slices) = one_sliced_sample(lengths);
    let sample = ir.samples()[0];
    let replica = ir.add_replica(vec![0]);
    ir.place_sample(sample, replica);
    let pack = ir.add_pack(
        Pack {
            direction: Direction::Forward,
            cap: None,
        },
        replica,
        &slices,
    );
    (ir, pack, replica, slices)
}

/// The pack lists `StepIr::packs_on` reads are kept beside the placement edges; the
/// public API changes both together, so this test cuts an edge by hand.
#[test]
fn a_pack_list_that_disagrees_with_the_edges_is_reported() {
    let (mut ir, pack, replica, _) = one_forward_pack(&[10]);
    let edge = ir
        .graph()
        .find_edge(pack.node(), replica.node())
        .expect("the placement edge exists");
    ir.graph_mut().remove_edge(edge);
    let errors = check(&ir);
    assert!(
        errors
            .iter()
            .any(|e| e.message.contains("fwd pack list is not the order")),
        "{errors:?}"
    );
}

/// A pack's slice list (`StepIr::pack_members`) and its member edges, likewise (the edges
/// reordered by hand).
#[test]
fn a_slice_list_that_disagrees_with_the_edges_is_reported() {
    let (mut ir, pack, _, slices) = one_forward_pack(&[4, 6]);
    assert!(check(&ir).iter().all(|e| !e.message.contains("slice list")));
    for (slice, position) in [(slices[0], 1), (slices[1], 0)] {
        let edge = ir.graph().find_edge(slice.node(), pack.node()).unwrap();
        ir.graph_mut()[edge] = Edge::Member { position };
    }
    let errors = check(&ir);
    assert!(
        errors.iter().any(|e| e
            .message
            .contains("slice list is not the order of its member edges")),
        "{errors:?}"
    );
}

/// A slice node the slice table has no row for (added to the graph by hand, past the table's
/// end) is reported, not a panic: the verifier reads slices from the graph.
#[test]
fn a_slice_node_without_a_table_row_is_reported() {
    let (mut ir, slices) = one_sliced_sample(&[4, 6]);
    let sample = ir.samples()[0];
    let extra = ir
        .graph_mut()
        .add_node(Node::Slice(crate::step::Slice { start: 10, len: 2 }));
    ir.graph_mut()
        .add_edge(sample.node(), extra, Edge::Contains);
    ir.graph_mut().add_edge(slices[1].node(), extra, Edge::Next);
    reports_a_table_disagreement(&ir);
    // The new node itself, not only its predecessor (whose row says it is the last).
    assert!(check(&ir)
        .iter()
        .any(|e| e.location == "%d0.2" && e.message.contains("slice table disagrees")));
}

/// Asserts that `ir`'s check reports the slice table disagreeing with the graph.
fn reports_a_table_disagreement(ir: &StepIr) {
    let errors = check(ir);
    assert!(
        errors
            .iter()
            .any(|e| e.invariant == "slice-chain" && e.message.contains("slice table disagrees")),
        "{errors:?}"
    );
}

/// On a large step the verifier runs its sections on two threads; the errors are the same, in
/// the same order, as on one (here from the samples', the packs' and the schedules' sections).
#[test]
fn a_large_step_gets_the_same_errors_on_two_threads() {
    let spec = Spec::from_presets("tiny", "cpu", "tp=1,pp=1,dp=1").unwrap();
    let mut ir = StepIr::new(spec, BatchInfo::default());
    let replica = ir.add_replica(vec![0]);
    let samples: Vec<SampleId> = (0..PARALLEL_SAMPLES as u64)
        .map(|doc| {
            let sample = ir.add_sample(Sample {
                len: 10,
                doc,
                piece: 0,
            });
            ir.place_sample(sample, replica);
            sample
        })
        .collect();
    let mut forward = Vec::new();
    for chunk in samples.chunks(64) {
        let slices: Vec<SliceId> = chunk.iter().flat_map(|&s| ir.slices_of(s)).collect();
        for direction in [Direction::Forward, Direction::Backward] {
            let pack = ir.add_pack(
                Pack {
                    direction,
                    cap: None,
                },
                replica,
                &slices,
            );
            if direction == Direction::Forward {
                forward.push(pack);
            }
        }
    }
    assert!(check_on(&ir, false).is_empty());
    // Two forward packs over a cap, a sample longer than its slices.
    for pack in [forward[3], forward[7]] {
        ir.graph_mut()[pack.node()] = Node::Pack(Pack {
            direction: Direction::Forward,
            cap: Some(100),
        });
    }
    ir.graph_mut()[samples[5].node()] = Node::Sample(Sample {
        len: 11,
        doc: 5,
        piece: 0,
    });
    ir.advance(Phase::Scheduled);
    let sequential = check_on(&ir, false);
    let invariants: Vec<&str> = sequential.iter().map(|e| e.invariant).collect();
    assert_eq!(
        invariants,
        ["slice-cover", "pack-cap", "pack-cap", "schedule-complete"],
        "{sequential:?}"
    );
    assert_eq!(check_on(&ir, true), sequential);
    assert_eq!(check(&ir), sequential);
}
