//! RMSNorm kernels, matching the CPU backend's `rmsnorm_forward`/`rmsnorm_backward`.
//!
//! Rows of `cols` floats, row-major; one block per row (grid `rows`, block a multiple of 32).
//! - `slimpack_rmsnorm_fwd(x, gain, y, inv_rms, rows, cols, eps)`:
//!   `inv_rms[r] = 1 / sqrt(mean(x[r]²) + eps)`, `y[r] = x[r] · inv_rms[r] · gain`.
//! - `slimpack_rmsnorm_bwd(x, gain, inv_rms, dy, dx, rows, cols)`: with `x̂ = x · inv_rms` and
//!   `dx̂ = dy ∘ gain`, `dx = inv_rms · (dx̂ − x̂ · mean(dx̂ ∘ x̂))`.
//! - `slimpack_rmsnorm_bwd_gain(x, inv_rms, dy, d_gain, rows, cols)`: one thread per column (any
//!   grid), `d_gain[c] += Σ_r dy[r,c] · x[r,c] · inv_rms[r]`, summed in f64 like the CPU backend.
//!   It is a separate kernel so the column sums need no atomics and stay deterministic.

use inkwell::context::Context;
use inkwell::module::Module;

use super::builder::{Combine, KernelBuilder, Result, Target};
use super::spec::{Grid, Items, KernelSpec, Param};

pub const FORWARD: KernelSpec = KernelSpec {
    name: "slimpack_rmsnorm_fwd",
    params: &[
        Param::f32_ptr("x"),
        Param::f32_ptr("gain"),
        Param::f32_ptr("y"),
        Param::f32_ptr("inv_rms"),
        Param::i64("rows"),
        Param::i64("cols"),
        Param::f32("eps"),
    ],
    grid: Grid::BlockPerRow { rows: "rows" },
};

pub const BACKWARD: KernelSpec = KernelSpec {
    name: "slimpack_rmsnorm_bwd",
    params: &[
        Param::f32_ptr("x"),
        Param::f32_ptr("gain"),
        Param::f32_ptr("inv_rms"),
        Param::f32_ptr("dy"),
        Param::f32_ptr("dx"),
        Param::i64("rows"),
        Param::i64("cols"),
    ],
    grid: Grid::BlockPerRow { rows: "rows" },
};

pub const BACKWARD_GAIN: KernelSpec = KernelSpec {
    name: "slimpack_rmsnorm_bwd_gain",
    params: &[
        Param::f32_ptr("x"),
        Param::f32_ptr("inv_rms"),
        Param::f32_ptr("dy"),
        Param::f32_ptr("d_gain"),
        Param::i64("rows"),
        Param::i64("cols"),
    ],
    grid: Grid::GridStride {
        items: Items {
            product_of: &["cols"],
            divisor: 1,
        },
    },
};

pub(super) fn build<'ctx>(
    context: &'ctx Context,
    module: &Module<'ctx>,
    target: Target,
) -> Result<()> {
    forward(context, module, target)?;
    backward(context, module, target)?;
    backward_gain(context, module, target)
}

fn forward<'ctx>(context: &'ctx Context, module: &Module<'ctx>, target: Target) -> Result<()> {
    let mut kb = KernelBuilder::new(context, module, target, &FORWARD)?;
    let (x, gain, y, inv_rms) = (kb.ptr("x"), kb.ptr("gain"), kb.ptr("y"), kb.ptr("inv_rms"));
    let (rows, cols, eps) = (kb.int("rows"), kb.int("cols"), kb.float("eps"));

    let row = kb.block_index()?;
    kb.return_unless(kb.unsigned_less(row, rows)?)?;
    let base = kb.mul(row, cols)?;
    let sum_squares = kb.local(kb.f32(0.0))?;
    kb.row_loop(cols, |kb, c| {
        let v = kb.load_f32(x, kb.add(base, c)?)?;
        let sum = kb.fadd(kb.read(sum_squares, v)?, kb.fmul(v, v)?)?;
        kb.write(sum_squares, sum)
    })?;
    let partial = kb.read(sum_squares, kb.f32(0.0))?;
    let total = kb.block_reduce(partial, Combine::Sum)?;
    let cols_f32 = kb.count_to_f32(cols)?;
    let mean = kb.fdiv(total, cols_f32)?;
    let inv = kb.fdiv(kb.f32(1.0), kb.sqrt(kb.fadd(mean, eps)?)?)?;
    kb.when(kb.int_eq(kb.thread_index()?, kb.i64(0))?, |kb| {
        kb.store_f32(inv_rms, row, inv)
    })?;
    kb.row_loop(cols, |kb, c| {
        let at = kb.add(base, c)?;
        let v = kb.load_f32(x, at)?;
        let scaled = kb.fmul(kb.fmul(v, inv)?, kb.load_f32(gain, c)?)?;
        kb.store_f32(y, at, scaled)
    })?;
    kb.finish()
}

