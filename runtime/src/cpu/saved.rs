//! Activations a slice's forward saves for its backward, on one stage.
//!
//! Everything is per token (one row per token), so the activations a forward pack computed as one
//! block are split into per-slice records, and a backward pack — a different set of slices —
//! concatenates its slices' records back into one block. Per layer a slice keeps: the layer input,
//! the pre-attention norm (inverse RMS and output), Q after RoPE, the attention output and its
//! log-sum-exp per head, and the MLP block's inputs (residual, norm, gate and up projections).
//! Keys and values live in the K/V cache instead, because later slices read them too.

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
    /// Splits a pack's activations into one record per segment of `layout` (its slices, then its
    /// padding). Field by field, so
    /// that at most one field exists twice at a time; a pack of one slice keeps its tensors.
    pub fn split(self, layout: &PackLayout) -> Vec<SavedActivations> {
        let (layers, has_head) = (self.layers.len(), self.head.is_some());
        let count = layout.segments();
        let mut per_slice: Vec<Vec<Vec<f32>>> = vec![Vec::new(); count];
        for field in self.into_fields() {
            if count == 1 {
                per_slice[0].push(field);
                continue;
            }
            for (fields, part) in per_slice.iter_mut().zip(layout.split(&field)) {
                fields.push(part);
            }
        }
        per_slice
            .into_iter()
            .map(|fields| SavedActivations::from_fields(fields, layers, has_head))
            .collect()
    }

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

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        let mut bytes = 0;
        for layer in &self.layers {
            let post = &layer.post;
            for field in [
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
            ] {
                bytes += field.capacity() * 4;
            }
        }
        if let Some(head) = &self.head {
            let fields = [&head.x, &head.inv_rms, &head.normed, &head.probs];
            bytes += fields.iter().map(|f| f.capacity() * 4).sum::<usize>();
        }
        bytes
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
