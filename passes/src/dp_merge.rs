//! `dp-merge{threshold=T,memory=M}`: run a dominant or memory-infeasible sample on k merged DP replicas
//! as one context-parallel group, and rebalance the rest (SlimPack's DP-Merge).
//!
//! Phase in: `assigned` (one replica per DP rank, from `assign-dp`). Phase out: unchanged.
//! A sample is *dominant* when its estimated cost exceeds `threshold` times the mean replica
//! load (no placement can then balance the replicas), and *memory-infeasible* when its
//! activations and K/V on one device exceed `memory` times what the model states leave of HBM
//! (the rest is headroom for the other packs in flight). It gets
//! `k = 2^ceil(log2(need))` replicas (cost or memory ratio, at most dp), on an aligned block of
//! k DP ranks — aligned so that a block smaller than a node stays inside a node under
//! Megatron's rank order. Blocks are chosen least-loaded first and never overlap. Each merged
//! rank carries `cost / k` of the sample; the other samples keep their placement and are then
//! moved and swapped between replicas until the loads, merged shares included, balance again.

use crate::balance::{refine, sample_weights, Balance};
use crate::error::{PassError, Result};
use crate::pass::{OptionInfo, Pass, PassContext, PassInfo, PassOptions, Statistics};
use slimpack_ir::spec::ParallelSpec;
use slimpack_ir::step::{Phase, SampleId};
use slimpack_ir::StepIr;
use slimpack_machine::cost::CostModel;

pub(crate) const INFO: PassInfo = PassInfo {
    name: "dp-merge",
    summary: "merge DP replicas into CP groups for dominant or over-long samples, rebalance",
    description: "Samples costing more than `threshold` x the mean replica load, or too big \
                  for one device's memory, run on an aligned block of 2^k DP ranks as one CP \
                  group; the remaining samples are re-placed around them. Phase assigned.",
    accepts: Phase::Assigned..=Phase::Assigned,
    produces: None,
    options: &[
        OptionInfo {
            name: "threshold",
            help: "merge a sample costing more than this fraction of the mean replica load",
            default: Some("1.0"),
        },
        OptionInfo {
            name: "memory",
            help: "merge a sample needing more than this fraction of a device's free memory",
            default: Some("0.5"),
        },
    ],
    create: |options| Ok(Box::new(DpMerge::from_options(options)?)),
};

/// The DP-Merge pass.
#[derive(Debug, Clone, Copy)]
pub struct DpMerge {
    pub threshold: f64,
    /// Largest fraction of a device's free memory (HBM less model states and workspace) one
    /// sample's activations and K/V may take; the rest is for the other packs in flight.
    pub memory: f64,
}

impl DpMerge {
    fn from_options(options: &PassOptions) -> Result<DpMerge> {
        let threshold: f64 = options
            .get("threshold", "a positive number")?
            .expect("declared with a default");
        let memory: f64 = options
            .get("memory", "a fraction in (0, 1]")?
            .expect("declared with a default");
        for (name, value, valid) in [
            (
                "threshold",
                threshold,
                threshold.is_finite() && threshold > 0.0,
            ),
            ("memory", memory, memory > 0.0 && memory <= 1.0),
        ] {
            if !valid {
                return Err(PassError::BadOption {
                    pass: INFO.name,
                    option: name.into(),
                    value: value.to_string(),
                    message: "out of range".into(),
                });
            }
        }
        Ok(DpMerge { threshold, memory })
    }
}

/// Smallest power of two >= `need`, or the largest power of two <= `limit` if that is smaller.
fn merge_degree(need: f64, limit: u32) -> u32 {
    let mut k = 1u32;
    while (k as f64) < need && k * 2 <= limit {
        k *= 2;
    }
    k
}

/// Per-device bytes one sample needs when it runs alone, on its most loaded pipeline device:
/// the model states and workspace, and on each of the device's stages (model chunks) its saved
/// activations and K/V and the dK/dV accumulators its backward fills.
fn sample_memory(cost: &CostModel, parallel: ParallelSpec, tokens: u64) -> u64 {
    let memory = cost.memory();
    (0..parallel.pp)
        .map(|device| {
            let per_chunk: u64 = parallel
                .stages_on(device)
                .map(|stage| {
                    memory.activation_bytes(tokens, stage)
                        + memory.kv_bytes(tokens, stage)
                        + memory.kv_grad_bytes(tokens, stage)
                })
                .sum();
            memory.model_state_bytes(device) + memory.workspace_bytes() + per_chunk
        })
        .max()
        .unwrap_or(0)
}

