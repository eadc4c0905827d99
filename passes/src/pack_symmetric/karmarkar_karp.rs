//! `kk`: verl's Karmarkar–Karp balancing — of the global batch over DP ranks, then of each
//! rank's samples over its micro-batches — on the workload `a·L + L²`.
//!
//! Source: volcengine/verl, `verl/utils/seqlen_balancing.py`: `karmarkar_karp` (the largest
//! differencing method for k-way partitioning), `get_seqlen_balanced_partitions`,
//! `calculate_workload` (`24576·L + L²`, "calibrated for a 7B model (hidden_size=4096)") and
//! `rearrange_micro_batches`; `verl/trainer/ppo/ray_trainer.py`, `RayPPOTrainer._balance_batch`.
//!
//! - DP: the batch is split into `dp` parts of equal sample count (`equal_size=True`) balancing
//!   the workload; each rank's samples are ordered by workload, alternating from both ends
//!   (`partition[::2] + partition[1::2][::-1]`).
//! - Micro-batches: each rank uses `min(n, ceil(tokens / max_token_len))` micro-batches, the
//!   maximum over ranks (`same_micro_num_in_dp`), partitions its samples over them by workload
//!   (`equal_size=False`), sorts them by workload and puts the small ones at both ends
//!   (`[::2][::-1] + [1::2]`) to shorten pipeline warm-up and cool-down.
//!
//! The differencing method is reproduced exactly: the same initial states, the same merge, the
//! same tie-breaks (a set orders by sum, then item count, then its (index, value) list; a state
//! by spread, then its largest set). That order is total, so the result does not depend on the
//! heap implementation.
//!
//! Deviations: `a` comes from the model instead of the constant 24576 ([`workload_coefficient`]);
//! verl requires the batch size to be a multiple of `dp` for the DP split, a token-budgeted batch
//! need not be, and then the split balances the workload without equal counts
//! (`equal_size=False`); a rank with fewer samples than the common micro-batch count uses one per
//! sample (verl asserts). `max_token_len` is not a hard cap in verl (the partition balances
//! workload, not tokens), so the packs carry no cap.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use slimpack_machine::cost::CostModel;

/// verl's constant `a`: `6 · hidden` for hidden 4096 (`calculate_workload`).
pub const VERL_COEFFICIENT: u64 = 24_576;

/// verl's workload of a sequence of `len` tokens: `a·len + len²`.
pub fn workload(len: u32, a: u64) -> u128 {
    let len = u128::from(len);
    u128::from(a) * len + len * len
}

/// `a` for this model: the workload `a·L + L²` is then proportional to the forward FLOPs of a
/// whole sample, `layers·(lin·L + att·L(L+1)/2) + head·L` with `lin` the GEMM FLOPs per token
/// per layer, `att` the attention FLOPs per causal pair per layer and `head` the output
/// projection's FLOPs per token, so `a = 2·(layers·lin + head) / (layers·att)` (dropping the
/// `+L` of the causal pair count). verl's 24576 is `6·hidden` for hidden 4096: Megatron's
/// `24·s·h² + 4·s²·h` per layer, which counts attention over the full `s × s` square; counting
/// the causal half that FlashAttention computes doubles `a`. For llama-7b (SwiGLU 11008, the
/// output projection included) this gives 50,408; for llama-13b 62,752.
pub fn workload_coefficient(cost: &CostModel) -> u64 {
    let flops = cost.flop_model();
    let layers = f64::from(cost.spec().model.layers);
    let linear = layers * flops.linear_per_token() + flops.head_per_token();
    let attention = layers * flops.attention_per_pair();
    (2.0 * linear / attention).round() as u64
}

