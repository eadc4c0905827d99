//! The CPU executor: runs a scheduled step as a real training step, exactly as compiled — as its
//! lowered [`Program`] (`slimpack_ir::program`), one op list per worker.
//!
//! - One worker thread per device — a DP rank on a pipeline stage, the simulator's device group
//!   (`slimpack_machine::sim::Layout`) and the program's worker — holding that stage's weights, a
//!   gradient buffer, and its shard of the AdamW state. A plain replica's packs run on its
//!   rank's devices; a DP-Merge group's packs run on all its ranks' devices at once, each with
//!   its load-balanced share of every slice, computing attention across the group through a K/V
//!   all-gather ([`crate::cpu::cp`]).
//! - Each worker runs its ops in order (`recv`, `cp-exchange`, `fwd`/`bwd`, `send`, then
//!   `reduce-scatter`, `optimizer`, `all-gather`; the `ops` module gives their semantics), each
//!   called through the runtime's C ABI by a [`Driver`]: the interpreter, or a compiled driver's
//!   `slimpack_run_device(index)` on the worker's thread. Both end in the same worker methods.
//! - A rank in both a plain replica and a DP-Merge group runs both on its devices; how their
//!   tasks interleave is the program's order: [`DeviceOrder::program`] builds it from the
//!   lowered program (replica-major) and a chosen order, such as the simulator's.
//!
//! Measured: every pack task's wall time with its op breakdown ([`crate::cpu::profile`]), every
//! worker's real peak memory ([`MemoryMeter`](crate::cpu::MemoryMeter), when the binary installs
//! the [`CountingAllocator`](crate::cpu::CountingAllocator)), the step time from the moment all
//! workers are ready to the last one's end, and the trace of the ops each worker executed.
//!
//! [`check_reference`] compares the result with the unsliced single-worker reference step.
//!
//! The CUDA executor (`crate::cuda`) runs the same [`Plan`] and program with the same
//! [`Driver`], and shares the pieces that do not depend on where tensors live: the
//! [`ProgramCursor`] (each C ABI call checked against the worker's next op), [`neighbour`], the
//! program's check against the plan, and the assembly of the workers' outcomes.

mod check;
mod cursor;
mod driver;
mod mailbox;
mod ops;
mod order;
mod plan;
mod result;
mod sync;
mod worker;

pub use check::{check_reference, ReferenceCheck};
pub use cursor::{direction_keyword, neighbour, ProgramCursor};
pub use driver::{CompiledDriver, Driver};
pub use order::DeviceOrder;
pub use plan::{Device, Plan, PlanPack};
pub use result::{Execution, SyncTimes, TaskMemory, TaskRecord, WorkerReport};

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use slimpack_ir::program::Program;

use crate::cpu::adamw::AdamWConfig;
use crate::cpu::batch::TokenBatch;
use crate::cpu::cp::ThreadExchange;
use crate::cpu::error::{CpuError, Result};
use crate::cpu::params::Params;
use crate::cpu::stage::LayerRange;

use mailbox::mailboxes;
pub(crate) use sync::shard_range;
use sync::Collectives;
pub(crate) use worker::Outcome;
use worker::WorkerThread;

/// Runs one training step of `plan` on `batch` from the whole-model weights `params`, devices
/// interleaving replicas as `order` says (its [`DeviceOrder::program`], interpreted), and updates
/// the weights with AdamW (`adamw`).
pub fn execute(
    plan: &Plan,
    order: &DeviceOrder,
    batch: &TokenBatch,
    params: &Params,
    adamw: AdamWConfig,
) -> Result<Execution> {
    let program = order.program(plan)?;
    execute_program(plan, &program, &Driver::Interpreted, batch, params, adamw)
}

