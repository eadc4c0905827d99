//! Local search on a MicroPack partition: single-slice moves and pairwise swaps out of the most
//! loaded pack, within each slice's order window and the token cap.

use super::{Chains, Item, Partition};

/// Local search rounds: single-slice moves out of the most loaded pack.
const IMPROVEMENT_ROUNDS: usize = 256;

/// Lightest packs considered as swap partners of each slice of the heaviest pack.
const SWAP_TARGETS: usize = 8;

/// Slices of a target pack considered for a swap (bounds the search on large packs).
const SWAP_CANDIDATES: usize = 64;

/// Moves single slices out of the most loaded pack into another pack their order constraints
/// allow (between the packs of the chain's neighbours, not before its release, within the cap;
/// under [`Chains::Contiguous`] also at most one pack from either neighbour, so that a local
/// move does not spread a chain the greedy kept together), or swaps one with a lighter slice of
/// another pack, while that lowers the maximum. With a `run` bound (the greedy bounded the runs
/// of packs that chains join, see [`super::partition`]) a chain of several slices does not move
/// out of the packs it spans, so no move joins two runs, and no move takes a run past the bound
/// (or further past it).
pub(super) fn improve(
    chains: &[&[Item]],
    release: &[usize],
    cap: u32,
    rule: Chains,
    run: Option<u64>,
    partition: &mut Partition,
) {
    let packs = partition.len();
    // The packs slice `i` of chain `c` may move to.
    let window = |c: usize, i: usize, pack_of: &PackOf| {
        let previous = (i > 0).then(|| pack_of.at(c, i - 1));
        let next = (i + 1 < chains[c].len()).then(|| pack_of.at(c, i + 1));
        let mut low = previous.unwrap_or(0).max(release[c]);
        let mut high = next.unwrap_or(packs - 1);
        if rule == Chains::Contiguous {
            if let Some(next) = next {
                low = low.max(next.saturating_sub(1));
            }
            if let Some(previous) = previous {
                high = high.min(previous + 1);
            }
        }
        if run.is_some() && chains[c].len() > 1 {
            low = low.max(pack_of.at(c, 0));
            high = high.min(pack_of.at(c, chains[c].len() - 1));
        }
        (low, high)
    };
    let mut pack_of = PackOf::new(chains);
    let mut loads = vec![0.0; packs];
    let mut tokens = vec![0u64; packs];
    // Each pack's members' costs, beside `partition` (the swap search reads them in bulk).
    let mut costs: Vec<Vec<f64>> = Vec::with_capacity(packs);
    for (k, members) in partition.iter().enumerate() {
        costs.push(members.iter().map(|&(c, i)| chains[c][i].cost).collect());
        for &(c, i) in members {
            pack_of.set(c, i, k);
            loads[k] += chains[c][i].cost;
            tokens[k] += u64::from(chains[c][i].tokens);
        }
    }
    let mut runs = Runs::new(chains, partition, &pack_of, run);
    let mut targets = Vec::with_capacity(SWAP_TARGETS);
    // Packs from the lightest: the best target of a move is the lightest one allowed.
    let mut by_load: Vec<usize> = (0..packs).collect();
    by_load.sort_by(|&a, &b| lighter(&loads, a, b));
    for _ in 0..IMPROVEMENT_ROUNDS {
        let heavy = (0..packs)
            .max_by(|&a, &b| loads[a].total_cmp(&loads[b]).then(b.cmp(&a)))
            .unwrap_or(0);
        let mut best: Option<(f64, usize, usize)> = None; // (new pair max, member index, target)
        for (m, &(c, i)) in partition[heavy].iter().enumerate() {
            let item = chains[c][i];
            let (low, high) = window(c, i, &pack_of);
            let target = by_load.iter().copied().find(|&t| {
                t != heavy
                    && (low..=high).contains(&t)
                    && tokens[t] + u64::from(item.tokens) <= u64::from(cap)
                    && runs.allows(heavy, t, i64::from(item.tokens))
            });
            if let Some(target) = target {
                let pair_max = (loads[heavy] - item.cost).max(loads[target] + item.cost);
                if pair_max < loads[heavy] * (1.0 - 1e-9)
                    && best.is_none_or(|(b, _, _)| pair_max < b)
                {
                    best = Some((pair_max, m, target));
                }
            }
        }
        if let Some((_, member, target)) = best {
            let (c, i) = partition[heavy].remove(member);
            costs[heavy].remove(member);
            costs[target].push(chains[c][i].cost);
            let shift = (chains[c][i].cost, u64::from(chains[c][i].tokens));
            loads[heavy] -= shift.0;
            tokens[heavy] -= shift.1;
            loads[target] += shift.0;
            tokens[target] += shift.1;
            runs.shift(heavy, target, shift.1 as i64);
            pack_of.set(c, i, target);
            partition[target].push((c, i));
            reorder(&mut by_load, &loads, [heavy, target]);
            continue;
        }
        // No single move helps: try the best swap of a slice of the heavy pack with one of
        // another pack, both within their order windows and the caps.
        let mut swap: Option<(f64, usize, usize, usize)> = None; // (pair max, a, target, b)
                                                                 // What a swap's pair max must stay below: the best swap's so far (itself below the
                                                                 // heavy pack's threshold), or the threshold.
        let threshold = loads[heavy] * (1.0 - 1e-9);
        let bar = |swap: Option<(f64, usize, usize, usize)>| swap.map_or(threshold, |(m, ..)| m);
        for (a, &(ca, ia)) in partition[heavy].iter().enumerate() {
            let (low, high) = window(ca, ia, &pack_of);
            lightest_in(
                &by_load,
                &loads,
                heavy,
                low..=high.min(packs - 1),
                &mut targets,
            );
            let cost_a = chains[ca][ia].cost;
            for &target in &targets {
                // A swap puts more cost on the target than it had: a target at least as
                // loaded as the best pair so far (or the heavy pack) cannot beat it, nor can
                // the targets after it, which are loaded no less.
                if loads[target] >= bar(swap) {
                    break;
                }
                let members = partition[target].iter().zip(&costs[target]);
                for (b, (&(cb, ib), &cost_b)) in members.enumerate().take(SWAP_CANDIDATES) {
                    let delta = cost_a - cost_b;
                    if cb == ca || delta <= 0.0 {
                        continue;
                    }
                    // The gain first: most pairs do not beat the best swap so far, and the
                    // constraints below cost more to check.
                    let pair_max = (loads[heavy] - delta).max(loads[target] + delta);
                    let improves = pair_max < bar(swap);
                    if !improves {
                        continue;
                    }
                    let (low_b, high_b) = window(cb, ib, &pack_of);
                    let token_delta =
                        i64::from(chains[ca][ia].tokens) - i64::from(chains[cb][ib].tokens);
                    let fits = tokens[target] as i64 + token_delta <= i64::from(cap)
                        && tokens[heavy] as i64 - token_delta <= i64::from(cap);
                    if heavy < low_b
                        || heavy > high_b
                        || !fits
                        || !runs.allows(heavy, target, token_delta)
                        || !runs.allows(target, heavy, -token_delta)
                    {
                        continue;
                    }
                    swap = Some((pair_max, a, target, b));
                }
            }
        }
        let Some((_, a, target, b)) = swap else { break };
        let (ca, ia) = partition[heavy][a];
        let (cb, ib) = partition[target][b];
        let delta = chains[ca][ia].cost - chains[cb][ib].cost;
        let token_delta = i64::from(chains[ca][ia].tokens) - i64::from(chains[cb][ib].tokens);
        partition[heavy][a] = (cb, ib);
        partition[target][b] = (ca, ia);
        costs[heavy][a] = chains[cb][ib].cost;
        costs[target][b] = chains[ca][ia].cost;
        pack_of.set(ca, ia, target);
        pack_of.set(cb, ib, heavy);
        loads[heavy] -= delta;
        loads[target] += delta;
        tokens[heavy] = (tokens[heavy] as i64 - token_delta) as u64;
        tokens[target] = (tokens[target] as i64 + token_delta) as u64;
        runs.shift(heavy, target, token_delta);
        reorder(&mut by_load, &loads, [heavy, target]);
    }
    partition.retain(|p| !p.is_empty());
}

