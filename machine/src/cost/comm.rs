//! Communication: alpha-beta costs of point-to-point transfers and ring collectives, the link a
//! group of ranks uses, and the volumes of slimpack's collectives (TP with sequence
//! parallelism, the CP K/V exchange of merged groups, pipeline sends, DP gradient sync).
//!
//! Contract: times are seconds on one device's communication stream, assuming nothing else
//! shares the link; overlapping them with compute is the simulator's business. A group whose
//! devices all sit in one node (rank order tp fastest, then cp, dp, pp: [`ParallelSpec::rank`];
//! node = rank / `gpus_per_node`) uses the intra-node link, otherwise the inter-node one (a ring
//! that crosses nodes runs at the speed of its slowest hop).
//!
//! Ring costs with `n` members, a buffer of `B` bytes, link bandwidth `bw` and latency `α`
//! (Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective Communication Operations in
//! MPICH"; NCCL's ring algorithm): all-gather and reduce-scatter `(n−1)/n · B/bw + (n−1)·α`;
//! all-reduce, a reduce-scatter followed by an all-gather, `2(n−1)/n · B/bw + 2(n−1)·α`.

use slimpack_ir::spec::{LinkSpec, ModelSpec, ParallelSpec, RecomputeMix, Spec};
use slimpack_ir::step::Direction;

use super::memory::MAIN_GRAD_BYTES;

/// TP collectives per layer and direction with sequence parallelism (Korthikanti et al. 2022,
/// §4.2.2): an all-gather before and a reduce-scatter after each of the attention and MLP
/// blocks in the forward; the transposed pair in the backward. Megatron's extra backward
/// all-gather of the sharded input for the weight gradient overlaps the input-gradient GEMM and
/// is not counted.
pub const TP_COLLECTIVES_PER_LAYER: f64 = 4.0;

/// All-reduces of one fp32 value per token in the forward of Megatron's vocab-parallel
/// cross-entropy: the max logit, the sum of exponentials, the target logit.
pub const LOSS_ALL_REDUCES: f64 = 3.0;

/// Bytes per token of each of the loss's all-reduces (one fp32 value).
const LOSS_REDUCE_BYTES_PER_TOKEN: f64 = 4.0;

/// Ring passes of the K/V blocks per layer in the backward of ring attention: the K/V blocks
/// again, and the dK/dV partial sums travelling back (both in the activation dtype, as in
/// Transformer Engine's `AttnFuncWithCPAndKVP2P`). The forward makes one pass.
pub const CP_BACKWARD_RING_PASSES: f64 = 2.0;

/// Seconds to send `bytes` over `link`.
pub fn p2p_time(bytes: f64, link: &LinkSpec) -> f64 {
    if bytes <= 0.0 {
        return 0.0;
    }
    link.latency + bytes / link.bandwidth
}

/// Ring all-gather among `n` devices; `bytes` is the size of the gathered buffer.
pub fn all_gather_time(bytes: f64, n: u32, link: &LinkSpec) -> f64 {
    if n <= 1 || bytes <= 0.0 {
        return 0.0;
    }
    let steps = f64::from(n - 1);
    steps / f64::from(n) * bytes / link.bandwidth + steps * link.latency
}

/// Ring reduce-scatter among `n` devices; `bytes` is the size of each device's input buffer.
pub fn reduce_scatter_time(bytes: f64, n: u32, link: &LinkSpec) -> f64 {
    all_gather_time(bytes, n, link)
}

/// Ring all-reduce among `n` devices of a `bytes`-byte buffer.
pub fn all_reduce_time(bytes: f64, n: u32, link: &LinkSpec) -> f64 {
    2.0 * all_gather_time(bytes, n, link)
}

/// Which link connects which ranks.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    parallel: ParallelSpec,
    gpus_per_node: u64,
    intra_node: LinkSpec,
    inter_node: LinkSpec,
}

