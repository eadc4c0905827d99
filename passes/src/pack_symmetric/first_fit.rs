//! `first-fit`: Axolotl's multipack packing — first fit in sampler order, no sort.
//!
//! Source: axolotl-ai-cloud/axolotl, `src/axolotl/utils/samplers/multipack.py`, `pack_group`
//! (called by `pack_parallel` from `MultipackBatchSampler.generate_batches`). Every sequence, in
//! the order the sampler yields it, goes to the first bin that has room for it and holds fewer
//! than `bin_size` sequences (`sample_packing_bin_size`, 200 by default); otherwise it opens a new
//! bin. The function's docstring says "first-fit decreasing", but the code does not sort.
//!
//! Deviations: Axolotl packs in groups of `sample_packing_group_size` (100,000) sequences, in
//! parallel processes; a global batch is packed here as one group (the same for batches of up to
//! 100,000 samples). Axolotl opens an over-full bin for a sequence longer than the capacity (its
//! data pipeline drops such sequences earlier); here that is an error.
//!
//! The search for the first fitting bin is a max segment tree over the bins' free space
//! (`O(log bins)` per sequence instead of Axolotl's linear scan), with identical results.

use super::Oversize;

/// Packs `lengths`, in order, into bins of `cap` tokens holding at most `bin_size` sequences
/// each. Returns the bins (indices into `lengths`, in insertion order), in the order they were
/// opened.
pub fn pack(lengths: &[u32], cap: u32, bin_size: usize) -> Result<Vec<Vec<usize>>, Oversize> {
    let order: Vec<usize> = (0..lengths.len()).collect();
    first_fit(lengths, &order, cap, bin_size)
}

/// First fit of the items `order` (indices into `lengths`), in that order.
pub(crate) fn first_fit(
    lengths: &[u32],
    order: &[usize],
    cap: u32,
    bin_size: usize,
) -> Result<Vec<Vec<usize>>, Oversize> {
    let mut free = FreeSpace::new(order.len());
    let mut bins: Vec<Vec<usize>> = Vec::new();
    let mut room: Vec<u32> = Vec::new();
    for &item in order {
        let len = lengths[item];
        if len > cap {
            return Err(Oversize {
                index: item,
                len,
                cap,
            });
        }
        let bin = match free.first_at_least(len) {
            Some(bin) => bin,
            None => {
                bins.push(Vec::new());
                room.push(cap);
                bins.len() - 1
            }
        };
        bins[bin].push(item);
        room[bin] -= len;
        let usable = if bins[bin].len() < bin_size {
            room[bin]
        } else {
            0
        };
        free.set(bin, usable);
    }
    Ok(bins)
}

/// Free tokens of each bin in a max segment tree: the leftmost bin with at least `n` free
/// tokens is found by descending from the root. Bins that do not exist yet have 0.
struct FreeSpace {
    leaves: usize,
    max: Vec<u32>,
}

impl FreeSpace {
    /// Room for `bins` bins (a first fit of n items never opens more than n).
    fn new(bins: usize) -> FreeSpace {
        let leaves = bins.max(1).next_power_of_two();
        FreeSpace {
            leaves,
            max: vec![0; 2 * leaves],
        }
    }

    fn first_at_least(&self, need: u32) -> Option<usize> {
        if self.max[1] < need {
            return None;
        }
        let mut node = 1;
        while node < self.leaves {
            node = if self.max[2 * node] >= need {
                2 * node
            } else {
                2 * node + 1
            };
        }
        Some(node - self.leaves)
    }

    fn set(&mut self, bin: usize, free: u32) {
        let mut node = bin + self.leaves;
        self.max[node] = free;
        while node > 1 {
            node /= 2;
            self.max[node] = self.max[2 * node].max(self.max[2 * node + 1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Axolotl's linear scan, as written in `pack_group`.
    fn reference(lengths: &[u32], cap: u32, bin_size: usize) -> Vec<Vec<usize>> {
        let mut bins: Vec<(u32, Vec<usize>)> = Vec::new();
        for (index, &len) in lengths.iter().enumerate() {
            match bins
                .iter_mut()
                .find(|(room, items)| *room >= len && items.len() < bin_size)
            {
                Some((room, items)) => {
                    *room -= len;
                    items.push(index);
                }
                None => bins.push((cap - len, vec![index])),
            }
        }
        bins.into_iter().map(|(_, items)| items).collect()
    }

    #[test]
    fn matches_the_linear_scan() {
        let mut state = 12345u64;
        let lengths: Vec<u32> = (0..2000)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                1 + ((state >> 33) % 900) as u32
            })
            .collect();
        for bin_size in [3, 200] {
            assert_eq!(
                pack(&lengths, 1000, bin_size).unwrap(),
                reference(&lengths, 1000, bin_size)
            );
        }
    }

    #[test]
    fn keeps_sampler_order_and_caps_sequences_per_bin() {
        assert_eq!(
            pack(&[6, 5, 4, 1], 10, 200).unwrap(),
            vec![vec![0, 2], vec![1, 3]]
        );
        assert_eq!(pack(&[1, 1, 1], 10, 2).unwrap(), vec![vec![0, 1], vec![2]]);
        assert_eq!(
            pack(&[3, 11], 10, 2).unwrap_err(),
            Oversize {
                index: 1,
                len: 11,
                cap: 10
            }
        );
    }
}
