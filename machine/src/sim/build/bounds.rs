//! What a search needs of the simulator without running it: each pipeline device's peak
//! memory stacked from the schedules alone ([`UntimedPeaks`]), and two lower bounds on the
//! step ([`compute_bound`] for any schedule of a packing, [`schedule_bound`] for a schedule).
//! They reuse the builder's gathering of packs and its timing of each task, so that they
//! price the step exactly as the simulator does.

use slimpack_ir::spec::Recompute;
use slimpack_ir::step::{Direction, PackId, Part, StepIr};

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
        builder.read_pack_modes();
        Ok(UntimedPeaks {
            builder,
            models: Vec::new(),
            effects: Vec::new(),
        })
    }

    /// The peaks with pipeline device `d` running `modes[d]` on every stage it holds (and each
    /// pack its own mode where the IR gives it one, or [`UntimedPeaks::set_pack_modes`] did).
    pub fn device_peaks(&mut self, modes: &[Recompute]) -> Result<Vec<u64>, MachineError> {
        let (stage_modes, own_modes) = self.prepare(modes);
        self.builder
            .untimed_device_peaks(&stage_modes, &own_modes, &mut self.effects, None)
    }

    /// Replaces the packs' own modes, `((forward pack, stage), mode)`, that the next probes
    /// stack (see [`Builder::set_pack_modes`]).
    pub fn set_pack_modes(&mut self, own: &[((PackId, u32), Recompute)]) {
        self.builder.set_pack_modes(own);
    }

    /// [`UntimedPeaks::device_peaks`]'s stacking, op by op: per timeline (a replica's groups of a
    /// pipeline device that hold the same, or a shared rank's group), the ops in the order
    /// they run with the bytes held while each runs.
    pub fn timelines(&mut self, modes: &[Recompute]) -> Result<Vec<Timeline>, MachineError> {
        let (stage_modes, own_modes) = self.prepare(modes);
        let mut timelines = Vec::new();
        self.builder.untimed_device_peaks(
            &stage_modes,
            &own_modes,
            &mut self.effects,
            Some(&mut timelines),
        )?;
        Ok(timelines)
    }

    /// The bytes `pack`'s forward saves (activations and K/V) on each device of its group on
    /// `stage` under `mode`; 0 for a pack the probe does not hold.
    pub fn saved_bytes(&mut self, pack: PackId, stage: u32, mode: Recompute) -> u64 {
        let builder = &self.builder;
        let Some(&index) = builder.pack_of_node.get(pack.node().index()) else {
            return 0;
        };
        if index == NONE || stage >= builder.stages {
            return 0;
        }
        let cost = match mode == builder.ir.spec.model.recompute {
            true => builder.cost,
            false => {
                let at = match self.models.iter().position(|(m, _)| *m == mode) {
                    Some(at) => at,
                    None => {
                        self.models.push((mode, builder.cost.with_recompute(mode)));
                        self.models.len() - 1
                    }
                };
                &self.models[at].1
            }
        };
        builder
            .memory_effect_on(cost, PackIndex(index), stage, Part::Whole)
            .allocated
    }

    /// The stages' machines under `modes` (by pipeline device), the memo index of each stage's
    /// mode and of each of the packs' own modes, and the memo sized for them.
    fn prepare(&mut self, modes: &[Recompute]) -> (Vec<usize>, Vec<usize>) {
        let builder = &mut self.builder;
        let model_mode = builder.ir.spec.model.recompute;
        let pp = builder.layout.pp;
        let models = &mut self.models;
        let mut memo_of = |mode: Recompute| -> usize {
            if mode == model_mode {
                return 0;
            }
            match models.iter().position(|(m, _)| *m == mode) {
                Some(index) => index + 1,
                None => {
                    models.push((mode, builder.cost.with_recompute(mode)));
                    models.len()
                }
            }
        };
        let stage_modes: Vec<usize> = (0..builder.stages)
            .map(|stage| memo_of(modes[(stage % pp) as usize]))
            .collect();
        let own_modes: Vec<usize> = builder
            .pack_costs
            .iter()
            .map(|&(mode, _)| memo_of(mode))
            .collect();
        builder.stage_costs = stage_modes
            .iter()
            .map(|&memo| (memo > 0).then(|| self.models[memo - 1].1.clone()))
            .collect();
        let slots = builder.packs.len() * 4 * 3;
        self.effects.resize_with(self.models.len() + 1, Vec::new);
        for effects in &mut self.effects {
            effects.resize(slots, None);
        }
        (stage_modes, own_modes)
    }
}

