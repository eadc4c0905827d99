//! Elementwise kernels over `n` floats, grid-stride (any grid); outputs may alias inputs.
//! - `slimpack_add(a, b, out, n)`: `out = a + b` (residual adds, gradient accumulation).
//! - `slimpack_scale(x, out, alpha, n)`: `out = alpha · x` (loss scaling, gradient averaging).

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

pub const ADD: KernelSpec = KernelSpec {
    name: "slimpack_add",
    params: &[
        Param::f32_ptr("a"),
        Param::f32_ptr("b"),
        Param::f32_ptr("out"),
        Param::i64("n"),
    ],
    grid: ELEMENTS,
};

pub const SCALE: KernelSpec = KernelSpec {
    name: "slimpack_scale",
    params: &[
        Param::f32_ptr("x"),
        Param::f32_ptr("out"),
        Param::f32("alpha"),
        Param::i64("n"),
    ],
    grid: ELEMENTS,
};

pub(super) fn build<'ctx>(
    context: &'ctx Context,
    module: &Module<'ctx>,
    target: Target,
) -> Result<()> {
    let kb = KernelBuilder::new(context, module, target, &ADD)?;
    let (a, b, out, n) = (kb.ptr("a"), kb.ptr("b"), kb.ptr("out"), kb.int("n"));
    kb.grid_stride_loop(n, |kb, i| {
        let sum = kb.fadd(kb.load_f32(a, i)?, kb.load_f32(b, i)?)?;
        kb.store_f32(out, i, sum)
    })?;
    kb.finish()?;

    let kb = KernelBuilder::new(context, module, target, &SCALE)?;
    let (x, out, alpha, n) = (kb.ptr("x"), kb.ptr("out"), kb.float("alpha"), kb.int("n"));
    kb.grid_stride_loop(n, |kb, i| {
        let scaled = kb.fmul(alpha, kb.load_f32(x, i)?)?;
        kb.store_f32(out, i, scaled)
    })?;
    kb.finish()
}
