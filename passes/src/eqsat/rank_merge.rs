//! Rank-merging rules: which DP ranks of an aligned pair `{a, a + 1}` run each whole sample —
//! rank `a`'s plain replica, rank `a + 1`'s, or the DP-Merge group of the two (see `passes/src/eqsat/mod.rs`).
//!
//! The term is `(pair A B M)` (see `language.rs`): the samples of the two plain replicas and
//! of the merged group. A rank runs its plain replica's work and the group's on the same
//! streams, so rank `a` costs `T(A) + T_group(M)` and rank `a + 1` costs `T(B) + T_group(M)`,
//! and the pair costs the larger. `T` is estimated bottom-up from the machine model: a list's
//! [`PackLoad`] is the sum of its samples' slice loads (one for a plain rank, one for the
//! group, whose attention is split two ways and whose packs pay the CP ring exchange of
//! `machine/src/cost/comm.rs`, through [`PackTimer`] over the group's ranks), and `T` is the
//! forward plus backward time of that load on the slowest stage. The pass judges what it
//! extracts more finely: it re-packs the changed replicas with `pack-fwd` and `pack-bwd` and
//! times them by their 1F1B makespans (`placement.rs`).
//!
//! | rule               | identity                                                        |
//! |--------------------|-----------------------------------------------------------------|
//! | `move-to-partner`  | a sample of the slower rank's plain replica runs on the other's |
//! | `merge-ranks`      | a sample of the slower rank runs on the group, half per rank    |
//! | `split-group`      | a sample of the group runs on one rank's plain replica          |
//!
//! Guards, each a small function below: a move must lower the pair's estimated cost
//! ([`balances`]); a merge or a split must make the slower rank faster ([`relieves_slower`]:
//! merging a dominant sample loads the partner, which a move back then relieves); a sample leaves for a plain replica only if it is no longer than the
//! longest sample the input runs on a plain replica ([`fits_plain`]: `dp-merge` merged what
//! one rank's memory cannot hold, and a rewrite must not undo that). At most `fanout`
//! rewrites, the cheapest first, are added per matched pair term, so the e-graph is a
//! best-first search over placements; extraction ranks every pair term of the root e-class
//! (they differ only in placement, so no e-class below the root is shared by rival choices).

use std::cell::RefCell;
use std::rc::Rc;

use egg::{rewrite, Analysis, Applier, DidMerge, EGraph, Id, PatternAst, Rewrite, Subst, Symbol};

use super::cost::{PackLoad, PackTimer};
use super::language::{Schedule, Whole};
use slimpack_ir::step::Direction;

/// What the rules need to know of one of the pair's samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UnitFacts {
    pub len: u32,
    /// Its slices' load on a plain rank.
    pub plain: PackLoad,
    /// Its slices' load on the merged group.
    pub merged: PackLoad,
}

/// The pair's fixed facts.
#[derive(Debug, Clone, PartialEq)]
pub struct PairFacts {
    /// The pair's samples, longest first (a `w` leaf indexes them).
    pub units: Vec<UnitFacts>,
    /// Samples longer than this never move onto a plain replica.
    pub plain_len_limit: u32,
    /// Rewrites added per matched pair term, cheapest first.
    pub fanout: usize,
}

/// The e-class analysis of a pair's e-graph; its timers are shared with the pass.
#[derive(Debug, Clone)]
pub struct RankAnalysis {
    pub facts: Rc<PairFacts>,
    /// Times packs of a plain rank.
    pub plain: Rc<RefCell<PackTimer>>,
    /// Times packs of the merged group (CP exchange included).
    pub merged: Rc<RefCell<PackTimer>>,
}

/// The e-graph of one rank pair.
pub type PairGraph = EGraph<Schedule, RankAnalysis>;

/// The samples of a `work` list (increasing) and their summed loads.
#[derive(Debug, Clone, PartialEq)]
pub struct Crew {
    pub units: Units,
    pub plain: PackLoad,
    pub merged: PackLoad,
}