/// verl's `get_seqlen_balanced_partitions`: `k` partitions of the indices of `values`, each
/// sorted ascending, in the order of the final state (largest sum first). With `equal_size`,
/// `values.len()` must be a multiple of `k` and every partition gets the same count.
pub fn partition(values: &[u128], k: usize, equal_size: bool) -> Vec<Vec<usize>> {
    assert!(k > 0, "k-way partition with k = 0; this is a bug");
    let mut sorted: Vec<(u128, usize)> = values.iter().enumerate().map(|(i, &v)| (v, i)).collect();
    sorted.sort_unstable();
    let mut heap: BinaryHeap<State> = BinaryHeap::new();
    if equal_size {
        assert!(
            values.len() % k == 0,
            "equal-size partition of {} items into {k}; this is a bug",
            values.len()
        );
        for chunk in sorted.chunks(k) {
            heap.push(State::new(chunk, k));
        }
    } else {
        for item in &sorted {
            heap.push(State::new(std::slice::from_ref(item), k));
        }
    }
    while heap.len() > 1 {
        let mut first = heap.pop().expect("two states");
        let second = heap.pop().expect("two states");
        first.merge(second);
        heap.push(first);
    }
    let Some(last) = heap.pop() else {
        return vec![Vec::new(); k];
    };
    last.into_sets()
        .into_iter()
        .map(|set| {
            let mut indices: Vec<usize> = set.items.into_iter().map(|(i, _)| i).collect();
            indices.sort_unstable();
            indices
        })
        .collect()
}

/// The DP split of `_balance_batch`: `ranks` partitions of the batch (indices into `values`),
/// each in verl's order (by workload, alternating from both ends).
pub fn balance_ranks(values: &[u128], ranks: usize) -> Vec<Vec<usize>> {
    let equal_size = values.len() % ranks == 0 && values.len() >= ranks;
    let mut parts = partition(values, ranks, equal_size);
    for part in &mut parts {
        part.sort_by_key(|&i| (values[i], i));
        let front = part.iter().step_by(2).copied();
        let back: Vec<usize> = part.iter().skip(1).step_by(2).copied().collect();
        *part = front.chain(back.into_iter().rev()).collect();
    }
    parts
}

/// The micro-batches of `rearrange_micro_batches`: `count` partitions of `values` (at most one
/// per item), ordered small, ..., large, ..., small.
pub fn micro_batches(values: &[u128], count: usize) -> Vec<Vec<usize>> {
    let count = count.min(values.len());
    if count == 0 {
        return Vec::new();
    }
    let mut parts: Vec<Vec<usize>> = partition(values, count, false)
        .into_iter()
        .filter(|part| !part.is_empty())
        .collect();
    let total = |part: &Vec<usize>| part.iter().map(|&i| values[i]).sum::<u128>();
    parts.sort_by(|a, b| (total(b), b[0]).cmp(&(total(a), a[0])));
    let evens: Vec<Vec<usize>> = parts.iter().step_by(2).cloned().collect();
    let odds = parts.iter().skip(1).step_by(2).cloned();
    evens.into_iter().rev().chain(odds).collect()
}

/// One set of a partial partition.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Set {
    sum: u128,
    /// (index, value) in insertion order.
    items: Vec<(usize, u128)>,
}

impl Ord for Set {
    /// verl's `Set.__lt__`: by sum, then item count, then the item lists.
    fn cmp(&self, other: &Self) -> Ordering {
        self.sum
            .cmp(&other.sum)
            .then(self.items.len().cmp(&other.items.len()))
            .then_with(|| self.items.cmp(&other.items))
    }
}

impl PartialOrd for Set {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// A partial k-way partition of `k` sets in decreasing order, of which only the non-empty
/// ones are held: the others are equal (no sum, no items) and smaller than any non-empty one,
/// so they are the last `k - sets.len()` sets. A state of one item is then one set, not `k`,
/// and a merge walks the non-empty sets only (verl's states hold all `k` sets, so its
/// differencing costs `n·k` for `n` items; the result is the same).
#[derive(Debug, Clone, PartialEq, Eq)]
struct State {
    /// The non-empty sets, in decreasing order.
    sets: Vec<Set>,
    k: usize,
    /// The largest sum less the smallest (0 for an empty set), kept with the sets so that the
    /// heap compares states without reading them.
    spread: u128,
}

impl State {
    fn new(items: &[(u128, usize)], k: usize) -> State {
        let sets = items
            .iter()
            .take(k)
            .map(|&(value, index)| Set {
                sum: value,
                items: vec![(index, value)],
            })
            .collect();
        let mut state = State { sets, k, spread: 0 };
        state.sort(0);
        state
    }

