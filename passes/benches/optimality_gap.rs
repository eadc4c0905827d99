//! Optimality gap of the MicroPack heuristic against the exact MILP on small random instances.
//!
//! `cargo bench -p slimpack-passes --features milp --bench optimality_gap` prints, per instance
//! family, the mean and worst gap `heuristic / optimum - 1` of the largest pack cost (the
//! quantity the heuristic balances), with the costs of real slices: per-layer forward FLOPs of
//! llama-7b slices at their offsets, from lognormal sample lengths cut into slices.

use slimpack_ir::step::Direction;
use slimpack_ir::Spec;
use slimpack_machine::cost::CostModel;
use slimpack_passes::micropack::{partition, Chains, Item};
use slimpack_passes::milp::optimal_max_pack_cost;

/// A small deterministic generator (SplitMix64), so the instances are the same on every run.
struct SplitMix(u64);
impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn instance(
    rng: &mut SplitMix,
    cost: &CostModel,
    samples: usize,
    slice: u32,
    direction: Direction,
) -> Vec<Vec<Item>> {
    (0..samples)
        .map(|_| {
            // Lognormal lengths around 2K tokens with a heavy tail, at most 4 slices.
            let normal = (-2.0 * rng.unit().max(1e-12).ln()).sqrt()
                * (std::f64::consts::TAU * rng.unit()).cos();
            let len = ((2048.0 * (1.2 * normal).exp()) as u32).clamp(64, 4 * slice);
            let mut items = Vec::new();
            let mut start = 0;
            while start < len {
                let l = slice.min(len - start);
                items.push(Item {
                    cost: cost
                        .slice_flops(u64::from(l), u64::from(start), direction)
                        .total(),
                    tokens: l,
                });
                start += l;
            }
            if direction == Direction::Backward {
                items.reverse();
            }
            items
        })
        .collect()
}

fn main() {
    let spec = Spec::from_presets("llama-7b", "h100-sxm", "tp=8,pp=1,dp=1").expect("preset");
    let cost = CostModel::new(&spec);
    println!(
        "{:<34} {:>9} {:>11} {:>11}",
        "family", "instances", "mean gap %", "worst gap %"
    );
    for (samples, packs, slice) in [
        (4usize, 2usize, 2048u32),
        (6, 3, 2048),
        (8, 3, 4096),
        (10, 4, 4096),
    ] {
        for direction in [Direction::Forward, Direction::Backward] {
            let mut rng = SplitMix(samples as u64 * 1000 + packs as u64);
            let mut gaps = Vec::new();
            for _ in 0..10 {
                let chains = instance(&mut rng, &cost, samples, slice, direction);
                let release = vec![0; chains.len()];
                let cap = u32::MAX / 2;
                // The rule the packing passes use in each direction.
                let rule = match direction {
                    Direction::Forward => Chains::Contiguous,
                    Direction::Backward => Chains::Free,
                };
                let heuristic = partition(&chains, &release, packs, cap, rule, None);
                let worst = heuristic
                    .iter()
                    .map(|p| p.iter().map(|&(c, i)| chains[c][i].cost).sum::<f64>())
                    .fold(0.0, f64::max);
                let Some(optimum) = optimal_max_pack_cost(&chains, &release, heuristic.len(), cap)
                else {
                    continue;
                };
                gaps.push(worst / optimum - 1.0);
            }
            let mean = gaps.iter().sum::<f64>() / gaps.len().max(1) as f64;
            let worst = gaps.iter().copied().fold(0.0, f64::max);
            let family = format!(
                "{samples} samples, {packs} packs, {} {}",
                slice,
                if direction == Direction::Forward {
                    "fwd"
                } else {
                    "bwd"
                }
            );
            println!(
                "{family:<34} {:>9} {:>11.2} {:>11.2}",
                gaps.len(),
                100.0 * mean,
                100.0 * worst
            );
        }
    }
}
