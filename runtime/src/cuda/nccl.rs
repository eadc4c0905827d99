//! The links between a step's GPUs, through NCCL (one process, one thread per GPU, the
//! communicators made at once with `ncclCommInitAll`):
//! - pipeline send/receive: point-to-point on two communicators over every worker, one for
//!   forward messages (activations) and one for backward messages (gradients), each on its own
//!   stream per worker, so that a forward send and a backward send between the same two stages
//!   (1F1B sends both ways at once) never wait for each other. NCCL matches the messages between
//!   two ranks in order, so [`check_fifo`] first checks that every worker receives a pair's
//!   messages in the order the sender sends them;
//! - per stage, its DP ranks (on their compute streams): the gradient sum and the broadcast of
//!   each rank's updated shard;
//! - per DP rank, when the embedding is tied and split across stages: its first and last stage,
//!   for the tied copies' sum;
//! - per DP-Merge group and stage, its members (on their compute streams, in the replica's DP
//!   rank order): the K/V all-gathers of context parallelism ([`CpExchange`]; the rows they
//!   carry are `cp_rows`'s).
//!
//! The host orders the streams: a send waits for the compute stream (the tensor is complete),
//! a receive completes before the compute stream reads the buffer, and a sent buffer is freed
//! only once its send has completed. Every wait on NCCL work polls the step's abort flag: a
//! peer that failed never sends what the wait is for, so the waiter gives up instead of hanging,
//! and dropping its links aborts the communicators.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaEvent, CudaStream};
use cudarc::nccl::{Comm, ReduceOp};

use slimpack_ir::program::{Op, Program};
use slimpack_ir::step::Direction;

use crate::cpu::exec::{Device, Plan};

use super::device::Gpu;
use super::error::{CudaError, Result};
use super::memory::DeviceVec;

/// A communicator handed to the worker thread that uses it (and only that thread).
struct Link(Comm);

// SAFETY: an NCCL communicator may be used from any thread as long as one thread at a time
// uses it; each `Link` is moved to its worker's thread and used there only.
unsafe impl Send for Link {}

/// One worker's links.
#[derive(Default)]
pub(crate) struct Links {
    forward: Option<Link>,
    backward: Option<Link>,
    stage: Option<Link>,
    tied: Option<Link>,
    /// Per DP-Merge group (by replica) this worker belongs to, the group's communicator on
    /// this stage: its ranks are the group's members in the replica's DP rank order.
    cp: BTreeMap<usize, Link>,
    /// Sent buffers and the events that say their sends completed.
    in_flight: Vec<(CudaEvent, DeviceVec)>,
    /// Raised when any worker of the step failed.
    abort: Arc<AtomicBool>,
}

/// How long a wait on NCCL work sleeps between polls.
const POLL: Duration = Duration::from_micros(20);

/// Every worker's links (by device index), given each worker's compute stream and two
/// message streams (forward, backward).
pub(crate) fn links(
    plan: &Plan,
    tied_split: bool,
    compute: &[Arc<CudaStream>],
    messages: &[(Arc<CudaStream>, Arc<CudaStream>)],
    abort: &Arc<AtomicBool>,
) -> Result<Vec<Links>> {
    let devices = plan.devices();
    let mut links: Vec<Links> = devices
        .iter()
        .map(|_| Links {
            abort: Arc::clone(abort),
            ..Links::default()
        })
        .collect();
    if devices.len() < 2 {
        return Ok(links);
    }
    if plan.pp() > 1 {
        let forward = Comm::from_devices(messages.iter().map(|m| Arc::clone(&m.0)).collect())?;
        let backward = Comm::from_devices(messages.iter().map(|m| Arc::clone(&m.1)).collect())?;
        for ((link, f), b) in links.iter_mut().zip(forward).zip(backward) {
            link.forward = Some(Link(f));
            link.backward = Some(Link(b));
        }
    }
    let group = |members: &[usize]| -> Result<Vec<Comm>> {
        Ok(Comm::from_devices(
            members.iter().map(|&i| Arc::clone(&compute[i])).collect(),
        )?)
    };
    if plan.dp > 1 {
        for stage in 0..plan.pp() {
            let members: Vec<usize> = (0..plan.dp)
                .map(|rank| plan.device_index(Device { rank, stage }))
                .collect();
            for (&member, comm) in members.iter().zip(group(&members)?) {
                links[member].stage = Some(Link(comm));
            }
        }
    }
    for (replica, ranks) in plan.replicas.iter().enumerate() {
        if ranks.len() < 2 {
            continue;
        }
        for stage in 0..plan.pp() {
            let members: Vec<usize> = ranks
                .iter()
                .map(|&rank| plan.device_index(Device { rank, stage }))
                .collect();
            for (&member, comm) in members.iter().zip(group(&members)?) {
                links[member].cp.insert(replica, Link(comm));
            }
        }
    }
    if tied_split && plan.pp() > 1 {
        for rank in 0..plan.dp {
            let members = [
                plan.device_index(Device { rank, stage: 0 }),
                plan.device_index(Device {
                    rank,
                    stage: plan.pp() - 1,
                }),
            ];
            for (&member, comm) in members.iter().zip(group(&members)?) {
                links[member].tied = Some(Link(comm));
            }
        }
    }
    Ok(links)
}

