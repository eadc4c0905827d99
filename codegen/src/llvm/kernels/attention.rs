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
//! - `k`, `v` (and `dk`, `dv`): K/V pools `[kv_rows, kv_heads · head_dim]` holding each
//!   sample's keys and values by position, contiguously: the key of position `p` of slice `s`'s
//!   sample is row `kv_starts[s] + p` (int32 `kv_starts`, one per slice). Rows `0 ..= position`
//!   of the sample must be filled before the forward: the prefix from the K/V cache of earlier
//!   slices, and the slice's own rows (a causal mask aligned bottom-right: query position `p`
//!   sees keys `0 ..= p`). Slices of one sample share its rows (the same `kv_starts`); the
//!   regions of different samples must not overlap.
//! - `lse` (`[total_q, heads]`): the forward's log-sum-exp of each query row's scaled scores per
//!   head, which the backward reads to recompute the probabilities (FlashAttention's scheme).
//!
//! Query head `h` reads K/V head `h / (heads / kv_heads)` (`heads` a multiple of `kv_heads`).
//!
//! # Kernels
//! - [`FORWARD`] `slimpack_attention_fwd`: `out[t, h] = Σ_j softmax_j(scale · q[t, h] · k_j) ·
//!   v_j` and `lse[t, h] = max + ln Σ_j exp(score_j − max)`, over the keys `j` row `t` sees.
//! - [`BACKWARD_DQ`] `slimpack_attention_bwd_dq`: with `P_j = exp(score_j − lse)` and
//!   `dS_j = P_j · (d_out · v_j − d_out · out)`, *writes* `dq[t, h] = scale · Σ_j dS_j · k_j`.
//! - [`BACKWARD_DKV`] `slimpack_attention_bwd_dkv`: for every K/V pool row `r` and K/V head,
//!   *adds* `scale · Σ dS · q` into `dk[r]` and `Σ P · d_out` into `dv[r]`, summed over every
//!   (query row, query head of the K/V group) of the pack that sees the row — prefix rows
//!   included, and several slices of one sample together. For the prefix these are the
//!   contributions the earlier slices' backward consumes; `dk`/`dv` are not cleared, and rows
//!   no query sees are left as they are. Run it with the same inputs as `bwd_dq` (in any order:
//!   neither reads what the other writes).
//!
//! # Launch geometry
//! Grid-stride loops over work items, so any 1-D grid and block works (the default launch:
//! [`super::spec::STRIDE_BLOCK`]-thread blocks, `ceil(items / block)` of them); threads never
//! cooperate (no shared memory, no barriers, no atomics), so the results do not depend on the
//! launch shape, and every value is summed in one fixed order (deterministic on the GPU too).
//! - forward and `bwd_dq`: one item per (query row, query head), `total_q · heads` items, item
//!   `i = row · heads + head`; each loops over its keys one by one (the forward in three passes,
//!   max, sum and output, as the CPU backend's softmax does).
//! - `bwd_dkv`: one item per (K/V pool row, K/V head), `kv_rows · kv_heads` items (`kv_rows`:
//!   the pool's rows; rows no slice sees cost a loop over the slices); each loops over the
//!   slices whose sample owns the row and their query rows at or after the key's position,
//!   recomputing the probabilities, and keeps its sums in a per-thread array of
//!   [`DKV_COLUMNS`] columns, repeating the loop for wider heads.
//!
//! Simple rather than fast: no tiling, scores recomputed per pass.

use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::values::{FloatValue, IntValue, PointerValue};

use super::builder::{Combine, KernelBuilder, Result, Target};
use super::spec::{Grid, Items, KernelSpec, Param};

/// The work items of the forward and `bwd_dq`: one per (query row, query head).
const QUERY_ITEMS: Items = Items {
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
    grid: Grid::GridStride { items: QUERY_ITEMS },
};

