//! libFuzzer over `slimpack::fuzz::pipeline` (see `src/fuzz.rs`); corpus in `fuzz/corpus/pipeline/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| slimpack::fuzz::pipeline(data));
