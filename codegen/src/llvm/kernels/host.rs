//! Host emulation: the kernels of [`super::KERNELS`], built by the same builder for this host
//! (x86-64) and JIT-compiled, run with the grid turned into loops.
//!
//! The host build of a kernel is `void kernel(const u64 *args, const ThreadContext *thread)`:
//! one call runs one GPU thread. Its parameters come from `args` (one 8-byte slot per parameter,
//! like `cuLaunchKernel`'s argument array), and what the GPU build reads from special registers
//! or does with warp and block instructions goes through the `ThreadContext` the launcher
//! fills: thread, block and grid indices and sizes, the block's shared memory, and callbacks for
//! the block barrier and the warp butterfly shuffle.
//!
//! [`HostKernels::launch`] loops over the grid's blocks one at a time, so one buffer serves as
//! every block's shared memory. Within a block:
//! - [`Grid::GridStride`] kernels never cooperate, so the launcher loops over the block's
//!   threads on the calling thread (their barrier and shuffle callbacks abort: reaching them
//!   would be a bug in the kernel's spec);
//! - [`Grid::BlockPerRow`] kernels reduce over the block (shuffles, shared memory, barriers), so
//!   each of the block's threads runs on its own OS thread, and the callbacks meet at a
//!   [`std::sync::Barrier`]: a shuffle publishes the thread's value, waits, reads its partner's
//!   (`lane ^ mask`, within the warp of 32), and waits again so the next shuffle cannot overwrite
//!   a value still being read. Every thread of a block reaches the same barriers in the same
//!   order, as on the GPU (the kernels' reductions are block-uniform).
//!
//! What the emulation does not reproduce: `ex2.approx`/`lg2.approx` (the host build calls
//! LLVM's `exp2`/`log2`; the PTX ISA bounds the approximations' relative error at about 2⁻²²)
//! and the NVPTX backend's fusing of multiplies and adds into `fma`: last bits, not indexing or
//! control flow. (No kernel uses atomics, whose order would differ too.)

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Barrier;

use inkwell::context::Context;
use inkwell::passes::PassBuilderOptions;
use inkwell::OptimizationLevel;

use super::builder::{Target, MAX_WARPS};
use super::spec::{Grid, KernelSpec, LaunchShape, ParamKind};
use super::{build_all, KERNELS};
use crate::CodegenError;

/// The 8-byte fields of [`ThreadContext`], in order: what the host build of a kernel loads.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ContextField {
    Thread = 0,
    BlockSize = 1,
    Block = 2,
    Grid = 3,
    SharedMemory = 4,
    Barrier = 5,
    Shuffle = 6,
}

/// What one emulated GPU thread sees; laid out as [`ContextField`] numbers it.
#[repr(C)]
struct ThreadContext {
    thread: u64,
    block_size: u64,
    block: u64,
    grid: u64,
    shared_memory: *mut f32,
    barrier: extern "C" fn(*const ThreadContext),
    shuffle: extern "C" fn(*const ThreadContext, f32, i32) -> f32,
    /// The block's meeting point (not read by the kernels, only by the callbacks).
    block_sync: *const BlockSync,
}

/// What the threads of one cooperating block share.
struct BlockSync {
    barrier: Barrier,
    /// One value per thread, for shuffles.
    exchange: Vec<AtomicU32>,
}

extern "C" fn block_barrier(context: *const ThreadContext) {
    // SAFETY: the launcher passes a context whose `block_sync` outlives the kernel call.
    let sync = unsafe { &*(*context).block_sync };
    sync.barrier.wait();
}

extern "C" fn block_shuffle(context: *const ThreadContext, value: f32, lane_mask: i32) -> f32 {
    // SAFETY: as in `block_barrier`.
    let (thread, sync) = unsafe { ((*context).thread as usize, &*(*context).block_sync) };
    sync.exchange[thread].store(value.to_bits(), Ordering::Relaxed);
    sync.barrier.wait();
    let partner = thread ^ lane_mask as usize;
    let other = sync.exchange[partner].load(Ordering::Relaxed);
    sync.barrier.wait();
    f32::from_bits(other)
}

extern "C" fn no_barrier(_: *const ThreadContext) {
    eprintln!("bug: a grid-stride kernel reached a block barrier in the host emulation");
    std::process::abort();
}

