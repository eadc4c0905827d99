//! libFuzzer over `slimpack::fuzz::lengths` (see `src/fuzz.rs`); corpus in `fuzz/corpus/lengths/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| slimpack::fuzz::lengths(data));
