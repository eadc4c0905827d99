//! MicroPack building: partition one replica's slices into an ordered sequence of packs whose
//! costs balance, respecting each sample's slice order.
//!
//! The problem: every sample is a chain of slices that must land in packs of non-decreasing
//! index (forward: first slice first; backward: last slice first). Packs are filled one after
//! another; pack `k` gets the budget `remaining cost / remaining packs` and repeatedly takes the
//! chain head with the largest cost that still fits the budget and the token cap (best fit
//! decreasing over chain heads). A chain whose remaining length would not fit in the remaining
//! packs is urgent: its head goes in now. Under [`Chains::Contiguous`] (the rule `pack-fwd`
//! gives on one model chunk per device) a chain a previous pack started then continues in this
//! one, whatever the budget, so a sample's slices sit in consecutive packs (the memory it holds
//! until its backward spans few packs). Because packs are filled in order and a chain's next
//! slice only becomes a head once the previous one is placed, the order constraints hold by
//! construction. The last pack takes what is left; if that breaks the token cap, the pack count
//! grows and the partition is rebuilt: one count at a time at first, then galloping and
//! bisecting (a pass stops as soon as the tokens left exceed what the packs left can hold).
//! The heads are kept in `heads.rs`: sorted release groups with a union-find over removals, so a
//! greedy pass is O(n log n) in the slices.
//!
//! Two refinements follow: a bisection on a uniform per-pack budget (the same greedy, with every
//! pack capped at the budget, keeping the smallest budget that places everything), and a local
//! search that moves single slices out of the most loaded pack into the least loaded pack their
//! order constraints allow. `benches/optimality_gap.rs` measures the result against the exact
//! MILP ([`crate::milp`], feature `milp`).

mod build;
mod heads;
mod improve;

pub use build::RUNS_OVER_MEMORY;
pub(crate) use build::{pack_direction, PackOptions, BACKWARD_OPTIONS, FORWARD_OPTIONS};
use heads::{FirstHeads, Head, Heads};
use improve::improve;

/// One slice to pack: its cost in the direction being packed and its tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Item {
    pub cost: f64,
    pub tokens: u32,
}

/// A partition: for each pack, its members as (chain, index in chain), in placement order.
pub type Partition = Vec<Vec<(usize, usize)>>;

/// Whether a chain a pack started continues in the next pack whatever that pack's cost budget
/// (`Contiguous`), or only where its next slice fits the budget (`Free`).
///
/// Forward packs keep chains contiguous: a sample's activations (and the K/V its later slices
/// attend to) stay alive from its first slice's forward to its backward, so a chain spread
/// over the step (its first slice early, the rest when they turn urgent at the end, beside
/// other chains' tails) holds memory over every pack between and makes long chains overlap
/// (the held-out sweep's R16). Backward packs free what they run, so they keep the cost
/// balance free: chains there are short-lived already, and forcing them cost time (the 70B
/// Wikipedia step of `docs/BENCHMARKS.md`, 0.9%). On model chunks (`vpp > 1`) forward chains
/// are free too: contiguous ones made the interleaved list schedule of
/// `tests/interleaved.rs` slower (2.95 -> 3.11 s) and its peak higher (87% -> 96% of the
/// device), above the 92% limit its memory window aims at. The packing passes choose the rule;
/// the local search keeps it (a contiguous chain's slices move at most a pack from their
/// neighbours).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chains {
    Contiguous,
    Free,
}

