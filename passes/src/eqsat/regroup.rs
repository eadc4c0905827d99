//! Regrouping rules: move a slice to the neighbouring pack of its direction, or swap two slices
//! between neighbouring packs.
//!
//! The rules match two adjacent packs `(fseq ?p (fseq ?q ?t))` (or `bseq`), read both packs'
//! finest slices from the analysis, and add the best few regroupings as new terms in the
//! matched e-class. Which piece of a sample may move is fixed by the order rules:
//!
//! | rule               | moves                                        | why it stays ordered          |
//! |--------------------|----------------------------------------------|-------------------------------|
//! | `fwd-move-later`   | a sample's last piece in `?p` into `?q`      | its later tokens run in `?q`+ |
//! | `fwd-move-earlier` | a sample's first piece in `?q` into `?p`     | its earlier tokens ran by `?p`|
//! | `bwd-move-later`   | a sample's first piece in `?p` into `?q`     | backward runs last token first|
//! | `bwd-move-earlier` | a sample's last piece in `?q` into `?p`      | likewise                      |
//! | `fwd-swap`, `bwd-swap` | one later-move and one earlier-move at once, of two samples |   |
//!
//! Only the packs spelled out in the term (the slowest of the input and their neighbours; the
//! others are kept runs, which the patterns do not match) are regrouped. Guards, each a small
//! function below: the moving pack is the slower of the two
//! ([`slower_first`]); the receiving pack stays within its token cap ([`fits_cap`]); the giving
//! pack keeps a slice ([`keeps_a_slice`]: packs are never emptied, so pack positions, which the
//! release rule is stated in, never shift); the release rule of `pack-bwd` holds
//! ([`released`]); and the slower of the two packs gets faster ([`balances`]). Candidates are
//! ranked by the time of the slower resulting pack, ties by slice order, so the result is
//! deterministic; at most `fanout` are added per match.

use egg::{rewrite, Applier, Id, PatternAst, Rewrite, Subst, Symbol, Var};

use super::analysis::{Members, ScheduleAnalysis, ScheduleGraph};
use super::cost::PackLoad;
use super::language::{Schedule, Span};
use super::slicing::union;
use slimpack_ir::step::Direction;

/// Which way a move goes between the matched packs `?p` (position k) and `?q` (k + 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Toward {
    /// From `?p` into `?q`.
    Later,
    /// From `?q` into `?p`.
    Earlier,
}

/// The regrouping rules.
pub fn rules() -> Vec<Rewrite<Schedule, ScheduleAnalysis>> {
    use Direction::{Backward, Forward};
    use Toward::{Earlier, Later};
    vec![
        // (fseq (fpack P+x) (fseq (fpack Q) t)) == (fseq (fpack P) (fseq (fpack Q+x) t))  x: last piece of its sample in P
        rewrite!("fwd-move-later";   "(fseq ?p (fseq ?q ?t))" => { Move(Forward, Later) }    if slower_first(Later)),
        // (fseq (fpack P) (fseq (fpack Q+x) t)) == (fseq (fpack P+x) (fseq (fpack Q) t))  x: first piece of its sample in Q
        rewrite!("fwd-move-earlier"; "(fseq ?p (fseq ?q ?t))" => { Move(Forward, Earlier) }  if slower_first(Earlier)),
        // (bseq (bpack P+x) (bseq (bpack Q) t)) == (bseq (bpack P) (bseq (bpack Q+x) t))  x: first piece of its sample in P
        rewrite!("bwd-move-later";   "(bseq ?p (bseq ?q ?t))" => { Move(Backward, Later) }   if slower_first(Later)),
        // (bseq (bpack P) (bseq (bpack Q+x) t)) == (bseq (bpack P+x) (bseq (bpack Q) t))  x: last piece of its sample in Q, released by k
        rewrite!("bwd-move-earlier"; "(bseq ?p (bseq ?q ?t))" => { Move(Backward, Earlier) } if slower_first(Earlier)),
        // (fseq (fpack P+x) (fseq (fpack Q+y) t)) == (fseq (fpack P+y) (fseq (fpack Q+x) t))  x, y: movable pieces of two samples
        rewrite!("fwd-swap";         "(fseq ?p (fseq ?q ?t))" => { Swap(Forward) }),
        // (bseq (bpack P+x) (bseq (bpack Q+y) t)) == (bseq (bpack P+y) (bseq (bpack Q+x) t))  x, y: movable pieces of two samples
        rewrite!("bwd-swap";         "(bseq ?p (bseq ?q ?t))" => { Swap(Backward) }),
    ]
}

