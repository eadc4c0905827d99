//! The simulated machine: predicts the time and memory of a scheduled training step.
//!
//! [`simulate`] builds a DAG of tasks from a scheduled [`StepIr`] (`build`: every pack's
//! forward and backward on every stage of its replica, pipeline sends, the per-stage DP
//! gradient sync and optimizer step), times and sizes each task with the cost crate's machine
//! model ([`CostModel`]), runs it event by event on a compute and a communication stream per
//! device group (`engine`; a group is the `tp × cp` devices of one DP rank on one stage,
//! `layout`), stacks each group's memory timeline (`memory`), and derives the [`Metrics`]
//! (`metrics`). [`trace::chrome_trace`] and [`svg::timeline`] draw the result; [`fixture`]
//! builds small scheduled steps for tests and benchmarks.
//!
//! The simulator trusts a verified IR (`slimpack_ir::verify`) but checks what it relies on:
//! the phase, the stage count, replica ranks, that every per-stage schedule lists the
//! replica's packs once each, and that the dependencies leave no task waiting forever.

mod build;
mod engine;
pub mod fixture;
mod layout;
mod memory;
mod metrics;
mod result;
pub mod svg;
mod task;
pub mod trace;

#[cfg(test)]
mod tests;

pub use build::{SharedRanks, Timeline, TimelineOp};
pub use engine::Span;
pub use layout::{GroupId, Layout};
pub use memory::{GroupMemory, MemoryEffect, MemoryPoint};
pub use metrics::{Losses, Metrics};
pub use result::{PackInfo, SimResult};
pub use task::{ComputeParts, PackIndex, Stream, Task, TaskGraph, TaskId, TaskKind};

use crate::cost::CostModel;
use crate::error::MachineError;
use slimpack_ir::spec::Recompute;
use slimpack_ir::step::{PackId, Phase, StepIr};

/// Simulates one training step of `ir` (phase `scheduled` or later) on the machine `model`
/// describes (which must be built for `ir.spec`).
pub fn simulate(ir: &StepIr, model: &CostModel) -> Result<SimResult, MachineError> {
    simulate_with(ir, model, SharedRanks::AsProgram)
}

/// [`simulate`] with a DP rank in several replicas ordering their ops as `shared` says:
/// [`SharedRanks::AsProgram`] is [`simulate`]; [`SharedRanks::FirstComeFirstServed`] lets
/// them interleave as their ops become ready, the timeline a pass reads a rank's order from
/// (`StepIr::set_rank_order`) before the program runs it.
pub fn simulate_with(
    ir: &StepIr,
    model: &CostModel,
    shared: SharedRanks,
) -> Result<SimResult, MachineError> {
    let (layout, built, execution) = run(ir, model, shared)?;
    let capacity_bytes = model.memory().capacity_bytes();
    let peak_flops = ir.spec.cluster.gpu.peak_flops;
    let metrics = metrics::compute(&built, &execution, &layout, peak_flops, capacity_bytes);
    Ok(SimResult {
        metrics,
        layout,
        graph: built.graph,
        spans: execution.spans,
        packs: built.packs,
        replicas: built.replicas,
        memory: execution.memory,
        capacity_bytes,
    })
}

/// The peak memory of each pipeline device of [`simulate`]'s step (its highest device group)
/// under recomputation modes given per pipeline device: what a search over memory needs from
/// a simulation, asked about several sets of modes. The peaks are stacked from the schedules
/// without timing the step (the same bytes: a group's compute stream runs its device's
/// schedules in order, a shared rank's replicas one after the other), the packs gathered once.
/// A step whose shared ranks interleave (`StepIr::rank_order`) is probed as if they did not:
/// `assign-recompute`, which probes, runs before `interleave-ranks`.
pub struct PeakProbe<'a> {
    untimed: build::UntimedPeaks<'a>,
}

impl<'a> PeakProbe<'a> {
    /// A probe of `ir` (phase `scheduled` or later) on `model` (built for `ir.spec`).
    pub fn new(ir: &'a StepIr, model: &'a CostModel) -> Result<PeakProbe<'a>, MachineError> {
        check(ir, model)?;
        let layout = Layout::new(&ir.spec.parallel);
        Ok(PeakProbe {
            untimed: build::UntimedPeaks::new(ir, model, layout)?,
        })
    }

    /// The peaks with pipeline device `d` running `modes[d]` on every stage it holds
    /// (`modes` has one entry per pipeline device).
    pub fn device_peaks(&mut self, modes: &[Recompute]) -> Result<Vec<u64>, MachineError> {
        self.untimed.device_peaks(modes)
    }

    /// Makes the next probes stack these forward packs' own modes on these stages,
    /// `((pack, stage), mode)`, instead of the IR's (each backward pack replays under its first
    /// slice's forward pack's mode, as the simulator prices a step with
    /// `StepIr::set_pack_recompute`).
    pub fn set_pack_modes(&mut self, own: &[((PackId, u32), Recompute)]) {
        self.untimed.set_pack_modes(own);
    }

    /// [`PeakProbe::device_peaks`]' stacking op by op: per memory timeline (the groups of a
    /// replica's pipeline device, which hold the same, or one group of a shared DP rank), its
    /// ops in order, each with the bytes held while it runs.
    pub fn timelines(&mut self, modes: &[Recompute]) -> Result<Vec<Timeline>, MachineError> {
        self.untimed.timelines(modes)
    }

    /// The bytes forward pack `pack` saves on each device of its group on stage `stage` under
    /// `mode` (its activations and K/V).
    pub fn saved_bytes(&mut self, pack: PackId, stage: u32, mode: Recompute) -> u64 {
        self.untimed.saved_bytes(pack, stage, mode)
    }
}

