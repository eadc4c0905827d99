//! Slicing rules: cut a slice at a grain boundary, or join two adjacent slices, inside one pack.
//!
//! Both keep the pack's coverage exactly (the same tokens, none lost or duplicated) and the
//! canonical order of its list (the pieces of one sample stay together, in offset order). A
//! split costs a little attention efficiency by itself; it pays when a regrouping rule then
//! moves one piece to the neighbouring pack. A merge is the inverse: it re-joins pieces of one
//! input slice that ended up in one pack again, so the extractor takes the coarser cut
//! wherever no move needed the finer one.
//!
//! What the IR can express: slices are shared by a sample's forward and backward packs, so a
//! cut made in one direction's term is a cut in the other direction's too. The pass rebuilds
//! the IR from the common refinement of the two directions' cuts (see `rebuild.rs`): a piece
//! split in one direction sits, in the other, twice in the pack that held the whole slice — in
//! increasing order forward, in any order backward — which keeps both order rules. A merge
//! made in one direction only is undone there for the same reason; the pass's final cost check
//! is on the rebuilt slices, never on the term's.

use egg::{rewrite, Applier, Id, PatternAst, Rewrite, Subst, Symbol, Var};

use super::analysis::{ScheduleAnalysis, ScheduleGraph};
use super::language::{Schedule, Span};

/// The slicing rules.
pub fn rules() -> Vec<Rewrite<Schedule, ScheduleAnalysis>> {
    vec![
        // (cons s r) == (cons s[..x] (cons s[x..] r))  where x is a grain multiple inside s
        rewrite!("split-slice"; "(cons ?s ?r)" => SplitSlice if splittable("?s")),
        // (cons a (cons b r)) == (cons a++b r)  where b continues a inside one input slice
        rewrite!("merge-slices"; "(cons ?a (cons ?b ?r))" => MergeSlices if mergeable("?a", "?b")),
    ]
}

/// The grain multiple nearest the middle of `span`, strictly inside it.
pub fn cut_point(span: Span, grain: u32) -> Option<u32> {
    let grain = grain.max(1);
    let middle = span.start + span.len / 2;
    let below = middle / grain * grain;
    let above = below + grain;
    [below, above]
        .into_iter()
        .filter(|&x| x > span.start && x < span.end())
        .min_by_key(|&x| x.abs_diff(middle))
}

/// `?s` is of a sample in one of the slowest packs and has a grain boundary strictly inside.
fn splittable(s: &'static str) -> impl Fn(&mut ScheduleGraph, Id, &Subst) -> bool {
    let s: Var = s.parse().unwrap();
    move |egraph, _, subst| {
        let facts = &egraph.analysis.facts;
        let span = egraph[subst[s]].data.span();
        facts.splittable[span.sample as usize] && cut_point(span, facts.grain).is_some()
    }
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
            && first.len + second.len <= facts.largest_slice
            && facts
                .input_cuts
                .binary_search(&(second.sample, second.start))
                .is_err()
    }
}

/// Adds the two pieces of `?s` in its place.
struct SplitSlice;

impl Applier<Schedule, ScheduleAnalysis> for SplitSlice {
    fn apply_one(
        &self,
        egraph: &mut ScheduleGraph,
        matched: Id,
        subst: &Subst,
        _: Option<&PatternAst<Schedule>>,
        _: Symbol,
    ) -> Vec<Id> {
        let span = egraph[subst[var("?s")]].data.span();
        let cut = cut_point(span, egraph.analysis.facts.grain)
            .expect("split-slice fires only on a splittable slice; this is a bug");
        let head = Span {
            len: cut - span.start,
            ..span
        };
        let tail = Span {
            start: cut,
            len: span.end() - cut,
            ..span
        };
        let tail_leaf = egraph.add(Schedule::Slice(tail));
        let rest = egraph.add(Schedule::Cons([tail_leaf, subst[var("?r")]]));
        let head_leaf = egraph.add(Schedule::Slice(head));
        let list = egraph.add(Schedule::Cons([head_leaf, rest]));
        union(egraph, matched, list)
    }
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
    fn cut_points_are_grain_multiples_near_the_middle() {
        let span = |start, len| Span {
            sample: 0,
            start,
            len,
        };
        assert_eq!(cut_point(span(0, 8192), 1024), Some(4096));
        assert_eq!(cut_point(span(4096, 4096), 1024), Some(6144));
        assert_eq!(cut_point(span(0, 3000), 2048), Some(2048));
        assert_eq!(cut_point(span(0, 1024), 1024), None);
        assert_eq!(cut_point(span(100, 800), 1024), None);
    }

    /// split-slice fires on a long slice: the split list joins the original's e-class (same
    /// tokens, canonical order); a slice without an inner grain boundary is left alone.
    #[test]
    fn split_slice_fires_and_keeps_coverage() {
        let facts = facts(&[2048, 100], 1, 1, 512);
        let list = "(cons s0@0+2048 (cons s1@0+100 nil))";
        let (egraph, applied) = saturate(graph(&facts, list), rules(), 1);
        assert!(applied["split-slice"] >= 1, "{applied:?}");
        assert!(equivalent(
            &egraph,
            list,
            "(cons s0@0+1024 (cons s0@1024+1024 (cons s1@0+100 nil)))"
        ));
        assert!(!equivalent(
            &egraph,
            list,
            "(cons s0@0+2048 (cons s1@0+50 (cons s1@50+50 nil)))"
        ));
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
}
