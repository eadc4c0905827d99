//! The machine model a compile is judged on: the cost model of a spec, with a measured
//! calibration where slimpack ships one for the device.

use slimpack_ir::cost::CostModel;
use slimpack_ir::Spec;

/// The cost model for `spec` (analytic curves unless a calibration applies).
pub fn cost_model(spec: &Spec) -> CostModel {
    CostModel::new(spec)
}
