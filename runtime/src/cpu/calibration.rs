//! Calibration of the machine model on this machine: the CPU backend measures its own kernels
//! and writes the [`Calibration`] tables the cost model uses for the `cpu` cluster preset.
//!
//! Method: for each token count `n`, one sample of `n` tokens runs as one slice in one pack,
//! forward then backward, through the whole model — the very code the executor runs — and the
//! per-op profile ([`super::profile`]) splits each direction's time into GEMMs, attention and
//! element-wise work. Each table point is the cost model's work for that pack over the measured
//! time of its class, so that the model's formula gives back what was measured:
//! - `gemm-forward` / `gemm-backward`: linear FLOPs of every layer plus the output projection
//!   (`FlopModel`), forward and 2x forward, over the GEMM time, at `n` pack tokens;
//! - `attention-forward` / `attention-backward`: causal attention FLOPs of the slice at prefix
//!   0 (forward, and 2.5x forward), over the attention time, at query length `n`;
//! - `elementwise`: the traffic model's bytes of both directions (`Traffic`) over the rest of
//!   the pack's time (norms, RoPE, SwiGLU, residuals, embedding, loss, copies, allocation).
//!
//! The cost model also charges a fixed overhead per kernel (`DeviceProfile::kernel_overhead_s`
//! times its kernel counts). The CPU's per-op overheads are inside the measured times already,
//! so that charge is taken off the measured time first (from every class in proportion) — the
//! model's total for the pack then equals the measurement. Each class's time is its median over
//! repeated runs that no other process preempted (the thread's CPU time equals its wall time:
//! other processes on a shared machine only ever add time); `threads` copies run at once (as many as the workers the runs will use) so that the
//! rates include the sharing of memory bandwidth and caches between cores.
//!
//! The calibration measured this way for the `cpu` preset's device is shipped with the machine
//! model (`machine/calibration/cpu.json`, `slimpack_machine::shipped_calibration`).

use std::time::Instant;

use slimpack_ir::step::Direction;
use slimpack_ir::Spec;
use slimpack_machine::cost::{
    causal_pairs, Calibration, CalibrationPoint, CalibrationTable, CostModel, OpKind, Traffic,
    BACKWARD_ATTENTION_FACTOR, BACKWARD_LINEAR_FACTOR, EMBEDDING_KERNELS, HEAD_KERNELS,
    KERNELS_PER_LAYER_BACKWARD, KERNELS_PER_LAYER_FORWARD,
};

use super::batch::{SampleId, TokenBatch, TokenSlice};
use super::config::ModelConfig;
use super::error::{CpuError, Result};
use super::params::Params;
use super::profile::{self, OpTimes};
use super::stage::LayerRange;
use super::stage_state::StageState;

/// A run whose thread got less than this share of its wall time on a core was preempted by
/// another process; its times are not the kernels'.
const PREEMPTED: f64 = 0.03;

/// Most runs per point and thread, and most seconds as a multiple of the least.
const MAX_RUNS: usize = 200;
const MAX_TIME_FACTOR: f64 = 10.0;

/// How to measure.
#[derive(Debug, Clone)]
pub struct CalibrationOptions {
    /// Token counts to measure at, increasing.
    pub tokens: Vec<usize>,
    /// Least seconds of repeated runs per point (at least three runs).
    pub min_seconds: f64,
    /// Copies measured at once.
    pub threads: usize,
}

impl Default for CalibrationOptions {
    fn default() -> Self {
        CalibrationOptions {
            tokens: vec![16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192],
            min_seconds: 0.5,
            threads: 1,
        }
    }
}

/// One point's measured seconds per class and direction.
#[derive(Debug, Clone, Copy, Default)]
struct PackTimes {
    forward: OpTimes,
    backward: OpTimes,
}

/// Measures the kernels of `spec`'s model (fp32, one stage, tp 1) and returns the tables.
pub fn measure(spec: &Spec, options: &CalibrationOptions) -> Result<Calibration> {
    let config = ModelConfig::from_spec(&spec.model)?;
    super::exec::keep_freed_memory();
    let source = format!(
        "slimpack calibrate --backend cpu: model {}, tp=1, fp32, {} thread(s) at once, median of unpreempted runs over at least {} s per point",
        spec.model.name, options.threads, options.min_seconds
    );
    tables(spec, &options.tokens, source, |n| {
        measure_point(&config, n, options).map(|t| (t.forward, t.backward))
    })
}