/// Fails unless, for every pair of workers and direction, the receiver's `recv` ops come in
/// the order of the sender's `send` ops (NCCL's point-to-point messages match in order).
pub(crate) fn check_fifo(plan: &Plan, program: &Program) -> Result<()> {
    type Key = (usize, usize, bool);
    let mut sent: BTreeMap<Key, Vec<u32>> = BTreeMap::new();
    let mut received: BTreeMap<Key, Vec<u32>> = BTreeMap::new();
    let index = |dp: u32, pp: u32| {
        plan.device_index(Device {
            rank: dp as usize,
            stage: pp as usize,
        })
    };
    for worker in &program.workers {
        let me = index(worker.worker.dp, worker.worker.pp);
        for op in &worker.ops {
            match *op {
                Op::Send {
                    pack,
                    direction,
                    to,
                    ..
                } => sent
                    .entry((me, index(to.dp, to.pp), direction == Direction::Forward))
                    .or_default()
                    .push(pack),
                Op::Recv {
                    pack,
                    direction,
                    from,
                    ..
                } => received
                    .entry((index(from.dp, from.pp), me, direction == Direction::Forward))
                    .or_default()
                    .push(pack),
                _ => {}
            }
        }
    }
    match sent.iter().find(|(key, packs)| received.get(key) != Some(packs)) {
        None => Ok(()),
        Some(((from, to, _), _)) => Err(CudaError::Unsupported {
            what: format!(
                "a program whose worker {to} receives worker {from}'s tensors in another order than they are sent (NCCL matches point-to-point messages in order)"
            ),
        }),
    }
}

fn missing(what: &str) -> CudaError {
    CudaError::Unsupported {
        what: format!("{what} on a single GPU (a step with one worker has no peers)"),
    }
}

impl Links {
    fn message_link(&self, direction: Direction) -> Result<&Comm> {
        let link = match direction {
            Direction::Forward => &self.forward,
            Direction::Backward => &self.backward,
        };
        link.as_ref()
            .map(|l| &l.0)
            .ok_or_else(|| missing("pipeline messages"))
    }

    /// Sends `tensor` (complete once the compute stream is) to worker `to`; keeps it until
    /// the send completed.
    pub fn send(
        &mut self,
        gpu: &Gpu,
        direction: Direction,
        to: usize,
        tensor: DeviceVec,
    ) -> Result<()> {
        self.reap()?;
        gpu.synchronize()?;
        let comm = self.message_link(direction)?;
        comm.send(&tensor.view(), to as i32)?;
        let event = comm.stream().record_event(None)?;
        self.in_flight.push((event, tensor));
        Ok(())
    }

    /// Receives `len` floats from worker `from` (returns once they arrived).
    pub fn recv(
        &mut self,
        gpu: &Gpu,
        direction: Direction,
        from: usize,
        len: usize,
    ) -> Result<DeviceVec> {
        self.reap()?;
        let mut tensor = gpu.zeros(len)?;
        gpu.synchronize()?;
        let comm = self.message_link(direction)?;
        comm.recv(&mut tensor.view_mut(0..len), from as i32)?;
        self.wait(&comm.stream())?;
        Ok(tensor)
    }

