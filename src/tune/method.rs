//! slimpack's own strategy: the pipeline of the SlimPack method, the knobs the driver searches,
//! and the ablations that switch one idea off.
//!
//! Pipeline: `assign-dp` (phase 1: balance replicas on FLOPs), `dp-merge` (CP groups for
//! dominant or over-long samples), `slice{size=S}`, `pack-fwd{cap=C}` and `pack-bwd{cap=C}`
//! (phase 2: two different partitions, each balanced on its own direction's cost), `eqsat`
//! (e-graph refinement of the packs), `schedule-pipeline` (slice-level 1F1B, memory-aware).
//! Knobs: the slice size `S` and pack cap `C` (an eighth of the context in quarter-context packs,
//! an eighth or a half of the context in context-sized packs, see [`slice_sizes`]; with DP-Merge
//! also sixteenth-context slices in eighth-context packs, [`merge_slice_sizes`]; where a pack of
//! the context does not fit a device without recomputation, half-context slices in the largest pack
//! that does, [`fitting_cap`]), a static CP degree taken from the DP pool (as the peers may;
//! without one, DP-Merge forms CP groups per sample, sized per sample, merging samples above one of
//! [`MERGE_MEMORY`]'s fractions of a device's free memory) and the recompute mode; the driver
//! scores every candidate with the simulator and keeps the fastest that fits memory. Within a
//! candidate, every step chooses, again by simulation, between asymmetric and mirrored backward
//! packs and between the list schedule in time and the generalised 1F1B (the candidate's variants,
//! [`pipeline_orders`]); a mirrored pipeline that goes over the memory limit with forward runs that
//! do not fit is compiled again with them bounded (its fallback, [`bounded_runs`]). eqsat refines
//! the chosen configuration only: the search compares candidates without it, and the step that runs
//! a candidate also tries each of its packings refined by eqsat (the candidate's refinements,
//! [`Candidate::refined`]), keeping eqsat's result where the simulator prefers it. Its measured
//! gain (0.02-0.24% per scenario) rarely reorders candidates, and it cost about a seventh of the
//! search. Then `lower` (run by the compile driver on the chosen candidate only) emits the op
//! lists.
//!
//! The full method's search also holds the plans the peers would make (megatron's bins, kk,
//! wlb's packs without delay: `plan=<peer>` candidates), so it never settles for less than
//! theirs on the steps it is tuned on, and a run keeps the best of each beside the tuned
//! configuration and picks per step ([`super::kept`]); the ablations but `zero-bubble` search
//! only the method's own candidates.
//!
//! Zero bubble: on a pipeline (`pp > 1`, one model chunk per device), every candidate, the
//! peers' plans included, has a twin (label `...,zb`) whose `schedule-pipeline{zb=true}` splits
//! the backwards and defers the weight gradients into pipeline idle (ZB-H1); the simulator
//! keeps it where it is faster and fits.
//!
//! Per-stage recomputation: every candidate that recomputes fully, the peers' plans included,
//! has a twin (label `recompute=per-stage`) whose `assign-recompute` gives each pipeline device
//! the least recomputation its simulated memory allows ([`super::stage_recompute`]).
//!
//! Ablations (`--no-<idea>` on the command line, `slimpack-no-<idea>` as strategy names):
//! `asymmetric` (backward packs mirror the forward ones), `dp-merge`, `slicing` (whole
//! samples), `eqsat`; `zero-bubble`, the full search (peers' plans included) with whole
//! backwards only; `stage-recompute`, the full search with one mode per step; and
//! `interleave`, the full search with a shared DP rank's replicas one after the other (no
//! `interleave-ranks` at the end of the DP-Merge pipelines).

use slimpack_ir::batch::Batch;
use slimpack_ir::spec::Recompute;
use slimpack_ir::step::Direction;
use slimpack_ir::Spec;

use super::stage_recompute::with_stage_recompute;
use super::strategy::{
    capacity, cp_degrees, Candidate, Choices, StrategyState, Variant, DEFAULT_MEMORY_LIMIT,
};