    /// Python's `sorted(sets, reverse=True)`, where the first `sorted` sets already are in
    /// that order: the rest is sorted and merged into them, and the spread updated. Stable or
    /// not is the same order: the held sets are non-empty and hold distinct items, so no two
    /// compare equal.
    fn sort(&mut self, sorted: usize) {
        self.order_from(sorted);
        self.update_spread();
    }

    /// Sorts the sets from `sorted` on and merges them into the first `sorted`, which are in
    /// order already.
    fn order_from(&mut self, sorted: usize) {
        if sorted < self.sets.len() {
            self.sets[sorted..].sort_unstable_by(|a, b| b.cmp(a));
            merge_runs(&mut self.sets, sorted);
        }
    }

    fn update_spread(&mut self) {
        let smallest = match self.sets.len() == self.k {
            true => self.sets[self.k - 1].sum,
            false => 0,
        };
        self.spread = self.sets[0].sum - smallest;
    }

    /// Largest set with the other's smallest, and so on: set `j` takes the other's set
    /// `k - 1 - j`; where both are empty the result is too.
    fn merge(&mut self, other: State) {
        let k = self.k;
        let held = self.sets.len();
        let mut theirs = other.sets;
        let their_count = theirs.len();
        // Set `j` of the result is this state's set `j` (if held) with the other's set
        // `k - 1 - j` (if held), taken in place: the held sets from `k - their_count` on. The
        // sets before them keep their order, and so do the other's sets no held set took
        // (its first `min(their_count, k - held)`, which make the sets where this one is
        // empty): three runs in decreasing order once the joined sets are sorted.
        let unchanged = held.min(k - their_count);
        for (j, set) in self.sets.iter_mut().enumerate().skip(unchanged) {
            let other = &mut theirs[k - 1 - j];
            set.sum += other.sum;
            set.items.append(&mut other.items);
        }
        let free = their_count.min(k - held);
        theirs.truncate(free);
        self.order_from(unchanged);
        let joined = self.sets.len();
        self.sets.extend(theirs);
        merge_runs(&mut self.sets, joined);
        self.update_spread();
    }

    /// The `k` sets in decreasing order, the empty ones included.
    fn into_sets(self) -> Vec<Set> {
        let mut sets = self.sets;
        sets.resize(self.k, Set::default());
        sets
    }
}

/// Merges the two runs `sets[..mid]` and `sets[mid..]`, each in decreasing order, into one.
/// A short run (a state of a few sets, or the few sets a merge changed, beside up to `k`
/// others) moves in by binary search and rotation, without a buffer: the sets are never equal
/// (see [`State::sort`]), so the position is exact.
fn merge_runs(sets: &mut Vec<Set>, mid: usize) {
    const SHORT: usize = 8;
    let len = sets.len();
    if mid == 0 || mid == len || sets[mid - 1] > sets[mid] {
        return;
    }
    if len - mid <= SHORT {
        for i in mid..len {
            let at = sets[..i].partition_point(|s| *s > sets[i]);
            sets[at..=i].rotate_right(1);
        }
    } else if mid <= SHORT {
        for i in (0..mid).rev() {
            let end = i + 1 + sets[i + 1..].partition_point(|s| *s > sets[i]);
            sets[i..end].rotate_left(1);
        }
    } else {
        let tail = sets.split_off(mid);
        let head = std::mem::replace(sets, Vec::with_capacity(len));
        let mut head = head.into_iter().peekable();
        let mut tail = tail.into_iter().peekable();
        while let (Some(a), Some(b)) = (head.peek(), tail.peek()) {
            let next = match a > b {
                true => head.next(),
                false => tail.next(),
            };
            sets.extend(next);
        }
        sets.extend(head);
        sets.extend(tail);
    }
}

impl Ord for State {
    /// The heap pops the largest spread first, then the state with the largest set.
    fn cmp(&self, other: &Self) -> Ordering {
        self.spread
            .cmp(&other.spread)
            .then_with(|| self.sets[0].cmp(&other.sets[0]))
    }
}

impl PartialOrd for State {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slimpack_ir::Spec;

