//! The backward of a pack of slices on one pipeline stage.
//!
//! The pack gathers its slices' saved activations into one block and runs the per-token
//! backward on all rows at once. Per layer, the attention backward runs per slice in decreasing
//! order within each sample: a slice computes the gradient of its queries and adds the gradients
//! of the keys and values of its whole prefix into the sample's accumulators; its own rows of
//! those accumulators are then complete (only later slices' queries, all backwarded by now, see
//! its keys) and flow on into its K/V projections. Under context parallelism each worker gathers
//! the prefix K/V, computes its queries' share of the prefix's K/V gradients, and the group sums
//! those shares into each owner's accumulators (see [`super::cp`]). The last stage starts from
//! the loss; the first stage ends in the embedding's gradient.

use std::collections::BTreeMap;

use slimpack_ir::step::Direction;

use super::attention::{attention_backward, SliceAttention};
use super::batch::{SampleId, TokenBatch, TokenSlice};
use super::cp::gather::{gather_prefix, scatter_add_grads};
use super::error::Result;
use super::head::head_backward;
use super::layer::{post_attention_backward, pre_attention_backward};
use super::ops::embedding::embed_backward;
use super::pack_layout::PackLayout;
use super::padding::padding_backward;
use super::params::{Grads, Params};
use super::profile;
use super::saved::SavedLayer;
use super::stage_state::StageState;
use super::weight_grad::{DeferredWeightGrads, WeightGrads};

impl StageState {
    /// Runs the backward of the pack `slices` on this stage: adds the gradients of this stage's
    /// weights into `grads` and returns, per slice in the pack's order, the gradient of the
    /// stage's input hidden states `[tokens held, hidden]` to send to the previous stage (empty on
    /// the first stage).
    ///
    /// `grad_out` holds, per slice in the same order, the gradient of this stage's output received
    /// from the next stage; it is empty on the last stage, which starts from the loss. Every slice
    /// must have been forwarded on this stage with exactly these bounds, its sample fully
    /// forwarded, and a sample's slices are backwarded from its last token down (see
    /// [`StageState`]).
    pub fn backward_pack(
        &mut self,
        params: &Params,
        grads: &mut Grads,
        batch: &TokenBatch,
        slices: &[TokenSlice],
        grad_out: &[Vec<f32>],
    ) -> Result<Vec<Vec<f32>>> {
        self.backward_padded_pack(params, grads, batch, slices, 0, grad_out)
    }

    /// [`StageState::backward_pack`] of a pack padded with `padding` tokens (see
    /// [`super::padding`]): it takes the padding of the forward pack of the same slices, and
    /// `grad_out` and the result have one more tensor, the padding's.
    pub fn backward_padded_pack(
        &mut self,
        params: &Params,
        grads: &mut Grads,
        batch: &TokenBatch,
        slices: &[TokenSlice],
        padding: usize,
        grad_out: &[Vec<f32>],
    ) -> Result<Vec<Vec<f32>>> {
        let now = &mut WeightGrads::Now;
        self.backward_with(params, grads, batch, slices, padding, grad_out, now)
    }

    /// The input-gradient part of [`StageState::backward_padded_pack`] (a zero-bubble
    /// schedule's split backward): the same, but the layers' weight-gradient GEMMs are kept
    /// for [`DeferredWeightGrads::add_into`] instead of run (see [`super::weight_grad`]).
    #[allow(clippy::too_many_arguments)]
    pub fn backward_input_padded_pack(
        &mut self,
        params: &Params,
        grads: &mut Grads,
        batch: &TokenBatch,
        slices: &[TokenSlice],
        padding: usize,
        grad_out: &[Vec<f32>],
    ) -> Result<(Vec<Vec<f32>>, DeferredWeightGrads)> {
        let mut kept = WeightGrads::deferred();
        let out = self.backward_with(params, grads, batch, slices, padding, grad_out, &mut kept)?;
        Ok((out, kept.into_deferred()))
    }

