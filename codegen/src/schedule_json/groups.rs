//! The document's rank groups ([`RankGroup`]): written as strided runs, collected into one table
//! while the devices' ops are built (each distinct group once, numbered in order of first
//! mention), expanded by readers.
//!
//! A stage's DP sync group is every `tp`-th rank from its first: one run, so the table and the
//! ops that refer to it stay linear in the devices however large dp is.

use std::collections::HashMap;
use std::hash::Hash;

use super::{RankGroup, RankRun};

impl RankRun {
    /// Its ranks in order. Only for checked runs (see `check::groups`): the last rank is then
    /// below the world size.
    pub fn ranks(&self) -> impl Iterator<Item = u64> {
        let (first, stride) = (self.first, self.stride);
        (0..self.count).map(move |i| first + i * stride)
    }

    /// Its last rank, or `None` past `u64` (a hostile run).
    pub fn last(&self) -> Option<u64> {
        self.count
            .checked_sub(1)?
            .checked_mul(self.stride)?
            .checked_add(self.first)
    }
}

impl RankGroup {
    /// The group of `ranks` in this order: each run the longest with a positive stride that
    /// starts where the previous one ended (a lone rank has stride 1).
    pub fn of_ranks(ranks: &[u64]) -> RankGroup {
        let mut runs = Vec::new();
        let mut at = 0;
        while at < ranks.len() {
            let first = ranks[at];
            let mut run = RankRun {
                first,
                stride: 1,
                count: 1,
            };
            if let Some(&next) = ranks.get(at + 1).filter(|&&next| next > first) {
                run.stride = next - first;
                run.count = 2;
                while ranks.get(at + run.count as usize) == Some(&(first + run.count * run.stride))
                {
                    run.count += 1;
                }
            }
            at += run.count as usize;
            runs.push(run);
        }
        RankGroup { runs }
    }

    /// Its ranks in member order (of a checked group: see [`RankRun::ranks`]).
    pub fn ranks(&self) -> impl Iterator<Item = u64> + '_ {
        self.runs.iter().flat_map(RankRun::ranks)
    }

    /// How many ranks it holds.
    pub fn size(&self) -> u64 {
        self.runs.iter().map(|run| run.count).sum()
    }
}

/// The groups of a document being written: each distinct group gets one index (that of its
/// first mention), and a group named by a key the builder gave before is not built again.
pub(super) struct GroupTable<K> {
    groups: Vec<RankGroup>,
    by_group: HashMap<RankGroup, u32>,
    by_key: HashMap<K, u32>,
}

impl<K: Hash + Eq> GroupTable<K> {
    pub fn new() -> Self {
        GroupTable {
            groups: Vec::new(),
            by_group: HashMap::new(),
            by_key: HashMap::new(),
        }
    }

    /// The index of the group `key` stands for; `ranks` (in member order) is called the first
    /// time `key` is seen only.
    pub fn index(&mut self, key: K, ranks: impl FnOnce() -> Vec<u64>) -> u32 {
        if let Some(&index) = self.by_key.get(&key) {
            return index;
        }
        let group = RankGroup::of_ranks(&ranks());
        let next = self.groups.len() as u32;
        let index = *self.by_group.entry(group).or_insert_with_key(|group| {
            self.groups.push(group.clone());
            next
        });
        self.by_key.insert(key, index);
        index
    }

    /// The table, in index order.
    pub fn into_groups(self) -> Vec<RankGroup> {
        self.groups
    }
}
