//! Strategies: named ways to compile a training step — the peers reproduced in the step IR (and,
//! registered the same way, slimpack's own).
//!
//! A strategy is a row of [`STRATEGIES`]: a name, a one-line summary, its source (repository,
//! file, paper section), its deviations from that source, and a function giving its
//! [`Candidate`]s for a spec and a batch — pipeline strings with a recompute mode and a label.
//! The autotuner ([`super::autotune`]) compiles every candidate, simulates it and keeps the fastest
//! that fits memory, the way a competent user of the peer would tune it: Megatron users pick
//! the static CP degree and the recomputation granularity that run fastest without running out
//! of memory, and so do users of the packers that leave memory to the trainer. So, unless the
//! layout fixes `cp`, the candidates of those strategies are the static CP degrees the DP pool
//! allows (powers of two dividing `dp`, taken from it by `assign-dp{cp=K}`) times the recompute
//! modes ([`Choices`]); `hybrid-cp` chooses its CP degrees per sample itself and offers its
//! `max-tokens-per-rank` settings instead.
//!
//! A strategy that carries state from one step to the next (WLB-LLM delays outlier documents to
//! later steps) has an `admit` hook: it turns the drawn global batch into the samples the step
//! trains on, updating the run's [`StrategyState`]; callers thread one state through a run, and
//! [`StrategyState::drain_step`] trains what is left waiting at its end.
//!
//! A strategy whose source refuses some layouts says so (`applies`): Megatron-Core's hybrid CP
//! needs pp = 1, and elsewhere the tuner reports it as not applicable instead of running a
//! configuration its users cannot.
//!
//! Adding a strategy: write its passes, then add a [`StrategyInfo`] with its `candidates` (and
//! `admit` if it keeps state) to [`STRATEGIES`].

use slimpack_ir::batch::Batch;
use slimpack_ir::spec::Recompute;
use slimpack_ir::Spec;

use slimpack_passes::pack_symmetric::{default_count, karmarkar_karp, wlb::OutlierDelay};

use super::method;

/// One configuration of a strategy to compile and score.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// What was chosen, for reports (`cp=2,recompute=selective`).
    pub label: String,
    /// The pass pipeline.
    pub pipeline: String,
    /// Other pipelines of the same configuration a step may run instead, decided per step by
    /// the simulator (see [`Variant`]); empty for most strategies.
    pub variants: Vec<Variant>,
    /// Pipelines a step also tries once this configuration is the one it runs (slimpack's
    /// eqsat-refined packs): the tuning compares candidates on their pipeline and variants,
    /// then the chosen one's step, and every step a kept configuration runs, also tries
    /// these ([`Candidate::refined`]), keeping the best as for a variant. Refining only what
    /// was chosen keeps a refinement's cost off the search, where its gain (eqsat's: below
    /// 0.25% per scenario) would rarely change the ranking.
    pub refinements: Vec<Variant>,
    /// The activation recomputation the step runs with (it replaces the model's).
    pub recompute: Recompute,
    /// Model chunks per pipeline device the step runs with (interleaved 1F1B; it replaces the
    /// layout's `vpp`); `None`: the layout's own.
    pub vpp: Option<u32>,
}

impl Candidate {
    /// The candidate with `f` applied to every pipeline it has (its own, its variants', its
    /// refinements'): a twin that runs the same configuration another way.
    pub fn map_pipelines(&self, f: impl Fn(&str) -> String) -> Candidate {
        let map = |variants: &[Variant]| {
            variants
                .iter()
                .map(|variant| Variant {
                    label: variant.label.clone(),
                    pipeline: f(&variant.pipeline),
                    fallback_of: variant.fallback_of.as_deref().map(&f),
                })
                .collect()
        };
        Candidate {
            pipeline: f(&self.pipeline),
            variants: map(&self.variants),
            refinements: map(&self.refinements),
            ..self.clone()
        }
    }

    /// The candidate with its refinements among its variants: what a step that runs it
    /// compiles.
    pub fn refined(&self) -> Candidate {
        let mut refined = self.clone();
        refined.variants.append(&mut refined.refinements);
        refined
    }
}

/// An alternative pipeline of a [`Candidate`]: the same configuration compiled another way
/// (slimpack's mirrored backward packs, another pipeline order, or, as a refinement, its
/// packs refined by eqsat). The driver
/// compiles the passes a candidate's pipelines share once, then each variant's remaining
/// passes, simulates each, and keeps the best — so a choice that depends on the batch is made
/// on every step's batch, not fixed by the tuning step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variant {
    /// What differs, appended to the candidate's label in reports (`bwd=mirror`).
    pub label: String,
    pub pipeline: String,
    /// A fallback: the variant runs only on a step that the candidate's pipeline
    /// `fallback_of` (its own or another variant's, compiled first) made over the memory
    /// limit with forward runs over memory (slimpack's forward runs bounded by memory: see
    /// `super::evaluate`).
    pub fallback_of: Option<String>,
}