    #[allow(clippy::too_many_arguments)]
    fn backward_with(
        &mut self,
        params: &Params,
        grads: &mut Grads,
        batch: &TokenBatch,
        slices: &[TokenSlice],
        padding: usize,
        grad_out: &[Vec<f32>],
        weight_grads: &mut WeightGrads,
    ) -> Result<Vec<Vec<f32>>> {
        self.check_tensors(params)?;
        self.check_tensors(grads)?;
        self.check_backward(batch, slices, padding, grad_out)?;
        if slices.is_empty() {
            return Ok(Vec::new());
        }
        let _timer = profile::pack_scope(Direction::Backward);
        // Rows in the order the forward saved them (no copy when the pack is a forward pack).
        let (order, mut saved, padding_kv) = self.saved.take(slices);
        // Every layer's dK/dV accumulators of the pack's samples exist from the pack's start
        // (as the machine model allocates them), not layer by layer.
        for slice in slices {
            for layer in 0..params.layers.len() {
                self.cache.layer_for_backward(slice.sample, layer);
            }
        }
        let layout = PackLayout::new(&order, self.shard, padding);
        let position = |slice: &TokenSlice| {
            slices
                .iter()
                .position(|s| s == slice)
                .expect("bug: the saved order holds the pack's slices")
        };
        let mut inputs: Vec<&[f32]> = Vec::with_capacity(grad_out.len());
        if !grad_out.is_empty() {
            inputs.extend(order.iter().map(|s| grad_out[position(s)].as_slice()));
            inputs.extend(grad_out.get(slices.len()).map(Vec::as_slice));
        }
        let mut dy = match (saved.head.take(), &params.final_norm) {
            (Some(head), Some(final_norm)) => {
                let targets = layout.targets(batch);
                let (d_final_norm, d_output) = grads.head_mut();
                let weight = params.output_weight();
                let scale = batch.loss_scale();
                head_backward(
                    &self.config,
                    final_norm,
                    weight,
                    head,
                    &targets,
                    scale,
                    d_final_norm,
                    d_output,
                )
            }
            _ => PackLayout::concat(&inputs),
        };
        for local in (0..params.layers.len()).rev() {
            let layer_saved = saved
                .layers
                .pop()
                .expect("bug: saved activations of every layer");
            dy = self.layer_backward(
                params,
                grads,
                (local, weight_grads),
                &layout,
                layer_saved,
                &dy,
            )?;
        }
        self.finish_backward(&layout);
        drop(padding_kv);
        match grads.embedding.as_mut() {
            Some(d_table) => {
                embed_backward(d_table, self.config.hidden, layout.tokens(batch), &dy);
                Ok(Vec::new())
            }
            None => {
                // Back to the caller's slice order (the padding's tensor stays last).
                let mut parts: Vec<Option<Vec<f32>>> =
                    layout.split(&dy).into_iter().map(Some).collect();
                let mut out: Vec<Vec<f32>> = slices
                    .iter()
                    .map(|slice| {
                        let index = order.iter().position(|s| s == slice).expect("same slices");
                        parts[index].take().expect("each slice once")
                    })
                    .collect();
                out.extend(parts.into_iter().skip(slices.len()).flatten());
                Ok(out)
            }
        }
    }

    /// Drops the K/V rows of the backwarded tokens; retires samples whose backward finished.
    fn finish_backward(&mut self, layout: &PackLayout) {
        let mut new_frontier: BTreeMap<SampleId, usize> = BTreeMap::new();
        for slice in &layout.slices {
            let start = new_frontier.entry(slice.sample).or_insert(slice.start);
            *start = (*start).min(slice.start);
        }
        for (sample, start) in new_frontier {
            self.cache.finish_backward(sample, start);
            if start == 0 {
                self.retired.insert(sample);
            }
        }
    }

