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

pub use engine::Span;
pub use layout::{GroupId, Layout};
pub use memory::{GroupMemory, MemoryEffect, MemoryPoint};
pub use metrics::{Losses, Metrics};
pub use result::{PackInfo, SimResult};
pub use task::{ComputeParts, PackIndex, Stream, Task, TaskGraph, TaskId, TaskKind};

use crate::cost::CostModel;
use crate::error::MachineError;
use slimpack_ir::step::{Phase, StepIr};

/// Simulates one training step of `ir` (phase `scheduled` or later) on the machine `model`
/// describes (which must be built for `ir.spec`).
pub fn simulate(ir: &StepIr, model: &CostModel) -> Result<SimResult, MachineError> {
    let (layout, built, execution) = run(ir, model)?;
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

/// The memory timeline of each device group of [`simulate`]'s step, without its metrics
/// (what a search over memory needs from a simulation), with the layout that places the
/// groups.
pub fn memory_timelines(
    ir: &StepIr,
    model: &CostModel,
) -> Result<(Layout, Vec<GroupMemory>), MachineError> {
    let (layout, _, execution) = run(ir, model)?;
    Ok((layout, execution.memory))
}

/// Builds and runs the task graph of `ir`.
fn run(
    ir: &StepIr,
    model: &CostModel,
) -> Result<(Layout, build::Built, engine::Execution), MachineError> {
    if ir.phase() < Phase::Scheduled {
        return Err(MachineError::NotScheduled { phase: ir.phase() });
    }
    if model.spec() != &ir.spec {
        return Err(MachineError::SpecMismatch {
            cost: describe(model.spec()),
            ir: describe(&ir.spec),
        });
    }
    let layout = Layout::new(&ir.spec.parallel);
    let built = build::build(ir, model, layout)?;
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
