//! The list schedule in time (see the parent module's docs): the orders of one replica's
//! devices for any packs, model chunks or not, every op lasting its pack's time on the machine
//! model, forwards in flight bounded by a memory window.

use slimpack_ir::step::{Direction, PackId, ReplicaId};
use slimpack_ir::StepIr;
use slimpack_machine::cost::CostModel;

use super::ChunkOp;

/// When each op of one replica ran: per stage, in pack order, each forward's and backward's
/// end (NaN: not run yet), and how many of each have run (they run in pack order).
struct Timeline {
    forward_end: Vec<Vec<f64>>,
    backward_end: Vec<Vec<f64>>,
    forwards_done: Vec<usize>,
    backwards_done: Vec<usize>,
}

impl Timeline {
    fn new(stages: usize, forwards: usize, backwards: usize) -> Timeline {
        Timeline {
            forward_end: vec![vec![f64::NAN; forwards]; stages],
            backward_end: vec![vec![f64::NAN; backwards]; stages],
            forwards_done: vec![0; stages],
            backwards_done: vec![0; stages],
        }
    }

    /// The next pack of `direction` on `stage`, if any is left.
    fn next(&self, stage: usize, direction: Direction) -> Option<usize> {
        let (done, total) = match direction {
            Direction::Forward => (self.forwards_done[stage], self.forward_end[stage].len()),
            Direction::Backward => (self.backwards_done[stage], self.backward_end[stage].len()),
        };
        (done < total).then_some(done)
    }

    /// When the next op of `direction` on `stage` has its input (None: none left, or its
    /// input has not run). `need[b]`: the forwards backward pack `b` needs on the last stage
    /// (they run in order there, so the last of them ends last).
    fn ready_at(&self, stage: usize, direction: Direction, need: &[usize]) -> Option<f64> {
        let next = self.next(stage, direction)?;
        let last_stage = self.forward_end.len() - 1;
        let input = match direction {
            Direction::Forward if stage == 0 => 0.0,
            Direction::Forward => self.forward_end[stage - 1][next],
            Direction::Backward if stage == last_stage => match need[next] {
                0 => 0.0,
                forwards => self.forward_end[stage][forwards - 1],
            },
            Direction::Backward => self.backward_end[stage + 1][next],
        };
        (!input.is_nan()).then_some(input)
    }

    /// Records that `op` ran on `stage` until `end`.
    fn record(&mut self, stage: usize, op: ChunkOp, end: f64) {
        match op.direction {
            Direction::Forward => {
                self.forwards_done[stage] += 1;
                self.forward_end[stage][op.micro_batch] = end;
            }
            Direction::Backward => {
                self.backwards_done[stage] += 1;
                self.backward_end[stage][op.micro_batch] = end;
            }
        }
    }
}

/// A device's next op: when it can start, the device, the op.
type Choice = (f64, usize, ChunkOp);