/// One memory timeline of [`UntimedPeaks::timelines`]: the ops a device group runs, in order,
/// each with the bytes its devices hold while it runs (temporaries included).
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    pub device: u32,
    pub ops: Vec<TimelineOp>,
}

/// One op of a [`Timeline`].
#[derive(Debug, Clone, Copy)]
pub struct TimelineOp {
    pub pack: PackId,
    pub stage: u32,
    pub part: Part,
    pub during_bytes: u64,
}

/// A lower bound on the step time of every schedule of `ir`'s packs (phase `packed` or later),
/// see [`super::compute_bound`].
pub(in crate::sim) fn compute_bound(
    ir: &StepIr,
    cost: &CostModel,
    layout: Layout,
) -> Result<f64, MachineError> {
    let builder = timed_builder(ir, cost, layout, None)?;
    Ok(builder.compute_bound(vec![0.0; layout.groups()]))
}

/// A builder of `ir`'s packs (of every replica, or `only` one) with their durations, as the
/// bounds read them.
fn timed_builder<'a>(
    ir: &'a StepIr,
    cost: &'a CostModel,
    layout: Layout,
    only: Option<usize>,
) -> Result<Builder<'a>, MachineError> {
    check_stages(ir, layout)?;
    let mut builder = Builder::new(ir, cost, layout)?;
    builder.collect_packs(true, only);
    builder.read_pack_modes();
    Ok(builder)
}