fn var(name: &str) -> Var {
    name.parse().unwrap()
}

/// The pack a move takes from is the slower of the two matched packs.
pub(super) fn slower_first(toward: Toward) -> impl Fn(&mut ScheduleGraph, Id, &Subst) -> bool {
    move |egraph, _, subst| {
        let p = egraph[subst[var("?p")]].data.seconds();
        let q = egraph[subst[var("?q")]].data.seconds();
        match toward {
            Toward::Later => p > q,
            Toward::Earlier => q > p,
        }
    }
}

/// The receiving pack stays within its token cap.
fn fits_cap(receiving_tokens: u64, cap: u64) -> bool {
    receiving_tokens <= cap
}

/// The giving pack keeps at least one slice.
fn keeps_a_slice(giving: &Members, moved: usize) -> bool {
    giving.spans.len() > moved
}

/// The release rule: a sample's last forward token never moves past forward pack `release`,
/// and its backward never moves into a backward pack before `release`.
pub(super) fn released(
    direction: Direction,
    piece: Span,
    into: usize,
    egraph: &ScheduleGraph,
) -> bool {
    let sample = egraph.analysis.facts.samples[piece.sample as usize];
    match direction {
        Direction::Forward => piece.end() < sample.len || into <= sample.release,
        Direction::Backward => into >= sample.release,
    }
}

/// The slower of the two packs gets faster.
fn balances(before: (f64, f64), after: (f64, f64)) -> bool {
    after.0.max(after.1) < before.0.max(before.1)
}

/// Whether a move `toward` in `direction` takes a sample's last piece in its pack (else its
/// first). Forward runs a sample's tokens in increasing order, backward in decreasing order:
/// the piece that may go to the later pack is the one that runs last in the giving pack.
pub(super) fn moves_last_piece(direction: Direction, toward: Toward) -> bool {
    matches!(
        (direction, toward),
        (Direction::Forward, Toward::Later) | (Direction::Backward, Toward::Earlier)
    )
}

/// The piece of each sample in `giving` that may move `toward` in `direction`.
pub(super) fn movable_pieces(giving: &Members, direction: Direction, toward: Toward) -> Vec<Span> {
    let last = moves_last_piece(direction, toward);
    let mut pieces: Vec<Span> = Vec::new();
    for &span in giving.spans.iter() {
        match pieces.last_mut() {
            Some(previous) if previous.sample == span.sample => {
                if last {
                    *previous = span;
                }
            }
            _ => pieces.push(span),
        }
    }
    pieces
}

/// The matched packs, their position and the rest of the sequence.
pub(super) struct Matched {
    pub p: Id,
    pub q: Id,
    pub rest: Id,
    /// Position of `?p` among the direction's packs.
    pub position: usize,
    pub members: [Members; 2],
    pub seconds: [f64; 2],
}

pub(super) fn matched(
    egraph: &ScheduleGraph,
    direction: Direction,
    root: Id,
    subst: &Subst,
) -> Matched {
    let (p, q) = (subst[var("?p")], subst[var("?q")]);
    let position = egraph.analysis.facts.packs(direction) - egraph[root].data.packs();
    Matched {
        p,
        q,
        rest: subst[var("?t")],
        position,
        members: [
            egraph[p].data.members().clone(),
            egraph[q].data.members().clone(),
        ],
        seconds: [egraph[p].data.seconds(), egraph[q].data.seconds()],
    }
}

/// One regrouping: pieces leaving `?p` for `?q` and pieces leaving `?q` for `?p`.
#[derive(Debug, Clone)]
pub(super) struct Regrouping {
    later: Vec<Span>,
    earlier: Vec<Span>,
    /// Times of the new `?p` and `?q`.
    seconds: (f64, f64),
}

