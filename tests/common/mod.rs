//! What the command-line test files share: running the `slimpack` binary from the workspace
//! root.

use std::process::{Command, Output};

/// Runs `slimpack` with `args` in the workspace root and returns what it did (without the
/// caller's `RUST_BACKTRACE`, under which a panic prints Rust's report instead of slimpack's
/// one error line).
pub fn slimpack(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_slimpack"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("the slimpack binary runs")
}

/// `command` with the tiny model on the cpu preset with `parallel`, then `extra` (not every
/// test file uses it).
#[allow(dead_code)]
pub fn on_tiny<'a>(command: &'a str, parallel: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        command,
        "--model",
        "tiny",
        "--cluster",
        "cpu",
        "--parallel",
        parallel,
    ];
    args.extend_from_slice(extra);
    args
}
