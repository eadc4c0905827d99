//! MicroPack building: partition one replica's slices into an ordered sequence of packs whose
//! costs balance, respecting each sample's slice order.
//!
//! The problem: every sample is a chain of slices that must land in packs of non-decreasing
//! index (forward: first slice first; backward: last slice first). Packs are filled one after
//! another; pack `k` gets the budget `remaining cost / remaining packs` and repeatedly takes the
//! chain head with the largest cost that still fits the budget and the token cap (best fit
//! decreasing over chain heads). A chain whose remaining length would not fit in the remaining
//! packs is urgent: its head goes in now. Because packs are filled in order and a chain's next
//! slice only becomes a head once the previous one is placed, the order constraints hold by
//! construction. The last pack takes what is left; if that breaks the token cap, the pack count
//! grows by one and the partition is rebuilt.
//!
//! Two refinements follow: a bisection on a uniform per-pack budget (the same greedy, with every
//! pack capped at the budget, keeping the smallest budget that places everything), and a local
//! search that moves single slices out of the most loaded pack into the least loaded pack their
//! order constraints allow. `benches/optimality_gap.rs` measures the result against the exact
//! MILP ([`crate::milp`], feature `milp`).

use std::collections::BTreeSet;

/// One slice to pack: its cost in the direction being packed and its tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Item {
    pub cost: f64,
    pub tokens: u32,
}

/// A partition: for each pack, its members as (chain, index in chain), in placement order.
pub type Partition = Vec<Vec<(usize, usize)>>;

/// Partitions `chains` (each in the order its items must run) into at least `packs` packs of at
/// most `cap` tokens, balancing cost. Chain `c` may enter pack `k` only from `k >= release[c]`
/// (the backward packer releases a sample once its forward is done, so backward pack k does
/// not wait on forwards far beyond forward pack k). Returns the packs in run order.
pub fn partition(chains: &[Vec<Item>], release: &[usize], packs: usize, cap: u32) -> Partition {
    let total_items: usize = chains.iter().map(Vec::len).sum();
    let mut count = packs.max(1);
    let mut best = loop {
        let (result, fits) = attempt(chains, release, count, cap, None);
        if fits || count >= total_items {
            break result;
        }
        count += 1;
    };
    // Tighten: bisect the smallest uniform budget that the same greedy fits into as many packs.
    let mut high = max_load(chains, &best);
    let mut low = (chains.iter().flatten().map(|i| i.cost).sum::<f64>() / best.len() as f64)
        .max(chains.iter().flatten().map(|i| i.cost).fold(0.0, f64::max));
    for _ in 0..BISECTION_STEPS {
        if high - low <= 1e-4 * high {
            break;
        }
        let budget = 0.5 * (low + high);
        match attempt(chains, release, best.len(), cap, Some(budget)) {
            (candidate, true) if max_load(chains, &candidate) <= budget * (1.0 + 1e-9) => {
                high = budget;
                if max_load(chains, &candidate) < max_load(chains, &best) {
                    best = candidate;
                }
            }
            _ => low = budget,
        }
    }
    improve(chains, release, cap, &mut best);
    best
}

/// Bisection steps on the budget (each one a greedy pass): 2^-16 of the initial interval.
const BISECTION_STEPS: usize = 16;

/// Local search rounds: single-slice moves out of the most loaded pack.
const IMPROVEMENT_ROUNDS: usize = 256;

/// Slices of a target pack considered for a swap (bounds the search on large packs).
const SWAP_CANDIDATES: usize = 64;

/// The largest pack cost of a partition.
fn max_load(chains: &[Vec<Item>], partition: &Partition) -> f64 {
    partition
        .iter()
        .map(|p| p.iter().map(|&(c, i)| chains[c][i].cost).sum::<f64>())
        .fold(0.0, f64::max)
}

