//! A lower bound on the simulated time of *any* schedule of a batch, from the batch alone:
//! what the tuner prunes candidates with before compiling them.
//!
//! [`CostModel::step_time_lower_bound`] prices the samples' work the way the simulator prices
//! a pack (`CostModel::pack_time`), at the most favourable rates any packing could reach, and
//! spreads it perfectly over the devices of each pipeline device. Why no schedule the
//! simulator runs beats it:
//! - A device group's compute stream runs its pack tasks one at a time, and a pipeline device's
//!   DP sync (gradient reduce-scatter, optimizer step, parameter all-gather) starts after its
//!   last backward on every group and runs them in sequence: the step ends no earlier than
//!   `busy(group) + tail(device)` for every group, hence no earlier than the mean `busy` of the
//!   device's groups plus its tail, the figure computed here (the largest over devices).
//! - A pack's device-seconds (its time times its devices, `tp` times its CP degree) are at least
//!   what is summed here, whatever the slicing, packing, CP degree or DP-Merge:
//!   - attention: a slice's causal pairs sum to its sample's (`causal_pairs` is additive over a
//!     sample's slices), and its query length per device is at most the sample's length over
//!     the smallest CP degree a pack may have (`merged` DP replicas times the layout's CP),
//!     where the rate is at most [`Throughput::best_rate_up_to`] of it; splitting over more
//!     devices only lowers the rate, so a sample's attention costs at least its FLOPs there;
//!   - CP exchange: a pack's critical path holds the larger of its attention and its ring K/V
//!     exchange (`compute + max(0, exchange − attention)`), and over packs the sum of the
//!     larger is at least the larger of the sums; the exchange's device-seconds grow with the
//!     CP degree and the keys (at least the tokens), and are affine in them with a
//!     non-negative latency, so the packs' sum is at least one exchange of all tokens at the
//!     smallest CP degree, over the fastest link a group of that size may use;
//!   - GEMMs and the memory-bound kernels: FLOPs and bytes linear in tokens, at the saturated
//!     rates;
//!   - TP collectives: at least the first of the `tp` ring steps stays exposed
//!     ([`exposed_tp_comm`]), and a collective's time is affine in its tokens with a
//!     non-negative latency, so the packs' sum is at least one collective over all tokens;
//!   - kernel launch overheads, pipeline sends, fill and drain and imbalance are left out (all
//!     non-negative).
//!
//! Recomputation is priced as the simulator does (the backward replays forward work at forward
//! rates), so the bound separates the recompute modes of one batch.

use super::{causal_pairs, recomputed_forward};
use super::{
    exposed_tp_comm, CostModel, OpKind, BACKWARD_ATTENTION_FACTOR, BACKWARD_LINEAR_FACTOR,
};
use slimpack_ir::step::Direction;

/// Relative slack taken off the bound so that floating-point summation in another order (the
/// simulator sums per pack) never puts it above a simulated time it equals in exact arithmetic.
const ROUNDING_SLACK: f64 = 1e-9;

impl CostModel {
    /// A lower bound on the step time the simulator reports for any schedule of samples of
    /// `lengths` tokens under this model whose every pack runs on at least `merged` DP
    /// replicas (a static CP degree taken from the DP pool; 1 without one), see the module
    /// documentation.
    pub fn step_time_lower_bound(&self, lengths: &[u64], merged: u32) -> f64 {
        self.step_time_lower_bound_of(&self.batch_attention(lengths, merged))
    }

    /// The part of [`CostModel::step_time_lower_bound`] that reads every sample: the batch's
    /// tokens and its attention at the best rates packs of at least `merged` DP replicas
    /// reach. It depends on the device's kernel rates, the layout's CP degree and `merged`
    /// only, not on the recomputation mode or model chunks, so a tuner computes it once for
    /// the candidates of a batch that share a static CP degree and prices each with
    /// [`CostModel::step_time_lower_bound_of`] under its own model.
    pub fn batch_attention(&self, lengths: &[u64], merged: u32) -> BatchAttention {
        let throughput = self.throughput();
        let split = merged.max(1) * self.spec.parallel.cp_degree();
        // Seconds per attention FLOP summed over samples, weighted by their causal pairs.
        let (mut forward_pairs_s, mut backward_pairs_s) = (0.0, 0.0);
        let mut tokens = 0u64;
        for &len in lengths {
            if len == 0 {
                continue;
            }
            tokens += len;
            let pairs = causal_pairs(len, 0) as f64;
            let query = len as f64 / f64::from(split);
            forward_pairs_s += pairs / throughput.best_rate_up_to(OpKind::AttentionForward, query);
            backward_pairs_s +=
                pairs / throughput.best_rate_up_to(OpKind::AttentionBackward, query);
        }
        BatchAttention {
            tokens,
            split,
            pairs_s: PairSeconds {
                forward: forward_pairs_s,
                backward: backward_pairs_s,
            },
        }
    }