/// Partitions `chains` (each in the order its items must run) into at least `packs` packs of at
/// most `cap` tokens, balancing cost. Chain `c` may enter pack `k` only from `k >= release[c]`
/// (the backward packer releases a sample once its forward is done, so backward pack k does
/// not wait on forwards far beyond forward pack k). Returns the packs in run order.
///
/// `run`, where given, bounds the tokens of a *run*: consecutive packs joined by chains that
/// span them. A forward pack's activations stay until its backward, and the backward of a
/// chain's first slice waits for the forward of its last, so a run's forwards are all in
/// flight at once, however short the pipeline's warm-up: a run is what a stage holds. Once a
/// run could pass `run` tokens with the next two packs, the next closes it: it finishes the
/// chains it continues (the cap permitting) and starts only chains that it holds whole, within
/// the run's bound. The bound is kept where the pack count leaves room: chains it forces into a
/// pack (urgent ones, the last pack's) can take a run past it by up to a pack.
pub fn partition<C: AsRef<[Item]>>(
    chains: &[C],
    release: &[usize],
    packs: usize,
    cap: u32,
    rule: Chains,
    run: Option<u64>,
) -> Partition {
    let chains: Vec<&[Item]> = chains.iter().map(AsRef::as_ref).collect();
    let chains = chains.as_slice();
    let order = ChainOrder::new(chains, release, rule, run);
    let best = smallest_fitting_count(chains, release, &order, packs.max(1), cap);
    let mut best = tighten(chains, release, &order, cap, best, true);
    improve(chains, release, cap, rule, run, &mut best);
    best
}

/// Bisects the smallest uniform budget that the greedy fits into as many packs as `best`
/// has, keeping the partition with the least largest pack. With `shortcut`, a step whose
/// budget the last fitting pass is known to repeat ([`same_packs_from`]) takes that pass's
/// outcome without running it: the same result (a test compares the two).
fn tighten(
    chains: &[&[Item]],
    release: &[usize],
    order: &ChainOrder,
    cap: u32,
    mut best: Partition,
    shortcut: bool,
) -> Partition {
    let mut high = max_load(chains, &best);
    let mut low = (order.total_cost / best.len() as f64).max(
        chains
            .iter()
            .flat_map(|c| c.iter())
            .map(|i| i.cost)
            .fold(0.0, f64::max),
    );
    // Budgets from which the last fitting pass is known to make its packs again, and the
    // pack count it ran with: a pass into fewer packs (`best` became a fitting pass that
    // used fewer than it was given) is another pass, whose urgent chains and cost checks
    // differ.
    let (mut same_from, mut same_count) = (f64::INFINITY, 0);
    for _ in 0..BISECTION_STEPS {
        if high - low <= 1e-4 * high {
            break;
        }
        let budget = 0.5 * (low + high);
        if shortcut && budget >= same_from && best.len() == same_count {
            // The pass would fit with the same packs, no better than `best`'s.
            high = budget;
            continue;
        }
        let count = best.len();
        let greedy = attempt(chains, release, order, count, cap, Some(budget), false);
        let largest = max_load(chains, &greedy.parts);
        match greedy.fits && largest <= budget * (1.0 + 1e-9) {
            true => {
                high = budget;
                (same_from, same_count) = (same_packs_from(&greedy, largest), count);
                if largest < max_load(chains, &best) {
                    best = greedy.parts;
                }
            }
            false => low = budget,
        }
    }
    best
}

/// The tokens of each run of a partition: consecutive packs that some chain spans (see
/// [`partition`]). Every item of `chains` is in one pack of `parts`.
pub fn run_tokens<C: AsRef<[Item]>>(chains: &[C], parts: &Partition) -> Vec<u64> {
    // The packs of each chain's first and last items (one table each, not one per chain: this
    // runs on every forward packing).
    let (mut first, mut last) = (vec![0usize; chains.len()], vec![0usize; chains.len()]);
    for (k, pack) in parts.iter().enumerate() {
        for &(c, i) in pack {
            if i == 0 {
                first[c] = k;
            }
            if i + 1 == chains[c].as_ref().len() {
                last[c] = k;
            }
        }
    }
    // Boundary k (between packs k and k + 1) is open if a chain spans it: the chains spanning
    // each boundary, counted by a difference table (linear, however far chains reach).
    let mut spanning = vec![0i64; parts.len() + 1];
    for (c, chain) in chains.iter().enumerate() {
        if chain.as_ref().is_empty() {
            continue;
        }
        let (first, last) = (first[c].min(last[c]), first[c].max(last[c]));
        spanning[first] += 1;
        spanning[last] -= 1;
    }
    let mut runs = vec![0u64];
    let mut open = 0i64;
    for (k, pack) in parts.iter().enumerate() {
        *runs.last_mut().expect("one run at least") += pack
            .iter()
            .map(|&(c, i)| u64::from(chains[c].as_ref()[i].tokens))
            .sum::<u64>();
        open += spanning[k];
        if open == 0 {
            runs.push(0);
        }
    }
    runs.retain(|&t| t > 0);
    runs
}

