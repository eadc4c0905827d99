//! Load balancing shared by the placement passes: sample weights from the machine model,
//! longest-processing-time-first with initial loads, and move/swap refinement.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use slimpack_ir::step::Direction;
use slimpack_ir::StepIr;
use slimpack_machine::cost::CostModel;

/// What the replicas are balanced on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Balance {
    Cost,
    Tokens,
    None,
}

/// Estimated cost of each sample: FLOPs of forward + backward (`Cost`), or tokens.
pub(crate) fn sample_weights(ir: &StepIr, cost: &CostModel, balance: Balance) -> Vec<f64> {
    ir.samples()
        .iter()
        .map(|&s| {
            let len = u64::from(ir.sample(s).len);
            match balance {
                Balance::Tokens | Balance::None => len as f64,
                Balance::Cost => {
                    cost.slice_flops(len, 0, Direction::Forward).total()
                        + cost.slice_flops(len, 0, Direction::Backward).total()
                }
            }
        })
        .collect()
}

/// Longest-processing-time-first: heaviest item to the currently lightest bin, starting from
/// the bins' `initial` loads. Returns the bin of each item. Ties break on the lower bin index,
/// so the result is deterministic.
pub(crate) fn lpt(weights: &[f64], initial: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| weights[b].total_cmp(&weights[a]).then(a.cmp(&b)));
    let mut heap: BinaryHeap<Reverse<(OrderedLoad, usize)>> = initial
        .iter()
        .enumerate()
        .map(|(b, &load)| Reverse((OrderedLoad(load), b)))
        .collect();
    let mut bin_of = vec![0; weights.len()];
    for item in order {
        let Reverse((OrderedLoad(load), bin)) = heap.pop().expect("at least one bin");
        bin_of[item] = bin;
        heap.push(Reverse((OrderedLoad(load + weights[item]), bin)));
    }
    bin_of
}

/// Improving moves or swaps at most (each one scans the items once).
const REFINE_STEPS: usize = 512;

/// Items of the heaviest and of the lightest bin paired for swaps in one step.
const SWAP_SCAN: usize = 128;

/// Moves and swaps between the heaviest and the lightest bin (bins start at `initial` loads)
/// while that lowers the heavier of the two; returns the number of improving steps.
pub(crate) fn refine(weights: &[f64], bin_of: &mut [usize], initial: &[f64]) -> usize {
    let bins = initial.len();
    let mut loads = initial.to_vec();
    for (item, &bin) in bin_of.iter().enumerate() {
        loads[bin] += weights[item];
    }
    let mut steps = 0;
    for _ in 0..REFINE_STEPS {
        let heavy = (0..bins)
            .max_by(|&a, &b| loads[a].total_cmp(&loads[b]).then(b.cmp(&a)))
            .unwrap_or(0);
        let light = (0..bins)
            .min_by(|&a, &b| loads[a].total_cmp(&loads[b]).then(a.cmp(&b)))
            .unwrap_or(0);
        let gap = loads[heavy] - loads[light];
        if gap <= 0.0 {
            break;
        }
        // Best single move or swap: the transferred weight closest to gap / 2, strictly
        // between 0 and gap (so the maximum of the pair drops).
        let mut best: Option<(f64, usize, Option<usize>)> = None;
        let consider = |delta: f64,
                        moved: usize,
                        back: Option<usize>,
                        best: &mut Option<(f64, usize, Option<usize>)>| {
            if delta > 0.0 && delta < gap {
                let score = (delta - gap / 2.0).abs();
                if best.is_none_or(|(s, _, _)| score < s) {
                    *best = Some((score, moved, back));
                }
            }
        };
        let heavy_items: Vec<usize> = (0..weights.len()).filter(|&i| bin_of[i] == heavy).collect();
        let light_items: Vec<usize> = (0..weights.len()).filter(|&i| bin_of[i] == light).collect();
        for &h in &heavy_items {
            consider(weights[h], h, None, &mut best);
        }
        for &h in heavy_items.iter().take(SWAP_SCAN) {
            for &l in light_items.iter().take(SWAP_SCAN) {
                consider(weights[h] - weights[l], h, Some(l), &mut best);
            }
        }
        let Some((_, moved, back)) = best else { break };
        bin_of[moved] = light;
        loads[heavy] -= weights[moved];
        loads[light] += weights[moved];
        if let Some(back) = back {
            bin_of[back] = heavy;
            loads[light] -= weights[back];
            loads[heavy] += weights[back];
        }
        steps += 1;
    }
    steps
}

/// f64 with a total order, for the LPT heap.
#[derive(Debug, Clone, Copy, PartialEq)]
struct OrderedLoad(f64);
impl Eq for OrderedLoad {}
impl PartialOrd for OrderedLoad {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OrderedLoad {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// max / mean of the per-bin loads (1.0 is perfect balance).
pub(crate) fn imbalance(weights: &[f64], bin_of: &[usize], bins: usize) -> f64 {
    let mut loads = vec![0.0; bins];
    for (item, &bin) in bin_of.iter().enumerate() {
        loads[bin] += weights[item];
    }
    let mean = loads.iter().sum::<f64>() / bins as f64;
    let max = loads.iter().copied().fold(0.0, f64::max);
    if mean > 0.0 {
        max / mean
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lpt_and_refinement_balance_a_known_instance() {
        // 3 bins, weights summing to 30: a perfect split exists (10/10/10).
        let weights = [7.0, 6.0, 5.0, 4.0, 3.0, 3.0, 2.0];
        let mut bin_of = lpt(&weights, &[0.0; 3]);
        refine(&weights, &mut bin_of, &[0.0; 3]);
        assert!(
            (imbalance(&weights, &bin_of, 3) - 1.0).abs() < 1e-9,
            "{bin_of:?}"
        );
    }
}
