//! `wlb`: WLB-LLM's workload-aware variable-length packing with outlier delay.
//!
//! Source: Wang et al., "WLB-LLM: Workload-Balanced 4D Parallelism for Large Language Model
//! Training", OSDI'25 (arXiv 2503.17924), §4.1 and Algorithm 1 (the authors released no code).
//! Per training step, with `N` micro-batches and a per-micro-batch token limit `S_max`:
//!
//! 1. documents longer than the outlier thresholds go to a multi-level outlier queue (the level
//!    of the largest threshold they exceed) instead of this step;
//! 2. a level that holds at least `N` documents releases `N` of them into this step, so that
//!    every micro-batch can get one;
//! 3. the step's documents (those carried over from the previous step, the new ones and the
//!    released outliers) are taken longest first; each goes to the micro-batch of least
//!    workload if it fits under `S_max`, else to the micro-batch of fewest tokens if it fits
//!    there, else it is delayed to the next step.
//!
//! The workload `W(d) = W_attn(d) + W_linear(d)` is the model FLOPs of the document, forward and
//! backward, from the machine model (WLB-LLM profiles kernel latencies; FLOPs keep the same
//! quadratic/linear shape, and do not depend on the recomputation mode, so every candidate
//! configuration packs alike).
//!
//! Steps 1–2 and the delays of step 3 change *which* samples a step trains on, so they run
//! before the step's IR exists: [`OutlierDelay::admit`] takes the drawn global batch and
//! returns the samples of this step, keeping the queues and the delayed samples for the next
//! call (the `wlb` strategy threads one `OutlierDelay` through a run; nothing is dropped — what
//! is still queued at the end of a run is reported as the backlog). The `pack-symmetric` policy
//! `wlb` then runs step 3 on the admitted samples ([`fill`]); since a delayed sample never
//! changed a micro-batch, the admitted ones land exactly where the admission put them.
//!
//! Deviations: the paper keeps the carried-over documents ahead of the new ones; here all of a
//! step's documents are sorted together, longest first (carried documents are long ones, so the
//! order barely moves), which lets the pass reproduce the admission from the IR alone. Released
//! outliers leave their level oldest first. The thresholds are not given in the paper; the
//! default levels are `S_max / 4` and `S_max / 2`. The `N` micro-batches are the global batch's
//! and are dealt round-robin to the DP replicas.

use std::collections::{BTreeSet, VecDeque};

use slimpack_ir::batch::{Batch, Sample};
use slimpack_machine::cost::CostModel;

/// WLB-LLM's workload of one document: its model FLOPs, forward and backward.
pub fn workload(cost: &CostModel, len: u32) -> f64 {
    cost.model_flops(u64::from(len), 0)
}

/// The outcome of step 3 of Algorithm 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fill {
    /// `N` micro-batches (indices into the inputs, in placement order); some may be empty.
    pub micro_batches: Vec<Vec<usize>>,
    /// Indices that fit in no micro-batch, in the order they were tried.
    pub delayed: Vec<usize>,
}

/// Step 3 of Algorithm 1: `lengths` (with their `workloads`) into `count` micro-batches of at
/// most `cap` tokens, longest first (ties in input order). The micro-batch of least workload
/// and the one of fewest tokens (each the first such, as Python's `min` picks) are the roots
/// of two [`FirstMin`] trees, so a fill is O(n log count), not O(n count).
pub fn fill(lengths: &[u32], workloads: &[f64], count: usize, cap: u32) -> Fill {
    FillOrder::new(lengths, workloads).fill(count, cap)
}

/// A step's items in the order [`fill`] takes them, sorted once for fills into several counts.
pub struct FillOrder {
    /// Each item's length, index and workload, longest first, then by index (the stable
    /// order): the fill reads them in order rather than at random.
    order: Vec<(u32, usize, f64)>,
}

impl FillOrder {
    pub fn new(lengths: &[u32], workloads: &[f64]) -> FillOrder {
        debug_assert_eq!(lengths.len(), workloads.len(), "a workload per length");
        let mut order: Vec<(u32, usize, f64)> = (lengths.iter().zip(workloads).enumerate())
            .map(|(item, (&len, &work))| (len, item, work))
            .collect();
        order.sort_unstable_by_key(|&(len, item, _)| (std::cmp::Reverse(len), item));
        FillOrder { order }
    }

    /// [`fill`] into `count` micro-batches.
    pub fn fill(&self, count: usize, cap: u32) -> Fill {
        let mut delayed = Vec::new();
        let micro_batches = self.place(count, cap, |item| {
            delayed.push(item);
            true
        });
        Fill {
            micro_batches: micro_batches.expect("a fill that goes on past delays ends"),
            delayed,
        }
    }

