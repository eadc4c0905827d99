//! Device groups: how the simulator maps replicas and stages onto physical devices.
//!
//! Every device of the layout belongs to exactly one *device group*: the `tp × cp` devices (TP
//! ranks times static CP ranks) of one DP rank on one pipeline stage. The devices of a group
//! always run the same work at the same time (TP and static CP split every kernel evenly), so
//! the simulator keeps one compute stream and one communication stream per group and accounts
//! time and memory per device by copying the group's figures to each of its devices.
//!
//! A replica (one DP rank, or a DP-Merge group of several) runs its stage-`s` tasks on the
//! groups of its ranks at stage `s`. A DP rank that belongs both to a plain replica and to a
//! DP-Merge group therefore has one group per stage that both replicas' tasks share: their
//! streams are the same streams. With Megatron's rank order (tp fastest, then cp, dp, pp) the
//! devices of group `g = stage · dp + rank` are the global ranks `[g · tp · cp, (g + 1) · tp ·
//! cp)`.

use std::ops::Range;

use serde::Serialize;
use slimpack_ir::spec::{Coords, ParallelSpec};

/// A device group: the `tp × cp` devices of one DP rank on one stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct GroupId(pub u32);

impl GroupId {
    /// The group's position in `0..Layout::groups()`.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// The parallel layout as the simulator sees it: `dp × pp` device groups of `tp × cp` devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Layout {
    pub tp: u32,
    /// Static context-parallel degree (1 when the layout has none).
    pub cp: u32,
    pub pp: u32,
    pub dp: u32,
}

impl Layout {
    /// The layout of `parallel`.
    pub fn new(parallel: &ParallelSpec) -> Layout {
        Layout {
            tp: parallel.tp,
            cp: parallel.cp_degree(),
            pp: parallel.pp,
            dp: parallel.dp,
        }
    }

    /// Number of device groups (`dp × pp`).
    pub fn groups(&self) -> usize {
        self.dp as usize * self.pp as usize
    }

    /// Number of devices (`tp × cp × dp × pp`).
    pub fn devices(&self) -> usize {
        self.groups() * self.devices_per_group() as usize
    }

    /// Devices in one group (`tp × cp`).
    pub fn devices_per_group(&self) -> u64 {
        u64::from(self.tp) * u64::from(self.cp)
    }

    /// The group of DP rank `rank` on pipeline stage `stage` (with model chunks, `vpp > 1`,
    /// stage `k` runs on pipeline device `k mod pp`).
    pub fn group(&self, rank: u32, stage: u32) -> GroupId {
        GroupId(stage % self.pp * self.dp + rank)
    }

    /// The DP rank of a group.
    pub fn rank_of(&self, group: GroupId) -> u32 {
        group.0 % self.dp
    }

    /// The pipeline device (`pp` coordinate) of a group.
    pub fn stage_of(&self, group: GroupId) -> u32 {
        group.0 / self.dp
    }

    /// Global ranks of the group's devices.
    pub fn device_range(&self, group: GroupId) -> Range<u64> {
        let size = self.devices_per_group();
        let first = u64::from(group.0) * size;
        first..first + size
    }

    /// The group a global rank belongs to.
    pub fn group_of_device(&self, device: u64) -> GroupId {
        GroupId((device / self.devices_per_group()) as u32)
    }

    /// The global rank of the group's first device (TP rank 0, CP rank 0), which stands for
    /// the group when a link between two groups is looked up.
    pub fn first_device(&self, group: GroupId) -> u64 {
        let parallel = ParallelSpec {
            tp: self.tp,
            cp: Some(self.cp),
            pp: self.pp,
            vpp: 1,
            dp: self.dp,
        };
        parallel.rank(Coords {
            tp: 0,
            cp: 0,
            dp: self.rank_of(group),
            pp: self.stage_of(group),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_contiguous_rank_blocks_in_megatron_order() {
        let parallel: ParallelSpec = "tp=2,cp=2,pp=3,dp=4".parse().unwrap();
        let layout = Layout::new(&parallel);
        assert_eq!(layout.groups(), 12);
        assert_eq!(layout.devices(), 48);
        for device in 0..parallel.world() {
            let coords = parallel.coords(device);
            let group = layout.group(coords.dp, coords.pp);
            assert_eq!(layout.group_of_device(device), group);
            assert!(layout.device_range(group).contains(&device));
            assert_eq!(layout.rank_of(group), coords.dp);
            assert_eq!(layout.stage_of(group), coords.pp);
        }
        assert_eq!(layout.first_device(layout.group(3, 1)), 28);
    }
}
