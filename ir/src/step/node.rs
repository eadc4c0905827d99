//! Node and edge payloads of the step IR, and the compilation phase.

use crate::spec::Recompute;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

pub use crate::batch::Sample;

/// How far compilation has gone. Phases only move forward; each pass states which phases it
/// accepts and which it produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Samples (each with one or more slices); nothing placed.
    Logical,
    /// Every sample placed on a replica; replicas exist.
    Assigned,
    /// Every slice in exactly one forward and one backward pack.
    Packed,
    /// Every (replica, stage) has a total order of its packs.
    Scheduled,
    /// Per-device op lists exist.
    Lowered,
}

impl Phase {
    pub const ALL: [Phase; 5] = [
        Phase::Logical,
        Phase::Assigned,
        Phase::Packed,
        Phase::Scheduled,
        Phase::Lowered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Logical => "logical",
            Phase::Assigned => "assigned",
            Phase::Packed => "packed",
            Phase::Scheduled => "scheduled",
            Phase::Lowered => "lowered",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Phase {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Phase::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                let valid: Vec<_> = Phase::ALL.iter().map(|p| p.as_str()).collect();
                format!("unknown phase '{s}' (valid: {})", valid.join(", "))
            })
    }
}

/// Which pass of the training step a pack or task belongs to.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Forward,
    Backward,
}

impl Direction {
    /// The short keyword used in the text form (`fwd`, `bwd`).
    pub fn keyword(self) -> &'static str {
        match self {
            Direction::Forward => "fwd",
            Direction::Backward => "bwd",
        }
    }
}

/// Which part of a pack's work one op of a stage's order runs. A forward, and a backward that
/// is not split, run `Whole`. Zero-bubble schedules (Qi et al., "Zero Bubble Pipeline
/// Parallelism", ICLR 2024) split a backward into its input-gradient part `InputGrad` ("B":
/// attention backward, every layer's activation-gradient GEMMs, recomputation; the gradients
/// sent to the previous stage depend only on it) and its weight-gradient part `WeightGrad`
/// ("W": the weight-gradient GEMMs, deferrable, which the stage runs later on the same stage).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Part {
    #[default]
    Whole,
    InputGrad,
    WeightGrad,
}

impl Part {
    /// The suffix of a pack's name in a schedule of the text form (`%b0.dx`, `%b0.dw`).
    pub fn suffix(self) -> &'static str {
        match self {
            Part::Whole => "",
            Part::InputGrad => ".dx",
            Part::WeightGrad => ".dw",
        }
    }

    /// True for the default (an op that is not split), which serialisers leave out.
    pub fn is_whole(&self) -> bool {
        *self == Part::Whole
    }
}

/// One op of a stage's order: `part` of pack `pack` (see [`Part`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StageOp {
    pub pack: crate::step::PackId,
    pub part: Part,
}

impl StageOp {
    /// A forward, or a backward that is not split.
    pub fn whole(pack: crate::step::PackId) -> StageOp {
        StageOp {
            pack,
            part: Part::Whole,
        }
    }
}

/// A slice: tokens `[start, start + len)` of its sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slice {
    pub start: u32,
    pub len: u32,
}

impl Slice {
    /// One past the last token.
    pub fn end(&self) -> u32 {
        self.start + self.len
    }
}

/// A MicroPack: slices run together as one unit in one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pack {
    pub direction: Direction,
    /// Token cap the pack was built under, if any (checked by the verifier).
    pub cap: Option<u32>,
}

/// A pipeline stage: layers `[first_layer, first_layer + layers)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stage {
    pub index: u32,
    pub first_layer: u32,
    pub layers: u32,
    /// The stage's own activation recomputation, where a pass chose one (`assign-recompute`):
    /// it replaces the model's mode (`spec.model.recompute`) for this stage's layers, so that
    /// a stage holding few forwards in flight need not recompute what memory does not force.
    /// `None`: the model's mode. Read it through [`crate::StepIr::stage_recompute`].
    pub recompute: Option<Recompute>,
}

/// A replica: one DP rank, or a DP-Merge group of several acting as one context-parallel group.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Replica {
    /// DP ranks of the group, ascending.
    pub ranks: Vec<u32>,
}

impl Replica {
    /// True for a DP-Merge group (more than one DP rank).
    pub fn is_merged(&self) -> bool {
        self.ranks.len() > 1
    }
}

/// A node of the step IR.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    Sample(Sample),
    Slice(Slice),
    Pack(Pack),
    Stage(Stage),
    Replica(Replica),
}

/// An edge of the step IR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge {
    /// sample -> slice.
    Contains,
    /// slice j -> slice j+1 of the same sample (forward order).
    Next,
    /// slice -> pack; `position` orders the slices inside the pack.
    Member { position: u32 },
    /// pack -> replica; `position` orders a replica's packs of one direction. (A sample's
    /// placement and each stage's schedule are kept beside the graph, see
    /// [`crate::StepIr::place_sample`] and [`crate::StepIr::set_schedule`].)
    Placed { position: u32 },
}

/// What the batch was built from; printed in the IR header and carried to reports.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BatchInfo {
    /// Where the lengths came from (file name or synthetic description).
    pub source: String,
    /// Context length longer documents were cut to, if any.
    pub context: Option<u32>,
    /// Source documents drawn.
    pub documents: u64,
    /// Documents longer than the context that were cut into several samples.
    pub documents_cut: u64,
}
