//! `dp-merge{threshold=T,memory=M,share=S}`: run a dominant or memory-infeasible sample on k
//! merged DP replicas as one context-parallel group, and rebalance the rest (SlimPack's
//! DP-Merge).
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
//!
//! Degrees are chosen per sample, then fitted to the pool: while the wanted groups need more
//! than `dp` ranks together, the largest wanted degree is halved (down to 2), so that one
//! sample cannot take every rank and leave the others unmerged. A sample that still finds no
//! free block joins (`share=true`) the smallest merged group of at least the ranks it needs, the
//! one with the lowest load per rank: that group then runs both samples as one CP group.

use crate::balance::{refine, sample_weights, Balance};
use crate::error::{PassError, Result};
use crate::pass::{OptionInfo, Pass, PassContext, PassInfo, PassOptions, Statistics};
use slimpack_ir::spec::ParallelSpec;
use slimpack_ir::step::{Phase, ReplicaId, SampleId};
use slimpack_ir::StepIr;
use slimpack_machine::cost::CostModel;

pub(crate) const INFO: PassInfo = PassInfo {
    name: "dp-merge",
    summary: "merge DP replicas into CP groups for dominant or over-long samples, rebalance",
    description: "Samples costing more than `threshold` x the mean replica load, or too big \
                  for one device's memory, run on an aligned block of 2^k DP ranks as one CP \
                  group (degrees halved to fit the pool; with share, a sample left without a \
                  block joins a group); the remaining samples are re-placed around them. \
                  Phase assigned.",
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
        OptionInfo {
            name: "share",
            help: "a sample that finds no free block joins the lightest group large enough",
            default: Some("true"),
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
    /// Whether a sample that finds no free block of ranks joins an existing group (of at least
    /// the ranks it needs) rather than staying unmerged.
    pub share: bool,
}

impl DpMerge {
    fn from_options(options: &PassOptions) -> Result<DpMerge> {
        let threshold: f64 = options
            .get("threshold", "a positive number")?
            .expect("declared with a default");
        let memory: f64 = options
            .get("memory", "a fraction in (0, 1]")?
            .expect("declared with a default");
        let share: bool = options
            .get("share", "true or false")?
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
        Ok(DpMerge {
            threshold,
            memory,
            share,
        })
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

/// Fits wanted group degrees to a pool of `pool` ranks: while they need more ranks together,
/// the largest degree above 2 is halved (of equal degrees, the lightest sample's, by
/// `weights`). Degrees of 2 are kept even when the pool is short: those samples share groups.
fn fit_to_pool(degrees: &mut [u32], weights: &[f64], pool: u32) {
    while degrees.iter().map(|&k| u64::from(k)).sum::<u64>() > u64::from(pool) {
        let largest = (0..degrees.len())
            .filter(|&i| degrees[i] > 2)
            .max_by(|&a, &b| {
                degrees[a]
                    .cmp(&degrees[b])
                    .then(weights[b].total_cmp(&weights[a]))
            });
        match largest {
            Some(i) => degrees[i] /= 2,
            None => break,
        }
    }
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
        let mut degrees: Vec<u32> = wanted.iter().map(|&(k, _)| k).collect();
        let wanted_weights: Vec<f64> = wanted.iter().map(|&(_, index)| weights[index]).collect();
        fit_to_pool(&mut degrees, &wanted_weights, dp);
        for (want, degree) in wanted.iter_mut().zip(degrees) {
            want.0 = degree;
        }
        // Largest groups first, then heaviest; each on the least-loaded free aligned block.
        wanted.sort_by(|a, b| b.0.cmp(&a.0).then(weights[b.1].total_cmp(&weights[a.1])));
        let mut loads = vec![0.0; dp as usize];
        let mut taken = vec![false; dp as usize];
        // Merged groups: their ranks and the samples they run as one CP group.
        let mut merged: Vec<(Vec<u32>, Vec<usize>)> = Vec::new();
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
            let group = match block {
                Some(ranks) => {
                    merged.push((ranks, Vec::new()));
                    merged.len() - 1
                }
                None if self.share => match lightest_group_of_at_least(&merged, &loads, k) {
                    Some(group) => group,
                    None => {
                        unmerged += 1;
                        continue;
                    }
                },
                None => {
                    unmerged += 1;
                    continue;
                }
            };
            let (ranks, members) = &mut merged[group];
            for &rank in ranks.iter() {
                taken[rank as usize] = true;
                loads[rank as usize] += weights[index] / ranks.len() as f64;
            }
            members.push(index);
        }
        let is_merged: Vec<bool> = {
            let mut flags = vec![false; samples.len()];
            for (_, members) in &merged {
                for &index in members {
                    flags[index] = true;
                }
            }
            flags
        };
        let rest: Vec<usize> = (0..samples.len()).filter(|&i| !is_merged[i]).collect();
        let rest_weights: Vec<f64> = rest.iter().map(|&i| weights[i]).collect();
        // The others are rebalanced before the groups exist, so that only the samples the
        // refinement moves are placed again (each placement edit costs the replica's degree
        // in the graph).
        let placement = rebalance_around(
            ir,
            &plain,
            &samples,
            &rest,
            &rest_weights,
            &loads,
            !merged.is_empty(),
        );
        add_groups(ir, &merged, &samples);
        let largest = merged
            .iter()
            .map(|(ranks, _)| ranks.len())
            .max()
            .unwrap_or(1);
        Ok(Statistics::new()
            .with(
                "merged_samples",
                merged.iter().map(|(_, m)| m.len()).sum::<usize>(),
            )
            .with("merge_groups", merged.len())
            .with("largest_group", largest)
            .with("unmerged_for_lack_of_ranks", unmerged)
            .with("cost_imbalance", placement))
    }
}

/// One replica per merged group, running its samples.
fn add_groups(
    ir: &mut StepIr,
    merged: &[(Vec<u32>, Vec<usize>)],
    samples: &[SampleId],
) -> Vec<ReplicaId> {
    merged
        .iter()
        .map(|(ranks, members)| {
            let group = ir.add_replica(ranks.clone());
            for &index in members {
                ir.place_sample(samples[index], group);
            }
            group
        })
        .collect()
}

/// For a sample that found no free block: the smallest merged group of at least `k` ranks (its
/// CP exchange grows with the degree), of those the one with the lowest load per rank.
fn lightest_group_of_at_least(
    merged: &[(Vec<u32>, Vec<usize>)],
    loads: &[f64],
    k: u32,
) -> Option<usize> {
    let per_rank =
        |ranks: &[u32]| ranks.iter().map(|&r| loads[r as usize]).sum::<f64>() / ranks.len() as f64;
    (0..merged.len())
        .filter(|&g| merged[g].0.len() >= k as usize)
        .min_by(|&a, &b| {
            let (a, b) = (&merged[a].0, &merged[b].0);
            a.len()
                .cmp(&b.len())
                .then(per_rank(a).total_cmp(&per_rank(b)))
        })
}

/// The other samples keep their single-rank replicas and are moved and swapped from their
/// current placement until the loads, merged shares included, balance. Returns the final
/// max / mean rank load.
fn rebalance_around(
    ir: &mut StepIr,
    plain: &[ReplicaId],
    samples: &[SampleId],
    rest: &[usize],
    rest_weights: &[f64],
    loads: &[f64],
    any_merged: bool,
) -> f64 {
    let rank_of = |replica| plain.iter().position(|&r| r == replica).unwrap_or(0);
    let before: Vec<usize> = rest
        .iter()
        .map(|&i| ir.replica_of_sample(samples[i]).map_or(0, rank_of))
        .collect();
    let mut bin_of = before.clone();
    if any_merged {
        refine(rest_weights, &mut bin_of, loads);
    }
    for (position, &index) in rest.iter().enumerate() {
        if bin_of[position] != before[position] {
            ir.place_sample(samples[index], plain[bin_of[position]]);
        }
    }
    let mut final_loads = loads.to_vec();
    for (position, &bin) in bin_of.iter().enumerate() {
        final_loads[bin] += rest_weights[position];
    }
    max_over_mean(&final_loads)
}

/// max / mean of the per-rank loads (1.0 is perfect balance).
fn max_over_mean(loads: &[f64]) -> f64 {
    let mean = loads.iter().sum::<f64>() / loads.len() as f64;
    let max = loads.iter().copied().fold(0.0, f64::max);
    if mean > 0.0 {
        max / mean
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::{fit_to_pool, merge_degree};

    #[test]
    fn wanted_degrees_are_halved_to_fit_the_pool() {
        // One sample wanting every rank would leave the other two unmerged: it gets half.
        let mut degrees = [8, 2, 2];
        fit_to_pool(&mut degrees, &[3.0, 2.0, 1.0], 8);
        assert_eq!(degrees, [4, 2, 2]);
        // Of equal degrees, the lighter sample's is halved first.
        let mut degrees = [4, 4, 4];
        fit_to_pool(&mut degrees, &[3.0, 1.0, 2.0], 8);
        assert_eq!(degrees, [4, 2, 2]);
        // Pairs are not split further: those samples share groups.
        let mut degrees = [2, 2, 2, 2, 2];
        fit_to_pool(&mut degrees, &[1.0; 5], 8);
        assert_eq!(degrees, [2; 5]);
        // What fits is left alone.
        let mut degrees = [8, 4];
        fit_to_pool(&mut degrees, &[1.0, 1.0], 16);
        assert_eq!(degrees, [8, 4]);
    }

    #[test]
    fn degrees_are_powers_of_two_within_the_pool() {
        assert_eq!(merge_degree(1.0, 8), 1);
        assert_eq!(merge_degree(1.3, 8), 2);
        assert_eq!(merge_degree(3.0, 8), 4);
        assert_eq!(merge_degree(100.0, 8), 8);
        assert_eq!(merge_degree(5.0, 6), 4);
    }
}
