//! [`Plan`]: a scheduled step IR as the executor needs it — stages, replicas, packs with their
//! slices in the core's terms, each replica's per-stage schedule, and the step's lowered
//! program (replica-major, `slimpack_ir::program::lower`).

use slimpack_ir::program::{self, Op, Program};
use slimpack_ir::step::{Direction, Part, Phase, StepIr};

use crate::cpu::batch::{SampleId, TokenBatch, TokenSlice};
use crate::cpu::config::ModelConfig;
use crate::cpu::error::{CpuError, Result};
use crate::cpu::stage::LayerRange;

/// One pack of the step.
#[derive(Debug, Clone)]
pub struct PlanPack {
    pub direction: Direction,
    /// Index into [`Plan::replicas`].
    pub replica: usize,
    /// Its slices, in the pack's order; samples are numbered in the IR's batch order.
    pub slices: Vec<TokenSlice>,
    /// Padding tokens after the slices (0 unless the pack is padded to a fixed length).
    pub padding: usize,
    /// The pack's name in the printed IR (`%f3`, `%b7`).
    pub name: String,
}

/// A scheduled step in executable form.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Data-parallel ranks.
    pub dp: usize,
    /// Pipeline stages, in order.
    pub stages: Vec<LayerRange>,
    /// DP ranks of each replica, in the IR's replica order.
    pub replicas: Vec<Vec<usize>>,
    /// Every pack, in the IR's canonical order (per replica, forward packs then backward).
    pub packs: Vec<PlanPack>,
    /// `schedules[replica][stage]`: the order of the replica's tasks ([`Plan::task_of`]: pack
    /// indices into `packs`, and the deferred weight gradients of a zero-bubble schedule).
    pub schedules: Vec<Vec<Vec<usize>>>,
    /// Sample lengths in batch order.
    pub sample_lens: Vec<usize>,
    /// The step's lowered program: replicas in IR order on every worker (see
    /// [`super::DeviceOrder::program`] for other interleavings).
    pub lowered: Program,
}

/// A device: one DP rank on one pipeline stage (one worker thread).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device {
    pub rank: usize,
    pub stage: usize,
}

impl Plan {
    /// The plan of `ir` (phase `scheduled` or later) for the model `config`.
    pub fn new(ir: &StepIr, config: &ModelConfig) -> Result<Plan> {
        if ir.phase() < Phase::Scheduled {
            return Err(CpuError::NotScheduled {
                phase: ir.phase().to_string(),
            });
        }
        let parallel = ir.spec.parallel;
        if parallel.tp != 1 || parallel.cp_degree() != 1 || parallel.vpp != 1 {
            return Err(CpuError::UnsupportedLayout {
                layout: ir.spec.parallel.to_string(),
            });
        }
        let stages = ir
            .stages()
            .iter()
            .map(|&id| {
                let stage = ir.stage(id);
                let first = stage.first_layer as usize;
                LayerRange::new(config, first..first + stage.layers as usize)
            })
            .collect::<Result<Vec<LayerRange>>>()?;
        LayerRange::check_partition(&stages)?;
        let sample_index: std::collections::HashMap<_, _> = ir
            .samples()
            .iter()
            .enumerate()
            .map(|(index, &id)| (id, index))
            .collect();
        let mut plan = Plan {
            dp: ir.spec.parallel.dp as usize,
            stages,
            replicas: Vec::new(),
            packs: Vec::new(),
            schedules: Vec::new(),
            sample_lens: ir
                .samples()
                .iter()
                .map(|&s| ir.sample(s).len as usize)
                .collect(),
            lowered: program::program_of(ir).into_owned(),
        };
        let mut numbers = [0usize; 2];
        let mut pack_index = std::collections::HashMap::new();
        for (replica, &replica_id) in ir.replicas().iter().enumerate() {
            let ranks: Vec<usize> = ir
                .replica(replica_id)
                .ranks
                .iter()
                .map(|&r| r as usize)
                .collect();
            if let Some(&rank) = ranks.iter().find(|&&r| r >= plan.dp) {
                return Err(CpuError::Schedule {
                    message: format!("replica {replica} names DP rank {rank} of {}", plan.dp),
                });
            }
            plan.replicas.push(ranks);
            for (slot, direction) in [Direction::Forward, Direction::Backward]
                .into_iter()
                .enumerate()
            {
                for pack in ir.packs_on(replica_id, direction) {
                    let slices = ir
                        .pack_members(pack)
                        .iter()
                        .map(|&slice| {
                            let bounds = ir.slice(slice);
                            TokenSlice {
                                sample: SampleId(sample_index[&ir.sample_of(slice)]),
                                start: bounds.start as usize,
                                len: bounds.len as usize,
                            }
                        })
                        .collect::<Vec<TokenSlice>>();
                    let tokens: usize = slices.iter().map(|s| s.len).sum();
                    let padded = ir.padding(pack).map_or(0, |p| p as usize);
                    pack_index.insert(pack, plan.packs.len());
                    plan.packs.push(PlanPack {
                        direction,
                        replica,
                        slices,
                        padding: padded.saturating_sub(tokens),
                        name: format!("%{}{}", ["f", "b"][slot], numbers[slot]),
                    });
                    numbers[slot] += 1;
                }
            }
        }
        // Tasks: packs by index, deferred weight gradients after all packs (see `task_of`).
        let packs = plan.packs.len();
        for &replica_id in ir.replicas() {
            let schedules = (0..plan.stages.len() as u32)
                .map(|stage| {
                    ir.stage_ops(replica_id, stage)
                        .into_iter()
                        .map(|op| match op.part {
                            Part::WeightGrad => packs + pack_index[&op.pack],
                            _ => pack_index[&op.pack],
                        })
                        .collect()
                })
                .collect();
            plan.schedules.push(schedules);
        }
        plan.check_schedules()?;
        Ok(plan)
    }