/// The samples of a `work` list, in order: one shared cell per `work` e-node, holding its
/// sample and its tail's cells, so that the analysis of a list of n samples costs O(n), not
/// the O(n^2) of copying every tail (rank pairs hold thousands of samples).
#[derive(Debug, Clone, Default)]
pub struct Units(Option<Rc<UnitCell>>);

#[derive(Debug)]
struct UnitCell {
    unit: u32,
    rest: Units,
}

impl Units {
    /// `unit` followed by `rest`.
    fn cons(unit: u32, rest: &Units) -> Units {
        Units(Some(Rc::new(UnitCell {
            unit,
            rest: rest.clone(),
        })))
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let mut cell = self.0.as_deref();
        std::iter::from_fn(move || {
            let current = cell?;
            cell = current.rest.0.as_deref();
            Some(current.unit)
        })
    }

    pub fn to_vec(&self) -> Vec<u32> {
        self.iter().collect()
    }
}

impl PartialEq for Units {
    fn eq(&self, other: &Units) -> bool {
        let (mut a, mut b) = (self.0.as_ref(), other.0.as_ref());
        loop {
            match (a, b) {
                (None, None) => return true,
                (Some(x), Some(y)) if Rc::ptr_eq(x, y) => return true,
                (Some(x), Some(y)) if x.unit == y.unit => {
                    (a, b) = (x.rest.0.as_ref(), y.rest.0.as_ref());
                }
                _ => return false,
            }
        }
    }
}

impl Drop for Units {
    /// Iteratively: a long list dropped recursively would overflow the stack.
    fn drop(&mut self) {
        let mut next = self.0.take();
        while let Some(cell) = next {
            next = match Rc::try_unwrap(cell) {
                Ok(mut cell) => cell.rest.0.take(),
                Err(_) => None,
            };
        }
    }
}

/// Per e-class data.
#[derive(Debug, Clone, PartialEq)]
pub enum RankData {
    Whole(u32),
    Work(Crew),
    /// A pair term: its children's data says what it costs.
    Pair,
}

impl RankData {
    fn crew(&self) -> &Crew {
        match self {
            RankData::Work(crew) => crew,
            other => panic!("{other:?} is not a work list; this is a bug"),
        }
    }
}

impl Analysis<Schedule> for RankAnalysis {
    type Data = RankData;

    fn make(egraph: &mut PairGraph, enode: &Schedule, _id: Id) -> RankData {
        match enode {
            Schedule::WholeSample(whole) => RankData::Whole(whole.0),
            Schedule::Idle => RankData::Work(Crew {
                units: Units::default(),
                plain: PackLoad::default(),
                merged: PackLoad::default(),
            }),
            Schedule::Work([head, rest]) => {
                let RankData::Whole(unit) = egraph[*head].data else {
                    panic!("a work list holds whole samples; this is a bug")
                };
                let rest = egraph[*rest].data.crew();
                let facts = &egraph.analysis.facts.units[unit as usize];
                RankData::Work(Crew {
                    units: Units::cons(unit, &rest.units),
                    plain: rest.plain.add(&facts.plain),
                    merged: rest.merged.add(&facts.merged),
                })
            }
            Schedule::Pair(_) => RankData::Pair,
            other => panic!("{other:?} in a rank pair's e-graph; this is a bug"),
        }
    }

    fn merge(&mut self, a: &mut RankData, b: RankData) -> DidMerge {
        assert_eq!(
            *a, b,
            "rank-pair e-classes of different samples were merged; this is a bug"
        );
        DidMerge(false, false)
    }
}

/// The two ranks' estimated seconds and what they sum to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairCost {
    pub ranks: [f64; 2],
}

impl PairCost {
    /// What the pair costs the step: its slower rank.
    pub fn max(&self) -> f64 {
        self.ranks[0].max(self.ranks[1])
    }

    /// Ranks pair terms: the slower rank, then the total.
    pub fn key(&self) -> (f64, f64) {
        (self.max(), self.ranks[0] + self.ranks[1])
    }
}

impl RankAnalysis {
    fn seconds(timer: &RefCell<PackTimer>, load: &PackLoad) -> f64 {
        let mut timer = timer.borrow_mut();
        timer.seconds(Direction::Forward, load) + timer.seconds(Direction::Backward, load)
    }