/// `slimpack_attention_bwd_dq(q, k, v, out, lse, d_out, dq, positions, cu_seqlens_q,
/// kv_starts, slices, total_q, heads, kv_heads, head_dim, scale)`.
pub const BACKWARD_DQ: KernelSpec = KernelSpec {
    name: "slimpack_attention_bwd_dq",
    params: &[
        Param::f32_ptr("q"),
        Param::f32_ptr("k"),
        Param::f32_ptr("v"),
        Param::f32_ptr("out"),
        Param::f32_ptr("lse"),
        Param::f32_ptr("d_out"),
        Param::f32_ptr("dq"),
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
    grid: Grid::GridStride { items: QUERY_ITEMS },
};

/// `slimpack_attention_bwd_dkv(q, k, v, out, lse, d_out, dk, dv, positions, cu_seqlens_q,
/// kv_starts, slices, total_q, kv_rows, heads, kv_heads, head_dim, scale)`.
pub const BACKWARD_DKV: KernelSpec = KernelSpec {
    name: "slimpack_attention_bwd_dkv",
    params: &[
        Param::f32_ptr("q"),
        Param::f32_ptr("k"),
        Param::f32_ptr("v"),
        Param::f32_ptr("out"),
        Param::f32_ptr("lse"),
        Param::f32_ptr("d_out"),
        Param::f32_ptr("dk"),
        Param::f32_ptr("dv"),
        Param::i32_ptr("positions"),
        Param::i32_ptr("cu_seqlens_q"),
        Param::i32_ptr("kv_starts"),
        Param::i64("slices"),
        Param::i64("total_q"),
        Param::i64("kv_rows"),
        Param::i64("heads"),
        Param::i64("kv_heads"),
        Param::i64("head_dim"),
        Param::f32("scale"),
    ],
    grid: Grid::GridStride {
        items: Items {
            product_of: &["kv_rows", "kv_heads"],
            divisor: 1,
        },
    },
};

/// Columns of `dk`/`dv` one `bwd_dkv` pass sums per thread (its per-thread array).
pub const DKV_COLUMNS: u32 = 64;

pub(super) fn build<'ctx>(
    context: &'ctx Context,
    module: &Module<'ctx>,
    target: Target,
) -> Result<()> {
    forward(context, module, target)?;
    backward_dq(context, module, target)?;
    backward_dkv(context, module, target)
}

/// The parameters every attention kernel has, and the widths derived from them.
struct Shape<'ctx> {
    positions: PointerValue<'ctx>,
    cu_seqlens_q: PointerValue<'ctx>,
    kv_starts: PointerValue<'ctx>,
    slices: IntValue<'ctx>,
    heads: IntValue<'ctx>,
    kv_heads: IntValue<'ctx>,
    head_dim: IntValue<'ctx>,
    scale: FloatValue<'ctx>,
    /// Floats per query row (`heads · head_dim`).
    q_width: IntValue<'ctx>,
    /// Floats per K/V row (`kv_heads · head_dim`).
    kv_width: IntValue<'ctx>,
    /// Query heads per K/V head.
    group: IntValue<'ctx>,
}

/// One (query row, query head): where its data lives and which keys it sees.
struct Query<'ctx> {
    /// First float of the head in the query row (of `q`, `out`, `d_out`, `dq`).
    q_at: IntValue<'ctx>,
    /// Index of the (row, head) in `lse`.
    lse_at: IntValue<'ctx>,
    /// First float of the query's K/V head at its sample's position 0 (of `k`, `v`).
    kv_at: IntValue<'ctx>,
    /// Keys the query sees: `position + 1`.
    visible: IntValue<'ctx>,
}

