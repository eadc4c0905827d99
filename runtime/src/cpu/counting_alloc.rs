//! Real peak memory per worker: a counting global allocator with per-thread attribution.
//!
//! [`CountingAllocator`] wraps mimalloc (the process's allocator underneath, counting or not:
//! planning allocates and frees many small tables: glibc's malloc took about 12% of a planned
//! step's instructions, mimalloc about 4%). Each allocation carries a small header
//! naming the [`MemoryMeter`] of the thread that made it, so that its bytes are taken off that
//! meter whichever thread frees it: a tensor a pipeline worker allocates and hands to the next
//! stage stays on the sender's account until the receiver drops it (a send buffer), and never
//! drives the receiver's count below zero. A meter counts the bytes requested (the allocation's
//! size, not the allocator's rounding or the header: what PyTorch's `memory_allocated` counts),
//! live now and at their highest. A thread without a meter of its own counts on meter 0.
//!
//! The binary registers it with `#[global_allocator]`; elsewhere (a library embedding the
//! runtime, most tests) it is not installed and [`CountingAllocator::installed`] says so.
//! Counting costs every allocation a header and a few atomic operations, which commands that
//! execute nothing (compile, plan, bench) should not pay: before its first allocation the
//! process may [`CountingAllocator::pass_through`], after which the allocator is mimalloc
//! unchanged and [`CountingAllocator::installed`] is false. The choice is made once:
//! a block's layout (header or none) must not change between its allocation and its free.
//! Meters are recycled; a generation number in each header keeps the frees of a finished
//! meter's allocations off the meter that reuses its slot.
//!
//! A message between workers changes hands: the sender [`hand_off`]s its buffers when it sends
//! them (in transit they count on the shared meter 0, no worker's) and the receiver [`adopt`]s
//! them when its task takes them, so that each worker's meter holds what that worker holds —
//! the accounting of a point-to-point transfer, where the sender's buffer is released by the
//! send and the receiver's is its own.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};

/// The allocator underneath, counting or not.
use mimalloc::MiMalloc as Backing;

/// Meters that can be live at once (slot 0 is the shared one of threads without a meter).
pub const MAX_METERS: usize = 256;

const HEADER: usize = 16;

static INSTALLED: AtomicBool = AtomicBool::new(false);
/// Set by [`CountingAllocator::pass_through`] before the first allocation: count nothing.
static PASS_THROUGH: AtomicBool = AtomicBool::new(false);
/// Set by the first allocation: from then on the mode is fixed.
static ALLOCATED: AtomicBool = AtomicBool::new(false);
static CURRENT: [AtomicI64; MAX_METERS] = [const { AtomicI64::new(0) }; MAX_METERS];
static PEAK: [AtomicI64; MAX_METERS] = [const { AtomicI64::new(0) }; MAX_METERS];
static GENERATION: [AtomicU32; MAX_METERS] = [const { AtomicU32::new(0) }; MAX_METERS];
/// Slots in use, one bit each.
static IN_USE: [AtomicU64; MAX_METERS / 64] = [
    const { AtomicU64::new(1) },
    const { AtomicU64::new(0) },
    const { AtomicU64::new(0) },
    const { AtomicU64::new(0) },
];

thread_local! {
    /// `(slot, generation)` of the meter this thread's allocations count on.
    static THREAD_METER: Cell<(u32, u32)> = const { Cell::new((0, 0)) };
}

/// The counting allocator; see the module documentation.
#[derive(Debug, Default, Clone, Copy)]
pub struct CountingAllocator;

impl CountingAllocator {
    /// The allocator (register it with `#[global_allocator]`).
    pub const fn new() -> CountingAllocator {
        CountingAllocator
    }

    /// Whether the process allocates through it (meters count nothing otherwise).
    pub fn installed() -> bool {
        INSTALLED.load(Ordering::Relaxed)
    }