/// The calibration of `spec`'s device from a pack's per-class times: `measure_point(n)` gives
/// the forward and backward [`OpTimes`] of one pack of one `n`-token slice through the whole
/// model, for every `n` of `tokens` (the CUDA backend's calibration measures its own).
pub(crate) fn tables<E>(
    spec: &Spec,
    tokens: &[usize],
    source: String,
    mut measure_point: impl FnMut(usize) -> std::result::Result<(OpTimes, OpTimes), E>,
) -> std::result::Result<Calibration, E> {
    let cost = CostModel::new(spec);
    let flops = cost.flop_model();
    let traffic = Traffic::new(&spec.model, 1, spec.layers_per_chunk());
    let overhead = cost.throughput().profile().kernel_overhead_s;
    let layers = spec.model.layers as f64;
    let kernels_forward = KERNELS_PER_LAYER_FORWARD * layers + EMBEDDING_KERNELS + HEAD_KERNELS;
    let kernels_backward = KERNELS_PER_LAYER_BACKWARD * layers + EMBEDDING_KERNELS + HEAD_KERNELS;
    let mut tables: [Vec<CalibrationPoint>; 5] = Default::default();
    for &n in tokens {
        let (forward, backward) = measure_point(n)?;
        let forward = without_overhead(forward, overhead * kernels_forward);
        let backward = without_overhead(backward, overhead * kernels_backward);
        let tokens = n as f64;
        let linear = (flops.linear_per_token() * layers + flops.head_per_token()) * tokens;
        let attention = flops.attention_per_pair() * causal_pairs(n as u64, 0) as f64 * layers;
        let bytes = tokens
            * (traffic.layer(Direction::Forward) * layers
                + traffic.layer(Direction::Backward) * layers
                + traffic.embedding(Direction::Forward)
                + traffic.embedding(Direction::Backward)
                + traffic.head(Direction::Forward)
                + traffic.head(Direction::Backward));
        let elementwise_s = forward.elementwise_forward_s + backward.elementwise_backward_s;
        let rates = [
            linear / forward.gemm_forward_s,
            BACKWARD_LINEAR_FACTOR * linear / backward.gemm_backward_s,
            attention / forward.attention_forward_s,
            BACKWARD_ATTENTION_FACTOR * attention / backward.attention_backward_s,
            bytes / elementwise_s,
        ];
        for (table, rate) in tables.iter_mut().zip(rates) {
            if rate.is_finite() && rate > 0.0 {
                table.push(CalibrationPoint { tokens, rate });
            }
        }
    }
    let mut calibration = Calibration::new(spec.cluster.gpu.name.clone());
    calibration.source = source;
    for (op, points) in OpKind::ALL.into_iter().zip(tables) {
        if !points.is_empty() {
            let table = CalibrationTable::new(points)
                .expect("measured points are positive and the token counts increase");
            calibration.insert(op, table);
        }
    }
    Ok(calibration)
}

/// `times` with `overhead` seconds taken off, from every class in proportion.
fn without_overhead(times: OpTimes, overhead: f64) -> OpTimes {
    let total = times.total_s();
    let keep = ((total - overhead) / total).max(0.1);
    OpTimes {
        gemm_forward_s: times.gemm_forward_s * keep,
        gemm_backward_s: times.gemm_backward_s * keep,
        attention_forward_s: times.attention_forward_s * keep,
        attention_backward_s: times.attention_backward_s * keep,
        elementwise_forward_s: times.elementwise_forward_s * keep,
        elementwise_backward_s: times.elementwise_backward_s * keep,
        exchange_s: times.exchange_s * keep,
    }
}

