//! Per-pack recomputation: a forward pack that saves its activations on a stage under another
//! mode than the stage's ([`StepIr::set_pack_recompute`], written by `assign-recompute
//! {packs=true}`).
//!
//! A stage's mode ([`StepIr::stage_recompute`]) is what its packs save by default. Where memory
//! allows some packs on a stage to recompute less (those live when the stage's memory is not
//! at its peak), each such forward pack names its own mode for that stage; its slices'
//! backwards replay what it did not save. A backward pack replays the slices of one mode only
//! on each stage (the verifier's `pack-recompute` rule): with mirrored packs every backward
//! follows its forward, with asymmetric ones the forwards whose slices one backward holds
//! take one mode together.

use super::{Direction, PackId, StepIr};
use crate::spec::Recompute;

impl StepIr {
    /// Sets the recomputation forward pack `pack` saves its activations under on stage `stage`
    /// (`None`, or the stage's own mode: the stage's). Shared ranks' orders, read off the
    /// step's memory, are cleared.
    pub fn set_pack_recompute(&mut self, pack: PackId, stage: u32, mode: Option<Recompute>) {
        self.clear_rank_orders();
        // A stage the step lacks keeps the mode (the verifier names it).
        let stage_mode = (stage < self.stages().len() as u32).then(|| self.stage_recompute(stage));
        match mode.filter(|&mode| Some(mode) != stage_mode) {
            Some(mode) => self.pack_recompute.insert((pack, stage), mode),
            None => self.pack_recompute.remove(&(pack, stage)),
        };
    }

    /// The recomputation `pack`'s slices were saved under on stage `stage`: a forward pack's
    /// own mode there, or the stage's; a backward pack's, that of the forward pack of its first
    /// slice (the verifier checks its slices agree).
    pub fn saved_recompute(&self, pack: PackId, stage: u32) -> Recompute {
        let forward = match self.pack(pack).direction {
            Direction::Forward => Some(pack),
            Direction::Backward => self
                .pack_members(pack)
                .first()
                .and_then(|&slice| self.pack_of(slice, Direction::Forward)),
        };
        forward
            .and_then(|forward| self.pack_recompute.get(&(forward, stage)).copied())
            .or_else(|| (stage < self.stages().len() as u32).then(|| self.stage_recompute(stage)))
            .unwrap_or(self.spec.model.recompute)
    }

    /// Every forward pack's own mode, by (pack, stage index), in that order.
    pub fn pack_recomputes(&self) -> impl Iterator<Item = ((PackId, u32), Recompute)> + '_ {
        self.pack_recompute.iter().map(|(&key, &mode)| (key, mode))
    }

    /// True when some forward pack saves under a mode of its own.
    pub fn has_pack_recompute(&self) -> bool {
        !self.pack_recompute.is_empty()
    }

    /// Drops every pack's own mode (each saves under its stage's again).
    pub fn clear_pack_recompute(&mut self) {
        self.pack_recompute.clear();
    }
}