/// What the strategies may choose among — the recompute modes (all of them, unless the user
/// fixed one) — and the memory a chosen configuration may use.
#[derive(Debug, Clone, PartialEq)]
pub struct Choices {
    /// The uniform modes (or the one the user fixed).
    pub recompute: Vec<Recompute>,
    /// Whether a strategy that models Megatron's block recomputation may add `block:K` modes
    /// ([`block_recompute_layers`]); off when the user fixed the mode.
    pub block_recompute: bool,
    /// The fraction of device memory (HBM) a configuration may peak at to count as fitting
    /// (default [`DEFAULT_MEMORY_LIMIT`]).
    pub memory_limit: f64,
    /// Whether a strategy may try model chunks (interleaved 1F1B, `vpp > 1`); off where the
    /// step goes to an executor or backend that runs one chunk per device (`run`, `--emit
    /// mlir|llvm`).
    pub model_chunks: bool,
    /// Whether a strategy may split backwards into input and weight gradients (zero-bubble
    /// schedules); off where the consumer runs whole backwards (`--emit mlir|llvm`, the CUDA
    /// backend).
    pub split_backwards: bool,
    /// Whether slimpack may give each pipeline stage its own recomputation
    /// (`assign-recompute`, see [`super::stage_recompute`]); off when the user fixed the mode
    /// and where the consumer runs one mode per step (`--emit mlir|llvm`, `slimpack.torch`).
    pub stage_recompute: bool,
}

pub use slimpack_machine::cost::DEFAULT_MEMORY_LIMIT;

impl Choices {
    /// Every recompute mode.
    pub fn all() -> Choices {
        Choices {
            recompute: Recompute::ALL.to_vec(),
            block_recompute: true,
            memory_limit: DEFAULT_MEMORY_LIMIT,
            model_chunks: true,
            split_backwards: true,
            stage_recompute: true,
        }
    }

    /// Only `mode`.
    pub fn fixed(mode: Recompute) -> Choices {
        Choices {
            recompute: vec![mode],
            block_recompute: false,
            memory_limit: DEFAULT_MEMORY_LIMIT,
            model_chunks: true,
            split_backwards: true,
            stage_recompute: false,
        }
    }

    /// The same choices with whole backwards only (see [`Choices::split_backwards`]).
    pub fn whole_backwards(self) -> Choices {
        Choices {
            split_backwards: false,
            ..self
        }
    }

    /// The same choices with one recomputation mode per step (see
    /// [`Choices::stage_recompute`]).
    pub fn one_mode_per_step(self) -> Choices {
        Choices {
            stage_recompute: false,
            ..self
        }
    }

    /// The same choices without model chunks (see [`Choices::model_chunks`]).
    pub fn one_chunk_per_device(self) -> Choices {
        Choices {
            model_chunks: false,
            ..self
        }
    }

    /// The bytes a configuration may peak at on a device of `capacity_bytes`.
    pub fn memory_limit_bytes(&self, capacity_bytes: u64) -> u64 {
        (capacity_bytes as f64 * self.memory_limit) as u64
    }

    /// The bytes a configuration may peak at on a device of `spec`'s cluster.
    pub fn memory_limit_for(&self, spec: &Spec) -> u64 {
        let model = slimpack_machine::machine_model(spec);
        self.memory_limit_bytes(model.memory().capacity_bytes())
    }

    /// The modes plus, where allowed, block recomputation of a few layer counts of a model
    /// chunk of `layers_per_chunk` layers.
    fn with_block(&self, layers_per_chunk: u32) -> Vec<Recompute> {
        let mut modes = self.recompute.clone();
        if self.block_recompute {
            let blocks = block_recompute_layers(layers_per_chunk);
            modes.extend(blocks.into_iter().map(Recompute::Block));
        }
        modes
    }
}

/// What a run carries from step to step for the strategies that keep state.
#[derive(Debug, Clone, Default)]
pub struct StrategyState {
    /// `wlb`: the outlier queues, the samples delayed so far, and the micro-batch count of the
    /// step last admitted.
    pub wlb: Option<WlbState>,
}

/// `wlb`'s state between steps.
#[derive(Debug, Clone)]
pub struct WlbState {
    pub delay: OutlierDelay,
    /// `N` of the step last admitted.
    pub micro_batches: usize,
    /// `S_max` of the step last admitted.
    pub cap: u32,
}

impl StrategyState {
    /// Samples and tokens waiting for a later step.
    pub fn backlog(&self) -> (usize, u64) {
        self.wlb.as_ref().map_or((0, 0), |wlb| wlb.delay.backlog())
    }

    /// A step that draws nothing new and trains what earlier steps left waiting (`wlb`: every
    /// queued outlier released, `N` sized for the waiting tokens), so that a run can end with
    /// every drawn document trained; `None` when nothing waits. Each such step trains at least
    /// the longest waiting sample, so repeating it empties the backlog. `like` is a batch of
    /// the run (for its context and source).
    pub fn drain_step(&mut self, spec: &Spec, like: &Batch) -> Option<Batch> {
        let wlb = self.wlb.as_mut()?;
        let (samples, tokens) = wlb.delay.backlog();
        if samples == 0 {
            return None;
        }
        wlb.delay.release_all();
        wlb.micro_batches = default_count(tokens, wlb.cap, spec.parallel.dp as usize);
        let nothing_new = Batch {
            samples: Vec::new(),
            documents: 0,
            documents_cut: 0,
            documents_empty: 0,
            context: like.context,
            source: like.source.clone(),
        };
        let cost = slimpack_machine::machine_model(spec);
        Some(
            wlb.delay
                .admit(&nothing_new, &cost, wlb.micro_batches, wlb.cap),
        )
    }
}

/// A named strategy.
pub struct StrategyInfo {
    pub name: &'static str,
    /// One line, shown by `slimpack passes`.
    pub summary: &'static str,
    /// Where it comes from: repository and file, or paper and section.
    pub source: &'static str,
    /// How the reproduction differs from the source, and the choices made where it is silent.
    pub deviations: &'static str,
    /// The configurations to try on `batch` (the admitted one, for strategies that admit).
    pub candidates: fn(&Spec, &Batch, &StrategyState, &Choices) -> Vec<Candidate>,
    /// Turns a drawn global batch into the step's samples, updating the run's state.
    pub admit: Option<fn(&mut StrategyState, &Spec, &Batch) -> Batch>,
    /// Where the source supports the strategy: `Err(what it needs)` on a layout it refuses
    /// (Megatron-Core asserts hybrid CP runs without pipeline parallelism); `None`: every
    /// layout.
    pub applies: Option<Applicability>,
}

