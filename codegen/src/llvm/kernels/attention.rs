//! Varlen causal attention of a pack of slices against their samples' K/V, forward and backward,
//! with the semantics of the CPU backend's `runtime/src/cpu/attention.rs` (grouped-query heads,
//! scores scaled by `scale = 1/sqrt(head_dim)`, log-sum-exp saved for the backward).
//!
//! # Buffers
//! - `q`, `out`, `d_out`, `dq`: the pack's query rows, `[total_q, heads · head_dim]`, slice after
//!   slice; `cu_seqlens_q` (int32, `slices + 1` entries, `cu_seqlens_q[0] = 0`) delimits slice
//!   `s` as rows `cu_seqlens_q[s] .. cu_seqlens_q[s + 1]`.
//! - `positions` (int32, `total_q`): each query row's position in its sample (a continuation
//!   slice at offset `o` has positions `o, o + 1, ...`; the same array the RoPE kernels read).
//!   Positions within a slice ascend.
//! - `k`, `v` (and `dk`, `dv`): K/V pools `[pool_rows, kv_heads · head_dim]` holding each
//!   sample's keys and values by position, contiguously: the key of position `p` of slice `s`'s
//!   sample is row `kv_starts[s] + p` (int32 `kv_starts`, one per slice). Rows `0 ..= position`
//!   of the sample must be filled before the forward: the prefix from the K/V cache of earlier
//!   slices, and the slice's own rows (a causal mask aligned bottom-right: query position `p`
//!   sees keys `0 ..= p`). Slices of one sample share its rows.
//! - `lse` (`[total_q, heads]`): the forward's log-sum-exp of each query row's scaled scores per
//!   head, which the backward reads to recompute the probabilities (FlashAttention's scheme).
//!
//! Query head `h` reads K/V head `h / (heads / kv_heads)` (`heads` a multiple of `kv_heads`).
//!
//! # Kernels
//! - [`FORWARD`] `slimpack_attention_fwd`: `out[t, h] = Σ_j softmax_j(scale · q[t, h] · k_j) ·
//!   v_j` and `lse[t, h] = max + ln Σ_j exp(score_j − max)`, over the keys `j` row `t` sees.
//! - [`BACKWARD`] `slimpack_attention_bwd`: with `P_j = exp(score_j − lse)`,
//!   `dS_j = P_j · (d_out · v_j − d_out · out)`: *writes* `dq[t, h] = scale · Σ_j dS_j · k_j` and
//!   *adds* `scale · dS_j · q[t, h]` into `dk` and `P_j · d_out[t, h]` into `dv` at every key
//!   row the query sees, prefix rows included (atomically: query rows of one sample, and the
//!   query heads of one K/V group, add into the same rows). For the prefix these are the
//!   contributions the earlier slices' backward consumes; `dk`/`dv` are not cleared.
//!
//! # Launch geometry
//! One thread per (query row, query head) work item, `total_q · heads` items, item
//! `i = row · heads + head`, in a grid-stride loop: any 1-D grid and block (the default launch:
//! [`super::spec::STRIDE_BLOCK`]-thread blocks, `ceil(items / block)` blocks). Threads never
//! cooperate (no shared memory, no barriers); each item loops over its keys one by one, three
//! passes in the forward (max, sum, output) as the CPU backend's softmax does. Simple rather
//! than fast: no tiling, and the backward's `dk`/`dv` sums use `atomicAdd`, so on a GPU their
//! summation order (and last bits) vary from run to run.

use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::values::{FloatValue, IntValue, PointerValue};

use super::builder::{Combine, KernelBuilder, Result, Target};
use super::spec::{Grid, Items, KernelSpec, Param};

/// The work items of both kernels: one per (query row, query head).
const ITEMS: Items = Items {
    product_of: &["total_q", "heads"],
    divisor: 1,
};

