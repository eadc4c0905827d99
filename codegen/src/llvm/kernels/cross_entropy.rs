//! Softmax cross-entropy: loss and logit gradient in one pass over each row.
//!
//! `slimpack_softmax_xent(logits, targets, loss, d_logits, rows, vocab, grad_scale)`: one block
//! per row of `vocab` logits (grid `rows`, block a multiple of 32). `targets[r]` (int32) is the
//! row's next token; a negative target (a sample's last token, or padding) contributes neither
//! loss nor gradient, as in the CPU backend. With `lse = logsumexp(z)`:
//! `loss[r] = lse − z[target]` (0 without a target) and
//! `d_logits[r, c] = grad_scale · (exp(z[c] − lse) − [c = target])` (0 without a target), where
//! `grad_scale` is the loss's scale (1 / tokens for a mean). `d_logits` may alias `logits`.

use inkwell::context::Context;
use inkwell::module::Module;

use super::builder::{Combine, KernelBuilder, Result, Target};
use super::spec::{Grid, KernelSpec, Param};

pub const SOFTMAX_XENT: KernelSpec = KernelSpec {
    name: "slimpack_softmax_xent",
    params: &[
        Param::f32_ptr("logits"),
        Param::i32_ptr("targets"),
        Param::f32_ptr("loss"),
        Param::f32_ptr("d_logits"),
        Param::i64("rows"),
        Param::i64("vocab"),
        Param::f32("grad_scale"),
    ],
    grid: Grid::BlockPerRow { rows: "rows" },
};

pub(super) fn build<'ctx>(
    context: &'ctx Context,
    module: &Module<'ctx>,
    target: Target,
) -> Result<()> {
    let mut kb = KernelBuilder::new(context, module, target, &SOFTMAX_XENT)?;
    let (logits, targets) = (kb.ptr("logits"), kb.ptr("targets"));
    let (loss, d_logits) = (kb.ptr("loss"), kb.ptr("d_logits"));
    let (rows, vocab, grad_scale) = (kb.int("rows"), kb.int("vocab"), kb.float("grad_scale"));

    let row = kb.block_index()?;
    kb.return_unless(kb.unsigned_less(row, rows)?)?;
    let base = kb.mul(row, vocab)?;

    let running_max = kb.local(kb.f32(f32::NEG_INFINITY))?;
    kb.row_loop(vocab, |kb, c| {
        let z = kb.load_f32(logits, kb.add(base, c)?)?;
        let best = kb.combine(Combine::Max, kb.read(running_max, z)?, z)?;
        kb.write(running_max, best)
    })?;
    let partial_max = kb.read(running_max, kb.f32(0.0))?;
    let max = kb.block_reduce(partial_max, Combine::Max)?;

    let running_sum = kb.local(kb.f32(0.0))?;
    kb.row_loop(vocab, |kb, c| {
        let z = kb.load_f32(logits, kb.add(base, c)?)?;
        let term = kb.exp(kb.fsub(z, max)?)?;
        kb.write(running_sum, kb.fadd(kb.read(running_sum, z)?, term)?)
    })?;
    let partial_sum = kb.read(running_sum, kb.f32(0.0))?;
    let sum = kb.block_reduce(partial_sum, Combine::Sum)?;
    let lse = kb.fadd(max, kb.ln(sum)?)?;

    let target = kb.load_i32(targets, row)?;
    let has_target = kb.non_negative(target)?;
    let first_thread = kb.int_eq(kb.thread_index()?, kb.i64(0))?;
    kb.when(kb.and(first_thread, kb.not(has_target)?)?, |kb| {
        kb.store_f32(loss, row, kb.f32(0.0))
    })?;
    // The thread that owns the target column writes the loss from the logit it has just read,
    // so a `d_logits` aliasing `logits` is safe: every column is read and then written by the
    // same thread.
    let scale = kb.select_f32(has_target, grad_scale, kb.f32(0.0))?;
    kb.row_loop(vocab, |kb, c| {
        let at = kb.add(base, c)?;
        let z = kb.load_f32(logits, at)?;
        let probability = kb.exp(kb.fsub(z, lse)?)?;
        let is_target = kb.int_eq(c, target)?;
        kb.when(is_target, |kb| kb.store_f32(loss, row, kb.fsub(lse, z)?))?;
        let one_hot = kb.select_f32(is_target, kb.f32(1.0), kb.f32(0.0))?;
        kb.store_f32(
            d_logits,
            at,
            kb.fmul(scale, kb.fsub(probability, one_hot)?)?,
        )
    })?;
    kb.finish()
}