/// A lower bound on the step time of every step the backward packing, scheduling and
/// refining of `ir`'s forward packs make (phase `assigned`, every slice in a forward pack),
/// see [`super::forward_bound`].
pub(in crate::sim) fn forward_bound(
    ir: &StepIr,
    cost: &CostModel,
    layout: Layout,
) -> Result<f64, MachineError> {
    let builder = timed_builder(ir, cost, layout, None)?;
    let devices_per_group = f64::from(ir.spec.parallel.tp * ir.spec.parallel.cp_degree());
    let mut backward = vec![0.0f64; layout.groups()];
    for (&replica, ranks) in ir.replicas().iter().zip(&builder.replicas) {
        // The replica's samples: its backward packs hold their slices.
        let lengths: Vec<u64> = (ir.samples_on(replica).iter())
            .map(|&sample| u64::from(ir.sample(sample).len))
            .collect();
        let attention = cost.batch_attention(&lengths, ranks.len() as u32);
        let devices = devices_per_group * ranks.len() as f64;
        for stage in 0..builder.stages {
            let seconds = cost.backward_device_seconds_lower_bound(stage, &attention) / devices;
            for &rank in ranks {
                backward[layout.group(rank, stage).index()] += seconds;
            }
        }
    }
    Ok(builder.compute_bound(backward))
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
    timed_builder(ir, cost, layout, Some(replica))?.replica_bound()
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
    /// With `timelines`, the ops of each timeline and the bytes held while each runs are
    /// recorded there too. `own_modes[k]` is the memo index of the `k`-th of the packs' own
    /// modes (`pack_costs`).
    fn untimed_device_peaks(
        &mut self,
        stage_modes: &[usize],
        own_modes: &[usize],
        effects: &mut [Vec<Option<MemoryEffect>>],
        mut timelines: Option<&mut Vec<Timeline>>,
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
        // With timelines: the one being stacked for a replica alone, and each shared group's.
        let mut alone: Option<usize> = None;
        let mut shared_timeline: Vec<Option<usize>> = vec![None; shared.len()];
        self.walk_schedules(|builder, entry| {
            let slot = builder.share_slot(entry.pack, entry.stage, entry.part);
            let memo_index = match builder.pack_mode(entry.pack, entry.stage) {
                Some(own) => own_modes[own],
                None => stage_modes[entry.stage as usize],
            };
            let memo = &mut effects[memo_index][slot];
            let effect = *memo
                .get_or_insert_with(|| builder.memory_effect(entry.pack, entry.stage, entry.part));
            let peak = &mut peaks[entry.device as usize];
            let replica = builder.packs[entry.pack.0 as usize].replica as usize;
            let op = |during_bytes| TimelineOp {
                pack: builder.pack_ids[entry.pack.0 as usize],
                stage: entry.stage,
                part: entry.part,
                during_bytes,
            };
            if !sharing[replica] {
                if entry.first {
                    timeline = GroupMemory::new(baseline(entry.device));
                }
                let during = timeline.stack(&effect);
                *peak = (*peak).max(timeline.peak_bytes);
                if let Some(timelines) = timelines.as_deref_mut() {
                    if entry.first || alone.is_none() {
                        timelines.push(Timeline {
                            device: entry.device,
                            ops: Vec::new(),
                        });
                        alone = Some(timelines.len() - 1);
                    }
                    timelines[alone.expect("just set")].ops.push(op(during));
                }
                return;
            }
            for &rank in &builder.replicas[replica] {
                let group = builder.layout.group(rank, entry.device).index();
                let memory =
                    shared[group].get_or_insert_with(|| GroupMemory::new(baseline(entry.device)));
                let during = memory.stack(&effect);
                *peak = (*peak).max(memory.peak_bytes);
                if let Some(timelines) = timelines.as_deref_mut() {
                    let index = *shared_timeline[group].get_or_insert_with(|| {
                        timelines.push(Timeline {
                            device: entry.device,
                            ops: Vec::new(),
                        });
                        timelines.len() - 1
                    });
                    timelines[index].ops.push(op(during));
                }
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
    /// of its stages, on each group of its replica) after its pipeline fill, plus its stage's
    /// DP sync tail (gradient reduce-scatter, optimizer step, parameter all-gather), which
    /// follows its last backward. A split backward takes no less than the whole one (its input
    /// gradient hides less of the TP collectives, and the compute adds up).
    ///
    /// The fill: a group's first op is a forward (a backward follows its slices' forwards on
    /// the last stage, a weight gradient its input gradient), and a pack's forward on a stage
    /// starts after its forwards on the stages before it and the sends between them, as in
    /// [`Builder::replica_bound`]; so a group runs nothing before the shortest such prefix of
    /// the forwards it runs. (A drain bound, backwards from a group's last backward to stage
    /// 0, was tried and pruned nothing more on the 70B step of issue 13: a zero-bubble
    /// schedule may run weight gradients after that backward, so such a bound could count
    /// only the input gradients before it.)
    ///
    /// `busy` is compute each group runs besides its packs' (per group: the backward of a
    /// step not packed backward yet, [`forward_bound`]; zeros otherwise).
    fn compute_bound(&self, mut busy: Vec<f64>) -> f64 {
        let layout = self.layout;
        let mut fill = vec![f64::INFINITY; layout.groups()];
        for (index, pack) in self.packs.iter().enumerate() {
            let pack_index = PackIndex(index as u32);
            let ranks = &self.replicas[pack.replica as usize];
            let forward = pack.direction == Direction::Forward;
            // The forward's earliest start on `stage`.
            let mut prefix = 0.0f64;
            for stage in 0..self.stages {
                let seconds = self
                    .part_time(pack_index, stage, Part::Whole)
                    .critical_path_s();
                for &rank in ranks {
                    let group = layout.group(rank, stage).index();
                    busy[group] += seconds;
                    if forward {
                        fill[group] = fill[group].min(prefix);
                    }
                }
                if forward && stage + 1 < self.stages {
                    prefix += seconds + self.send_seconds(pack_index, stage, stage + 1);
                }
            }
        }
        let tails: Vec<f64> = (0..layout.pp).map(|d| self.sync_tail_s(d)).collect();
        busy.iter()
            .zip(fill)
            .enumerate()
            .map(|(group, (busy, fill))| {
                // A group with no forward runs nothing.
                let fill = if fill.is_finite() { fill } else { 0.0 };
                fill + busy + tails[layout.stage_of(GroupId(group as u32)) as usize]
            })
            .fold(0.0, f64::max)
    }
}
