//! `slice{size=N}`: cut every slice longer than N tokens into slices of N tokens, the last one
//! shorter, chained by dependency edges. `slice{size=N,by=cost}`: cut each sample so that every
//! slice costs about what a fresh N-token slice does (linear work plus causal attention over the
//! slice's prefix): the later slices of a long sample are shorter. Slices of even cost make
//! packs of even cost, and so fewer pipeline stalls behind one heavy pack.
//!
//! Phase in: `logical` or `assigned` (slices are not in packs yet). Phase out: unchanged. On a
//! fresh IR (one slice per sample) this cuts each sample into `ceil(len / N)` slices; on an IR
//! that is already sliced it refines the slices, so running it twice with the same N is a no-op.

use crate::error::Result;
use crate::pass::{OptionInfo, Pass, PassContext, PassInfo, PassOptions, Statistics};
use slimpack_ir::step::Phase;
use slimpack_ir::StepIr;
use slimpack_machine::cost::FlopModel;

pub(crate) const INFO: PassInfo = PassInfo {
    name: "slice",
    summary: "cut samples into slices of at most N tokens",
    description: "Every slice longer than `size` tokens is replaced by consecutive slices of \
                  `size` tokens, the last one shorter, chained by dependency edges. Runs before \
                  packing (phases logical and assigned); leaves the phase unchanged.",
    accepts: Phase::Logical..=Phase::Assigned,
    produces: None,
    options: &[
        OptionInfo {
            name: "size",
            help: "maximum tokens per slice, a positive integer",
            default: None,
        },
        OptionInfo {
            name: "by",
            help: "tokens: every slice `size` tokens; cost: a sample's later slices shorter, \
                   each costing about what its first does (attention over a longer prefix)",
            default: Some("tokens"),
        },
    ],
    create: |options| Ok(Box::new(Slice::from_options(options)?)),
};

/// The slicing pass.
#[derive(Debug, Clone, Copy)]
pub struct Slice {
    /// Maximum tokens per slice.
    pub size: u32,
    /// Cut by cost rather than by tokens.
    pub by_cost: bool,
}

impl Slice {
    fn from_options(options: &PassOptions) -> Result<Slice> {
        let by_cost = matches!(options.choice("by", &["tokens", "cost"])?, Some("cost"));
        Ok(Slice {
            size: options.required_positive("size")?,
            by_cost,
        })
    }
}

impl Pass for Slice {
    fn info(&self) -> &'static PassInfo {
        &INFO
    }

    fn run(&mut self, ir: &mut StepIr, cx: &PassContext) -> Result<Statistics> {
        let flops = cx.machine().flop_model();
        let (mut before, mut after, mut samples_cut) = (0usize, 0usize, 0usize);
        let mut largest = 0u32;
        for sample in ir.samples().to_vec() {
            let slices = ir.slices_of(sample);
            before += slices.len();
            let lengths: Vec<u32> = slices
                .iter()
                .flat_map(|&s| {
                    let slice = ir.slice(s);
                    match self.by_cost {
                        true => split_by_cost(slice.start, slice.len, self.size, flops),
                        false => split(slice.len, self.size).collect(),
                    }
                })
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

/// Lengths of the pieces of a `len`-token slice starting at `start`, each (but the last)
/// costing about what a fresh `size`-token slice does in a layer's forward
/// ([`FlopModel::forward_layer`]), so a piece after a long prefix is shorter. Pieces are
/// multiples of 256 tokens and at least `size / 8` (or 256).
fn split_by_cost(start: u32, len: u32, size: u32, flops: &FlopModel) -> Vec<u32> {
    const GRAIN: u32 = 256;
    let budget = flops.forward_layer(u64::from(size), 0).total();
    // A piece of `l` tokens after `at` costs `linear·l + pair·(l·at + l(l+1)/2)`: the largest
    // `l` within the budget solves that quadratic.
    let (linear, pair) = (flops.linear_per_token(), flops.attention_per_pair());
    let floor = (size / 8).max(GRAIN).min(size);
    let mut pieces = Vec::new();
    let (mut at, end) = (start, start + len);
    while at < end {
        let b = linear + pair * (f64::from(at) + 0.5);
        let fit = ((b * b + 2.0 * pair * budget).sqrt() - b) / pair;
        let piece = ((fit as u32) / GRAIN * GRAIN)
            .clamp(floor, size)
            .min(end - at);
        pieces.push(piece);
        at += piece;
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::{split, split_by_cost};
    use slimpack_ir::Spec;
    use slimpack_machine::cost::CostModel;

    /// Cut by cost, a long sample keeps every token; its first slice is `size`, the later ones
    /// no longer, each a multiple of 256 tokens (but the last) and each costing about what the
    /// first does; a slice that starts late (a continuation) starts short.
    #[test]
    fn cost_cuts_keep_every_token_and_even_the_cost() {
        let spec = Spec::from_presets("llama-70b", "h100-sxm", "tp=8,pp=8,dp=4").unwrap();
        let model = CostModel::new(&spec);
        let flops = model.flop_model();
        let cost = |start: u32, len: u32| {
            flops
                .forward_layer(u64::from(len), u64::from(start))
                .total()
        };
        let pieces = split_by_cost(0, 262_144, 32_768, flops);
        assert_eq!(pieces.iter().sum::<u32>(), 262_144);
        assert_eq!(pieces[0], 32_768);
        assert!(pieces.windows(2).all(|w| w[1] <= w[0]), "{pieces:?}");
        assert!(pieces.len() > 8, "later slices are shorter: {pieces:?}");
        let budget = cost(0, 32_768);
        let mut start = 0;
        for (k, &piece) in pieces.iter().enumerate() {
            if k + 1 < pieces.len() {
                assert_eq!(piece % 256, 0, "{pieces:?}");
                let ratio = cost(start, piece) / budget;
                assert!(
                    (0.85..=1.0 + 1e-9).contains(&ratio),
                    "{k}: {ratio} {pieces:?}"
                );
            }
            start += piece;
        }
        // Short samples are one slice, as by tokens.
        assert_eq!(split_by_cost(0, 20_000, 32_768, flops), vec![20_000]);
        assert!(split_by_cost(200_000, 32_768, 32_768, flops)[0] < 32_768);
    }

    #[test]
    fn split_keeps_every_token() {
        assert_eq!(split(10, 4).collect::<Vec<_>>(), vec![4, 4, 2]);
        assert_eq!(split(8, 4).collect::<Vec<_>>(), vec![4, 4]);
        assert_eq!(split(3, 4).collect::<Vec<_>>(), vec![3]);
    }
}
