//! What the codegen tests share: the small schedules under `tests/data/`, lowered, and golden
//! files under `tests/golden/` (`SLIMPACK_BLESS=1` rewrites them).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use slimpack_ir::program::{lower, Program};

/// The schedules every emitted form is checked on: a DP-Merge group across two pipeline stages
/// (sends, receives, CP exchanges) and a single stage with two DP ranks.
pub const SCHEDULES: &[&str] = &["merge-pp2-dp3", "single-stage-dp2"];

fn tests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests")
}

/// The lowered program of `tests/data/<name>.sir`.
pub fn program(name: &str) -> Program {
    let path = tests_dir().join("data").join(format!("{name}.sir"));
    let text = std::fs::read_to_string(&path).unwrap();
    let ir = slimpack_ir::text::parse(&text, &path.display().to_string()).unwrap();
    lower(&ir)
}

/// Compares `actual` with `tests/golden/<file>`, or rewrites it under `SLIMPACK_BLESS=1`.
pub fn check_golden(file: &str, actual: &str) {
    let path = tests_dir().join("golden").join(file);
    if std::env::var_os("SLIMPACK_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "no golden file {} (run with SLIMPACK_BLESS=1 to create it)",
            path.display()
        )
    });
    if expected != actual {
        let first_difference = expected
            .lines()
            .zip(actual.lines())
            .position(|(e, a)| e != a)
            .unwrap_or(expected.lines().count().min(actual.lines().count()));
        panic!(
            "{} differs from what is emitted now, first at line {}:\n  expected: {:?}\n  actual:   {:?}\n\
             (SLIMPACK_BLESS=1 rewrites it if the change is intended)",
            path.display(),
            first_difference + 1,
            expected.lines().nth(first_difference),
            actual.lines().nth(first_difference),
        );
    }
}

/// `tool` if it is on PATH; otherwise says the check is skipped.
pub fn tool(tool: &str) -> Option<&str> {
    let found = std::process::Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success());
    if !found {
        eprintln!("{tool} not on PATH: check skipped (scripts/setup.sh installs it)");
    }
    found.then_some(tool)
}

/// Path of the dialect's IRDL definition.
pub fn irdl_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("dialect/slimpack.irdl.mlir")
}
