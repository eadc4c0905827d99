//! The CUDA backend of a build without the `cuda` feature: the same functions as the real one
//! (candle's `dummy_cuda_backend`), each failing with [`CudaError::NotCompiled`].

use slimpack_ir::program::Program;
use slimpack_ir::Spec;
use slimpack_machine::cost::Calibration;

use crate::cpu::calibration::CalibrationOptions;
use crate::cpu::exec::{Driver, Execution, Plan};
use crate::cpu::{AdamWConfig, Params, TokenBatch};

use super::{CudaError, GpuInfo, KernelSource, Precision, Result};

/// The machine's GPUs: never any in this build.
pub fn gpus() -> Result<Vec<GpuInfo>> {
    Err(CudaError::NotCompiled)
}

/// Runs one training step on GPUs: not in this build.
#[allow(clippy::too_many_arguments)]
pub fn execute_program(
    _plan: &Plan,
    _program: &Program,
    _driver: &Driver,
    _batch: &TokenBatch,
    _params: &Params,
    _adamw: AdamWConfig,
    _kernels: &KernelSource,
    _precision: Precision,
) -> Result<Execution> {
    Err(CudaError::NotCompiled)
}

/// Measures the GPU's kernels: not in this build.
pub fn calibrate(
    _spec: &Spec,
    _options: &CalibrationOptions,
    _kernels: &KernelSource,
) -> Result<Calibration> {
    Err(CudaError::NotCompiled)
}
