//! The forward of a pack of slices on one pipeline stage.
//!
//! The pack's per-token work runs on all its rows at once; the attention runs per slice, in
//! increasing order within each sample: a slice first appends its keys and values to its
//! sample's cache, then attends over the whole cached prefix (gathered from the group's workers
//! under context parallelism). The first stage embeds the slices' tokens; the last stage ends
//! with the head and returns the pack's share of the batch loss.

use slimpack_ir::step::Direction;

use super::attention::{attention_forward, SliceAttention};
use super::batch::{TokenBatch, TokenSlice};
use super::cp::gather::gather_prefix;
use super::error::Result;
use super::head::head_forward;
use super::layer::{post_attention_forward, pre_attention_forward, PreAttention};
use super::ops::embedding::embed;
use super::pack_layout::PackLayout;
use super::padding::padding_forward;
use super::params::Params;
use super::profile;
use super::saved::{SavedActivations, SavedLayer};
use super::saved_store::PaddingKv;
use super::stage_state::StageState;

/// What a forward pack hands on.
#[derive(Debug, Clone, PartialEq)]
pub struct ForwardOutput {
    /// Per slice (in the pack's order), the stage's output hidden states `[tokens held, hidden]`,
    /// to send to the next stage; empty on the last stage.
    pub hidden: Vec<Vec<f32>>,
    /// The pack's share of the batch's mean loss (its tokens' losses over the batch's predicted
    /// tokens); 0 except on the last stage.
    pub loss: f64,
}

impl StageState {
    /// Runs the forward of the pack `slices` on this stage with `params` (this stage's weights).
    ///
    /// `hidden_in` holds, per slice in the same order, the previous stage's output
    /// `[tokens held, hidden]` (`len` tokens unless the worker is one of a DP-Merge group);
    /// it is empty on the first stage, which embeds the slices' tokens instead. The slices may
    /// come from any samples and in any order; slices of one sample must continue exactly where
    /// that sample's forward stopped (see [`StageState`]). Saves what the slices' backward needs.
    pub fn forward_pack(
        &mut self,
        params: &Params,
        batch: &TokenBatch,
        slices: &[TokenSlice],
        hidden_in: &[Vec<f32>],
    ) -> Result<ForwardOutput> {
        self.forward_padded_pack(params, batch, slices, 0, hidden_in)
    }

    /// [`StageState::forward_pack`] of a pack padded with `padding` tokens after its slices
    /// (see [`super::padding`]): `hidden_in` and the output have one more tensor, the padding's.
    pub fn forward_padded_pack(
        &mut self,
        params: &Params,
        batch: &TokenBatch,
        slices: &[TokenSlice],
        padding: usize,
        hidden_in: &[Vec<f32>],
    ) -> Result<ForwardOutput> {
        self.check_tensors(params)?;
        self.check_forward(batch, slices, padding, hidden_in)?;
        let _timer = profile::pack_scope(Direction::Forward);
        let layout = PackLayout::new(slices, self.shard, padding);
        for index in layout.forward_order() {
            let slice = layout.slices[index];
            self.cache.begin_slice(slice.sample, slice.start, slice.len);
        }
        let mut x = match &params.embedding {
            Some(table) => embed(
                table,
                self.config.hidden,
                layout.rows(),
                layout.tokens(batch),
            ),
            None => PackLayout::concat(&hidden_in.iter().map(Vec::as_slice).collect::<Vec<_>>()),
        };
        let mut layers = Vec::with_capacity(params.layers.len());
        let mut padding_kv = Vec::new();
        for (local, layer) in params.layers.iter().enumerate() {
            let pre = pre_attention_forward(&self.config, layer, &x, &layout.positions);
            let (mut attn, mut lse) = self.attend(local, &layout, &pre)?;
            if let Some(rows) = layout.padding_rows() {
                let tensors = (&pre.q[..], &pre.k[..], &pre.v[..]);
                padding_forward(&self.config, &layout, tensors, &mut attn, &mut lse);
                let kvw = self.config.kv_width();
                let own = rows.start * kvw..rows.end * kvw;
                padding_kv.push((pre.k[own.clone()].to_vec(), pre.v[own].to_vec()));
            }
            let (y, post) = post_attention_forward(&self.config, layer, &x, &attn);
            let PreAttention {
                inv_rms, normed, q, ..
            } = pre;
            layers.push(SavedLayer {
                x,
                inv_rms,
                normed,
                q,
                attn,
                lse,
                post,
            });
            x = y;
        }
        let mut output = ForwardOutput {
            hidden: Vec::new(),
            loss: 0.0,
        };
        let head = match &params.final_norm {
            Some(final_norm) => {
                let targets = layout.targets(batch);
                let weight = params.output_weight();
                let (loss, saved) = head_forward(
                    &self.config,
                    final_norm,
                    weight,
                    x,
                    &targets,
                    batch.loss_scale(),
                );
                output.loss = loss;
                Some(saved)
            }
            None => {
                output.hidden = layout.split(&x);
                None
            }
        };
        self.finish_forward(&layout, SavedActivations { layers, head }, padding_kv);
        Ok(output)
    }

