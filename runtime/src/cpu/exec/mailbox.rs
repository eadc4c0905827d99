//! Point-to-point messages between device workers: a stage's output hidden states to the next
//! stage, and their gradients back.
//!
//! Every device has one inbox. A message is tagged with the pack and direction it belongs to;
//! a worker waiting for a tag keeps the other messages it receives meanwhile (the previous
//! stage may run a different interleaving of replicas, so messages can arrive out of the
//! receiver's order). The tensors travel by move, not copy: the sender's buffer is the
//! receiver's input. On the memory meters it leaves the sender when sent and counts on the
//! receiver from the moment a task takes it (see `counting_alloc`): a worker's peak is what it
//! holds, not what its neighbour has not consumed yet.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;

use slimpack_ir::step::Direction;

use crate::cpu::counting_alloc;
use crate::cpu::error::{CpuError, Result};
use crate::cpu::rendezvous::ABORT_POLL;

/// What a message carries: per slice of the pack, `[tokens held, hidden]`.
pub type Tensors = Vec<Vec<f32>>;

/// The pack and direction a message belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tag {
    pub pack: usize,
    pub direction: Direction,
}

/// One device's inbox.
#[derive(Debug)]
pub struct Inbox {
    receiver: Receiver<(Tag, Tensors)>,
    early: HashMap<Tag, Tensors>,
    abort: Arc<AtomicBool>,
}

/// Where to send to each device.
#[derive(Debug, Clone)]
pub struct Outboxes {
    senders: Vec<Sender<(Tag, Tensors)>>,
}

/// One inbox per device (by index), and the senders to all of them.
pub fn mailboxes(devices: usize, abort: &Arc<AtomicBool>) -> (Vec<Inbox>, Outboxes) {
    let mut inboxes = Vec::with_capacity(devices);
    let mut senders = Vec::with_capacity(devices);
    for _ in 0..devices {
        let (sender, receiver) = channel();
        senders.push(sender);
        inboxes.push(Inbox {
            receiver,
            early: HashMap::new(),
            abort: Arc::clone(abort),
        });
    }
    (inboxes, Outboxes { senders })
}

impl Outboxes {
    /// Sends `tensors` to device `to`.
    pub fn send(&self, to: usize, tag: Tag, mut tensors: Tensors) -> Result<()> {
        tensors.iter_mut().for_each(counting_alloc::hand_off);
        counting_alloc::hand_off(&mut tensors);
        self.senders[to].send((tag, tensors)).map_err(|_| aborted())
    }
}

impl Inbox {
    /// Waits for the message tagged `tag`; fails when the step is aborted.
    /// The tensors count on the calling thread's meter from now on.
    pub fn receive(&mut self, tag: Tag) -> Result<Tensors> {
        let mut tensors = self.wait(tag)?;
        counting_alloc::adopt(&mut tensors);
        tensors.iter_mut().for_each(counting_alloc::adopt);
        Ok(tensors)
    }

    fn wait(&mut self, tag: Tag) -> Result<Tensors> {
        if let Some(tensors) = self.early.remove(&tag) {
            return Ok(tensors);
        }
        loop {
            match self.receiver.recv_timeout(ABORT_POLL) {
                Ok((got, tensors)) if got == tag => return Ok(tensors),
                Ok((got, tensors)) => {
                    self.early.insert(got, tensors);
                }
                Err(RecvTimeoutError::Timeout) if !self.abort.load(Ordering::Relaxed) => {}
                Err(_) => return Err(aborted()),
            }
        }
    }
}

fn aborted() -> CpuError {
    CpuError::WorkerFailed {
        worker: "peer".to_string(),
        message: "another worker stopped; the step was abandoned".to_string(),
    }
}
