//! The seeded permutation that orders documents when a global batch is drawn.
//!
//! A Fisher–Yates shuffle driven by ChaCha8 seeded with the seed, with an unbiased bounded draw
//! (Lemire's multiply-and-reject) written here rather than taken from `rand`'s range sampling:
//! the permutation then depends only on the ChaCha8 output stream, which is fixed by its
//! specification, so the same seed orders documents identically across runs, machines and
//! `rand` releases.

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A permutation of `0..count` determined by `seed`.
pub(super) fn permutation(count: usize, seed: u64) -> Vec<usize> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut order: Vec<usize> = (0..count).collect();
    for last in (1..count).rev() {
        let pick = below(&mut rng, last as u64 + 1) as usize;
        order.swap(last, pick);
    }
    order
}

/// A uniform draw from `0..bound` (`bound > 0`).
fn below(rng: &mut ChaCha8Rng, bound: u64) -> u64 {
    let mut product = u128::from(rng.next_u64()) * u128::from(bound);
    if (product as u64) < bound {
        let threshold = bound.wrapping_neg() % bound;
        while (product as u64) < threshold {
            product = u128::from(rng.next_u64()) * u128::from(bound);
        }
    }
    (product >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_a_permutation() {
        let mut order = permutation(1000, 5);
        assert_ne!(order, (0..1000).collect::<Vec<_>>());
        order.sort_unstable();
        assert_eq!(order, (0..1000).collect::<Vec<_>>());
        assert!(permutation(0, 1).is_empty());
        assert_eq!(permutation(1, 1), vec![0]);
    }

    #[test]
    fn same_seed_same_order() {
        assert_eq!(permutation(500, 9), permutation(500, 9));
        assert_ne!(permutation(500, 9), permutation(500, 10));
    }

    #[test]
    fn order_is_pinned_for_a_seed() {
        assert_eq!(permutation(8, 0), PINNED_SEED_0);
    }

    const PINNED_SEED_0: [usize; 8] = [7, 2, 1, 6, 0, 4, 3, 5];

    #[test]
    fn draws_are_in_range() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for bound in [1, 2, 3, 7, 1 << 40, u64::MAX] {
            for _ in 0..100 {
                assert!(below(&mut rng, bound) < bound);
            }
        }
    }
}
