//! Finding the GPUs, and one worker's handle on its GPU ([`Gpu`]): context, stream, cuBLAS,
//! the loaded kernels and the memory meter.
//!
//! cudarc loads `libcuda.so` on the first driver call and panics when it is absent, so [`gpus`]
//! asks [`cudarc::driver::sys::is_culib_present`] first: a machine without a driver gets
//! [`CudaError::NoDriver`], one whose driver sees no device [`CudaError::NoDevice`]. cuBLAS,
//! NVRTC and NCCL are checked the same way before their first use.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Instant;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaStream, DriverError};

use crate::cpu::profile::OpTimes;

use super::error::{CudaError, Result};
use super::kernels::Kernels;
use super::memory::{DeviceVec, Meter};
use super::{GpuInfo, KernelSource, Precision};

impl From<DriverError> for CudaError {
    fn from(error: DriverError) -> CudaError {
        CudaError::Api {
            api: "the CUDA driver",
            message: error.to_string(),
        }
    }
}

impl From<cudarc::cublas::result::CublasError> for CudaError {
    fn from(error: cudarc::cublas::result::CublasError) -> CudaError {
        CudaError::Api {
            api: "cuBLAS",
            message: format!("{error:?}"),
        }
    }
}

impl From<cudarc::nccl::result::NcclError> for CudaError {
    fn from(error: cudarc::nccl::result::NcclError) -> CudaError {
        CudaError::Api {
            api: "NCCL",
            message: format!("{error:?}"),
        }
    }
}

/// Fails with [`CudaError::NoDriver`] unless the driver library can be loaded.
fn require_driver() -> Result<()> {
    // SAFETY: only tries to open the library (dlopen); nothing is called in it.
    match unsafe { cudarc::driver::sys::is_culib_present() } {
        true => Ok(()),
        false => Err(CudaError::NoDriver),
    }
}

/// Fails with [`CudaError::MissingLibrary`] unless cuBLAS can be loaded.
pub(crate) fn require_cublas() -> Result<()> {
    // SAFETY: as in `require_driver`.
    match unsafe { cudarc::cublas::sys::is_culib_present() } {
        true => Ok(()),
        false => Err(CudaError::MissingLibrary {
            library: "libcublas.so",
            needed_for: "the GEMMs",
        }),
    }
}

/// Fails with [`CudaError::MissingLibrary`] unless NVRTC can be loaded.
pub(crate) fn require_nvrtc() -> Result<()> {
    // SAFETY: as in `require_driver`.
    match unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        true => Ok(()),
        false => Err(CudaError::MissingLibrary {
            library: "libnvrtc.so",
            needed_for: "compiling the AdamW kernel",
        }),
    }
}

/// Fails with [`CudaError::MissingLibrary`] unless NCCL can be loaded.
pub(crate) fn require_nccl() -> Result<()> {
    // SAFETY: as in `require_driver`.
    match unsafe { cudarc::nccl::sys::is_culib_present() } {
        true => Ok(()),
        false => Err(CudaError::MissingLibrary {
            library: "libnccl.so",
            needed_for: "exchanging tensors between GPUs",
        }),
    }
}

/// The GPUs the driver reports, in ordinal order; [`CudaError::NoDriver`] or
/// [`CudaError::NoDevice`] when there are none.
pub fn gpus() -> Result<Vec<GpuInfo>> {
    require_driver()?;
    let count = CudaContext::device_count().map_err(|e| CudaError::NoDevice {
        detail: e.to_string(),
    })?;
    if count <= 0 {
        return Err(CudaError::NoDevice {
            detail: "0 devices".to_string(),
        });
    }
    (0..count as usize)
        .map(|ordinal| {
            let context = CudaContext::new(ordinal)?;
            let (major, minor) = context.compute_capability()?;
            Ok(GpuInfo {
                ordinal,
                name: context.name()?,
                compute_capability: (major as u32, minor as u32),
                memory_bytes: context.total_mem()? as u64,
            })
        })
        .collect()
}

/// A context on GPU `ordinal` with its cross-stream event tracking off (each worker computes
/// on one stream; see [`super::memory`]).
pub(crate) fn context(ordinal: usize) -> Result<Arc<CudaContext>> {
    let context = CudaContext::new(ordinal)?;
    // SAFETY: called before any buffer or stream of the context exists; the backend orders
    // its streams itself (one compute stream per worker, host synchronisation with NCCL's).
    unsafe { context.disable_event_tracking() };
    Ok(context)
}

/// One worker's GPU: everything its ops launch work through.
pub(crate) struct Gpu {
    /// The worker's compute stream (it holds the context).
    pub stream: Arc<CudaStream>,
    pub blas: CudaBlas,
    pub kernels: Kernels,
    pub meter: Arc<Meter>,
    /// The GEMMs' precision (fp32 unless the run asked for bf16).
    pub precision: Precision,
    /// Per-class times of the work launched (calibration only: every timed launch waits for
    /// the stream before and after).
    profile: Option<RefCell<Profile>>,
}