/// The least budget from which a fitting pass under a fixed budget, whose largest pack costs
/// `largest`, is known to make the same packs into the same pack count: every budget `b`
/// between that and its own, unless one of its head searches stopped at the scan limit
/// (`INFINITY` then).
///
/// Why: with a budget `b` no less than any pack's final cost, every head the pass took still
/// fits the room `b` leaves (a pack's cost only grows as it fills), and each search finds the
/// same head: the heads it passed over under the larger room are a superset of those it looks
/// at now, and whether a head fits its tokens (or, closing a run, its whole chain's cost the
/// room) does not get easier with less room; a search that found nothing looked at every head
/// under its room, unless capped, so it finds nothing again. The budget's other checks
/// (cost left against packs left, a pack over it) pass where every pack is within it. The
/// margin of `1e-9 · b` covers the rounding of a pack's running cost and of the room.
fn same_packs_from(greedy: &Greedy, largest: f64) -> f64 {
    match greedy.capped {
        true => f64::INFINITY,
        false => largest / (1.0 - 1e-9),
    }
}

/// Pack counts the count search tries one by one, from the first, before it gallops.
const LINEAR_COUNTS: usize = 8;

/// The greedy partition into the fewest packs from `first` on that fits the cap. Counts are
/// tried one by one for [`LINEAR_COUNTS`] counts, then in doubling steps until one fits, then
/// by bisection between the last count that did not fit and the first that did: O(log) greedy
/// passes where the cap needs many packs more than `tokens / cap` (short documents filling
/// packs by tokens before cost), not one pass per extra pack. Whether a count fits is not
/// proven monotone in the count, so past the linear counts the count found is the smallest
/// above one that does not fit, which need not be the smallest overall. With no count below
/// the number of slices fitting, the partition into that many packs is returned as it is.
fn smallest_fitting_count(
    chains: &[&[Item]],
    release: &[usize],
    order: &ChainOrder,
    first: usize,
    cap: u32,
) -> Partition {
    let total_items = order.total_items;
    // The last count possible keeps its partition even when it does not fit.
    let attempt_count = |count: usize| {
        let greedy = attempt(
            chains,
            release,
            order,
            count,
            cap,
            None,
            count >= total_items,
        );
        (greedy.parts, greedy.fits)
    };
    let (mut failed, mut count, mut step) = (None, first, 1);
    let (mut fitting, mut best) = loop {
        let (result, fits) = attempt_count(count);
        if fits || count >= total_items {
            break (count, result);
        }
        failed = Some(count);
        if count - first + 1 >= LINEAR_COUNTS {
            step *= 2;
        }
        count = (count + step).min(total_items);
    };
    let Some(mut failed) = failed else {
        return best;
    };
    while fitting - failed > 1 {
        let middle = failed + (fitting - failed) / 2;
        match attempt_count(middle) {
            (result, true) => (fitting, best) = (middle, result),
            _ => failed = middle,
        }
    }
    best
}

/// Heads (largest cost first) examined for one that also fits the token room: bounds the scan
/// when the cap, not the cost budget, is what fills a pack.
const TOKEN_SCAN: usize = 64;

/// Bisection steps on the budget (each one a greedy pass): 2^-16 of the initial interval.
const BISECTION_STEPS: usize = 16;

/// The largest pack cost of a partition.
fn max_load(chains: &[&[Item]], partition: &Partition) -> f64 {
    partition
        .iter()
        .map(|p| p.iter().map(|&(c, i)| chains[c][i].cost).sum::<f64>())
        .fold(0.0, f64::max)
}

