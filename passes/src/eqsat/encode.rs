//! From the IR to a replica's term, and from an extracted term back to packs.
//!
//! [`ReplicaPlan`] is the schedule of one replica in spans: its samples (the spans' sample
//! numbers index them), and its forward and backward packs in run order, each pack's spans in
//! canonical order. The pass encodes the input plan as a term, saturates, extracts a term and
//! decodes it into a new plan.

use egg::{Id, RecExpr};
use rustc_hash::FxHashMap as HashMap;

use super::analysis::{Knobs, ReplicaFacts, SampleFacts};
use super::cost::PackTimer;
use super::language::{Kept, Schedule, Span};
use slimpack_ir::step::{Direction, ReplicaId, SampleId};
use slimpack_ir::StepIr;

/// How far around each of the slowest packs the term spells packs out.
pub const FOCUS_RADIUS: usize = 1;

/// One replica's packs, in spans.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaPlan {
    pub samples: Vec<SampleId>,
    pub forward: Vec<Vec<Span>>,
    pub backward: Vec<Vec<Span>>,
}

impl ReplicaPlan {
    /// The plans of all replicas that have packs, in replica order; one pass over the samples.
    pub fn all(ir: &StepIr) -> Vec<(ReplicaId, ReplicaPlan)> {
        ReplicaPlan::all_where(ir, |_| true)
    }

    /// [`ReplicaPlan::all`] of the replicas (by position in the IR's order) that `wanted` keeps.
    pub fn all_where(ir: &StepIr, wanted: impl Fn(usize) -> bool) -> Vec<(ReplicaId, ReplicaPlan)> {
        let mut on: HashMap<ReplicaId, Vec<SampleId>> = HashMap::default();
        let mut index: HashMap<SampleId, u32> = HashMap::default();
        for &sample in ir.samples() {
            if let Some(replica) = ir.replica_of_sample(sample) {
                let samples = on.entry(replica).or_default();
                index.insert(sample, samples.len() as u32);
                samples.push(sample);
            }
        }
        let mut plans = Vec::new();
        for (position, &replica) in ir.replicas().iter().enumerate() {
            if !wanted(position) {
                continue;
            }
            let packs = |direction| -> Vec<Vec<Span>> {
                ir.packs_on(replica, direction)
                    .into_iter()
                    .map(|pack| {
                        let mut spans: Vec<Span> = ir
                            .pack_members(pack)
                            .iter()
                            .map(|&slice_id| {
                                let slice = ir.slice(slice_id);
                                Span {
                                    sample: index[&ir.sample_of(slice_id)],
                                    start: slice.start,
                                    len: slice.len,
                                }
                            })
                            .collect();
                        spans.sort_unstable();
                        spans
                    })
                    .collect()
            };
            let forward = packs(Direction::Forward);
            if forward.is_empty() {
                continue;
            }
            let plan = ReplicaPlan {
                forward,
                backward: packs(Direction::Backward),
                samples: on.remove(&replica).unwrap_or_default(),
            };
            plans.push((replica, plan));
        }
        plans
    }

    pub fn packs(&self, direction: Direction) -> &[Vec<Span>] {
        match direction {
            Direction::Forward => &self.forward,
            Direction::Backward => &self.backward,
        }
    }

    /// Per sample, the forward position of the pack holding its last token.
    pub fn releases(&self) -> Vec<usize> {
        let mut release = vec![0; self.samples.len()];
        let mut end = vec![0u32; self.samples.len()];
        for (position, pack) in self.forward.iter().enumerate() {
            for span in pack {
                let sample = span.sample as usize;
                if span.end() >= end[sample] {
                    end[sample] = span.end();
                    release[sample] = position;
                }
            }
        }
        release
    }

    /// The rules' facts about this replica: `caps` are the packs' token caps per direction.
    pub fn facts(
        &self,
        ir: &StepIr,
        caps: [u64; 2],
        knobs: Knobs,
        timer: &mut PackTimer,
    ) -> ReplicaFacts {
        let releases = self.releases();
        let largest_tokens = |packs: &[Vec<Span>]| {
            packs
                .iter()
                .map(|p| p.iter().map(|s| u64::from(s.len)).sum::<u64>())
                .max()
                .unwrap_or(0)
        };
        let kept_seconds = [Direction::Forward, Direction::Backward].map(|direction| {
            self.packs(direction)
                .iter()
                .map(|pack| timer.pack_seconds(direction, pack))
                .collect()
        });
        ReplicaFacts {
            samples: self
                .samples
                .iter()
                .zip(releases)
                .map(|(&s, release)| SampleFacts {
                    len: ir.sample(s).len,
                    release,
                })
                .collect(),
            forward_packs: self.forward.len(),
            backward_packs: self.backward.len(),
            forward_cap: caps[0].min(largest_tokens(&self.forward)),
            backward_cap: caps[1].min(largest_tokens(&self.backward)),
            grain: knobs.grain,
            largest_slice: self
                .forward
                .iter()
                .flatten()
                .map(|s| s.len)
                .max()
                .unwrap_or(1),
            input_cuts: self.input_cuts(),
            fanout: knobs.fanout,
            kept_seconds,
        }
    }