/// `slimpack_attention_fwd(q, k, v, out, lse, positions, cu_seqlens_q, kv_starts, slices,
/// total_q, heads, kv_heads, head_dim, scale)`.
pub const FORWARD: KernelSpec = KernelSpec {
    name: "slimpack_attention_fwd",
    params: &[
        Param::f32_ptr("q"),
        Param::f32_ptr("k"),
        Param::f32_ptr("v"),
        Param::f32_ptr("out"),
        Param::f32_ptr("lse"),
        Param::i32_ptr("positions"),
        Param::i32_ptr("cu_seqlens_q"),
        Param::i32_ptr("kv_starts"),
        Param::i64("slices"),
        Param::i64("total_q"),
        Param::i64("heads"),
        Param::i64("kv_heads"),
        Param::i64("head_dim"),
        Param::f32("scale"),
    ],
    grid: Grid::GridStride { items: ITEMS },
};

/// `slimpack_attention_bwd(q, k, v, out, lse, d_out, dq, dk, dv, positions, cu_seqlens_q,
/// kv_starts, slices, total_q, heads, kv_heads, head_dim, scale)`.
pub const BACKWARD: KernelSpec = KernelSpec {
    name: "slimpack_attention_bwd",
    params: &[
        Param::f32_ptr("q"),
        Param::f32_ptr("k"),
        Param::f32_ptr("v"),
        Param::f32_ptr("out"),
        Param::f32_ptr("lse"),
        Param::f32_ptr("d_out"),
        Param::f32_ptr("dq"),
        Param::f32_ptr("dk"),
        Param::f32_ptr("dv"),
        Param::i32_ptr("positions"),
        Param::i32_ptr("cu_seqlens_q"),
        Param::i32_ptr("kv_starts"),
        Param::i64("slices"),
        Param::i64("total_q"),
        Param::i64("heads"),
        Param::i64("kv_heads"),
        Param::i64("head_dim"),
        Param::f32("scale"),
    ],
    grid: Grid::GridStride { items: ITEMS },
};

pub(super) fn build<'ctx>(
    context: &'ctx Context,
    module: &Module<'ctx>,
    target: Target,
) -> Result<()> {
    forward(context, module, target)?;
    backward(context, module, target)
}

/// Where one work item's data lives: its query row and head, and its keys.
struct Item<'ctx> {
    /// First float of the item's head in its query row (of `q`, `out`, `d_out`, `dq`).
    q_at: IntValue<'ctx>,
    /// Index of the item's (row, head) in `lse`.
    lse_at: IntValue<'ctx>,
    /// First float of the key head of the sample's position 0 in the K/V pools.
    kv_at: IntValue<'ctx>,
    /// Floats between consecutive key rows (`kv_heads · head_dim`).
    kv_width: IntValue<'ctx>,
    /// Keys the query sees: `position + 1`.
    visible: IntValue<'ctx>,
    head_dim: IntValue<'ctx>,
    scale: FloatValue<'ctx>,
}

/// The integer parameters both kernels share, by name.
struct Shape<'ctx> {
    positions: PointerValue<'ctx>,
    cu_seqlens_q: PointerValue<'ctx>,
    kv_starts: PointerValue<'ctx>,
    slices: IntValue<'ctx>,
    total_q: IntValue<'ctx>,
    heads: IntValue<'ctx>,
    kv_heads: IntValue<'ctx>,
    head_dim: IntValue<'ctx>,
    scale: FloatValue<'ctx>,
}

