//! Context parallelism inside the numerical core: how the `k` workers of a DP-Merge group split
//! a pack's tokens, and how they see each other's keys and values.
//!
//! Split ([`CpShard`]): every slice is cut into `2k` chunks of (nearly) equal length and worker
//! `i` takes chunks `i` and `2k − 1 − i` — Megatron-LM's load-balanced causal split, under which
//! every worker has about the same number of tokens *and* of causal (query, key) pairs. A
//! worker runs the per-token work (norms, projections, MLP, head) of its tokens only, keeps the
//! K/V of its tokens only (the K/V store of a merged sample is sharded), and sends and receives
//! its own tokens' hidden states along the pipeline. A slice shorter than `2k` tokens leaves
//! some workers without any of its tokens; they still take part in its exchanges. The split is
//! defined once, in `slimpack_ir::program::CpShard`, which the schedule JSON also states for
//! trainers.
//!
//! Attention ([`KvExchange`]), the all-gather scheme (as in Llama 3's context parallelism):
//! - forward, per slice and layer: the workers all-gather the K/V rows they hold of the
//!   slice's sample (positions `0..end`), each assembles the whole prefix in position order and
//!   runs its queries against it — the same keys, in the same order, as one worker would see;
//! - backward, per slice and layer: each worker gathers the prefix again, computes its queries'
//!   contributions to the gradients of every prefix key and value, and the workers exchange
//!   those; each adds, in worker order, the rows of the positions it owns into its dK/dV
//!   accumulators (a reduce-scatter). A slice's own rows are then complete, as on one worker.
//!
//! The gathered prefix lives only while one slice's attention runs on one layer. A ring of
//! K/V blocks with an online-softmax merge would move the same bytes with less transient
//! memory; the all-gather keeps the arithmetic identical to the single-worker path.

mod exchange;
pub(crate) mod gather;
mod thread_exchange;

pub use exchange::{KvExchange, LocalExchange};
pub use slimpack_ir::program::CpShard;
pub use thread_exchange::ThreadExchange;
