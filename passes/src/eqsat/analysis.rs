//! The e-class analysis: what every e-class of a replica's e-graph holds, and the replica's
//! fixed facts the rules consult.
//!
//! Every term of one e-class covers the same tokens (the rules only regroup and re-slice), so a
//! slice list's e-class has one *coverage*; its terms differ only in where slices are cut. The
//! analysis keeps, per list and pack e-class, the common refinement of all its terms' slices
//! (`Members`): merging two e-classes refines, which is a join, so egg's fixpoint is well
//! defined. Regrouping rules move the pieces of that refinement, so a split in one e-class
//! makes the end of the slice movable everywhere that e-class is used. A pack e-class
//! also holds its time from the [`PackTimer`] at that finest cut (an upper bound on its terms'
//! times, as longer slices run attention at least as efficiently); a sequence e-class holds its
//! length in packs (kept runs included), from which a rule learns the position of the pack it
//! matched.

use std::cell::RefCell;
use std::rc::Rc;

use egg::{Analysis, DidMerge, EGraph, Id};

use super::cost::{PackLoad, PackTimer, SequenceCost};
use super::language::{Kept, Schedule, Span};
use slimpack_ir::step::Direction;

/// What the rules need to know of one of the replica's samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleFacts {
    pub len: u32,
    /// Position of the forward pack that holds the sample's last token in the input: its
    /// backward may not move into an earlier backward pack, and its last forward token may not
    /// move into a later forward pack (the release rule of `pack-bwd`).
    pub release: usize,
}

/// The replica's fixed facts: samples, pack counts and caps, rule parameters.
#[derive(Debug, Clone)]
pub struct ReplicaFacts {
    pub samples: Vec<SampleFacts>,
    pub forward_packs: usize,
    pub backward_packs: usize,
    /// Token cap of a forward pack: the packs' cap, and no more than the largest input forward
    /// pack (a stand-in for its activation memory, which `schedule-pipeline` sizes warm-ups by).
    pub forward_cap: u64,
    /// Token cap of a backward pack, likewise.
    pub backward_cap: u64,
    /// Slices are split only at multiples of this many tokens.
    pub grain: u32,
    /// Slices are merged only up to this length (the largest input slice).
    pub largest_slice: u32,
    /// Where the input cuts samples into slices, as sorted (sample, offset) pairs: merges never
    /// remove an input cut, since the other direction would keep it (see `slicing.rs`).
    pub input_cuts: Vec<(u32, u32)>,
    /// At most this many moves (or swaps) are added per matched pair of packs, the best first.
    pub fanout: usize,
    /// Per direction, per position: the input pack's time (what a kept run costs).
    pub kept_seconds: [Vec<f64>; 2],
}

/// The pass options the rules read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Knobs {
    pub grain: u32,
    pub fanout: usize,
}

impl ReplicaFacts {
    pub fn packs(&self, direction: Direction) -> usize {
        match direction {
            Direction::Forward => self.forward_packs,
            Direction::Backward => self.backward_packs,
        }
    }

    /// Sum and largest time of the kept run `kept` of `direction`.
    pub fn kept_cost(&self, direction: Direction, kept: Kept) -> SequenceCost {
        let seconds = &self.kept_seconds[direction_index(direction)];
        let run = &seconds[kept.first as usize..(kept.first + kept.count) as usize];
        run.iter()
            .rev()
            .fold(SequenceCost::default(), |sequence, &s| sequence.then(s))
    }

    pub fn cap(&self, direction: Direction) -> u64 {
        match direction {
            Direction::Forward => self.forward_cap,
            Direction::Backward => self.backward_cap,
        }
    }
}

/// 0 for forward, 1 for backward.
pub fn direction_index(direction: Direction) -> usize {
    match direction {
        Direction::Forward => 0,
        Direction::Backward => 1,
    }
}

