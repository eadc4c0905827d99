//! `ffd`: first-fit decreasing into context-length bins — the packed-sequence (THD) path of the
//! Megatron stack.
//!
//! Source: NVIDIA NeMo, `nemo/utils/sequence_packing_utils.py`, `first_fit_decreasing` (used by
//! NeMo / Megatron-Bridge to build packed datasets whose rows Megatron-Core runs as THD
//! sequences with `cu_seqlens` document masks): sort the lengths in decreasing order, then put
//! each into the first bin with room for it, else open a new bin. Megatron-LM's own GPT dataset
//! concatenates documents and cuts at the sequence length instead; packing whole documents is
//! what its variable-length users run, and never cuts a document a second time.
//!
//! Deviations: none in the packing. Ties in length keep batch order (Python's `sorted` is
//! stable). The bins are the global batch's micro-batches; `mod.rs` deals them to the DP
//! replicas.

use super::first_fit::first_fit;
use super::Oversize;

/// Packs `lengths` first-fit decreasing into bins of `cap` tokens. Returns the bins (indices
/// into `lengths`, in insertion order), in the order they were opened.
pub fn pack(lengths: &[u32], cap: u32) -> Result<Vec<Vec<usize>>, Oversize> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(lengths[i]));
    first_fit(lengths, &order, cap, usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_first_then_first_fit() {
        // Sorted: 60, 40, 30, 25, 10, 5 into 64-token bins.
        let bins = pack(&[60, 10, 30, 25, 5, 40], 64).unwrap();
        assert_eq!(bins, vec![vec![0], vec![5, 1, 4], vec![2, 3]]);
    }
}
