//! Back to the IR: refine a plan's slices so both directions share them, and rebuild the step.
//!
//! A plan's forward and backward packs may cut a sample differently (a slice split or merged in
//! one direction only). The IR's slices are shared by both directions, so [`refine`] cuts every
//! span at every boundary either direction has: each piece then sits in the forward pack and
//! the backward pack that held the span containing it. Order is kept: forward, a sample's
//! pieces run in non-decreasing pack order and, within a pack, by offset; backward, in
//! non-increasing pack order (within a pack the order is free). Coverage is kept: each
//! direction's spans tile every sample exactly (checked; a failure is a bug in a rule).
//!
//! The IR has no operation to take slices out of packs, so [`rebuild`] builds a new step with
//! the same spec, stages, replicas and samples, copies the untouched replicas' slices and packs
//! as they are and lays out the planned ones; [`rebuild_replicas`] does the same for a new set
//! of replicas (rank merging adds, empties or drops DP-Merge groups and moves samples). Members of a planned pack are ordered as
//! `pack-fwd` and `pack-bwd` order them: by sample, forward first piece first, backward last
//! piece first.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap as HashMap;

use super::analysis::direction_index;
use super::encode::ReplicaPlan;
use super::language::Span;
use slimpack_ir::step::{Direction, Pack, Phase, ReplicaId, SampleId, SliceId};
use slimpack_ir::StepIr;
use slimpack_machine::cost::CostModel;

/// The plan with both directions cut at the union of their boundaries.
pub fn refine(plan: &ReplicaPlan, lengths: &[u32]) -> ReplicaPlan {
    let mut cuts: Vec<BTreeSet<u32>> = vec![BTreeSet::new(); plan.samples.len()];
    for direction in [Direction::Forward, Direction::Backward] {
        let mut covered = vec![Vec::new(); plan.samples.len()];
        for span in plan.packs(direction).iter().flatten() {
            cuts[span.sample as usize].extend([span.start, span.end()]);
            covered[span.sample as usize].push((span.start, span.end()));
        }
        for (sample, ranges) in covered.iter_mut().enumerate() {
            ranges.sort_unstable();
            let tiles = ranges.windows(2).all(|w| w[0].1 == w[1].0)
                && ranges.first().map(|r| r.0) == Some(0)
                && ranges.last().map(|r| r.1) == Some(lengths[sample]);
            assert!(
                tiles,
                "eqsat: {direction:?} spans of sample {sample} do not tile it ({ranges:?}); this is a bug"
            );
        }
    }
    let cut = |packs: &[Vec<Span>]| -> Vec<Vec<Span>> {
        packs
            .iter()
            .map(|pack| {
                let mut pieces = Vec::with_capacity(pack.len());
                for span in pack {
                    let inner = cuts[span.sample as usize].range(span.start + 1..span.end());
                    let mut start = span.start;
                    for &boundary in inner.chain(std::iter::once(&span.end())) {
                        pieces.push(Span {
                            sample: span.sample,
                            start,
                            len: boundary - start,
                        });
                        start = boundary;
                    }
                }
                pieces.sort_unstable();
                pieces
            })
            .collect()
    };
    ReplicaPlan {
        samples: plan.samples.clone(),
        forward: cut(&plan.forward),
        backward: cut(&plan.backward),
    }
}

/// What a replica of a rebuilt step runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Layout {
    /// The input replica's samples, slices and packs, as they are.
    Copy(ReplicaId),
    /// The plan's samples and packs, the packs of each direction capped position by position
    /// (forward, backward).
    Plan(ReplicaPlan, [Vec<Option<u32>>; 2]),
}

/// A new step equal to `ir` except for the replicas in `plans`, whose packs (and their
/// samples' slices) are laid out from the (refined) plans. The phase is `packed`.
pub fn rebuild(ir: &StepIr, plans: &BTreeMap<ReplicaId, ReplicaPlan>, cost: &CostModel) -> StepIr {
    let replicas: Vec<(Vec<u32>, Layout)> = ir
        .replicas()
        .iter()
        .map(|&replica| {
            let layout = match plans.get(&replica) {
                // Regrouping never adds or removes packs: position k keeps input pack k's cap.
                Some(plan) => Layout::Plan(
                    plan.clone(),
                    [Direction::Forward, Direction::Backward].map(|direction| {
                        ir.packs_on(replica, direction)
                            .iter()
                            .map(|&p| ir.pack(p).cap)
                            .collect()
                    }),
                ),
                None => Layout::Copy(replica),
            };
            (ir.replica(replica).ranks.clone(), layout)
        })
        .collect();
    rebuild_replicas(ir, &replicas, cost)
}