    fn sums(values: &[u128], parts: &[Vec<usize>]) -> Vec<u128> {
        parts
            .iter()
            .map(|p| p.iter().map(|&i| values[i]).sum())
            .collect()
    }

    #[test]
    fn differencing_balances_a_textbook_instance() {
        // Karmarkar-Karp on {8, 7, 6, 5, 4} in two parts: 8-7, 6-5 -> 1, 1; 4-1 -> 3; 3-1 -> 2.
        let values = [8, 7, 6, 5, 4];
        let parts = partition(&values, 2, false);
        assert_eq!(sums(&values, &parts), vec![16, 14]);
        let parts = partition(&[1, 2, 3, 4, 5, 6], 3, true);
        assert!(parts.iter().all(|p| p.len() == 2));
        assert_eq!(sums(&[1, 2, 3, 4, 5, 6], &parts), vec![7, 7, 7]);
    }

    #[test]
    fn micro_batches_put_small_ones_at_both_ends() {
        let values: Vec<u128> = vec![50, 40, 30, 20, 10];
        let parts = micro_batches(&values, 5);
        let order: Vec<u128> = sums(&values, &parts);
        assert_eq!(order, vec![10, 30, 50, 40, 20]);
        assert_eq!(micro_batches(&values, 9).len(), 5);
    }

    #[test]
    fn dp_split_alternates_from_both_ends() {
        let values: Vec<u128> = (1..=8).collect();
        let parts = balance_ranks(&values, 2);
        for part in &parts {
            let w: Vec<u128> = part.iter().map(|&i| values[i]).collect();
            assert!(w[0] < w[1] && w[1] < w[2] && w[3] < w[2], "{w:?}");
        }
        assert_eq!(sums(&values, &parts), vec![18, 18]);
    }

    /// A seeded xorshift generator: `next(bound)` draws from `0..bound`.
    fn xorshift(mut state: u64) -> impl FnMut(u64) -> u64 {
        move |bound| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % bound
        }
    }