/// Which ideas a variant keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ideas {
    pub asymmetric: bool,
    pub dp_merge: bool,
    pub slicing: bool,
    pub eqsat: bool,
    pub zero_bubble: bool,
    /// Per-stage recomputation twins ([`super::stage_recompute`]).
    pub stage_recompute: bool,
    /// The twins' packs take lower rungs than their device where memory allows
    /// (`assign-recompute{packs=true}`).
    pub pack_recompute: bool,
    /// DP-Merge pipelines end in `interleave-ranks`: a rank shared by its plain replica and a
    /// group runs their schedules interleaved where that is faster within memory.
    pub interleave_ranks: bool,
}

impl Ideas {
    /// The full method.
    pub const ALL: Ideas = Ideas {
        asymmetric: true,
        dp_merge: true,
        slicing: true,
        eqsat: true,
        zero_bubble: true,
        stage_recompute: true,
        pack_recompute: true,
        interleave_ranks: true,
    };
}

/// (slice size, pack cap) pairs tried for a context length: small slices in quarter-context
/// packs (memory-light, many packs for the pipeline), small slices in context-sized packs
/// (GEMMs near their peak, few per-pack overheads), and half-context slices in context-sized
/// packs; at least 1024 tokens each, without duplicates.
pub fn slice_sizes(context: u32) -> Vec<(u32, u32)> {
    let at_least = |tokens: u32| tokens.max(1024).min(context);
    let mut sizes = vec![
        (at_least(context / 8), at_least(context / 4)),
        (at_least(context / 8), context),
        (at_least(context / 2), context),
    ];
    sizes.dedup();
    sizes
}

/// The (slice size, pack cap) pairs of DP-Merge candidates: [`slice_sizes`] and, first, a
/// memory-light pair (sixteenth-context slices in eighth-context packs): a merged rank holds
/// its share of the long sample after its own pipeline, whose forwards in flight small packs
/// keep light, so that it runs without recomputation.
pub fn merge_slice_sizes(context: u32) -> Vec<(u32, u32)> {
    let at_least = |tokens: u32| tokens.max(1024).min(context);
    let mut sizes = vec![(at_least(context / 16), at_least(context / 8))];
    for size in slice_sizes(context) {
        if !sizes.contains(&size) {
            sizes.push(size);
        }
    }
    sizes
}

/// Where a pack of the whole context does not fit a device's memory without recomputation,
/// the largest that does, in eighths of the context and at least half of it: the pack cap of
/// a further (half-context slice, cap) pair, so that a candidate that recomputes nothing
/// packs as much as memory allows rather than a quarter of the context. A pack's tokens are
/// spread over `cp` ranks; the first pipeline device holds a forward of each of its stages in
/// flight per pipeline device under 1F1B (`pp · vpp` of a stage's layers; a schedule that fits
/// fewer shortens its warm-up) and the backward's temporaries, beside its model states, within
/// `memory` of the device. `None` where the context fits or half of it does not.
pub fn fitting_cap(spec: &Spec, context: u32, cp: u32, memory: f64) -> Option<u32> {
    let mut plain = spec.clone();
    plain.model.recompute = Recompute::None;
    let model = slimpack_machine::machine_model(&plain);
    let memory_model = model.memory();
    let budget = memory_model.activation_budget(0, memory);
    let in_flight = u64::from(plain.parallel.stages());
    let fits = |cap: u32| {
        let tokens = u64::from(cap).div_ceil(u64::from(cp.max(1)));
        let held = in_flight * memory_model.held_bytes(tokens, 0);
        held + memory_model.temporary_bytes(tokens, 0, Direction::Backward) <= budget
    };
    if context / 8 < 1024 || fits(context) {
        return None;
    }
    // k eighths, rounded down: at least the half-context slice (`context / 2`) for k = 4.
    (4..8u64)
        .rev()
        .map(|k| (u64::from(context) * k / 8) as u32)
        .find(|&cap| fits(cap))
}

/// How replicas are formed: a static CP degree from the DP pool, or single ranks with DP-Merge
/// groups for samples that need more than `memory` of a device's free memory.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Grouping {
    Static(u32),
    Merge { memory: f64 },
}

