//! libFuzzer over `slimpack::fuzz::config_toml` (see `src/fuzz.rs`); corpus in `fuzz/corpus/config_toml/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| slimpack::fuzz::config_toml(data));
