//! Padded packs: a micro-batch padded to a fixed length, as a trainer without sequence packing
//! runs it. The padding tokens follow the pack's slices as one sequence and attend causally to
//! everything before them; they have no target, so they add nothing to the loss, and their
//! output gradient — hence every gradient they pass on — is exactly zero. What they cost is
//! real: their rows go through every projection, norm and MLP, their attention runs over the
//! whole padded sequence, and their activations and K/V stay saved from the forward to the
//! backward, like a slice's.
//!
//! Because no real token reads a padding token and the padding's gradients are zero, the keys
//! the padding attends to only have to have the right shape: a worker of a DP-Merge group, which
//! holds only its share of the pack's keys, and every backward use zero-filled stand-ins of the
//! padded sequence's length (the same work, no effect on any value that leaves the pack).
//!
//! A padded backward pack takes the saved padding of the forward pack with the same slices
//! (padding is used with symmetric packs; see [`super::saved_store`]).

use super::attention::{attention_backward, attention_forward, SliceAttention};
use super::config::ModelConfig;
use super::pack_layout::PackLayout;

/// The padding rows' attention in the forward: writes their output and log-sum-exp. `keys`
/// and `values` are the pack's rows (the whole padded sequence for a worker of one).
pub(crate) fn padding_forward(
    config: &ModelConfig,
    layout: &PackLayout,
    (q, keys, values): (&[f32], &[f32], &[f32]),
    out: &mut [f32],
    lse: &mut [f32],
) {
    let Some(rows) = layout.padding_rows().filter(|rows| !rows.is_empty()) else {
        return;
    };
    let (qw, kvw, heads) = (config.q_width(), config.kv_width(), config.heads);
    let sequence = layout.sequence_len() * kvw;
    let stand_in;
    let (keys, values) = if keys.len() == sequence {
        (keys, values)
    } else {
        stand_in = vec![0.0; sequence];
        (&stand_in[..], &stand_in[..])
    };
    let input = SliceAttention {
        positions: &layout.positions[rows.clone()],
        q: &q[rows.start * qw..rows.end * qw],
        keys,
        values,
    };
    attention_forward(
        config,
        &input,
        &mut out[rows.start * qw..rows.end * qw],
        &mut lse[rows.start * heads..rows.end * heads],
    );
}

/// The padding rows' attention backward: the same work as the forward's, against zero stand-in
/// keys; writes the padding rows' (zero) query gradients.
pub(crate) fn padding_backward(
    config: &ModelConfig,
    layout: &PackLayout,
    (q, out, lse, d_out): (&[f32], &[f32], &[f32], &[f32]),
    dq: &mut [f32],
) {
    let Some(rows) = layout.padding_rows().filter(|rows| !rows.is_empty()) else {
        return;
    };
    let (qw, heads) = (config.q_width(), config.heads);
    let sequence = layout.sequence_len() * config.kv_width();
    let stand_in = vec![0.0; sequence];
    let (mut d_keys, mut d_values) = (vec![0.0; sequence], vec![0.0; sequence]);
    let q_rows = rows.start * qw..rows.end * qw;
    let input = SliceAttention {
        positions: &layout.positions[rows.clone()],
        q: &q[q_rows.clone()],
        keys: &stand_in,
        values: &stand_in,
    };
    attention_backward(
        config,
        &input,
        &out[q_rows.clone()],
        &lse[rows.start * heads..rows.end * heads],
        &d_out[q_rows.clone()],
        &mut dq[q_rows],
        &mut d_keys,
        &mut d_values,
    );
}