impl<'ctx> Shape<'ctx> {
    fn of(kb: &KernelBuilder<'ctx, '_>) -> Result<Shape<'ctx>> {
        let (heads, kv_heads, head_dim) = (kb.int("heads"), kb.int("kv_heads"), kb.int("head_dim"));
        Ok(Shape {
            positions: kb.ptr("positions"),
            cu_seqlens_q: kb.ptr("cu_seqlens_q"),
            kv_starts: kb.ptr("kv_starts"),
            slices: kb.int("slices"),
            heads,
            kv_heads,
            head_dim,
            scale: kb.float("scale"),
            q_width: kb.mul(heads, head_dim)?,
            kv_width: kb.mul(kv_heads, head_dim)?,
            group: kb.divrem(heads, kv_heads)?.0,
        })
    }

    /// Runs `body` for every (query row, query head) item, in a grid-stride loop.
    fn for_each_query<'m>(
        &self,
        kb: &KernelBuilder<'ctx, 'm>,
        body: impl FnOnce(&KernelBuilder<'ctx, 'm>, &Query<'ctx>) -> Result<()>,
    ) -> Result<()> {
        let items = kb.mul(kb.int("total_q"), self.heads)?;
        kb.grid_stride_loop(items, |kb, index| {
            let (row, head) = kb.divrem(index, self.heads)?;
            let slice = self.slice_of(kb, row)?;
            let query = self.query(kb, row, head, kb.load_i32(self.kv_starts, slice)?)?;
            body(kb, &query)
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

    /// Query `row`, head `head`, whose sample's K/V start at pool row `kv_start`.
    fn query(
        &self,
        kb: &KernelBuilder<'ctx, '_>,
        row: IntValue<'ctx>,
        head: IntValue<'ctx>,
        kv_start: IntValue<'ctx>,
    ) -> Result<Query<'ctx>> {
        let kv_head = kb.divrem(head, self.group)?.0;
        Ok(Query {
            q_at: kb.add(kb.mul(row, self.q_width)?, kb.mul(head, self.head_dim)?)?,
            lse_at: kb.add(kb.mul(row, self.heads)?, head)?,
            kv_at: kb.add(
                kb.mul(kv_start, self.kv_width)?,
                kb.mul(kv_head, self.head_dim)?,
            )?,
            visible: kb.add(kb.load_i32(self.positions, row)?, kb.i64(1))?,
        })
    }

    /// First float of key/value row `j` of `query`'s sample (of `k`, `v`, `dk`, `dv`).
    fn key_at(
        &self,
        kb: &KernelBuilder<'ctx, '_>,
        query: &Query<'ctx>,
        j: IntValue<'ctx>,
    ) -> Result<IntValue<'ctx>> {
        kb.add(query.kv_at, kb.mul(j, self.kv_width)?)
    }

    /// `Σ_c a[a_at + c] · b[b_at + c]` over a head's `head_dim` floats.
    fn dot(
        &self,
        kb: &KernelBuilder<'ctx, '_>,
        (a, a_at): (PointerValue<'ctx>, IntValue<'ctx>),
        (b, b_at): (PointerValue<'ctx>, IntValue<'ctx>),
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

    /// The scaled score `scale · q · k` of the query head at `q_at` and the key head at `key_at`.
    fn score(
        &self,
        kb: &KernelBuilder<'ctx, '_>,
        (q, q_at): (PointerValue<'ctx>, IntValue<'ctx>),
        (k, key_at): (PointerValue<'ctx>, IntValue<'ctx>),
    ) -> Result<FloatValue<'ctx>> {
        let dot = self.dot(kb, (q, q_at), (k, key_at))?;
        kb.fmul(self.scale, dot)
    }

    /// `body(c)` for every float `c` of a head.
    fn for_each_column<'m>(
        &self,
        kb: &KernelBuilder<'ctx, 'm>,
        body: impl FnOnce(&KernelBuilder<'ctx, 'm>, IntValue<'ctx>) -> Result<()>,
    ) -> Result<()> {
        kb.for_range(kb.i64(0), self.head_dim, kb.i64(1), body)
    }

    /// `body(j)` for every key row `j` `query` sees.
    fn for_each_key<'m>(
        &self,
        kb: &KernelBuilder<'ctx, 'm>,
        query: &Query<'ctx>,
        body: impl FnOnce(&KernelBuilder<'ctx, 'm>, IntValue<'ctx>) -> Result<()>,
    ) -> Result<()> {
        kb.for_range(kb.i64(0), query.visible, kb.i64(1), body)
    }
}

fn forward<'ctx>(context: &'ctx Context, module: &Module<'ctx>, target: Target) -> Result<()> {
    let kb = KernelBuilder::new(context, module, target, &FORWARD)?;
    let (q, k, v) = (kb.ptr("q"), kb.ptr("k"), kb.ptr("v"));
    let (out, lse) = (kb.ptr("out"), kb.ptr("lse"));
    let shape = Shape::of(&kb)?;
    shape.for_each_query(&kb, |kb, query| {
        let score = |kb: &KernelBuilder<'ctx, '_>, j| {
            shape.score(kb, (q, query.q_at), (k, shape.key_at(kb, query, j)?))
        };
        let running_max = kb.local(kb.f32(f32::NEG_INFINITY))?;
        shape.for_each_key(kb, query, |kb, j| {
            let score = score(kb, j)?;
            let best = kb.combine(Combine::Max, kb.read(running_max, score)?, score)?;
            kb.write(running_max, best)
        })?;
        let max = kb.read(running_max, kb.f32(0.0))?;

        let running_sum = kb.local(kb.f32(0.0))?;
        shape.for_each_key(kb, query, |kb, j| {
            let term = kb.exp(kb.fsub(score(kb, j)?, max)?)?;
            kb.write(running_sum, kb.fadd(kb.read(running_sum, term)?, term)?)
        })?;
        let sum = kb.read(running_sum, kb.f32(0.0))?;
        kb.store_f32(lse, query.lse_at, kb.fadd(max, kb.ln(sum)?)?)?;

        shape.for_each_column(kb, |kb, c| {
            kb.store_f32(out, kb.add(query.q_at, c)?, kb.f32(0.0))
        })?;
        shape.for_each_key(kb, query, |kb, j| {
            let term = kb.exp(kb.fsub(score(kb, j)?, max)?)?;
            let probability = kb.fdiv(term, sum)?;
            let key_at = shape.key_at(kb, query, j)?;
            shape.for_each_column(kb, |kb, c| {
                let at = kb.add(query.q_at, c)?;
                let weighted = kb.fmul(probability, kb.load_f32(v, kb.add(key_at, c)?)?)?;
                kb.store_f32(out, at, kb.fadd(kb.load_f32(out, at)?, weighted)?)
            })
        })
    })?;
    kb.finish()
}

