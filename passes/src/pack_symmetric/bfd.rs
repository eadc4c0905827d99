//! `bfd`: TRL's best-fit decreasing, `pack_dataset(dataset, seq_length, strategy="bfd")`.
//!
//! Source: huggingface/trl, `trl/data_utils.py`, `_pack_bfd` with its `_SegmentTree` (after
//! "Fewer Truncations Improve Language Modeling", Ding et al. 2024). Sequences are sorted by
//! decreasing length (a stable sort, so ties keep input order); each goes to the open bin with
//! the *least* free space that still fits it, else to a new bin. Bins with the same free space
//! are used first-in, first-out (`space_to_bin[space].popleft()`); a bin left with no free space
//! is never offered again.
//!
//! Deviations: TRL's `"bfd"` truncates a sequence longer than `seq_length` (and `"bfd_split"`
//! splits it); here batches are already cut to the context, and a longer sample is an error.
//! TRL packs each `datasets.map` batch (1,000 rows by default) on its own; here the whole global
//! batch is one packing problem (the bench packs per step, TRL per map batch: set
//! `map_kwargs={"batch_size": N}` for the same). TRL's segment tree over free space answers
//! "the smallest free space >= length"; here a two-level bitmap over the spaces `0..=cap` does (a
//! bit per space, a summary bit per 64; the caps of real contexts, up to 2^20 tokens, make at most
//! 257 summary words), or an ordered set for larger caps. Each space's bins form a FIFO list
//! threaded through one array, so a step of a million samples packs without an allocation per
//! bin or per space. The tests check the bins against TRL's algorithm on an ordered map.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use super::Oversize;

/// Packs `lengths` best-fit decreasing into bins of `cap` tokens. Returns the bins (indices
/// into `lengths`, in insertion order), in the order they were opened.
pub fn pack(lengths: &[u32], cap: u32) -> Result<Vec<Vec<usize>>, Oversize> {
    // The first sample of the largest length is the first the sorted walk would refuse.
    if let Some((index, &len)) = (lengths.iter().enumerate())
        .rev()
        .max_by_key(|&(_, &len)| len)
        .filter(|&(_, &len)| len > cap)
    {
        return Err(Oversize { index, len, cap });
    }
    // Longest first, ties in input order: one sort of packed keys.
    let mut order: Vec<u64> = (lengths.iter().enumerate())
        .map(|(index, &len)| (u64::from(u32::MAX - len) << 32) | index as u64)
        .collect();
    order.sort_unstable();
    let mut bins: Vec<Vec<usize>> = Vec::new();
    let mut spaces = FreeSpaces::new(cap);
    for key in order {
        let item = (key & u64::from(u32::MAX)) as usize;
        let len = lengths[item];
        let (bin, space) = match spaces.take_at_least(len) {
            Some(found) => found,
            None => {
                bins.push(Vec::new());
                (bins.len() - 1, cap)
            }
        };
        bins[bin].push(item);
        if space > len {
            spaces.put(space - len, bin);
        }
    }
    Ok(bins)
}

/// The open bins by free space: FIFO lists per space, and the set of spaces that have one.
struct FreeSpaces {
    /// Per space with bins: its list's first and last bin.
    lists: FxHashMap<u32, (u32, u32)>,
    /// Per bin: the next bin of its list (`u32::MAX`: the last).
    next: Vec<u32>,
    set: SpaceSet,
}

impl FreeSpaces {
    fn new(cap: u32) -> FreeSpaces {
        FreeSpaces {
            lists: FxHashMap::default(),
            next: Vec::new(),
            set: SpaceSet::new(cap),
        }
    }

    /// Appends `bin` to the list of bins with `space` free.
    fn put(&mut self, space: u32, bin: usize) {
        let bin = bin as u32;
        if self.next.len() <= bin as usize {
            self.next.resize(bin as usize + 1, u32::MAX);
        }
        self.next[bin as usize] = u32::MAX;
        match self.lists.get_mut(&space) {
            Some((_, last)) => {
                self.next[*last as usize] = bin;
                *last = bin;
            }
            None => {
                self.lists.insert(space, (bin, bin));
                self.set.insert(space);
            }
        }
    }

    /// Takes the oldest bin of the least free space `>= len`, with that space.
    fn take_at_least(&mut self, len: u32) -> Option<(usize, u32)> {
        let space = self.set.at_least(len)?;
        let (first, last) = self.lists[&space];
        if first == last {
            self.lists.remove(&space);
            self.set.remove(space);
        } else {
            self.lists.insert(space, (self.next[first as usize], last));
        }
        Some((first as usize, space))
    }
}

/// Caps up to which [`SpaceSet`] is a bitmap.
const BITMAP_CAP: u32 = 1 << 20;

/// A set of spaces `0..=cap` with a successor query.
enum SpaceSet {
    /// A bit per space, and a summary bit per non-empty word.
    Bitmap {
        words: Vec<u64>,
        summary: Vec<u64>,
    },
    Ordered(BTreeSet<u32>),
}

impl SpaceSet {
    fn new(cap: u32) -> SpaceSet {
        if cap > BITMAP_CAP {
            return SpaceSet::Ordered(BTreeSet::new());
        }
        let words = cap as usize / 64 + 1;
        SpaceSet::Bitmap {
            words: vec![0; words],
            summary: vec![0; words.div_ceil(64)],
        }
    }

