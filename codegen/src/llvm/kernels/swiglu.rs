//! SwiGLU kernels: `y = silu(gate) ∘ up` with `silu(g) = g · σ(g)`, elementwise over `n` floats,
//! grid-stride (any grid).
//! - `slimpack_swiglu_fwd(gate, up, y, n)`.
//! - `slimpack_swiglu_bwd(gate, up, dy, d_gate, d_up, n)`: `d_up = dy · silu(g)`,
//!   `d_gate = dy · up · σ(g) · (1 + g · (1 − σ(g)))`.

use inkwell::context::Context;
use inkwell::module::Module;

use super::builder::{KernelBuilder, Result, Target};
use super::spec::{Grid, Items, KernelSpec, Param};

/// One work item per element.
const ELEMENTS: Grid = Grid::GridStride {
    items: Items {
        product_of: &["n"],
        divisor: 1,
    },
};

pub const FORWARD: KernelSpec = KernelSpec {
    name: "slimpack_swiglu_fwd",
    params: &[
        Param::f32_ptr("gate"),
        Param::f32_ptr("up"),
        Param::f32_ptr("y"),
        Param::i64("n"),
    ],
    grid: ELEMENTS,
};

pub const BACKWARD: KernelSpec = KernelSpec {
    name: "slimpack_swiglu_bwd",
    params: &[
        Param::f32_ptr("gate"),
        Param::f32_ptr("up"),
        Param::f32_ptr("dy"),
        Param::f32_ptr("d_gate"),
        Param::f32_ptr("d_up"),
        Param::i64("n"),
    ],
    grid: ELEMENTS,
};

pub(super) fn build<'ctx>(
    context: &'ctx Context,
    module: &Module<'ctx>,
    target: Target,
) -> Result<()> {
    forward(context, module, target)?;
    backward(context, module, target)
}

fn forward<'ctx>(context: &'ctx Context, module: &Module<'ctx>, target: Target) -> Result<()> {
    let kb = KernelBuilder::new(context, module, target, &FORWARD)?;
    let (gate, up, y, n) = (kb.ptr("gate"), kb.ptr("up"), kb.ptr("y"), kb.int("n"));
    kb.grid_stride_loop(n, |kb, i| {
        let g = kb.load_f32(gate, i)?;
        let silu = kb.fmul(g, kb.sigmoid(g)?)?;
        kb.store_f32(y, i, kb.fmul(silu, kb.load_f32(up, i)?)?)
    })?;
    kb.finish()
}

fn backward<'ctx>(context: &'ctx Context, module: &Module<'ctx>, target: Target) -> Result<()> {
    let kb = KernelBuilder::new(context, module, target, &BACKWARD)?;
    let (gate, up, dy) = (kb.ptr("gate"), kb.ptr("up"), kb.ptr("dy"));
    let (d_gate, d_up, n) = (kb.ptr("d_gate"), kb.ptr("d_up"), kb.int("n"));
    kb.grid_stride_loop(n, |kb, i| {
        let g = kb.load_f32(gate, i)?;
        let u = kb.load_f32(up, i)?;
        let grad = kb.load_f32(dy, i)?;
        let sigma = kb.sigmoid(g)?;
        let silu = kb.fmul(g, sigma)?;
        kb.store_f32(d_up, i, kb.fmul(grad, silu)?)?;
        let one = kb.f32(1.0);
        let slope = kb.fmul(sigma, kb.fadd(one, kb.fmul(g, kb.fsub(one, sigma)?)?)?)?;
        kb.store_f32(d_gate, i, kb.fmul(kb.fmul(grad, u)?, slope)?)
    })?;
    kb.finish()
}
