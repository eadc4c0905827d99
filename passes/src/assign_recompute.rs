//! `assign-recompute`: per pipeline device, the least activation recomputation that keeps the
//! device's simulated peak memory within the limit.
//!
//! Phase in and out: `scheduled` (the packs and orders are not changed; only the stages'
//! `recompute=` attribute, [`slimpack_ir::step::Stage::recompute`]).
//!
//! Why per stage: one recomputation mode for the whole step is sized for the device that holds
//! the most. In a 1F1B pipeline, stage `s` of `pp` holds up to `pp - s` forwards' activations
//! while the last stage holds about one, so a mode that makes stage 0 fit recomputes on every
//! later stage what their memory never forced.
//!
//! The ladder of modes a device may take, from the least recomputation to the most: `none`,
//! `block:1`, ..., `block:L-1`, `full` (`L` the layers of a model chunk) — each step keeps
//! less and replays more. Every stage (model chunk) of a pipeline device takes the device's
//! mode. The choice is made on the simulator's memory timeline, not on an estimate: a binary
//! search per device over the ladder, all devices at once (one probe of the simulator's peaks
//! per round, [`sim::PeakProbe`], which stacks the schedules without timing them: a device's
//! peak depends on its own mode only, so the search is exact). The schedule itself was built
//! by `schedule-pipeline` under the model's mode (run the step with `recompute=full` so that
//! its warm-ups are not cut for memory, and let this pass give the memory back where it is
//! not needed).
//!
//! Per pack (`packs=true`, [`packs`]): a device's rung is what its peak needs, but not every
//! pack is live at the peak. Packs whose lifetime on the device has room (warm-up and drain,
//! short packs beside long ones, a pipeline of one stage where only the packs holding a long
//! document need recomputation) then save under a lower rung of their own
//! (`StepIr::set_pack_recompute`), chosen on the probe's memory timelines and checked by a
//! last probe. Forward packs whose slices one backward pack replays take one mode together.

mod packs;

use crate::error::{PassError, Result};
use crate::pass::{OptionInfo, Pass, PassContext, PassInfo, PassOptions, Statistics};
use slimpack_ir::spec::Recompute;
use slimpack_ir::step::Phase;
use slimpack_ir::StepIr;
use slimpack_machine::cost::DEFAULT_MEMORY_LIMIT;
use slimpack_machine::sim;
use slimpack_machine::MachineError;

pub(crate) const INFO: PassInfo = PassInfo {
    name: "assign-recompute",
    summary: "per pipeline stage, the least block recomputation that fits memory (simulated)",
    description: "Per pipeline device, the least recomputation on the ladder none, block:1, \
                  ..., full whose simulated peak memory stays within the `memory` fraction of \
                  the device; written on the stages as recompute=<mode>. With packs=true, then \
                  the packs whose lifetime leaves room take a lower rung of their own \
                  (`recompute %stN MODE [...]`); run it after the passes that repack or \
                  reschedule (eqsat, schedule-pipeline), which drop those. Phase scheduled -> \
                  scheduled (packs and orders unchanged).",
    accepts: Phase::Scheduled..=Phase::Scheduled,
    produces: None,
    options: &[
        OptionInfo {
            name: "memory",
            help: "the fraction of device memory each device's simulated peak may reach",
            default: Some("0.92"),
        },
        OptionInfo {
            name: "packs",
            help:
                "then lower the rung of the packs whose lifetime leaves memory room (true or false)",
            default: Some("false"),
        },
    ],
    create: |options| Ok(Box::new(AssignRecompute::from_options(options)?)),
};

/// The per-stage recomputation pass.
#[derive(Debug, Clone, Copy)]
pub struct AssignRecompute {
    /// The fraction of device memory a device's peak may reach (the tuner's limit unless
    /// given).
    pub memory: f64,
    /// Whether packs take a lower rung than their device where memory allows
    /// ([`packs::lower_packs`]).
    pub packs: bool,
}

