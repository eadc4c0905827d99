//! `pack-symmetric{policy=..,scope=..,cap=N}`: micro-batches as conventional trainers build them
//! — the same packs for the forward and the backward pass.
//!
//! Phase in: `assigned`. Phase out: `packed`. Samples are grouped into packs by `policy`; each
//! pack is added once as a forward pack and once as a backward pack with the same slices, so
//! backward packs run in forward order (as 1F1B does with micro-batches). A sample cut into
//! several slices is kept in one pack, in slice order (the trainers reproduced here do not split
//! documents across micro-batches), which keeps the per-sample order invariants.
//!
//! `scope` says where packing happens relative to data parallelism:
//! - `replica` (default): each replica packs the samples `assign-dp` placed on it (a rank packs
//!   its own shard of the batch);
//! - `global`: the trainer packs (or balances) the whole global batch first and then deals the
//!   micro-batches to the replicas — what Megatron-style packed datasets, TRL's `pack_dataset`
//!   and Axolotl's multipack sampler do before the distributed sampler, and what verl and
//!   WLB-LLM do on purpose. The pass then re-places every sample on the replica of its pack; the
//!   replicas are those of the preceding `assign-dp` (with its `cp`), whose placement is
//!   replaced. Bins are dealt round-robin in the order the packer made them (the sampler's
//!   shuffle is not modelled; round-robin spreads the largest documents, which favours the peer).
//!
//! Policies, one file each with its source and deviations:
//! - `per-sample`: one pack per sample, in batch order;
//! - `padding` ([`padding`]): one pack per sample, padded to the batch's longest sample;
//! - `ffd` ([`ffd`]): first-fit decreasing into `cap`-token bins (the Megatron stack's packing);
//! - `bfd` ([`bfd`]): TRL's best-fit decreasing into `cap`-token bins;
//! - `first-fit` ([`first_fit`]): Axolotl's multipack first fit in sampler order, at most
//!   `bin-size` samples per bin;
//! - `kk` ([`karmarkar_karp`]): verl's Karmarkar–Karp on `a·L + L²` — globally, the DP split and
//!   then each rank's micro-batches; per replica, the micro-batches only;
//! - `wlb` ([`wlb`]): WLB-LLM's workload-balanced fill of `micro-batches` micro-batches of at
//!   most `cap` tokens (the outlier delay runs before the IR is built); without
//!   `micro-batches`, the fewest micro-batches (a multiple of the replicas) the fill places
//!   every sample in — WLB-LLM's packing without its delay.
//!
//! `cap` defaults to the batch's context length; it is recorded on the packs of the policies
//! that enforce it (`ffd`, `bfd`, `first-fit`, `wlb`).

pub mod bfd;
pub mod ffd;
pub mod first_fit;
pub mod karmarkar_karp;
pub mod padding;
pub mod wlb;

use crate::error::{PassError, Result};
use crate::pass::{OptionInfo, Pass, PassContext, PassInfo, PassOptions, Statistics};
use slimpack_ir::step::{Direction, Pack, Phase, ReplicaId, SampleId};
use slimpack_ir::StepIr;
use slimpack_machine::cost::CostModel;

pub(crate) const INFO: PassInfo = PassInfo {
    name: "pack-symmetric",
    summary: "build identical forward and backward micro-batches (conventional packing)",
    description: "Groups samples into packs by a policy (per-sample, padding, ffd, bfd, \
                  first-fit, kk, wlb), per replica or over the whole batch (then dealt to the replicas), and \
                  uses the same packs in both directions. Phase assigned -> packed.",
    accepts: Phase::Assigned..=Phase::Assigned,
    produces: Some(Phase::Packed),
    options: &[
        OptionInfo {
            name: "policy",
            help: "per-sample, padding, ffd, bfd, first-fit, kk or wlb",
            default: Some("per-sample"),
        },
        OptionInfo {
            name: "scope",
            help: "replica (pack each replica's samples) or global (pack the batch, deal \
                   packs to replicas)",
            default: Some("replica"),
        },
        OptionInfo {
            name: "cap",
            help: "tokens per pack (default: the batch's context length)",
            default: None,
        },
        OptionInfo {
            name: "bin-size",
            help: "first-fit: most samples per bin (Axolotl's default)",
            default: Some("200"),
        },
        OptionInfo {
            name: "a",
            help: "kk: the workload a*L + L^2's linear coefficient (default: from the model)",
            default: None,
        },
        OptionInfo {
            name: "micro-batches",
            help: "wlb: micro-batches of the step (global) or of each replica (replica scope); \
                   default: the fewest, a multiple of the replicas, that hold every sample",
            default: None,
        },
    ],
    create: |options| Ok(Box::new(PackSymmetric::from_options(options)?)),
};