/// Whether a layout is one the strategy's source supports: `Err(what it needs)` otherwise.
pub type Applicability = fn(&Spec) -> Result<(), &'static str>;

impl StrategyInfo {
    /// What the strategy needs that `spec`'s layout lacks (`needs pp=1`), if anything.
    pub fn not_applicable(&self, spec: &Spec) -> Option<&'static str> {
        self.applies.and_then(|applies| applies(spec).err())
    }
}

/// Every strategy, in the order reports list them.
pub static STRATEGIES: &[StrategyInfo] = &[
    StrategyInfo {
        name: "padding",
        summary: "no packing: one sample per micro-batch, padded to the batch's longest sample",
        source: "a trainer without sequence packing: HF Transformers Trainer with a \
                 DistributedSampler and micro-batch size 1, or Megatron-LM without packed \
                 sequences (static micro-batch shape)",
        deviations: "samples dealt round-robin to the DP ranks in batch order; padding to the \
                     longest sample of the global batch (a collator would pad to the longest \
                     of the micro-batch, i.e. not at all); static CP and recompute searched as \
                     for megatron.",
        candidates: padding_candidates,
        admit: None,
        applies: None,
    },
    StrategyInfo {
        name: "megatron",
        summary: "Megatron-LM as a competent user tunes it: FFD bins, static CP, recompute, interleaved 1F1B",
        source: "NVIDIA NeMo nemo/utils/sequence_packing_utils.py first_fit_decreasing (the \
                 packed THD sequences Megatron-Core runs with cu_seqlens); Megatron-LM \
                 --context-parallel-size, --recompute-granularity selective|full, \
                 --recompute-method block --recompute-num-layers K, \
                 --num-layers-per-virtual-pipeline-stage; 1F1B and interleaved 1F1B \
                 (megatron/core/pipeline_parallel/schedules.py)",
        deviations: "bins are packed per global batch and dealt round-robin to the DP ranks \
                     (no sampler shuffle); the tuner searches the bin size (the rungs 2^k and \
                     3·2^(k-1) at or above the batch's longest document, the first two, and \
                     the context), the static CP degree (a power of two from the DP pool), \
                     the recomputation (none, selective, full, block of a quarter and a half \
                     of a chunk's layers) and two model chunks per pipeline device where the \
                     layers split into 2·pp, keeping the fastest combination that fits \
                     memory; a user sizes bins once per run, here per tuned batch. \
                     Interleaved steps follow Megatron's order (micro-batch groups of pp) \
                     where a replica's micro-batch count is a multiple of pp; Megatron \
                     refuses other counts, where slimpack's list schedule runs them instead \
                     (in the peer's favour).",
        candidates: megatron_candidates,
        admit: None,
        applies: None,
    },
    StrategyInfo {
        name: "megatron-paper",
        summary: "Megatron-LM as the SlimPack paper ran it: bins of the context, static CP, 1F1B",
        source: "the Megatron-LM baseline of SlimPack (arXiv 2509.26246, section 6): NeMo \
                 first_fit_decreasing packing into context-length sequences, \
                 --context-parallel-size, --recompute-granularity, 1F1B",
        deviations: "bins are packed per global batch and dealt round-robin to the DP ranks \
                     (no sampler shuffle); bins are pinned to the context length; the static \
                     CP degree and the uniform recompute mode (none, selective, full) are the \
                     fastest combination that fits memory. The baseline SlimPack's 2.8x is \
                     quoted against.",
        candidates: megatron_paper_candidates,
        admit: None,
        applies: None,
    },
    StrategyInfo {
        name: "bfd",
        summary: "TRL best-fit decreasing bins of the context length",
        source: "huggingface/trl trl/data_utils.py pack_dataset(strategy=\"bfd\"), _pack_bfd",
        deviations: "packs the whole global batch at once (TRL packs each datasets.map batch \
                     of 1,000 rows); over-long samples are cut to the context beforehand \
                     instead of truncated; bins dealt round-robin; static CP and recompute \
                     searched as for megatron.",
        candidates: bfd_candidates,
        admit: None,
        applies: None,
    },
    StrategyInfo {
        name: "ff",
        summary: "Axolotl multipack first fit in sampler order (at most 200 samples a bin)",
        source: "axolotl-ai-cloud/axolotl src/axolotl/utils/samplers/multipack.py pack_group, \
                 pack_parallel, MultipackBatchSampler",
        deviations: "one packing group per global batch (Axolotl: groups of 100,000); bins \
                     dealt round-robin (accelerate's batch-sampler sharding); static CP and \
                     recompute searched as for megatron.",
        candidates: ff_candidates,
        admit: None,
        applies: None,
    },
    StrategyInfo {
        name: "kk",
        summary: "verl Karmarkar-Karp balancing of DP ranks and micro-batches on a*L + L^2",
        source: "volcengine/verl verl/utils/seqlen_balancing.py karmarkar_karp, \
                 rearrange_micro_batches, calculate_workload; verl/trainer/ppo/ray_trainer.py \
                 _balance_batch",
        deviations: "a from the model's FLOPs (2 x linear FLOPs per token / attention FLOPs \
                     per causal pair) instead of the constant 24576; the DP split balances \
                     without equal counts when the batch size is not a multiple of dp; static \
                     CP and recompute searched as for megatron.",
        candidates: kk_candidates,
        admit: None,
        applies: None,
    },
    StrategyInfo {
        name: "wlb",
        summary: "WLB-LLM workload-balanced variable-length packing with outlier delay",
        source: "Wang et al., WLB-LLM, OSDI'25 (arXiv 2503.17924), section 4.1, Algorithm 1",
        deviations: "workload = model FLOPs (WLB-LLM profiles latencies); outlier levels at \
                     cap/4 and cap/2 (the paper gives none); carried documents are sorted with \
                     the new ones; N = the micro-batches the step's tokens need at the context \
                     length, a multiple of dp, dealt round-robin; queued documents carry over \
                     between steps (reported as backlog); static CP and recompute searched.",
        candidates: wlb_candidates,
        admit: Some(wlb_admit),
        applies: None,
    },
    StrategyInfo {
        name: "hybrid-cp",
        summary: "Megatron-Core hybrid CP: per-sample power-of-two CP groups of DP ranks",
        source: "NVIDIA/Megatron-LM megatron/core/pipeline_parallel/hybrid_cp_schedule.py \
                 BalancedCPScheduler; --hybrid-context-parallel, --max-seqlen-per-dp-cp-rank",
        deviations: "one set of disjoint CP groups per step instead of barrier-separated \
                     scheduling groups (see passes/src/assign_hybrid_cp.rs); not applicable \
                     where pp > 1 (Megatron-Core's arguments.py asserts hybrid CP without \
                     pipeline parallelism); max-seqlen-per-dp-cp-rank (context / 2^k) and \
                     recompute searched.",
        candidates: hybrid_cp_candidates,
        admit: None,
        applies: Some(single_stage),
    },
    StrategyInfo {
        name: "slimpack",
        summary: "SlimPack: slices, asymmetric forward/backward MicroPacks, DP-Merge, eqsat",
        source: "Fine-Grained Asymmetric Packing (SlimPack), arXiv 2509.26246, sections 3-5",
        deviations: "phase 2 is a chain-constrained balanced-partition heuristic with local \
                     search and e-graph refinement instead of the paper's MILP; slice size, pack \
                     cap and recompute are searched with the simulator (see src/tune/method.rs); \
                     the plans megatron, kk and wlb (without its outlier delay) would make \
                     are candidates too (labelled plan=<peer>), so the search contains theirs; \
                     a run keeps the best of each beside the tuned configuration and runs \
                     the fastest per step (src/tune/kept.rs).",
        candidates: method::full,
        admit: None,
        applies: None,
    },
    StrategyInfo {
        name: "slimpack-no-asymmetric",
        summary: "ablation: backward packs mirror the forward packs",
        source: "src/tune/method.rs",
        deviations: "pack-bwd{mirror=true}",
        candidates: method::no_asymmetric,
        admit: None,
        applies: None,
    },
    StrategyInfo {
        name: "slimpack-no-dp-merge",
        summary: "ablation: no DP-Merge groups",
        source: "src/tune/method.rs",
        deviations: "no dp-merge pass",
        candidates: method::no_dp_merge,
        admit: None,
        applies: None,
    },
    StrategyInfo {
        name: "slimpack-no-slicing",
        summary: "ablation: whole samples, no slices",
        source: "src/tune/method.rs",
        deviations: "no slice pass; packs capped at the context",
        candidates: method::no_slicing,
        admit: None,
        applies: None,
    },
    StrategyInfo {
        name: "slimpack-no-eqsat",
        summary: "ablation: no e-graph refinement",
        source: "src/tune/method.rs",
        deviations: "no eqsat pass",
        candidates: method::no_eqsat,
        admit: None,
        applies: None,
    },
    StrategyInfo {
        name: "slimpack-no-zero-bubble",
        summary: "ablation: whole backwards (plain 1F1B orders, no deferred weight gradients)",
        source: "src/tune/method.rs",
        deviations: "no schedule-pipeline{zb=true} candidates",
        candidates: method::no_zero_bubble,
        admit: None,
        applies: None,
    },
    StrategyInfo {
        name: "slimpack-no-stage-recompute",
        summary: "ablation: one recomputation mode for the whole step (no per-stage modes)",
        source: "src/tune/method.rs, src/tune/stage_recompute.rs",
        deviations: "no assign-recompute candidates",
        candidates: method::no_stage_recompute,
        admit: None,
        applies: None,
    },
    StrategyInfo {
        name: "slimpack-no-pack-recompute",
        summary: "ablation: per-stage recomputation without per-pack rungs (every pack takes its device's)",
        source: "src/tune/method.rs, passes/src/assign_recompute/packs.rs",
        deviations: "assign-recompute without packs=true",
        candidates: method::no_pack_recompute,
        admit: None,
        applies: None,
    },
    StrategyInfo {
        name: "slimpack-no-interleave",
        summary: "ablation: a DP rank's plain replica and DP-Merge group one after the other (no interleaving)",
        source: "src/tune/method.rs, passes/src/interleave_ranks.rs",
        deviations: "no interleave-ranks pass",
        candidates: method::no_interleave,
        admit: None,
        applies: None,
    },
    StrategyInfo {
        name: "slimpack-outlier-delay",
        summary: "opt-in: slimpack's search with WLB-LLM's outlier delay (long documents trained in later steps)",
        source: "src/tune/method.rs; the admission of wlb (WLB-LLM, OSDI'25, Algorithm 1)",
        deviations: "not slimpack's default, and not one of its ablations: it changes which step \
                     trains a document (outliers above a quarter of the context wait until a \
                     micro-batch each can take one; a run drains what still waits), which a \
                     user opts into by naming it; slimpack's full search (its own pipelines \
                     and the peers' plans) compiles the admitted steps.",
        candidates: method::full,
        admit: Some(wlb_admit),
        applies: None,
    },
];