/// How backward packs are formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backward {
    /// Their own partition, balanced on backward cost (`pack-bwd`).
    Asymmetric,
    /// The forward packs mirrored (`pack-bwd{mirror=true}`).
    Mirror,
}

/// Backward packings a step may use: with asymmetry, both — an asymmetric partition balances
/// each direction on its own cost, but its packs can hold a pipeline stage waiting for a
/// forward they depend on (a slice's backward waits for its forward on every later stage), and where that costs more than the balance gains the
/// simulator picks the mirrored packs, per step; without it, only the mirror.
fn backward_packings(ideas: Ideas) -> &'static [Backward] {
    if ideas.asymmetric {
        &[Backward::Asymmetric, Backward::Mirror]
    } else {
        &[Backward::Mirror]
    }
}

/// Whether a step runs eqsat: with the idea, without and, once the configuration is chosen,
/// with (the simulator judges eqsat's result per step, since its rewrites are scored by its
/// own estimate); without, never.
fn refinements(ideas: Ideas) -> &'static [bool] {
    if ideas.eqsat {
        &[false, true]
    } else {
        &[false]
    }
}

/// DP-Merge memory fractions tried, the simulator choosing: merge only what would crowd a
/// device (half its free memory), or long samples earlier (a quarter, an eighth), trading CP
/// exchanges and more, smaller groups for memory.
const MERGE_MEMORY: [f64; 3] = [0.5, 0.25, 0.125];

