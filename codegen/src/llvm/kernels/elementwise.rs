//! Elementwise kernels over `n` floats, grid-stride (any grid); outputs may alias inputs.
//! - `slimpack_add(a, b, out, n)`: `out = a + b` (residual adds, gradient accumulation).
//! - `slimpack_scale(x, out, alpha, n)`: `out = alpha · x` (loss scaling, gradient averaging).

use inkwell::context::Context;
use inkwell::module::Module;

use super::builder::{KernelBuilder, Param, Result};

pub(super) fn build<'ctx>(context: &'ctx Context, module: &Module<'ctx>) -> Result<()> {
    use Param::*;
    let kb = KernelBuilder::new(
        context,
        module,
        "slimpack_add",
        &[F32Ptr, F32Ptr, F32Ptr, I64],
    );
    let (a, b, out, n) = (kb.ptr(0), kb.ptr(1), kb.ptr(2), kb.int(3));
    kb.grid_stride_loop(n, |kb, i| {
        let sum = kb.fadd(kb.load_f32(a, i)?, kb.load_f32(b, i)?)?;
        kb.store_f32(out, i, sum)
    })?;
    kb.finish()?;

    let kb = KernelBuilder::new(
        context,
        module,
        "slimpack_scale",
        &[F32Ptr, F32Ptr, F32, I64],
    );
    let (x, out, alpha, n) = (kb.ptr(0), kb.ptr(1), kb.float(2), kb.int(3));
    kb.grid_stride_loop(n, |kb, i| {
        let scaled = kb.fmul(alpha, kb.load_f32(x, i)?)?;
        kb.store_f32(out, i, scaled)
    })?;
    kb.finish()
}
