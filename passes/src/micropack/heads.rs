//! The chain heads the MicroPack greedy chooses from: heads of chains already started (`open`,
//! an ordered set: a started chain's next slice joins it as the previous one is placed) and
//! heads of chains not started yet (`fresh`, grouped by the pack at which they were released,
//! oldest release first).
//!
//! Fresh heads are only ever removed once their group is complete, so a group is a sorted
//! vector with a union-find over removed positions ([`ReleaseGroup`]): the largest head under a
//! cost bound is a binary search plus a near-constant skip over removed heads, instead of an
//! ordered-set walk with an allocation per insertion. A pack's releases are collected and
//! sealed into their group before the pack takes anything ([`Heads::seal`]).

use std::collections::BTreeSet;

use super::Item;

/// Chain-head key: cost (total order), then chain index for determinism (the lower chain is
/// the larger key, so it is preferred among equal costs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Head {
    pub cost: f64,
    pub chain: usize,
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

/// Where a chain's fresh head is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fresh {
    /// Not a fresh head (not released yet, or already started).
    No,
    /// Released in the current pack, not sealed into its group yet.
    Pending,
    /// In group `group` at position `index`.
    At { group: u32, index: u32 },
}

/// The fresh heads of one release, ascending, with removals.
#[derive(Debug)]
struct ReleaseGroup {
    heads: Vec<Head>,
    /// The heads' costs as order-preserving integers (the binary search's keys).
    keys: Vec<u64>,
    /// Union-find over slots (slot `i + 1` is head `i`, slot 0 is "none"): a slot is its own
    /// root while its head is present; a removed head's slot points one slot down.
    below: Vec<u32>,
    present: usize,
    /// No head below this position is present.
    lowest: usize,
    /// The last bound's count of keys at or under it: the next search starts there (a pack's
    /// room shrinks as it fills, so the next count is usually near; it goes back up at the
    /// next pack, which the search handles as well).
    hint: usize,
}

impl ReleaseGroup {
    fn new(heads: Vec<Head>) -> ReleaseGroup {
        let present = heads.len();
        ReleaseGroup {
            below: (0..=heads.len() as u32).collect(),
            keys: heads.iter().map(|h| cost_key(h.cost)).collect(),
            heads,
            present,
            lowest: 0,
            hint: 0,
        }
    }

    /// The slot of the highest present head at or below `slot` (0: none).
    fn find(&mut self, mut slot: u32) -> u32 {
        while self.below[slot as usize] != slot {
            let parent = self.below[slot as usize];
            self.below[slot as usize] = self.below[parent as usize];
            slot = parent;
        }
        slot
    }

    fn remove(&mut self, index: usize) {
        self.below[index + 1] = index as u32;
        self.present -= 1;
    }

    fn smallest(&mut self) -> Option<Head> {
        while self.lowest < self.heads.len()
            && self.below[self.lowest + 1] as usize != self.lowest + 1
        {
            self.lowest += 1;
        }
        self.heads.get(self.lowest).copied()
    }

    /// The largest present head costing at most `room` for which `fits` holds, looking at no
    /// more than `scan` present heads from the top; `capped` is set where the scan stopped at
    /// that limit with heads left under it.
    fn largest_fitting(
        &mut self,
        room: f64,
        scan: usize,
        fits: &impl Fn(&Head) -> bool,
        capped: &mut bool,
    ) -> Option<Head> {
        let count = count_at_most(&self.keys, cost_key(room), self.hint);
        self.hint = count;
        let mut slot = self.find(count as u32);
        for _ in 0..scan {
            if slot == 0 {
                return None;
            }
            let head = self.heads[slot as usize - 1];
            if fits(&head) {
                return Some(head);
            }
            slot = self.find(slot - 1);
        }
        *capped |= slot != 0;
        None
    }
}

