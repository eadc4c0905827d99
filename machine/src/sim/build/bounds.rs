//! What a search needs of the simulator without running it: each pipeline device's peak
//! memory stacked from the schedules alone ([`UntimedPeaks`]), and two lower bounds on the
//! step ([`compute_bound`] for any schedule of a packing, [`schedule_bound`] for a schedule).
//! They reuse the builder's gathering of packs and its timing of each task, so that they
//! price the step exactly as the simulator does.

use slimpack_ir::spec::Recompute;
use slimpack_ir::step::{Direction, Part, StepIr};

use super::super::layout::{GroupId, Layout};
use super::super::memory::{GroupMemory, MemoryEffect};
use super::super::task::PackIndex;
use super::{check_stages, Builder, Scheduled, NONE};
use crate::cost::CostModel;
use crate::error::MachineError;

/// The peak memory of each pipeline device of a step (its highest device group) under
/// recomputation modes given per pipeline device, stacked from the schedules without timing
/// the step (see [`Builder::untimed_device_peaks`]): the step's packs are gathered once, for
/// every set of modes asked about.
pub(in crate::sim) struct UntimedPeaks<'a> {
    builder: Builder<'a>,
    /// The machine under each mode asked about so far.
    models: Vec<(Recompute, CostModel)>,
    /// Per mode (the model's first, then `models`' order), the memory effects computed so
    /// far by (pack, stage ends, part): a pack's effect depends on its stage through those
    /// and the stage's mode only, so stages and probes that share them share it.
    effects: Vec<Vec<Option<MemoryEffect>>>,
}

impl<'a> UntimedPeaks<'a> {
    pub fn new(
        ir: &'a StepIr,
        cost: &'a CostModel,
        layout: Layout,
    ) -> Result<UntimedPeaks<'a>, MachineError> {
        check_stages(ir, layout)?;
        let mut builder = Builder::new(ir, cost, layout)?;
        builder.collect_packs(false, None);
        Ok(UntimedPeaks {
            builder,
            models: Vec::new(),
            effects: Vec::new(),
        })
    }

    /// The peaks with pipeline device `d` running `modes[d]` on every stage it holds.
    pub fn device_peaks(&mut self, modes: &[Recompute]) -> Result<Vec<u64>, MachineError> {
        let builder = &mut self.builder;
        let model_mode = builder.ir.spec.model.recompute;
        let pp = builder.layout.pp;
        let mut stage_modes = Vec::with_capacity(builder.stages as usize);
        builder.stage_costs = (0..builder.stages)
            .map(|stage| {
                let mode = modes[(stage % pp) as usize];
                if mode == model_mode {
                    stage_modes.push(0);
                    return None;
                }
                let index = match self.models.iter().position(|(m, _)| *m == mode) {
                    Some(index) => index,
                    None => {
                        self.models.push((mode, builder.cost.with_recompute(mode)));
                        self.models.len() - 1
                    }
                };
                stage_modes.push(index + 1);
                Some(self.models[index].1.clone())
            })
            .collect();
        let slots = builder.packs.len() * 4 * 3;
        self.effects.resize_with(self.models.len() + 1, Vec::new);
        for effects in &mut self.effects {
            effects.resize(slots, None);
        }
        builder.untimed_device_peaks(&stage_modes, &mut self.effects)
    }
}

/// A lower bound on the step time of every schedule of `ir`'s packs (phase `packed` or later),
/// see [`super::compute_bound`].
pub(in crate::sim) fn compute_bound(
    ir: &StepIr,
    cost: &CostModel,
    layout: Layout,
) -> Result<f64, MachineError> {
    check_stages(ir, layout)?;
    let mut builder = Builder::new(ir, cost, layout)?;
    builder.collect_packs(true, None);
    Ok(builder.compute_bound())
}