impl<'ctx> Shape<'ctx> {
    fn of(kb: &KernelBuilder<'ctx, '_>) -> Shape<'ctx> {
        Shape {
            positions: kb.ptr("positions"),
            cu_seqlens_q: kb.ptr("cu_seqlens_q"),
            kv_starts: kb.ptr("kv_starts"),
            slices: kb.int("slices"),
            total_q: kb.int("total_q"),
            heads: kb.int("heads"),
            kv_heads: kb.int("kv_heads"),
            head_dim: kb.int("head_dim"),
            scale: kb.float("scale"),
        }
    }

    /// Runs `body` for every (query row, head) item of the grid-stride loop.
    fn for_each_item(
        &self,
        kb: &KernelBuilder<'ctx, '_>,
        body: impl FnOnce(&KernelBuilder<'ctx, '_>, &Item<'ctx>) -> Result<()>,
    ) -> Result<()> {
        let items = kb.mul(self.total_q, self.heads)?;
        kb.grid_stride_loop(items, |kb, index| {
            let (row, head) = kb.divrem(index, self.heads)?;
            let group = kb.divrem(self.heads, self.kv_heads)?.0;
            let kv_head = kb.divrem(head, group)?.0;
            let slice = self.slice_of(kb, row)?;
            let kv_start = kb.load_i32(self.kv_starts, slice)?;
            let q_width = kb.mul(self.heads, self.head_dim)?;
            let kv_width = kb.mul(self.kv_heads, self.head_dim)?;
            let item = Item {
                q_at: kb.add(kb.mul(row, q_width)?, kb.mul(head, self.head_dim)?)?,
                lse_at: index,
                kv_at: kb.add(kb.mul(kv_start, kv_width)?, kb.mul(kv_head, self.head_dim)?)?,
                kv_width,
                visible: kb.add(kb.load_i32(self.positions, row)?, kb.i64(1))?,
                head_dim: self.head_dim,
                scale: self.scale,
            };
            body(kb, &item)
        })
    }

    /// The slice holding query `row`: the last `s` with `cu_seqlens_q[s] <= row`.
    fn slice_of(
        &self,
        kb: &KernelBuilder<'ctx, '_>,
        row: IntValue<'ctx>,
    ) -> Result<IntValue<'ctx>> {
        let found = kb.int_local(kb.i64(0))?;
        kb.for_range(kb.i64(1), self.slices, kb.i64(1), |kb, s| {
            let start = kb.load_i32(self.cu_seqlens_q, s)?;
            kb.when(kb.unsigned_less_or_equal(start, row)?, |kb| {
                kb.write_int(found, s)
            })
        })?;
        kb.read_int(found)
    }
}

impl<'ctx> Item<'ctx> {
    /// First float of key/value row `j` (of `k`, `v`, `dk`, `dv`).
    fn key_at(&self, kb: &KernelBuilder<'ctx, '_>, j: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        kb.add(self.kv_at, kb.mul(j, self.kv_width)?)
    }

    /// `Σ_c a[a_at + c] · b[b_at + c]` over the head's `head_dim` floats.
    fn dot(
        &self,
        kb: &KernelBuilder<'ctx, '_>,
        a: PointerValue<'ctx>,
        a_at: IntValue<'ctx>,
        b: PointerValue<'ctx>,
        b_at: IntValue<'ctx>,
    ) -> Result<FloatValue<'ctx>> {
        let sum = kb.local(kb.f32(0.0))?;
        kb.for_range(kb.i64(0), self.head_dim, kb.i64(1), |kb, c| {
            let product = kb.fmul(
                kb.load_f32(a, kb.add(a_at, c)?)?,
                kb.load_f32(b, kb.add(b_at, c)?)?,
            )?;
            kb.write(sum, kb.fadd(kb.read(sum, product)?, product)?)
        })?;
        kb.read(sum, kb.f32(0.0))
    }

    /// The scaled score `scale · q · k_j` of key row `j`.
    fn score(
        &self,
        kb: &KernelBuilder<'ctx, '_>,
        q: PointerValue<'ctx>,
        k: PointerValue<'ctx>,
        j: IntValue<'ctx>,
    ) -> Result<FloatValue<'ctx>> {
        let dot = self.dot(kb, q, self.q_at, k, self.key_at(kb, j)?)?;
        kb.fmul(self.scale, dot)
    }

    /// `body(c)` for every float `c` of the head.
    fn for_each_column(
        &self,
        kb: &KernelBuilder<'ctx, '_>,
        body: impl FnOnce(&KernelBuilder<'ctx, '_>, IntValue<'ctx>) -> Result<()>,
    ) -> Result<()> {
        kb.for_range(kb.i64(0), self.head_dim, kb.i64(1), body)
    }

    /// `body(j)` for every key row `j` the query sees.
    fn for_each_key(
        &self,
        kb: &KernelBuilder<'ctx, '_>,
        body: impl FnOnce(&KernelBuilder<'ctx, '_>, IntValue<'ctx>) -> Result<()>,
    ) -> Result<()> {
        kb.for_range(kb.i64(0), self.visible, kb.i64(1), body)
    }
}

fn forward<'ctx>(context: &'ctx Context, module: &Module<'ctx>, target: Target) -> Result<()> {
    let kb = KernelBuilder::new(context, module, target, &FORWARD)?;
    let (q, k, v) = (kb.ptr("q"), kb.ptr("k"), kb.ptr("v"));
    let (out, lse) = (kb.ptr("out"), kb.ptr("lse"));
    let shape = Shape::of(&kb);
    shape.for_each_item(&kb, |kb, item| {
        let running_max = kb.local(kb.f32(f32::NEG_INFINITY))?;
        item.for_each_key(kb, |kb, j| {
            let score = item.score(kb, q, k, j)?;
            let best = kb.combine(Combine::Max, kb.read(running_max, score)?, score)?;
            kb.write(running_max, best)
        })?;
        let max = kb.read(running_max, kb.f32(0.0))?;

        let running_sum = kb.local(kb.f32(0.0))?;
        item.for_each_key(kb, |kb, j| {
            let term = kb.exp(kb.fsub(item.score(kb, q, k, j)?, max)?)?;
            kb.write(running_sum, kb.fadd(kb.read(running_sum, term)?, term)?)
        })?;
        let sum = kb.read(running_sum, kb.f32(0.0))?;
        kb.store_f32(lse, item.lse_at, kb.fadd(max, kb.ln(sum)?)?)?;

        item.for_each_column(kb, |kb, c| {
            kb.store_f32(out, kb.add(item.q_at, c)?, kb.f32(0.0))
        })?;
        item.for_each_key(kb, |kb, j| {
            let term = kb.exp(kb.fsub(item.score(kb, q, k, j)?, max)?)?;
            let probability = kb.fdiv(term, sum)?;
            let key_at = item.key_at(kb, j)?;
            item.for_each_column(kb, |kb, c| {
                let at = kb.add(item.q_at, c)?;
                let weighted = kb.fmul(probability, kb.load_f32(v, kb.add(key_at, c)?)?)?;
                kb.store_f32(out, at, kb.fadd(kb.load_f32(out, at)?, weighted)?)
            })
        })
    })?;
    kb.finish()
}