extern "C" fn no_shuffle(_: *const ThreadContext, _: f32, _: i32) -> f32 {
    eprintln!("bug: a grid-stride kernel reached a warp shuffle in the host emulation");
    std::process::abort();
}

/// One kernel argument for [`HostKernels::launch`], in the order of the kernel's parameters.
#[derive(Debug)]
pub enum KernelArg<'a> {
    /// A `float*` the kernel only reads.
    F32s(&'a [f32]),
    /// A `float*` the kernel writes (or reads and writes).
    F32sMut(&'a mut [f32]),
    /// An `int32_t*` the kernel reads.
    I32s(&'a [i32]),
    I64(i64),
    F32(f32),
}

impl KernelArg<'_> {
    fn kind(&self) -> ParamKind {
        match self {
            KernelArg::F32s(_) | KernelArg::F32sMut(_) => ParamKind::F32Ptr,
            KernelArg::I32s(_) => ParamKind::I32Ptr,
            KernelArg::I64(_) => ParamKind::I64,
            KernelArg::F32(_) => ParamKind::F32,
        }
    }

    /// The argument's 8-byte slot: an address, an integer, or a float's bits.
    fn slot(&mut self) -> u64 {
        match self {
            KernelArg::F32s(values) => values.as_ptr() as u64,
            KernelArg::F32sMut(values) => values.as_mut_ptr() as u64,
            KernelArg::I32s(values) => values.as_ptr() as u64,
            KernelArg::I64(value) => *value as u64,
            KernelArg::F32(value) => u64::from(value.to_bits()),
        }
    }
}

type HostKernel = unsafe extern "C" fn(*const u64, *const ThreadContext);

/// The JIT-compiled host build of every kernel; see the module comment.
pub struct HostKernels {
    /// The entry address of each kernel, in the order of [`KERNELS`].
    addresses: Vec<usize>,
}

fn launch_error(spec: &KernelSpec, message: impl Into<String>) -> CodegenError {
    CodegenError::KernelLaunch {
        kernel: spec.name.to_string(),
        message: message.into(),
    }
}

fn llvm_error(stage: &'static str, message: impl ToString) -> CodegenError {
    CodegenError::Llvm {
        stage,
        message: message.to_string(),
    }
}

/// Builds every kernel for the host, optimises (`default<O2>`) and JIT-compiles them, and runs
/// `body` while the compiled code lives.
pub fn with_host_kernels<R>(body: impl FnOnce(&HostKernels) -> R) -> Result<R, CodegenError> {
    let machine = crate::llvm::driver::host_machine()?;
    let context = Context::create();
    let module = context.create_module("slimpack_kernels_host");
    module.set_triple(&machine.get_triple());
    module.set_data_layout(&machine.get_target_data().get_data_layout());
    build_all(&context, &module, Target::Host)?;
    module
        .verify()
        .map_err(|e| llvm_error("host kernel verification", e))?;
    module
        .run_passes("default<O2>", &machine, PassBuilderOptions::create())
        .map_err(|e| llvm_error("host kernel optimisation", e))?;
    let engine = module
        .create_jit_execution_engine(OptimizationLevel::Default)
        .map_err(|e| llvm_error("host kernel JIT", e))?;
    let mut addresses = Vec::with_capacity(KERNELS.len());
    for spec in KERNELS {
        let address = engine
            .get_function_address(spec.name)
            .map_err(|e| llvm_error("host kernel JIT", format!("{}: {e}", spec.name)))?;
        addresses.push(address);
    }
    Ok(body(&HostKernels { addresses }))
}

impl HostKernels {
    /// Runs kernel `name` over `shape` with `args`, as a GPU launch would.
    ///
    /// # Safety
    /// The buffers must be as large as the kernel's contract (its module's documentation) needs
    /// for the integer arguments given; the kernel reads and writes them without bounds checks.
    pub unsafe fn launch(
        &self,
        name: &str,
        shape: LaunchShape,
        args: &mut [KernelArg<'_>],
    ) -> Result<(), CodegenError> {
        let index = KERNELS
            .iter()
            .position(|spec| spec.name == name)
            .ok_or_else(|| CodegenError::KernelLaunch {
                kernel: name.to_string(),
                message: "no such kernel".to_string(),
            })?;
        let spec = &KERNELS[index];
        check_args(spec, shape, args)?;
        // SAFETY: the address is the host build of `spec`, whose signature is `HostKernel`.
        let function: HostKernel = unsafe { std::mem::transmute(self.addresses[index]) };
        let slots: Vec<u64> = args.iter_mut().map(KernelArg::slot).collect();
        let mut shared_buffer = vec![0.0f32; MAX_WARPS as usize];
        let shared_memory = shared_buffer.as_mut_ptr();
        for block in 0..u64::from(shape.grid) {
            let context = |thread: u64, sync: &BlockSync| ThreadContext {
                thread,
                block_size: u64::from(shape.block),
                block,
                grid: u64::from(shape.grid),
                shared_memory,
                barrier: block_barrier,
                shuffle: block_shuffle,
                block_sync: sync,
            };
            match spec.grid {
                Grid::GridStride { .. } => {
                    let unused = BlockSync::new(0);
                    for thread in 0..u64::from(shape.block) {
                        let thread_context = ThreadContext {
                            barrier: no_barrier,
                            shuffle: no_shuffle,
                            ..context(thread, &unused)
                        };
                        // SAFETY: the caller vouches for the buffers; the context is complete.
                        unsafe { function(slots.as_ptr(), &thread_context) };
                    }
                }
                Grid::BlockPerRow { .. } => {
                    let sync = BlockSync::new(shape.block as usize);
                    let slots = &slots;
                    std::thread::scope(|scope| {
                        for thread in 0..u64::from(shape.block) {
                            let thread_context = SendContext(context(thread, &sync));
                            scope.spawn(move || {
                                let thread_context = thread_context;
                                // SAFETY: as above; `sync` and the shared memory outlive the
                                // scope, and the threads meet only through the callbacks.
                                unsafe { function(slots.as_ptr(), &thread_context.0) };
                            });
                        }
                    });
                }
            }
        }
        Ok(())
    }
}

/// A [`ThreadContext`] moved to the OS thread that runs it.
struct SendContext(ThreadContext);

// SAFETY: the context's pointers (shared memory, block sync) point to data that outlives the
// block's scoped threads, and the threads touch it only in the kernel's barrier-separated
// phases and through the `BlockSync`'s own synchronisation.
unsafe impl Send for SendContext {}

impl BlockSync {
    fn new(threads: usize) -> BlockSync {
        BlockSync {
            barrier: Barrier::new(threads),
            exchange: (0..threads).map(|_| AtomicU32::new(0)).collect(),
        }
    }
}

/// The arguments match the spec's parameters, and the shape suits its grid.
fn check_args(
    spec: &KernelSpec,
    shape: LaunchShape,
    args: &[KernelArg<'_>],
) -> Result<(), CodegenError> {
    if args.len() != spec.params.len() {
        let message = format!("takes {} arguments, got {}", spec.params.len(), args.len());
        return Err(launch_error(spec, message));
    }
    for (param, arg) in spec.params.iter().zip(args) {
        if param.kind != arg.kind() {
            let message = format!(
                "parameter {} is {:?}, got {:?}",
                param.name,
                param.kind,
                arg.kind()
            );
            return Err(launch_error(spec, message));
        }
    }
    if shape.grid == 0 || shape.block == 0 {
        return Err(launch_error(spec, "an empty grid or block"));
    }
    if matches!(spec.grid, Grid::BlockPerRow { .. })
        && (shape.block % 32 != 0 || shape.block > 32 * MAX_WARPS)
    {
        let message = format!(
            "block size {} is not a multiple of 32 up to 1024",
            shape.block
        );
        return Err(launch_error(spec, message));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_fields_number_the_thread_context() {
        use std::mem::offset_of;
        let offsets = [
            (ContextField::Thread, offset_of!(ThreadContext, thread)),
            (
                ContextField::BlockSize,
                offset_of!(ThreadContext, block_size),
            ),
            (ContextField::Block, offset_of!(ThreadContext, block)),
            (ContextField::Grid, offset_of!(ThreadContext, grid)),
            (
                ContextField::SharedMemory,
                offset_of!(ThreadContext, shared_memory),
            ),
            (ContextField::Barrier, offset_of!(ThreadContext, barrier)),
            (ContextField::Shuffle, offset_of!(ThreadContext, shuffle)),
        ];
        for (field, offset) in offsets {
            assert_eq!(field as usize * 8, offset, "{field:?}");
        }
    }
}
