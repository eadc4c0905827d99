//! [`CpShard`]: which tokens of a slice one member of a context-parallel group holds.
//!
//! The one definition of the CP split, read by the CPU runtime (which runs it) and by the
//! schedule JSON (which states it for trainers): a slice of `len` tokens is cut into `2k` chunks
//! at `start + ⌊j·len / 2k⌋` and member `i` of `k` takes chunks `i` and `2k − 1 − i`
//! (Megatron-LM's load-balanced causal split, without padding the slice).

use std::ops::Range;

/// Worker `rank` of a context-parallel group of `size` workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CpShard {
    pub rank: usize,
    pub size: usize,
}

impl CpShard {
    /// The single worker of a group of one: it holds every token.
    pub const WHOLE: CpShard = CpShard { rank: 0, size: 1 };

    /// Worker `rank` of `size`; `None` unless `rank < size`.
    pub fn new(rank: usize, size: usize) -> Option<CpShard> {
        (rank < size).then_some(CpShard { rank, size })
    }

    /// The two runs of sample positions this worker holds of the slice `[start, start + len)`:
    /// chunks `rank` and `2·size − 1 − rank` of `2·size` (possibly empty; adjacent for the
    /// middle workers, the whole slice for a group of one).
    pub fn runs(&self, start: usize, len: usize) -> [Range<usize>; 2] {
        let chunks = 2 * self.size;
        let bound = |j: usize| start + j * len / chunks;
        let (first, second) = (self.rank, chunks - 1 - self.rank);
        [
            bound(first)..bound(first + 1),
            bound(second)..bound(second + 1),
        ]
    }

    /// Tokens of the slice this worker holds.
    pub fn len_of(&self, start: usize, len: usize) -> usize {
        self.runs(start, len).iter().map(|r| r.len()).sum()
    }

    /// Sample positions of the slice this worker holds, ascending.
    pub fn positions(&self, start: usize, len: usize) -> impl Iterator<Item = usize> {
        let [first, second] = self.runs(start, len);
        first.chain(second)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_partition_a_slice_and_balance_tokens_and_causal_pairs() {
        for size in 1..=4 {
            for (start, len) in [(0, 1), (0, 7), (5, 64), (100, 333)] {
                let mut seen = Vec::new();
                let mut pairs = Vec::new();
                for rank in 0..size {
                    let shard = CpShard::new(rank, size).unwrap();
                    let positions: Vec<usize> = shard.positions(start, len).collect();
                    assert!(positions.windows(2).all(|w| w[0] < w[1]));
                    assert_eq!(positions.len(), shard.len_of(start, len));
                    pairs.push(positions.iter().map(|p| p + 1).sum::<usize>());
                    seen.extend(positions);
                }
                seen.sort_unstable();
                assert_eq!(seen, (start..start + len).collect::<Vec<_>>());
                if len >= 64 {
                    let (min, max) = (pairs.iter().min().unwrap(), pairs.iter().max().unwrap());
                    assert!(
                        (*max as f64) / (*min as f64) < 1.05,
                        "{size} workers, slice {start}+{len}: pairs {pairs:?}"
                    );
                }
            }
        }
        assert_eq!(CpShard::WHOLE.runs(3, 4), [3..5, 5..7]);
        assert_eq!(CpShard::new(2, 2), None);
    }
}