/// Runs one training step of `plan` as `program` (a lowered program of the same step, checked
/// against it), each worker's ops driven by `driver`, and updates the weights with AdamW.
pub fn execute_program(
    plan: &Plan,
    program: &Program,
    driver: &Driver,
    batch: &TokenBatch,
    params: &Params,
    adamw: AdamWConfig,
) -> Result<Execution> {
    let config = *params.config();
    if params.stage() != LayerRange::whole(&config) {
        return Err(CpuError::StageMismatch {
            expected: LayerRange::whole(&config),
            got: params.stage(),
        });
    }
    let lens: Vec<usize> = batch.sample_ids().map(|s| batch.tokens(s).len()).collect();
    if lens != plan.sample_lens {
        return Err(CpuError::Schedule {
            message: format!(
                "the batch has {} samples of other lengths than the step's {}",
                lens.len(),
                plan.sample_lens.len()
            ),
        });
    }
    plan.check_program(program)?;
    keep_freed_memory();
    let weights = params.split(&plan.stages)?;
    let devices = plan.devices();
    let abort = Arc::new(AtomicBool::new(false));
    let (inboxes, outboxes) = mailboxes(devices.len(), &abort);
    let collectives = Collectives::new(plan.dp, plan.pp(), &abort);
    let mut exchanges = merged_group_exchanges(plan, &abort);
    let epoch = Instant::now();
    // A worker the OS cannot start (a thread or memory limit): the ones started are aborted
    // (they wait with timeouts and watch `abort`) and joined, and the step fails with why.
    let mut not_started: Option<(String, std::io::Error)> = None;
    let outcomes: Vec<std::thread::Result<Result<Outcome>>> = std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(devices.len());
        for (inbox, &device) in inboxes.into_iter().zip(&devices) {
            let index = plan.device_index(device);
            let worker = WorkerThread {
                device,
                plan,
                program,
                ops: &program.workers[index].ops,
                driver,
                config,
                batch,
                weights: &weights[device.stage],
                adamw,
                inbox,
                outboxes: outboxes.clone(),
                exchanges: std::mem::take(&mut exchanges[index]),
                collectives: &collectives,
                epoch,
                abort: Arc::clone(&abort),
            };
            let name = format!("rank{}-stage{}", device.rank, device.stage);
            match std::thread::Builder::new()
                .name(name.clone())
                .spawn_scoped(scope, move || worker.run())
            {
                Ok(thread) => handles.push(thread),
                Err(error) => {
                    abort.store(true, std::sync::atomic::Ordering::Relaxed);
                    not_started = Some((name, error));
                    break;
                }
            }
        }
        handles.into_iter().map(|h| h.join()).collect()
    });
    if let Some((worker, error)) = not_started {
        return Err(CpuError::WorkerFailed {
            worker,
            message: format!(
                "the OS could not start its thread ({error}); {} workers were asked for",
                devices.len()
            ),
        });
    }
    let outcomes = collect_outcomes(&devices, outcomes, is_abort, |worker, message| {
        CpuError::WorkerFailed { worker, message }
    })?;
    assemble(plan, &config, outcomes)
}

/// Asks glibc's allocator to keep freed memory for reuse instead of returning it to the kernel,
/// as a GPU framework's caching allocator does: otherwise every large tensor is a fresh `mmap`
/// whose pages fault in one by one, and the workers, threads of one process, serialise on the
/// kernel's address-space lock doing it. Memory meters count requested bytes, so measured peaks
/// do not change; run time does, from the second step of a process on.
pub(crate) fn keep_freed_memory() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: mallopt only sets allocator parameters; any values are valid.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30);
            libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        }
    });
}

/// Per device, its ends of the exchanges of the DP-Merge groups it belongs to (one group per
/// merged replica and stage), by replica.
fn merged_group_exchanges(
    plan: &Plan,
    abort: &Arc<AtomicBool>,
) -> Vec<BTreeMap<usize, ThreadExchange>> {
    let mut per_device: Vec<BTreeMap<usize, ThreadExchange>> =
        plan.devices().iter().map(|_| BTreeMap::new()).collect();
    for (replica, ranks) in plan.replicas.iter().enumerate() {
        if ranks.len() < 2 {
            continue;
        }
        for stage in 0..plan.pp() {
            let ends = ThreadExchange::group(ranks.len(), Arc::clone(abort));
            for (&rank, end) in ranks.iter().zip(ends) {
                per_device[plan.device_index(Device { rank, stage })].insert(replica, end);
            }
        }
    }
    per_device
}

