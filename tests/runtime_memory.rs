//! The counting allocator, installed as this test binary's global allocator: meters count the
//! bytes their threads allocate, at their peak; a block freed by another thread comes off its
//! owner's meter; reallocation moves the bytes; a finished meter's blocks never touch the meter
//! that reuses its slot.

use slimpack::runtime::cpu::{CountingAllocator, MemoryMeter};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

const MIB: usize = 1 << 20;

#[test]
fn meters_count_their_threads_and_owners_get_their_frees_back() {
    assert!(CountingAllocator::installed());
    let meter = MemoryMeter::new().expect("a free meter");
    let sent = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let _attached = meter.attach();
                let kept = vec![1u8; 3 * MIB];
                let temporary = vec![2u8; 2 * MIB];
                drop(temporary);
                kept
            })
            .join()
            .unwrap()
    });
    // 3 MiB still held (now by this thread), 5 MiB at the peak.
    assert_eq!(meter.current_bytes(), 3 * MIB as i64);
    assert_eq!(meter.peak_bytes(), 5 * MIB as i64);
    drop(sent);
    assert_eq!(meter.current_bytes(), 0);

    let mut grown = {
        let _attached = meter.attach();
        meter.reset_peak();
        vec![0u8; MIB]
    };
    // Growing it outside the meter moves its bytes to the growing thread's meter.
    grown.reserve_exact(4 * MIB);
    assert_eq!(meter.current_bytes(), 0);
    assert_eq!(meter.peak_bytes(), MIB as i64);
    drop(grown);
}

#[test]
fn a_reused_slot_does_not_see_the_old_meters_frees() {
    let old = MemoryMeter::new().unwrap();
    let block = {
        let _attached = old.attach();
        vec![0u8; MIB]
    };
    drop(old);
    // Meters are handed out lowest free slot first: whichever slot the new one gets, the old
    // block's free must not be taken off it.
    let new = MemoryMeter::new().unwrap();
    drop(block);
    assert_eq!(new.current_bytes(), 0);
}