/// Pack `a` before pack `b` from the lightest: by load, then by index (a total order, so the
/// sorted packs are one sequence however they are kept sorted).
fn lighter(loads: &[f64], a: usize, b: usize) -> std::cmp::Ordering {
    loads[a].total_cmp(&loads[b]).then(a.cmp(&b))
}

/// The first [`SWAP_TARGETS`] packs of `window` other than `heavy`, lightest first, into
/// `targets`: a walk of `by_load` from the lightest, or where the window holds few packs (a
/// contiguous chain's slice moves at most a pack), its packs sorted the same way.
fn lightest_in(
    by_load: &[usize],
    loads: &[f64],
    heavy: usize,
    window: std::ops::RangeInclusive<usize>,
    targets: &mut Vec<usize>,
) {
    targets.clear();
    let width = if window.is_empty() {
        0
    } else {
        window.end() - window.start() + 1
    };
    if width * 4 < by_load.len() {
        targets.extend(window.clone().filter(|&t| t != heavy));
        targets.sort_unstable_by(|&a, &b| lighter(loads, a, b));
        targets.truncate(SWAP_TARGETS);
    } else {
        let allowed = |&t: &usize| t != heavy && window.contains(&t);
        targets.extend(by_load.iter().copied().filter(allowed).take(SWAP_TARGETS));
    }
}