/// A sample longer than a packer's capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Oversize {
    /// Position of the sample in the packer's input.
    pub index: usize,
    pub len: u32,
    pub cap: u32,
}

/// How samples are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    PerSample,
    Padding,
    FirstFitDecreasing,
    BestFitDecreasing,
    FirstFit { bin_size: usize },
    KarmarkarKarp { a: Option<u64> },
    Wlb { micro_batches: Option<usize> },
}

impl Policy {
    fn name(self) -> &'static str {
        match self {
            Policy::PerSample => "per-sample",
            Policy::Padding => "padding",
            Policy::FirstFitDecreasing => "ffd",
            Policy::BestFitDecreasing => "bfd",
            Policy::FirstFit { .. } => "first-fit",
            Policy::KarmarkarKarp { .. } => "kk",
            Policy::Wlb { .. } => "wlb",
        }
    }

    /// Whether packs of this policy respect (and record) the token cap.
    fn enforces_cap(self) -> bool {
        !matches!(
            self,
            Policy::PerSample | Policy::Padding | Policy::KarmarkarKarp { .. }
        )
    }

    /// Whether the policy uses the cap at all (kk sizes its micro-batch count with it).
    fn needs_cap(self) -> bool {
        !matches!(self, Policy::PerSample | Policy::Padding)
    }
}

/// Where packing happens relative to the DP split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Replica,
    Global,
}

/// The symmetric packing pass.
#[derive(Debug, Clone, Copy)]
pub struct PackSymmetric {
    pub policy: Policy,
    pub scope: Scope,
    pub cap: Option<u32>,
}

impl PackSymmetric {
    fn from_options(options: &PassOptions) -> Result<PackSymmetric> {
        let bad = |option: &str, value: String, message: &str| PassError::BadOption {
            pass: INFO.name,
            option: option.into(),
            value,
            message: message.into(),
        };
        let positive = |option: &str| options.positive::<u64>(option);
        let policies = [
            "per-sample",
            "padding",
            "ffd",
            "bfd",
            "first-fit",
            "kk",
            "wlb",
        ];
        let policy = match options.choice("policy", &policies)? {
            Some("padding") => Policy::Padding,
            Some("ffd") => Policy::FirstFitDecreasing,
            Some("bfd") => Policy::BestFitDecreasing,
            Some("first-fit") => Policy::FirstFit {
                bin_size: positive("bin-size")?.expect("declared with a default") as usize,
            },
            Some("kk") => Policy::KarmarkarKarp {
                a: options.get("a", "a non-negative integer")?,
            },
            Some("wlb") => Policy::Wlb {
                micro_batches: positive("micro-batches")?.map(|n| n as usize),
            },
            _ => Policy::PerSample,
        };
        let scope = match options.choice("scope", &["replica", "global"])? {
            Some("global") => Scope::Global,
            _ => Scope::Replica,
        };
        let cap = positive("cap")?
            .map(|cap| u32::try_from(cap).map_err(|_| bad("cap", cap.to_string(), "too large")))
            .transpose()?;
        if let (Some(cap), false) = (cap, policy.needs_cap()) {
            return Err(bad(
                "cap",
                cap.to_string(),
                &format!(
                    "policy {} puts each sample in a micro-batch of its own and uses no cap",
                    policy.name()
                ),
            ));
        }
        Ok(PackSymmetric { policy, scope, cap })
    }

    fn cap(&self, ir: &StepIr) -> Result<u32> {
        self.cap.or(ir.batch.context).ok_or(PassError::Failed {
            pass: INFO.name,
            message: format!(
                "policy {} needs cap=N or a batch with a context length",
                self.policy.name()
            ),
        })
    }
}

/// The samples one packer sees, with what the policies need to know of them.
struct Items {
    samples: Vec<SampleId>,
    lengths: Vec<u32>,
}

impl Items {
    fn new(ir: &StepIr, samples: Vec<SampleId>) -> Items {
        let lengths = samples.iter().map(|&s| ir.sample(s).len).collect();
        Items { samples, lengths }
    }

    fn tokens(&self) -> u64 {
        self.lengths.iter().map(|&l| u64::from(l)).sum()
    }

    fn subset(&self, indices: &[usize]) -> Items {
        Items {
            samples: indices.iter().map(|&i| self.samples[i]).collect(),
            lengths: indices.iter().map(|&i| self.lengths[i]).collect(),
        }
    }