    /// Makes the allocator plain mimalloc for the life of the process, counting
    /// nothing. Only possible before the process's first allocation (a process decides this
    /// from its arguments, before `main`); returns whether it took effect.
    pub fn pass_through() -> bool {
        if ALLOCATED.load(Ordering::Relaxed) {
            return false;
        }
        PASS_THROUGH.store(true, Ordering::Relaxed);
        true
    }
}

/// Bytes before the block the caller sees: the header, padded to the block's alignment.
fn prefix(layout: Layout) -> usize {
    layout.align().max(HEADER)
}

fn outer(layout: Layout) -> Option<Layout> {
    let size = layout.size().checked_add(prefix(layout))?;
    Layout::from_size_align(size, layout.align().max(HEADER)).ok()
}

fn current_meter() -> (u32, u32) {
    THREAD_METER.try_with(Cell::get).unwrap_or((0, 0))
}

fn charge(meter: (u32, u32), bytes: usize) {
    let slot = meter.0 as usize;
    if GENERATION[slot].load(Ordering::Relaxed) != meter.1 {
        return;
    }
    let now = CURRENT[slot].fetch_add(bytes as i64, Ordering::Relaxed) + bytes as i64;
    PEAK[slot].fetch_max(now, Ordering::Relaxed);
}

fn refund(meter: (u32, u32), bytes: usize) {
    let slot = meter.0 as usize;
    if GENERATION[slot].load(Ordering::Relaxed) == meter.1 {
        CURRENT[slot].fetch_sub(bytes as i64, Ordering::Relaxed);
    }
}

/// Writes the header of a block and returns the pointer the caller sees.
unsafe fn stamp(base: *mut u8, layout: Layout, meter: (u32, u32)) -> *mut u8 {
    let user = base.add(prefix(layout));
    (user.sub(8) as *mut u64).write(u64::from(meter.0) << 32 | u64::from(meter.1));
    user
}

/// The meter stamped on a block, and its base pointer.
unsafe fn read_stamp(user: *mut u8, layout: Layout) -> ((u32, u32), *mut u8) {
    let word = (user.sub(8) as *const u64).read();
    (((word >> 32) as u32, word as u32), user.sub(prefix(layout)))
}

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.allocate(layout, false)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.allocate(layout, true)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if PASS_THROUGH.load(Ordering::Relaxed) {
            return Backing.dealloc(ptr, layout);
        }
        let (meter, base) = read_stamp(ptr, layout);
        refund(meter, layout.size());
        Backing.dealloc(base, outer(layout).expect("a live block's layout fits"));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if PASS_THROUGH.load(Ordering::Relaxed) {
            return Backing.realloc(ptr, layout, new_size);
        }
        let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
        let Some(new_outer) = outer(new_layout) else {
            return std::ptr::null_mut();
        };
        let (old_meter, base) = read_stamp(ptr, layout);
        let outer_old = outer(layout).expect("a live block's layout fits");
        let moved = Backing.realloc(base, outer_old, new_outer.size());
        if moved.is_null() {
            return moved;
        }
        refund(old_meter, layout.size());
        let meter = current_meter();
        charge(meter, new_size);
        stamp(moved, new_layout, meter)
    }
}

impl CountingAllocator {
    unsafe fn allocate(&self, layout: Layout, zeroed: bool) -> *mut u8 {
        if !ALLOCATED.load(Ordering::Relaxed) {
            ALLOCATED.store(true, Ordering::Relaxed);
        }
        if PASS_THROUGH.load(Ordering::Relaxed) {
            return if zeroed {
                Backing.alloc_zeroed(layout)
            } else {
                Backing.alloc(layout)
            };
        }
        if !INSTALLED.load(Ordering::Relaxed) {
            INSTALLED.store(true, Ordering::Relaxed);
        }
        let Some(outer) = outer(layout) else {
            return std::ptr::null_mut();
        };
        let base = if zeroed {
            Backing.alloc_zeroed(outer)
        } else {
            Backing.alloc(outer)
        };
        if base.is_null() {
            return base;
        }
        let meter = current_meter();
        charge(meter, layout.size());
        stamp(base, layout, meter)
    }
}