/// What the work being launched belongs to, for [`Gpu::profiled`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpClass {
    Gemm,
    Attention,
    Elementwise,
}

#[derive(Debug, Default)]
struct Profile {
    backward: bool,
    times: OpTimes,
}

impl Gpu {
    /// The worker's handle on `context` with compute stream `stream`: loads the kernels of
    /// `source` (and compiles AdamW) into the context and binds cuBLAS to the stream.
    pub fn new(
        context: Arc<CudaContext>,
        stream: Arc<CudaStream>,
        source: &KernelSource,
    ) -> Result<Gpu> {
        context.bind_to_thread()?;
        let kernels = Kernels::load(&context, source)?;
        let blas = CudaBlas::new(Arc::clone(&stream))?;
        Ok(Gpu {
            stream,
            blas,
            kernels,
            meter: Arc::new(Meter::default()),
            precision: Precision::Fp32,
            profile: None,
        })
    }

    /// Starts timing the work launched by op class (calibration).
    pub fn start_profile(&mut self) {
        self.profile = Some(RefCell::new(Profile::default()));
    }

    /// Says whether the work launched next belongs to a backward pass (for the profile).
    pub fn set_backward(&self, backward: bool) {
        if let Some(profile) = &self.profile {
            profile.borrow_mut().backward = backward;
        }
    }

    /// The per-class times since the last call (zero unless profiling).
    pub fn take_profile(&self) -> OpTimes {
        self.profile
            .as_ref()
            .map(|p| std::mem::take(&mut p.borrow_mut().times))
            .unwrap_or_default()
    }

    /// Runs `launch`; when profiling, waits for the stream before and after and adds the time
    /// to `class` in the current direction.
    pub fn profiled(&self, class: OpClass, launch: impl FnOnce() -> Result<()>) -> Result<()> {
        let Some(profile) = &self.profile else {
            return launch();
        };
        self.synchronize()?;
        let clock = Instant::now();
        launch()?;
        self.synchronize()?;
        let seconds = clock.elapsed().as_secs_f64();
        let mut profile = profile.borrow_mut();
        let backward = profile.backward;
        let times = &mut profile.times;
        let slot = match (class, backward) {
            (OpClass::Gemm, false) => &mut times.gemm_forward_s,
            (OpClass::Gemm, true) => &mut times.gemm_backward_s,
            (OpClass::Attention, false) => &mut times.attention_forward_s,
            (OpClass::Attention, true) => &mut times.attention_backward_s,
            (OpClass::Elementwise, false) => &mut times.elementwise_forward_s,
            (OpClass::Elementwise, true) => &mut times.elementwise_backward_s,
        };
        *slot += seconds;
        Ok(())
    }

    /// `len` zeros on this GPU.
    pub fn zeros(&self, len: usize) -> Result<DeviceVec> {
        DeviceVec::zeros(&self.stream, &self.meter, len)
    }

    /// A copy of `values` on this GPU.
    pub fn upload<T>(&self, values: &[T]) -> Result<DeviceVec<T>>
    where
        T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits,
    {
        DeviceVec::from_host(&self.stream, &self.meter, values)
    }

    /// The values `range` of `buffer`, on the host (waits for the stream).
    pub fn download(&self, buffer: &DeviceVec, range: std::ops::Range<usize>) -> Result<Vec<f32>> {
        let mut host = vec![0.0f32; range.len()];
        if !host.is_empty() {
            // SAFETY: `range` lies in `buffer` (`at` checks its end), `host` has its length.
            unsafe {
                cudarc::driver::result::memcpy_dtoh_async(
                    &mut host,
                    buffer.at(range.start),
                    self.stream.cu_stream(),
                )
            }?;
            let _ = buffer.at(range.end);
        }
        self.stream.synchronize()?;
        Ok(host)
    }

    /// Copies `len` floats from element `from` of `source` to element `to` of `target`, on
    /// the stream.
    pub fn copy(
        &self,
        source: &DeviceVec,
        from: usize,
        target: &DeviceVec,
        to: usize,
        len: usize,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let (src, dst) = (source.at(from), target.at(to));
        let _ = (source.at(from + len), target.at(to + len));
        self.profiled(OpClass::Elementwise, || {
            // SAFETY: both ranges lie in their buffers, which outlive the stream's use of them
            // (a buffer is freed on the same stream, after the ops that used it).
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(
                    dst,
                    src,
                    len * 4,
                    self.stream.cu_stream(),
                )
            }?;
            Ok(())
        })
    }

    /// Waits for everything enqueued on the compute stream.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize()?;
        Ok(())
    }
}
