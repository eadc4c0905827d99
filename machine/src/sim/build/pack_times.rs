//! How long each pack's part takes on a stage, and what its FLOPs go to: the times and
//! shares the builder tags its compute tasks with, each computed once per set of stages that
//! give the same result (a pack's time depends on the stage only through its ends, its
//! replica's CP link and its recomputation mode, [`CostModel::alike_stages`]).

use crate::cost::{CostModel, Flops, OpKind, PackTime};
use slimpack_ir::step::{Direction, Part};

use super::super::memory::MemoryEffect;
use super::super::task::{ComputeParts, PackIndex};
use super::Builder;

/// What a pack's part does on a stage that depends on the stage through its ends only.
#[derive(Debug, Clone, Copy)]
pub(super) struct StageShare {
    /// Useful, recomputed and padding FLOP seconds at the saturated rates, over all devices.
    pub flop_seconds: [f64; 3],
    pub memory: MemoryEffect,
}

/// A part's index in the per-part tables.
fn part_index(part: Part) -> usize {
    match part {
        Part::Whole => 0,
        Part::InputGrad => 1,
        Part::WeightGrad => 2,
    }
}

/// The kernel rates at saturation (`Throughput::saturated_rate`), which price FLOPs for the
/// ideal times.
pub(super) struct SaturatedRates {
    gemm_forward: f64,
    gemm_backward: f64,
    attention_forward: f64,
    attention_backward: f64,
}

impl SaturatedRates {
    pub(super) fn new(cost: &CostModel) -> SaturatedRates {
        let throughput = cost.throughput();
        let rate = |op| throughput.saturated_rate(op);
        SaturatedRates {
            gemm_forward: rate(OpKind::GemmForward),
            gemm_backward: rate(OpKind::GemmBackward),
            attention_forward: rate(OpKind::AttentionForward),
            attention_backward: rate(OpKind::AttentionBackward),
        }
    }

    /// Seconds of `flops` run by the kernels of `direction`.
    fn seconds(&self, flops: Flops, direction: Direction) -> f64 {
        match direction {
            Direction::Forward => {
                flops.linear / self.gemm_forward + flops.attention / self.attention_forward
            }
            Direction::Backward => {
                flops.linear / self.gemm_backward + flops.attention / self.attention_backward
            }
        }
    }
}