    /// Every slice start but a sample's first, sorted.
    fn input_cuts(&self) -> Vec<(u32, u32)> {
        let mut cuts: Vec<(u32, u32)> = self
            .forward
            .iter()
            .flatten()
            .filter(|span| span.start > 0)
            .map(|span| (span.sample, span.start))
            .collect();
        cuts.sort_unstable();
        cuts
    }

    /// Per position of `direction`: whether the pack is spelled out in the term, being within
    /// [`FOCUS_RADIUS`] of one of the `count` slowest (by `seconds`, the input packs' times).
    pub fn focus(seconds: &[f64], count: usize) -> Vec<bool> {
        let mut focus = vec![false; seconds.len()];
        for position in slowest(seconds, count) {
            let last = (position + FOCUS_RADIUS).min(seconds.len() - 1);
            for flag in &mut focus[position.saturating_sub(FOCUS_RADIUS)..=last] {
                *flag = true;
            }
        }
        focus
    }

    /// The plan as a term, spelling out the packs in `focus` (per direction, per position).
    pub fn term(&self, focus: &[Vec<bool>; 2]) -> RecExpr<Schedule> {
        let mut term = RecExpr::default();
        let forward = sequence(&mut term, Direction::Forward, &self.forward, &focus[0]);
        let backward = sequence(&mut term, Direction::Backward, &self.backward, &focus[1]);
        term.add(Schedule::Replica([forward, backward]));
        term
    }

    /// The packs an extracted sequence term of direction `d` (0 forward, 1 backward)
    /// describes, kept runs taken from this plan.
    pub fn decode_sequence(&self, d: usize, term: &RecExpr<Schedule>) -> Vec<Vec<Span>> {
        let input = [&self.forward, &self.backward][d];
        decode_sequence(term, Id::from(term.as_ref().len() - 1), input)
    }
}

/// Positions of the `count` largest of `seconds` (ties: the earlier).
fn slowest(seconds: &[f64], count: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..seconds.len()).collect();
    order.sort_by(|&a, &b| seconds[b].total_cmp(&seconds[a]).then(a.cmp(&b)));
    order.truncate(count);
    order
}

fn sequence(
    term: &mut RecExpr<Schedule>,
    direction: Direction,
    packs: &[Vec<Span>],
    focus: &[bool],
) -> Id {
    let mut rest = term.add(Schedule::End);
    let mut position = packs.len();
    while position > 0 {
        if focus[position - 1] {
            position -= 1;
            let mut list = term.add(Schedule::Nil);
            for &span in packs[position].iter().rev() {
                let leaf = term.add(Schedule::Slice(span));
                list = term.add(Schedule::Cons([leaf, list]));
            }
            let pack = term.add(match direction {
                Direction::Forward => Schedule::ForwardPack(list),
                Direction::Backward => Schedule::BackwardPack(list),
            });
            rest = term.add(match direction {
                Direction::Forward => Schedule::ForwardSeq([pack, rest]),
                Direction::Backward => Schedule::BackwardSeq([pack, rest]),
            });
        } else {
            let end = position;
            while position > 0 && !focus[position - 1] {
                position -= 1;
            }
            let kept = term.add(Schedule::KeptPacks(Kept {
                first: position as u32,
                count: (end - position) as u32,
            }));
            rest = term.add(match direction {
                Direction::Forward => Schedule::ForwardKeep([kept, rest]),
                Direction::Backward => Schedule::BackwardKeep([kept, rest]),
            });
        }
    }
    rest
}

fn decode_sequence(term: &RecExpr<Schedule>, mut id: Id, input: &[Vec<Span>]) -> Vec<Vec<Span>> {
    let mut packs = Vec::new();
    loop {
        match &term[id] {
            Schedule::ForwardSeq([pack, rest]) | Schedule::BackwardSeq([pack, rest]) => {
                let (Schedule::ForwardPack(list) | Schedule::BackwardPack(list)) = &term[*pack]
                else {
                    panic!("a sequence holds packs; this is a bug")
                };
                packs.push(decode_list(term, *list));
                id = *rest;
            }
            Schedule::ForwardKeep([kept, rest]) | Schedule::BackwardKeep([kept, rest]) => {
                let Schedule::KeptPacks(kept) = &term[*kept] else {
                    panic!("a keep node holds a kept run; this is a bug")
                };
                let first = kept.first as usize;
                packs.extend_from_slice(&input[first..first + kept.count as usize]);
                id = *rest;
            }
            Schedule::End => return packs,
            other => panic!("{other:?} in a pack sequence; this is a bug"),
        }
    }
}

fn decode_list(term: &RecExpr<Schedule>, mut id: Id) -> Vec<Span> {
    let mut spans = Vec::new();
    while let Schedule::Cons([head, rest]) = &term[id] {
        match &term[*head] {
            Schedule::Slice(span) => spans.push(*span),
            other => panic!("{other:?} in a slice list; this is a bug"),
        }
        id = *rest;
    }
    spans
}
