//! Checking a [`Program`]: every reference in range, every send received exactly once, every
//! collective met by all its members, and the whole program able to run to the end.
//!
//! The proof is an execution of the op lists as a token game: sends are buffered, a receive waits
//! for its matching send, a collective (`cp-exchange` among a DP-Merge group, `reduce-scatter`
//! and `all-gather` among a stage's DP ranks) waits until every member is at it. If the game stops
//! before every worker has run its last op, the program deadlocks, and the stuck ops are named.

use std::fmt;

use rustc_hash::FxHashMap;

use super::{Op, Program, Worker};
use crate::step::Direction;

/// Why a program is not executable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramError {
    pub message: String,
}

impl fmt::Display for ProgramError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ProgramError {}

fn error(message: String) -> ProgramError {
    ProgramError { message }
}

fn worker_name(w: Worker) -> String {
    format!("worker dp={} pp={}", w.dp, w.pp)
}

/// Checks that `program` is well-formed and deadlock-free.
pub fn check(program: &Program) -> Result<(), ProgramError> {
    let (pp, dp) = (program.pp, program.dp);
    if program.workers.len() != (pp * dp) as usize {
        return Err(error(format!(
            "{} workers for pp={pp} x dp={dp}",
            program.workers.len()
        )));
    }
    let in_range = |w: Worker| w.dp < dp && w.pp < pp;
    for (index, wp) in program.workers.iter().enumerate() {
        let expected = Worker {
            dp: index as u32 % dp,
            pp: index as u32 / dp,
        };
        if wp.worker != expected {
            return Err(error(format!(
                "worker {index} is {}, expected {}",
                worker_name(wp.worker),
                worker_name(expected)
            )));
        }
        for op in &wp.ops {
            if let Some(pack) = op.pack() {
                let Some(layout) = program.packs.get(pack as usize) else {
                    return Err(error(format!(
                        "{}: {} names pack {pack}, but there are {}",
                        worker_name(wp.worker),
                        op.keyword(),
                        program.packs.len()
                    )));
                };
                let direction = match op {
                    Op::Forward { .. } => Some(Direction::Forward),
                    Op::Backward { .. } => Some(Direction::Backward),
                    Op::CpExchange { direction, .. }
                    | Op::Send { direction, .. }
                    | Op::Recv { direction, .. } => Some(*direction),
                    _ => None,
                };
                if direction != Some(layout.direction) || !layout.dp_ranks.contains(&wp.worker.dp) {
                    return Err(error(format!(
                        "{}: {} {} does not fit the pack ({} on dp ranks {:?})",
                        worker_name(wp.worker),
                        op.keyword(),
                        layout.name,
                        layout.direction.keyword(),
                        layout.dp_ranks
                    )));
                }
            }
            if op.chunk() >= program.vpp.max(1) {
                return Err(error(format!(
                    "{}: {} names model chunk {}, but a device holds {}",
                    worker_name(wp.worker),
                    op.keyword(),
                    op.chunk(),
                    program.vpp.max(1)
                )));
            }
            match op {
                Op::Send { to: peer, .. } | Op::Recv { from: peer, .. } if !in_range(*peer) => {
                    return Err(error(format!(
                        "{}: {} names {}, outside pp={pp} x dp={dp}",
                        worker_name(wp.worker),
                        op.keyword(),
                        worker_name(*peer)
                    )));
                }
                Op::CpExchange { group, .. } if !group.contains(&wp.worker.dp) => {
                    return Err(error(format!(
                        "{}: cp-exchange in group {group:?} it is not part of",
                        worker_name(wp.worker)
                    )));
                }
                _ => {}
            }
        }
    }
    Game::new(program).run()
}

/// The token game of [`check`].
struct Game<'a> {
    program: &'a Program,
    /// Next op of each worker.
    next: Vec<usize>,
    /// Sends not yet received: (from, to, pack, direction) -> count.
    mailbox: FxHashMap<(Worker, Worker, u32, Direction), u32>,
    /// Per pipeline stage: the DP collective its ranks are meeting at and how many of them,
    /// from rank 0 up, are known to be at it. A rank at a collective stays there until it
    /// runs, so the count only grows until then: checking a meeting is linear in dp, not the
    /// quadratic of looking at every rank each time one more arrives.
    meeting: Vec<Option<(&'a Op, u32)>>,
    /// Workers to run again: each one, then whoever a send or a collective may have unblocked.
    ready: Vec<usize>,
}