impl Regrouping {
    /// Evaluates the regrouping; `None` if a cap or the balance guard fails.
    pub(super) fn evaluate(
        egraph: &ScheduleGraph,
        direction: Direction,
        site: &Matched,
        later: Vec<Span>,
        earlier: Vec<Span>,
    ) -> Option<Regrouping> {
        let mut timer = egraph.analysis.timer.borrow_mut();
        let leaving = timer.list_load(&later);
        let arriving = timer.list_load(&earlier);
        let p = site.members[0].load.sub(&leaving).add(&arriving);
        let q = site.members[1].load.sub(&arriving).add(&leaving);
        let cap = egraph.analysis.facts.cap(direction);
        let receiving_ok = |load: &PackLoad, gains: bool| !gains || fits_cap(load.tokens, cap);
        if !receiving_ok(&p, !earlier.is_empty()) || !receiving_ok(&q, !later.is_empty()) {
            return None;
        }
        let seconds = (timer.seconds(direction, &p), timer.seconds(direction, &q));
        balances((site.seconds[0], site.seconds[1]), seconds).then_some(Regrouping {
            later,
            earlier,
            seconds,
        })
    }

    /// The slower of the two resulting packs' times.
    pub(super) fn key(&self) -> f64 {
        self.seconds.0.max(self.seconds.1)
    }

    /// Adds the regrouped sequence `(seq p' (seq q' rest))` and unions it with `root`.
    fn apply(
        &self,
        egraph: &mut ScheduleGraph,
        direction: Direction,
        site: &Matched,
        root: Id,
    ) -> Vec<Id> {
        let p = regrouped(&site.members[0], &self.later, &self.earlier);
        let q = regrouped(&site.members[1], &self.earlier, &self.later);
        let p = add_pack(egraph, direction, &p);
        let q = add_pack(egraph, direction, &q);
        let seq = |pack, rest| match direction {
            Direction::Forward => Schedule::ForwardSeq([pack, rest]),
            Direction::Backward => Schedule::BackwardSeq([pack, rest]),
        };
        let tail = egraph.add(seq(q, site.rest));
        let new = egraph.add(seq(p, tail));
        union(egraph, root, new)
    }
}

/// `members` without `leaving`, with `arriving`, in canonical order.
fn regrouped(members: &Members, leaving: &[Span], arriving: &[Span]) -> Vec<Span> {
    let mut spans: Vec<Span> = members
        .spans
        .iter()
        .copied()
        .filter(|s| !leaving.contains(s))
        .chain(arriving.iter().copied())
        .collect();
    spans.sort_unstable();
    spans
}

/// Adds the cons list of `spans`, built from its end (sharing existing suffixes).
pub(super) fn add_list(egraph: &mut ScheduleGraph, spans: &[Span]) -> Id {
    let mut list = egraph.add(Schedule::Nil);
    for &span in spans.iter().rev() {
        let leaf = egraph.add(Schedule::Slice(span));
        list = egraph.add(Schedule::Cons([leaf, list]));
    }
    list
}

/// Adds the pack of `spans`.
fn add_pack(egraph: &mut ScheduleGraph, direction: Direction, spans: &[Span]) -> Id {
    let list = add_list(egraph, spans);
    egraph.add(match direction {
        Direction::Forward => Schedule::ForwardPack(list),
        Direction::Backward => Schedule::BackwardPack(list),
    })
}

/// Adds the best `fanout` regroupings of `candidates` at `site`.
fn apply_best(
    egraph: &mut ScheduleGraph,
    direction: Direction,
    site: &Matched,
    root: Id,
    mut candidates: Vec<Regrouping>,
) -> Vec<Id> {
    // Stable sort: equal keys keep candidate (slice) order.
    candidates.sort_by(|a, b| a.key().total_cmp(&b.key()));
    candidates.truncate(egraph.analysis.facts.fanout);
    let mut changed = Vec::new();
    for candidate in candidates {
        changed.extend(candidate.apply(egraph, direction, site, root));
    }
    changed
}

/// Moves one piece between the matched packs (see the module header).
struct Move(Direction, Toward);