/// The backward's per-(query, key) terms: `P = exp(score − lse)` and
/// `dS = P · (d_out · v − d_out · out)` (unscaled: `dq = scale · Σ dS · k`, `dk = scale · Σ dS · q`).
struct Backward<'ctx> {
    q: PointerValue<'ctx>,
    k: PointerValue<'ctx>,
    v: PointerValue<'ctx>,
    out: PointerValue<'ctx>,
    lse: PointerValue<'ctx>,
    d_out: PointerValue<'ctx>,
}

impl<'ctx> Backward<'ctx> {
    fn of(kb: &KernelBuilder<'ctx, '_>) -> Backward<'ctx> {
        Backward {
            q: kb.ptr("q"),
            k: kb.ptr("k"),
            v: kb.ptr("v"),
            out: kb.ptr("out"),
            lse: kb.ptr("lse"),
            d_out: kb.ptr("d_out"),
        }
    }

    /// `d_out · out` of `query`: the softmax backward's row term.
    fn delta(
        &self,
        kb: &KernelBuilder<'ctx, '_>,
        shape: &Shape<'ctx>,
        query: &Query<'ctx>,
    ) -> Result<FloatValue<'ctx>> {
        shape.dot(kb, (self.d_out, query.q_at), (self.out, query.q_at))
    }

    /// `(P, dS)` of `query` and the key head at `key_at`, given the query's `delta`.
    fn terms(
        &self,
        kb: &KernelBuilder<'ctx, '_>,
        shape: &Shape<'ctx>,
        query: &Query<'ctx>,
        key_at: IntValue<'ctx>,
        delta: FloatValue<'ctx>,
    ) -> Result<(FloatValue<'ctx>, FloatValue<'ctx>)> {
        let score = shape.score(kb, (self.q, query.q_at), (self.k, key_at))?;
        let row_lse = kb.load_f32(self.lse, query.lse_at)?;
        let probability = kb.exp(kb.fsub(score, row_lse)?)?;
        let d_probability = shape.dot(kb, (self.d_out, query.q_at), (self.v, key_at))?;
        let d_score = kb.fmul(probability, kb.fsub(d_probability, delta)?)?;
        Ok((probability, d_score))
    }
}

fn backward_dq<'ctx>(context: &'ctx Context, module: &Module<'ctx>, target: Target) -> Result<()> {
    let kb = KernelBuilder::new(context, module, target, &BACKWARD_DQ)?;
    let (inputs, dq) = (Backward::of(&kb), kb.ptr("dq"));
    let shape = Shape::of(&kb)?;
    shape.for_each_query(&kb, |kb, query| {
        let delta = inputs.delta(kb, &shape, query)?;
        shape.for_each_column(kb, |kb, c| {
            kb.store_f32(dq, kb.add(query.q_at, c)?, kb.f32(0.0))
        })?;
        shape.for_each_key(kb, query, |kb, j| {
            let key_at = shape.key_at(kb, query, j)?;
            let (_, d_score) = inputs.terms(kb, &shape, query, key_at, delta)?;
            shape.for_each_column(kb, |kb, c| {
                let at = kb.add(query.q_at, c)?;
                let term = kb.fmul(d_score, kb.load_f32(inputs.k, kb.add(key_at, c)?)?)?;
                kb.store_f32(dq, at, kb.fadd(kb.load_f32(dq, at)?, term)?)
            })
        })?;
        shape.for_each_column(kb, |kb, c| {
            let at = kb.add(query.q_at, c)?;
            kb.store_f32(dq, at, kb.fmul(shape.scale, kb.load_f32(dq, at)?)?)
        })
    })?;
    kb.finish()
}