/// The candidates of a variant: groupings x (slice size, cap) x recompute modes, each with its
/// backward packings and eqsat on or off as per-step variants.
pub fn candidates_with(
    ideas: Ideas,
    spec: &Spec,
    batch: &Batch,
    choices: &Choices,
) -> Vec<Candidate> {
    let mut groupings = Vec::new();
    for cp in cp_degrees(spec) {
        if cp == 1 && ideas.dp_merge {
            groupings.extend(MERGE_MEMORY.map(|memory| Grouping::Merge { memory }));
        } else {
            groupings.push(Grouping::Static(cp));
        }
    }
    let context = capacity(batch);
    // A pack attends to the sum of its slices' keys (each slice's prefix and itself), held in
    // the 32-bit offsets of a varlen layout. Whole samples sum to at most the batch's tokens;
    // a pack holding k slices of one sample of L tokens attends to up to k·L keys, and packs
    // of the context hold eight slices of an eighth (more where slices are cut by cost). So a
    // batch with a sample past 2^26 tokens (64 times that, far beyond any context trained on)
    // is not sliced.
    let longest = batch.samples.iter().map(|s| s.len).max().unwrap_or(0);
    let slicing = ideas.slicing && longest <= u32::MAX / 64;
    let mut candidates = Vec::new();
    // The fitting cap by CP degree, computed once for the groupings that share one.
    let mut fitting_caps: Vec<(u32, Option<u32>)> = Vec::new();
    for grouping in groupings {
        let mut sizes = match grouping {
            _ if !slicing => vec![(context, context)],
            Grouping::Merge { .. } => merge_slice_sizes(context),
            Grouping::Static(_) => slice_sizes(context),
        };
        let cp = match grouping {
            Grouping::Static(cp) => cp,
            Grouping::Merge { .. } => 1,
        };
        // Only without recomputation: with it, the context's packs fit.
        let cap = match fitting_caps.iter().find(|&&(degree, _)| degree == cp) {
            _ if !slicing => None,
            Some(&(_, cap)) => cap,
            None => {
                let cap = fitting_cap(spec, context, cp, choices.memory_limit);
                fitting_caps.push((cp, cap));
                cap
            }
        };
        let fitting = cap
            .map(|cap| (context / 2, cap))
            .filter(|pair| !sizes.contains(pair));
        sizes.extend(fitting);
        // Static groupings with packs shorter than the context also cut by cost
        // (`slice{by=cost}`: a long sample's later slices shorter), which evens the costs of
        // the many packs a pipeline then runs, where one CP group holds a whole long sample.
        // A DP-Merge group spreads the long sample already, and there token slices win (S2,
        // S7); packs of the whole context hold a long sample's slices by themselves.
        let cuts = |cap: u32| -> &[bool] {
            match grouping {
                Grouping::Static(_) if slicing && cap < context => &[false, true],
                _ => &[false],
            }
        };
        for (&(size, cap), &by_cost) in sizes
            .iter()
            .flat_map(|pair| cuts(pair.1).iter().map(move |cut| (pair, cut)))
        {
            let (mut passes, label) = match grouping {
                Grouping::Static(1) => (vec!["assign-dp".to_string()], "cp=1".to_string()),
                Grouping::Static(cp) => (vec![format!("assign-dp{{cp={cp}}}")], format!("cp={cp}")),
                Grouping::Merge { memory } => (
                    vec![
                        "assign-dp".to_string(),
                        format!("dp-merge{{memory={memory}}}"),
                    ],
                    format!("dp-merge={memory}"),
                ),
            };
            if slicing {
                passes.push(match by_cost {
                    true => format!("slice{{size={size},by=cost}}"),
                    false => format!("slice{{size={size}}}"),
                });
            }
            passes.push(format!("pack-fwd{{cap={cap}{}}}", memory_option(choices)));
            // Every backward packing, in every pipeline order: the first is the candidate's
            // pipeline, the others its per-step variants; with eqsat, the same refined by it
            // (the candidate's refinements, tried once it is chosen).
            let mut pipelines = Vec::new();
            let mut refined = Vec::new();
            for &backward in backward_packings(ideas) {
                for &refine in refinements(ideas) {
                    let mut passes = passes.clone();
                    passes.push(match backward {
                        Backward::Asymmetric => format!("pack-bwd{{cap={cap}}}"),
                        Backward::Mirror => MIRROR.to_string(),
                    });
                    let mut label = Vec::new();
                    if backward == Backward::Mirror && ideas.asymmetric {
                        label.push("bwd=mirror");
                    }
                    if refine {
                        passes.push("eqsat".into());
                        label.push("eqsat");
                    }
                    for order in pipeline_orders(spec) {
                        let mut label = label.clone();
                        let schedule = match order {
                            Some(order) => {
                                label.push(order);
                                format!("schedule-pipeline{{{order}}}")
                            }
                            None => "schedule-pipeline".to_string(),
                        };
                        let variant = Variant {
                            label: label.join(","),
                            pipeline: [passes.join(","), schedule].join(","),
                            fallback_of: None,
                        };
                        match refine {
                            true => refined.push(variant),
                            false => pipelines.push(variant),
                        }
                    }
                }
            }
            // Each mirrored pipeline's fallback with forward runs bounded by memory, for the
            // steps it makes over the limit (after them: the tree compiles a fallback once its
            // pipeline is simulated). Mirrored backward packs hold a whole run until its
            // backward; asymmetric ones free it sample by sample, and bounded runs, which make
            // fuller forward packs, raised their peaks (H1: 98 -> 126 GiB).
            // Not on model chunks (`vpp > 1`), whose list schedule keeps its own window.
            let fallbacks: Vec<Variant> = pipelines
                .iter()
                .filter(|variant| spec.parallel.vpp == 1 && variant.pipeline.contains(MIRROR))
                .map(|variant| bounded_runs(variant, cap, choices))
                .collect();
            pipelines.extend(fallbacks);
            let primary = pipelines.remove(0);
            let modes = choices
                .recompute
                .iter()
                .filter(|&&recompute| fitting != Some((size, cap)) || recompute == Recompute::None);
            for &recompute in modes {
                candidates.push(Candidate {
                    label: format!(
                        "{label},slice={size}{},cap={cap},recompute={}",
                        if by_cost { ",by=cost" } else { "" },
                        recompute
                    ),
                    pipeline: primary.pipeline.clone(),
                    variants: pipelines.clone(),
                    refinements: refined.clone(),
                    recompute,
                    vpp: None,
                });
            }
        }
    }
    let candidates = match ideas.zero_bubble {
        true => with_zero_bubble(candidates, spec, choices),
        false => candidates,
    };
    let candidates = match ideas.stage_recompute {
        true => with_stage_recompute(candidates, choices, ideas.pack_recompute),
        false => candidates,
    };
    match ideas.interleave_ranks {
        true => with_interleaved_ranks(candidates, choices),
        false => candidates,
    }
}