/// The orders every greedy pass of one partition walks, computed once.
struct ChainOrder {
    /// Non-empty chains, latest release first (popped from the back).
    waiting: Vec<usize>,
    /// Non-empty chains by length, longest first.
    by_length: Vec<usize>,
    firsts: FirstHeads,
    total_cost: f64,
    total_tokens: u64,
    total_items: usize,
    /// How started chains continue.
    rule: Chains,
    /// The most tokens of a run of packs joined by chains (see [`partition`]).
    run: Option<u64>,
    /// Each chain's tokens and cost, whole (for a pack that closes a run; empty without a
    /// bound on runs).
    chain_tokens: Vec<u64>,
    chain_cost: Vec<f64>,
}

impl ChainOrder {
    fn new(chains: &[&[Item]], release: &[usize], rule: Chains, run: Option<u64>) -> ChainOrder {
        let mut waiting: Vec<usize> = (0..chains.len())
            .filter(|&c| !chains[c].is_empty())
            .collect();
        let mut by_length = waiting.clone();
        waiting.sort_by(|a, b| release[*b].cmp(&release[*a]).then(b.cmp(a)));
        by_length.sort_by(|a, b| chains[*b].len().cmp(&chains[*a].len()).then(a.cmp(b)));
        ChainOrder {
            waiting,
            by_length,
            firsts: FirstHeads::new(chains),
            total_cost: chains.iter().flat_map(|c| c.iter()).map(|i| i.cost).sum(),
            total_tokens: (chains.iter().flat_map(|c| c.iter()))
                .map(|i| u64::from(i.tokens))
                .sum(),
            total_items: chains.iter().map(|c| c.len()).sum(),
            rule,
            run,
            chain_tokens: match run {
                Some(_) => (chains.iter())
                    .map(|c| c.iter().map(|i| u64::from(i.tokens)).sum())
                    .collect(),
                None => Vec::new(),
            },
            chain_cost: match run {
                Some(_) => (chains.iter())
                    .map(|c| c.iter().map(|i| i.cost).sum())
                    .collect(),
                None => Vec::new(),
            },
        }
    }
}

/// What one greedy pass made.
struct Greedy {
    parts: Partition,
    /// Every item placed and every pack within the cap (and, under a fixed budget, within
    /// it).
    fits: bool,
    /// A search for the largest head stopped at its scan limit ([`Heads::capped`]).
    capped: bool,
}