    /// The micro-batches of [`fill`] into `count` when it delays nothing; `None` as soon as it
    /// delays an item (the rest is not filled).
    pub fn fill_all(&self, count: usize, cap: u32) -> Option<Vec<Vec<usize>>> {
        self.place(count, cap, |_| false)
    }

    /// Places the items in order; an item that fits nowhere goes to `delay`, and the fill
    /// stops (`None`) where that returns false.
    fn place(
        &self,
        count: usize,
        cap: u32,
        mut delay: impl FnMut(usize) -> bool,
    ) -> Option<Vec<Vec<usize>>> {
        let mut micro_batches = vec![Vec::new(); count];
        let mut by_load = FirstMin::new(count, 0.0f64);
        let mut by_tokens = FirstMin::new(count, 0u64);
        for &(len, item, work) in &self.order {
            let len = u64::from(len);
            let target = [by_load.first(), by_tokens.first()]
                .into_iter()
                .flatten()
                .find(|&mb| by_tokens.value(mb) + len <= u64::from(cap));
            match target {
                Some(mb) => {
                    debug_assert!(work >= 0.0, "a negative workload");
                    micro_batches[mb].push(item);
                    by_tokens.set(mb, by_tokens.value(mb) + len);
                    by_load.set(mb, by_load.value(mb) + work);
                }
                None if delay(item) => {}
                None => return None,
            }
        }
        Some(micro_batches)
    }
}

/// Values indexed `0..n` in a tournament tree whose root is the index of the first minimum (the
/// least index among equal values): a query is O(1) and a change O(log n), in one array.
/// Values must be totally ordered where they meet (workloads and token counts: no NaN).
struct FirstMin<T> {
    /// Leaves (a power of two, at least one).
    leaves: usize,
    /// Leaf `i` at `leaves + i`; every inner node holds the leaf index its subtree's first
    /// minimum is at. Padding leaves (`i >= n`) hold `usize::MAX` and never win.
    winner: Vec<usize>,
    values: Vec<T>,
}

impl<T: PartialOrd + Copy> FirstMin<T> {
    fn new(n: usize, initial: T) -> FirstMin<T> {
        let leaves = n.max(1).next_power_of_two();
        let mut winner = vec![usize::MAX; 2 * leaves];
        for (i, slot) in winner[leaves..leaves + n].iter_mut().enumerate() {
            *slot = i;
        }
        let mut tree = FirstMin {
            leaves,
            winner,
            values: vec![initial; n],
        };
        for node in (1..leaves).rev() {
            tree.winner[node] = tree.better(tree.winner[2 * node], tree.winner[2 * node + 1]);
        }
        tree
    }

    /// The first index of least value (`None` when empty).
    fn first(&self) -> Option<usize> {
        Some(self.winner[1]).filter(|&i| i != usize::MAX)
    }

    fn value(&self, index: usize) -> T {
        self.values[index]
    }

    fn set(&mut self, index: usize, value: T) {
        self.values[index] = value;
        let mut node = (self.leaves + index) / 2;
        while node >= 1 {
            self.winner[node] = self.better(self.winner[2 * node], self.winner[2 * node + 1]);
            node /= 2;
        }
    }

    /// Of two subtrees' winners, the one of lesser value; the left (lesser index) on a tie.
    fn better(&self, left: usize, right: usize) -> usize {
        if right == usize::MAX || (left != usize::MAX && self.values[left] <= self.values[right]) {
            left
        } else {
            right
        }
    }
}

/// WLB-LLM's multi-level outlier queues and the samples delayed by the last step: the state a
/// run carries from one step to the next.
#[derive(Debug, Clone, PartialEq)]
pub struct OutlierDelay {
    /// Lower bounds of the levels, ascending: a sample longer than `thresholds[i]` (and no
    /// larger threshold) waits in level `i`.
    thresholds: Vec<u32>,
    levels: Vec<VecDeque<Sample>>,
    /// Samples that fit in no micro-batch of the last step.
    carried: Vec<Sample>,
}

impl OutlierDelay {
    /// Queues with the given level thresholds (sorted and deduplicated).
    pub fn new(thresholds: &[u32]) -> OutlierDelay {
        let thresholds: Vec<u32> = thresholds
            .iter()
            .copied()
            .collect::<BTreeSet<u32>>()
            .into_iter()
            .collect();
        OutlierDelay {
            levels: vec![VecDeque::new(); thresholds.len()],
            thresholds,
            carried: Vec::new(),
        }
    }