/// `candidates` with every pipeline of the DP-Merge ones (whose groups share DP ranks with
/// the plain replicas) ending in `interleave-ranks`, after whatever else it runs: the pass
/// keeps a shared rank's replicas one after the other unless interleaving them is faster
/// within the memory limit, so a step only gains.
fn with_interleaved_ranks(candidates: Vec<Candidate>, choices: &Choices) -> Vec<Candidate> {
    let pass = match choices.memory_limit == DEFAULT_MEMORY_LIMIT {
        true => INTERLEAVE.to_string(),
        false => format!("{INTERLEAVE}{{memory={}}}", choices.memory_limit),
    };
    candidates
        .into_iter()
        .map(|candidate| match candidate.label.starts_with("dp-merge=") {
            true => candidate.map_pipelines(|pipeline| format!("{pipeline},{pass}")),
            false => candidate,
        })
        .collect()
}

/// The pass that interleaves a shared rank's replicas.
const INTERLEAVE: &str = "interleave-ranks";

/// The mirrored backward packing (the forward packs' slices).
const MIRROR: &str = "pack-bwd{mirror=true}";

/// `pack-fwd`'s `memory` option where the memory limit is not its default: the fraction its
/// runs are measured (and, bounded, kept) against.
fn memory_option(choices: &Choices) -> String {
    match choices.memory_limit == DEFAULT_MEMORY_LIMIT {
        true => String::new(),
        false => format!(",memory={}", choices.memory_limit),
    }
}

/// `variant` with its `pack-fwd{cap=cap}` bounding its forward runs by the memory limit
/// (`runs=bounded`): its fallback where it goes over the limit. A run of forward packs joined
/// by a sample's slices is in flight until that sample's first backward, whatever the
/// pipeline order, and with long samples cut into many slices such runs hold more
/// activations than the devices have (H1: 191 GiB with mirrored backward packs); bounded,
/// the packing closes a run before it would not fit.
fn bounded_runs(variant: &Variant, cap: u32, choices: &Choices) -> Variant {
    let memory = memory_option(choices);
    let free = format!("pack-fwd{{cap={cap}{memory}}}");
    let bounded = format!("pack-fwd{{cap={cap},runs=bounded{memory}}}");
    debug_assert!(variant.pipeline.contains(&free), "{}", variant.pipeline);
    let label = match variant.label.is_empty() {
        true => "runs=bounded".to_string(),
        false => format!("{},runs=bounded", variant.label),
    };
    Variant {
        label,
        pipeline: variant.pipeline.replace(&free, &bounded),
        fallback_of: Some(variant.pipeline.clone()),
    }
}

/// `candidates` and, on a pipeline of one model chunk per device where `choices` allow split
/// backwards, each one's zero-bubble twin (label `...,zb`).
pub(crate) fn with_zero_bubble(
    candidates: Vec<Candidate>,
    spec: &Spec,
    choices: &Choices,
) -> Vec<Candidate> {
    let parallel = spec.parallel;
    if !choices.split_backwards || parallel.pp < 2 || parallel.vpp > 1 {
        return candidates;
    }
    let split = |pipeline: &str| match pipeline.contains("schedule-pipeline{") {
        true => pipeline.replace("schedule-pipeline{", "schedule-pipeline{zb=true,"),
        false => pipeline.replace("schedule-pipeline", "schedule-pipeline{zb=true}"),
    };
    let twins: Vec<Candidate> = candidates
        .iter()
        .filter(|candidate| candidate.vpp.is_none_or(|vpp| vpp == 1))
        .map(|candidate| Candidate {
            label: format!("{},zb", candidate.label),
            ..candidate.map_pipelines(split)
        })
        .collect();
    let mut all = candidates;
    all.extend(twins);
    all
}

