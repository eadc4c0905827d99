//! How the slices of a pack map to the rows of the pack's concatenated tensors.
//!
//! A pack runs its per-token work (norms, projections, MLP, head) as one block of rows: slice
//! `i`'s tokens are rows `offsets[i]..offsets[i] + lens[i]` in the order the slices were given.
//! A worker of a context-parallel group holds only its share of each slice ([`CpShard`]): its
//! rows are those tokens, at their sample positions. Saved activations are stored per slice
//! (forward and backward packs differ), so they are split by these ranges after the forward and
//! concatenated again by the backward pack's layout.

use super::batch::{Batch, Slice};
use super::cp::CpShard;

/// Row ranges of a pack's slices in its concatenated tensors.
pub(crate) struct PackLayout {
    pub slices: Vec<Slice>,
    offsets: Vec<usize>,
    /// Rows of each slice (its tokens held by this worker).
    lens: Vec<usize>,
    /// Position in its sample of every row.
    pub positions: Vec<usize>,
}

impl PackLayout {
    /// The rows `shard` holds of each of `slices`.
    pub fn new(slices: &[Slice], shard: CpShard) -> PackLayout {
        let mut offsets = Vec::with_capacity(slices.len());
        let mut lens = Vec::with_capacity(slices.len());
        let mut positions = Vec::new();
        for slice in slices {
            offsets.push(positions.len());
            positions.extend(shard.positions(slice.start, slice.len));
            lens.push(positions.len() - offsets[offsets.len() - 1]);
        }
        PackLayout {
            slices: slices.to_vec(),
            offsets,
            lens,
            positions,
        }
    }

    /// Rows of the pack.
    pub fn rows(&self) -> usize {
        self.positions.len()
    }

    /// Row range of slice `index`.
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
    pub fn targets(&self, batch: &Batch) -> Vec<Option<u32>> {
        let mut targets = Vec::with_capacity(self.rows());
        for (index, slice) in self.slices.iter().enumerate() {
            let tokens = batch.tokens(slice.sample);
            let rows = &self.positions[self.rows_of(index)];
            targets.extend(rows.iter().map(|&p| tokens.get(p + 1).copied()));
        }
        targets
    }

    /// Token id of every row.
    pub fn tokens<'a>(&'a self, batch: &'a Batch) -> impl Iterator<Item = u32> + 'a {
        (0..self.slices.len()).flat_map(move |index| {
            let tokens = batch.tokens(self.slices[index].sample);
            self.positions[self.rows_of(index)]
                .iter()
                .map(move |&p| tokens[p])
        })
    }

    /// Splits a row-major pack tensor into one tensor per slice.
    pub fn split(&self, data: &[f32]) -> Vec<Vec<f32>> {
        let width = row_width(data, self.rows());
        (0..self.slices.len())
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