/// The workers' outcomes, or the error of the worker that failed first (not the aborts its
/// failure caused in the others, told by `is_abort`), naming the worker with `failed(worker,
/// message)`: the CPU and CUDA executors' rule.
pub(crate) fn collect_outcomes<T, E: std::fmt::Display>(
    devices: &[Device],
    outcomes: Vec<std::thread::Result<std::result::Result<T, E>>>,
    is_abort: impl Fn(&E) -> bool,
    failed: impl Fn(String, String) -> E,
) -> std::result::Result<Vec<T>, E> {
    let mut ok = Vec::with_capacity(outcomes.len());
    let mut errors = Vec::new();
    for (device, outcome) in devices.iter().zip(outcomes) {
        let worker = format!("rank {}, stage {}", device.rank, device.stage);
        match outcome {
            Ok(Ok(outcome)) => ok.push(outcome),
            Ok(Err(error)) if is_abort(&error) => errors.push((true, error)),
            Ok(Err(error)) => errors.push((false, failed(worker, error.to_string()))),
            Err(_) => errors.push((
                false,
                failed(
                    worker,
                    "panicked (a bug in slimpack; the panic message is above)".to_string(),
                ),
            )),
        }
    }
    if errors.is_empty() {
        return Ok(ok);
    }
    let root = errors.iter().position(|(abort, _)| !abort).unwrap_or(0);
    Err(errors.swap_remove(root).1)
}

/// An error a worker got because another one failed first.
fn is_abort(error: &CpuError) -> bool {
    matches!(error, CpuError::WorkerFailed { worker, .. } if worker == "peer")
        || matches!(error, CpuError::ExchangeAborted { .. })
}

/// Joins the workers' outcomes into the step's result (the CUDA executor's too).
pub(crate) fn assemble(
    plan: &Plan,
    config: &crate::cpu::config::ModelConfig,
    outcomes: Vec<Outcome>,
) -> Result<Execution> {
    let step_start = outcomes
        .iter()
        .map(|o| o.started_s)
        .fold(f64::INFINITY, f64::min);
    let mut loss = 0.0;
    let mut tasks = Vec::new();
    let mut trace = Vec::with_capacity(outcomes.len());
    let mut workers = Vec::with_capacity(outcomes.len());
    let mut shards: Vec<Vec<Vec<f32>>> = vec![Vec::new(); plan.pp()];
    let mut stage_params: Vec<Option<Params>> = vec![None; plan.pp()];
    for outcome in outcomes {
        loss += outcome.loss;
        for mut task in outcome.tasks {
            task.start_s -= step_start;
            task.end_s -= step_start;
            tasks.push(task);
        }
        trace.push(outcome.trace);
        let mut report = outcome.report;
        report.finish_s -= step_start;
        let stage = report.stage;
        shards[stage].push(outcome.grad_shard);
        match &stage_params[stage] {
            None => stage_params[stage] = Some(outcome.params),
            Some(first) if *first == outcome.params => {}
            Some(_) => panic!("bug: DP ranks of stage {stage} disagree on the updated weights"),
        }
        workers.push(report);
    }
    let step_time_s = workers.iter().map(|w| w.finish_s).fold(0.0, f64::max);
    let mut grads = Vec::with_capacity(plan.pp());
    for (stage, parts) in plan.stages.iter().zip(shards) {
        let mut stage_grads = Params::zeros(config, *stage);
        let numel = stage_grads.numel();
        for (rank, part) in parts.iter().enumerate() {
            let mut offset = 0;
            for piece in stage_grads.flat_range_mut(shard_range(numel, plan.dp, rank)) {
                let len = piece.data.len();
                piece.data.copy_from_slice(&part[offset..offset + len]);
                offset += len;
            }
        }
        grads.push(stage_grads);
    }
    let params = stage_params
        .into_iter()
        .map(|p| p.expect("every stage has a worker"))
        .collect();
    Ok(Execution {
        loss,
        grads: Params::merge(grads)?,
        params: Params::merge(params)?,
        step_time_s,
        workers,
        tasks,
        trace,
    })
}

#[cfg(test)]
mod tests;
