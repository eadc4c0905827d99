//! slimpack-machine: the machine a step is compiled for and judged on.
//!
//! - [`cost`]: the cost and memory model of a spec — FLOPs per slice, achieved-efficiency
//!   curves (or measured calibration tables), communication, memory per device; pure functions
//!   the passes plan with;
//! - [`sim`]: the simulator — a DAG of a scheduled step's tasks executed event by event on
//!   per-device streams, with a memory timeline, the metrics and the pictures;
//! - [`machine_model`]: the one cost model of a spec, with the calibration slimpack ships for
//!   its device where there is one (`machine/calibration/`). The pass manager hands it to every
//!   pass and the driver simulates with it, so planning and judging use the same machine.
//!
//! `slimpack-passes` depends on this crate for [`cost`] only; it never runs the simulator.

pub mod cost;
mod error;
pub mod sim;

pub use cost::CostModel;
pub use error::{MachineError, Result};

use cost::Calibration;
use slimpack_ir::Spec;

/// The calibration of the `cpu` preset's device, as shipped (measured by
/// `slimpack calibrate --backend cpu`).
const SHIPPED_CPU: &str = include_str!("../calibration/cpu.json");

/// The shipped calibration of `device` (a [`slimpack_ir::spec::GpuSpec`] name), if slimpack
/// ships one: `cpu-2core`, measured on the machines the CPU runtime runs on.
pub fn shipped_calibration(device: &str) -> Option<Calibration> {
    let calibration = Calibration::from_json(SHIPPED_CPU, "machine/calibration/cpu.json")
        .expect("the shipped calibration parses (a test checks it)");
    (calibration.device == device).then_some(calibration)
}

/// The cost model of `spec`: the shipped calibration of its device if there is one, the
/// analytic curves otherwise.
pub fn machine_model(spec: &Spec) -> CostModel {
    match shipped_calibration(&spec.cluster.gpu.name) {
        Some(measured) => CostModel::with_calibration(spec, measured)
            .expect("a shipped calibration is only returned for its own device (bug)"),
        None => CostModel::new(spec),
    }
}

/// Whether [`machine_model`] uses a measured calibration for `spec`.
pub fn is_calibrated(spec: &Spec) -> bool {
    shipped_calibration(&spec.cluster.gpu.name).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cost::OpKind;

    #[test]
    fn the_shipped_calibration_parses_and_covers_every_op_kind() {
        let calibration = shipped_calibration("cpu-2core").expect("shipped for the cpu device");
        for op in OpKind::ALL {
            assert!(calibration.tables.contains_key(&op), "{op:?}");
        }
        assert!(shipped_calibration("H100-SXM5-80GB").is_none());
    }

    #[test]
    fn the_cpu_preset_is_calibrated_and_the_gpus_are_not() {
        let cpu = Spec::from_presets("tiny", "cpu", "tp=1,pp=1,dp=1").unwrap();
        let gpu = Spec::from_presets("llama-7b", "h100-sxm", "tp=8,pp=1,dp=1").unwrap();
        assert!(is_calibrated(&cpu));
        assert!(!is_calibrated(&gpu));
    }
}