impl<'a> Game<'a> {
    fn new(program: &'a Program) -> Game<'a> {
        Game {
            program,
            next: vec![0; program.workers.len()],
            mailbox: FxHashMap::default(),
            meeting: vec![None; program.pp as usize],
            ready: Vec::new(),
        }
    }

    fn index(&self, w: Worker) -> usize {
        (w.pp * self.program.dp + w.dp) as usize
    }

    fn current(&self, index: usize) -> Option<&'a Op> {
        self.program.workers[index].ops.get(self.next[index])
    }

    fn run(mut self) -> Result<(), ProgramError> {
        // A worklist, not sweeps over every worker until none moves (one sweep per wave of the
        // pipeline: quadratic in packs x workers). A worker runs until it blocks; what can
        // unblock it (a send to it, the last member arriving at its collective) puts it back.
        // The game is monotone, so the order of the list does not change where it ends.
        self.ready = (0..self.program.workers.len()).rev().collect();
        while let Some(index) = self.ready.pop() {
            while self.step(index) {}
        }
        let stuck: Vec<String> = (0..self.program.workers.len())
            .filter_map(|index| {
                let op = self.current(index)?;
                let wp = &self.program.workers[index];
                let pack = op
                    .pack()
                    .map(|p| format!(" {}", self.program.packs[p as usize].name))
                    .unwrap_or_default();
                Some(format!(
                    "{} at {}{pack}",
                    worker_name(wp.worker),
                    op.keyword()
                ))
            })
            .collect();
        if !stuck.is_empty() {
            let shown = stuck.iter().take(4).cloned().collect::<Vec<_>>().join("; ");
            let more = stuck.len().saturating_sub(4);
            let more = if more > 0 {
                format!(" (and {more} more)")
            } else {
                String::new()
            };
            return Err(error(format!("the program deadlocks: {shown}{more}")));
        }
        if let Some(((from, to, pack, _), _)) = self.mailbox.iter().find(|(_, &n)| n > 0) {
            return Err(error(format!(
                "{} sends {} to {}, which never receives it",
                worker_name(*from),
                self.program.packs[*pack as usize].name,
                worker_name(*to)
            )));
        }
        Ok(())
    }

    /// Runs the current op of worker `index` if it can; true if something advanced.
    fn step(&mut self, index: usize) -> bool {
        let Some(op) = self.current(index) else {
            return false;
        };
        let me = self.program.workers[index].worker;
        match op {
            Op::Forward { .. } | Op::Backward { .. } | Op::Optimizer => {}
            Op::Send {
                pack,
                direction,
                to,
                ..
            } => {
                *self
                    .mailbox
                    .entry((me, *to, *pack, *direction))
                    .or_insert(0) += 1;
                // The receiver may be waiting for it.
                self.ready.push(self.index(*to));
            }
            Op::Recv {
                pack,
                direction,
                from,
                ..
            } => {
                let key = (*from, me, *pack, *direction);
                match self.mailbox.get_mut(&key) {
                    Some(n) if *n > 0 => *n -= 1,
                    _ => return false,
                }
            }
            Op::CpExchange { group, .. } => {
                // `Game::index` of each member, on this worker's stage.
                let base = me.pp * self.program.dp;
                return self.collective(op, group.iter().map(move |&rank| (base + rank) as usize));
            }
            Op::ReduceScatter | Op::AllGather => return self.dp_collective(op, me.pp),
        }
        self.next[index] += 1;
        true
    }

    /// [`Game::collective`] of every DP rank of pipeline stage `pp`, resuming the count of
    /// ranks known to be at `op` (see `meeting`).
    fn dp_collective(&mut self, op: &'a Op, pp: u32) -> bool {
        let dp = self.program.dp;
        let mut arrived = match self.meeting[pp as usize] {
            Some((meeting, arrived)) if meeting == op => arrived,
            _ => 0,
        };
        while arrived < dp && self.current(self.index(Worker { dp: arrived, pp })) == Some(op) {
            arrived += 1;
        }
        if arrived < dp {
            self.meeting[pp as usize] = Some((op, arrived));
            return false;
        }
        self.meeting[pp as usize] = None;
        for rank in 0..dp {
            let member = self.index(Worker { dp: rank, pp });
            self.next[member] += 1;
            self.ready.push(member);
        }
        true
    }

    /// Advances every member of a collective at once when all of them are at `op` (and puts
    /// them back on the worklist).
    fn collective(&mut self, op: &Op, members: impl Iterator<Item = usize> + Clone) -> bool {
        if !members.clone().all(|m| self.current(m) == Some(op)) {
            return false;
        }
        for m in members {
            self.next[m] += 1;
            self.ready.push(m);
        }
        true
    }
}