    /// The estimated cost of a pair whose plain replicas run loads `a` and `b` and whose
    /// group runs `group` (see the module header).
    pub fn cost(&self, a: &PackLoad, b: &PackLoad, group: &PackLoad) -> PairCost {
        let group = Self::seconds(&self.merged, group);
        PairCost {
            ranks: [
                Self::seconds(&self.plain, a) + group,
                Self::seconds(&self.plain, b) + group,
            ],
        }
    }
}

/// The rank-merging rules.
pub fn rules() -> Vec<Rewrite<Schedule, RankAnalysis>> {
    vec![
        // (pair (work x A) B M) == (pair A (work x B) M)  x: a sample of the slower rank (either side)
        rewrite!("move-to-partner"; "(pair ?a ?b ?m)" => { Place(Rewriting::MoveToPartner) }),
        // (pair (work x A) B M) == (pair A B (work x M))  x on rank a == x on the group {a, a+1}: half the work per rank plus the CP exchange
        rewrite!("merge-ranks";     "(pair ?a ?b ?m)" => { Place(Rewriting::MergeRanks) }),
        // (pair A B (work x M)) == (pair (work x A) B M)  x leaves the group for either rank's plain replica
        rewrite!("split-group";     "(pair ?a ?b ?m)" => { Place(Rewriting::SplitGroup) }),
    ]
}

/// Which rule a [`Place`] applier implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rewriting {
    MoveToPartner,
    MergeRanks,
    SplitGroup,
}

/// Adds the best few placements its rule reaches from the matched pair term.
struct Place(Rewriting);

/// One placement the rule may add: `units` moves from list `from` to list `to` (0: rank a's
/// plain replica, 1: rank a + 1's, 2: the group).
#[derive(Debug, Clone, Copy)]
struct Step {
    unit: u32,
    from: usize,
    to: usize,
    key: (f64, f64),
}

/// The rewrite lowers the pair's estimated cost.
fn balances(before: &PairCost, after: &PairCost) -> bool {
    after.max() < before.max() * (1.0 - 1e-12)
}

/// The rewrite makes the slower rank faster, though the pair may get slower: merging a
/// dominant sample loads the partner rank, which a later move to the slower rank relieves, so
/// merges and splits are added on this weaker guard (the e-graph keeps both terms and
/// extraction picks the cheaper).
fn relieves_slower(before: &PairCost, after: &PairCost) -> bool {
    let slower = usize::from(before.ranks[1] > before.ranks[0]);
    after.ranks[slower] < before.ranks[slower] * (1.0 - 1e-12)
}

/// The guard of a rule (see the module header).
fn admits(rewriting: Rewriting, before: &PairCost, after: &PairCost) -> bool {
    match rewriting {
        Rewriting::MoveToPartner => balances(before, after),
        Rewriting::MergeRanks | Rewriting::SplitGroup => relieves_slower(before, after),
    }
}

/// A sample may run on a plain replica.
fn fits_plain(facts: &PairFacts, unit: u32) -> bool {
    facts.units[unit as usize].len <= facts.plain_len_limit
}

/// The (from, to) list moves the rule tries for a pair whose ranks cost `cost`.
fn directions(rewriting: Rewriting, cost: &PairCost) -> Vec<(usize, usize)> {
    let slower = match cost.ranks[0].total_cmp(&cost.ranks[1]) {
        std::cmp::Ordering::Greater => Some(0),
        std::cmp::Ordering::Less => Some(1),
        std::cmp::Ordering::Equal => None,
    };
    match (rewriting, slower) {
        (Rewriting::MoveToPartner, Some(slower)) => vec![(slower, 1 - slower)],
        (Rewriting::MergeRanks, Some(slower)) => vec![(slower, 2)],
        (Rewriting::SplitGroup, _) => vec![(2, 0), (2, 1)],
        (_, None) => Vec::new(),
    }
}