/// A run's kept configuration for a later step, given what the strategy offers that step: the
/// candidate of the same label (a strategy whose pipeline depends on the step's state, like
/// wlb's micro-batch count, re-derives it), or the tuned one as it is where the step does not
/// offer it (a megatron bin below the step's longest document: compiling it then fails, and
/// the step is re-planned).
pub fn kept_for_step(offered: &[Candidate], tuned: &Candidate) -> Candidate {
    offered
        .iter()
        .find(|candidate| candidate.label == tuned.label)
        .unwrap_or(tuned)
        .clone()
}

/// Looks a strategy up by name; the error lists the valid names.
pub fn lookup(name: &str) -> Result<&'static StrategyInfo, String> {
    STRATEGIES.iter().find(|s| s.name == name).ok_or_else(|| {
        let valid: Vec<&str> = STRATEGIES.iter().map(|s| s.name).collect();
        format!("unknown strategy '{name}' (valid: {})", valid.join(", "))
    })
}

/// The token capacity of a micro-batch: the batch's context, or its longest sample.
pub fn capacity(batch: &Batch) -> u32 {
    batch
        .context
        .or_else(|| batch.samples.iter().map(|s| s.len).max())
        .unwrap_or(1)
}

/// Static CP degrees a strategy may take from the DP pool: powers of two dividing `dp`, or only
/// 1 when the layout fixes `cp` itself.
pub fn cp_degrees(spec: &Spec) -> Vec<u32> {
    if spec.parallel.cp.is_some() {
        return vec![1];
    }
    let dp = spec.parallel.dp;
    (0..32)
        .map(|k| 1u32 << k)
        .take_while(|&k| k <= dp)
        .filter(|&k| dp % k == 0)
        .collect()
}

