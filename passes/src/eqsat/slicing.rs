//! Slicing rules: cut a slice at a grain boundary, or join two adjacent slices, inside one pack.
//!
//! Both keep the pack's coverage exactly (the same tokens, none lost or duplicated) and the
//! canonical order of its list (the pieces of one sample stay together, in offset order). A
//! split costs a little attention efficiency by itself; it pays when a regrouping rule then
//! moves one piece to the neighbouring pack. So the split rules match two neighbouring packs,
//! as the regrouping rules do, and cut a movable slice of the slower one at the grain multiples
//! whose end piece, moved, would balance the two best ([`balances`] the pair, as a move must);
//! the cut list joins the e-class of the pack's list, and the regrouping rules, which move the
//! finest pieces an e-class knows, can then move the piece. Cutting every slice everywhere
//! instead grows the e-graph by an order of magnitude for the same gain. A merge is the
//! inverse of a split: it re-joins pieces of one input slice that ended up in one pack again,
//! so the extractor takes the coarser cut wherever no move needed the finer one.
//!
//! What the IR can express: slices are shared by a sample's forward and backward packs, so a
//! cut made in one direction's term is a cut in the other direction's too. The pass rebuilds
//! the IR from the common refinement of the two directions' cuts (see `rebuild.rs`): a piece
//! split in one direction sits, in the other, twice in the pack that held the whole slice — in
//! increasing order forward, in any order backward — which keeps both order rules. A merge
//! never removes a cut of the input, which the other direction keeps; the pass's final cost
//! check is on the rebuilt slices, never on the term's.
//!
//! [`balances`]: super::regroup

use egg::{rewrite, Applier, Id, PatternAst, Rewrite, Subst, Symbol, Var};

use super::analysis::{Members, ScheduleAnalysis, ScheduleGraph};
use super::language::{Schedule, Span};
use super::regroup::{
    add_list, matched, movable_pieces, moves_last_piece, released, Regrouping, Toward,
};
use slimpack_ir::step::Direction;

/// The slicing rules.
pub fn rules() -> Vec<Rewrite<Schedule, ScheduleAnalysis>> {
    use Direction::{Backward, Forward};
    vec![
        // (fpack (cons s r)) == (fpack (cons s[..x] (cons s[x..] r)))  s movable from the slower of two neighbours, x a grain multiple
        rewrite!("fwd-split-slice"; "(fseq ?p (fseq ?q ?t))" => { SplitSlice(Forward) }),
        // (bpack (cons s r)) == (bpack (cons s[..x] (cons s[x..] r)))  s movable from the slower of two neighbours, x a grain multiple
        rewrite!("bwd-split-slice"; "(bseq ?p (bseq ?q ?t))" => { SplitSlice(Backward) }),
        // (cons a (cons b r)) == (cons a++b r)  where b continues a inside one input slice
        rewrite!("merge-slices"; "(cons ?a (cons ?b ?r))" => MergeSlices if mergeable("?a", "?b")),
    ]
}

/// The grain multiples strictly inside `span`.
pub fn cut_points(span: Span, grain: u32) -> impl Iterator<Item = u32> {
    let grain = grain.max(1);
    // The first multiple past the start may lie past u32::MAX: then there is none inside.
    let first = (span.start / grain + 1)
        .checked_mul(grain)
        .unwrap_or(span.end());
    (first..span.end()).step_by(grain as usize)
}

/// `?b` starts where `?a` ends, in the same sample, not at a cut of the input, and together they
/// are no longer than the largest input slice: a merge only undoes a split, so the slicing the
/// user asked for stays the coarsest, and no cut is removed that the other direction keeps.
fn mergeable(a: &'static str, b: &'static str) -> impl Fn(&mut ScheduleGraph, Id, &Subst) -> bool {
    let (a, b): (Var, Var) = (a.parse().unwrap(), b.parse().unwrap());
    move |egraph, _, subst| {
        let facts = &egraph.analysis.facts;
        let (first, second) = (egraph[subst[a]].data.span(), egraph[subst[b]].data.span());
        first.sample == second.sample
            && first.end() == second.start
            // In u64: two long slices of one sample sum past u32::MAX.
            && u64::from(first.len) + u64::from(second.len) <= u64::from(facts.largest_slice)
            && facts
                .input_cuts
                .binary_search(&(second.sample, second.start))
                .is_err()
    }
}

/// Cuts movable slices of the slower matched pack where moving the end piece would balance.
struct SplitSlice(Direction);