    fn resolve(&self, packs: Vec<Vec<usize>>) -> Vec<Vec<SampleId>> {
        packs
            .into_iter()
            .filter(|pack| !pack.is_empty())
            .map(|pack| pack.into_iter().map(|i| self.samples[i]).collect())
            .collect()
    }
}

/// Per replica, its packs (samples in pack order).
type Plan = Vec<Vec<Vec<SampleId>>>;

impl PackSymmetric {
    /// The packs of one group of samples (a replica's, or the whole batch's), for the policies
    /// that pack each group on its own.
    fn bins(&self, cost: &CostModel, items: &Items, cap: u32) -> Result<Vec<Vec<usize>>> {
        let oversize = |error: Oversize| PassError::Failed {
            pass: INFO.name,
            message: format!("a sample of {} tokens exceeds cap={}", error.len, error.cap),
        };
        match self.policy {
            Policy::PerSample | Policy::Padding => {
                Ok((0..items.lengths.len()).map(|i| vec![i]).collect())
            }
            Policy::FirstFitDecreasing => ffd::pack(&items.lengths, cap).map_err(oversize),
            Policy::BestFitDecreasing => bfd::pack(&items.lengths, cap).map_err(oversize),
            Policy::FirstFit { bin_size } => {
                first_fit::pack(&items.lengths, cap, bin_size).map_err(oversize)
            }
            Policy::Wlb { micro_batches } => self.wlb(cost, items, micro_batches, cap, 1),
            Policy::KarmarkarKarp { .. } => {
                unreachable!("kk packs replicas jointly; this is a bug")
            }
        }
    }

    /// WLB-LLM's fill of `items` into `micro_batches` micro-batches (an error naming the
    /// admission if a sample fits in none), or, without a count, into the fewest — a multiple
    /// of `replicas`, from enough for the tokens at `cap` (and one per sample above `cap / 2`,
    /// no two of which share one) upwards — in which the fill places every sample.
    fn wlb(
        &self,
        cost: &CostModel,
        items: &Items,
        micro_batches: Option<usize>,
        cap: u32,
        replicas: usize,
    ) -> Result<Vec<Vec<usize>>> {
        let workloads: Vec<f64> = items
            .lengths
            .iter()
            .map(|&l| wlb::workload(cost, l))
            .collect();
        let Some(count) = micro_batches else {
            if let Some(&len) = items.lengths.iter().find(|&&len| len > cap) {
                return Err(PassError::Failed {
                    pass: INFO.name,
                    message: format!("a sample of {len} tokens exceeds cap={cap}"),
                });
            }
            let replicas = replicas.max(1);
            let halves = items.lengths.iter().filter(|&&len| len > cap / 2).count();
            let mut count = default_count(items.tokens(), cap, replicas)
                .max(halves.div_ceil(replicas) * replicas);
            // Terminates: at one micro-batch per sample every sample fits (none exceeds cap).
            // A fill that delays a sample stops there: only the count that delays none is kept.
            let order = wlb::FillOrder::new(&items.lengths, &workloads);
            loop {
                if let Some(micro_batches) = order.fill_all(count, cap) {
                    return Ok(micro_batches);
                }
                count += replicas;
            }
        };
        let fill = wlb::fill(&items.lengths, &workloads, count, cap);
        if let Some(&first) = fill.delayed.first() {
            return Err(PassError::Failed {
                pass: INFO.name,
                message: format!(
                    "wlb: a sample of {} tokens fits in none of {count} micro-batches of cap={cap} \
                     ({} such samples); WLB-LLM delays them to a later step, which the `wlb` \
                     strategy does before compiling",
                    items.lengths[first],
                    fill.delayed.len()
                ),
            });
        }
        Ok(fill.micro_batches)
    }

    /// kk's workload of every item.
    fn kk_workloads(&self, cost: &CostModel, items: &Items) -> Vec<u128> {
        let a = match self.policy {
            Policy::KarmarkarKarp { a: Some(a) } => a,
            _ => karmarkar_karp::workload_coefficient(cost),
        };
        items
            .lengths
            .iter()
            .map(|&l| karmarkar_karp::workload(l, a))
            .collect()
    }

    /// verl's micro-batching of every replica: a common count, KK within each.
    fn kk_micro_batches(&self, cost: &CostModel, groups: &[Items], cap: u32) -> Plan {
        let count = groups
            .iter()
            .map(|g| (g.tokens().div_ceil(u64::from(cap)) as usize).min(g.lengths.len()))
            .max()
            .unwrap_or(0);
        groups
            .iter()
            .map(|group| {
                let workloads = self.kk_workloads(cost, group);
                group.resolve(karmarkar_karp::micro_batches(&workloads, count))
            })
            .collect()
    }