/// `pipeline(cp)` for every static CP degree and recompute mode.
fn cp_and_recompute(
    spec: &Spec,
    choices: &Choices,
    pipeline: impl Fn(u32) -> String,
) -> Vec<Candidate> {
    let mut candidates = Vec::new();
    for cp in cp_degrees(spec) {
        for &recompute in &choices.recompute {
            let label = if spec.parallel.cp.is_some() {
                format!("recompute={}", recompute)
            } else {
                format!("cp={cp},recompute={}", recompute)
            };
            candidates.push(Candidate {
                variants: Vec::new(),
                refinements: Vec::new(),
                label,
                pipeline: pipeline(cp),
                recompute,
                vpp: None,
            });
        }
    }
    candidates
}

/// Global-scope packing by `policy` (with extra options) into micro-batches of `cap` tokens,
/// after a round-robin DP split into static CP groups, then 1F1B.
fn global_packing(spec: &Spec, choices: &Choices, policy: &str, cap: u32) -> Vec<Candidate> {
    cp_and_recompute(spec, choices, |cp| {
        format!(
            "assign-dp{{cp={cp},balance=none}},\
             pack-symmetric{{policy={policy},scope=global,cap={cap}}},schedule-pipeline"
        )
    })
}

fn padding_candidates(spec: &Spec, _: &Batch, _: &StrategyState, c: &Choices) -> Vec<Candidate> {
    cp_and_recompute(spec, c, |cp| {
        format!(
            "assign-dp{{cp={cp},balance=none}},pack-symmetric{{policy=padding}},schedule-pipeline"
        )
    })
}

fn megatron_paper_candidates(
    spec: &Spec,
    b: &Batch,
    _: &StrategyState,
    c: &Choices,
) -> Vec<Candidate> {
    let uniform = Choices {
        block_recompute: false,
        ..c.clone()
    };
    global_packing(spec, &uniform, "ffd", capacity(b))
}

/// Megatron tuned: every bin size of [`megatron_bin_sizes`] times the static CP degrees times
/// the recompute modes with block recomputation, with and without interleaving (see
/// [`megatron_vpp_choices`]).
fn megatron_candidates(spec: &Spec, b: &Batch, _: &StrategyState, c: &Choices) -> Vec<Candidate> {
    let mut candidates = Vec::new();
    for vpp in megatron_vpp_choices(spec, c) {
        let mut layout = spec.clone();
        if let Some(vpp) = vpp {
            layout.parallel.vpp = vpp;
        }
        let modes = Choices {
            recompute: c.with_block(layout.layers_per_chunk()),
            block_recompute: false,
            ..c.clone()
        };
        for bin in megatron_bin_sizes(b) {
            for mut candidate in global_packing(&layout, &modes, "ffd", bin) {
                candidate.label = match vpp {
                    Some(vpp) => format!("vpp={vpp},bin={bin},{}", candidate.label),
                    None => format!("bin={bin},{}", candidate.label),
                };
                candidate.vpp = vpp;
                candidates.push(candidate);
            }
        }
    }
    candidates
}

/// The interleavings a Megatron user tries (`--num-layers-per-virtual-pipeline-stage`): the
/// layout's own, and two model chunks per device where the layout has none, a pipeline, and
/// layers that split evenly into `2 · pp` chunks, where `choices` allow model chunks. `None`
/// is the layout's own.
pub fn megatron_vpp_choices(spec: &Spec, choices: &Choices) -> Vec<Option<u32>> {
    let parallel = &spec.parallel;
    let mut vpps = vec![None];
    if choices.model_chunks
        && parallel.vpp == 1
        && parallel.pp >= 2
        && spec.model.layers % (2 * parallel.pp) == 0
    {
        vpps.push(Some(2));
    }
    vpps
}

