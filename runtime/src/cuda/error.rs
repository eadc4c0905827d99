//! The CUDA backend's error type.
//!
//! Every variant renders as one line. The first three say why there is no GPU to run on (the
//! build, the driver, the devices); the rest name what failed on a GPU that exists.

use crate::cpu::CpuError;

/// Errors of the CUDA backend.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// This build has no CUDA backend.
    #[error("this build of slimpack has no CUDA backend (built without the `cuda` feature; rebuild with --features cuda)")]
    NotCompiled,
    /// `libcuda.so` (the driver) could not be loaded.
    #[error("no CUDA driver found (libcuda.so could not be loaded)")]
    NoDriver,
    /// The driver loaded but reports no device.
    #[error("no CUDA device found (the CUDA driver reports {detail})")]
    NoDevice { detail: String },
    /// The step has more workers than the machine has GPUs (one GPU per worker).
    #[error("the step needs {needed} GPUs (one per DP rank and pipeline stage), this machine has {found}; {hint}")]
    TooFewDevices {
        needed: usize,
        found: usize,
        hint: &'static str,
    },
    /// A CUDA library the step needs could not be loaded.
    #[error("{library} could not be loaded ({needed_for})")]
    MissingLibrary {
        library: &'static str,
        needed_for: &'static str,
    },
    /// The kernel table handed to the backend lacks a kernel it launches.
    #[error("the PTX module has no kernel {name} (built by a codegen without it)")]
    MissingKernel { name: String },
    /// A kernel's parameters in the table differ from what the backend passes.
    #[error(
        "kernel {name} takes ({table}) in the PTX's table, the CUDA backend passes ({passed})"
    )]
    KernelSignature {
        name: String,
        table: String,
        passed: String,
    },
    /// What the CUDA backend does not run yet.
    #[error("the CUDA backend does not run {what} yet")]
    Unsupported { what: String },
    /// A driver, cuBLAS, NVRTC or NCCL call failed.
    #[error("{api} failed: {message}")]
    Api { api: &'static str, message: String },
    /// The schedule, the batch or the tensors are wrong (the same checks as the CPU backend).
    #[error(transparent)]
    Cpu(#[from] CpuError),
    /// A worker failed; the others were stopped.
    #[error("worker {worker}: {message}")]
    WorkerFailed { worker: String, message: String },
}

impl CudaError {
    /// What a worker reports when it stopped because another one failed (the executor reports
    /// the other's error instead).
    #[cfg(feature = "cuda")]
    pub(crate) fn aborted() -> CudaError {
        CudaError::WorkerFailed {
            worker: "peer".to_string(),
            message: "another worker stopped; the step was abandoned".to_string(),
        }
    }
}

/// Results of the CUDA backend.
pub type Result<T> = std::result::Result<T, CudaError>;
