//! The slices' tables: [`SliceRow`], a slice's row in the table [`StepIr`] keeps beside its
//! graph (what a slice node and its `Contains` and `Next` edges say, read in bulk by passes,
//! the simulator and the lowering), and [`SampleSlices`], every sample's slices in offset order
//! gathered in one pass (from that table, or from the edges for the verifier).

#[cfg(doc)]
use super::StepIr;
use super::{Rows, Slice, SliceId};

/// A slice's row in [`StepIr`]'s slice table (`sample == NO_NODE` for a node that is no slice).
#[derive(Debug, Clone, Copy)]
pub(super) struct SliceRow {
    pub slice: Slice,
    /// The sample's node index.
    pub sample: u32,
    /// The next slice's node index (`NO_NODE` for the sample's last).
    pub next: u32,
}

/// No node, in [`SliceRow`]s.
pub(super) const NO_NODE: u32 = u32::MAX;

impl SliceRow {
    pub const ABSENT: SliceRow = SliceRow {
        slice: Slice { start: 0, len: 0 },
        sample: NO_NODE,
        next: NO_NODE,
    };
}

/// Every sample's slices, by the sample's batch position, and every slice's sample (see
/// [`StepIr::sample_slices`]).
#[derive(Debug, Clone, Default)]
pub struct SampleSlices {
    pub(super) slices: Rows<SliceId>,
    /// By slice node index: the batch position of the slice's sample (`u32::MAX`: none).
    pub(super) sample_at: Vec<u32>,
}

impl SampleSlices {
    /// The slices of the sample at batch position `position`, in offset order.
    pub fn at(&self, position: u32) -> &[SliceId] {
        self.slices.row(position as usize)
    }

    /// The batch position of a slice's sample (as `position_of(sample_of(slice))`).
    pub fn sample_position(&self, slice: SliceId) -> u32 {
        match self.sample_at.get(slice.node().index()) {
            Some(&position) if position != u32::MAX => position,
            _ => panic!("{slice:?} has no sample; this is a bug"),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::batch::Sample;
    use crate::step::{BatchInfo, Node, SampleId, StepIr};
    use crate::Spec;

    #[test]
    fn the_slice_table_is_each_samples_slices_in_offset_order() {
        let spec = Spec::from_presets("tiny", "cpu", "tp=1,pp=1,dp=1").unwrap();
        let mut ir = StepIr::new(spec, BatchInfo::default());
        let samples: Vec<SampleId> = (0..5u32)
            .map(|i| {
                ir.add_sample(Sample {
                    len: 10 + i,
                    doc: u64::from(i),
                    piece: 0,
                })
            })
            .collect();
        // Re-slicing frees slice nodes and edges that later slices reuse, so neither node
        // nor edge order is offset order.
        let mut state = 7u64;
        for round in 0..20u32 {
            for &sample in &samples {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let len = ir.sample(sample).len;
                let cut = 1 + (state >> 33) as u32 % (len - 1);
                let lengths = match (state >> 40) % 3 {
                    0 => vec![len],
                    1 => vec![cut, len - cut],
                    _ if cut > 1 => vec![1, cut - 1, len - cut],
                    _ => vec![len - round % 2 - 1, 1 + round % 2],
                };
                ir.set_slices(sample, &lengths);
            }
        }
        let table = ir.sample_slices();
        for &sample in &samples {
            let position = ir.position_of(sample);
            assert_eq!(table.at(position), ir.slices_of(sample));
            for (j, &slice) in table.at(position).iter().enumerate() {
                assert_eq!(table.sample_position(slice), position);
                assert_eq!(ir.sample_of(slice), sample);
                assert_eq!(ir.next_slice(slice), table.at(position).get(j + 1).copied());
                assert!(
                    matches!(ir.graph()[slice.node()], Node::Slice(s) if s == *ir.slice(slice))
                );
            }
        }
    }
}