impl Pass for DpMerge {
    fn info(&self) -> &'static PassInfo {
        &INFO
    }

    fn run(&mut self, ir: &mut StepIr, cx: &PassContext) -> Result<Statistics> {
        let dp = ir.spec.parallel.dp;
        let plain: Vec<_> = ir.replicas().to_vec();
        if plain.len() != dp as usize || plain.iter().any(|&r| ir.replica(r).ranks.len() != 1) {
            return Err(PassError::Failed {
                pass: INFO.name,
                message: "expects one replica per DP rank (run assign-dp first, without static CP)"
                    .into(),
            });
        }
        let cost_model = cx.machine();
        let parallel = ir.spec.parallel;
        let weights = sample_weights(ir, cx.machine(), Balance::Cost);
        let samples: Vec<SampleId> = ir.samples().to_vec();
        let mean = weights.iter().sum::<f64>() / f64::from(dp);
        let capacity = cost_model.memory().capacity_bytes() as f64;
        // Degree each sample needs, by cost and by memory.
        let mut wanted: Vec<(u32, usize)> = Vec::new();
        for (index, &sample) in samples.iter().enumerate() {
            let tokens = u64::from(ir.sample(sample).len);
            let by_cost = if weights[index] > self.threshold * mean {
                weights[index] / mean
            } else {
                1.0
            };
            let fixed = sample_memory(cost_model, parallel, 0) as f64;
            let needed = sample_memory(cost_model, parallel, tokens) as f64 - fixed;
            let allowed = self.memory * (capacity - fixed).max(1.0);
            let by_memory = if needed > allowed {
                needed / allowed
            } else {
                1.0
            };
            let k = merge_degree(by_cost.max(by_memory), dp);
            if k > 1 {
                wanted.push((k, index));
            }
        }
        // Largest groups first, then heaviest; each on the least-loaded free aligned block.
        wanted.sort_by(|a, b| b.0.cmp(&a.0).then(weights[b.1].total_cmp(&weights[a.1])));
        let mut loads = vec![0.0; dp as usize];
        let mut taken = vec![false; dp as usize];
        let mut merged: Vec<(Vec<u32>, usize)> = Vec::new();
        let mut unmerged = 0usize;
        for (k, index) in wanted {
            let block = (0..dp / k)
                .map(|b| (b * k..(b + 1) * k).collect::<Vec<u32>>())
                .filter(|ranks| ranks.iter().all(|&r| !taken[r as usize]))
                .min_by(|a, b| {
                    let load =
                        |ranks: &Vec<u32>| ranks.iter().map(|&r| loads[r as usize]).sum::<f64>();
                    load(a).total_cmp(&load(b))
                });
            let Some(ranks) = block else {
                unmerged += 1;
                continue;
            };
            for &rank in &ranks {
                taken[rank as usize] = true;
                loads[rank as usize] += weights[index] / f64::from(k);
            }
            merged.push((ranks, index));
        }
        // Rebalance the other samples around the merged shares, starting from the current
        // placement: only the samples the refinement moves are placed again (each placement
        // edit costs the replica's degree in the graph).
        let is_merged: Vec<bool> = {
            let mut flags = vec![false; samples.len()];
            for (_, index) in &merged {
                flags[*index] = true;
            }
            flags
        };
        let rank_of = |replica| plain.iter().position(|&r| r == replica).unwrap_or(0);
        let rest: Vec<usize> = (0..samples.len()).filter(|&i| !is_merged[i]).collect();
        let rest_weights: Vec<f64> = rest.iter().map(|&i| weights[i]).collect();
        let before: Vec<usize> = rest
            .iter()
            .map(|&i| ir.replica_of_sample(samples[i]).map_or(0, rank_of))
            .collect();
        let mut bin_of = before.clone();
        if !merged.is_empty() {
            refine(&rest_weights, &mut bin_of, &loads);
        }
        for (position, &index) in rest.iter().enumerate() {
            if bin_of[position] != before[position] {
                ir.place_sample(samples[index], plain[bin_of[position]]);
            }
        }
        let groups = merged.len();
        let mut largest = 1;
        for (ranks, index) in merged {
            largest = largest.max(ranks.len());
            let group = ir.add_replica(ranks);
            ir.place_sample(samples[index], group);
        }
        let mut final_loads = loads.clone();
        for (position, &bin) in bin_of.iter().enumerate() {
            final_loads[bin] += rest_weights[position];
        }
        let mean_load = final_loads.iter().sum::<f64>() / final_loads.len() as f64;
        let max_load = final_loads.iter().copied().fold(0.0, f64::max);
        Ok(Statistics::new()
            .with("merged_samples", groups)
            .with("largest_group", largest)
            .with("unmerged_for_lack_of_ranks", unmerged)
            .with(
                "cost_imbalance",
                if mean_load > 0.0 {
                    max_load / mean_load
                } else {
                    1.0
                },
            ))
    }
}

#[cfg(test)]
mod tests {
    use super::merge_degree;

    #[test]
    fn degrees_are_powers_of_two_within_the_pool() {
        assert_eq!(merge_degree(1.0, 8), 1);
        assert_eq!(merge_degree(1.3, 8), 2);
        assert_eq!(merge_degree(3.0, 8), 4);
        assert_eq!(merge_degree(100.0, 8), 8);
        assert_eq!(merge_degree(5.0, 6), 4);
    }
}
