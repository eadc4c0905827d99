//! How the slices of a pack map to the rows of the pack's concatenated tensors.
//!
//! A pack runs its per-token work (norms, projections, MLP, head) as one block of rows: slice
//! `i`'s tokens are rows `offsets[i]..offsets[i] + lens[i]` in the order the slices were given.
//! A worker of a context-parallel group holds only its share of each slice ([`CpShard`]): its
//! rows are those tokens, at their sample positions. Saved activations are stored per slice
//! (forward and backward packs differ), so they are split by these ranges after the forward and
//! concatenated again by the backward pack's layout.
//!
//! A padded pack (a micro-batch padded to a fixed length) has padding rows after its slices: as
//! many tokens as the padding, positioned after the pack's own tokens as one more segment (a
//! worker of a group holds its share of them too). They have token 0 and no target.

use super::batch::{TokenBatch, TokenSlice};
use super::cp::CpShard;

/// Row ranges of a pack's slices in its concatenated tensors.
pub(crate) struct PackLayout {
    pub slices: Vec<TokenSlice>,
    offsets: Vec<usize>,
    /// Rows of each slice (its tokens held by this worker).
    lens: Vec<usize>,
    /// Position in its sample of every row (for padding rows: in the padded pack's sequence).
    pub positions: Vec<usize>,
    /// Padding tokens after the slices, over the whole group (0: not padded).
    pub padding: usize,
}

impl PackLayout {
    /// The rows `shard` holds of each of `slices`, then of `padding` padding tokens.
    pub fn new(slices: &[TokenSlice], shard: CpShard, padding: usize) -> PackLayout {
        let mut offsets = Vec::with_capacity(slices.len() + 1);
        let mut lens = Vec::with_capacity(slices.len() + 1);
        let mut positions = Vec::new();
        let mut segment = |start: usize, len: usize| {
            offsets.push(positions.len());
            positions.extend(shard.positions(start, len));
            lens.push(positions.len() - offsets[offsets.len() - 1]);
        };
        for slice in slices {
            segment(slice.start, slice.len);
        }
        if padding > 0 {
            segment(slices.iter().map(|s| s.len).sum(), padding);
        }
        PackLayout {
            slices: slices.to_vec(),
            offsets,
            lens,
            positions,
            padding,
        }
    }

    /// Row segments: one per slice, then the padding's if the pack is padded.
    pub fn segments(&self) -> usize {
        self.offsets.len()
    }

    /// The padding's rows, if the pack is padded.
    pub fn padding_rows(&self) -> Option<std::ops::Range<usize>> {
        (self.padding > 0).then(|| self.rows_of(self.slices.len()))
    }

    /// Tokens of the padded pack's sequence: its slices' and its padding.
    pub fn sequence_len(&self) -> usize {
        self.slices.iter().map(|s| s.len).sum::<usize>() + self.padding
    }

    /// Rows of the pack.
    pub fn rows(&self) -> usize {
        self.positions.len()
    }

    /// Row range of segment `index` (slice `index`, or the padding after the last slice).
    pub fn rows_of(&self, index: usize) -> std::ops::Range<usize> {
        self.offsets[index]..self.offsets[index] + self.lens[index]
    }

    /// Indices of the slices ordered by sample, then start (the forward's order within a sample).
    pub fn forward_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.slices.len()).collect();
        order.sort_by_key(|&i| (self.slices[i].sample, self.slices[i].start));
        order
    }

    /// Indices of the slices ordered by sample, then decreasing start (the backward's order).
    pub fn backward_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.slices.len()).collect();
        order.sort_by_key(|&i| {
            (
                self.slices[i].sample,
                std::cmp::Reverse(self.slices[i].start),
            )
        });
        order
    }

    /// Next-token target of every row.
    pub fn targets(&self, batch: &TokenBatch) -> Vec<Option<u32>> {
        let mut targets = Vec::with_capacity(self.rows());
        for (index, slice) in self.slices.iter().enumerate() {
            let tokens = batch.tokens(slice.sample);
            let rows = &self.positions[self.rows_of(index)];
            targets.extend(rows.iter().map(|&p| tokens.get(p + 1).copied()));
        }
        let padding = self.padding_rows().map_or(0, |rows| rows.len());
        targets.extend(std::iter::repeat_n(None, padding));
        targets
    }

    /// Token id of every row (0 for padding).
    pub fn tokens<'a>(&'a self, batch: &'a TokenBatch) -> impl Iterator<Item = u32> + 'a {
        let padding = self.padding_rows().map_or(0, |rows| rows.len());
        let real = (0..self.slices.len()).flat_map(move |index| {
            let tokens = batch.tokens(self.slices[index].sample);
            self.positions[self.rows_of(index)]
                .iter()
                .map(move |&p| tokens[p])
        });
        real.chain(std::iter::repeat_n(0, padding))
    }

    /// Splits a row-major pack tensor into one tensor per segment.
    pub fn split(&self, data: &[f32]) -> Vec<Vec<f32>> {
        let width = row_width(data, self.rows());
        (0..self.segments())
            .map(|i| {
                let rows = self.rows_of(i);
                data[rows.start * width..rows.end * width].to_vec()
            })
            .collect()
    }

    /// Concatenates per-slice tensors into one row-major pack tensor.
    pub fn concat(parts: &[&[f32]]) -> Vec<f32> {
        let mut data = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
        for part in parts {
            data.extend_from_slice(part);
        }
        data
    }
}

/// Values per row of a tensor of `rows` rows.
pub(crate) fn row_width(data: &[f32], rows: usize) -> usize {
    if rows == 0 {
        return 0;
    }
    assert_eq!(
        data.len() % rows,
        0,
        "bug: tensor is not a whole number of rows"
    );
    data.len() / rows
}