impl Default for AssignRecompute {
    fn default() -> AssignRecompute {
        AssignRecompute {
            memory: DEFAULT_MEMORY_LIMIT,
            packs: false,
        }
    }
}

impl AssignRecompute {
    fn from_options(options: &PassOptions) -> Result<AssignRecompute> {
        let memory = options
            .fraction("memory")?
            .expect("declared with a default");
        let packs = options
            .get::<bool>("packs", "true or false")?
            .expect("declared with a default");
        Ok(AssignRecompute { memory, packs })
    }
}

impl Pass for AssignRecompute {
    fn info(&self) -> &'static PassInfo {
        &INFO
    }

    fn run(&mut self, ir: &mut StepIr, cx: &PassContext) -> Result<Statistics> {
        let cost = cx.machine();
        let limit = (cost.memory().capacity_bytes() as f64 * self.memory) as u64;
        let top = ir.spec.layers_per_chunk();
        let pp = ir.spec.parallel.pp as usize;
        let mut simulations = 0u64;
        let mut probe = sim::PeakProbe::new(ir, cost).map_err(simulation_failed)?;
        // The devices' rungs replace whatever packs' own modes the step had.
        probe.set_pack_modes(&[]);
        let mut peaks = |levels: &[u32]| -> Result<Vec<u64>> {
            simulations += 1;
            let modes: Vec<Recompute> = levels.iter().map(|&l| ladder_mode(l, top)).collect();
            probe.device_peaks(&modes).map_err(simulation_failed)
        };
        // Binary search per device for the lowest rung that fits: `high` fits (or is the top).
        let (mut low, mut high) = (vec![0u32; pp], vec![top; pp]);
        while low.iter().zip(&high).any(|(l, h)| l < h) {
            let probe: Vec<u32> = low
                .iter()
                .zip(&high)
                .map(|(&l, &h)| if l < h { l + (h - l) / 2 } else { h })
                .collect();
            let device_peaks = peaks(&probe)?;
            for device in 0..pp {
                if low[device] >= high[device] {
                    continue;
                }
                match device_peaks[device] <= limit {
                    true => high[device] = probe[device],
                    false => low[device] = probe[device] + 1,
                }
            }
        }
        let levels = high;
        let mut statistics = Statistics::new();
        let own = match self.packs && levels.iter().any(|&level| level > 0) {
            true => {
                simulations += 2;
                packs::lower_packs(ir, &mut probe, &levels, top, limit)
                    .map_err(simulation_failed)?
            }
            false => Vec::new(),
        };
        set_levels(ir, &levels, top);
        for &((pack, stage), mode) in &own {
            ir.set_pack_recompute(pack, stage, Some(mode));
        }
        if self.packs {
            statistics.set("packs_recomputing_less", own.len() as u64);
        }
        statistics.set("simulations", simulations);
        statistics.set(
            "devices_recomputing",
            levels.iter().filter(|&&level| level > 0).count() as u64,
        );
        statistics.set(
            "recomputed_layers_per_replica",
            u64::from(ir.spec.parallel.vpp) * levels.iter().map(|&l| u64::from(l)).sum::<u64>(),
        );
        statistics.set(
            "modes",
            levels
                .iter()
                .map(|&level| ladder_mode(level, top).to_string())
                .collect::<Vec<_>>()
                .join(" "),
        );
        Ok(statistics)
    }
}

/// Rung `level` of the ladder over a chunk of `top` layers: `none`, `block:level`, `full`.
pub fn ladder_mode(level: u32, top: u32) -> Recompute {
    match level {
        0 => Recompute::None,
        level if level >= top => Recompute::Full,
        level => Recompute::Block(level),
    }
}

