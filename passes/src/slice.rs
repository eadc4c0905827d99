//! `slice{size=N}`: cut every slice longer than N tokens into slices of N tokens, the last one
//! shorter, chained by dependency edges.
//!
//! Phase in: `logical` or `assigned` (slices are not in packs yet). Phase out: unchanged. On a
//! fresh IR (one slice per sample) this cuts each sample into `ceil(len / N)` slices; on an IR
//! that is already sliced it refines the slices, so running it twice with the same N is a no-op.

use crate::error::Result;
use crate::pass::{OptionInfo, Pass, PassContext, PassInfo, PassOptions, Statistics};
use slimpack_ir::step::Phase;
use slimpack_ir::StepIr;

pub(crate) const INFO: PassInfo = PassInfo {
    name: "slice",
    summary: "cut samples into slices of at most N tokens",
    description: "Every slice longer than `size` tokens is replaced by consecutive slices of \
                  `size` tokens, the last one shorter, chained by dependency edges. Runs before \
                  packing (phases logical and assigned); leaves the phase unchanged.",
    accepts: Phase::Logical..=Phase::Assigned,
    produces: None,
    options: &[OptionInfo {
        name: "size",
        help: "maximum tokens per slice, a positive integer",
        default: None,
    }],
    create: |options| Ok(Box::new(Slice::from_options(options)?)),
};

/// The slicing pass.
#[derive(Debug, Clone, Copy)]
pub struct Slice {
    /// Maximum tokens per slice.
    pub size: u32,
}

impl Slice {
    fn from_options(options: &PassOptions) -> Result<Slice> {
        Ok(Slice {
            size: options.required_positive("size")?,
        })
    }
}

impl Pass for Slice {
    fn info(&self) -> &'static PassInfo {
        &INFO
    }

    fn run(&mut self, ir: &mut StepIr, _: &PassContext) -> Result<Statistics> {
        let (mut before, mut after, mut samples_cut) = (0usize, 0usize, 0usize);
        let mut largest = 0u32;
        for sample in ir.samples().to_vec() {
            let slices = ir.slices_of(sample);
            before += slices.len();
            let lengths: Vec<u32> = slices
                .iter()
                .flat_map(|&s| split(ir.slice(s).len, self.size))
                .collect();
            if lengths.len() != slices.len() {
                samples_cut += 1;
                ir.set_slices(sample, &lengths);
            }
            after += lengths.len();
            largest = largest.max(lengths.iter().copied().max().unwrap_or(0));
        }
        Ok(Statistics::new()
            .with("slices_before", before)
            .with("slices_after", after)
            .with("samples_cut", samples_cut)
            .with("largest_slice", largest))
    }
}

/// Lengths of the pieces of a `len`-token slice cut at every `size` tokens.
fn split(len: u32, size: u32) -> impl Iterator<Item = u32> {
    let pieces = len.div_ceil(size);
    (0..pieces).map(move |k| size.min(len - k * size))
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn split_keeps_every_token() {
        assert_eq!(split(10, 4).collect::<Vec<_>>(), vec![4, 4, 2]);
        assert_eq!(split(8, 4).collect::<Vec<_>>(), vec![4, 4]);
        assert_eq!(split(3, 4).collect::<Vec<_>>(), vec![3]);
    }
}
