//! The IR side of MicroPack building: per replica, turn samples into chains of slice costs
//! (machine-model FLOPs at each slice's offset, in the direction packed), partition them, and
//! add the packs to the IR.

use std::collections::HashMap;

use slimpack_ir::step::{Direction, Pack, PackId, ReplicaId, SliceId};
use slimpack_ir::StepIr;
use slimpack_machine::cost::CostModel;

use super::{partition, Chains, Item};

/// Options shared by `pack-fwd` and `pack-bwd`.
pub(crate) const OPTIONS: &[crate::pass::OptionInfo] = &[
    crate::pass::OptionInfo {
        name: "cap",
        help: "token cap per pack (default: the batch's context length, or the longest sample)",
        default: None,
    },
    crate::pass::OptionInfo {
        name: "packs",
        help: "minimum packs per replica (default: tokens / cap, rounded up)",
        default: None,
    },
];

/// `pack-bwd`'s options: the shared ones, and `mirror` (the no-asymmetry ablation).
pub(crate) const BACKWARD_OPTIONS: &[crate::pass::OptionInfo] = &[
    OPTIONS[0],
    OPTIONS[1],
    crate::pass::OptionInfo {
        name: "mirror",
        help: "true: reuse the forward packs' slices (no asymmetric partition), in an order \
               that keeps each sample's backward last slice first",
        default: Some("false"),
    },
];

/// Parsed options of a packing pass.
#[derive(Debug, Clone, Copy, Default)]
pub struct PackOptions {
    pub cap: Option<u32>,
    pub packs: Option<usize>,
    /// Backward only: mirror the forward packs instead of partitioning anew.
    pub mirror: bool,
}

impl PackOptions {
    pub(crate) fn parse(options: &crate::pass::PassOptions) -> crate::Result<PackOptions> {
        let cap = options.positive("cap")?;
        let packs = options.positive("packs")?;
        let mirror = options
            .get::<bool>("mirror", "true or false")?
            .unwrap_or(false);
        Ok(PackOptions { cap, packs, mirror })
    }
}