/// The finest known slices of a list e-class, in canonical order, and their load.
#[derive(Debug, Clone, PartialEq)]
pub struct Members {
    pub spans: Rc<[Span]>,
    pub load: PackLoad,
}

/// Per e-class data.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    Slice(Span),
    Kept(Kept),
    List(Members),
    Pack {
        direction: Direction,
        members: Members,
        /// Time of the pack at its finest cut.
        seconds: f64,
    },
    /// A pack sequence (or `end`) of `packs` packs.
    Sequence {
        packs: usize,
    },
    Replica,
}

impl Data {
    pub fn span(&self) -> Span {
        match self {
            Data::Slice(span) => *span,
            other => panic!("{other:?} is not a slice; this is a bug"),
        }
    }

    pub fn members(&self) -> &Members {
        match self {
            Data::List(members) | Data::Pack { members, .. } => members,
            other => panic!("{other:?} is not a slice list; this is a bug"),
        }
    }

    pub fn seconds(&self) -> f64 {
        match self {
            Data::Pack { seconds, .. } => *seconds,
            other => panic!("{other:?} is not a pack; this is a bug"),
        }
    }

    pub fn packs(&self) -> usize {
        match self {
            Data::Sequence { packs } => *packs,
            other => panic!("{other:?} is not a pack sequence; this is a bug"),
        }
    }
}

/// The analysis: replica facts and the pack timer, shared with the cost function.
#[derive(Debug, Clone)]
pub struct ScheduleAnalysis {
    pub facts: Rc<ReplicaFacts>,
    pub timer: Rc<RefCell<PackTimer>>,
}

/// The e-graph of one replica.
pub type ScheduleGraph = EGraph<Schedule, ScheduleAnalysis>;

impl ScheduleAnalysis {
    fn pack(&self, direction: Direction, members: Members) -> Data {
        let seconds = self.timer.borrow_mut().seconds(direction, &members.load);
        Data::Pack {
            direction,
            members,
            seconds,
        }
    }
}

impl Analysis<Schedule> for ScheduleAnalysis {
    type Data = Data;

    fn make(egraph: &mut ScheduleGraph, enode: &Schedule, _id: Id) -> Data {
        let data = |id: Id| &egraph[id].data;
        match enode {
            Schedule::Slice(span) => Data::Slice(*span),
            Schedule::KeptPacks(kept) => Data::Kept(*kept),
            Schedule::Nil => Data::List(Members {
                spans: Rc::from(Vec::new()),
                load: PackLoad::default(),
            }),
            Schedule::Cons([head, rest]) => {
                let head = data(*head).span();
                let rest = data(*rest).members().clone();
                let mut spans = Vec::with_capacity(rest.spans.len() + 1);
                spans.push(head);
                spans.extend_from_slice(&rest.spans);
                let load = egraph
                    .analysis
                    .timer
                    .borrow_mut()
                    .load(head)
                    .add(&rest.load);
                Data::List(Members {
                    spans: Rc::from(spans),
                    load,
                })
            }
            Schedule::ForwardPack(list) => {
                let members = data(*list).members().clone();
                egraph.analysis.pack(Direction::Forward, members)
            }
            Schedule::BackwardPack(list) => {
                let members = data(*list).members().clone();
                egraph.analysis.pack(Direction::Backward, members)
            }
            Schedule::End => Data::Sequence { packs: 0 },
            Schedule::ForwardSeq([_, rest]) | Schedule::BackwardSeq([_, rest]) => Data::Sequence {
                packs: data(*rest).packs() + 1,
            },
            Schedule::ForwardKeep([kept, rest]) | Schedule::BackwardKeep([kept, rest]) => {
                let Data::Kept(kept) = data(*kept) else {
                    panic!("a keep node holds a kept run; this is a bug")
                };
                Data::Sequence {
                    packs: data(*rest).packs() + kept.count as usize,
                }
            }
            Schedule::Replica(_) => Data::Replica,
            Schedule::Idle | Schedule::Work(_) | Schedule::Pair(_) | Schedule::WholeSample(_) => {
                panic!(
                    "{enode:?} in a replica's e-graph (rank pairs have their own); this is a bug"
                )
            }
        }
    }