    /// The default levels for micro-batches of `cap` tokens: `cap / 4` and `cap / 2`.
    pub fn for_cap(cap: u32) -> OutlierDelay {
        OutlierDelay::new(&[cap / 4, cap / 2])
    }

    /// Runs Algorithm 1 on a freshly drawn global batch for a step of `count` micro-batches of
    /// at most `cap` tokens; returns the samples this step trains on (carried samples first, in
    /// the order they were tried, then the new and released ones in batch order). Samples
    /// longer than `cap` are never admitted (batches are cut to the context, which is `cap`).
    pub fn admit(&mut self, batch: &Batch, cost: &CostModel, count: usize, cap: u32) -> Batch {
        let mut fresh = Vec::with_capacity(batch.samples.len());
        for &sample in &batch.samples {
            match self.thresholds.iter().rposition(|&t| sample.len > t) {
                Some(level) => self.levels[level].push_back(sample),
                None => fresh.push(sample),
            }
        }
        for level in &mut self.levels {
            if count > 0 && level.len() >= count {
                fresh.extend(level.drain(..count));
            }
        }
        let mut candidates = std::mem::take(&mut self.carried);
        candidates.extend(fresh);
        let lengths: Vec<u32> = candidates.iter().map(|s| s.len).collect();
        let workloads: Vec<f64> = lengths.iter().map(|&l| workload(cost, l)).collect();
        let delayed = fill(&lengths, &workloads, count, cap).delayed;
        let mut keep = vec![true; candidates.len()];
        for &index in &delayed {
            keep[index] = false;
            self.carried.push(candidates[index]);
        }
        let samples: Vec<Sample> = candidates
            .into_iter()
            .zip(keep)
            .filter_map(|(sample, keep)| keep.then_some(sample))
            .collect();
        admitted_batch(batch, samples)
    }

    /// Moves every queued outlier, whatever its level holds, to the samples the next step tries
    /// first: how a run ends without leaving documents behind (`slimpack bench --drain`). Then
    /// [`admit`](Self::admit) on a batch without samples trains what fits and carries the rest.
    pub fn release_all(&mut self) {
        for level in &mut self.levels {
            self.carried.extend(level.drain(..));
        }
    }

    /// The longest sample waiting for a later step (0 when none is).
    pub fn longest_waiting(&self) -> u32 {
        let waiting = self.levels.iter().flatten().chain(&self.carried);
        waiting.map(|s| s.len).max().unwrap_or(0)
    }

    /// Samples and tokens waiting for a later step (queued outliers and delayed samples).
    pub fn backlog(&self) -> (usize, u64) {
        let waiting = self.levels.iter().flatten().chain(&self.carried);
        waiting.fold((0, 0), |(n, t), s| (n + 1, t + u64::from(s.len)))
    }
}