fn backward<'ctx>(context: &'ctx Context, module: &Module<'ctx>, target: Target) -> Result<()> {
    let kb = KernelBuilder::new(context, module, target, &BACKWARD)?;
    let (q, k, v) = (kb.ptr("q"), kb.ptr("k"), kb.ptr("v"));
    let (out, lse, d_out) = (kb.ptr("out"), kb.ptr("lse"), kb.ptr("d_out"));
    let (dq, dk, dv) = (kb.ptr("dq"), kb.ptr("dk"), kb.ptr("dv"));
    let shape = Shape::of(&kb);
    shape.for_each_item(&kb, |kb, item| {
        let row_lse = kb.load_f32(lse, item.lse_at)?;
        let delta = item.dot(kb, d_out, item.q_at, out, item.q_at)?;
        item.for_each_column(kb, |kb, c| {
            kb.store_f32(dq, kb.add(item.q_at, c)?, kb.f32(0.0))
        })?;
        item.for_each_key(kb, |kb, j| {
            let probability = kb.exp(kb.fsub(item.score(kb, q, k, j)?, row_lse)?)?;
            let key_at = item.key_at(kb, j)?;
            let d_probability = item.dot(kb, d_out, item.q_at, v, key_at)?;
            let d_score = kb.fmul(probability, kb.fsub(d_probability, delta)?)?;
            let scaled_d_score = kb.fmul(item.scale, d_score)?;
            item.for_each_column(kb, |kb, c| {
                let (q_c, kv_c) = (kb.add(item.q_at, c)?, kb.add(key_at, c)?);
                let dq_term = kb.fmul(d_score, kb.load_f32(k, kv_c)?)?;
                kb.store_f32(dq, q_c, kb.fadd(kb.load_f32(dq, q_c)?, dq_term)?)?;
                let dk_term = kb.fmul(scaled_d_score, kb.load_f32(q, q_c)?)?;
                kb.atomic_add_f32(dk, kv_c, dk_term)?;
                let dv_term = kb.fmul(probability, kb.load_f32(d_out, q_c)?)?;
                kb.atomic_add_f32(dv, kv_c, dv_term)
            })
        })?;
        item.for_each_column(kb, |kb, c| {
            let at = kb.add(item.q_at, c)?;
            kb.store_f32(dq, at, kb.fmul(item.scale, kb.load_f32(dq, at)?)?)
        })
    })?;
    kb.finish()
}
