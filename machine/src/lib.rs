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
//!   [`use_calibration`] replaces it with one the user measured (`--calibration FILE`,
//!   [`use_calibration_file`]).
//!
//! `slimpack-passes` depends on this crate for [`cost`] only; it never runs the simulator.

pub mod cost;
mod error;
pub mod sim;

pub use cost::CostModel;
pub use error::{MachineError, Result};

use std::sync::{OnceLock, RwLock};

use cost::Calibration;
use slimpack_ir::Spec;

/// The calibration of the `cpu` preset's device, as shipped (measured by
/// `slimpack calibrate --backend cpu`).
const SHIPPED_CPU: &str = include_str!("../calibration/cpu.json");

/// Calibrations given to this process ([`use_calibration`]: `--calibration FILE`), at most one
/// per device; they take precedence over the shipped ones.
static GIVEN: RwLock<Vec<Calibration>> = RwLock::new(Vec::new());

/// The shipped calibration of `device` (a [`slimpack_ir::spec::GpuSpec`] name), if slimpack
/// ships one: `cpu-2core`, measured on the machines the CPU runtime runs on.
pub fn shipped_calibration(device: &str) -> Option<Calibration> {
    static SHIPPED: OnceLock<Calibration> = OnceLock::new();
    let calibration = SHIPPED.get_or_init(|| {
        Calibration::from_json(SHIPPED_CPU, "machine/calibration/cpu.json")
            .expect("the shipped calibration parses (a test checks it)")
    });
    (calibration.device == device).then(|| calibration.clone())
}

/// Makes [`machine_model`] use `calibration` (a `slimpack calibrate` measurement, e.g. of a
/// GPU) for every spec whose device it was measured on, in place of any earlier one of that
/// device and of the shipped one, for the rest of the process.
pub fn use_calibration(calibration: Calibration) {
    let mut given = GIVEN
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    given.retain(|known| known.device != calibration.device);
    given.push(calibration);
}

/// Reads a `slimpack calibrate` table from `path`, checks that it was measured on `spec`'s
/// device (the rule of [`CostModel::with_calibration`]), and uses it ([`use_calibration`]):
/// what `--calibration FILE` and the Python package's `calibration=` do.
pub fn use_calibration_file(path: &std::path::Path, spec: &Spec) -> Result<()> {
    let calibration = Calibration::load(path)?;
    CostModel::with_calibration(spec, calibration.clone())?;
    use_calibration(calibration);
    Ok(())
}

/// The calibration [`machine_model`] uses for `spec`'s device: a given one, else the shipped
/// one where the spec's device is the one it was measured on — the `cpu` preset's, with its
/// rates; a config that keeps the device's name but overrides its peak FLOP/s or memory
/// bandwidth (`gpu = { peak_flops = .. }`) describes another machine, which the analytic
/// curves model (the shipped table ignored the override, while MFU divided by it). A table
/// given with `--calibration` is the user's measurement of their device and is used as given.
fn calibration_of(spec: &Spec) -> Option<Calibration> {
    let device = &spec.cluster.gpu;
    let given = GIVEN
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    given
        .iter()
        .find(|known| known.device == device.name)
        .cloned()
        .or_else(|| shipped_for(device))
}

/// The shipped calibration where `device` is the one it was measured on: the `cpu` preset's
/// name and rates (peak FLOP/s, memory bandwidth; its memory size is no rate of the table's).
fn shipped_for(device: &slimpack_ir::spec::GpuSpec) -> Option<Calibration> {
    static MEASURED_ON: OnceLock<Option<(f64, f64)>> = OnceLock::new();
    let rates = MEASURED_ON.get_or_init(|| {
        let gpu = slimpack_ir::spec::ClusterSpec::preset("cpu").ok()?.gpu;
        Some((gpu.peak_flops, gpu.hbm_bandwidth))
    });
    (*rates == Some((device.peak_flops, device.hbm_bandwidth)))
        .then(|| shipped_calibration(&device.name))
        .flatten()
}

/// The cost model of `spec`: the calibration of its device (given with [`use_calibration`], or
/// shipped) if there is one, the analytic curves otherwise.
pub fn machine_model(spec: &Spec) -> CostModel {
    match calibration_of(spec) {
        Some(measured) => CostModel::with_calibration(spec, measured)
            .expect("a calibration is only used for its own device (bug)"),
        None => CostModel::new(spec),
    }
}