fn backward_dkv<'ctx>(context: &'ctx Context, module: &Module<'ctx>, target: Target) -> Result<()> {
    let kb = KernelBuilder::new(context, module, target, &BACKWARD_DKV)?;
    let (inputs, dk, dv) = (Backward::of(&kb), kb.ptr("dk"), kb.ptr("dv"));
    let shape = Shape::of(&kb)?;
    let (dk_sums, dv_sums) = (kb.f32_array(DKV_COLUMNS)?, kb.f32_array(DKV_COLUMNS)?);
    let chunk = kb.i64(u64::from(DKV_COLUMNS));
    let items = kb.mul(kb.int("kv_rows"), shape.kv_heads)?;
    kb.grid_stride_loop(items, |kb, index| {
        let (row, kv_head) = kb.divrem(index, shape.kv_heads)?;
        let key_at = kb.add(
            kb.mul(row, shape.kv_width)?,
            kb.mul(kv_head, shape.head_dim)?,
        )?;
        kb.for_range(kb.i64(0), shape.head_dim, chunk, |kb, first| {
            let columns = kb.umin(chunk, kb.sub(shape.head_dim, first)?)?;
            kb.for_range(kb.i64(0), columns, kb.i64(1), |kb, c| {
                kb.store_f32(dk_sums, c, kb.f32(0.0))?;
                kb.store_f32(dv_sums, c, kb.f32(0.0))
            })?;
            kb.for_range(kb.i64(0), shape.slices, kb.i64(1), |kb, slice| {
                let kv_start = kb.load_i32(shape.kv_starts, slice)?;
                kb.when(kb.unsigned_less_or_equal(kv_start, row)?, |kb| {
                    let key_position = kb.sub(row, kv_start)?;
                    let rows_start = kb.load_i32(shape.cu_seqlens_q, slice)?;
                    let rows_end = kb.load_i32(shape.cu_seqlens_q, kb.add(slice, kb.i64(1))?)?;
                    kb.for_range(rows_start, rows_end, kb.i64(1), |kb, q_row| {
                        let position = kb.load_i32(shape.positions, q_row)?;
                        kb.when(kb.unsigned_less_or_equal(key_position, position)?, |kb| {
                            let first_head = kb.mul(kv_head, shape.group)?;
                            let heads_end = kb.add(first_head, shape.group)?;
                            kb.for_range(first_head, heads_end, kb.i64(1), |kb, head| {
                                let query = shape.query(kb, q_row, head, kv_start)?;
                                let delta = inputs.delta(kb, &shape, &query)?;
                                let (probability, d_score) =
                                    inputs.terms(kb, &shape, &query, key_at, delta)?;
                                let q_first = kb.add(query.q_at, first)?;
                                kb.for_range(kb.i64(0), columns, kb.i64(1), |kb, c| {
                                    let at = kb.add(q_first, c)?;
                                    let dk_term = kb.fmul(d_score, kb.load_f32(inputs.q, at)?)?;
                                    let dk_sum = kb.fadd(kb.load_f32(dk_sums, c)?, dk_term)?;
                                    kb.store_f32(dk_sums, c, dk_sum)?;
                                    let dv_term =
                                        kb.fmul(probability, kb.load_f32(inputs.d_out, at)?)?;
                                    let dv_sum = kb.fadd(kb.load_f32(dv_sums, c)?, dv_term)?;
                                    kb.store_f32(dv_sums, c, dv_sum)
                                })
                            })
                        })
                    })
                })
            })?;
            let key_first = kb.add(key_at, first)?;
            kb.for_range(kb.i64(0), columns, kb.i64(1), |kb, c| {
                let at = kb.add(key_first, c)?;
                let dk_add = kb.fmul(shape.scale, kb.load_f32(dk_sums, c)?)?;
                kb.store_f32(dk, at, kb.fadd(kb.load_f32(dk, at)?, dk_add)?)?;
                let dv_add = kb.load_f32(dv_sums, c)?;
                kb.store_f32(dv, at, kb.fadd(kb.load_f32(dv, at)?, dv_add)?)
            })
        })
    })?;
    kb.finish()
}
