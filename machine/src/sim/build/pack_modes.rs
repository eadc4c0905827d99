//! A pack's own recomputation on a stage, where it saves under another mode than the stage's
//! (`StepIr::saved_recompute`): the builder prices such a pack's tasks there, time and memory,
//! on the machine under that mode. A backward pack replays its slices under the mode their
//! forward pack saved them under (one per backward pack and stage: the verifier's
//! `pack-recompute` rule), read off its first slice.

use slimpack_ir::spec::Recompute;
use slimpack_ir::step::{Direction, PackId};

use super::super::task::PackIndex;
use super::{Builder, NONE};
use crate::cost::CostModel;

/// A (pack, stage) that saves under its stage's mode.
const SAME_AS_STAGE: u16 = u16::MAX;

impl Builder<'_> {
    /// Takes the IR's packs' own modes (after `collect_packs`).
    pub(super) fn read_pack_modes(&mut self) {
        if !self.ir.has_pack_recompute() {
            return;
        }
        let own: Vec<_> = self.ir.pack_recomputes().collect();
        self.set_pack_modes(&own);
    }

    /// Sets the modes forward packs save under on stages, `((pack, stage), mode)`, replacing
    /// any set before (after `collect_packs`; packs it did not gather are skipped); each
    /// backward pack takes, on each stage, the mode of its first slice's forward pack.
    pub(super) fn set_pack_modes(&mut self, own: &[((PackId, u32), Recompute)]) {
        self.pack_costs.clear();
        self.pack_modes.clear();
        if own.is_empty() {
            return;
        }
        let stages = self.stages as usize;
        self.pack_modes = vec![SAME_AS_STAGE; self.packs.len() * stages];
        for &((pack, stage), mode) in own {
            let index = self
                .pack_of_node
                .get(pack.node().index())
                .copied()
                .unwrap_or(NONE);
            if index == NONE || stage >= self.stages {
                continue;
            }
            let own = match self.pack_costs.iter().position(|(m, _)| *m == mode) {
                Some(own) => own,
                None => {
                    self.pack_costs.push((mode, self.cost.with_recompute(mode)));
                    self.pack_costs.len() - 1
                }
            };
            // Distinct modes are at most a stage's layers plus three, far below 2^16 - 1.
            let own = u16::try_from(own).unwrap_or(SAME_AS_STAGE - 1);
            self.pack_modes[index as usize * stages + stage as usize] = own;
        }
        for index in 0..self.packs.len() {
            if self.packs[index].direction != Direction::Backward {
                continue;
            }
            let forward = self
                .slices_of(PackIndex(index as u32))
                .first()
                .map_or(NONE, |slice| self.forward_of_node[slice.node]);
            if forward == NONE {
                continue;
            }
            let forward = forward as usize;
            self.pack_modes
                .copy_within(forward * stages..(forward + 1) * stages, index * stages);
        }
    }

    /// The index in `pack_costs` of the mode `pack` saves under on `stage` where it is its
    /// own; `None`: the stage's.
    pub(super) fn pack_mode(&self, pack: PackIndex, stage: u32) -> Option<usize> {
        let own = *self
            .pack_modes
            .get(pack.0 as usize * self.stages as usize + stage as usize)?;
        (own != SAME_AS_STAGE).then_some(usize::from(own))
    }

    /// The machine `pack` runs on `stage` on: under its own mode there, or its stage's.
    pub(super) fn pack_cost(&self, pack: PackIndex, stage: u32) -> &CostModel {
        match self.pack_mode(pack, stage) {
            Some(own) => &self.pack_costs[own].1,
            None => self.stage_cost(stage),
        }
    }
}