    /// verl's differencing as written: every state holds all `k` sets.
    fn partition_with_every_set(values: &[u128], k: usize, equal_size: bool) -> Vec<Vec<usize>> {
        #[derive(PartialEq, Eq)]
        struct Full(Vec<Set>);
        impl Ord for Full {
            fn cmp(&self, other: &Self) -> Ordering {
                let spread = |s: &Full| s.0[0].sum - s.0[s.0.len() - 1].sum;
                spread(self)
                    .cmp(&spread(other))
                    .then_with(|| self.0[0].cmp(&other.0[0]))
            }
        }
        impl PartialOrd for Full {
            fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
                Some(self.cmp(other))
            }
        }
        let sorted_desc = |sets: &mut Vec<Set>| sets.sort_by(|a, b| b.cmp(a));
        let mut sorted: Vec<(u128, usize)> =
            values.iter().enumerate().map(|(i, &v)| (v, i)).collect();
        sorted.sort_unstable();
        let chunk = if equal_size { k } else { 1 };
        let mut heap: BinaryHeap<Full> = sorted
            .chunks(chunk)
            .map(|items| {
                let mut sets = vec![Set::default(); k];
                for (set, &(value, index)) in sets.iter_mut().zip(items) {
                    set.sum += value;
                    set.items.push((index, value));
                }
                sorted_desc(&mut sets);
                Full(sets)
            })
            .collect();
        while heap.len() > 1 {
            let mut first = heap.pop().unwrap();
            let second = heap.pop().unwrap();
            for (i, theirs) in second.0.into_iter().enumerate() {
                let mine = &mut first.0[k - 1 - i];
                mine.sum += theirs.sum;
                mine.items.extend(theirs.items);
            }
            sorted_desc(&mut first.0);
            heap.push(first);
        }
        heap.pop()
            .unwrap()
            .0
            .into_iter()
            .map(|set| {
                let mut indices: Vec<usize> = set.items.into_iter().map(|(i, _)| i).collect();
                indices.sort_unstable();
                indices
            })
            .collect()
    }

    /// Holding only the non-empty sets partitions exactly as holding all `k` does, on batches
    /// with repeated values, more parts than items, and equal-size splits.
    #[test]
    fn states_of_non_empty_sets_partition_as_verl_does() {
        let mut next = xorshift(0x2545_F491_4F6C_DD1Du64);
        for round in 0..200 {
            let n = 1 + next(60) as usize;
            let spread = [4, 1000, 1 << 20][round % 3];
            let values: Vec<u128> = (0..n).map(|_| u128::from(1 + next(spread))).collect();
            for k in [1, 2, 3, 7, n, n + 3] {
                let fast = partition(&values, k, false);
                assert_eq!(
                    fast,
                    partition_with_every_set(&values, k, false),
                    "{values:?} k={k}"
                );
                if n % k == 0 {
                    let fast = partition(&values, k, true);
                    let full = partition_with_every_set(&values, k, true);
                    assert_eq!(fast, full, "{values:?} k={k} equal");
                }
            }
        }
    }

    /// The same with many parts (up to hundreds of micro-batches per rank, as on a batch of a
    /// million documents), where a merge moves a few sets among many.
    #[test]
    fn states_of_many_parts_partition_as_verl_does() {
        let mut next = xorshift(0x9E37_79B9_7F4A_7C15u64);
        for (n, k) in [(1500, 40), (1200, 300), (700, 700), (2000, 500)] {
            let values: Vec<u128> = (0..n).map(|_| u128::from(1 + next(1 << 24))).collect();
            assert_eq!(
                partition(&values, k, false),
                partition_with_every_set(&values, k, false),
                "n={n} k={k}"
            );
            if n % k == 0 {
                assert_eq!(
                    partition(&values, k, true),
                    partition_with_every_set(&values, k, true),
                    "n={n} k={k} equal"
                );
            }
        }
    }

    /// Two runs merge into the sorted order whichever is short: each way by rotation, and
    /// by the buffer when both are long.
    #[test]
    fn runs_merge_into_decreasing_order() {
        let set = |sum: u128| Set {
            sum,
            items: vec![(sum as usize, sum)],
        };
        for (first, second) in [(1, 30), (8, 30), (30, 1), (30, 8), (9, 9), (20, 40), (0, 5)] {
            for offset in 0..3u128 {
                // Interleaved runs: the first takes every third sum from `offset`.
                let all: Vec<u128> = (0..(first + second) as u128).collect();
                let (mut a, mut b): (Vec<u128>, Vec<u128>) = all
                    .iter()
                    .partition(|&&v| v % 3 == offset && v / 3 < first as u128);
                b.truncate(second);
                a.truncate(first);
                let mut sets: Vec<Set> = a
                    .iter()
                    .rev()
                    .chain(b.iter().rev())
                    .map(|&v| set(v))
                    .collect();
                let mut expected = sets.clone();
                expected.sort_by(|x, y| y.cmp(x));
                merge_runs(&mut sets, a.len());
                assert_eq!(
                    sets, expected,
                    "runs of {first} and {second}, offset {offset}"
                );
            }
        }
    }

    #[test]
    fn coefficient_from_the_model() {
        let a = |model| {
            let spec = Spec::from_presets(model, "h100-sxm", "tp=1,pp=1,dp=1").unwrap();
            workload_coefficient(&CostModel::new(&spec))
        };
        // 2 x (32 x 2 x 202.4M + 2 x 4096 x 32000) / (32 x 4 x 4096) for llama-7b.
        assert_eq!(a("llama-7b"), 50_408);
        assert_eq!(a("llama-13b"), 62_752);
    }
}