fn backward<'ctx>(context: &'ctx Context, module: &Module<'ctx>, target: Target) -> Result<()> {
    let mut kb = KernelBuilder::new(context, module, target, &BACKWARD)?;
    let (x, gain, inv_rms) = (kb.ptr("x"), kb.ptr("gain"), kb.ptr("inv_rms"));
    let (dy, dx) = (kb.ptr("dy"), kb.ptr("dx"));
    let (rows, cols) = (kb.int("rows"), kb.int("cols"));

    let row = kb.block_index()?;
    kb.return_unless(kb.unsigned_less(row, rows)?)?;
    let base = kb.mul(row, cols)?;
    let inv = kb.load_f32(inv_rms, row)?;
    let dot = kb.local(kb.f32(0.0))?;
    kb.row_loop(cols, |kb, c| {
        let at = kb.add(base, c)?;
        let x_hat = kb.fmul(kb.load_f32(x, at)?, inv)?;
        let dx_hat = kb.fmul(kb.load_f32(dy, at)?, kb.load_f32(gain, c)?)?;
        let sum = kb.fadd(kb.read(dot, x_hat)?, kb.fmul(dx_hat, x_hat)?)?;
        kb.write(dot, sum)
    })?;
    let partial = kb.read(dot, kb.f32(0.0))?;
    let total = kb.block_reduce(partial, Combine::Sum)?;
    let cols_f32 = kb.count_to_f32(cols)?;
    let mean = kb.fdiv(total, cols_f32)?;
    kb.row_loop(cols, |kb, c| {
        let at = kb.add(base, c)?;
        let x_hat = kb.fmul(kb.load_f32(x, at)?, inv)?;
        let dx_hat = kb.fmul(kb.load_f32(dy, at)?, kb.load_f32(gain, c)?)?;
        let grad = kb.fmul(inv, kb.fsub(dx_hat, kb.fmul(x_hat, mean)?)?)?;
        kb.store_f32(dx, at, grad)
    })?;
    kb.finish()
}

fn backward_gain<'ctx>(
    context: &'ctx Context,
    module: &Module<'ctx>,
    target: Target,
) -> Result<()> {
    let kb = KernelBuilder::new(context, module, target, &BACKWARD_GAIN)?;
    let (x, inv_rms) = (kb.ptr("x"), kb.ptr("inv_rms"));
    let (dy, d_gain) = (kb.ptr("dy"), kb.ptr("d_gain"));
    let (rows, cols) = (kb.int("rows"), kb.int("cols"));

    kb.grid_stride_loop(cols, |kb, c| {
        let zero = context.f64_type().const_zero();
        let sum = kb.local(zero)?;
        kb.for_range(kb.i64(0), rows, kb.i64(1), |kb, r| {
            let at = kb.add(kb.mul(r, cols)?, c)?;
            let term = kb.fmul(
                kb.fmul(kb.load_f32(dy, at)?, kb.load_f32(x, at)?)?,
                kb.load_f32(inv_rms, r)?,
            )?;
            let next = kb.fadd(kb.read(sum, zero)?, kb.to_f64(term)?)?;
            kb.write(sum, next)
        })?;
        let previous = kb.to_f64(kb.load_f32(d_gain, c)?)?;
        let total = kb.fadd(previous, kb.read(sum, zero)?)?;
        kb.store_f32(d_gain, c, kb.to_f32(total)?)
    })?;
    kb.finish()
}
