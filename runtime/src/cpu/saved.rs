//! Activations a slice's forward saves for its backward, on one stage.
//!
//! Everything is per token (one row per token): a forward pack's activations are one block of
//! rows, which [`super::saved_store`] keeps, and a backward pack — possibly a different set of
//! slices — selects and joins the rows of its slices. Per layer a slice keeps: the layer input,
//! the pre-attention norm (inverse RMS and output), Q after RoPE, the attention output and its
//! log-sum-exp per head, and the MLP block's tensors (residual, norm, gate and up projections,
//! SwiGLU's output); the last stage also keeps the head's (final norm input and output, the
//! loss's softmax). These are the tensors the machine model's memory counts per token. Keys and
//! values live in the K/V cache instead, because later slices read them too.

use std::fmt;

use super::head::SavedHead;
use super::layer::PostAttention;
use super::pack_layout::PackLayout;

/// One layer's saved activations for a block of token rows.
pub(crate) struct SavedLayer {
    pub x: Vec<f32>,
    pub inv_rms: Vec<f32>,
    pub normed: Vec<f32>,
    pub q: Vec<f32>,
    pub attn: Vec<f32>,
    pub lse: Vec<f32>,
    pub post: PostAttention,
}

/// A slice's (or a pack's) saved activations on a stage: per layer, and the head's on the last
/// stage.
pub(crate) struct SavedActivations {
    pub layers: Vec<SavedLayer>,
    pub head: Option<SavedHead>,
}

impl fmt::Debug for SavedActivations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SavedActivations({} bytes)", self.bytes())
    }
}

impl SavedActivations {
    /// Concatenates the records of a pack's slices (in the pack's order) into one block. Field
    /// by field, freeing the pieces of each field as it is joined; one record is kept as is.
    pub fn concat(parts: Vec<SavedActivations>) -> SavedActivations {
        let (layers, has_head) = (parts[0].layers.len(), parts[0].head.is_some());
        let mut per_field: Vec<Vec<Vec<f32>>> = Vec::new();
        for fields in parts.into_iter().map(Self::into_fields) {
            per_field.resize_with(fields.len(), Vec::new);
            for (pieces, field) in per_field.iter_mut().zip(fields) {
                pieces.push(field);
            }
        }
        let fields = per_field
            .into_iter()
            .map(|mut pieces| match pieces.len() {
                1 => pieces.pop().expect("one piece"),
                _ => {
                    let slices: Vec<&[f32]> = pieces.iter().map(Vec::as_slice).collect();
                    PackLayout::concat(&slices)
                }
            })
            .collect();
        SavedActivations::from_fields(fields, layers, has_head)
    }

    /// Moves the rows `ranges` (disjoint, ascending) out into a block of their own, in that
    /// order, and closes the gap they leave, field by field in place (the remaining rows keep
    /// their buffers: no second copy of them exists at any time).
    pub fn take_rows(&mut self, ranges: &[std::ops::Range<usize>]) -> SavedActivations {
        let rows = self.rows();
        let taken: usize = ranges.iter().map(|r| r.len()).sum();
        let (layers, has_head) = (self.layers.len(), self.head.is_some());
        let mut fields = Vec::new();
        for field in self.fields_mut() {
            let width = super::pack_layout::row_width(field, rows);
            let mut out = Vec::with_capacity(taken * width);
            for range in ranges {
                out.extend_from_slice(&field[range.start * width..range.end * width]);
            }
            let mut kept = 0;
            let mut next = 0;
            for range in ranges.iter().chain(std::iter::once(&(rows..rows))) {
                let keep = next..range.start;
                field.copy_within(keep.start * width..keep.end * width, kept * width);
                kept += keep.len();
                next = range.end;
            }
            field.truncate(kept * width);
            field.shrink_to_fit();
            fields.push(out);
        }
        SavedActivations::from_fields(fields, layers, has_head)
    }

    /// Token rows of the block.
    pub fn rows(&self) -> usize {
        match (self.layers.first(), &self.head) {
            (Some(layer), _) => layer.inv_rms.len(),
            (None, Some(head)) => head.inv_rms.len(),
            (None, None) => 0,
        }
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        self.fields().iter().map(|field| field.capacity() * 4).sum()
    }

    /// Every tensor, in the order of [`SavedActivations::into_fields`].
    fn fields(&self) -> Vec<&Vec<f32>> {
        let mut fields = Vec::new();
        for layer in &self.layers {
            let post = &layer.post;
            fields.extend([
                &layer.x,
                &layer.inv_rms,
                &layer.normed,
                &layer.q,
                &layer.attn,
                &layer.lse,
                &post.mid,
                &post.inv_rms,
                &post.normed,
                &post.gate,
                &post.up,
                &post.activation,
            ]);
        }
        if let Some(head) = &self.head {
            fields.extend([&head.x, &head.inv_rms, &head.normed, &head.probs]);
        }
        fields
    }

    /// Every tensor, mutably, in the order of [`SavedActivations::into_fields`].
    fn fields_mut(&mut self) -> Vec<&mut Vec<f32>> {
        let mut fields = Vec::new();
        for layer in &mut self.layers {
            let post = &mut layer.post;
            fields.extend([
                &mut layer.x,
                &mut layer.inv_rms,
                &mut layer.normed,
                &mut layer.q,
                &mut layer.attn,
                &mut layer.lse,
                &mut post.mid,
                &mut post.inv_rms,
                &mut post.normed,
                &mut post.gate,
                &mut post.up,
                &mut post.activation,
            ]);
        }
        if let Some(head) = &mut self.head {
            fields.extend([
                &mut head.x,
                &mut head.inv_rms,
                &mut head.normed,
                &mut head.probs,
            ]);
        }
        fields
    }

    fn into_fields(self) -> Vec<Vec<f32>> {
        let mut fields = Vec::new();
        for layer in self.layers {
            let post = layer.post;
            fields.extend([
                layer.x,
                layer.inv_rms,
                layer.normed,
                layer.q,
                layer.attn,
                layer.lse,
                post.mid,
                post.inv_rms,
                post.normed,
                post.gate,
                post.up,
                post.activation,
            ]);
        }
        if let Some(head) = self.head {
            fields.extend([head.x, head.inv_rms, head.normed, head.probs]);
        }
        fields
    }

    fn from_fields(fields: Vec<Vec<f32>>, layers: usize, has_head: bool) -> SavedActivations {
        let mut fields = fields.into_iter();
        let mut next = || fields.next().expect("bug: saved activations lost a field");
        let layers = (0..layers)
            .map(|_| SavedLayer {
                x: next(),
                inv_rms: next(),
                normed: next(),
                q: next(),
                attn: next(),
                lse: next(),
                post: PostAttention {
                    mid: next(),
                    inv_rms: next(),
                    normed: next(),
                    gate: next(),
                    up: next(),
                    activation: next(),
                },
            })
            .collect();
        let head = has_head.then(|| SavedHead {
            x: next(),
            inv_rms: next(),
            normed: next(),
            probs: next(),
        });
        SavedActivations { layers, head }
    }
}