/// The bin sizes a Megatron user tries for a batch: the usual sequence-length rungs (powers of
/// two and the steps halfway between, `2^k` and `3·2^(k-1)`) that hold the batch's longest
/// sample, the first two of them, and the context — no bin may cut a document, and past
/// twice the longest document larger bins only mean fewer micro-batches.
pub fn megatron_bin_sizes(batch: &Batch) -> Vec<u32> {
    let context = capacity(batch);
    let longest = batch.samples.iter().map(|s| s.len).max().unwrap_or(1);
    let mut rungs: Vec<u64> = (0..32u32)
        .flat_map(|k| [1u64 << k, 3u64 << k])
        .filter(|&rung| rung >= u64::from(longest) && rung < u64::from(context))
        .collect();
    rungs.sort_unstable();
    rungs.dedup();
    let mut sizes: Vec<u32> = rungs.into_iter().take(2).map(|rung| rung as u32).collect();
    sizes.push(context);
    sizes
}

/// The `K` of the block recomputations a Megatron user tries on chunks of `layers` layers: a
/// quarter and a half of them (at least 1, fewer than all: `block:n` is `full`).
pub fn block_recompute_layers(layers: u32) -> Vec<u32> {
    let mut ks: Vec<u32> = [layers / 4, layers / 2]
        .into_iter()
        .map(|k| k.max(1))
        .filter(|&k| k < layers)
        .collect();
    ks.dedup();
    ks
}

fn bfd_candidates(spec: &Spec, b: &Batch, _: &StrategyState, c: &Choices) -> Vec<Candidate> {
    global_packing(spec, c, "bfd", capacity(b))
}

fn ff_candidates(spec: &Spec, b: &Batch, _: &StrategyState, c: &Choices) -> Vec<Candidate> {
    global_packing(spec, c, "first-fit", capacity(b))
}

fn kk_candidates(spec: &Spec, b: &Batch, _: &StrategyState, c: &Choices) -> Vec<Candidate> {
    let a = karmarkar_karp::workload_coefficient(&slimpack_machine::machine_model(spec));
    global_packing(spec, c, &format!("kk,a={a}"), capacity(b))
}

fn wlb_candidates(spec: &Spec, b: &Batch, state: &StrategyState, c: &Choices) -> Vec<Candidate> {
    let (count, cap) = match &state.wlb {
        Some(wlb) => (wlb.micro_batches, wlb.cap),
        None => {
            let cap = capacity(b);
            (
                default_count(b.tokens(), cap, spec.parallel.dp as usize),
                cap,
            )
        }
    };
    global_packing(spec, c, &format!("wlb,micro-batches={count}"), cap)
}

/// The plans the peers would make, as candidates of slimpack's own search (labelled
/// `plan=<peer>,...`): megatron's tuned bins with its recompute modes, Karmarkar-Karp
/// micro-batches, and WLB-LLM's workload-balanced variable-length packs without its outlier
/// delay (slimpack does not change which documents a step trains on): the fewest micro-batches
/// of the context that hold every document of the step ([`wlb_without_delay`]); on a step
/// WLB-LLM's admission made (`slimpack-outlier-delay`, whose `state` has wlb's), wlb's own
/// plan, with its micro-batch count. The simulator
/// picks one where it beats the SlimPack pipelines — at tuning, and per step among the
/// configurations a run keeps ([`super::kept`]) — so slimpack's search contains those peers'.
pub(crate) fn peer_plans(
    spec: &Spec,
    batch: &Batch,
    state: &StrategyState,
    choices: &Choices,
) -> Vec<Candidate> {
    let wlb = match state.wlb {
        Some(_) => wlb_candidates(spec, batch, state, choices),
        None => wlb_without_delay(spec, batch, choices),
    };
    let fresh = StrategyState::default();
    let plans = [
        (
            "megatron",
            megatron_candidates(spec, batch, &fresh, choices),
        ),
        ("kk", kk_candidates(spec, batch, &fresh, choices)),
        ("wlb", wlb),
    ];
    plans
        .into_iter()
        .flat_map(|(peer, candidates)| {
            candidates.into_iter().map(move |mut candidate| {
                candidate.label = format!("plan={peer},{}", candidate.label);
                candidate
            })
        })
        .collect()
}

/// WLB-LLM's packing of a whole step, without the outlier delay: `pack-symmetric{policy=wlb}`
/// without a micro-batch count fills the fewest micro-batches of the context (a multiple of the
/// replicas) that hold every document (WLB-LLM's `N` is the tokens' count at the context; a
/// batch whose long documents it would delay gets more micro-batches instead), static CP and
/// recompute searched as for `wlb`.
fn wlb_without_delay(spec: &Spec, batch: &Batch, choices: &Choices) -> Vec<Candidate> {
    global_packing(spec, choices, "wlb", capacity(batch))
}

/// WLB-LLM's admission: outlier queues and delays, with `N` micro-batches for the drawn batch's
/// tokens at the context length (a multiple of `dp`, hence of every static CP split's replica
/// count). Without a context, `S_max` is the longest sample drawn or waiting.
fn wlb_admit(state: &mut StrategyState, spec: &Spec, batch: &Batch) -> Batch {
    let waiting = state
        .wlb
        .as_ref()
        .map_or(0, |wlb| wlb.delay.longest_waiting());
    let cap = capacity(batch).max(waiting);
    let count = default_count(batch.tokens(), cap, spec.parallel.dp as usize);
    let wlb = state.wlb.get_or_insert_with(|| WlbState {
        delay: OutlierDelay::for_cap(cap),
        micro_batches: count,
        cap,
    });
    wlb.micro_batches = count;
    wlb.cap = cap;
    wlb.delay
        .admit(batch, &slimpack_machine::machine_model(spec), count, cap)
}

