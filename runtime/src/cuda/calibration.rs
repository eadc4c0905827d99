//! Calibration of the machine model on a GPU: the CPU backend's method (`cpu::calibration`),
//! with the GPU's own times. For each token count `n`, one sample of `n` tokens runs as one
//! slice in one pack, forward then backward, through the whole model on GPU 0 — the very code
//! the executor runs — with every launch timed by op class ([`Gpu::profiled`]: the stream is
//! waited for before and after each, so the classes' times add up without overlap). Each
//! class's time is its median over the runs of at least `min_seconds` (three runs at least,
//! after one untimed warm-up run); the tables are then made exactly as the CPU's
//! (`cpu::calibration::tables`), for the cluster preset's GPU name, so that
//! `CostModel::with_calibration` takes them for that preset.

use std::time::Instant;

use slimpack_ir::Spec;
use slimpack_machine::cost::Calibration;

use crate::cpu::calibration::{median, tables, CalibrationOptions};
use crate::cpu::profile::OpTimes;
use crate::cpu::{CpShard, LayerRange, ModelConfig, Params, SampleId, TokenBatch, TokenSlice};

use super::device::{context, gpus, require_cublas, Gpu};
use super::error::Result;
use super::stage::{DeviceStage, RopeTables};
use super::tensors::{DeviceTensors, Layout};
use super::KernelSource;

/// Most runs per point.
const MAX_RUNS: usize = 200;

/// Measures the kernels of `spec`'s model (fp32, one stage, tp 1) on GPU 0 and returns the
/// tables for `spec.cluster`'s GPU.
pub fn measure(
    spec: &Spec,
    options: &CalibrationOptions,
    kernels: &KernelSource,
) -> Result<Calibration> {
    let config = ModelConfig::from_spec(&spec.model)?;
    kernels.check()?;
    let found = gpus()?;
    require_cublas()?;
    let context = context(0)?;
    let stream = context.new_stream()?;
    let mut gpu = Gpu::new(context, stream, kernels)?;
    gpu.start_profile();
    let max_len = options.tokens.iter().copied().max().unwrap_or(0);
    let rope = RopeTables::new(&gpu, &config, max_len)?;
    let weights = Params::init(&config, 1);
    let layout = Layout::of(&weights);
    let params = DeviceTensors::upload(&gpu, &weights)?;
    let grads = DeviceTensors::zeros(&gpu, &layout)?;
    let source = format!(
        "slimpack calibrate --backend cuda on {}: model {}, tp=1, fp32, per-class times with the stream synchronised around each launch, median of runs over at least {} s per point",
        found[0].name, spec.model.name, options.min_seconds
    );
    let bench = Bench {
        gpu: &gpu,
        rope: &rope,
        layout: &layout,
        params: &params,
        grads: &grads,
        config,
    };
    tables(spec, &options.tokens, source, |n| {
        bench.measure_point(n, options.min_seconds)
    })
}

/// What one point's runs need.
struct Bench<'a> {
    gpu: &'a Gpu,
    rope: &'a RopeTables,
    layout: &'a Layout,
    params: &'a DeviceTensors,
    grads: &'a DeviceTensors,
    config: ModelConfig,
}

impl Bench<'_> {
    /// Median per-class forward and backward times of a pack of one `n`-token slice.
    fn measure_point(&self, n: usize, min_seconds: f64) -> Result<(OpTimes, OpTimes)> {
        let batch = TokenBatch::synthetic(&self.config, &[n], 2)?;
        let slice = [TokenSlice {
            sample: SampleId(0),
            start: 0,
            len: n,
        }];
        let start = Instant::now();
        let (mut forward, mut backward) = (Vec::new(), Vec::new());
        for run in 0..=MAX_RUNS {
            let whole = LayerRange::whole(&self.config);
            let mut state =
                DeviceStage::new(&self.config, whole, self.layout.clone(), CpShard::WHOLE);
            self.gpu.take_profile();
            state.forward(
                self.gpu,
                self.rope,
                self.params,
                &batch,
                &slice,
                0,
                None,
                None,
            )?;
            let forward_times = self.gpu.take_profile();
            state.backward(
                self.gpu,
                self.rope,
                self.params,
                self.grads,
                &batch,
                &slice,
                0,
                None,
                None,
            )?;
            let backward_times = self.gpu.take_profile();
            if run == 0 {
                continue;
            }
            forward.push(forward_times);
            backward.push(backward_times);
            if forward.len() >= 3 && start.elapsed().as_secs_f64() >= min_seconds {
                break;
            }
        }
        Ok((median(&forward), median(&backward)))
    }
}