    /// The task an op belongs to: the runs of a worker's ops on one pack, its index into
    /// `packs`, except a split backward's deferred weight gradient (`bwd %bN.dw`), a task of its
    /// own numbered `packs.len() + pack`.
    pub fn task_of(&self, op: &Op) -> Option<usize> {
        match *op {
            Op::Backward {
                pack,
                part: Part::WeightGrad,
                ..
            } => Some(self.packs.len() + pack as usize),
            _ => op.pack().map(|pack| pack as usize),
        }
    }

    /// The pack a task works on (see [`Plan::task_of`]).
    pub fn task_pack(&self, task: usize) -> &PlanPack {
        &self.packs[task % self.packs.len()]
    }

    /// Pipeline stages.
    pub fn pp(&self) -> usize {
        self.stages.len()
    }

    /// The executors' rule for a `cp-exchange` of `pack` naming `group`: the DP ranks of the
    /// pack's replica, a DP-Merge group of two or more. `Some(why)` where it is broken.
    pub(crate) fn cp_exchange_error(&self, pack: usize, group: &[u32]) -> Option<String> {
        let info = &self.packs[pack];
        let ranks = &self.replicas[info.replica];
        let named: Vec<usize> = group.iter().map(|&rank| rank as usize).collect();
        (ranks.len() < 2 || named != *ranks).then(|| {
            format!(
                "cp-exchange of {} names the group {named:?}, but its replica runs on DP ranks {ranks:?}",
                info.name
            )
        })
    }

    /// The executors' rule for `device` receiving `pack` in `direction` from `from`: the same
    /// DP rank's previous stage (forward) or next stage (backward). `Some(why)` where broken.
    pub(crate) fn recv_error(
        &self,
        device: Device,
        pack: usize,
        direction: Direction,
        from: program::Worker,
    ) -> Option<String> {
        (super::neighbour(device, self.pp(), direction, true) != Some(from)).then(|| {
            format!(
                "{} cannot come from dp={} pp={}",
                self.packs[pack].name, from.dp, from.pp
            )
        })
    }

    /// Every device, by index (`stage · dp + rank`, the simulator's group order).
    pub fn devices(&self) -> Vec<Device> {
        (0..self.pp())
            .flat_map(|stage| (0..self.dp).map(move |rank| Device { rank, stage }))
            .collect()
    }

    /// The index of a device.
    pub fn device_index(&self, device: Device) -> usize {
        device.stage * self.dp + device.rank
    }

    /// The batch's samples with seeded random tokens, one per token of each IR sample.
    pub fn synthetic_batch(&self, config: &ModelConfig, seed: u64) -> Result<TokenBatch> {
        TokenBatch::synthetic(config, &self.sample_lens, seed)
    }

    /// Checks that `program` is a program of this step — the same layout, and every pack with
    /// the plan's direction, replica, DP ranks, slices and padding — and executable
    /// ([`program::check`]).
    pub fn check_program(&self, program: &Program) -> Result<()> {
        let mismatch = |message: String| CpuError::Schedule {
            message: format!("the program does not fit the step: {message}"),
        };
        if (program.pp as usize, program.dp as usize) != (self.pp(), self.dp) {
            return Err(mismatch(format!(
                "it has pp={} dp={}, the step pp={} dp={}",
                program.pp,
                program.dp,
                self.pp(),
                self.dp
            )));
        }
        if program.packs.len() != self.packs.len() {
            return Err(mismatch(format!(
                "it has {} packs, the step {}",
                program.packs.len(),
                self.packs.len()
            )));
        }
        for (layout, pack) in program.packs.iter().zip(&self.packs) {
            let ranks: Vec<usize> = layout.dp_ranks.iter().map(|&r| r as usize).collect();
            let slices = layout.slices.iter().map(|s| {
                (
                    s.sample as usize,
                    s.start as usize,
                    (s.end - s.start) as usize,
                )
            });
            let tokens: usize = pack.slices.iter().map(|s| s.len).sum();
            let fits = layout.direction == pack.direction
                && layout.replica as usize == pack.replica
                && ranks == self.replicas[pack.replica]
                && slices.eq(pack.slices.iter().map(|s| (s.sample.0, s.start, s.len)))
                && layout.padded_tokens as usize == tokens + pack.padding;
            if !fits {
                return Err(mismatch(format!(
                    "its pack {} differs from the step's {}",
                    layout.name, pack.name
                )));
            }
        }
        program::check(program).map_err(|e| CpuError::Schedule {
            message: format!("the program is not executable: {e}"),
        })
    }

    /// Every replica with packs has a complete schedule on every stage (the verifier's
    /// `schedule-complete`; checked again because an unverified IR can reach the executor).
    fn check_schedules(&self) -> Result<()> {
        for (replica, schedules) in self.schedules.iter().enumerate() {
            let mut expected: Vec<usize> = (0..self.packs.len())
                .filter(|&p| self.packs[p].replica == replica)
                .collect();
            expected.sort_unstable();
            for (stage, order) in schedules.iter().enumerate() {
                let mut listed: Vec<usize> = order
                    .iter()
                    .copied()
                    .filter(|&task| task < self.packs.len())
                    .collect();
                listed.sort_unstable();
                if listed != expected {
                    return Err(CpuError::Schedule {
                        message: format!(
                            "replica {replica} lists {} of its {} packs on stage {stage} (each exactly once)",
                            order.len(),
                            expected.len()
                        ),
                    });
                }
            }
        }
        Ok(())
    }
}