impl Applier<Schedule, RankAnalysis> for Place {
    fn apply_one(
        &self,
        egraph: &mut PairGraph,
        root: Id,
        subst: &Subst,
        _: Option<&PatternAst<Schedule>>,
        _: Symbol,
    ) -> Vec<Id> {
        let vars = ["?a", "?b", "?m"].map(|v| subst[v.parse().unwrap()]);
        let crews = vars.map(|id| egraph[id].data.crew().clone());
        let analysis = &egraph.analysis;
        let facts = Rc::clone(&analysis.facts);
        let before = analysis.cost(&crews[0].plain, &crews[1].plain, &crews[2].merged);
        let mut steps = Vec::new();
        for (from, to) in directions(self.0, &before) {
            for unit in crews[from].units.iter() {
                if to < 2 && !fits_plain(&facts, unit) {
                    continue;
                }
                let unit_facts = &facts.units[unit as usize];
                let mut loads = [crews[0].plain, crews[1].plain, crews[2].merged];
                let load = |list: usize| {
                    if list < 2 {
                        unit_facts.plain
                    } else {
                        unit_facts.merged
                    }
                };
                loads[from] = loads[from].sub(&load(from));
                loads[to] = loads[to].add(&load(to));
                let after = analysis.cost(&loads[0], &loads[1], &loads[2]);
                if admits(self.0, &before, &after) {
                    steps.push(Step {
                        unit,
                        from,
                        to,
                        key: after.key(),
                    });
                }
            }
        }
        // Stable sort: equal keys keep the longer sample first.
        steps.sort_by(|x, y| {
            x.key
                .0
                .total_cmp(&y.key.0)
                .then(x.key.1.total_cmp(&y.key.1))
        });
        steps.truncate(facts.fanout);
        let mut changed = Vec::new();
        for step in steps {
            let mut lists = crews.clone().map(|crew| crew.units.to_vec());
            lists[step.from].retain(|&u| u != step.unit);
            let at = lists[step.to].partition_point(|&u| u < step.unit);
            lists[step.to].insert(at, step.unit);
            let children = lists.map(|units| add_work(egraph, &units));
            let pair = egraph.add(Schedule::Pair(children));
            if egraph.union(root, pair) {
                changed.push(pair);
            }
        }
        changed
    }
}

/// Adds the `work` list of `units` (increasing) and returns its e-class.
pub fn add_work(egraph: &mut PairGraph, units: &[u32]) -> Id {
    let mut list = egraph.add(Schedule::Idle);
    for &unit in units.iter().rev() {
        let leaf = egraph.add(Schedule::WholeSample(Whole(unit)));
        list = egraph.add(Schedule::Work([leaf, list]));
    }
    list
}