impl Topology {
    /// The topology of `spec`'s cluster and layout.
    pub fn new(spec: &Spec) -> Topology {
        Topology {
            parallel: spec.parallel,
            gpus_per_node: u64::from(spec.cluster.gpus_per_node),
            intra_node: spec.cluster.intra_node,
            inter_node: spec.cluster.inter_node,
        }
    }

    /// Node of a global rank.
    pub fn node_of(&self, rank: u64) -> u64 {
        rank / self.gpus_per_node
    }

    /// The link between two ranks.
    pub fn link_between(&self, a: u64, b: u64) -> LinkSpec {
        self.link_if_one_node(self.node_of(a) == self.node_of(b))
    }

    /// The link a collective over `ranks` runs on.
    pub fn group_link(&self, ranks: impl IntoIterator<Item = u64>) -> LinkSpec {
        let mut nodes = ranks.into_iter().map(|r| self.node_of(r));
        let first = nodes.next();
        self.link_if_one_node(nodes.all(|node| Some(node) == first))
    }

    /// The link of the TP group of replica `dp` (static CP index `cp`) on `stage`.
    pub fn tp_link(&self, stage: u32, dp: u32, cp: u32) -> LinkSpec {
        let tp = self.parallel.tp;
        let stage = self.parallel.device_of_stage(stage);
        let rank = |t: u32| self.parallel.rank(coords(t, cp, dp, stage));
        self.group_link([rank(0), rank(tp - 1)])
    }

    /// The link shared by the devices of the replicas `dp_members` on pipeline stage `stage`
    /// (its device: `stage mod pp`; all TP and static CP ranks): the CP group of a DP-Merge group, or the DP group of gradient sync.
    pub fn replicas_link(&self, stage: u32, dp_members: impl IntoIterator<Item = u32>) -> LinkSpec {
        let (tp, cp) = (self.parallel.tp, self.parallel.cp_degree());
        let stage = self.parallel.device_of_stage(stage);
        let ranks = dp_members.into_iter().flat_map(|dp| {
            let first = self.parallel.rank(coords(0, 0, dp, stage));
            let last = self.parallel.rank(coords(tp - 1, cp - 1, dp, stage));
            [first, last]
        });
        self.group_link(ranks)
    }

    /// The fastest link a group of `devices` devices may use: the inter-node link when they
    /// cannot fit in one node, else the better of the two links in each of bandwidth and
    /// latency (a lower bound on any such group's transfer times).
    pub fn fastest_link_spanning(&self, devices: u64) -> LinkSpec {
        if devices > self.gpus_per_node {
            return self.inter_node;
        }
        LinkSpec {
            bandwidth: self.intra_node.bandwidth.max(self.inter_node.bandwidth),
            latency: self.intra_node.latency.min(self.inter_node.latency),
        }
    }

    fn link_if_one_node(&self, one_node: bool) -> LinkSpec {
        if one_node {
            self.intra_node
        } else {
            self.inter_node
        }
    }
}

fn coords(tp: u32, cp: u32, dp: u32, pp: u32) -> slimpack_ir::spec::Coords {
    slimpack_ir::spec::Coords { tp, cp, dp, pp }
}

/// Per-spec communication volumes and the collectives built from them.
#[derive(Debug, Clone, PartialEq)]
pub struct CommModel {
    topology: Topology,
    tp: u32,
    tp_link: LinkSpec,
    /// Bytes per token of one hidden-state row (`hidden · dtype`).
    hidden_row_bytes: f64,
    /// Bytes per token per layer of one device's K and V (`2 · kv_width · dtype / tp`).
    kv_bytes_per_token: f64,
    /// The recomputation over one model chunk's layers.
    recompute: RecomputeMix,
}

impl CommModel {
    /// The communication model of `spec`.
    pub fn new(spec: &Spec) -> CommModel {
        let topology = Topology::new(spec);
        let model: &ModelSpec = &spec.model;
        let dtype = model.dtype.bytes() as f64;
        let tp = spec.parallel.tp;
        CommModel {
            tp_link: topology.tp_link(0, 0, 0),
            topology,
            tp,
            hidden_row_bytes: f64::from(model.hidden) * dtype,
            kv_bytes_per_token: 2.0 * model.kv_width() as f64 * dtype / f64::from(tp),
            recompute: model.recompute.mix(spec.layers_per_chunk()),
        }
    }