/// The batch of one step: `samples`, with the document counts recomputed for them.
fn admitted_batch(drawn: &Batch, samples: Vec<Sample>) -> Batch {
    let documents: BTreeSet<u64> = samples.iter().map(|s| s.doc).collect();
    let cut: BTreeSet<u64> = samples
        .iter()
        .filter(|s| s.piece > 0)
        .map(|s| s.doc)
        .collect();
    Batch {
        samples,
        documents: documents.len(),
        documents_cut: cut.len(),
        documents_empty: drawn.documents_empty,
        context: drawn.context,
        source: drawn.source.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slimpack_ir::Spec;

    #[test]
    fn least_workload_first_then_fewest_tokens_then_delay() {
        // Workload = len² (attention-bound); cap 10, two micro-batches.
        let lengths = [9, 6, 4, 3, 2];
        let workloads: Vec<f64> = lengths.iter().map(|&l| f64::from(l * l)).collect();
        let fill = fill(&lengths, &workloads, 2, 10);
        // 9 -> mb0; 6 -> mb1; 4 -> mb1 (least work 36 < 81); 3: least work mb1 (52) is full
        // (10 + 3 > 10), fewest tokens mb0 (9) too: delayed; 2 -> neither fits... mb0 9+2 > 10.
        assert_eq!(fill.micro_batches, vec![vec![0], vec![1, 2]]);
        assert_eq!(fill.delayed, vec![3, 4]);
    }

    /// Step 3 as Algorithm 1 states it: a linear scan for each minimum.
    fn fill_by_scans(lengths: &[u32], workloads: &[f64], count: usize, cap: u32) -> Fill {
        fn first_min<T: PartialOrd>(values: &[T]) -> Option<usize> {
            (0..values.len()).reduce(|best, i| if values[i] < values[best] { i } else { best })
        }
        let mut order: Vec<usize> = (0..lengths.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(lengths[i]));
        let mut micro_batches = vec![Vec::new(); count];
        let (mut tokens, mut load) = (vec![0u64; count], vec![0.0f64; count]);
        let mut delayed = Vec::new();
        for item in order {
            let len = u64::from(lengths[item]);
            let target = [first_min(&load), first_min(&tokens)]
                .into_iter()
                .flatten()
                .find(|&mb| tokens[mb] + len <= u64::from(cap));
            match target {
                Some(mb) => {
                    micro_batches[mb].push(item);
                    tokens[mb] += len;
                    load[mb] += workloads[item];
                }
                None => delayed.push(item),
            }
        }
        Fill {
            micro_batches,
            delayed,
        }
    }

    proptest::proptest! {
        #[test]
        fn the_trees_pick_what_the_scans_pick(
            lengths in proptest::collection::vec(1u32..64, 0..200),
            count in 0usize..40,
            cap in 32u32..256,
            quadratic in proptest::bool::ANY,
        ) {
            // Equal workloads (linear) produce ties the index must break.
            let workloads: Vec<f64> = lengths
                .iter()
                .map(|&l| if quadratic { f64::from(l * l) } else { f64::from(l) })
                .collect();
            let scans = fill_by_scans(&lengths, &workloads, count, cap);
            proptest::prop_assert_eq!(fill(&lengths, &workloads, count, cap), scans.clone());
            // The early-stopping fill the count search uses: the same micro-batches, or none.
            proptest::prop_assert_eq!(
                FillOrder::new(&lengths, &workloads).fill_all(count, cap),
                scans.delayed.is_empty().then_some(scans.micro_batches)
            );
        }
    }

    fn sample(doc: u64, len: u32) -> Sample {
        Sample { len, doc, piece: 0 }
    }

    fn batch(samples: Vec<Sample>) -> Batch {
        Batch {
            documents: samples.len(),
            samples,
            documents_cut: 0,
            documents_empty: 0,
            context: Some(100),
            source: "test".into(),
        }
    }

    #[test]
    fn outliers_wait_until_every_micro_batch_can_take_one() {
        let spec = Spec::from_presets("tiny", "cpu", "tp=1,pp=1,dp=2").unwrap();
        let cost = CostModel::new(&spec);
        let mut delay = OutlierDelay::new(&[50]);
        // Step 1: one outlier (60) for two micro-batches: it waits.
        let step = delay.admit(&batch(vec![sample(0, 60), sample(1, 10)]), &cost, 2, 100);
        assert_eq!(step.samples, vec![sample(1, 10)]);
        assert_eq!(delay.backlog(), (1, 60));
        // Step 2: a second outlier: both are released, one per micro-batch.
        let step = delay.admit(&batch(vec![sample(2, 70), sample(3, 5)]), &cost, 2, 100);
        let docs: Vec<u64> = step.samples.iter().map(|s| s.doc).collect();
        assert_eq!(docs, vec![3, 0, 2]);
        assert_eq!(delay.backlog(), (0, 0));
        assert_eq!(step.documents, 3);
    }

    #[test]
    fn samples_that_fit_nowhere_are_carried_to_the_next_step() {
        let spec = Spec::from_presets("tiny", "cpu", "tp=1,pp=1,dp=1").unwrap();
        let cost = CostModel::new(&spec);
        let mut delay = OutlierDelay::new(&[]);
        let step = delay.admit(&batch(vec![sample(0, 80), sample(1, 30)]), &cost, 1, 100);
        assert_eq!(step.samples, vec![sample(0, 80)]);
        let step = delay.admit(&batch(vec![sample(2, 10)]), &cost, 1, 100);
        assert_eq!(step.samples, vec![sample(1, 30), sample(2, 10)]);
        assert_eq!(delay.backlog(), (0, 0));
    }

    #[test]
    fn release_all_trains_a_queue_that_would_never_fill() {
        let spec = Spec::from_presets("tiny", "cpu", "tp=1,pp=1,dp=2").unwrap();
        let cost = CostModel::new(&spec);
        let mut delay = OutlierDelay::new(&[50]);
        // One outlier for two micro-batches waits, and no later outlier comes to release it.
        delay.admit(&batch(vec![sample(0, 60), sample(1, 10)]), &cost, 2, 100);
        let step = delay.admit(&batch(Vec::new()), &cost, 2, 100);
        assert!(step.samples.is_empty());
        assert_eq!(delay.backlog(), (1, 60));
        delay.release_all();
        let step = delay.admit(&batch(Vec::new()), &cost, 2, 100);
        assert_eq!(step.samples, vec![sample(0, 60)]);
        assert_eq!(delay.backlog(), (0, 0));
    }
}