    fn plan(
        &self,
        ir: &StepIr,
        cost: &CostModel,
        replicas: &[ReplicaId],
        cap: u32,
    ) -> Result<Plan> {
        let deal = |packs: Vec<Vec<SampleId>>| -> Plan {
            let mut plan = vec![Vec::new(); replicas.len()];
            for (index, pack) in packs.into_iter().enumerate() {
                plan[index % replicas.len()].push(pack);
            }
            plan
        };
        match (self.scope, self.policy) {
            (Scope::Replica, Policy::KarmarkarKarp { .. }) => {
                let groups: Vec<Items> = replicas
                    .iter()
                    .map(|&r| Items::new(ir, ir.samples_on(r)))
                    .collect();
                Ok(self.kk_micro_batches(cost, &groups, cap))
            }
            (Scope::Replica, _) => replicas
                .iter()
                .map(|&r| {
                    let items = Items::new(ir, ir.samples_on(r));
                    Ok(items.resolve(self.bins(cost, &items, cap)?))
                })
                .collect(),
            (Scope::Global, Policy::KarmarkarKarp { .. }) => {
                let all = Items::new(ir, ir.samples().to_vec());
                let workloads = self.kk_workloads(cost, &all);
                let groups: Vec<Items> = karmarkar_karp::balance_ranks(&workloads, replicas.len())
                    .iter()
                    .map(|part| all.subset(part))
                    .collect();
                Ok(self.kk_micro_batches(cost, &groups, cap))
            }
            (Scope::Global, Policy::Wlb { micro_batches }) => {
                let all = Items::new(ir, ir.samples().to_vec());
                let packs = self.wlb(cost, &all, micro_batches, cap, replicas.len())?;
                Ok(deal(all.resolve(packs)))
            }
            (Scope::Global, _) => {
                let all = Items::new(ir, ir.samples().to_vec());
                Ok(deal(all.resolve(self.bins(cost, &all, cap)?)))
            }
        }
    }
}

/// The smallest multiple of `replicas` micro-batches of `cap` tokens that holds `tokens`.
pub fn default_count(tokens: u64, cap: u32, replicas: usize) -> usize {
    let replicas = replicas.max(1) as u64;
    let per_replica = tokens.div_ceil(u64::from(cap) * replicas).max(1);
    (per_replica * replicas) as usize
}

impl Pass for PackSymmetric {
    fn info(&self) -> &'static PassInfo {
        &INFO
    }

    fn run(&mut self, ir: &mut StepIr, cx: &PassContext) -> Result<Statistics> {
        let cap = if self.policy.needs_cap() {
            self.cap(ir)?
        } else {
            u32::MAX
        };
        let replicas = ir.replicas().to_vec();
        let plan = self.plan(ir, cx.machine(), &replicas, cap)?;
        let recorded_cap = self.policy.enforces_cap().then_some(cap);
        let padded_to = (self.policy == Policy::Padding).then(|| {
            let lengths: Vec<u32> = ir.samples().iter().map(|&s| ir.sample(s).len).collect();
            padding::padded_length(&lengths)
        });
        if self.scope == Scope::Global {
            let placements: Vec<(SampleId, ReplicaId)> = replicas
                .iter()
                .zip(&plan)
                .flat_map(|(&replica, packs)| {
                    packs.iter().flatten().map(move |&sample| (sample, replica))
                })
                .collect();
            ir.place_samples(&placements);
        }
        let (mut packs, mut largest, mut most) = (0usize, 0u64, 0usize);
        // Bins hold samples in any order: their slices are read in bulk, not sample by sample.
        let sample_slices = ir.sample_slices();
        for (&replica, groups) in replicas.iter().zip(&plan) {
            for group in groups {
                let slices: Vec<_> = (group.iter())
                    .flat_map(|&s| sample_slices.at(ir.position_of(s)).iter().copied())
                    .collect();
                for direction in [Direction::Forward, Direction::Backward] {
                    let pack = Pack {
                        direction,
                        cap: recorded_cap,
                    };
                    let pack = ir.add_pack(pack, replica, &slices);
                    if let Some(tokens) = padded_to {
                        ir.set_padding(pack, tokens);
                    }
                }
                largest = largest.max(group.iter().map(|&s| u64::from(ir.sample(s).len)).sum());
                packs += 1;
            }
            most = most.max(groups.len());
        }
        Ok(Statistics::new()
            .with("packs_per_direction", packs)
            .with("largest_pack_tokens", largest)
            .with("most_packs_per_replica", most))
    }
}