    /// The topology.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Exposed TP time of one layer over `tokens` tokens (the TP group's tokens, before the
    /// sequence-parallel split); full recomputation replays the forward's collectives.
    pub fn tp_layer_time(&self, tokens: f64, direction: Direction) -> f64 {
        let one = self.tp_collective_time(tokens);
        let collectives = match direction {
            Direction::Backward => (1.0 + self.recompute.full) * TP_COLLECTIVES_PER_LAYER,
            Direction::Forward => TP_COLLECTIVES_PER_LAYER,
        };
        collectives * one
    }

    /// TP time outside the layers: the embedding's reduce-scatter (first stage) and, on the last
    /// stage, the all-gather before the output projection plus the loss's small all-reduces.
    pub fn tp_edges_time(&self, tokens: f64, first: bool, last: bool, direction: Direction) -> f64 {
        let one = self.tp_collective_time(tokens);
        let mut time = 0.0;
        if first {
            time += one;
        }
        if last {
            time += one;
            if direction == Direction::Forward {
                let loss_bytes = tokens * LOSS_REDUCE_BYTES_PER_TOKEN;
                time += LOSS_ALL_REDUCES * all_reduce_time(loss_bytes, self.tp, &self.tp_link);
            }
        }
        time
    }

    /// One sequence-parallel all-gather or reduce-scatter of `tokens` hidden rows.
    pub fn tp_collective_time(&self, tokens: f64) -> f64 {
        all_gather_time(tokens * self.hidden_row_bytes, self.tp, &self.tp_link)
    }

    /// Ring K/V exchange of one layer in a CP group of `degree` devices, each holding K/V of
    /// `keys_per_device` tokens: `degree − 1` steps, each sending one block.
    pub fn cp_layer_time(
        &self,
        keys_per_device: f64,
        degree: u32,
        link: &LinkSpec,
        direction: Direction,
    ) -> f64 {
        if degree <= 1 {
            return 0.0;
        }
        let block = keys_per_device * self.kv_bytes_per_token;
        let pass = f64::from(degree - 1) * p2p_time(block, link);
        let passes = match direction {
            Direction::Forward => 1.0,
            Direction::Backward => {
                let replay = self.recompute.full + self.recompute.selective;
                CP_BACKWARD_RING_PASSES + replay
            }
        };
        passes * pass
    }

    /// Pipeline send of `tokens` activation (or activation-gradient) rows between two ranks;
    /// with sequence parallelism each TP rank sends its `1/tp` share over its own link.
    pub fn send_time(&self, tokens: f64, from_rank: u64, to_rank: u64) -> f64 {
        let bytes = tokens * self.hidden_row_bytes / f64::from(self.tp);
        p2p_time(bytes, &self.topology.link_between(from_rank, to_rank))
    }

    /// DP gradient sync with the distributed optimizer over `group_size` devices holding
    /// `params` parameters each: reduce-scatter of the fp32 gradients (Megatron reduces bf16
    /// models' gradients in fp32, `--accumulate-allreduce-grads-in-fp32`) and all-gather of
    /// the updated `dtype`-byte parameters.
    pub fn dp_sync(
        &self,
        params: f64,
        dtype_bytes: f64,
        group_size: u32,
        link: &LinkSpec,
    ) -> DpSyncTime {
        DpSyncTime {
            grad_reduce_scatter_s: reduce_scatter_time(
                params * MAIN_GRAD_BYTES as f64,
                group_size,
                link,
            ),
            param_all_gather_s: all_gather_time(params * dtype_bytes, group_size, link),
        }
    }
}

/// The two halves of the distributed optimizer's DP communication; Megatron overlaps the first
/// with the backward (`--overlap-grad-reduce`) and the second with the next forward
/// (`--overlap-param-gather`), so the simulator gets them apart.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DpSyncTime {
    pub grad_reduce_scatter_s: f64,
    pub param_all_gather_s: f64,
}