/// A new step with the same spec, stages and samples as `ir` and the replicas `replicas`
/// (ranks and layout, in this order); every sample of `ir` is on a copied replica or in a
/// plan. The phase is `packed`.
pub fn rebuild_replicas(ir: &StepIr, replicas: &[(Vec<u32>, Layout)], cost: &CostModel) -> StepIr {
    let stages: Vec<_> = ir.stages().iter().map(|&s| *ir.stage(s)).collect();
    let mut new = StepIr::with_stages(ir.spec.clone(), ir.batch.clone(), &stages);
    let mut copied_replicas = HashMap::default();
    let mut planned_on: HashMap<SampleId, ReplicaId> = HashMap::default();
    let mut ids = Vec::with_capacity(replicas.len());
    // A planned sample's pieces, from its forward packs (both directions hold the same pieces).
    let mut pieces: HashMap<SampleId, Vec<Span>> = HashMap::default();
    for (ranks, layout) in replicas {
        let id = new.add_replica(ranks.clone());
        ids.push(id);
        match layout {
            Layout::Copy(old) => {
                copied_replicas.insert(*old, id);
            }
            Layout::Plan(plan, _) => {
                for &sample in &plan.samples {
                    planned_on.insert(sample, id);
                }
                for span in plan.forward.iter().flatten() {
                    pieces
                        .entry(plan.samples[span.sample as usize])
                        .or_default()
                        .push(*span);
                }
            }
        }
    }
    let mut planned: HashMap<(SampleId, u32), SliceId> = HashMap::default();
    let mut copied: HashMap<SliceId, SliceId> = HashMap::default();
    let mut samples = Vec::with_capacity(ir.samples().len());
    new.reserve_samples(ir.samples().len());
    let sample_slices = ir.sample_slices();
    let mut lengths = Vec::new();
    for (position, &sample) in ir.samples().iter().enumerate() {
        let new_sample = new.add_bare_sample(*ir.sample(sample));
        samples.push((sample, new_sample));
        // A sample's slices tile it in offset order: laid out at once, as `add_slice` one by
        // one would (the same nodes and edges, in the same order).
        match pieces.get_mut(&sample) {
            Some(spans) => {
                spans.sort_unstable();
                lengths.clear();
                lengths.extend(spans.iter().map(|span| span.len));
                let created = new.set_slices(new_sample, &lengths);
                for (span, slice) in spans.iter().zip(created) {
                    planned.insert((sample, span.start), slice);
                }
            }
            None => {
                let old = sample_slices.at(position as u32);
                lengths.clear();
                lengths.extend(old.iter().map(|&slice| ir.slice(slice).len));
                let created = new.set_slices(new_sample, &lengths);
                copied.extend(old.iter().copied().zip(created));
            }
        }
    }
    for ((_, layout), &id) in replicas.iter().zip(&ids) {
        for direction in [Direction::Forward, Direction::Backward] {
            match layout {
                Layout::Copy(old) => {
                    for pack in ir.packs_on(*old, direction) {
                        let slices: Vec<SliceId> =
                            ir.pack_members(pack).iter().map(|s| copied[s]).collect();
                        new.add_pack(*ir.pack(pack), id, &slices);
                    }
                }
                Layout::Plan(plan, caps) => {
                    let caps = &caps[direction_index(direction)];
                    for (position, spans) in plan.packs(direction).iter().enumerate() {
                        let slices: Vec<SliceId> = member_order(spans, direction)
                            .iter()
                            .map(|s| planned[&(plan.samples[s.sample as usize], s.start)])
                            .collect();
                        let pack = Pack {
                            direction,
                            cap: caps[position],
                        };
                        new.add_pack(pack, id, &slices);
                    }
                }
            }
        }
    }
    // Samples are placed last, all at once.
    let placements: Vec<(SampleId, ReplicaId)> = (samples.into_iter())
        .filter_map(|(sample, new_sample)| {
            let replica = planned_on.get(&sample).copied().or_else(|| {
                ir.replica_of_sample(sample)
                    .and_then(|old| copied_replicas.get(&old).copied())
            });
            replica.map(|replica| (new_sample, replica))
        })
        .collect();
    new.place_samples(&placements);
    new.advance(Phase::Packed);
    if ir.phase() >= Phase::Scheduled {
        // The step keeps its phase: a scheduled input gets the orders of its new packs, split
        // again where the input's were (a zero-bubble schedule).
        let pass = crate::schedule_pipeline::SchedulePipeline {
            zero_bubble: ir.has_split_backwards(),
            ..Default::default()
        };
        crate::schedule_pipeline::schedule(&mut new, cost, pass);
        new.advance(Phase::Scheduled);
    }
    new
}

/// A pack's spans in the order `pack-fwd` / `pack-bwd` list them: by sample, each sample's in
/// its run order.
fn member_order(spans: &[Span], direction: Direction) -> Vec<Span> {
    let mut members = spans.to_vec();
    match direction {
        Direction::Forward => members.sort_unstable(),
        Direction::Backward => {
            members.sort_unstable_by(|a, b| a.sample.cmp(&b.sample).then(b.start.cmp(&a.start)))
        }
    }
    members
}