/// Megatron-Core's hybrid CP runs only without pipeline parallelism.
fn single_stage(spec: &Spec) -> Result<(), &'static str> {
    if spec.parallel.pp == 1 {
        Ok(())
    } else {
        Err("needs pp=1")
    }
}

fn hybrid_cp_candidates(spec: &Spec, b: &Batch, _: &StrategyState, c: &Choices) -> Vec<Candidate> {
    let context = capacity(b);
    let mut candidates = Vec::new();
    for degree in cp_degrees(&Spec {
        parallel: slimpack_ir::spec::ParallelSpec {
            cp: None,
            ..spec.parallel
        },
        ..spec.clone()
    }) {
        let per_rank = context.div_ceil(degree);
        for &recompute in &c.recompute {
            candidates.push(Candidate {
                variants: Vec::new(),
                refinements: Vec::new(),
                label: format!("max-tokens-per-rank={per_rank},recompute={}", recompute),
                pipeline: format!(
                    "assign-hybrid-cp{{max-tokens-per-rank={per_rank}}},\
                     pack-symmetric{{policy=per-sample}},schedule-pipeline"
                ),
                recompute,
                vpp: None,
            });
        }
    }
    candidates
}

#[cfg(test)]
mod tests {
    use super::*;
    use slimpack_ir::batch::Sample;
    use slimpack_passes::parse_pipeline;

    fn batch() -> Batch {
        Batch::from_lengths(&[40, 10, 64, 5], Some(64), "test")
    }

    #[test]
    fn every_candidate_pipeline_parses() {
        let spec = Spec::from_presets("tiny", "cpu", "tp=1,pp=2,dp=4").unwrap();
        let mut state = StrategyState::default();
        for strategy in STRATEGIES {
            let batch = match strategy.admit {
                Some(admit) => admit(&mut state, &spec, &batch()),
                None => batch(),
            };
            let candidates = (strategy.candidates)(&spec, &batch, &state, &Choices::all());
            assert!(!candidates.is_empty(), "{}", strategy.name);
            for candidate in candidates {
                parse_pipeline(&candidate.pipeline)
                    .unwrap_or_else(|e| panic!("{}: {}: {e}", strategy.name, candidate.pipeline));
            }
        }
    }