/// One greedy pass into `count` packs. Pack budgets are `fixed` when given (the partition then
/// fails if anything is left over), else `remaining cost / remaining packs` with the last pack
/// taking what is left.
///
/// A pack over the cap fails the partition, so once the tokens left exceed `cap` times the
/// packs left the pass cannot fit: unless `keep_failure`, it stops there and returns the
/// partial partition as not fitting (the pack-count search then tries the next count without
/// finishing a doomed pass, which would make it quadratic in the packs). Under a `fixed`
/// budget the pass also stops, as not fitting, once the cost left exceeds the packs left at
/// that budget or a pack went over it: the budget bisection, its only caller, rejects such a
/// pass anyway (it accepts a pass whose every pack is within `budget·(1 + 1e-9)`; the looser
/// `1e-6` margins below keep the summation's rounding from stopping a pass it would accept).
fn attempt(
    chains: &[&[Item]],
    release: &[usize],
    order: &ChainOrder,
    count: usize,
    cap: u32,
    fixed: Option<f64>,
    keep_failure: bool,
) -> Greedy {
    let mut next = vec![0usize; chains.len()];
    // Chains not yet released, latest release first (popped from the back). A chain released
    // early because it became urgent stays in the vector, marked in `released`, and is skipped.
    let mut waiting = order.waiting.clone();
    let mut unreleased = waiting.len();
    let mut released = vec![false; chains.len()];
    let mut heads = Heads::new(&order.firsts);
    // Chains by length, longest first: the chains that can be urgent at a pack (at least as
    // many slices as packs left) are a prefix that grows as packs are filled, so each pack
    // looks only at them (linear over the partition, not chains x packs).
    let by_length = &order.by_length;
    let mut long_enough = 0;
    let mut remaining_cost = order.total_cost;
    let mut remaining_tokens = order.total_tokens;
    let mut remaining_items = order.total_items;
    let mut result: Partition = Vec::with_capacity(count);
    let mut fits = true;
    // Tokens of the run the previous packs form (see [`partition`]): 0 after a pack that left
    // no chain started.
    let mut run_tokens = 0u64;
    for k in 0..count {
        let packs_left = count - k;
        if !keep_failure && remaining_tokens > u64::from(cap) * packs_left as u64 {
            return Greedy {
                parts: result,
                fits: false,
                capped: heads.capped,
            };
        }
        if let Some(budget) = fixed {
            if remaining_cost > packs_left as f64 * budget * (1.0 + 1e-6) + 1e-6 * order.total_cost
            {
                return Greedy {
                    parts: result,
                    fits: false,
                    capped: heads.capped,
                };
            }
        }
        let last = packs_left == 1 && fixed.is_none();
        // Release the chains due by this pack (all of them in the last pack); an empty set of
        // heads releases the next chain early so that every pack makes progress.
        while let Some(&chain) = waiting.last() {
            if released[chain] {
                waiting.pop();
                continue;
            }
            if release[chain] > k && !last && !heads.is_empty() {
                break;
            }
            waiting.pop();
            released[chain] = true;
            unreleased -= 1;
            heads.start(Head {
                cost: chains[chain][0].cost,
                chain,
            });
        }
        let budget = fixed.unwrap_or(remaining_cost / packs_left as f64);
        // A pack that leaves its run open adds at most `cap` tokens, and so does the pack that
        // then closes it.
        let closing = (order.run).is_some_and(|run| run_tokens + 2 * u64::from(cap) > run);
        let run_room = (order.run).map_or(u64::MAX, |run| run.saturating_sub(run_tokens));
        // Sized for an even share of what is left (a pack's members grow one by one).
        let mut pack = Fill {
            members: Vec::with_capacity(remaining_items.div_ceil(packs_left) + 4),
            ..Fill::default()
        };
        // Urgent chains first: more slices left than packs left (released now if waiting).
        while long_enough < by_length.len() && chains[by_length[long_enough]].len() >= packs_left {
            long_enough += 1;
        }
        for &chain in &by_length[..long_enough] {
            if !released[chain] {
                released[chain] = true;
                unreleased -= 1;
                heads.start(Head {
                    cost: chains[chain][0].cost,
                    chain,
                });
            }
        }
        heads.seal();
        // The chains a previous pack started, with their next slice: each continues in this
        // pack (below) unless the urgent chains took that slice first.
        let continuing: Vec<(usize, usize)> = match order.rule {
            Chains::Contiguous => (heads.open_heads())
                .map(|head| (head.chain, next[head.chain]))
                .collect(),
            Chains::Free => Vec::new(),
        };
        // Only chains of several slices can become urgent before the last pack.
        let mut urgent: Vec<usize> = by_length[..long_enough]
            .iter()
            .copied()
            .filter(|&c| {
                chains[c].len() > 1
                    && chains[c].len() - next[c] > packs_left - 1
                    && heads.contains(c, chains, &next)
            })
            .collect();
        urgent.sort_unstable();
        for chain in urgent {
            pack.take(chain, &mut next, &mut heads, chains);
        }
        // Contiguous chains: a started chain's next slice goes in this pack whatever the cost
        // budget (the token cap permitting), so a sample's slices sit in consecutive packs.
        // A pack that closes a run finishes them where the cap lets it.
        for (chain, slice) in continuing {
            if next[chain] == slice && pack.has_room(chains[chain][slice], cap) {
                pack.take(chain, &mut next, &mut heads, chains);
                if closing {
                    pack.finish(chain, cap, &mut next, &mut heads, chains);
                }
            }
        }
        while !heads.is_empty() {
            let room = if last {
                f64::INFINITY
            } else {
                budget - pack.cost
            };
            let token_room = u64::from(cap).saturating_sub(pack.tokens);
            let fits_tokens =
                |h: &Head| u64::from(chains[h.chain][next[h.chain]].tokens) <= token_room;
            // A pack that closes a run starts only chains it holds whole.
            let fits_whole = |h: &Head| {
                let tokens = order.chain_tokens[h.chain];
                tokens <= token_room
                    && (run_tokens == 0 || pack.tokens + tokens <= run_room)
                    && order.chain_cost[h.chain] <= room
            };
            // The largest head that fits both the cost budget and the token cap, continuing a
            // started sample before starting a new one (fewer samples half-done, less memory);
            // new chains in the order they became available (the oldest released backward
            // first: it frees its sample's memory), each the largest of its release.
            let mut pick = heads.largest_open(room, TOKEN_SCAN, &fits_tokens);
            let mut whole = false;
            if pick.is_none() {
                pick = match closing {
                    true => heads.largest_fresh(room, TOKEN_SCAN, &fits_whole),
                    false => heads.largest_fresh(room, TOKEN_SCAN, &fits_tokens),
                };
                whole = closing && pick.is_some();
            }
            if pick.is_none() && (pack.members.is_empty() || last) {
                // An empty pack must make progress, and the last pack takes everything: the
                // smallest head (a cap overflow in the last pack grows the pack count).
                pick = heads.smallest();
            }
            let Some(head) = pick else { break };
            pack.take(head.chain, &mut next, &mut heads, chains);
            while whole && next[head.chain] < chains[head.chain].len() {
                pack.take(head.chain, &mut next, &mut heads, chains);
            }
        }
        // A pack that closes a run finishes what it left started (an urgent chain, the head
        // an empty pack had to take), the cap permitting.
        if closing {
            let open: Vec<usize> = heads.open_heads().map(|head| head.chain).collect();
            for chain in open {
                pack.finish(chain, cap, &mut next, &mut heads, chains);
            }
        }
        if pack.tokens > u64::from(cap) {
            fits = false;
        }
        if fixed.is_some_and(|budget| pack.cost > budget * (1.0 + 1e-9)) {
            return Greedy {
                parts: result,
                fits: false,
                capped: heads.capped,
            };
        }
        remaining_cost -= pack.cost;
        remaining_tokens -= pack.tokens;
        remaining_items -= pack.members.len();
        run_tokens = match heads.open_heads().next() {
            Some(_) => run_tokens + pack.tokens,
            None => 0,
        };
        if !pack.members.is_empty() {
            result.push(pack.members);
        }
        if heads.is_empty() && unreleased == 0 {
            break;
        }
    }
    Greedy {
        fits: fits && heads.is_empty() && unreleased == 0,
        parts: result,
        capped: heads.capped,
    }
}