    /// [`CostModel::step_time_lower_bound`] of a batch whose [`BatchAttention`] a model of
    /// the same device and layout computed.
    pub fn step_time_lower_bound_of(&self, batch: &BatchAttention) -> f64 {
        let BatchAttention {
            tokens,
            split,
            ref pairs_s,
        } = *batch;
        let parallel = &self.spec.parallel;
        let mut busy = vec![0.0f64; parallel.pp as usize];
        if tokens > 0 {
            for stage in 0..parallel.stages() {
                let device = parallel.device_of_stage(stage) as usize;
                for direction in [Direction::Forward, Direction::Backward] {
                    busy[device] +=
                        self.stage_device_seconds(stage, direction, tokens, split, pairs_s);
                }
            }
        }
        let devices_per_pipeline_device = parallel.world() as f64 / f64::from(parallel.pp);
        let all_ranks: Vec<u32> = (0..parallel.dp).collect();
        let mut bound = 0.0f64;
        for (device, busy) in busy.into_iter().enumerate() {
            let device = device as u32;
            let tail = self.dp_sync(device, &all_ranks).total_s() + self.optimizer_time(device);
            bound = bound.max(busy / devices_per_pipeline_device + tail);
        }
        bound * (1.0 - ROUNDING_SLACK)
    }

    /// Device-seconds no backward packing of `batch`'s samples avoids on `stage` (each pack
    /// on CP groups of at least the devices `batch` was read for, [`CostModel::batch_attention`]),
    /// whatever the packs: what [`CostModel::step_time_lower_bound`] counts of the backward.
    pub fn backward_device_seconds_lower_bound(&self, stage: u32, batch: &BatchAttention) -> f64 {
        if batch.tokens == 0 {
            return 0.0;
        }
        self.stage_device_seconds(
            stage,
            Direction::Backward,
            batch.tokens,
            batch.split,
            &batch.pairs_s,
        )
    }

    /// Device-seconds no packing of `tokens` tokens in CP groups of at least `split` devices
    /// (per TP rank) avoids on `stage` in `direction`; the attention from the samples'
    /// [`PairSeconds`].
    fn stage_device_seconds(
        &self,
        stage: u32,
        direction: Direction,
        tokens: u64,
        split: u32,
        pairs_s: &PairSeconds,
    ) -> f64 {
        let throughput = self.throughput();
        let saturated = |op| throughput.saturated_rate(op);
        let (replayed_linear, replayed_attention) = recomputed_forward(self.recompute_mix());
        let layers = f64::from(self.layers_per_stage);
        let (first, last) = (stage == 0, self.is_last(stage));
        let total = tokens as f64;
        let per_pair = self.flops.attention_per_pair() * layers;
        let attention = match direction {
            Direction::Forward => per_pair * pairs_s.forward,
            Direction::Backward => {
                per_pair
                    * (BACKWARD_ATTENTION_FACTOR * pairs_s.backward
                        + replayed_attention * pairs_s.forward)
            }
        };
        let layer_linear = self.flops.linear_per_token() * layers * total;
        let mut forward_linear = layer_linear;
        if last {
            forward_linear += self.flops.head_per_token() * total;
        }
        let gemm = match direction {
            Direction::Forward => forward_linear / saturated(OpKind::GemmForward),
            Direction::Backward => {
                BACKWARD_LINEAR_FACTOR * forward_linear / saturated(OpKind::GemmBackward)
                    + replayed_linear * layer_linear / saturated(OpKind::GemmForward)
            }
        };
        let mut bytes_per_token = self.traffic.layer(direction) * layers;
        if first {
            bytes_per_token += self.traffic.embedding(direction);
        }
        if last {
            bytes_per_token += self.traffic.head(direction);
        }
        let elementwise = self.tp * bytes_per_token * total / saturated(OpKind::Elementwise);
        let tp_comm = layers * self.comm.tp_layer_time(total, direction)
            + self.comm.tp_edges_time(total, first, last, direction);
        // Per device at least `tp_comm / tp` of a pack's collectives is exposed, on `tp` devices
        // (times its CP degree, which only adds latency).
        let tp_exposed = self.tp * exposed_tp_comm(tp_comm, f64::INFINITY, self.spec.parallel.tp);
        let cp_exchange = self.cp_exchange_device_seconds(total, split, direction) * layers;
        attention.max(cp_exchange) + gemm + elementwise + tp_exposed
    }

    /// Device-seconds of one layer's ring K/V exchange of `tokens` keys in one CP group of
    /// `split` devices per TP rank, over the fastest link such a group may use.
    fn cp_exchange_device_seconds(&self, tokens: f64, split: u32, direction: Direction) -> f64 {
        if split <= 1 {
            return 0.0;
        }
        let devices = u64::from(split) * u64::from(self.spec.parallel.tp);
        let link = self.comm.topology().fastest_link_spanning(devices);
        let degree = f64::from(split);
        devices as f64
            * self
                .comm
                .cp_layer_time(tokens / degree, split, &link, direction)
    }
}

/// A batch's tokens and attention as [`CostModel::step_time_lower_bound`] prices them
/// ([`CostModel::batch_attention`]).
#[derive(Debug, Clone, Copy)]
pub struct BatchAttention {
    tokens: u64,
    /// The smallest CP group a pack may run on, in devices per TP rank.
    split: u32,
    pairs_s: PairSeconds,
}

/// Σ over samples of causal pairs over the best attention rate their length allows, forward
/// and backward kernels: seconds per attention FLOP-per-pair.
#[derive(Debug, Clone, Copy)]
struct PairSeconds {
    forward: f64,
    backward: f64,
}