/// Median per-class times of a pack of one `n`-token slice, with `threads` copies at once.
fn measure_point(
    config: &ModelConfig,
    n: usize,
    options: &CalibrationOptions,
) -> Result<PackTimes> {
    let params = Params::init(config, 1);
    let batch = TokenBatch::synthetic(config, &[n], 2)?;
    let runs: Vec<Result<Vec<PackTimes>>> = std::thread::scope(|scope| {
        let run = || repeated_runs(config, &params, &batch, options.min_seconds);
        // A copy the system will not start a thread for (a process limit) is an error: the
        // point measures `threads` copies at once.
        let handles: Vec<_> = (0..options.threads.max(1))
            .map(|_| std::thread::Builder::new().spawn_scoped(scope, run))
            .collect();
        handles
            .into_iter()
            .map(|handle| match handle {
                Ok(handle) => handle.join().expect("a calibration thread panicked"),
                Err(error) => Err(CpuError::WorkerFailed {
                    worker: "calibration".into(),
                    message: format!("cannot start a thread: {error}"),
                }),
            })
            .collect()
    });
    let mut all = Vec::new();
    for run in runs {
        all.extend(run?);
    }
    Ok(PackTimes {
        forward: median(&all.iter().map(|t| t.forward).collect::<Vec<_>>()),
        backward: median(&all.iter().map(|t| t.backward).collect::<Vec<_>>()),
    })
}

/// Runs the pack forward and backward until at least three runs ran unpreempted (thread CPU
/// time within [`PREEMPTED`] of wall time) and `min_seconds` passed; returns the clean runs, or
/// every run if fewer than three were clean after [`MAX_RUNS`] runs or [`MAX_TIME_FACTOR`] times
/// `min_seconds` (a point always gets three runs).
fn repeated_runs(
    config: &ModelConfig,
    params: &Params,
    batch: &TokenBatch,
    min_seconds: f64,
) -> Result<Vec<PackTimes>> {
    let slice = [TokenSlice {
        sample: SampleId(0),
        start: 0,
        len: batch.tokens(SampleId(0)).len(),
    }];
    let mut grads = params.zeros_like();
    let start = Instant::now();
    let (mut clean, mut all) = (Vec::new(), Vec::new());
    // One untimed run first: page faults of fresh buffers, instruction caches.
    for run in 0..=MAX_RUNS {
        let mut state = StageState::new(config, LayerRange::whole(config));
        let (wall, cpu) = (Instant::now(), profile::thread_cpu_s());
        profile::take();
        state.forward_pack(params, batch, &slice, &[])?;
        let forward = profile::take();
        state.backward_pack(params, &mut grads, batch, &slice, &[])?;
        let backward = profile::take();
        let (wall, cpu) = (wall.elapsed().as_secs_f64(), profile::thread_cpu_s() - cpu);
        if run == 0 {
            continue;
        }
        let times = PackTimes { forward, backward };
        if cpu >= (1.0 - PREEMPTED) * wall {
            clean.push(times);
        }
        all.push(times);
        let elapsed = start.elapsed().as_secs_f64();
        if clean.len() >= 3 && elapsed >= min_seconds {
            return Ok(clean);
        }
        if all.len() >= 3 && elapsed >= MAX_TIME_FACTOR * min_seconds {
            break;
        }
    }
    Ok(if clean.len() >= 3 { clean } else { all })
}

/// The per-class median of `times` (each class on its own).
pub(crate) fn median(times: &[OpTimes]) -> OpTimes {
    let class = |get: fn(&OpTimes) -> f64| {
        let mut values: Vec<f64> = times.iter().map(get).collect();
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    OpTimes {
        gemm_forward_s: class(|t| t.gemm_forward_s),
        gemm_backward_s: class(|t| t.gemm_backward_s),
        attention_forward_s: class(|t| t.attention_forward_s),
        attention_backward_s: class(|t| t.attention_backward_s),
        elementwise_forward_s: class(|t| t.elementwise_forward_s),
        elementwise_backward_s: class(|t| t.elementwise_backward_s),
        exchange_s: class(|t| t.exchange_s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tiny_measurement_gives_positive_increasing_tables() {
        let mut spec = Spec::from_presets("tiny", "cpu", "tp=1,pp=1,dp=1").unwrap();
        spec.model.layers = 1;
        let options = CalibrationOptions {
            tokens: vec![8, 64],
            min_seconds: 0.0,
            threads: 1,
        };
        let calibration = measure(&spec, &options).unwrap();
        assert_eq!(calibration.device, "cpu-2core");
        for op in OpKind::ALL {
            let points = calibration.tables[&op].points();
            assert_eq!(points.len(), 2, "{op:?}");
            assert!(points.iter().all(|p| p.rate > 0.0));
        }
    }
}