/// Builds the packs of one direction on every replica: chains in run order, costs from the
/// machine model (per-layer FLOPs of the slice at its offset, in that direction).
pub(crate) fn pack_direction(
    ir: &mut StepIr,
    cost: &CostModel,
    direction: Direction,
    options: PackOptions,
    pass: &'static str,
) -> crate::Result<crate::pass::Statistics> {
    if options.mirror {
        return mirror_forward(ir, pass);
    }
    let longest = ir
        .samples()
        .iter()
        .map(|&s| ir.sample(s).len)
        .max()
        .unwrap_or(1);
    let cap = options.cap.or(ir.batch.context).unwrap_or(longest);
    // See [`Chains`]: contiguous forward chains, but on model chunks (`vpp > 1`), where they
    // made the list schedule's step slower and its peak higher, free ones.
    let forward_rule = match ir.spec.parallel.vpp {
        1 => Chains::Contiguous,
        _ => Chains::Free,
    };
    let mut stats = (0usize, 0u64, 0.0f64, f64::INFINITY);
    let mut worst_spread: f64 = 1.0;
    let sample_slices = ir.sample_slices();
    for replica in ir.replicas().to_vec() {
        if !ir.packs_on(replica, direction).is_empty() {
            return Err(crate::PassError::Failed {
                pass,
                message: format!("replica already has {} packs", direction.keyword()),
            });
        }
        // Every chain's items and slice ids in one table each: chain `c` is at
        // `bounds[c]..bounds[c + 1]`.
        let (mut items, mut ids, mut bounds) = (Vec::new(), Vec::new(), vec![0]);
        let mut release = Vec::new();
        let forward_packs = ir.packs_on(replica, Direction::Forward);
        let forward_position = match direction {
            Direction::Backward => crate::schedule_pipeline::forward_positions(ir, &forward_packs),
            Direction::Forward => Default::default(),
        };
        for sample in ir.samples_on(replica) {
            let start = ids.len();
            ids.extend_from_slice(sample_slices.at(ir.position_of(sample)));
            if direction == Direction::Backward {
                ids[start..].reverse();
            }
            // A backward chain is released once the sample's forward is complete: at the
            // position of the forward pack that holds its last slice.
            release.push(
                ids.get(start)
                    .filter(|_| direction == Direction::Backward)
                    .and_then(|s| forward_position.get(s).copied())
                    .unwrap_or(0),
            );
            items.extend(ids[start..].iter().map(|&s| {
                let slice = ir.slice(s);
                Item {
                    cost: cost
                        .slice_flops(u64::from(slice.len), u64::from(slice.start), direction)
                        .total(),
                    tokens: slice.len,
                }
            }));
            bounds.push(ids.len());
        }
        // A slice longer than the cap fits no pack: the partition would put it in one over
        // the cap (which the verifier refuses, and `--no-verify` would let through).
        if let Some(longest) = items
            .iter()
            .map(|item| item.tokens)
            .max()
            .filter(|&t| t > cap)
        {
            return Err(crate::PassError::Failed {
                pass,
                message: format!(
                    "a slice of {longest} tokens is longer than the cap of {cap} tokens per \
                     pack: cut the samples first (slice{{size={cap}}}) or raise cap"
                ),
            });
        }
        let chains: Vec<&[Item]> = bounds.windows(2).map(|w| &items[w[0]..w[1]]).collect();
        let ids: Vec<&[SliceId]> = bounds.windows(2).map(|w| &ids[w[0]..w[1]]).collect();
        if chains.is_empty() {
            continue;
        }
        let parts = if direction == Direction::Backward {
            windowed(&chains, &release, forward_packs.len(), cap)
        } else {
            let tokens: u64 = items.iter().map(|i| u64::from(i.tokens)).sum();
            let by_cap = tokens.div_ceil(u64::from(cap)) as usize;
            partition(
                &chains,
                &release,
                options.packs.unwrap_or(1).max(by_cap),
                cap,
                forward_rule,
            )
        };
        let loads: Vec<f64> = parts
            .iter()
            .map(|p| p.iter().map(|&(c, i)| chains[c][i].cost).sum())
            .collect();
        let mean = loads.iter().sum::<f64>() / loads.len() as f64;
        let max = loads.iter().copied().fold(0.0, f64::max);
        worst_spread = worst_spread.max(if mean > 0.0 { max / mean } else { 1.0 });
        for mut members in parts {
            // Inside a pack, slices run in sample order, each sample's in its run order.
            members.sort_unstable();
            let slices: Vec<_> = members.iter().map(|&(c, i)| ids[c][i]).collect();
            let pack_tokens: u64 = members
                .iter()
                .map(|&(c, i)| u64::from(chains[c][i].tokens))
                .sum();
            stats.1 = stats.1.max(pack_tokens);
            stats.3 = stats.3.min(pack_tokens as f64);
            ir.add_pack(
                Pack {
                    direction,
                    cap: Some(cap),
                },
                replica,
                &slices,
            );
            stats.0 += 1;
        }
        stats.2 += 1.0;
    }
    Ok(crate::pass::Statistics::new()
        .with("packs", stats.0)
        .with("cap", cap)
        .with("largest_pack_tokens", stats.1)
        .with(
            "smallest_pack_tokens",
            if stats.3.is_finite() {
                stats.3 as u64
            } else {
                0
            },
        )
        .with("cost_spread", worst_spread))
}

/// Forward packs per backward window: the samples whose forward completes within a window of
/// this many forward packs are backwarded by as many backward packs, balanced on backward cost
/// among themselves. The window bounds how long activations wait for their backward (memory)
/// while leaving room to rebalance (the asymmetry).
const BACKWARD_WINDOW: usize = 4;