/// Sets every stage of pipeline device `d` to rung `levels[d]`.
fn set_levels(ir: &mut StepIr, levels: &[u32], top: u32) {
    for (device, &level) in levels.iter().enumerate() {
        ir.set_device_recompute(device as u32, Some(ladder_mode(level, top)));
    }
}

fn simulation_failed(error: MachineError) -> PassError {
    PassError::Failed {
        pass: INFO.name,
        message: format!("simulating the step: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slimpack_ir::Spec;
    use slimpack_machine::cost::CostModel;
    use slimpack_machine::sim::fixture::{one_f_one_b, ReplicaPlan};

    /// The peak memory of each pipeline device, from a full simulation of the step.
    fn device_peaks(ir: &StepIr, cost: &CostModel) -> Result<Vec<u64>> {
        let result = sim::simulate(ir, cost).map_err(simulation_failed)?;
        Ok(result.device_peaks())
    }

    /// llama-7b on a 40 GiB H100 at tp=2, pp=4: eight 16K-token samples in 1F1B, where stage
    /// 0 holds four forwards and the last stage one — so the uniform mode that fits stage 0
    /// recomputes on the last stage what its memory does not need.
    fn step(recompute: Recompute) -> StepIr {
        let mut spec = Spec::from_presets("llama-7b", "h100-sxm", "tp=2,pp=4,dp=1").unwrap();
        spec.cluster.gpu.hbm_bytes = 40 << 30;
        spec.model.recompute = recompute;
        let plan = ReplicaPlan {
            ranks: vec![0],
            packs: vec![vec![16384]; 8],
        };
        one_f_one_b(spec, &[plan])
    }

    fn assigned(recompute: Recompute) -> (StepIr, Statistics) {
        let mut ir = step(recompute);
        let cx = PassContext::for_spec(&ir.spec);
        let statistics = AssignRecompute::default().run(&mut ir, &cx).unwrap();
        (ir, statistics)
    }

    fn limit(ir: &StepIr) -> u64 {
        let capacity = slimpack_machine::machine_model(&ir.spec)
            .memory()
            .capacity_bytes();
        (capacity as f64 * DEFAULT_MEMORY_LIMIT) as u64
    }

    #[test]
    fn per_stage_modes_fit_and_recompute_less_than_the_uniform_mode() {
        let none = step(Recompute::None);
        let cost = slimpack_machine::machine_model(&none.spec);
        let none_peaks = device_peaks(&none, &cost).unwrap();
        assert!(
            none_peaks[0] > limit(&none),
            "the test needs a step whose first stage does not fit without recomputation"
        );
        let full = step(Recompute::Full);
        let full_sim = sim::simulate(&full, &slimpack_machine::machine_model(&full.spec)).unwrap();
        assert!(full_sim.metrics.peak_memory_bytes <= limit(&full));

        let (ir, statistics) = assigned(Recompute::Full);
        let cost = slimpack_machine::machine_model(&ir.spec);
        let peaks = device_peaks(&ir, &cost).unwrap();
        assert!(peaks.iter().all(|&peak| peak <= limit(&ir)), "{peaks:?}");
        let modes: Vec<Recompute> = (0..4).map(|stage| ir.stage_recompute(stage)).collect();
        // Fewer forwards in flight, less recomputation: never more on a later stage.
        let layers = |mode: Recompute| mode.mix(8).full * 8.0;
        assert!(
            modes.windows(2).all(|w| layers(w[0]) >= layers(w[1])),
            "{modes:?}"
        );
        assert_eq!(modes[3], Recompute::None, "{modes:?}");
        assert_ne!(modes[0], Recompute::None, "{modes:?}");
        let per_stage = sim::simulate(&ir, &cost).unwrap().metrics;
        assert!(per_stage.losses.recompute_s < full_sim.metrics.losses.recompute_s);
        assert!(per_stage.step_time_s < full_sim.metrics.step_time_s);
        assert!(statistics.get("simulations").is_some());
    }

    #[test]
    fn each_device_runs_the_least_rung_that_fits() {
        let (ir, _) = assigned(Recompute::Full);
        let cost = slimpack_machine::machine_model(&ir.spec);
        let top = ir.spec.layers_per_chunk();
        let rung = |mode: Recompute| match mode {
            Recompute::None => 0,
            Recompute::Block(k) => k,
            _ => top,
        };
        let levels: Vec<u32> = (0..4)
            .map(|stage| rung(ir.stage_recompute(stage)))
            .collect();
        for device in 0..4 {
            if levels[device] == 0 {
                continue;
            }
            let mut lower = ir.clone();
            let mut less = levels.clone();
            less[device] -= 1;
            set_levels(&mut lower, &less, top);
            let peaks = device_peaks(&lower, &cost).unwrap();
            assert!(
                peaks[device] > limit(&ir),
                "device {device} fits one rung lower than {levels:?}"
            );
        }
    }

    /// With `packs=true`, the packs whose lifetime leaves room under the limit take lower rungs
    /// than their device: the step still fits (by a full simulation, which prices each pack
    /// under its own mode, as the probe stacked it), recomputes less and is no slower.
    #[test]
    fn packs_take_lower_rungs_where_memory_allows_and_the_step_still_fits() {
        let (per_stage, _) = assigned(Recompute::Full);
        let mut ir = step(Recompute::Full);
        let cx = PassContext::for_spec(&ir.spec);
        let mut pass = AssignRecompute {
            packs: true,
            ..AssignRecompute::default()
        };
        let statistics = pass.run(&mut ir, &cx).unwrap();
        let own: Vec<_> = ir.pack_recomputes().collect();
        assert!(!own.is_empty(), "the test needs packs with room");
        assert_eq!(
            statistics.get("packs_recomputing_less"),
            Some(&serde_json::Value::from(own.len() as u64))
        );
        let layers = |mode: Recompute| mode.mix(8).full;
        for &((_, stage), mode) in &own {
            // The devices keep their rungs; a pack's own is lower.
            assert_eq!(ir.stage_recompute(stage), per_stage.stage_recompute(stage));
            assert!(layers(mode) < layers(ir.stage_recompute(stage)), "{mode}");
        }
        let cost = slimpack_machine::machine_model(&ir.spec);
        let simulated = sim::simulate(&ir, &cost).unwrap();
        assert!(simulated
            .device_peaks()
            .iter()
            .all(|&peak| peak <= limit(&ir)));
        let modes: Vec<Recompute> = (0..4).map(|stage| ir.stage_recompute(stage)).collect();
        let mut probe = sim::PeakProbe::new(&ir, &cost).unwrap();
        assert_eq!(
            probe.device_peaks(&modes).unwrap(),
            simulated.device_peaks()
        );
        let before = sim::simulate(&per_stage, &cost).unwrap().metrics;
        assert!(simulated.metrics.losses.recompute_s < before.losses.recompute_s);
        assert!(simulated.metrics.step_time_s <= before.step_time_s);
        // Verified, and the text form carries the packs' modes.
        slimpack_ir::verify::verify(&ir).unwrap();
        let text = slimpack_ir::text::print(&ir);
        let parsed = slimpack_ir::text::parse(&text, "test").unwrap();
        assert_eq!(
            parsed.pack_recomputes().collect::<Vec<_>>().len(),
            own.len()
        );
        assert_eq!(slimpack_ir::text::print(&parsed), text);
    }

    #[test]
    fn a_step_that_fits_without_recomputation_recomputes_nothing() {
        let mut ir = step(Recompute::Full);
        ir.spec.cluster.gpu.hbm_bytes = 80 << 30;
        let cx = PassContext::for_spec(&ir.spec);
        AssignRecompute::default().run(&mut ir, &cx).unwrap();
        assert!((0..4).all(|stage| ir.stage_recompute(stage) == Recompute::None));
    }
}
