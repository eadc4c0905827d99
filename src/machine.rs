//! The machine model a compile is judged on: the cost model of a spec, with a measured
//! calibration where slimpack ships one for the device (`runtime/calibration/cpu.json` for the
//! `cpu` preset's device, measured by `slimpack calibrate --backend cpu`).

use slimpack_ir::cost::CostModel;
use slimpack_ir::Spec;
use slimpack_runtime::cpu::calibration;

/// The cost model for `spec`: the shipped calibration of its device if there is one, the
/// analytic curves otherwise.
pub fn cost_model(spec: &Spec) -> CostModel {
    match calibration::shipped(&spec.cluster.gpu.name) {
        Some(measured) => CostModel::with_calibration(spec, measured)
            .expect("a shipped calibration is only returned for its own device (bug)"),
        None => CostModel::new(spec),
    }
}

/// Whether [`cost_model`] uses a measured calibration for `spec`.
pub fn is_calibrated(spec: &Spec) -> bool {
    calibration::shipped(&spec.cluster.gpu.name).is_some()
}
