//! The IR side of MicroPack building: per replica, turn samples into chains of slice costs
//! (machine-model FLOPs at each slice's offset, in the direction packed), partition them, and
//! add the packs to the IR.

use rustc_hash::FxHashMap as HashMap;

use slimpack_ir::step::{Direction, Pack, PackId, ReplicaId, SliceId};
use slimpack_ir::StepIr;
use slimpack_machine::cost::{CostModel, DEFAULT_MEMORY_LIMIT};

use super::{partition, run_tokens, Chains, Item};

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

/// `pack-fwd`'s options: the shared ones, `runs` and `memory`.
pub(crate) const FORWARD_OPTIONS: &[crate::pass::OptionInfo] = &[
    OPTIONS[0],
    OPTIONS[1],
    crate::pass::OptionInfo {
        name: "runs",
        help: "bounded: where a run of packs joined by a sample's slices (all in flight until \
               its first backward) would not fit in memory, close runs before they do; free: \
               never",
        default: Some("free"),
    },
    crate::pass::OptionInfo {
        name: "memory",
        help: "the fraction of device memory a run's forwards may fill: runs=bounded bounds \
               them to it; either way the statistic runs_over_memory counts the replicas whose \
               free runs would not fit",
        default: Some("0.92"),
    },
];

/// `pack-fwd`'s statistic: the replicas whose forward runs, partitioned freely, would not fit
/// in the `memory` fraction of their devices (what `runs=bounded` would change).
pub const RUNS_OVER_MEMORY: &str = "runs_over_memory";

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
#[derive(Debug, Clone, Copy)]
pub struct PackOptions {
    pub cap: Option<u32>,
    pub packs: Option<usize>,
    /// Forward only: bound the runs of packs that samples join by memory (see
    /// [`run_window`]), where they would not fit.
    pub bounded_runs: bool,
    /// The fraction of device memory a run's forwards may fill.
    pub memory: f64,
    /// Backward only: mirror the forward packs instead of partitioning anew.
    pub mirror: bool,
}

impl Default for PackOptions {
    fn default() -> PackOptions {
        PackOptions {
            cap: None,
            packs: None,
            bounded_runs: false,
            memory: DEFAULT_MEMORY_LIMIT,
            mirror: false,
        }
    }
}

impl PackOptions {
    pub(crate) fn parse(options: &crate::pass::PassOptions) -> crate::Result<PackOptions> {
        let cap = options.positive("cap")?;
        let packs = options.positive("packs")?;
        let bounded_runs = match options.get::<String>("runs", "bounded or free")?.as_deref() {
            Some("bounded") => true,
            Some("free") | None => false,
            Some(other) => {
                return Err(crate::PassError::BadOption {
                    pass: options.pass,
                    option: "runs".into(),
                    value: other.into(),
                    message: "expected bounded or free".into(),
                })
            }
        };
        let memory = options.fraction("memory")?.unwrap_or(DEFAULT_MEMORY_LIMIT);
        let mirror = options
            .get::<bool>("mirror", "true or false")?
            .unwrap_or(false);
        Ok(PackOptions {
            cap,
            packs,
            bounded_runs,
            memory,
            mirror,
        })
    }
}

/// Each replica's share of the activation memory of the devices it runs on: its tokens per
/// device over all the tokens those devices run, on the device where that is least. A device
/// runs its own DP rank's replica and the DP-Merge groups that hold its rank, and their
/// forwards are in flight side by side.
pub(crate) fn memory_shares(ir: &StepIr) -> HashMap<ReplicaId, f64> {
    let per_device = |replica: ReplicaId| -> f64 {
        let tokens: u64 = (ir.samples_on(replica).iter())
            .map(|&s| u64::from(ir.sample(s).len))
            .sum();
        tokens as f64 / ir.replica(replica).ranks.len().max(1) as f64
    };
    let own: Vec<(ReplicaId, f64)> = (ir.replicas().iter())
        .map(|&r| (r, per_device(r)))
        .collect();
    let mut device = vec![0.0f64; ir.spec.parallel.dp as usize];
    for &(replica, tokens) in &own {
        for &rank in &ir.replica(replica).ranks {
            if let Some(total) = device.get_mut(rank as usize) {
                *total += tokens;
            }
        }
    }
    own.into_iter()
        .map(|(replica, tokens)| {
            let share = (ir.replica(replica).ranks.iter())
                .filter_map(|&rank| device.get(rank as usize))
                .map(|&total| if total > 0.0 { tokens / total } else { 1.0 })
                .fold(1.0, f64::min);
            (replica, share)
        })
        .collect()
}

/// The most tokens of a run of forward packs (see [`super::partition`]) that one of `replica`'s devices
/// can hold in flight: on every pipeline stage, the tokens whose activations and K/V fit in the
/// replica's `share` (see [`memory_shares`]) of the `fraction` of device memory the model
/// states leave (the replica's tokens, which its CP ranks share), less one pack of `cap`
/// tokens (the next run's first forward, which 1F1B runs beside the run's backwards); the least
/// over the stages. A run no longer than the warm-up adds nothing to what 1F1B holds anyway;
/// a longer one is all in flight. `None` on model chunks (`vpp > 1`), whose list schedule
/// keeps its own memory window.
pub(crate) fn run_window(
    ir: &StepIr,
    cost: &CostModel,
    replica: ReplicaId,
    share: f64,
    cap: u32,
    fraction: f64,
) -> Option<u64> {
    let parallel = &ir.spec.parallel;
    if parallel.vpp > 1 {
        return None;
    }
    let memory = cost.memory();
    let cp = ir.replica(replica).ranks.len().max(1) as u64;
    // Held bytes are linear in the tokens (up to rounding): priced on a large share.
    const SHARE: u64 = 1 << 24;
    (0..parallel.pp)
        .map(|stage| {
            let per_token = memory.held_bytes(SHARE, stage) as f64 / SHARE as f64;
            let budget = memory.activation_budget(stage, fraction) as f64 * share;
            let tokens = ((budget / per_token.max(f64::MIN_POSITIVE)) as u64).saturating_mul(cp);
            tokens.saturating_sub(u64::from(cap))
        })
        .min()
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
    let shares = match direction {
        Direction::Forward => memory_shares(ir),
        Direction::Backward => HashMap::default(),
    };
    // Replicas whose free forward runs would not fit in memory, and those of them whose runs
    // were bounded (`runs=bounded`).
    let (mut over_memory, mut bounded) = (0usize, 0usize);
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
            let count = options.packs.unwrap_or(1).max(by_cap);
            // Runs are bounded only where asked and where memory needs it: a partition whose
            // runs all fit the window is kept as it is. Where they do not, the statistics say
            // so either way (the tuner compiles a bounded fallback only then).
            let free = partition(&chains, &release, count, cap, forward_rule, None);
            let share = shares.get(&replica).copied().unwrap_or(1.0);
            let window = run_window(ir, cost, replica, share, cap, options.memory)
                .filter(|&w| run_tokens(&chains, &free).into_iter().max().unwrap_or(0) > w);
            over_memory += usize::from(window.is_some());
            match window.filter(|_| options.bounded_runs) {
                Some(window) => {
                    bounded += 1;
                    partition(&chains, &release, count, cap, forward_rule, Some(window))
                }
                None => free,
            }
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
        .with("cost_spread", worst_spread)
        .with(RUNS_OVER_MEMORY, over_memory)
        .with("runs_bounded", bounded))
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
        for pack in partition(&sub, &sub_release, count, cap, Chains::Free, None) {
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