/// Moves single slices out of the most loaded pack into another pack their order constraints
/// allow (between the packs of the chain's neighbours, not before its release, within the cap),
/// or swaps one with a lighter slice of another pack, while that lowers the maximum.
fn improve(chains: &[Vec<Item>], release: &[usize], cap: u32, partition: &mut Partition) {
    let packs = partition.len();
    let mut pack_of: Vec<Vec<usize>> = chains.iter().map(|c| vec![0; c.len()]).collect();
    let mut loads = vec![0.0; packs];
    let mut tokens = vec![0u64; packs];
    for (k, members) in partition.iter().enumerate() {
        for &(c, i) in members {
            pack_of[c][i] = k;
            loads[k] += chains[c][i].cost;
            tokens[k] += u64::from(chains[c][i].tokens);
        }
    }
    for _ in 0..IMPROVEMENT_ROUNDS {
        let heavy = (0..packs)
            .max_by(|&a, &b| loads[a].total_cmp(&loads[b]).then(b.cmp(&a)))
            .unwrap_or(0);
        let mut best: Option<(f64, usize, usize)> = None; // (new pair max, member index, target)
        for (m, &(c, i)) in partition[heavy].iter().enumerate() {
            let item = chains[c][i];
            let low = if i > 0 { pack_of[c][i - 1] } else { release[c] };
            let high = if i + 1 < chains[c].len() {
                pack_of[c][i + 1]
            } else {
                packs - 1
            };
            for target in low.max(release[c])..=high.min(packs - 1) {
                if target == heavy || tokens[target] + u64::from(item.tokens) > u64::from(cap) {
                    continue;
                }
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
            let shift = (chains[c][i].cost, u64::from(chains[c][i].tokens));
            loads[heavy] -= shift.0;
            tokens[heavy] -= shift.1;
            loads[target] += shift.0;
            tokens[target] += shift.1;
            pack_of[c][i] = target;
            partition[target].push((c, i));
            continue;
        }
        // No single move helps: try the best swap of a slice of the heavy pack with one of
        // another pack, both within their order windows and the caps.
        let window = |c: usize, i: usize, pack_of: &[Vec<usize>]| {
            let low = if i > 0 { pack_of[c][i - 1] } else { 0 }.max(release[c]);
            let high = if i + 1 < chains[c].len() {
                pack_of[c][i + 1]
            } else {
                packs - 1
            };
            (low, high)
        };
        let mut swap: Option<(f64, usize, usize, usize)> = None; // (pair max, a, target, b)
        for (a, &(ca, ia)) in partition[heavy].iter().enumerate() {
            let (low, high) = window(ca, ia, &pack_of);
            for target in low..=high.min(packs - 1) {
                if target == heavy {
                    continue;
                }
                for (b, &(cb, ib)) in partition[target].iter().enumerate().take(SWAP_CANDIDATES) {
                    let delta = chains[ca][ia].cost - chains[cb][ib].cost;
                    if cb == ca || delta <= 0.0 {
                        continue;
                    }
                    let (low_b, high_b) = window(cb, ib, &pack_of);
                    let token_delta =
                        i64::from(chains[ca][ia].tokens) - i64::from(chains[cb][ib].tokens);
                    let fits = tokens[target] as i64 + token_delta <= i64::from(cap)
                        && tokens[heavy] as i64 - token_delta <= i64::from(cap);
                    if heavy < low_b || heavy > high_b || !fits {
                        continue;
                    }
                    let pair_max = (loads[heavy] - delta).max(loads[target] + delta);
                    if pair_max < loads[heavy] * (1.0 - 1e-9)
                        && swap.is_none_or(|(m, ..)| pair_max < m)
                    {
                        swap = Some((pair_max, a, target, b));
                    }
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
        pack_of[ca][ia] = target;
        pack_of[cb][ib] = heavy;
        loads[heavy] -= delta;
        loads[target] += delta;
        tokens[heavy] = (tokens[heavy] as i64 - token_delta) as u64;
        tokens[target] = (tokens[target] as i64 + token_delta) as u64;
    }
    partition.retain(|p| !p.is_empty());
}

/// Chain-head key for the ordered set: cost (total order), then chain index for determinism.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Head {
    cost: f64,
    chain: usize,
}
impl Eq for Head {}
impl PartialOrd for Head {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Head {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.cost
            .total_cmp(&other.cost)
            .then(other.chain.cmp(&self.chain))
    }
}

/// One greedy pass into `count` packs. Pack budgets are `fixed` when given (the partition then
/// fails if anything is left over), else `remaining cost / remaining packs` with the last pack
/// taking what is left.
fn attempt(
    chains: &[Vec<Item>],
    release: &[usize],
    count: usize,
    cap: u32,
    fixed: Option<f64>,
) -> (Partition, bool) {
    let mut next = vec![0usize; chains.len()];
    // Chains not yet released, latest release first (popped from the back).
    let mut waiting: Vec<usize> = (0..chains.len())
        .filter(|&c| !chains[c].is_empty())
        .collect();
    waiting.sort_by(|a, b| release[*b].cmp(&release[*a]).then(b.cmp(a)));
    let mut heads: BTreeSet<Head> = BTreeSet::new();
    let mut remaining_cost: f64 = chains.iter().flatten().map(|i| i.cost).sum();
    let mut result: Partition = Vec::with_capacity(count);
    let mut fits = true;
    for k in 0..count {
        let packs_left = count - k;
        let last = packs_left == 1;
        // Release the chains due by this pack (all of them in the last pack); an empty set of
        // heads releases the next chain early so that every pack makes progress.
        while let Some(&chain) = waiting.last() {
            if release[chain] > k && !last && !heads.is_empty() {
                break;
            }
            waiting.pop();
            heads.insert(Head {
                cost: chains[chain][0].cost,
                chain,
            });
        }
        let budget = remaining_cost / packs_left as f64;
        let (mut cost, mut tokens) = (0.0, 0u64);
        let mut members = Vec::new();
        // Urgent chains first: more slices left than packs left (released now if waiting).
        waiting.retain(|&chain| {
            let urgent = chains[chain].len() > packs_left - 1;
            if urgent {
                heads.insert(Head {
                    cost: chains[chain][0].cost,
                    chain,
                });
            }
            !urgent
        });
        let urgent: Vec<usize> = heads
            .iter()
            .map(|h| h.chain)
            .filter(|&c| chains[c].len() - next[c] > packs_left - 1)
            .collect();
        for chain in urgent {
            let item = chains[chain][next[chain]];
            take(chain, item, &mut next, &mut heads, chains);
            cost += item.cost;
            tokens += u64::from(item.tokens);
            members.push((chain, next[chain] - 1));
        }
        while !heads.is_empty() {
            let room = if last { f64::INFINITY } else { budget - cost };
            let token_room = u64::from(cap).saturating_sub(tokens);
            let fits_tokens =
                |h: &&Head| u64::from(chains[h.chain][next[h.chain]].tokens) <= token_room;
            // The largest head that fits both the cost budget and the token cap.
            let mut pick = heads
                .range(
                    ..=Head {
                        cost: room,
                        chain: 0,
                    },
                )
                .rev()
                .find(fits_tokens)
                .copied();
            if pick.is_none() && (members.is_empty() || last) {
                // An empty pack must make progress, and the last pack takes everything: the
                // smallest head (a cap overflow in the last pack grows the pack count).
                pick = heads.iter().next().copied();
            }
            let Some(head) = pick else { break };
            let item = chains[head.chain][next[head.chain]];
            take(head.chain, item, &mut next, &mut heads, chains);
            cost += item.cost;
            tokens += u64::from(item.tokens);
            members.push((head.chain, next[head.chain] - 1));
        }
        if tokens > u64::from(cap) {
            fits = false;
        }
        remaining_cost -= cost;
        if !members.is_empty() {
            result.push(members);
        }
        if heads.is_empty() && waiting.is_empty() {
            break;
        }
    }
    (result, fits && heads.is_empty() && waiting.is_empty())
}

fn take(
    chain: usize,
    item: Item,
    next: &mut [usize],
    heads: &mut BTreeSet<Head>,
    chains: &[Vec<Item>],
) {
    heads.remove(&Head {
        cost: item.cost,
        chain,
    });
    next[chain] += 1;
    if let Some(following) = chains[chain].get(next[chain]) {
        heads.insert(Head {
            cost: following.cost,
            chain,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(costs: &[f64]) -> Vec<Item> {
        costs.iter().map(|&cost| Item { cost, tokens: 1 }).collect()
    }

    #[test]
    fn every_item_is_placed_once_and_in_chain_order() {
        let chains = vec![
            items(&[5.0, 6.0, 7.0]),
            items(&[1.0]),
            items(&[2.0, 2.0]),
            items(&[9.0]),
        ];
        let parts = partition(&chains, &[0; 4], 3, 100);
        let mut seen = vec![Vec::new(); chains.len()];
        for pack in &parts {
            for &(chain, index) in pack {
                seen[chain].push(index);
            }
        }
        for (chain, indices) in seen.iter().enumerate() {
            assert_eq!(indices, &(0..chains[chain].len()).collect::<Vec<_>>());
        }
    }

    #[test]
    fn balances_independent_items() {
        let chains: Vec<Vec<Item>> = [8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]
            .iter()
            .map(|&c| items(&[c]))
            .collect();
        let parts = partition(&chains, &[0; 8], 4, 100);
        let loads: Vec<f64> = parts
            .iter()
            .map(|p| p.iter().map(|&(c, i)| chains[c][i].cost).sum())
            .collect();
        assert_eq!(loads.len(), 4);
        assert!(loads.iter().all(|&l| (l - 9.0).abs() < 1e-9), "{loads:?}");
    }

    #[test]
    fn grows_the_pack_count_to_respect_the_cap() {
        let chains: Vec<Vec<Item>> = (0..6)
            .map(|_| {
                vec![Item {
                    cost: 1.0,
                    tokens: 10,
                }]
            })
            .collect();
        let parts = partition(&chains, &[0; 6], 2, 20);
        assert_eq!(parts.len(), 3);
        assert!(parts.iter().all(|p| p.len() == 2));
    }
}

/// Options shared by `pack-fwd` and `pack-bwd`.
pub(crate) const OPTIONS: &[crate::pass::OptionInfo] = &[
    crate::pass::OptionInfo {
        name: "cap",
        help: "token cap per pack (default: the batch's context length, or the longest sample)",
    },
    crate::pass::OptionInfo {
        name: "packs",
        help: "minimum packs per replica (default: tokens / cap, rounded up)",
    },
];

/// Parsed options of a packing pass.
#[derive(Debug, Clone, Copy, Default)]
pub struct PackOptions {
    pub cap: Option<u32>,
    pub packs: Option<usize>,
}

impl PackOptions {
    pub(crate) fn parse(options: &crate::pass::PassOptions) -> crate::Result<PackOptions> {
        let cap: Option<u32> = options.get("cap", "a positive integer")?;
        let packs: Option<usize> = options.get("packs", "a positive integer")?;
        for (name, value) in [("cap", cap.map(|c| c as usize)), ("packs", packs)] {
            if value == Some(0) {
                return Err(crate::PassError::BadOption {
                    pass: options.pass,
                    option: name.into(),
                    value: "0".into(),
                    message: "expected a positive integer".into(),
                });
            }
        }
        Ok(PackOptions { cap, packs })
    }
}

/// Builds the packs of one direction on every replica: chains in run order, costs from the
/// machine model (per-layer FLOPs of the slice at its offset, in that direction).
pub(crate) fn pack_direction(
    ir: &mut slimpack_ir::StepIr,
    direction: slimpack_ir::step::Direction,
    options: PackOptions,
    pass: &'static str,
) -> crate::Result<crate::pass::Statistics> {
    use slimpack_ir::step::{Direction, Pack};
    let cost = slimpack_ir::cost::CostModel::new(&ir.spec);
    let longest = ir
        .samples()
        .iter()
        .map(|&s| ir.sample(s).len)
        .max()
        .unwrap_or(1);
    let cap = options.cap.or(ir.batch.context).unwrap_or(longest);
    let mut stats = (0usize, 0u64, 0.0f64, f64::INFINITY);
    let mut worst_spread: f64 = 1.0;
    for replica in ir.replicas().to_vec() {
        if !ir.packs_on(replica, direction).is_empty() {
            return Err(crate::PassError::Failed {
                pass,
                message: format!("replica already has {} packs", direction.keyword()),
            });
        }
        let mut chains = Vec::new();
        let mut ids = Vec::new();
        let mut release = Vec::new();
        let forward_position: std::collections::HashMap<_, usize> = ir
            .packs_on(replica, Direction::Forward)
            .into_iter()
            .enumerate()
            .map(|(i, p)| (p, i))
            .collect();
        for sample in ir.samples_on(replica) {
            let mut slices = ir.slices_of(sample);
            if direction == Direction::Backward {
                slices.reverse();
            }
            // A backward chain is released once the sample's forward is complete: at the
            // position of the forward pack that holds its last slice.
            release.push(
                slices
                    .first()
                    .filter(|_| direction == Direction::Backward)
                    .and_then(|&s| ir.pack_of(s, Direction::Forward))
                    .and_then(|p| forward_position.get(&p).copied())
                    .unwrap_or(0),
            );
            chains.push(
                slices
                    .iter()
                    .map(|&s| {
                        let slice = ir.slice(s);
                        Item {
                            cost: cost
                                .slice_flops(
                                    u64::from(slice.len),
                                    u64::from(slice.start),
                                    direction,
                                )
                                .total(),
                            tokens: slice.len,
                        }
                    })
                    .collect::<Vec<_>>(),
            );
            ids.push(slices);
        }
        if chains.is_empty() {
            continue;
        }
        let tokens: u64 = chains.iter().flatten().map(|i| u64::from(i.tokens)).sum();
        let by_cap = tokens.div_ceil(u64::from(cap)) as usize;
        let packs = options.packs.unwrap_or(1).max(by_cap);
        let parts = partition(&chains, &release, packs, cap);
        let loads: Vec<f64> = parts
            .iter()
            .map(|p| p.iter().map(|&(c, i)| chains[c][i].cost).sum())
            .collect();
        let mean = loads.iter().sum::<f64>() / loads.len() as f64;
        let max = loads.iter().copied().fold(0.0, f64::max);
        worst_spread = worst_spread.max(if mean > 0.0 { max / mean } else { 1.0 });
        for mut members in parts {
            // Inside a pack, slices run in sample order, each sample's in its run order.
            members.sort_unstable();
            let slices: Vec<_> = members.iter().map(|&(c, i)| ids[c][i]).collect();
            let pack_tokens: u64 = members
                .iter()
                .map(|&(c, i)| u64::from(chains[c][i].tokens))
                .sum();
            stats.1 = stats.1.max(pack_tokens);
            stats.3 = stats.3.min(pack_tokens as f64);
            ir.add_pack(
                Pack {
                    direction,
                    cap: Some(cap),
                },
                replica,
                &slices,
            );
            stats.0 += 1;
        }
        stats.2 += 1.0;
    }
    Ok(crate::pass::Statistics::new()
        .with("packs", stats.0)
        .with("cap", cap)
        .with("largest_pack_tokens", stats.1)
        .with(
            "smallest_pack_tokens",
            if stats.3.is_finite() {
                stats.3 as u64
            } else {
                0
            },
        )
        .with("cost_spread", worst_spread))
}
