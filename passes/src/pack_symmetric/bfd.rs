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
//! `map_kwargs={"batch_size": N}` for the same). The segment tree over free space becomes an
//! ordered map from free space to the FIFO of bins with that space, which answers the same
//! query ("smallest free space >= length") with the same result.

use std::collections::{BTreeMap, VecDeque};

use super::Oversize;

/// Packs `lengths` best-fit decreasing into bins of `cap` tokens. Returns the bins (indices
/// into `lengths`, in insertion order), in the order they were opened.
pub fn pack(lengths: &[u32], cap: u32) -> Result<Vec<Vec<usize>>, Oversize> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(lengths[i]));
    let mut bins: Vec<Vec<usize>> = Vec::new();
    // Free space -> bins with exactly that much free space, oldest first. Full bins are dropped.
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
                let bin = queue
                    .pop_front()
                    .expect("queues in the map are never empty");
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
        let left = space - len;
        if left > 0 {
            by_space.entry(left).or_default().push_back(bin);
        }
    }
    Ok(bins)
}

#[cfg(test)]
mod tests {
    use super::*;

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