    /// Backward of local layer `local` for the pack's rows; returns the gradient of its input.
    fn layer_backward(
        &mut self,
        params: &Params,
        grads: &mut Grads,
        (local, weight_grads): (usize, &mut WeightGrads),
        layout: &PackLayout,
        saved: SavedLayer,
        dy: &[f32],
    ) -> Result<Vec<f32>> {
        let (layer, layer_grads) = (&params.layers[local], &mut grads.layers[local]);
        let (d_attn, mut dx) = post_attention_backward(
            &self.config,
            layer,
            layer_grads,
            (local, &mut *weight_grads),
            &saved.attn,
            &saved.post,
            dy,
        );
        let (mut dq, dk, dv) = self.attend_backward(local, layout, &saved, &d_attn)?;
        let padding = (&saved.q[..], &saved.attn[..], &saved.lse[..], &d_attn[..]);
        padding_backward(&self.config, layout, padding, &mut dq);
        let dx_pre = pre_attention_backward(
            &self.config,
            layer,
            layer_grads,
            (local, weight_grads),
            &saved.x,
            &saved.inv_rms,
            &saved.normed,
            &layout.positions,
            dq,
            dk,
            dv,
        );
        dx.iter_mut().zip(&dx_pre).for_each(|(d, &p)| *d += p);
        Ok(dx)
    }

    /// Attention backward of every slice of the pack on local layer `layer`: returns the
    /// gradients of the pack's own queries, keys and values (keys and values complete, including
    /// the contributions of later slices accumulated in the cache).
    fn attend_backward(
        &mut self,
        layer: usize,
        layout: &PackLayout,
        saved: &SavedLayer,
        d_attn: &[f32],
    ) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
        let (qw, kvw, heads) = (
            self.config.q_width(),
            self.config.kv_width(),
            self.config.heads,
        );
        let mut dq = vec![0.0; layout.rows() * qw];
        for index in layout.backward_order() {
            let slice = layout.slices[index];
            let rows = layout.rows_of(index);
            let q_rows = rows.start * qw..rows.end * qw;
            let bounds = self.cache.slices_until(slice.sample, slice.end());
            let kv = self.cache.layer_for_backward(slice.sample, layer);
            let sharded = self.shard.size > 1;
            let gathered = match sharded {
                true => Some(gather_prefix(&mut *self.exchange, &bounds, kv, kvw)?),
                false => None,
            };
            let (keys, values) = match &gathered {
                Some((keys, values)) => (&keys[..], &values[..]),
                None => (&kv.keys[..], &kv.values[..]),
            };
            let prefix = slice.end() * kvw;
            let input = SliceAttention {
                positions: &layout.positions[rows.clone()],
                q: &saved.q[q_rows.clone()],
                keys: &keys[..prefix],
                values: &values[..prefix],
            };
            let heads_rows = rows.start * heads..rows.end * heads;
            let (out, lse, d_out) = (
                &saved.attn[q_rows.clone()],
                &saved.lse[heads_rows],
                &d_attn[q_rows.clone()],
            );
            if !sharded {
                attention_backward(
                    &self.config,
                    &input,
                    out,
                    lse,
                    d_out,
                    &mut dq[q_rows],
                    &mut kv.key_grads[..prefix],
                    &mut kv.value_grads[..prefix],
                );
                continue;
            }
            let (mut d_keys, mut d_values) = match rows.is_empty() {
                true => (Vec::new(), Vec::new()),
                false => (vec![0.0; prefix], vec![0.0; prefix]),
            };
            if !rows.is_empty() {
                attention_backward(
                    &self.config,
                    &input,
                    out,
                    lse,
                    d_out,
                    &mut dq[q_rows],
                    &mut d_keys,
                    &mut d_values,
                );
            }
            drop(gathered);
            scatter_add_grads(&mut *self.exchange, &bounds, d_keys, d_values, kv, kvw)?;
        }
        let mut dk = vec![0.0; layout.rows() * kvw];
        let mut dv = vec![0.0; layout.rows() * kvw];
        for (index, slice) in layout.slices.iter().enumerate() {
            let rows = layout.rows_of(index);
            let first_row = self.cache.rows_before(slice.sample, slice.start);
            let kv = self.cache.layer_for_backward(slice.sample, layer);
            let own = first_row * kvw..(first_row + rows.len()) * kvw;
            dk[rows.start * kvw..rows.end * kvw].copy_from_slice(&kv.key_grads[own.clone()]);
            dv[rows.start * kvw..rows.end * kvw].copy_from_slice(&kv.value_grads[own]);
        }
        Ok((dq, dk, dv))
    }
}