/// The pair terms of the root e-class, cheapest (by the estimate) first, as the three lists
/// of samples; at most `count`.
pub fn cheapest_placements(egraph: &PairGraph, root: Id, count: usize) -> Vec<[Vec<u32>; 3]> {
    type Placement = [Vec<u32>; 3];
    let mut found: Vec<((f64, f64), Placement)> = Vec::new();
    for node in &egraph[egraph.find(root)].nodes {
        let Schedule::Pair(children) = node else {
            continue;
        };
        let crews = children.map(|id| egraph[id].data.crew().clone());
        let cost = egraph
            .analysis
            .cost(&crews[0].plain, &crews[1].plain, &crews[2].merged);
        let lists = crews.map(|crew| crew.units.to_vec());
        if !found.iter().any(|(_, known)| *known == lists) {
            found.push((cost.key(), lists));
        }
    }
    // Stable sort: equal estimates keep the order the rules found them in.
    found.sort_by(|x, y| x.0 .0.total_cmp(&y.0 .0).then(x.0 .1.total_cmp(&y.0 .1)));
    found.truncate(count);
    found.into_iter().map(|(_, lists)| lists).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eqsat::language::Span;
    use egg::{RecExpr, Runner};
    use slimpack_ir::Spec;
    use slimpack_machine::cost::CostModel;

    /// A pair of llama-7b ranks (tp=8, pp=2) whose samples have `lengths`, sliced at 8192.
    fn analysis(lengths: &[u32], plain_len_limit: u32) -> RankAnalysis {
        let spec = Spec::from_presets("llama-7b", "h100-sxm", "tp=8,pp=2,dp=2").unwrap();
        let model = CostModel::new(&spec);
        let plain = Rc::new(RefCell::new(PackTimer::new(model.clone(), vec![0])));
        let merged = Rc::new(RefCell::new(PackTimer::new(model, vec![0, 1])));
        let units = lengths
            .iter()
            .map(|&len| {
                let spans: Vec<Span> = (0..len)
                    .step_by(8192)
                    .map(|start| Span {
                        sample: 0,
                        start,
                        len: (len - start).min(8192),
                    })
                    .collect();
                UnitFacts {
                    len,
                    plain: plain.borrow_mut().list_load(&spans),
                    merged: merged.borrow_mut().list_load(&spans),
                }
            })
            .collect();
        RankAnalysis {
            facts: Rc::new(PairFacts {
                units,
                plain_len_limit,
                fanout: 8,
            }),
            plain,
            merged,
        }
    }

    /// Runs `rule` once on `term`; the placements of the root e-class, cheapest first, and
    /// how often the rule applied.
    fn run(analysis: RankAnalysis, term: &str, rule: &str) -> (Vec<[Vec<u32>; 3]>, usize) {
        let rules: Vec<_> = rules()
            .into_iter()
            .filter(|r| r.name.as_str() == rule)
            .collect();
        let term: RecExpr<Schedule> = term.parse().unwrap();
        let runner: Runner<Schedule, RankAnalysis> = Runner::new(analysis)
            .with_expr(&term)
            .with_iter_limit(1)
            .run(&rules);
        let applied = runner.iterations[0]
            .applied
            .get(&Symbol::from(rule))
            .copied()
            .unwrap_or(0);
        let placements = cheapest_placements(&runner.egraph, runner.roots[0], usize::MAX);
        (placements, applied)
    }

    /// A dominant sample on rank a: merging it runs half of it on each rank, which beats
    /// leaving it (rank a pays all of it) and moving it (rank a + 1 would).
    #[test]
    fn merge_ranks_runs_a_dominant_sample_on_both_ranks() {
        let (placements, applied) = run(
            analysis(&[131072, 8192, 8192], u32::MAX),
            "(pair (work w0 (work w1 idle)) (work w2 idle) idle)",
            "merge-ranks",
        );
        assert!(applied >= 1);
        assert_eq!(placements[0], [vec![1], vec![2], vec![0]]);
    }

    /// The group's only sample is short: running it on a plain rank saves the CP exchange and
    /// the other rank's half.
    #[test]
    fn split_group_takes_a_short_sample_out_of_the_group() {
        let (placements, applied) = run(
            analysis(&[16384, 8192, 4096], u32::MAX),
            "(pair (work w0 idle) (work w1 idle) (work w2 idle))",
            "split-group",
        );
        assert!(applied >= 1);
        assert_eq!(placements[0], [vec![0], vec![1, 2], vec![]]);
        // Not if the sample is longer than a plain replica may hold.
        let (placements, applied) = run(
            analysis(&[16384, 8192, 4096], 2048),
            "(pair (work w0 idle) (work w1 idle) (work w2 idle))",
            "split-group",
        );
        assert_eq!(applied, 0);
        assert_eq!(placements.len(), 1);
    }

    /// The slower rank gives a sample to its partner, and only the slower one does.
    #[test]
    fn move_to_partner_moves_from_the_slower_rank_only() {
        let (placements, applied) = run(
            analysis(&[16384, 16384, 16384], u32::MAX),
            "(pair (work w0 (work w1 (work w2 idle))) idle idle)",
            "move-to-partner",
        );
        assert!(applied >= 1);
        assert_eq!(placements[0].each_ref().map(|l| l.len()), [2, 1, 0]);
        let (placements, applied) = run(
            analysis(&[16384, 16384], u32::MAX),
            "(pair (work w0 idle) (work w1 idle) idle)",
            "move-to-partner",
        );
        assert_eq!(applied, 0, "{placements:?}");
    }
}