    /// The attention of local layer `layer` for every slice of the pack: appends each slice's K/V
    /// to its sample's cache and attends over the prefix. Returns `(out, lse)` for all rows.
    fn attend(
        &mut self,
        layer: usize,
        layout: &PackLayout,
        pre: &PreAttention,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let (qw, kvw, heads) = (
            self.config.q_width(),
            self.config.kv_width(),
            self.config.heads,
        );
        let mut out = vec![0.0; layout.rows() * qw];
        let mut lse = vec![0.0; layout.rows() * heads];
        for index in layout.forward_order() {
            let slice = layout.slices[index];
            let rows = layout.rows_of(index);
            let bounds = self.cache.slices_until(slice.sample, slice.end());
            let kv = self.cache.layer_mut(slice.sample, layer);
            // Exactly the rows held (no amortised growth): what the machine model counts.
            kv.keys.reserve_exact(rows.len() * kvw);
            kv.values.reserve_exact(rows.len() * kvw);
            kv.keys
                .extend_from_slice(&pre.k[rows.start * kvw..rows.end * kvw]);
            kv.values
                .extend_from_slice(&pre.v[rows.start * kvw..rows.end * kvw]);
            let gathered = match self.shard.size {
                1 => None,
                _ => Some(gather_prefix(&mut *self.exchange, &bounds, kv, kvw)?),
            };
            let (keys, values) = match &gathered {
                Some((keys, values)) => (&keys[..], &values[..]),
                None => (&kv.keys[..], &kv.values[..]),
            };
            let input = SliceAttention {
                positions: &layout.positions[rows.clone()],
                q: &pre.q[rows.start * qw..rows.end * qw],
                keys,
                values,
            };
            attention_forward(
                &self.config,
                &input,
                &mut out[rows.start * qw..rows.end * qw],
                &mut lse[rows.start * heads..rows.end * heads],
            );
        }
        Ok((out, lse))
    }

    /// Records the pack's progress and keeps its activations (and its padding's keys and values).
    fn finish_forward(
        &mut self,
        layout: &PackLayout,
        saved: SavedActivations,
        padding_kv: PaddingKv,
    ) {
        if layout.slices.is_empty() {
            return;
        }
        for slice in &layout.slices {
            let forwarded = self.cache.forwarded(slice.sample).max(slice.end());
            self.cache.finish_forward(slice.sample, forwarded);
        }
        let rows: Vec<usize> = (0..layout.slices.len())
            .map(|index| layout.rows_of(index).len())
            .collect();
        let padding = (layout.padding, padding_kv);
        self.saved
            .insert(layout.slices.clone(), rows, saved, padding);
    }
}