/// Moves the bytes of `buffer` onto the calling thread's meter (nothing without the allocator).
pub(crate) fn adopt<T>(buffer: &mut Vec<T>) {
    restamp(buffer, current_meter());
}

/// Moves the bytes of `buffer` onto the shared meter 0 (nothing without the allocator).
pub(crate) fn hand_off<T>(buffer: &mut Vec<T>) {
    restamp(buffer, (0, 0));
}

fn restamp<T>(buffer: &mut Vec<T>, meter: (u32, u32)) {
    if !CountingAllocator::installed() || buffer.capacity() == 0 || size_of::<T>() == 0 {
        return;
    }
    let layout = Layout::array::<T>(buffer.capacity()).expect("a live buffer's layout fits");
    // SAFETY: with the allocator installed every heap block came from `allocate`, so the block
    // behind a non-empty Vec carries a header, and the Vec's pointer has the whole block's
    // provenance.
    unsafe {
        let (old, base) = read_stamp(buffer.as_mut_ptr() as *mut u8, layout);
        refund(old, layout.size());
        charge(meter, layout.size());
        stamp(base, layout, meter);
    }
}

/// A meter: the allocations of the threads that [`MemoryMeter::attach`] it count on it, from
/// zero. Dropping it frees its slot (its blocks still alive then count on nothing).
#[derive(Debug)]
pub struct MemoryMeter {
    slot: u32,
    generation: u32,
}

impl MemoryMeter {
    /// A fresh meter at zero bytes; `None` when [`MAX_METERS`] are live.
    pub fn new() -> Option<MemoryMeter> {
        for (word_index, word) in IN_USE.iter().enumerate() {
            let mut bits = word.load(Ordering::Relaxed);
            while bits != u64::MAX {
                let bit = (!bits).trailing_zeros();
                match word.compare_exchange(
                    bits,
                    bits | 1 << bit,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        let slot = word_index * 64 + bit as usize;
                        let generation = GENERATION[slot].fetch_add(1, Ordering::Relaxed) + 1;
                        CURRENT[slot].store(0, Ordering::Relaxed);
                        PEAK[slot].store(0, Ordering::Relaxed);
                        return Some(MemoryMeter {
                            slot: slot as u32,
                            generation,
                        });
                    }
                    Err(now) => bits = now,
                }
            }
        }
        None
    }

    /// Makes the calling thread's allocations count on this meter until the guard is dropped.
    pub fn attach(&self) -> AttachGuard {
        let previous = THREAD_METER.with(|m| m.replace((self.slot, self.generation)));
        AttachGuard { previous }
    }

    /// Bytes allocated on this meter and not freed.
    pub fn current_bytes(&self) -> i64 {
        CURRENT[self.slot as usize].load(Ordering::Relaxed)
    }

    /// The highest [`MemoryMeter::current_bytes`] since the meter was created or last reset.
    pub fn peak_bytes(&self) -> i64 {
        PEAK[self.slot as usize].load(Ordering::Relaxed)
    }

    /// Restarts the peak from the current bytes.
    pub fn reset_peak(&self) {
        PEAK[self.slot as usize].store(self.current_bytes(), Ordering::Relaxed);
    }
}

impl Drop for MemoryMeter {
    fn drop(&mut self) {
        let slot = self.slot as usize;
        GENERATION[slot].fetch_add(1, Ordering::Relaxed);
        IN_USE[slot / 64].fetch_and(!(1 << (slot % 64)), Ordering::AcqRel);
    }
}

/// Restores the thread's previous meter when dropped.
#[derive(Debug)]
#[must_use = "the thread counts on the meter only while the guard lives"]
pub struct AttachGuard {
    previous: (u32, u32),
}

impl Drop for AttachGuard {
    fn drop(&mut self) {
        THREAD_METER.with(|m| m.set(self.previous));
    }
}