/// The orders of one replica's devices (see the module docs); `need[b]` is the number of
/// forward packs backward pack `b` needs (its last one's position + 1).
/// `ChunkOp::micro_batch` indexes `forward` or `backward` by direction.
pub(super) fn list_schedule(
    ir: &StepIr,
    replica: ReplicaId,
    forward: &[PackId],
    backward: &[PackId],
    need: &[usize],
    cost: &CostModel,
    memory: f64,
) -> Vec<Vec<ChunkOp>> {
    let parallel = ir.spec.parallel;
    let (pp, vpp) = (parallel.pp as usize, parallel.vpp as usize);
    // A pack's time on one chunk (every chunk holds the same layers, to the embedding and head).
    let ranks = &ir.replica(replica).ranks;
    let seconds = |pack: PackId, direction: Direction| {
        let slices: Vec<(u64, u64)> = ir
            .pack_members(pack)
            .iter()
            .map(|&s| {
                let slice = ir.slice(s);
                (u64::from(slice.len), u64::from(slice.start))
            })
            .collect();
        cost.pack_time_on(0, &slices, direction, ranks)
            .critical_path_s()
    };
    let forward_s: Vec<f64> = forward
        .iter()
        .map(|&p| seconds(p, Direction::Forward))
        .collect();
    let backward_s: Vec<f64> = backward
        .iter()
        .map(|&p| seconds(p, Direction::Backward))
        .collect();
    let forward_tokens: Vec<u64> = forward.iter().map(|&p| ir.pack_tokens(p)).collect();
    let backward_tokens: Vec<u64> = backward.iter().map(|&p| ir.pack_tokens(p)).collect();
    let cp = ir.replica(replica).ranks.len().max(1) as u64;
    let windows: Vec<i64> = (0..pp as u32)
        .map(|device| memory_window(cost, device, &forward_tokens, cp, memory))
        .collect();
    let mut timeline = Timeline::new(pp * vpp, forward.len(), backward.len());
    let mut in_flight = vec![0i64; pp];
    let mut free_at = vec![0.0f64; pp];
    let mut orders: Vec<Vec<ChunkOp>> = vec![Vec::new(); pp];
    let total = (forward.len() + backward.len()) * pp * vpp;
    let earliest = |a: &Choice, b: &Choice| a.0.total_cmp(&b.0);
    // Each device's choice by the 1F1B rule at the time it could start, and the forward it
    // would run past its window. A device's choice reads its own stages and their neighbours'
    // (a forward's input is the stage before, a backward's the stage after), so an op changes
    // the choices of its device and the two beside it only: those are all that are chosen
    // again after it.
    let choose = |device: usize, timeline: &Timeline, free_at: &[f64], in_flight: &[i64]| {
        // The earliest-ready op of each direction; the deepest chunk wins ties, to reach the
        // backwards soonest (forwards) and to free memory soonest (backwards).
        let next_op = |direction: Direction| {
            (0..vpp)
                .rev()
                .filter_map(|chunk| {
                    let stage = chunk * pp + device;
                    let ready = timeline.ready_at(stage, direction, need)?;
                    let op = ChunkOp {
                        direction,
                        micro_batch: timeline.next(stage, direction)?,
                        chunk: chunk as u32,
                    };
                    Some((ready.max(free_at[device]), device, op))
                })
                .min_by(earliest)
        };
        let next_forward = next_op(Direction::Forward);
        let next_backward = next_op(Direction::Backward);
        // At its window a device waits for a backward, as a 1F1B stage does; below it the op
        // that can start first runs (a backward on a tie).
        if in_flight[device] >= windows[device] {
            let past_window = if next_backward.is_none() {
                next_forward
            } else {
                None
            };
            (next_backward, past_window)
        } else {
            let choice = [next_backward, next_forward]
                .into_iter()
                .flatten()
                .min_by(earliest);
            (choice, None)
        }
    };
    let mut choices: Vec<(Option<Choice>, Option<Choice>)> = (0..pp)
        .map(|device| choose(device, &timeline, &free_at, &in_flight))
        .collect();
    for _ in 0..total {
        // The earliest choice of all (the first device on a tie).
        let mut best: Option<Choice> = None;
        let mut past_window: Option<Choice> = None;
        for &(choice, past) in &choices {
            if let Some(choice) = choice {
                if best.is_none_or(|b| choice.0 < b.0) {
                    best = Some(choice);
                }
            }
            past_window = [past_window, past].into_iter().flatten().min_by(earliest);
        }
        // When every device waits at its window, the earliest ready forward runs past it (a
        // backward pack may need forwards beyond it), so the schedule always completes.
        let (start, device, op) = best
            .or(past_window)
            .expect("the pipeline's dependencies are acyclic, so some op is always ready (bug)");
        let (duration, tokens) = match op.direction {
            Direction::Forward => (
                forward_s[op.micro_batch],
                forward_tokens[op.micro_batch] as i64,
            ),
            Direction::Backward => (
                backward_s[op.micro_batch],
                -(backward_tokens[op.micro_batch] as i64),
            ),
        };
        in_flight[device] += tokens;
        free_at[device] = start + duration;
        timeline.record(op.chunk as usize * pp + device, op, start + duration);
        orders[device].push(op);
        for neighbour in [device + pp - 1, device, device + 1] {
            let neighbour = neighbour % pp;
            choices[neighbour] = choose(neighbour, &timeline, &free_at, &in_flight);
        }
    }
    orders
}

/// The forward tokens (summed over model chunks) device `device` may hold in flight: what the
/// memory model says their activations and K/V may take of the `fraction` of device memory the
/// model states and workspace leave, less one largest pack's activations, backward
/// temporaries and dK/dV accumulators as headroom; never below one largest pack. Packs run
/// on `cp` merged ranks hold `1 / cp` of their tokens per device.
fn memory_window(
    cost: &CostModel,
    device: u32,
    forward_tokens: &[u64],
    cp: u64,
    fraction: f64,
) -> i64 {
    let memory = cost.memory();
    let largest = forward_tokens.iter().copied().max().unwrap_or(1).max(1);
    let largest_per_rank = largest.div_ceil(cp);
    let held = memory.held_bytes(largest_per_rank, device);
    let headroom = held
        + memory.temporary_bytes(largest_per_rank, device, Direction::Backward)
        + memory.kv_grad_bytes(largest_per_rank, device);
    let free = memory
        .activation_budget(device, fraction)
        .saturating_sub(headroom);
    let per_token = held as f64 / largest as f64;
    let window = (free as f64 / per_token.max(f64::MIN_POSITIVE)).floor();
    window.clamp(largest as f64, i64::MAX as f64 / 2.0) as i64
}