/// The pipeline orders a step chooses between by simulation: the list schedule in time
/// (`schedule-pipeline`'s default for asymmetric packs) and, with pipeline stages, the
/// generalised 1F1B (`order=1f1b`), which holds fewer forwards in flight and wins on some
/// batches.
fn pipeline_orders(spec: &Spec) -> Vec<Option<&'static str>> {
    if spec.parallel.pp > 1 && spec.parallel.vpp == 1 {
        vec![None, Some("order=1f1b")]
    } else {
        vec![None]
    }
}

macro_rules! variant {
    ($name:ident, $ideas:expr) => {
        pub(crate) fn $name(
            spec: &Spec,
            batch: &Batch,
            _: &StrategyState,
            choices: &Choices,
        ) -> Vec<Candidate> {
            candidates_with($ideas, spec, batch, choices)
        }
    };
}

/// The full method: its own candidates, and the peers' plans ([`super::strategy::peer_plans`])
/// so that the simulator can pick one on a batch where it is best.
pub(crate) fn full(
    spec: &Spec,
    batch: &Batch,
    state: &StrategyState,
    choices: &Choices,
) -> Vec<Candidate> {
    with_peer_plans(Ideas::ALL, spec, batch, state, choices)
}

/// An ablation that keeps the full method's search (its own candidates and the peers' plans)
/// with one idea off: for ideas that apply to the peers' plans too, or that only add to what
/// the search holds.
macro_rules! full_search_without {
    ($(#[$doc:meta])* $name:ident, $idea:ident) => {
        $(#[$doc])*
        pub(crate) fn $name(
            spec: &Spec,
            batch: &Batch,
            state: &StrategyState,
            choices: &Choices,
        ) -> Vec<Candidate> {
            let ideas = Ideas {
                $idea: false,
                ..Ideas::ALL
            };
            with_peer_plans(ideas, spec, batch, state, choices)
        }
    };
}
full_search_without!(
    /// Whole backwards only, the peers' plans without their zero-bubble twins too.
    no_zero_bubble,
    zero_bubble
);
full_search_without!(
    /// One recomputation mode per step (no per-stage twins).
    no_stage_recompute,
    stage_recompute
);
full_search_without!(
    /// Per-stage recomputation twins whose packs all take their device's rung.
    no_pack_recompute,
    pack_recompute
);
full_search_without!(
    /// A shared rank's replicas one after the other.
    no_interleave,
    interleave_ranks
);

/// The method's candidates under `ideas` and the peers' plans, each with its zero-bubble and
/// per-stage recomputation twins where `ideas` keep them.
fn with_peer_plans(
    ideas: Ideas,
    spec: &Spec,
    batch: &Batch,
    state: &StrategyState,
    choices: &Choices,
) -> Vec<Candidate> {
    let mut candidates = candidates_with(ideas, spec, batch, choices);
    let mut peers = super::strategy::peer_plans(spec, batch, state, choices);
    if ideas.zero_bubble {
        peers = with_zero_bubble(peers, spec, choices);
    }
    if ideas.stage_recompute {
        peers = with_stage_recompute(peers, choices, ideas.pack_recompute);
    }
    candidates.extend(peers);
    candidates
}
variant!(
    no_asymmetric,
    Ideas {
        asymmetric: false,
        ..Ideas::ALL
    }
);
variant!(
    no_dp_merge,
    Ideas {
        dp_merge: false,
        ..Ideas::ALL
    }
);
variant!(
    no_slicing,
    Ideas {
        slicing: false,
        ..Ideas::ALL
    }
);
variant!(
    no_eqsat,
    Ideas {
        eqsat: false,
        ..Ideas::ALL
    }
);

#[cfg(test)]
mod tests {
    use super::*;
    use slimpack_ir::spec::Recompute;

    /// DP-Merge candidates: every memory fraction with the memory-light size too; static CP
    /// degrees only the context-relative sizes.
    #[test]
    fn merge_candidates_search_fractions_and_the_light_size() {
        let spec = Spec::from_presets("llama-7b", "h100-sxm", "tp=8,pp=1,dp=2").unwrap();
        let batch = Batch::from_lengths(&[100_000, 2_000, 30_000], Some(131072), "test");
        let candidates =
            candidates_with(Ideas::ALL, &spec, &batch, &Choices::fixed(Recompute::None));
        let labels: Vec<&str> = candidates.iter().map(|c| c.label.as_str()).collect();
        for memory in MERGE_MEMORY {
            for (size, cap) in merge_slice_sizes(131072) {
                let label = format!("dp-merge={memory},slice={size},cap={cap},recompute=none");
                assert!(labels.contains(&label.as_str()), "{label} in {labels:?}");
            }
        }
        assert!(!labels.iter().any(|l| l.starts_with("cp=2,slice=8192")));
        // DP-Merge adds its pair of the largest pack that fits (a context's pack does not, at
        // cp=1); static cp=2 cuts its 3 sizes by tokens (the context's pack fits), and the
        // one with packs shorter than the context also by cost.
        assert_eq!(candidates.len(), MERGE_MEMORY.len() * 5 + 3 + 1);
        let light = candidates
            .iter()
            .find(|c| c.label.starts_with("dp-merge=0.25,slice=8192"))
            .unwrap();
        assert!(light
            .pipeline
            .starts_with("assign-dp,dp-merge{memory=0.25},slice{size=8192},pack-fwd{cap=16384}"));
    }

    /// llama-7b at tp=8 holds a 7/8-context pack of 128K without recomputation on one
    /// pipeline device, not a whole one; at cp=2, or at 32K, the context fits; at pp=4 (four
    /// forwards in flight) not even half of it does.
    #[test]
    fn a_pack_of_the_context_that_does_not_fit_gives_the_largest_that_does() {
        let spec = |parallel: &str| Spec::from_presets("llama-7b", "h100-sxm", parallel).unwrap();
        let one = spec("tp=8,pp=1,dp=16");
        assert_eq!(fitting_cap(&one, 131072, 1, 0.92), Some(114688));
        assert_eq!(fitting_cap(&one, 131072, 1, 0.80), Some(98304));
        assert_eq!(fitting_cap(&one, 131072, 2, 0.92), None);
        assert_eq!(fitting_cap(&one, 32768, 1, 0.92), None);
        assert_eq!(fitting_cap(&spec("tp=8,pp=4,dp=4"), 131072, 1, 0.92), None);
        // Contexts that are no multiple of 8: the cap still holds a half-context slice.
        let mut caps = 0;
        for context in [131_075u32, 100_003, 126_001] {
            for memory in [0.92, 0.85, 0.78, 0.7] {
                if let Some(cap) = fitting_cap(&one, context, 1, memory) {
                    assert!(
                        cap >= context / 2 && cap < context,
                        "{context} {memory}: {cap}"
                    );
                    caps += 1;
                }
            }
        }
        assert!(caps >= 6, "{caps}");
        let batch = Batch::from_lengths(&[131072, 2_000, 30_000], Some(131072), "test");
        let labels: Vec<String> = candidates_with(Ideas::ALL, &one, &batch, &Choices::all())
            .into_iter()
            .map(|c| c.label)
            .collect();
        for memory in MERGE_MEMORY {
            let label = format!("dp-merge={memory},slice=65536,cap=114688,recompute=none");
            assert!(labels.contains(&label), "{label} in {labels:?}");
        }
    }

    #[test]
    fn slice_sizes_follow_the_context() {
        assert_eq!(
            slice_sizes(131072),
            vec![(16384, 32768), (16384, 131072), (65536, 131072)]
        );
        assert_eq!(
            slice_sizes(4096),
            vec![(1024, 1024), (1024, 4096), (2048, 4096)]
        );
        assert_eq!(slice_sizes(1024), vec![(1024, 1024)]);
    }

    #[test]
    fn merge_candidates_add_a_memory_light_size() {
        assert_eq!(
            merge_slice_sizes(131072),
            vec![
                (8192, 16384),
                (16384, 32768),
                (16384, 131072),
                (65536, 131072)
            ]
        );
        // Where the light pair is one of the others, it is tried once.
        assert_eq!(
            merge_slice_sizes(4096),
            vec![(1024, 1024), (1024, 4096), (2048, 4096)]
        );
    }
}
