//! libFuzzer over `slimpack::fuzz::schedule_json` (see `src/fuzz.rs`); corpus in `fuzz/corpus/schedule_json/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| slimpack::fuzz::schedule_json(data));
