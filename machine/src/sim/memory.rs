//! The memory timeline of each device group, stacked from the cost crate's memory model.
//!
//! Each device starts the step holding its stage's model states and the fixed workspace (the
//! *baseline*). A pack's forward allocates, on each of its devices, the activations its slices
//! save and their K/V; the backward of a slice frees its activations, its K/V (no earlier slice
//! attends to its keys, so nobody needs them any more) and its dK/dV accumulator. A sample's
//! accumulators (fp32 dK/dV of every slice but the last) are allocated when its first backward
//! (that of its last slice) starts, because that backward already adds into them. Every task
//! also holds temporaries while it runs. Which bytes those are is [`MemoryModel`]'s business;
//! this file only stacks them.
//!
//! The compute stream of a group runs one task at a time, and only compute tasks change memory,
//! so applying each task's [`MemoryEffect`] in the order the executor starts them on the group
//! gives the exact timeline: `baseline + allocations so far − frees so far`, plus the running
//! task's temporaries.
//!
//! [`MemoryModel`]: crate::cost::MemoryModel

use serde::Serialize;

use super::layout::{GroupId, Layout};

/// What one task does to the memory of each of its devices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MemoryEffect {
    /// Bytes allocated when the task starts and kept after it ends (saved activations, K/V,
    /// dK/dV accumulators).
    pub allocated: u64,
    /// Bytes held only while the task runs.
    pub temporary: u64,
    /// Bytes freed when the task ends.
    pub freed: u64,
}

/// The memory of a device at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MemoryPoint {
    pub time_s: f64,
    pub bytes: u64,
}

/// The memory timeline of every device of one group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupMemory {
    /// Model states plus workspace: what the device holds before the first task and, if every
    /// allocation is freed, after the last.
    pub baseline_bytes: u64,
    /// The highest memory reached, temporaries included.
    pub peak_bytes: u64,
    /// Memory after the last task.
    pub final_bytes: u64,
    /// Memory at each task start (with the task's temporaries) and end (without them), in time
    /// order; between two points memory stays at the later point's level.
    pub timeline: Vec<MemoryPoint>,
}

impl GroupMemory {
    /// A device holding `baseline_bytes` before the step.
    pub fn new(baseline_bytes: u64) -> GroupMemory {
        GroupMemory {
            baseline_bytes,
            peak_bytes: baseline_bytes,
            final_bytes: baseline_bytes,
            timeline: Vec::new(),
        }
    }

    /// Applies a task that runs from `start_s` to `end_s`; tasks must come in start order.
    pub fn apply(&mut self, effect: &MemoryEffect, start_s: f64, end_s: f64) {
        let during = self.stack(effect);
        self.timeline.push(MemoryPoint {
            time_s: start_s,
            bytes: during,
        });
        self.timeline.push(MemoryPoint {
            time_s: end_s,
            bytes: self.final_bytes,
        });
    }

    /// Stacks a task's effect on the peak and final bytes without recording when (tasks in
    /// start order); returns the bytes held while it runs.
    pub fn stack(&mut self, effect: &MemoryEffect) -> u64 {
        let held = self.final_bytes + effect.allocated;
        let during = held + effect.temporary;
        self.peak_bytes = self.peak_bytes.max(during);
        self.final_bytes = held.checked_sub(effect.freed).unwrap_or_else(|| {
            panic!(
                "a task frees {} bytes of {held} held; this is a bug",
                effect.freed
            )
        });
        during
    }
}

/// The peak of each pipeline device: the highest of its groups' (`memory` per group, in
/// `layout`'s group order).
pub(super) fn device_peaks(layout: &Layout, memory: &[GroupMemory]) -> Vec<u64> {
    let mut peaks = vec![0u64; layout.pp as usize];
    for (group, memory) in memory.iter().enumerate() {
        let device = layout.stage_of(GroupId(group as u32)) as usize;
        peaks[device] = peaks[device].max(memory.peak_bytes);
    }
    peaks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_allocations_temporaries_and_frees() {
        let mut memory = GroupMemory::new(100);
        let forward = MemoryEffect {
            allocated: 30,
            temporary: 5,
            freed: 0,
        };
        let backward = MemoryEffect {
            allocated: 0,
            temporary: 50,
            freed: 30,
        };
        memory.apply(&forward, 0.0, 1.0);
        memory.apply(&forward, 1.0, 2.0);
        memory.apply(&backward, 2.0, 4.0);
        memory.apply(&backward, 4.0, 6.0);
        // 100 + 30 + 30 + 50 temporaries during the first backward.
        assert_eq!(memory.peak_bytes, 210);
        assert_eq!(memory.final_bytes, 100);
        let bytes: Vec<u64> = memory.timeline.iter().map(|p| p.bytes).collect();
        assert_eq!(bytes, [135, 130, 165, 160, 210, 130, 180, 100]);
    }
}