impl DpSyncTime {
    /// Both halves, back to back.
    pub fn total_s(&self) -> f64 {
        self.grad_reduce_scatter_s + self.param_all_gather_s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(bandwidth: f64, latency: f64) -> LinkSpec {
        LinkSpec { bandwidth, latency }
    }

    #[test]
    fn ring_formulas_by_hand() {
        let l = link(100e9, 5e-6);
        // 8 devices, 800 MB: 7/8 · 8 ms + 7 · 5 µs.
        assert!((all_gather_time(800e6, 8, &l) - (7e-3 + 35e-6)).abs() < 1e-12);
        assert!((reduce_scatter_time(800e6, 8, &l) - (7e-3 + 35e-6)).abs() < 1e-12);
        assert!((all_reduce_time(800e6, 8, &l) - 2.0 * (7e-3 + 35e-6)).abs() < 1e-12);
        assert_eq!(all_gather_time(800e6, 1, &l), 0.0);
        assert!((p2p_time(1e9, &l) - (10e-3 + 5e-6)).abs() < 1e-12);
        assert_eq!(p2p_time(0.0, &l), 0.0);
    }

    #[test]
    fn groups_inside_a_node_use_the_intra_node_link() {
        let spec = Spec::from_presets("llama-7b", "h100-sxm", "tp=4,pp=2,dp=4").unwrap();
        let topology = Topology::new(&spec);
        let (intra, inter) = (spec.cluster.intra_node, spec.cluster.inter_node);
        assert_eq!(topology.tp_link(1, 3, 0), intra);
        // Replicas 0 and 1 of stage 0 are ranks 0..8: one node. Replicas 1 and 2: two nodes.
        assert_eq!(topology.replicas_link(0, [0, 1]), intra);
        assert_eq!(topology.replicas_link(0, [1, 2]), inter);
        assert_eq!(topology.replicas_link(0, 0..4), inter);
        // Stage 0 replica 0 (rank 0) to stage 1 replica 0 (rank 16): another node.
        assert_eq!(topology.link_between(0, 16), inter);
        assert_eq!(topology.link_between(0, 7), intra);
    }

    #[test]
    fn tp_layer_volume_is_four_hidden_collectives() {
        let spec = Spec::from_presets("llama-7b", "h100-sxm", "tp=8,pp=1,dp=1").unwrap();
        let comm = CommModel::new(&spec);
        // 4096 tokens · 4096 · 2 B = 32 MiB per collective: 7/8 of it at 450 GB/s, 7 · 5 µs.
        let one = 7.0 / 8.0 * 4096.0 * 4096.0 * 2.0 / 450e9 + 7.0 * 5e-6;
        let layer = comm.tp_layer_time(4096.0, Direction::Forward);
        assert!((layer - 4.0 * one).abs() < 1e-12, "{layer}");
        assert_eq!(comm.tp_layer_time(4096.0, Direction::Backward), layer);
    }

    #[test]
    fn cp_exchange_sends_degree_minus_one_blocks() {
        let spec = Spec::from_presets("llama-70b", "h100-sxm", "tp=8,pp=1,dp=4").unwrap();
        let comm = CommModel::new(&spec);
        let l = spec.cluster.inter_node;
        // K and V of 8 K/V heads · 128 / tp 8, bf16: 512 B per token; 16K keys per device.
        let block = 16384.0 * 512.0;
        let forward = comm.cp_layer_time(16384.0, 4, &l, Direction::Forward);
        assert!((forward - 3.0 * (l.latency + block / l.bandwidth)).abs() < 1e-12);
        let backward = comm.cp_layer_time(16384.0, 4, &l, Direction::Backward);
        assert!((backward - 2.0 * forward).abs() < 1e-12);
        assert_eq!(comm.cp_layer_time(16384.0, 1, &l, Direction::Forward), 0.0);
    }
}