/// How many of the ascending `keys` are at most `key` (`partition_point`), searched from
/// `hint` outward in doubling steps and then by bisection: O(log d) for an answer `d` away.
fn count_at_most(keys: &[u64], key: u64, hint: usize) -> usize {
    let hint = hint.min(keys.len());
    let at_most = |k: &u64| *k <= key;
    if hint < keys.len() && keys[hint] <= key {
        // The answer is above `hint`: keys[..low] are all at most `key`.
        let (mut low, mut step) = (hint + 1, 1);
        loop {
            let high = (low + step).min(keys.len());
            if high == keys.len() || keys[high] > key {
                return low + keys[low..high].partition_point(at_most);
            }
            (low, step) = (high + 1, step * 2);
        }
    }
    if hint == 0 || keys[hint - 1] <= key {
        return hint;
    }
    // The answer is below `hint`: keys[high..] are all over `key`.
    let (mut high, mut step) = (hint - 1, 1);
    loop {
        let low = high.saturating_sub(step);
        if keys[low] <= key {
            return low + 1 + keys[low + 1..high].partition_point(at_most);
        }
        if low == 0 {
            return 0;
        }
        (high, step) = (low, step * 2);
    }
}

/// `cost` as an integer that orders as `f64::total_cmp` does.
fn cost_key(cost: f64) -> u64 {
    let bits = cost.to_bits();
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    }
}

/// Every chain's first head, in ascending order, computed once per partition: a release is
/// sorted by these ranks (or, when it holds most chains, picked out of this order).
#[derive(Debug)]
pub(super) struct FirstHeads {
    ascending: Vec<Head>,
    /// Position of each chain's first head in `ascending` (empty chains: none).
    rank: Vec<u32>,
}

impl FirstHeads {
    pub fn new(chains: &[&[Item]]) -> FirstHeads {
        let mut ascending: Vec<Head> = chains
            .iter()
            .enumerate()
            .filter_map(|(chain, items)| {
                items.first().map(|item| Head {
                    cost: item.cost,
                    chain,
                })
            })
            .collect();
        ascending.sort_unstable();
        let mut rank = vec![u32::MAX; chains.len()];
        for (position, head) in ascending.iter().enumerate() {
            rank[head.chain] = position as u32;
        }
        FirstHeads { ascending, rank }
    }
}

/// The chain heads available to the pack being filled (see the module comment).
#[derive(Debug)]
pub(super) struct Heads<'a> {
    firsts: &'a FirstHeads,
    open: BTreeSet<Head>,
    groups: Vec<ReleaseGroup>,
    /// Groups with a head present, oldest release first.
    live: Vec<u32>,
    pending: Vec<Head>,
    fresh: Vec<Fresh>,
    /// Fresh heads present or pending.
    fresh_count: usize,
    /// Whether a search for the largest head under a room found none because it stopped at
    /// its scan limit with heads left below: only then can a smaller room find one where
    /// this one did not (see `super::partition`'s bisection).
    pub capped: bool,
}

