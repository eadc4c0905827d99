//! SwiGLU kernels: `y = silu(gate) ∘ up` with `silu(g) = g · σ(g)`, elementwise over `n` floats,
//! grid-stride (any grid).
//! - `slimpack_swiglu_fwd(gate, up, y, n)`.
//! - `slimpack_swiglu_bwd(gate, up, dy, d_gate, d_up, n)`: `d_up = dy · silu(g)`,
//!   `d_gate = dy · up · σ(g) · (1 + g · (1 − σ(g)))`.

use inkwell::context::Context;
use inkwell::module::Module;

use super::builder::{KernelBuilder, Param, Result};

pub(super) fn build<'ctx>(context: &'ctx Context, module: &Module<'ctx>) -> Result<()> {
    forward(context, module)?;
    backward(context, module)
}

fn forward<'ctx>(context: &'ctx Context, module: &Module<'ctx>) -> Result<()> {
    use Param::*;
    let kb = KernelBuilder::new(
        context,
        module,
        "slimpack_swiglu_fwd",
        &[F32Ptr, F32Ptr, F32Ptr, I64],
    );
    let (gate, up, y, n) = (kb.ptr(0), kb.ptr(1), kb.ptr(2), kb.int(3));
    kb.grid_stride_loop(n, |kb, i| {
        let g = kb.load_f32(gate, i)?;
        let silu = kb.fmul(g, kb.sigmoid(g)?)?;
        kb.store_f32(y, i, kb.fmul(silu, kb.load_f32(up, i)?)?)
    })?;
    kb.finish()
}

fn backward<'ctx>(context: &'ctx Context, module: &Module<'ctx>) -> Result<()> {
    use Param::*;
    let kb = KernelBuilder::new(
        context,
        module,
        "slimpack_swiglu_bwd",
        &[F32Ptr, F32Ptr, F32Ptr, F32Ptr, F32Ptr, I64],
    );
    let (gate, up, dy, d_gate, d_up) = (kb.ptr(0), kb.ptr(1), kb.ptr(2), kb.ptr(3), kb.ptr(4));
    let n = kb.int(5);
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