    fn merge(&mut self, a: &mut Data, b: Data) -> DidMerge {
        match (&mut *a, b) {
            (Data::List(mine), Data::List(theirs)) => {
                let (members, changed) = self.refine(mine, &theirs);
                *mine = members;
                changed
            }
            (
                Data::Pack {
                    direction,
                    members: mine,
                    seconds,
                },
                Data::Pack {
                    members: theirs, ..
                },
            ) => {
                let (members, changed) = self.refine(mine, &theirs);
                if changed.0 {
                    *seconds = self.timer.borrow_mut().seconds(*direction, &members.load);
                }
                *mine = members;
                changed
            }
            (mine, theirs) => {
                assert_eq!(
                    *mine, theirs,
                    "e-classes of different kinds or lengths were merged; this is a bug"
                );
                DidMerge(false, false)
            }
        }
    }
}

impl ScheduleAnalysis {
    /// The common refinement of two cuts of one coverage, and which side it changed.
    fn refine(&self, mine: &Members, theirs: &Members) -> (Members, DidMerge) {
        assert_eq!(
            mine.load.tokens, theirs.load.tokens,
            "slice lists of different coverage were merged; this is a bug"
        );
        let spans = common_refinement(&mine.spans, &theirs.spans);
        let changed = DidMerge(
            spans.len() != mine.spans.len(),
            spans.len() != theirs.spans.len(),
        );
        if !changed.0 {
            return (mine.clone(), changed);
        }
        let load = self.timer.borrow_mut().list_load(&spans);
        (
            Members {
                spans: Rc::from(spans),
                load,
            },
            changed,
        )
    }
}

/// The common refinement of two canonical lists of one coverage: every span of either, cut at
/// every boundary of the other. Per sample, both lists tile the same token range in offset
/// order, so one walk over both suffices.
pub fn common_refinement(a: &[Span], b: &[Span]) -> Vec<Span> {
    let mut spans = Vec::with_capacity(a.len().max(b.len()));
    let (mut i, mut j) = (0, 0);
    let mut start = a.first().map_or(0, |s| s.start);
    while i < a.len() && j < b.len() {
        let (x, y) = (a[i], b[j]);
        assert!(
            x.sample == y.sample && x.start <= start && y.start <= start,
            "slice lists of different coverage were merged ({x} vs {y}); this is a bug"
        );
        let end = x.end().min(y.end());
        spans.push(Span {
            sample: x.sample,
            start,
            len: end - start,
        });
        start = end;
        if y.end() == end {
            j += 1;
        }
        if x.end() == end {
            i += 1;
            // The next span may begin another sample's (or a later) run.
            if let Some(next) = a.get(i) {
                start = next.start;
            }
        }
    }
    assert!(
        i == a.len() && j == b.len(),
        "slice lists of different coverage were merged; this is a bug"
    );
    spans
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(sample: u32, start: u32, len: u32) -> Span {
        Span { sample, start, len }
    }

    #[test]
    fn refinement_cuts_at_both_sides_boundaries() {
        let a = [span(0, 0, 8), span(1, 0, 4)];
        let b = [span(0, 0, 3), span(0, 3, 5), span(1, 0, 2), span(1, 2, 2)];
        assert_eq!(common_refinement(&a, &b), b.to_vec());
        let c = [span(0, 0, 6), span(0, 6, 2), span(1, 0, 4)];
        assert_eq!(
            common_refinement(&b, &c),
            vec![
                span(0, 0, 3),
                span(0, 3, 3),
                span(0, 6, 2),
                span(1, 0, 2),
                span(1, 2, 2)
            ]
        );
    }
}
