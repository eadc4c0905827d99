//! What the command-line test files share: running the `slimpack` binary from the workspace
//! root.

use std::io::Write;
use std::process::{Command, Output, Stdio};

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

/// `slimpack` with `input` on its standard input (not every test file uses it).
#[allow(dead_code)]
pub fn slimpack_reading(args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_slimpack"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the slimpack binary runs");
    let mut stdin = child.stdin.take().expect("piped");
    // A command that exits before reading it all closes the pipe: not this test's failure.
    let _ = stdin.write_all(input);
    drop(stdin);
    child.wait_with_output().expect("the slimpack binary runs")
}