/// A cut worth adding: the slice, where to cut it, and how slow the slower pack would be after
/// moving the end piece.
struct Cut {
    piece: Span,
    at: u32,
    key: f64,
}

impl Applier<Schedule, ScheduleAnalysis> for SplitSlice {
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
        let (toward, giving, into) = match site.seconds[0].total_cmp(&site.seconds[1]) {
            std::cmp::Ordering::Greater => (Toward::Later, 0, site.position + 1),
            std::cmp::Ordering::Less => (Toward::Earlier, 1, site.position),
            std::cmp::Ordering::Equal => return Vec::new(),
        };
        let last = moves_last_piece(direction, toward);
        let grain = egraph.analysis.facts.grain;
        let mut cuts = Vec::new();
        for piece in movable_pieces(&site.members[giving], direction, toward) {
            if !released(direction, piece, into, egraph) {
                continue;
            }
            // The moved part grows away from the piece's movable end; the pair's slower pack
            // first gets faster, then slower again: stop once past the best cut.
            let mut points: Vec<u32> = cut_points(piece, grain).collect();
            if last {
                points.reverse();
            }
            let mut best = f64::INFINITY;
            for at in points {
                let part = if last {
                    Span {
                        start: at,
                        len: piece.end() - at,
                        ..piece
                    }
                } else {
                    Span {
                        len: at - piece.start,
                        ..piece
                    }
                };
                let (later, earlier) = match toward {
                    Toward::Later => (vec![part], Vec::new()),
                    Toward::Earlier => (Vec::new(), vec![part]),
                };
                match Regrouping::evaluate(egraph, direction, &site, later, earlier) {
                    Some(moved) if moved.key() <= best => {
                        best = moved.key();
                        cuts.push(Cut {
                            piece,
                            at,
                            key: best,
                        });
                    }
                    Some(_) => break,
                    None if best.is_finite() => break,
                    None => {}
                }
            }
        }
        // Stable sort: equal keys keep slice and cut order.
        cuts.sort_by(|a, b| a.key.total_cmp(&b.key));
        cuts.truncate(egraph.analysis.facts.fanout);
        let pack = [site.p, site.q][giving];
        let mut changed = Vec::new();
        for cut in cuts {
            changed.extend(split_in_pack(
                egraph,
                pack,
                &site.members[giving],
                cut.piece,
                cut.at,
            ));
        }
        changed
    }
}

/// Adds the list of `members` with `piece` cut at `at` to the e-class of `pack`'s list.
fn split_in_pack(
    egraph: &mut ScheduleGraph,
    pack: Id,
    members: &Members,
    piece: Span,
    at: u32,
) -> Vec<Id> {
    let list = egraph[pack]
        .nodes
        .iter()
        .find_map(|node| match node {
            Schedule::ForwardPack(list) | Schedule::BackwardPack(list) => Some(*list),
            _ => None,
        })
        .expect("a pack e-class holds a pack; this is a bug");
    let mut spans = Vec::with_capacity(members.spans.len() + 1);
    for &span in members.spans.iter() {
        if span == piece {
            spans.push(Span {
                len: at - span.start,
                ..span
            });
            spans.push(Span {
                start: at,
                len: span.end() - at,
                ..span
            });
        } else {
            spans.push(span);
        }
    }
    let split = add_list(egraph, &spans);
    union(egraph, list, split)
}

/// Adds `?a` joined with `?b` in their place.
struct MergeSlices;

impl Applier<Schedule, ScheduleAnalysis> for MergeSlices {
    fn apply_one(
        &self,
        egraph: &mut ScheduleGraph,
        matched: Id,
        subst: &Subst,
        _: Option<&PatternAst<Schedule>>,
        _: Symbol,
    ) -> Vec<Id> {
        let first = egraph[subst[var("?a")]].data.span();
        let second = egraph[subst[var("?b")]].data.span();
        let joined = egraph.add(Schedule::Slice(Span {
            len: first.len + second.len,
            ..first
        }));
        let list = egraph.add(Schedule::Cons([joined, subst[var("?r")]]));
        union(egraph, matched, list)
    }
}

fn var(name: &str) -> Var {
    name.parse().unwrap()
}