/// A lower bound on the step time of `ir`'s schedules from one replica's alone, see
/// [`super::schedule_bound`].
pub(in crate::sim) fn schedule_bound(
    ir: &StepIr,
    cost: &CostModel,
    layout: Layout,
) -> Result<f64, MachineError> {
    check_stages(ir, layout)?;
    // The replica with the most packs, the likeliest to finish last.
    let replica = ir
        .replicas()
        .iter()
        .enumerate()
        .max_by_key(|&(index, &replica)| {
            let packs = ir.packs_on(replica, Direction::Forward).len()
                + ir.packs_on(replica, Direction::Backward).len();
            (packs, std::cmp::Reverse(index))
        })
        .map(|(index, _)| index);
    let Some(replica) = replica else {
        return Ok(0.0);
    };
    let mut builder = Builder::new(ir, cost, layout)?;
    builder.collect_packs(true, Some(replica));
    builder.replica_bound()
}

impl Builder<'_> {
    /// The peak memory of each pipeline device's groups, stacked from its schedule without
    /// timing the step: exact, since a group's compute stream runs its device's schedule of
    /// each of its replicas in order, the replicas one after the other in the IR's order
    /// (see [`Builder::compute_tasks`]), and only pack compute tasks change memory. A replica
    /// whose ranks are in no other replica is stacked once for all its groups (they hold the
    /// same); a shared rank's group is stacked on its own, across its replicas.
    /// `stage_modes[stage]` indexes `effects` (see [`UntimedPeaks`]), the memo of memory
    /// effects by mode and (pack, stage ends, part).
    fn untimed_device_peaks(
        &mut self,
        stage_modes: &[usize],
        effects: &mut [Vec<Option<MemoryEffect>>],
    ) -> Result<Vec<u64>, MachineError> {
        let memory = self.cost.memory();
        let baseline = |device: u32| memory.model_state_bytes(device) + memory.workspace_bytes();
        let mut peaks: Vec<u64> = (0..self.layout.pp).map(baseline).collect();
        let sharing = self.sharing();
        let mut shared: Vec<Option<GroupMemory>> = match sharing.contains(&true) {
            true => vec![None; self.layout.groups()],
            false => Vec::new(),
        };
        let mut timeline = GroupMemory::new(0);
        self.walk_schedules(|builder, entry| {
            let slot = builder.share_slot(entry.pack, entry.stage, entry.part);
            let memo = &mut effects[stage_modes[entry.stage as usize]][slot];
            let effect = *memo
                .get_or_insert_with(|| builder.memory_effect(entry.pack, entry.stage, entry.part));
            let peak = &mut peaks[entry.device as usize];
            let replica = builder.packs[entry.pack.0 as usize].replica as usize;
            if !sharing[replica] {
                if entry.first {
                    timeline = GroupMemory::new(baseline(entry.device));
                }
                timeline.stack(&effect);
                *peak = (*peak).max(timeline.peak_bytes);
                return;
            }
            for &rank in &builder.replicas[replica] {
                let group = builder.layout.group(rank, entry.device).index();
                let timeline =
                    shared[group].get_or_insert_with(|| GroupMemory::new(baseline(entry.device)));
                timeline.stack(&effect);
                *peak = (*peak).max(timeline.peak_bytes);
            }
        })?;
        Ok(peaks)
    }

    /// The collected replica's step without contention: its pack compute tasks in each
    /// device's schedule order, each after what it depends on (the same pack's forward on the
    /// stage before, its backward on the stage after, through a send that takes its time but
    /// holds no stream; on the last stage, a backward after its slices' forwards), as early as
    /// those allow; then each device's DP sync tail. Every constraint here is one the
    /// simulator also enforces, with its own on top (streams, other replicas), so its step is
    /// no shorter. `Err` where a schedule is malformed; 0 where the schedules deadlock (the
    /// simulator reports that).
    fn replica_bound(&mut self) -> Result<f64, MachineError> {
        let stages = self.stages as usize;
        let pp = self.layout.pp as usize;
        let mut orders: Vec<Vec<Scheduled>> = vec![Vec::new(); pp];
        self.walk_schedules(|_, entry| orders[entry.device as usize].push(entry))?;
        let unset = f64::NAN;
        // End times of (pack, stage): whole op or input gradient (a weight gradient only
        // holds its device, which `free` keeps).
        let mut ends = vec![unset; self.packs.len() * stages];
        let mut next = vec![0usize; pp];
        let mut free = vec![0.0f64; pp];
        let mut remaining: usize = orders.iter().map(Vec::len).sum();
        while remaining > 0 {
            let mut progressed = false;
            for device in 0..pp {
                while let Some(&entry) = orders[device].get(next[device]) {
                    let Some(ready) = self.ready_at(entry, &ends) else {
                        break;
                    };
                    let time = self.part_time(entry.pack, entry.stage, entry.part);
                    let end = ready.max(free[device]) + time.critical_path_s();
                    if entry.part != Part::WeightGrad {
                        ends[entry.pack.0 as usize * stages + entry.stage as usize] = end;
                    }
                    free[device] = end;
                    next[device] += 1;
                    remaining -= 1;
                    progressed = true;
                }
            }
            if !progressed {
                return Ok(0.0);
            }
        }
        Ok((0..self.layout.pp)
            .filter(|&device| !orders[device as usize].is_empty())
            .map(|device| free[device as usize] + self.sync_tail_s(device))
            .fold(0.0, f64::max))
    }

    /// When `entry`'s dependencies on other stages have ended (see
    /// [`Builder::replica_bound`]); `None` while one has not.
    fn ready_at(&self, entry: Scheduled, ends: &[f64]) -> Option<f64> {
        let stages = self.stages as usize;
        let pack = entry.pack.0 as usize;
        let info = self.packs[pack];
        let slot = |stage: u32| pack * stages + stage as usize;
        let ended = |time: f64| (!time.is_nan()).then_some(time);
        let send = |from: u32, to: u32| self.send_seconds(entry.pack, from, to);
        let last = self.stages - 1;
        match (info.direction, entry.part) {
            (_, Part::WeightGrad) => ended(ends[slot(entry.stage)]),
            (Direction::Forward, _) if entry.stage == 0 => Some(0.0),
            (Direction::Forward, _) => ended(ends[slot(entry.stage - 1)])
                .map(|end| end + send(entry.stage - 1, entry.stage)),
            (Direction::Backward, _) if entry.stage < last => ended(ends[slot(entry.stage + 1)])
                .map(|end| end + send(entry.stage + 1, entry.stage)),
            (Direction::Backward, _) => {
                let mut ready = 0.0f64;
                for position in self.pack_slices[pack].clone() {
                    let forward = self.forward_of_node[self.slices[position as usize].node];
                    if forward == NONE {
                        continue;
                    }
                    ready = ready.max(ended(ends[forward as usize * stages + last as usize])?);
                }
                Some(ready)
            }
        }
    }

    /// The most any device group must run (every pack's forward and whole backward on each
    /// of its stages, on each group of its replica) plus its stage's DP sync tail (gradient
    /// reduce-scatter, optimizer step, parameter all-gather), which follows its last backward.
    /// A split backward takes no less than the whole one (its input gradient hides less of
    /// the TP collectives, and the compute adds up).
    fn compute_bound(&self) -> f64 {
        let layout = self.layout;
        let mut busy = vec![0.0f64; layout.groups()];
        for (index, pack) in self.packs.iter().enumerate() {
            let ranks = &self.replicas[pack.replica as usize];
            for stage in 0..self.stages {
                let seconds = self
                    .part_time(PackIndex(index as u32), stage, Part::Whole)
                    .critical_path_s();
                for &rank in ranks {
                    busy[layout.group(rank, stage).index()] += seconds;
                }
            }
        }
        let tails: Vec<f64> = (0..layout.pp).map(|d| self.sync_tail_s(d)).collect();
        busy.iter()
            .enumerate()
            .map(|(group, busy)| busy + tails[layout.stage_of(GroupId(group as u32)) as usize])
            .fold(0.0, f64::max)
    }
}
