//! Rotary position embedding kernels, Llama's "rotate half" convention (as the CPU backend's
//! `rope_forward`/`rope_backward`).
//!
//! `x` holds `tokens` rows of `heads · head_dim` floats; `positions[t]` (int32) is token `t`'s
//! position in its sample, so a packed varlen batch passes its per-slice position offsets here.
//! The angles come from tables the host fills once, in f64 like the CPU backend:
//! `cos[p · half + i] = cos(p · theta^(-2i/head_dim))` and `sin` likewise, `half = head_dim / 2`.
//! One thread per rotated pair, grid-stride (any grid); `y` may alias `x`.
//! - `slimpack_rope_fwd(x, y, cos, sin, positions, tokens, heads, head_dim)`:
//!   `y[i] = x[i]·cos − x[i+half]·sin`, `y[i+half] = x[i+half]·cos + x[i]·sin`.
//! - `slimpack_rope_bwd(x = dy, y = dx, cos, sin, positions, tokens, heads, head_dim)`: the rotation by
//!   the opposite angle (the transpose), turning the rotated values' gradient into the inputs'.

use inkwell::context::Context;
use inkwell::module::Module;

use super::builder::{KernelBuilder, Result, Target};
use super::spec::{Grid, Items, KernelSpec, Param};

/// One work item per rotated pair.
const PAIRS: Grid = Grid::GridStride {
    items: Items {
        product_of: &["tokens", "heads", "head_dim"],
        divisor: 2,
    },
};

pub const FORWARD: KernelSpec = KernelSpec {
    name: "slimpack_rope_fwd",
    params: &[
        Param::f32_ptr("x"),
        Param::f32_ptr("y"),
        Param::f32_ptr("cos"),
        Param::f32_ptr("sin"),
        Param::i32_ptr("positions"),
        Param::i64("tokens"),
        Param::i64("heads"),
        Param::i64("head_dim"),
    ],
    grid: PAIRS,
};

/// Parameters named as [`FORWARD`]'s: `x` is the gradient `dy`, `y` receives `dx`.
pub const BACKWARD: KernelSpec = KernelSpec {
    name: "slimpack_rope_bwd",
    ..FORWARD
};

pub(super) fn build<'ctx>(
    context: &'ctx Context,
    module: &Module<'ctx>,
    target: Target,
) -> Result<()> {
    rotate(context, module, target, &FORWARD, false)?;
    rotate(context, module, target, &BACKWARD, true)
}

fn rotate<'ctx>(
    context: &'ctx Context,
    module: &Module<'ctx>,
    target: Target,
    spec: &'static KernelSpec,
    inverse: bool,
) -> Result<()> {
    let kb = KernelBuilder::new(context, module, target, spec)?;
    let (x, y, positions) = (kb.ptr("x"), kb.ptr("y"), kb.ptr("positions"));
    let (cos, sin) = (kb.ptr("cos"), kb.ptr("sin"));
    let (tokens, heads, head_dim) = (kb.int("tokens"), kb.int("heads"), kb.int("head_dim"));

    let half = kb.divrem(head_dim, kb.i64(2))?.0;
    let pairs = kb.mul(kb.mul(tokens, heads)?, half)?;
    kb.grid_stride_loop(pairs, |kb, pair| {
        let (token_head, i) = kb.divrem(pair, half)?;
        let token = kb.divrem(token_head, heads)?.0;
        let position = kb.load_i32(positions, token)?;
        let angle_at = kb.add(kb.mul(position, half)?, i)?;
        let cos_angle = kb.load_f32(cos, angle_at)?;
        let mut sin_angle = kb.load_f32(sin, angle_at)?;
        if inverse {
            sin_angle = kb.fneg(sin_angle)?;
        }
        let low = kb.add(kb.mul(token_head, head_dim)?, i)?;
        let high = kb.add(low, half)?;
        let a = kb.load_f32(x, low)?;
        let b = kb.load_f32(x, high)?;
        let rotated_low = kb.fsub(kb.fmul(a, cos_angle)?, kb.fmul(b, sin_angle)?)?;
        let rotated_high = kb.fadd(kb.fmul(b, cos_angle)?, kb.fmul(a, sin_angle)?)?;
        kb.store_f32(y, low, rotated_low)?;
        kb.store_f32(y, high, rotated_high)
    })?;
    kb.finish()
}
