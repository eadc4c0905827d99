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

use super::builder::{Combine, KernelBuilder, Param, Result};

pub(super) fn build<'ctx>(context: &'ctx Context, module: &Module<'ctx>) -> Result<()> {
    forward(context, module)?;
    backward(context, module)?;
    backward_gain(context, module)
}

fn forward<'ctx>(context: &'ctx Context, module: &Module<'ctx>) -> Result<()> {
    use Param::*;
    let params = [F32Ptr, F32Ptr, F32Ptr, F32Ptr, I64, I64, F32];
    let mut kb = KernelBuilder::new(context, module, "slimpack_rmsnorm_fwd", &params);
    let (x, gain, y, inv_rms) = (kb.ptr(0), kb.ptr(1), kb.ptr(2), kb.ptr(3));
    let (rows, cols, eps) = (kb.int(4), kb.int(5), kb.float(6));

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

fn backward<'ctx>(context: &'ctx Context, module: &Module<'ctx>) -> Result<()> {
    use Param::*;
    let params = [F32Ptr, F32Ptr, F32Ptr, F32Ptr, F32Ptr, I64, I64];
    let mut kb = KernelBuilder::new(context, module, "slimpack_rmsnorm_bwd", &params);
    let (x, gain, inv_rms, dy, dx) = (kb.ptr(0), kb.ptr(1), kb.ptr(2), kb.ptr(3), kb.ptr(4));
    let (rows, cols) = (kb.int(5), kb.int(6));

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

fn backward_gain<'ctx>(context: &'ctx Context, module: &Module<'ctx>) -> Result<()> {
    use Param::*;
    let params = [F32Ptr, F32Ptr, F32Ptr, F32Ptr, I64, I64];
    let kb = KernelBuilder::new(context, module, "slimpack_rmsnorm_bwd_gain", &params);
    let (x, inv_rms, dy, d_gain) = (kb.ptr(0), kb.ptr(1), kb.ptr(2), kb.ptr(3));
    let (rows, cols) = (kb.int(4), kb.int(5));

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
