//! `assign-hybrid-cp{max-tokens-per-rank=N}`: Megatron-Core's hybrid context parallelism —
//! every sample gets its own power-of-two CP degree, and groups of DP ranks run the long ones.
//!
//! Phase in: `logical`. Phase out: `assigned`. Source: NVIDIA/Megatron-LM,
//! `megatron/core/pipeline_parallel/hybrid_cp_schedule.py`, `BalancedCPScheduler`
//! (`gpus_needed`, `get_total_workload`, `next_hdp_group`), enabled by `--hybrid-context-parallel`
//! with `--max-seqlen-per-dp-cp-rank` ("a good starting point is the maximum sequence length /
//! context parallel size").
//!
//! - A sample of `L` tokens needs `max(1, 2^ceil(log2(L / N)))` ranks (at most the DP pool,
//!   rounded down to a power of two); its estimated work per rank is `L² / ranks`.
//! - Samples are taken longest first. One needing `k > 1` ranks goes to the least-loaded
//!   existing group of exactly `k` ranks, or to a new group of the `k` least-loaded free ranks
//!   when that group would be less loaded (Megatron's choice between `best_gid` and
//!   `new_members`). A group is a replica of `k` DP ranks: the IR's DP-Merge group, one CP group.
//! - A sample needing one rank goes to the least-loaded rank, on the rank's own replica.
//!
//! Deviations: Megatron-Core forms a sequence of scheduling groups per step, separated by
//! barriers, each with its own partition of the ranks; the step IR keeps one set of merged
//! groups per step (they must be disjoint, and a rank's own replica shares its devices with its
//! group's), so a sample needing `k` ranks when no group of `k` exists and too few ranks are
//! free runs on the least-loaded larger group, with a higher CP degree than it needs. The
//! balance check, `trim_overload` and `fill_empty_gpus` act within one scheduling group and
//! have no counterpart; ranks left without work stay idle. Megatron-Core asserts
//! `pipeline_model_parallel_size == 1` with hybrid CP; here the schedule that follows
//! (`schedule-pipeline`) pipelines whatever `pp` the layout has.

use crate::error::{PassError, Result};
use crate::pass::{OptionInfo, Pass, PassContext, PassInfo, PassOptions, Statistics};
use slimpack_ir::step::Phase;
use slimpack_ir::StepIr;

pub(crate) const INFO: PassInfo = PassInfo {
    name: "assign-hybrid-cp",
    summary: "Megatron-Core hybrid CP: per-sample power-of-two CP groups of DP ranks",
    description: "Each sample needs 2^ceil(log2(L / max-tokens-per-rank)) DP ranks; longest \
                  first, it goes to the least-loaded group of that size or a new group of free \
                  ranks (a DP-Merge replica), short samples to the least-loaded rank. Phase \
                  logical -> assigned.",
    accepts: Phase::Logical..=Phase::Logical,
    produces: Some(Phase::Assigned),
    options: &[OptionInfo {
        name: "max-tokens-per-rank",
        help: "Megatron's max_seqlen_per_dp_cp_rank (default: the batch's context length)",
        default: None,
    }],
    create: |options| Ok(Box::new(AssignHybridCp::from_options(options)?)),
};

/// The hybrid-CP assignment pass.
#[derive(Debug, Clone, Copy)]
pub struct AssignHybridCp {
    pub max_tokens_per_rank: Option<u32>,
}

impl AssignHybridCp {
    fn from_options(options: &PassOptions) -> Result<AssignHybridCp> {
        Ok(AssignHybridCp {
            max_tokens_per_rank: options.positive("max-tokens-per-rank")?,
        })
    }
}

/// Megatron's `gpus_needed`, capped at `pool` (a power of two).
pub fn ranks_needed(len: u32, max_tokens_per_rank: u32, pool: u32) -> u32 {
    let ratio = f64::from(len) / f64::from(max_tokens_per_rank);
    let needed = if ratio <= 1.0 {
        1
    } else {
        2u64.saturating_pow(ratio.log2().ceil() as u32)
    };
    needed.min(u64::from(pool)) as u32
}

/// The largest power of two that is at most `n` (n >= 1).
fn power_of_two_below(n: u32) -> u32 {
    1 << (31 - n.leading_zeros())
}

/// The outcome: merged groups (ranks) and, per sample, its group or its single rank.
struct Assignment {
    groups: Vec<Vec<u32>>,
    placement: Vec<Placement>,
}

#[derive(Debug, Clone, Copy)]
enum Placement {
    Rank(u32),
    Group(usize),
}