impl<'a> Heads<'a> {
    pub fn new(firsts: &'a FirstHeads) -> Heads<'a> {
        let chains = firsts.rank.len();
        Heads {
            firsts,
            open: BTreeSet::new(),
            groups: Vec::new(),
            live: Vec::new(),
            pending: Vec::new(),
            fresh: vec![Fresh::No; chains],
            fresh_count: 0,
            capped: false,
        }
    }

    /// Makes a chain available in the current pack's release (`head` is its first head).
    pub fn start(&mut self, head: Head) {
        self.pending.push(head);
        self.fresh[head.chain] = Fresh::Pending;
        self.fresh_count += 1;
    }

    /// Closes the current pack's release: its chains become one group, after the older ones.
    pub fn seal(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let mut heads = std::mem::take(&mut self.pending);
        if heads.len() >= self.firsts.ascending.len() / 4 {
            // Most chains at once (the forward's first pack): filtering the whole order is
            // linear, sorting is not.
            heads = (self.firsts.ascending.iter())
                .filter(|head| self.fresh[head.chain] == Fresh::Pending)
                .copied()
                .collect();
        } else {
            heads.sort_unstable_by_key(|head| self.firsts.rank[head.chain]);
        }
        let group = self.groups.len() as u32;
        for (index, head) in heads.iter().enumerate() {
            self.fresh[head.chain] = Fresh::At {
                group,
                index: index as u32,
            };
        }
        self.groups.push(ReleaseGroup::new(heads));
        self.live.push(group);
    }

    /// A started chain's next head.
    pub fn open(&mut self, head: Head) {
        self.open.insert(head);
    }

    /// Removes `head`, open or fresh (sealed).
    pub fn remove(&mut self, head: &Head) {
        if self.open.remove(head) {
            return;
        }
        let Fresh::At { group, index } = self.fresh[head.chain] else {
            panic!("micropack: removing a head that is neither open nor sealed (bug)");
        };
        self.fresh[head.chain] = Fresh::No;
        self.fresh_count -= 1;
        let release = &mut self.groups[group as usize];
        release.remove(index as usize);
        if release.present == 0 {
            self.live.retain(|&g| g != group);
        }
    }

    /// Whether chain `c`'s next item is an available head.
    pub fn contains(&self, c: usize, chains: &[&[Item]], next: &[usize]) -> bool {
        let Some(item) = chains[c].get(next[c]) else {
            return false;
        };
        self.fresh[c] != Fresh::No
            || self.open.contains(&Head {
                cost: item.cost,
                chain: c,
            })
    }

    /// The open heads, largest first.
    pub fn open_heads(&self) -> impl Iterator<Item = Head> + '_ {
        self.open.iter().rev().copied()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty() && self.fresh_count == 0
    }

    /// The largest open head costing at most `room` that `fits`, among the `scan` largest.
    pub fn largest_open(
        &mut self,
        room: f64,
        scan: usize,
        fits: &impl Fn(&Head) -> bool,
    ) -> Option<Head> {
        // Chain 0 is the largest head of its cost.
        let bound = Head {
            cost: room,
            chain: 0,
        };
        let mut under = self.open.range(..=bound).rev();
        let found = under.by_ref().take(scan).find(|h| fits(h)).copied();
        self.capped |= found.is_none() && under.next().is_some();
        found
    }

    /// The largest fresh head costing at most `room` that `fits` (among the `scan` largest of
    /// a release), from the oldest release that has one.
    pub fn largest_fresh(
        &mut self,
        room: f64,
        scan: usize,
        fits: &impl Fn(&Head) -> bool,
    ) -> Option<Head> {
        for &group in &self.live {
            let release = &mut self.groups[group as usize];
            // A release whose cheapest head is over the room has none: skipped without its
            // binary search (amortised O(1): `smallest` only moves up).
            if release.smallest().is_none_or(|head| head.cost > room) {
                continue;
            }
            let found = release.largest_fitting(room, scan, fits, &mut self.capped);
            if found.is_some() {
                return found;
            }
        }
        None
    }