/// The pack a greedy pass is filling: its cost, tokens and members so far.
#[derive(Default)]
struct Fill {
    cost: f64,
    tokens: u64,
    members: Vec<(usize, usize)>,
}

impl Fill {
    /// Whether `item` fits the pack under the token cap.
    fn has_room(&self, item: Item, cap: u32) -> bool {
        self.tokens + u64::from(item.tokens) <= u64::from(cap)
    }

    /// Places `chain`'s next slices while the cap has room for them.
    fn finish(
        &mut self,
        chain: usize,
        cap: u32,
        next: &mut [usize],
        heads: &mut Heads,
        chains: &[&[Item]],
    ) {
        while (chains[chain].get(next[chain])).is_some_and(|&item| self.has_room(item, cap)) {
            self.take(chain, next, heads, chains);
        }
    }

    /// Places `chain`'s next slice (its head) in the pack; the slice after it becomes the
    /// chain's open head.
    fn take(&mut self, chain: usize, next: &mut [usize], heads: &mut Heads, chains: &[&[Item]]) {
        let item = chains[chain][next[chain]];
        heads.remove(&Head {
            cost: item.cost,
            chain,
        });
        self.cost += item.cost;
        self.tokens += u64::from(item.tokens);
        self.members.push((chain, next[chain]));
        next[chain] += 1;
        if let Some(following) = chains[chain].get(next[chain]) {
            heads.open(Head {
                cost: following.cost,
                chain,
            });
        }
    }
}

#[cfg(test)]
mod tests;
