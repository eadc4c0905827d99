//! libFuzzer over `slimpack::fuzz::ir_text` (see `src/fuzz.rs`); corpus in `fuzz/corpus/ir_text/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| slimpack::fuzz::ir_text(data));