    /// Frees the sent buffers whose sends completed.
    fn reap(&mut self) -> Result<()> {
        let mut pending = Vec::with_capacity(self.in_flight.len());
        for (event, tensor) in self.in_flight.drain(..) {
            if !event.try_is_complete()? {
                pending.push((event, tensor));
            }
        }
        self.in_flight = pending;
        Ok(())
    }

    /// Waits for every send, then frees the buffers.
    pub fn flush(&mut self) -> Result<()> {
        for (event, _) in &self.in_flight {
            self.wait_for(event)?;
        }
        self.in_flight.clear();
        Ok(())
    }

    /// Waits for the work enqueued on `stream` so far (NCCL's included), unless a worker fails.
    pub fn wait(&self, stream: &CudaStream) -> Result<()> {
        self.wait_for(&stream.record_event(None)?)
    }

    fn wait_for(&self, event: &CudaEvent) -> Result<()> {
        while !event.try_is_complete()? {
            if self.abort.load(Ordering::Relaxed) {
                return Err(CudaError::aborted());
            }
            std::thread::sleep(POLL);
        }
        Ok(())
    }

    /// Sums `range` of `buffer` over the stage's DP ranks (in place).
    pub fn sum_over_stage(
        &self,
        buffer: &mut DeviceVec,
        range: std::ops::Range<usize>,
    ) -> Result<()> {
        if let Some(Link(comm)) = &self.stage {
            comm.all_reduce_in_place(&mut buffer.view_mut(range), &ReduceOp::Sum)?;
        }
        Ok(())
    }

    /// Sums `range` of `buffer` between the pipeline's first and last stage of this DP rank.
    /// The K/V exchange of the DP-Merge group running `replica` (its communicator on this
    /// worker's stage).
    pub fn cp_exchange(&self, replica: usize) -> Result<CpExchange<'_>> {
        self.cp
            .get(&replica)
            .map(|Link(comm)| CpExchange { comm, links: self })
            .ok_or_else(|| missing("a DP-Merge group's K/V exchange"))
    }

    pub fn sum_tied(&self, buffer: &mut DeviceVec, range: std::ops::Range<usize>) -> Result<()> {
        if let Some(Link(comm)) = &self.tied {
            comm.all_reduce_in_place(&mut buffer.view_mut(range), &ReduceOp::Sum)?;
        }
        Ok(())
    }

    /// Copies `range` of `buffer` from DP rank `root` of the stage to the others.
    pub fn broadcast(
        &self,
        buffer: &mut DeviceVec,
        range: std::ops::Range<usize>,
        root: usize,
    ) -> Result<()> {
        if let Some(Link(comm)) = &self.stage {
            if !range.is_empty() {
                comm.broadcast_in_place(&mut buffer.view_mut(range), root as i32)?;
            }
        }
        Ok(())
    }
}

/// One member's end of a DP-Merge group's K/V exchange: NCCL all-gathers on the compute stream
/// (stream-ordered with the attention kernels that use their results). The host waits for each
/// gather, polling the step's abort flag, so that a member whose peer failed gives up instead
/// of blocking in a later stream synchronisation.
#[derive(Clone, Copy)]
pub(crate) struct CpExchange<'l> {
    comm: &'l Comm,
    links: &'l Links,
}

impl CpExchange<'_> {
    /// Every member's `part` values of `mine` (equal parts), in rank order: `[size · part]`.
    pub fn all_gather(&self, gpu: &Gpu, mine: &DeviceVec, part: usize) -> Result<DeviceVec> {
        let size = self.comm.world_size();
        let mut gathered = gpu.zeros(size * part)?;
        if part > 0 {
            self.comm
                .all_gather(&mine.view(), &mut gathered.view_mut(0..size * part))?;
            self.links.wait(&self.comm.stream())?;
        }
        Ok(gathered)
    }
}