impl Applier<Schedule, ScheduleAnalysis> for Move {
    fn apply_one(
        &self,
        egraph: &mut ScheduleGraph,
        root: Id,
        subst: &Subst,
        _: Option<&PatternAst<Schedule>>,
        _: Symbol,
    ) -> Vec<Id> {
        let Move(direction, toward) = *self;
        let site = matched(egraph, direction, root, subst);
        let (giving, into) = match toward {
            Toward::Later => (&site.members[0], site.position + 1),
            Toward::Earlier => (&site.members[1], site.position),
        };
        if !keeps_a_slice(giving, 1) {
            return Vec::new();
        }
        let mut candidates = Vec::new();
        for piece in movable_pieces(giving, direction, toward) {
            if !released(direction, piece, into, egraph) {
                continue;
            }
            let (later, earlier) = match toward {
                Toward::Later => (vec![piece], Vec::new()),
                Toward::Earlier => (Vec::new(), vec![piece]),
            };
            candidates.extend(Regrouping::evaluate(
                egraph, direction, &site, later, earlier,
            ));
        }
        apply_best(egraph, direction, &site, root, candidates)
    }
}

/// Swaps a piece of `?p` with a piece of `?q` (of another sample).
struct Swap(Direction);

impl Applier<Schedule, ScheduleAnalysis> for Swap {
    fn apply_one(
        &self,
        egraph: &mut ScheduleGraph,
        root: Id,
        subst: &Subst,
        _: Option<&PatternAst<Schedule>>,
        _: Symbol,
    ) -> Vec<Id> {
        let direction = self.0;
        let site = matched(egraph, direction, root, subst);
        let graph: &ScheduleGraph = egraph;
        let movable = |members: &Members, toward: Toward, into: usize| -> Vec<Span> {
            movable_pieces(members, direction, toward)
                .into_iter()
                .filter(|&piece| released(direction, piece, into, graph))
                .collect()
        };
        let later = movable(&site.members[0], Toward::Later, site.position + 1);
        let earlier = movable(&site.members[1], Toward::Earlier, site.position);
        let mut candidates = Vec::new();
        for &x in &later {
            for &y in earlier.iter().filter(|y| y.sample != x.sample) {
                candidates.extend(Regrouping::evaluate(
                    egraph,
                    direction,
                    &site,
                    vec![x],
                    vec![y],
                ));
            }
        }
        apply_best(egraph, direction, &site, root, candidates)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eqsat::testing::{equivalent, facts, graph, saturate};

    /// Forward pack 0 is heavy: moving s1's first piece later balances the two packs; s0's
    /// only piece holds its last token, released at pack 0, so it stays.
    #[test]
    fn fwd_move_later_fires_and_keeps_the_sequence_meaning() {
        let facts = facts(&[4096, 4160], 2, 1, 1024);
        let before = "(fseq (fpack (cons s0@0+4096 (cons s1@0+4096 nil))) (fseq (fpack (cons s1@4096+64 nil)) end))";
        let after = "(fseq (fpack (cons s0@0+4096 nil)) (fseq (fpack (cons s1@0+4096 (cons s1@4096+64 nil))) end))";
        let held = "(fseq (fpack (cons s1@0+4096 nil)) (fseq (fpack (cons s0@0+4096 (cons s1@4096+64 nil))) end))";
        let (egraph, applied) = saturate(graph(&facts, before), rules(), 1);
        assert!(applied["fwd-move-later"] >= 1, "{applied:?}");
        assert!(equivalent(&egraph, before, after));
        assert!(egraph.lookup_expr(&held.parse().unwrap()).is_none());
    }

    /// The first piece of a sample in the later pack may move earlier; its last piece may not
    /// (the sample's earlier piece would then run after it).
    #[test]
    fn fwd_move_earlier_moves_only_a_first_piece() {
        let facts = facts(&[64, 8192], 2, 1, 1024);
        let before = "(fseq (fpack (cons s0@0+64 nil)) (fseq (fpack (cons s1@0+4096 (cons s1@4096+4096 nil))) end))";
        let good = "(fseq (fpack (cons s0@0+64 (cons s1@0+4096 nil))) (fseq (fpack (cons s1@4096+4096 nil)) end))";
        let bad = "(fseq (fpack (cons s0@0+64 (cons s1@4096+4096 nil))) (fseq (fpack (cons s1@0+4096 nil)) end))";
        let (egraph, applied) = saturate(graph(&facts, before), rules(), 1);
        assert!(applied["fwd-move-earlier"] >= 1, "{applied:?}");
        assert!(equivalent(&egraph, before, good));
        assert!(egraph.lookup_expr(&bad.parse().unwrap()).is_none());
    }

    /// Backward runs a sample last token first: the later pack may receive its first piece.
    #[test]
    fn bwd_move_later_moves_a_first_piece() {
        let facts = facts(&[8192, 64], 1, 2, 1024);
        let before = "(bseq (bpack (cons s0@0+4096 (cons s0@4096+4096 nil))) (bseq (bpack (cons s1@0+64 nil)) end))";
        let after = "(bseq (bpack (cons s0@4096+4096 nil)) (bseq (bpack (cons s0@0+4096 (cons s1@0+64 nil))) end))";
        let (egraph, applied) = saturate(graph(&facts, before), rules(), 1);
        assert!(applied["bwd-move-later"] >= 1, "{applied:?}");
        assert!(equivalent(&egraph, before, after));
    }

    /// bwd-move-earlier respects the release rule: a sample released at forward pack 1 never
    /// enters backward pack 0.
    #[test]
    fn bwd_move_earlier_waits_for_the_release() {
        let mut facts = facts(&[64, 4096, 4096], 1, 2, 1024);
        let before = "(bseq (bpack (cons s0@0+64 nil)) (bseq (bpack (cons s1@0+4096 (cons s2@0+4096 nil))) end))";
        let s1_moved = "(bseq (bpack (cons s0@0+64 (cons s1@0+4096 nil))) (bseq (bpack (cons s2@0+4096 nil)) end))";
        let s2_moved = "(bseq (bpack (cons s0@0+64 (cons s2@0+4096 nil))) (bseq (bpack (cons s1@0+4096 nil)) end))";
        facts.samples[1].release = 1;
        let (egraph, applied) = saturate(graph(&facts, before), rules(), 1);
        assert!(applied["bwd-move-earlier"] >= 1, "{applied:?}");
        assert!(egraph.lookup_expr(&s1_moved.parse().unwrap()).is_none());
        assert!(equivalent(&egraph, before, s2_moved));
    }

    /// A swap exchanges a big and a smaller slice where either move alone would overshoot.
    #[test]
    fn fwd_swap_fires_when_a_move_would_overshoot() {
        let facts = facts(&[4000, 3400, 1200, 200], 2, 1, 1024);
        let before = "(fseq (fpack (cons s0@0+2000 (cons s1@0+3400 nil))) (fseq (fpack (cons s0@2000+2000 (cons s2@0+1200 (cons s3@0+200 nil)))) end))";
        let after = "(fseq (fpack (cons s1@0+3400 (cons s2@0+1200 nil))) (fseq (fpack (cons s0@0+2000 (cons s0@2000+2000 (cons s3@0+200 nil)))) end))";
        let (egraph, applied) = saturate(graph(&facts, before), rules(), 1);
        assert!(applied["fwd-swap"] >= 1, "{applied:?}");
        assert!(applied.get("fwd-move-later").is_none(), "{applied:?}");
        assert!(equivalent(&egraph, before, after));
    }

    /// The backward swap: a first piece of p for a last piece of q.
    #[test]
    fn bwd_swap_fires_when_a_move_would_overshoot() {
        let facts = facts(&[2000, 2000, 1500, 200], 1, 2, 1024);
        let before = "(bseq (bpack (cons s0@0+2000 (cons s1@0+2000 nil))) (bseq (bpack (cons s2@0+1500 (cons s3@0+200 nil))) end))";
        let after = "(bseq (bpack (cons s1@0+2000 (cons s2@0+1500 nil))) (bseq (bpack (cons s0@0+2000 (cons s3@0+200 nil))) end))";
        let (egraph, applied) = saturate(graph(&facts, before), rules(), 1);
        assert!(applied["bwd-swap"] >= 1, "{applied:?}");
        assert!(equivalent(&egraph, before, after));
    }

    /// A move never breaks the token cap of the receiving pack.
    #[test]
    fn moves_respect_the_token_cap() {
        let mut facts = facts(&[4096, 4096, 64], 2, 1, 1024);
        facts.forward_cap = 4096;
        let before = "(fseq (fpack (cons s0@0+4096 (cons s1@0+4096 nil))) (fseq (fpack (cons s2@0+64 nil)) end))";
        let (_, applied) = saturate(graph(&facts, before), rules(), 1);
        assert!(applied.get("fwd-move-later").is_none(), "{applied:?}");
    }
}