    fn insert(&mut self, space: u32) {
        match self {
            SpaceSet::Bitmap { words, summary } => {
                let word = space as usize / 64;
                words[word] |= 1 << (space % 64);
                summary[word / 64] |= 1 << (word % 64);
            }
            SpaceSet::Ordered(set) => {
                set.insert(space);
            }
        }
    }

    fn remove(&mut self, space: u32) {
        match self {
            SpaceSet::Bitmap { words, summary } => {
                let word = space as usize / 64;
                words[word] &= !(1 << (space % 64));
                if words[word] == 0 {
                    summary[word / 64] &= !(1 << (word % 64));
                }
            }
            SpaceSet::Ordered(set) => {
                set.remove(&space);
            }
        }
    }

    /// The least space in the set `>= len`.
    fn at_least(&self, len: u32) -> Option<u32> {
        match self {
            SpaceSet::Bitmap { words, summary } => {
                let word = len as usize / 64;
                let here = words.get(word)? & (u64::MAX << (len % 64));
                if here != 0 {
                    return Some((word * 64) as u32 + here.trailing_zeros());
                }
                // The next non-empty word after `word`, from the summary.
                let after = word + 1;
                let mut group = after / 64;
                let mut bits = summary.get(group)? & u64::MAX.checked_shl((after % 64) as u32)?;
                while bits == 0 {
                    group += 1;
                    bits = *summary.get(group)?;
                }
                let word = group * 64 + bits.trailing_zeros() as usize;
                Some((word * 64) as u32 + words[word].trailing_zeros())
            }
            SpaceSet::Ordered(set) => set.range(len..).next().copied(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, VecDeque};

    /// TRL's algorithm as written, on an ordered map from free space to a FIFO of bins.
    fn reference(lengths: &[u32], cap: u32) -> Result<Vec<Vec<usize>>, Oversize> {
        let mut order: Vec<usize> = (0..lengths.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(lengths[i]));
        let mut bins: Vec<Vec<usize>> = Vec::new();
        let mut by_space: BTreeMap<u32, VecDeque<usize>> = BTreeMap::new();
        for item in order {
            let len = lengths[item];
            if len > cap {
                return Err(Oversize {
                    index: item,
                    len,
                    cap,
                });
            }
            let (bin, space) = match by_space.range_mut(len..).next() {
                Some((&space, queue)) => {
                    let bin = queue.pop_front().unwrap();
                    if queue.is_empty() {
                        by_space.remove(&space);
                    }
                    (bin, space)
                }
                None => {
                    bins.push(Vec::new());
                    (bins.len() - 1, cap)
                }
            };
            bins[bin].push(item);
            if space > len {
                by_space.entry(space - len).or_default().push_back(bin);
            }
        }
        Ok(bins)
    }

    proptest::proptest! {
        /// The same bins as the reference, on the bitmap (small caps, spaces across many words
        /// and summary groups) and on the ordered set (caps above the bitmap's).
        #[test]
        fn the_same_bins_as_trls_algorithm(
            lengths in proptest::collection::vec(1u32..20_000, 0..300),
            cap in 1u32..20_000,
            large in proptest::bool::ANY,
            oversize in proptest::bool::weighted(0.1),
        ) {
            // Lengths up to the cap (a tenth of the cases keep longer ones: the error's index).
            let lengths: Vec<u32> = if oversize {
                lengths
            } else {
                lengths.iter().map(|&l| (l - 1) % cap + 1).collect()
            };
            let (lengths, cap) = if large {
                let scale = BITMAP_CAP / 10_000 + 1;
                (lengths.iter().map(|&l| l * scale).collect::<Vec<_>>(), cap * scale)
            } else {
                (lengths, cap)
            };
            match (pack(&lengths, cap), reference(&lengths, cap)) {
                (Ok(fast), Ok(slow)) => proptest::prop_assert_eq!(fast, slow),
                (Err(fast), Err(slow)) => {
                    proptest::prop_assert_eq!((fast.index, fast.len), (slow.index, slow.len));
                }
                (fast, slow) => proptest::prop_assert!(false, "{fast:?} against {slow:?}"),
            }
        }
    }

    #[test]
    fn trl_docstring_example() {
        // `pack_dataset` on [[1,2,3,4,5], [6,7], [8,9,10], [11]] with seq_length=4 and "bfd"
        // truncates the first to 4 tokens and returns rows [0], [2, 3], [1].
        assert_eq!(
            pack(&[4, 2, 3, 1], 4).unwrap(),
            vec![vec![0], vec![2, 3], vec![1]]
        );
    }

    #[test]
    fn best_fit_prefers_the_tightest_bin() {
        // 7 opens a bin with 3 free, the two 4s share one with 2 free; first fit would put the
        // 1 in the first bin, best fit puts it where it leaves the least room.
        assert_eq!(
            pack(&[7, 4, 4, 1], 10).unwrap(),
            vec![vec![0], vec![1, 2, 3]]
        );
        // Equal free space: the bin that got it first is used first.
        assert_eq!(
            pack(&[6, 6, 4, 4], 10).unwrap(),
            vec![vec![0, 2], vec![1, 3]]
        );
    }
}