/// Whether [`machine_model`] uses a measured calibration for `spec`.
pub fn is_calibrated(spec: &Spec) -> bool {
    calibration_of(spec).is_some()
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

    /// The H100 table measured with PyTorch (docs/SIMULATOR.md, "The kernel curves against a
    /// real H100") parses, is of the `h100-sxm` preset's device, and holds rates near the
    /// analytic curves' where the two agree (large GEMMs and attention): a sanity check on
    /// both the file and the curves.
    #[test]
    fn the_measured_h100_table_loads_for_the_h100_preset() {
        let text = include_str!("../calibration/h100-sxm-measured.json");
        let measured = Calibration::from_json(text, "h100-sxm-measured.json").unwrap();
        let spec = Spec::from_presets("llama-70b", "h100-sxm", "tp=8,pp=8,dp=4").unwrap();
        assert_eq!(measured.device, spec.cluster.gpu.name);
        assert!(measured.tables.contains_key(&OpKind::AttentionBackward));
        assert!(!measured.tables.contains_key(&OpKind::Elementwise));
        let analytic = CostModel::new(&spec);
        let calibrated = CostModel::with_calibration(&spec, measured).unwrap();
        for op in [OpKind::GemmForward, OpKind::AttentionForward] {
            let (model, real) = (
                analytic.throughput().rate(op, 16384.0),
                calibrated.throughput().rate(op, 16384.0),
            );
            assert!(
                (real / model - 1.0).abs() < 0.15,
                "{op:?}: {real:e} vs {model:e}"
            );
        }
    }

    #[test]
    fn the_cpu_preset_is_calibrated_and_the_gpus_are_not() {
        let cpu = Spec::from_presets("tiny", "cpu", "tp=1,pp=1,dp=1").unwrap();
        let gpu = Spec::from_presets("llama-7b", "h100-sxm", "tp=8,pp=1,dp=1").unwrap();
        assert!(is_calibrated(&cpu));
        assert!(!is_calibrated(&gpu));
    }

    #[test]
    fn a_given_calibration_replaces_the_analytic_curves_of_its_device_only() {
        // A device of its own: the registry is process-wide and tests run in parallel.
        let mut h200 = Spec::from_presets("llama-7b", "h200", "tp=8,pp=1,dp=1").unwrap();
        h200.cluster.gpu.name = "calibration-test-gpu".into();
        let h100 = Spec::from_presets("llama-7b", "h100-sxm", "tp=8,pp=1,dp=1").unwrap();
        assert!(!is_calibrated(&h200));
        let mut measured = shipped_calibration("cpu-2core").unwrap();
        measured.device = h200.cluster.gpu.name.clone();
        use_calibration(measured.clone());
        assert!(is_calibrated(&h200));
        assert!(!is_calibrated(&h100));
        assert!(machine_model(&h200)
            .throughput()
            .is_calibrated(OpKind::GemmForward));
        // A second calibration of the device replaces the first.
        measured.source = "second".into();
        use_calibration(measured);
        assert_eq!(calibration_of(&h200).unwrap().source, "second");
    }

    /// The shipped table is of the `cpu` preset's device as it is: a spec that keeps the
    /// device's name but gives it other rates is modelled by the analytic curves, so its step
    /// time follows the rates it gives (and MFU stays below 100%).
    #[test]
    fn the_shipped_calibration_is_not_used_for_a_device_with_other_rates() {
        let cpu = Spec::from_presets("tiny", "cpu", "tp=1,pp=1,dp=1").unwrap();
        assert!(is_calibrated(&cpu));
        for scale in [1e-3, 1e3] {
            let mut other = cpu.clone();
            other.cluster.gpu.peak_flops *= scale;
            assert!(!is_calibrated(&other), "{scale}");
            let mut other = cpu.clone();
            other.cluster.gpu.hbm_bandwidth *= scale;
            assert!(!is_calibrated(&other), "{scale}");
        }
        // Its memory size is no rate of the table's.
        let mut bigger = cpu.clone();
        bigger.cluster.gpu.hbm_bytes *= 2;
        assert!(is_calibrated(&bigger));
    }
}