/// A lower bound on the step time [`simulate`] reports for *any* schedule of `ir`'s packs
/// (phase `packed` or later): the most compute any device group must run, every pack's forward
/// and whole backward on each of its stages, after the pipeline fill before its first forward
/// can start, plus the DP sync tail of its stage. The tuner
/// skips scheduling and simulating a packing whose bound is above a step it already has.
/// `model` is the machine of `ir.spec`, or of `ir.spec` with less recomputation: then it
/// bounds the steps a later pass that gives the stages less recomputation makes (each stage
/// at least recomputes nothing).
pub fn compute_bound(ir: &StepIr, model: &CostModel) -> Result<f64, MachineError> {
    if ir.phase() < Phase::Packed {
        return Err(MachineError::NotPacked { phase: ir.phase() });
    }
    same_but_recompute(ir, model)?;
    build::compute_bound(ir, model, Layout::new(&ir.spec.parallel))
}

/// [`compute_bound`] of a step packed forward only (phase `assigned`, every slice in a forward
/// pack): every step that packing its backward, scheduling and refining it make (passes that
/// keep the forward packs and every slice on its sample's replica) is no faster. The forward
/// packs count as they are; each replica's backward as the least any backward packing of its
/// samples runs, on CP groups of its DP ranks
/// ([`CostModel::backward_device_seconds_lower_bound`]), spread evenly over its groups.
pub fn forward_bound(ir: &StepIr, model: &CostModel) -> Result<f64, MachineError> {
    if ir.phase() != Phase::Assigned {
        return Err(MachineError::NotForwardPacked { phase: ir.phase() });
    }
    same_but_recompute(ir, model)?;
    build::forward_bound(ir, model, Layout::new(&ir.spec.parallel))
}

/// `model` is built for `ir.spec`, but maybe for another recomputation.
fn same_but_recompute(ir: &StepIr, model: &CostModel) -> Result<(), MachineError> {
    let mut spec = model.spec().clone();
    spec.model.recompute = ir.spec.model.recompute;
    if spec != ir.spec {
        return Err(MachineError::SpecMismatch {
            cost: describe(model.spec()),
            ir: describe(&ir.spec),
        });
    }
    Ok(())
}

/// A lower bound on the step time [`simulate`] reports for `ir` (phase `scheduled` or later),
/// from one replica's schedules alone: the replica with the most packs runs its packs in
/// each device's order, each after what it depends on (sends take their time but hold no
/// stream, no other replica shares a device), then each device's DP sync tail. The tuner
/// skips simulating a step whose bound is above a step it already has. `model` as for
/// [`compute_bound`] (the machine of `ir.spec`, or with less recomputation).
pub fn schedule_bound(ir: &StepIr, model: &CostModel) -> Result<f64, MachineError> {
    if ir.phase() < Phase::Scheduled {
        return Err(MachineError::NotScheduled { phase: ir.phase() });
    }
    same_but_recompute(ir, model)?;
    build::schedule_bound(ir, model, Layout::new(&ir.spec.parallel))
}

/// What a simulation needs of `ir` and `model`: a scheduled step, and the machine of its spec.
fn check(ir: &StepIr, model: &CostModel) -> Result<(), MachineError> {
    if ir.phase() < Phase::Scheduled {
        return Err(MachineError::NotScheduled { phase: ir.phase() });
    }
    if model.spec() != &ir.spec {
        return Err(MachineError::SpecMismatch {
            cost: describe(model.spec()),
            ir: describe(&ir.spec),
        });
    }
    Ok(())
}

/// Builds and runs the task graph of `ir`.
fn run(
    ir: &StepIr,
    model: &CostModel,
    shared: SharedRanks,
) -> Result<(Layout, build::Built, engine::Execution), MachineError> {
    check(ir, model)?;
    let layout = Layout::new(&ir.spec.parallel);
    let built = build::build(ir, model, layout, shared)?;
    let execution = engine::execute(&built.graph, &built.baselines).map_err(|stuck| {
        let task = &built.graph.tasks[stuck.first.index()];
        let pack = task.pack.map(|p| built.packs[p.0 as usize].name());
        MachineError::Deadlock {
            task: format!(
                "{:?} {} on stage {}",
                task.kind,
                pack.unwrap_or_default(),
                task.stage
            ),
            unfinished: stuck.count,
            total: built.graph.tasks.len(),
        }
    })?;
    Ok((layout, built, execution))
}

/// `model 'llama-7b' on 'h100-sxm' with tp=8,pp=4,dp=8`.
fn describe(spec: &slimpack_ir::Spec) -> String {
    format!(
        "model '{}' on '{}' with {}",
        spec.model.name, spec.cluster.name, spec.parallel
    )
}
