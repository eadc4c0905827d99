//! [`ProgramCursor`]: a worker's place in its op list, and the rules every backend's worker
//! applies to the C ABI calls its driver makes — the part of running a lowered program that
//! does not depend on where the tensors live (the CPU and CUDA executors share it).
//!
//! - Every call must be the worker's next op (a driver of another program fails the step
//!   instead of running something else), and the driver must run them all.
//! - The step ends with `reduce-scatter`, `optimizer`, `all-gather`, in this order.
//! - A pack's tensor comes from (`recv`) and goes to (`send`) the same DP rank's previous or
//!   next stage, by direction ([`neighbour`]).

use slimpack_ir::program::abi::abi_call;
use slimpack_ir::program::{Op, Worker as ProgramWorker};
use slimpack_ir::step::Direction;

use crate::abi::Call;

use super::plan::Device;

/// One worker's progress through its ops.
#[derive(Debug)]
pub struct ProgramCursor<'a> {
    ops: &'a [Op],
    device: Device,
    next: usize,
    collectives_done: usize,
}

impl<'a> ProgramCursor<'a> {
    /// A cursor before the first of `ops`, the op list of `device`.
    pub fn new(ops: &'a [Op], device: Device) -> ProgramCursor<'a> {
        ProgramCursor {
            ops,
            device,
            next: 0,
            collectives_done: 0,
        }
    }

    /// The op `call` stands for, when it is the worker's next op (the cursor then moves past
    /// it); otherwise why the call is wrong.
    pub fn advance(&mut self, call: &Call) -> Result<&'a Op, String> {
        let (dp, pp) = (self.device.rank as i64, self.device.stage as i64);
        let Some(op) = self.ops.get(self.next) else {
            return Err(format!(
                "the driver called {call:?} after the program's last op"
            ));
        };
        let expected = abi_call(dp, pp, op);
        if *call != expected {
            return Err(format!(
                "the driver called {call:?} where the program's op {} is {expected:?}",
                self.next
            ));
        }
        self.next += 1;
        Ok(op)
    }

    /// Fails unless the collective op `keyword` comes `position`-th among the three.
    pub fn collective_in_order(&mut self, position: usize, keyword: &str) -> Result<(), String> {
        if self.collectives_done != position {
            return Err(format!(
                "{keyword} out of order (the step ends with reduce-scatter, optimizer, all-gather)"
            ));
        }
        self.collectives_done += 1;
        Ok(())
    }

    /// Fails unless the driver ran every op and the step's three collectives.
    pub fn finish(&self) -> Result<(), String> {
        if self.next != self.ops.len() {
            return Err(format!(
                "the driver ran {} of the worker's {} ops",
                self.next,
                self.ops.len()
            ));
        }
        if self.collectives_done != 3 {
            return Err(
                "the program does not end with reduce-scatter, optimizer, all-gather".to_string(),
            );
        }
        Ok(())
    }
}

/// The worker a pack's tensor comes from (`incoming`) or goes to, for `device` of a pipeline of
/// `pp` stages: the same DP rank's previous or next stage, by direction; `None` at the ends.
pub fn neighbour(
    device: Device,
    pp: usize,
    direction: Direction,
    incoming: bool,
) -> Option<ProgramWorker> {
    let Device { rank, stage } = device;
    let forward_side = matches!(direction, Direction::Forward) != incoming;
    let stage = match forward_side {
        true => Some(stage + 1).filter(|&s| s < pp),
        false => stage.checked_sub(1),
    }?;
    Some(ProgramWorker {
        dp: rank as u32,
        pp: stage as u32,
    })
}

/// A direction's op keyword in errors: `fwd` or `bwd`.
pub fn direction_keyword(direction: Direction) -> &'static str {
    match direction {
        Direction::Forward => "fwd",
        Direction::Backward => "bwd",
    }
}