/// The scheduler over `lengths` (batch order) on `dp` ranks.
fn assign(lengths: &[u32], max_tokens_per_rank: u32, dp: u32) -> Assignment {
    let pool = power_of_two_below(dp);
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(lengths[i]));
    let mut load = vec![0.0f64; dp as usize];
    let mut in_group = vec![false; dp as usize];
    let mut groups: Vec<Vec<u32>> = Vec::new();
    let mut placement = vec![Placement::Rank(0); lengths.len()];
    let group_load = |load: &[f64], members: &[u32]| {
        members
            .iter()
            .map(|&r| load[r as usize])
            .fold(0.0, f64::max)
    };
    for item in order {
        let len = lengths[item];
        let needed = ranks_needed(len, max_tokens_per_rank, pool);
        let work = f64::from(len) * f64::from(len);
        if needed == 1 {
            let rank = (0..dp)
                .min_by(|&a, &b| load[a as usize].total_cmp(&load[b as usize]))
                .expect("dp >= 1");
            load[rank as usize] += work;
            placement[item] = Placement::Rank(rank);
            continue;
        }
        let existing = (0..groups.len())
            .filter(|&g| groups[g].len() == needed as usize)
            .map(|g| (g, group_load(&load, &groups[g])))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let mut free: Vec<u32> = (0..dp).filter(|&r| !in_group[r as usize]).collect();
        free.sort_by(|&a, &b| load[a as usize].total_cmp(&load[b as usize]));
        let fresh = (free.len() >= needed as usize).then(|| free[..needed as usize].to_vec());
        let group = match (existing, fresh) {
            (Some((g, best)), Some(members)) if group_load(&load, &members) >= best => g,
            (_, Some(members)) => {
                for &r in &members {
                    in_group[r as usize] = true;
                }
                groups.push(members);
                groups.len() - 1
            }
            (Some((g, _)), None) => g,
            (None, None) => (0..groups.len())
                .filter(|&g| groups[g].len() > needed as usize)
                .min_by(|&a, &b| {
                    let (la, lb) = (group_load(&load, &groups[a]), group_load(&load, &groups[b]));
                    groups[a]
                        .len()
                        .cmp(&groups[b].len())
                        .then(la.total_cmp(&lb))
                })
                .expect("longest first: a larger group exists when no group fits; this is a bug"),
        };
        let share = work / groups[group].len() as f64;
        for &r in &groups[group] {
            load[r as usize] += share;
        }
        placement[item] = Placement::Group(group);
    }
    Assignment { groups, placement }
}

impl Pass for AssignHybridCp {
    fn info(&self) -> &'static PassInfo {
        &INFO
    }

    fn run(&mut self, ir: &mut StepIr, _: &PassContext) -> Result<Statistics> {
        let max_tokens =
            self.max_tokens_per_rank
                .or(ir.batch.context)
                .ok_or(PassError::MissingOption {
                    pass: INFO.name,
                    option: "max-tokens-per-rank",
                    help: "the batch has no context length to default to: give --context, \
                           or the option (Megatron's max_seqlen_per_dp_cp_rank)",
                })?;
        let dp = ir.spec.parallel.dp;
        let samples = ir.samples().to_vec();
        let lengths: Vec<u32> = samples.iter().map(|&s| ir.sample(s).len).collect();
        let assignment = assign(&lengths, max_tokens, dp);
        let singles: Vec<_> = (0..dp).map(|rank| ir.add_replica(vec![rank])).collect();
        let merged: Vec<_> = assignment
            .groups
            .iter()
            .map(|ranks| ir.add_replica(ranks.clone()))
            .collect();
        let mut merged_samples = 0usize;
        for (&sample, placement) in samples.iter().zip(&assignment.placement) {
            let replica = match *placement {
                Placement::Rank(rank) => singles[rank as usize],
                Placement::Group(group) => {
                    merged_samples += 1;
                    merged[group]
                }
            };
            ir.place_sample(sample, replica);
        }
        let largest = assignment.groups.iter().map(Vec::len).max().unwrap_or(1);
        Ok(Statistics::new()
            .with("groups", assignment.groups.len())
            .with("largest_group", largest)
            .with("samples_in_groups", merged_samples))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn degrees_are_powers_of_two_of_the_ratio() {
        assert_eq!(ranks_needed(1000, 4096, 8), 1);
        assert_eq!(ranks_needed(4096, 4096, 8), 1);
        assert_eq!(ranks_needed(4097, 4096, 8), 2);
        assert_eq!(ranks_needed(12_000, 4096, 8), 4);
        assert_eq!(ranks_needed(1 << 20, 4096, 8), 8);
        assert_eq!(ranks_needed(1 << 20, 4096, 6), 6);
        assert_eq!(power_of_two_below(6), 4);
    }

    #[test]
    fn long_samples_get_groups_short_ones_the_least_loaded_rank() {
        // dp=4, 100 tokens per rank: 400 needs 4 ranks, 150 and 180 need 2 each, 50s need 1.
        let lengths = [50, 400, 150, 180, 50, 50];
        let assignment = assign(&lengths, 100, 4);
        // 400 takes all four ranks; no ranks are free for a 2-group, so 180 and 150 run on the
        // 4-group too; the short ones spread over the ranks.
        assert_eq!(assignment.groups, vec![vec![0, 1, 2, 3]]);
        assert!(matches!(assignment.placement[3], Placement::Group(0)));
        let ranks: Vec<u32> = [0, 4, 5]
            .iter()
            .map(|&i| match assignment.placement[i] {
                Placement::Rank(r) => r,
                Placement::Group(_) => panic!("a short sample in a group"),
            })
            .collect();
        assert_eq!(ranks, vec![0, 1, 2]);
        // Without the 400, 180 opens a 2-group and 150 opens a second one on the free ranks.
        let assignment = assign(&[50, 150, 180, 50], 100, 4);
        assert_eq!(assignment.groups, vec![vec![0, 1], vec![2, 3]]);
    }
}