    /// Over several steps, every wlb candidate compiles exactly the samples the admission
    /// admitted (the pass reproduces the admission's fill), and no token is lost: what was drawn
    /// is either trained on or still waiting.
    #[test]
    fn wlb_compiles_what_it_admits_and_drops_nothing() {
        let spec = Spec::from_presets("tiny", "cpu", "tp=1,pp=2,dp=4").unwrap();
        let wlb = lookup("wlb").unwrap();
        let mut state = StrategyState::default();
        let (mut drawn, mut trained) = (0u64, 0u64);
        let mut seed = 7u64;
        for step in 0..8u64 {
            let samples: Vec<Sample> = (0..30)
                .map(|i| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    Sample {
                        len: 1 + ((seed >> 33) % 64) as u32,
                        doc: step * 100 + i,
                        piece: 0,
                    }
                })
                .collect();
            let batch = Batch {
                documents: samples.len(),
                samples,
                documents_cut: 0,
                documents_empty: 0,
                context: Some(64),
                source: "test".into(),
            };
            drawn += batch.tokens();
            let admitted = (wlb.admit.unwrap())(&mut state, &spec, &batch);
            trained += admitted.tokens();
            for candidate in (wlb.candidates)(&spec, &admitted, &state, &Choices::all()) {
                let mut ir = slimpack_ir::StepIr::from_batch(spec.clone(), &admitted);
                let pipeline = parse_pipeline(&candidate.pipeline).unwrap();
                let options = slimpack_passes::ManagerOptions::default();
                slimpack_passes::run_pipeline(&mut ir, &pipeline, &options, &mut std::io::sink())
                    .unwrap_or_else(|e| panic!("step {step}, {}: {e}", candidate.label));
                assert_eq!(ir.tokens(), admitted.tokens());
            }
        }
        assert_eq!(drawn, trained + state.backlog().1);
        assert!(state.backlog().0 > 0, "the test should exercise the delay");
    }

    /// slimpack's `plan=wlb` is WLB-LLM's packing without delay (no micro-batch count: the
    /// fewest that hold every sample); on the steps of the opt-in `slimpack-outlier-delay`,
    /// admitted as wlb admits them, it is wlb's own plan, candidate for candidate.
    #[test]
    fn plan_wlb_is_wlb_without_delay_unless_the_delay_is_opted_into() {
        let spec = Spec::from_presets("tiny", "cpu", "tp=1,pp=2,dp=4").unwrap();
        let choices = Choices::all();
        let plans = |strategy: &StrategyInfo, state: &StrategyState, batch: &Batch| {
            (strategy.candidates)(&spec, batch, state, &choices)
                .into_iter()
                .filter(|c| c.label.starts_with("plan=wlb,"))
                .collect::<Vec<_>>()
        };
        let slimpack = lookup("slimpack").unwrap();
        let fresh = StrategyState::default();
        let own = plans(slimpack, &fresh, &batch());
        assert!(!own.is_empty());
        assert!(own
            .iter()
            .all(|c| c.pipeline.contains("policy=wlb,scope=global,cap=64}")));

        let delayed = lookup("slimpack-outlier-delay").unwrap();
        let wlb = lookup("wlb").unwrap();
        let mut state = StrategyState::default();
        let admitted = (delayed.admit.unwrap())(&mut state, &spec, &batch());
        let peer = (wlb.candidates)(&spec, &admitted, &state, &choices);
        let offered = plans(delayed, &state, &admitted);
        for candidate in &peer {
            let label = format!("plan=wlb,{}", candidate.label);
            let plan = offered.iter().find(|c| c.label == label).unwrap();
            assert_eq!(plan.pipeline, candidate.pipeline, "{label}");
            assert!(plan.pipeline.contains("micro-batches="), "{label}");
        }
    }

    #[test]
    fn cp_degrees_come_from_the_dp_pool_unless_the_layout_fixes_cp() {
        let spec = Spec::from_presets("tiny", "cpu", "tp=1,pp=1,dp=8").unwrap();
        assert_eq!(cp_degrees(&spec), vec![1, 2, 4, 8]);
        let spec = Spec::from_presets("tiny", "cpu", "tp=1,pp=1,dp=6").unwrap();
        assert_eq!(cp_degrees(&spec), vec![1, 2]);
        let spec = Spec::from_presets("tiny", "cpu", "tp=1,cp=2,pp=1,dp=8").unwrap();
        assert_eq!(cp_degrees(&spec), vec![1]);
        assert_eq!(
            megatron_paper_candidates(&spec, &batch(), &StrategyState::default(), &Choices::all())
                .len(),
            3
        );
        assert!(lookup("nope").is_err_and(|e| e.contains("megatron")));
    }

    /// Bins hold the longest document: the first two rungs at or above it, then the context.
    #[test]
    fn megatron_bin_sizes_climb_from_the_longest_document() {
        let sizes = |lengths: &[u32], context| {
            megatron_bin_sizes(&Batch::from_lengths(lengths, Some(context), "test"))
        };
        // Wikipedia-like S4: longest 90,000 of a 262,144 context -> 96K, 128K, 256K.
        assert_eq!(
            sizes(&[90_000, 300, 5_000], 262_144),
            vec![98_304, 131_072, 262_144]
        );
        // A rung equal to the longest is taken; rungs at the context are the context.
        assert_eq!(sizes(&[4096, 10], 65_536), vec![4096, 6144, 65_536]);
        assert_eq!(sizes(&[40_000], 65_536), vec![49_152, 65_536]);
        assert_eq!(sizes(&[65_536], 65_536), vec![65_536]);
    }

    #[test]
    fn block_recompute_tries_a_quarter_and_a_half_of_a_chunk() {
        assert_eq!(block_recompute_layers(10), vec![2, 5]);
        assert_eq!(block_recompute_layers(4), vec![1, 2]);
        assert_eq!(block_recompute_layers(2), vec![1]);
        assert_eq!(block_recompute_layers(1), Vec::<u32>::new());
    }

    /// megatron = interleavings x bins x CP degrees x (uniform + block) recompute modes;
    /// megatron-paper keeps the context bins, the uniform modes and plain 1F1B.
    #[test]
    fn megatron_searches_bins_block_recompute_and_interleaving() {
        // llama-70b, 10 layers per stage: block:2 and block:5; with two chunks per device, 5
        // layers per chunk: block:1 and block:2.
        let spec = Spec::from_presets("llama-70b", "h100-sxm", "tp=8,pp=8,dp=4").unwrap();
        let batch = Batch::from_lengths(&[90_000, 300, 5_000], Some(262_144), "test");
        let state = StrategyState::default();
        let tuned = megatron_candidates(&spec, &batch, &state, &Choices::all());
        assert_eq!(tuned.len(), 2 * 3 * 3 * 5);
        assert!(tuned
            .iter()
            .any(|c| c.label == "bin=98304,cp=2,recompute=block:5"
                && c.recompute == Recompute::Block(5)
                && c.vpp.is_none()
                && c.pipeline.contains("cap=98304")));
        assert!(tuned
            .iter()
            .any(|c| c.label == "vpp=2,bin=98304,cp=2,recompute=block:1"
                && c.recompute == Recompute::Block(1)
                && c.vpp == Some(2)));
        assert!(!tuned
            .iter()
            .any(|c| c.vpp == Some(2) && c.recompute == Recompute::Block(5)));
        let paper = megatron_paper_candidates(&spec, &batch, &state, &Choices::all());
        assert_eq!(paper.len(), 3 * 3);
        assert!(paper
            .iter()
            .all(|c| c.pipeline.contains("cap=262144") && c.vpp.is_none()));
        let fixed = megatron_candidates(&spec, &batch, &state, &Choices::fixed(Recompute::Full));
        assert_eq!(fixed.len(), 2 * 3 * 3);
    }

    /// Interleaving is tried where the layers split into `2 · pp` chunks, with a pipeline, and
    /// the layout does not fix `vpp` itself.
    #[test]
    fn megatron_interleaves_where_the_layers_allow() {
        let choices = |layout: &str| {
            let spec = Spec::from_presets("llama-7b", "h100-sxm", layout).unwrap();
            megatron_vpp_choices(&spec, &Choices::all())
        };
        assert_eq!(choices("tp=8,pp=4,dp=4"), vec![None, Some(2)]);
        assert_eq!(choices("tp=8,pp=1,dp=4"), vec![None]);
        assert_eq!(choices("tp=8,pp=4,vpp=2,dp=4"), vec![None]);
        // 32 layers do not split into 2 x 32 chunks.
        assert_eq!(choices("tp=8,pp=32,dp=1"), vec![None]);
        // Not for an executor that runs one chunk per device.
        let spec = Spec::from_presets("llama-7b", "h100-sxm", "tp=8,pp=4,dp=4").unwrap();
        let one = Choices::all().one_chunk_per_device();
        assert_eq!(megatron_vpp_choices(&spec, &one), vec![None]);
    }
}
