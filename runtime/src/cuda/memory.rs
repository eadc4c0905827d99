//! Device buffers and the worker's memory meter.
//!
//! Every buffer a worker allocates is a [`DeviceVec`] counted on the worker's [`Meter`], by the
//! bytes requested — the CUDA counterpart of the CPU backend's counting allocator, so that peak
//! memory means the same on both backends. Buffers are addressed by raw device pointers: each
//! worker has one context and one stream for its compute (cudarc's cross-stream event tracking
//! is switched off, see [`super::device`]), so the stream's order is the only ordering needed;
//! the NCCL streams are synchronised with it explicitly by the host.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr, ValidAsZeroBits};

use super::error::Result;

/// Bytes a worker holds on its GPU now, and the most it held since the last reset.
#[derive(Debug, Default)]
pub(crate) struct Meter {
    current: AtomicI64,
    peak: AtomicI64,
}

impl Meter {
    fn add(&self, bytes: i64) {
        let now = self.current.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    /// Bytes held now.
    pub fn current_bytes(&self) -> u64 {
        self.current.load(Ordering::Relaxed).max(0) as u64
    }

    /// Most bytes held since the last [`Meter::reset_peak`].
    pub fn peak_bytes(&self) -> u64 {
        self.peak.load(Ordering::Relaxed).max(0) as u64
    }

    /// Starts a new peak from the bytes held now.
    pub fn reset_peak(&self) {
        self.peak
            .store(self.current.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// A buffer of `len` values of `T` on one GPU, counted on its worker's meter.
pub(crate) struct DeviceVec<T = f32> {
    /// Owns the allocation (freed on drop); cudarc's safe API reads it only for NCCL.
    data: CudaSlice<T>,
    ptr: u64,
    len: usize,
    meter: Arc<Meter>,
}

impl<T: DeviceRepr + ValidAsZeroBits> DeviceVec<T> {
    /// `len` zeros.
    pub fn zeros(stream: &Arc<CudaStream>, meter: &Arc<Meter>, len: usize) -> Result<DeviceVec<T>> {
        // A zero-length allocation is not a valid CUDA allocation; one element stands in.
        let data = stream.alloc_zeros::<T>(len.max(1))?;
        Ok(DeviceVec::wrap(stream, meter, data, len))
    }

    /// A copy of `values`.
    pub fn from_host(
        stream: &Arc<CudaStream>,
        meter: &Arc<Meter>,
        values: &[T],
    ) -> Result<DeviceVec<T>> {
        if values.is_empty() {
            return DeviceVec::zeros(stream, meter, 0);
        }
        let data = stream.clone_htod(values)?;
        Ok(DeviceVec::wrap(stream, meter, data, values.len()))
    }

    fn wrap(
        stream: &Arc<CudaStream>,
        meter: &Arc<Meter>,
        data: CudaSlice<T>,
        len: usize,
    ) -> DeviceVec<T> {
        let ptr = {
            // With event tracking off the guard records nothing.
            let (ptr, _no_event) = data.device_ptr(stream);
            ptr
        };
        meter.add((len * std::mem::size_of::<T>()) as i64);
        DeviceVec {
            data,
            ptr,
            len,
            meter: Arc::clone(meter),
        }
    }
}

impl<T> DeviceVec<T> {
    /// The buffer's device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The device address of element `index` (at most `len`: one past the end is a valid
    /// empty range).
    pub fn at(&self, index: usize) -> u64 {
        assert!(
            index <= self.len,
            "bug: element {index} of a device buffer of {}",
            self.len
        );
        self.ptr + (index * std::mem::size_of::<T>()) as u64
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The values `range`, for NCCL's safe API.
    pub fn view_mut(
        &mut self,
        range: std::ops::Range<usize>,
    ) -> cudarc::driver::CudaViewMut<'_, T> {
        assert!(
            range.end <= self.len,
            "bug: {range:?} of a device buffer of {}",
            self.len
        );
        self.data.slice_mut(range)
    }

    /// The whole buffer, for NCCL's safe API.
    pub fn view(&self) -> cudarc::driver::CudaView<'_, T> {
        self.data.slice(0..self.len)
    }
}

impl<T> Drop for DeviceVec<T> {
    fn drop(&mut self) {
        self.meter
            .add(-((self.len * std::mem::size_of::<T>()) as i64));
    }
}

impl<T> std::fmt::Debug for DeviceVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceVec({} values at {:#x})", self.len, self.ptr)
    }
}