/// Puts the two packs whose loads a move or swap changed back in their places in `by_load`
/// (the others' loads, and so their order, are unchanged).
fn reorder(by_load: &mut Vec<usize>, loads: &[f64], changed: [usize; 2]) {
    by_load.retain(|pack| !changed.contains(pack));
    for pack in changed {
        let at = by_load.partition_point(|&other| lighter(loads, other, pack).is_lt());
        by_load.insert(at, pack);
    }
}

/// The runs of packs that chains join (see [`super::partition`]) and their tokens, under a bound
/// on them; a move within the chains' spans never joins two runs, so the runs stay as they are.
struct Runs {
    /// Each pack's run, and each run's tokens (empty without a bound).
    run_of: Vec<usize>,
    tokens: Vec<u64>,
    bound: u64,
}

impl Runs {
    fn new(
        chains: &[&[Item]],
        partition: &Partition,
        pack_of: &PackOf,
        bound: Option<u64>,
    ) -> Runs {
        let Some(bound) = bound else {
            return Runs {
                run_of: Vec::new(),
                tokens: Vec::new(),
                bound: u64::MAX,
            };
        };
        // Boundary k (after pack k) is open where a chain spans it.
        let mut open = vec![false; partition.len()];
        for (c, chain) in chains.iter().enumerate() {
            if let Some(last) = chain.len().checked_sub(1) {
                for boundary in &mut open[pack_of.at(c, 0)..pack_of.at(c, last)] {
                    *boundary = true;
                }
            }
        }
        let (mut run_of, mut tokens) = (Vec::with_capacity(partition.len()), vec![0u64]);
        for (k, members) in partition.iter().enumerate() {
            run_of.push(tokens.len() - 1);
            *tokens.last_mut().expect("one run at least") += (members.iter())
                .map(|&(c, i)| u64::from(chains[c][i].tokens))
                .sum::<u64>();
            if !open[k] {
                tokens.push(0);
            }
        }
        Runs {
            run_of,
            tokens,
            bound,
        }
    }

    /// Whether `delta` tokens may go from pack `from` to pack `to`: the receiving run stays
    /// within the bound, or does not grow.
    fn allows(&self, from: usize, to: usize, delta: i64) -> bool {
        if self.run_of.is_empty() || self.run_of[from] == self.run_of[to] || delta <= 0 {
            return true;
        }
        self.tokens[self.run_of[to]] + delta as u64 <= self.bound
    }

    fn shift(&mut self, from: usize, to: usize, delta: i64) {
        if self.run_of.is_empty() {
            return;
        }
        let (from, to) = (self.run_of[from], self.run_of[to]);
        self.tokens[from] = (self.tokens[from] as i64 - delta) as u64;
        self.tokens[to] = (self.tokens[to] as i64 + delta) as u64;
    }
}

/// The pack of every item, in one table indexed by chain and position.
struct PackOf {
    /// Where each chain's items start in `pack`.
    first: Vec<usize>,
    pack: Vec<usize>,
}

impl PackOf {
    fn new(chains: &[&[Item]]) -> PackOf {
        let mut first = Vec::with_capacity(chains.len());
        let mut total = 0;
        for chain in chains {
            first.push(total);
            total += chain.len();
        }
        PackOf {
            first,
            pack: vec![0; total],
        }
    }

    fn at(&self, chain: usize, index: usize) -> usize {
        self.pack[self.first[chain] + index]
    }

    fn set(&mut self, chain: usize, index: usize, pack: usize) {
        self.pack[self.first[chain] + index] = pack;
    }
}