/// Unions `new` into `matched`; the changed e-class, if any (what egg counts as an application).
pub(super) fn union(egraph: &mut ScheduleGraph, matched: Id, new: Id) -> Vec<Id> {
    if egraph.union(matched, new) {
        vec![new]
    } else {
        vec![]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eqsat::testing::{equivalent, facts, graph, saturate};

    #[test]
    fn cut_points_are_the_grain_multiples_inside() {
        let span = |start, len| Span {
            sample: 0,
            start,
            len,
        };
        let cuts = |s, g| cut_points(s, g).collect::<Vec<_>>();
        assert_eq!(cuts(span(0, 4096), 1024), vec![1024, 2048, 3072]);
        assert_eq!(cuts(span(1000, 1100), 1024), vec![1024, 2048]);
        assert_eq!(cuts(span(0, 1024), 1024), Vec::<u32>::new());
    }

    /// The slower forward pack holds a slice too big to move whole: fwd-split-slice cuts it
    /// (the cut list joins the pack list's e-class), and a move of its end piece follows.
    #[test]
    fn fwd_split_slice_fires_where_a_whole_move_overshoots() {
        let mut facts = facts(&[4096, 3000], 2, 1, 512);
        facts.samples[0].release = 1;
        facts.fanout = 1;
        let list = "(cons s0@0+4096 nil)";
        let before = "(fseq (fpack (cons s0@0+4096 nil)) (fseq (fpack (cons s1@0+3000 nil)) end))";
        let (egraph, applied) = saturate(graph(&facts, before), rules(), 1);
        assert!(applied["fwd-split-slice"] >= 1, "{applied:?}");
        let split = egraph[egraph.lookup_expr(&list.parse().unwrap()).unwrap()]
            .data
            .members()
            .clone();
        assert!(split.spans.len() > 1, "{split:?}");
        assert!(split.spans.iter().all(|s| s.start % 512 == 0));
        let cut = split.spans[1].start;
        let cut_list = format!("(cons s0@0+{cut} (cons s0@{cut}+{} nil))", 4096 - cut);
        assert!(equivalent(&egraph, list, &cut_list));
        let (egraph, applied) = saturate(egraph, crate::eqsat::regroup::rules(), 1);
        assert!(applied["fwd-move-later"] >= 1, "{applied:?}");
        let moved = format!(
            "(fseq (fpack (cons s0@0+{cut} nil)) (fseq (fpack (cons s0@{cut}+{} (cons s1@0+3000 nil))) end))",
            4096 - cut
        );
        assert!(equivalent(&egraph, before, &moved));
    }

    /// The backward rule cuts the first piece (backward runs a sample last token first, so its
    /// beginning is what may move to the later pack).
    #[test]
    fn bwd_split_slice_cuts_so_that_the_beginning_can_move_later() {
        let mut facts = facts(&[4096, 3000], 1, 2, 512);
        facts.fanout = 1;
        let list = "(cons s0@0+4096 nil)";
        let before = "(bseq (bpack (cons s0@0+4096 nil)) (bseq (bpack (cons s1@0+3000 nil)) end))";
        let (egraph, applied) = saturate(graph(&facts, before), rules(), 1);
        assert!(applied["bwd-split-slice"] >= 1, "{applied:?}");
        let split = egraph[egraph.lookup_expr(&list.parse().unwrap()).unwrap()]
            .data
            .members()
            .clone();
        let cut = split.spans[1].start;
        let (egraph, _) = saturate(egraph, crate::eqsat::regroup::rules(), 1);
        let moved = format!(
            "(bseq (bpack (cons s0@{cut}+{} nil)) (bseq (bpack (cons s0@0+{cut} (cons s1@0+3000 nil))) end))",
            4096 - cut
        );
        assert!(equivalent(&egraph, before, &moved));
    }

    /// merge-slices joins two adjacent pieces of one sample, and only those.
    #[test]
    fn merge_slices_fires_on_adjacent_pieces_only() {
        let facts = facts(&[2048, 1024], 1, 1, 4096);
        let list = "(cons s0@0+1024 (cons s0@1024+1024 (cons s1@0+1024 nil)))";
        let (egraph, applied) = saturate(graph(&facts, list), rules(), 1);
        assert!(applied["merge-slices"] >= 1, "{applied:?}");
        assert!(equivalent(
            &egraph,
            list,
            "(cons s0@0+2048 (cons s1@0+1024 nil))"
        ));
        assert!(egraph
            .lookup_expr(&"(cons s0@1024+2048 nil)".parse().unwrap())
            .is_none());
    }

    /// A merge never removes a cut the input has.
    #[test]
    fn merge_slices_keeps_input_cuts() {
        let mut facts = facts(&[2048], 1, 1, 4096);
        facts.input_cuts = vec![(0, 1024)];
        let list = "(cons s0@0+1024 (cons s0@1024+1024 nil))";
        let (_, applied) = saturate(graph(&facts, list), rules(), 1);
        assert!(applied.get("merge-slices").is_none(), "{applied:?}");
    }
}
