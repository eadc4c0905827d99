//! What this machine can hold: the up-front memory estimate that a CPU run or a calibration is
//! refused on, before it allocates.
//!
//! The estimate is the simulator's: the predicted peak of every worker (each a device of the
//! `cpu` preset, all sharing this machine's memory), summed. The bound is the memory the
//! operating system reports available (`MemAvailable` in `/proc/meminfo`); where it reports
//! none, nothing is refused.

use slimpack_ir::batch::Batch;
use slimpack_ir::Spec;
use slimpack_machine::sim::{self, Metrics};

use crate::compile::{compile, CompileOptions};

/// A job that would not fit this machine's memory.
#[derive(Debug, thiserror::Error)]
#[error("{what} needs about {needed} of memory by the simulator's estimate, but this machine has {available} available")]
pub struct OutOfHostMemory {
    pub what: String,
    pub needed: Gib,
    pub available: Gib,
}

/// Bytes shown as GiB.
#[derive(Debug, Clone, Copy)]
pub struct Gib(pub u64);

impl std::fmt::Display for Gib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.2} GiB", self.0 as f64 / (1u64 << 30) as f64)
    }
}

/// Memory the operating system reports available, in bytes (`None` where it does not say).
pub fn available_memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// Refuses `needed` bytes for `what` when they exceed the available memory.
pub fn check_fits(what: &str, needed: u64) -> Result<(), OutOfHostMemory> {
    match available_memory_bytes() {
        Some(available) if needed > available => Err(OutOfHostMemory {
            what: what.to_string(),
            needed: Gib(needed),
            available: Gib(available),
        }),
        _ => Ok(()),
    }
}

/// Memory all workers of a simulated step hold at their peaks together (every device of the
/// step is a worker on this machine).
pub fn workers_peak_bytes(metrics: &Metrics) -> u64 {
    metrics
        .peak_memory_per_device
        .iter()
        .fold(0u64, |sum, &bytes| sum.saturating_add(bytes))
}

/// The predicted peak of one worker running a single pack of `tokens` tokens forward and
/// backward on `spec`'s model at tp=pp=dp=1: what each copy of a calibration holds.
pub fn single_pack_peak_bytes(spec: &Spec, tokens: u32) -> anyhow::Result<u64> {
    let mut spec = spec.clone();
    spec.parallel = "tp=1,pp=1,dp=1".parse()?;
    let batch = Batch::from_lengths(&[tokens], None, "calibration");
    let options = CompileOptions {
        pipeline: "assign-dp,pack-symmetric,schedule-pipeline".to_string(),
        ..CompileOptions::default()
    };
    let compiled = compile(&spec, &batch, &options, &mut std::io::sink())?;
    let result = sim::simulate(&compiled.ir, &slimpack_machine::machine_model(&spec))?;
    Ok(result.metrics.peak_memory_bytes)
}
