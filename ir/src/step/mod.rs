//! The step IR: one training step as a petgraph graph.
//!
//! Nodes are samples, slices, packs (forward or backward MicroPacks), pipeline stages and
//! replicas (a DP replica, or a DP-Merge group of k replicas acting as one CP group). Edges say
//! containment (sample -> slice), dependency (slice j -> slice j+1 of the same sample), membership
//! (slice -> pack, with its position in the pack), placement (pack -> replica; a sample's replica
//! is kept beside the graph) and schedule order (pack -> next pack on one stage of one replica; a zero-bubble
//! schedule's deferred weight-gradient ops are kept beside the chain, see [`Part`]).
//!
//! Tables beside the graph repeat, for bulk reads, what some nodes and edges say: every slice's
//! tokens, sample and next slice; each replica's packs and each pack's slices in order. Only the
//! mutations that change the graph write them, and the verifier checks they agree with it.
//!
//! Every sample always has at least one slice: a freshly built IR has one whole-sample slice per
//! sample, and `slice` refines them. The [`Phase`] records how far compilation went; it only
//! moves forward. Ids are typed wrappers around petgraph node indices; iteration orders are
//! defined (insertion order, positions, offsets) so that the same input prints the same text.

mod build;
mod graph;
mod ids;
mod node;
mod recompute;
mod rows;
mod slices;

pub use graph::StepIr;
pub use ids::{PackId, ReplicaId, SampleId, SliceId, StageId};
pub use node::{
    BatchInfo, Direction, Edge, Node, Pack, Part, Phase, Replica, Sample, Slice, Stage, StageOp,
};
pub(crate) use rows::Rows;
pub use slices::SampleSlices;