impl Builder<'_> {
    /// Sizes the per-(pack, stage ends, mode, part) table of [`StageShare`]s from the stages'
    /// recomputation modes.
    pub(super) fn prepare_stage_shares(&mut self) {
        let mut distinct = vec![self.ir.spec.model.recompute];
        self.stage_modes = (0..self.stages)
            .map(|stage| {
                let mode = self.ir.stage_recompute(stage);
                distinct.iter().position(|&m| m == mode).unwrap_or_else(|| {
                    distinct.push(mode);
                    distinct.len() - 1
                })
            })
            .collect();
        self.modes = distinct.len() + self.pack_costs.len();
        self.stage_shares = vec![None; self.packs.len() * 4 * self.modes * 3];
        // Stages alike for one replica's ranks, numbered in stage order.
        self.time_classes = (self.replicas.iter())
            .map(|ranks| {
                let first = self.cost.alike_stages(ranks).times;
                let mut class = vec![0u32; first.len()];
                let mut classes = 0;
                for (stage, &like) in first.iter().enumerate() {
                    class[stage] = match like as usize == stage {
                        true => {
                            classes += 1;
                            classes - 1
                        }
                        false => class[like as usize],
                    };
                }
                class
            })
            .collect();
        self.classes = (self.time_classes.iter())
            .map(|class| class.iter().max().map_or(1, |&c| c as usize + 1))
            .max()
            .unwrap_or(1);
        self.replica_packs = vec![(u32::MAX, 0); self.replicas.len()];
        for (index, pack) in self.packs.iter().enumerate() {
            let (first, count) = &mut self.replica_packs[pack.replica as usize];
            *first = (*first).min(index as u32);
            *count += 1;
        }
        let largest = (self.replica_packs.iter())
            .map(|&(_, count)| count as usize)
            .max()
            .unwrap_or(0);
        self.stage_times = vec![None; largest * self.classes * 3 * self.modes];
        self.times_replica = usize::MAX;
    }

    /// The time of `part` of `pack` on `stage`, under the stage's recomputation, on the
    /// replicas that run it.
    pub(super) fn part_time(&self, pack: PackIndex, stage: u32, part: Part) -> PackTime {
        let ranks = &self.replicas[self.packs[pack.0 as usize].replica as usize];
        self.pack_cost(pack, stage).work_part_time_on(
            stage,
            &self.works[pack.0 as usize],
            part,
            ranks,
        )
    }

    /// What `time`, the time of `pack` on `stage`, goes to on each of its devices: the FLOPs
    /// of its real slices without recomputation (useful), their recomputed forward work (at
    /// the forward rates), the pad tokens' FLOPs, each at the saturated rates and shared
    /// evenly by the task's devices; the rest of the GEMM and attention time is below
    /// saturation; the other components are the cost model's.
    pub(super) fn compute_parts(
        &self,
        pack: PackIndex,
        share: &StageShare,
        time: &PackTime,
    ) -> ComputeParts {
        let info = &self.packs[pack.0 as usize];
        let [useful, recompute, padding] = share.flop_seconds;
        let devices = (self.split(info.replica) * u64::from(self.layout.tp)) as f64;
        let (useful_s, recompute_s, padding_s) =
            (useful / devices, recompute / devices, padding / devices);
        ComputeParts {
            useful_s,
            recompute_s,
            padding_s,
            below_saturation_s: time.gemm_s + time.attention_s - useful_s - recompute_s - padding_s,
            memory_bound_s: time.elementwise_s,
            launch_overhead_s: time.kernel_overhead_s,
            exposed_tp_s: time.tp_exposed_s,
            exposed_cp_s: time.cp_exposed_s(),
        }
    }

    /// The index of (pack, stage ends, part), in `0..packs * 12`: what a pack's part does on
    /// a stage beside the stage's recomputation mode ([`Builder::stage_share`]).
    pub(super) fn share_slot(&self, pack: PackIndex, stage: u32, part: Part) -> usize {
        (pack.0 as usize * 4 + self.cost.stage_ends(stage).index()) * 3 + part_index(part)
    }

    /// The recomputation mode `pack` runs under on `stage`, as an index in `0..modes`: its
    /// stage's, or its own there.
    fn mode_index(&self, pack: PackIndex, stage: u32) -> usize {
        match self.pack_mode(pack, stage) {
            Some(own) => self.modes - self.pack_costs.len() + own,
            None => self.stage_modes[stage as usize],
        }
    }

    /// [`Builder::part_time`], computed once per (pack, time class, part, mode): a pack
    /// takes the same time on the stages of one class.
    pub(super) fn stage_time(&mut self, pack: PackIndex, stage: u32, part: Part) -> PackTime {
        let replica = self.packs[pack.0 as usize].replica as usize;
        let (first, count) = self.replica_packs[replica];
        if replica != self.times_replica {
            let used = count as usize * self.classes * 3 * self.modes;
            self.stage_times[..used].fill(None);
            self.times_replica = replica;
        }
        let class = self.time_classes[replica][stage as usize] as usize;
        let within = (pack.0 - first) as usize;
        let slot = ((within * self.classes + class) * 3 + part_index(part)) * self.modes
            + self.mode_index(pack, stage);
        if let Some(time) = self.stage_times[slot] {
            return time;
        }
        let time = self.part_time(pack, stage, part);
        self.stage_times[slot] = Some(time);
        time
    }

    /// What `part` of `pack` does on `stage` that depends on the stage through its ends and
    /// its recomputation mode only: computed once per (pack, ends, mode, part).
    pub(super) fn stage_share(&mut self, pack: PackIndex, stage: u32, part: Part) -> StageShare {
        let slot = self.share_slot(pack, stage, part) * self.modes + self.mode_index(pack, stage);
        if let Some(share) = self.stage_shares[slot] {
            return share;
        }
        let share = StageShare {
            flop_seconds: self.flop_seconds(pack, stage, part),
            memory: self.memory_effect(pack, stage, part),
        };
        self.stage_shares[slot] = Some(share);
        share
    }

    /// The seconds of `part` of `pack`'s FLOPs on `stage` at the saturated rates, summed over
    /// its devices: useful, recomputed and padding work (see [`Builder::compute_parts`]).
    fn flop_seconds(&self, pack: PackIndex, stage: u32, part: Part) -> [f64; 3] {
        let info = &self.packs[pack.0 as usize];
        let range = self.pack_slices[pack.0 as usize].clone();
        let (mut useful, mut recompute, mut padding) = (0.0, 0.0, 0.0);
        for position in range {
            let (len, prefix) = self.pairs[position as usize];
            let executed = self.pack_cost(pack, stage).stage_part_flops(
                stage,
                len,
                prefix,
                info.direction,
                part,
            );
            let model = self
                .useful_cost
                .stage_part_flops(stage, len, prefix, info.direction, part);
            let replayed = Flops {
                linear: executed.linear - model.linear,
                attention: executed.attention - model.attention,
            };
            let model_s = self.rates.seconds(model, info.direction);
            let replayed_s = self.rates.seconds(replayed, Direction::Forward);
            if self.slices[position as usize].padding {
                padding += model_s + replayed_s;
            } else {
                useful += model_s;
                recompute += replayed_s;
            }
        }
        [useful, recompute, padding]
    }
}