/// Backward packs window by window (see [`BACKWARD_WINDOW`]): chains grouped by the window of
/// their release, each group partitioned into as many packs as its window has forward packs
/// (more if the cap needs them), in window order.
fn windowed(
    chains: &[&[Item]],
    release: &[usize],
    forward_packs: usize,
    cap: u32,
) -> super::Partition {
    let windows = forward_packs.div_ceil(BACKWARD_WINDOW).max(1);
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); windows];
    for (chain, &r) in release.iter().enumerate() {
        groups[(r / BACKWARD_WINDOW).min(windows - 1)].push(chain);
    }
    let mut parts = Vec::new();
    for (window, members) in groups.iter().enumerate() {
        if members.is_empty() {
            continue;
        }
        let sub: Vec<&[Item]> = members.iter().map(|&c| chains[c]).collect();
        let sub_release: Vec<usize> = members
            .iter()
            .map(|&c| release[c].saturating_sub(window * BACKWARD_WINDOW))
            .collect();
        let in_window = (forward_packs - window * BACKWARD_WINDOW).min(BACKWARD_WINDOW);
        let tokens: u64 = (sub.iter().flat_map(|c| c.iter()))
            .map(|i| u64::from(i.tokens))
            .sum();
        let count = in_window
            .max(tokens.div_ceil(u64::from(cap)) as usize)
            .max(1);
        for pack in partition(&sub, &sub_release, count, cap, Chains::Free) {
            parts.push(pack.into_iter().map(|(c, i)| (members[c], i)).collect());
        }
    }
    parts
}

/// The no-asymmetry ablation: backward packs hold exactly the forward packs' slices. Their order
/// is the forward order where possible (1F1B-friendly), except that a pack holding a later
/// slice of a sample must come before one holding an earlier slice (Kahn's algorithm, lowest
/// forward position first).
fn mirror_forward(ir: &mut StepIr, pass: &'static str) -> crate::Result<crate::pass::Statistics> {
    let mut packs = 0usize;
    for replica in ir.replicas().to_vec() {
        if !ir.packs_on(replica, Direction::Backward).is_empty() {
            return Err(crate::PassError::Failed {
                pass,
                message: "replica already has bwd packs".into(),
            });
        }
        for forward_pack in mirrored_order(ir, replica) {
            let cap = ir.pack(forward_pack).cap;
            let mut slices = ir.pack_slices(forward_pack);
            slices.reverse();
            ir.add_pack(
                Pack {
                    direction: Direction::Backward,
                    cap,
                },
                replica,
                &slices,
            );
            packs += 1;
        }
    }
    Ok(crate::pass::Statistics::new()
        .with("packs", packs)
        .with("mirrored", true))
}

/// The forward packs of a replica in a valid backward order (see [`mirror_forward`]).
fn mirrored_order(ir: &StepIr, replica: ReplicaId) -> Vec<PackId> {
    let forward = ir.packs_on(replica, Direction::Forward);
    let position: HashMap<PackId, usize> =
        forward.iter().enumerate().map(|(i, &p)| (p, i)).collect();
    // before[q] = packs that must run before q: those holding a later slice of a sample q holds.
    let mut indegree = vec![0usize; forward.len()];
    let mut successors: Vec<Vec<usize>> = vec![Vec::new(); forward.len()];
    for sample in ir.samples_on(replica) {
        let slices = ir.slices_of(sample);
        for pair in slices.windows(2) {
            let earlier = ir
                .pack_of(pair[0], Direction::Forward)
                .map(|p| position[&p]);
            let later = ir
                .pack_of(pair[1], Direction::Forward)
                .map(|p| position[&p]);
            if let (Some(earlier), Some(later)) = (earlier, later) {
                if earlier != later {
                    successors[later].push(earlier);
                    indegree[earlier] += 1;
                }
            }
        }
    }
    let mut ready: std::collections::BTreeSet<usize> =
        (0..forward.len()).filter(|&i| indegree[i] == 0).collect();
    let mut order = Vec::with_capacity(forward.len());
    while let Some(next) = ready.pop_first() {
        order.push(forward[next]);
        for &after in &successors[next] {
            indegree[after] -= 1;
            if indegree[after] == 0 {
                ready.insert(after);
            }
        }
    }
    order
}