    /// The cheapest head of either set.
    pub fn smallest(&mut self) -> Option<Head> {
        let mut least = self.open.first().copied();
        for &group in &self.live {
            let first = self.groups[group as usize].smallest();
            if let Some(head) = first {
                if least.is_none_or(|l| head < l) {
                    least = Some(head);
                }
            }
        }
        least
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(cost: f64, chain: usize) -> Head {
        Head { cost, chain }
    }

    fn group() -> ReleaseGroup {
        let mut heads: Vec<Head> = [5.0, 1.0, 3.0, 3.0, 8.0]
            .iter()
            .enumerate()
            .map(|(chain, &cost)| head(cost, chain))
            .collect();
        heads.sort_unstable();
        ReleaseGroup::new(heads)
    }

    #[test]
    fn largest_under_a_bound_skips_removed_heads() {
        let mut group = group();
        let any = |_: &Head| true;
        let bound = 5.0;
        assert_eq!(
            group.largest_fitting(bound, 8, &any, &mut false),
            Some(head(5.0, 0))
        );
        // Heads ascending: 1.0 (1), 3.0 (3), 3.0 (2), 5.0 (0), 8.0 (4).
        group.remove(3);
        assert_eq!(
            group.largest_fitting(bound, 8, &any, &mut false),
            Some(head(3.0, 2))
        );
        group.remove(2);
        assert_eq!(
            group.largest_fitting(bound, 8, &any, &mut false),
            Some(head(3.0, 3))
        );
        let odd = |h: &Head| h.chain % 2 == 1;
        assert_eq!(
            group.largest_fitting(bound, 8, &odd, &mut false),
            Some(head(3.0, 3))
        );
        let none = |_: &Head| false;
        assert_eq!(group.largest_fitting(0.5, 8, &any, &mut false), None);
        assert_eq!(group.largest_fitting(bound, 8, &none, &mut false), None);
    }

    #[test]
    fn the_scan_stops_after_its_limit_of_present_heads() {
        let mut group = group();
        group.remove(3);
        let cheap = |h: &Head| h.cost < 2.0;
        let bound = f64::INFINITY;
        // Present from the top: 8.0, 3.0, 3.0, 1.0.
        let mut capped = false;
        assert_eq!(group.largest_fitting(bound, 3, &cheap, &mut capped), None);
        assert!(capped, "a head was left under the limit");
        let mut capped = false;
        assert_eq!(
            group.largest_fitting(bound, 4, &cheap, &mut capped),
            Some(head(1.0, 1))
        );
        assert_eq!(
            group.largest_fitting(bound, 4, &|_: &Head| false, &mut capped),
            None
        );
        assert!(!capped, "every head under the bound was looked at");
    }

    #[test]
    fn the_search_from_a_hint_counts_as_partition_point() {
        // Keys with repeats, every bound from below the first to above the last, every hint.
        let keys: Vec<u64> = [1, 3, 3, 3, 4, 7, 9, 9, 12, 20, 21, 21, 21, 30]
            .iter()
            .map(|&k| k * 10)
            .collect();
        for length in 0..=keys.len() {
            let keys = &keys[..length];
            for key in 0..320 {
                let expected = keys.partition_point(|&k| k <= key);
                for hint in 0..=length + 2 {
                    assert_eq!(
                        count_at_most(keys, key, hint),
                        expected,
                        "{keys:?}, key {key}, hint {hint}"
                    );
                }
            }
        }
    }

    #[test]
    fn heads_come_from_the_oldest_release_and_the_open_set() {
        let chains: Vec<Vec<Item>> = [2.0, 4.0, 6.0, 1.0]
            .iter()
            .map(|&cost| vec![Item { cost, tokens: 1 }])
            .collect();
        let chains: Vec<&[Item]> = chains.iter().map(Vec::as_slice).collect();
        let firsts = FirstHeads::new(&chains);
        let mut heads = Heads::new(&firsts);
        heads.start(head(2.0, 0));
        heads.start(head(4.0, 1));
        heads.seal();
        heads.start(head(6.0, 2));
        heads.seal();
        let any = |_: &Head| true;
        let bound = f64::INFINITY;
        assert_eq!(heads.largest_fresh(bound, 8, &any), Some(head(4.0, 1)));
        heads.remove(&head(4.0, 1));
        heads.remove(&head(2.0, 0));
        assert_eq!(heads.largest_fresh(bound, 8, &any), Some(head(6.0, 2)));
        heads.open(head(1.0, 0));
        assert_eq!(heads.smallest(), Some(head(1.0, 0)));
        heads.remove(&head(1.0, 0));
        heads.remove(&head(6.0, 2));
        assert!(heads.is_empty());
    }
}
