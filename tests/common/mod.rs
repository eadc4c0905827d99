//! What the command-line test files share: running the `slimpack` binary from the workspace
//! root.

use std::process::{Command, Output};

/// Runs `slimpack` with `args` in the workspace root and returns what it did.
pub fn slimpack(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_slimpack"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the slimpack binary runs")
}
