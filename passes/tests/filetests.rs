//! The filetest runner: text IR in, expected text out.
//!
//! Each `tests/filetests/**/*.sir` file holds a header of `//` comment lines, the input IR, a
//! separator line `// ----- expected -----`, and the expected output: the printed IR after the
//! passes, or the one-line error (`error: ...`) when parsing, a pass or the verifier fails.
//! Header directives:
//!
//! - `// passes: PIPELINE` — the pipeline to run (default: none; the input is parsed, verified
//!   and printed back);
//! - `// no-verify` — do not run the verifier.
//!
//! `SLIMPACK_BLESS=1 cargo test -p slimpack-passes --test filetests` rewrites the expected
//! sections from the actual output; review the diff before committing it. The files live in the
//! workspace's `tests/filetests/`; the runner lives in this crate because it needs only the IR
//! and the passes.

use std::path::{Path, PathBuf};

use slimpack_ir::text;
use slimpack_passes::{parse_pipeline, run_pipeline, ManagerOptions};

const SEPARATOR: &str = "// ----- expected -----";

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/filetests");
    let mut files = Vec::new();
    collect(&root, &mut files);
    files.sort();
    let bless = std::env::var_os("SLIMPACK_BLESS").is_some();
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let (mut passed, mut failed, mut blessed) = (0, 0, 0);
    for file in &files {
        let name = file.strip_prefix(&root).unwrap().display().to_string();
        if filter.as_ref().is_some_and(|f| !name.contains(f.as_str())) {
            continue;
        }
        let content = std::fs::read_to_string(file).unwrap();
        let (input, expected) = match content.split_once(&format!("\n{SEPARATOR}\n")) {
            Some((input, expected)) => (format!("{input}\n"), Some(expected.to_string())),
            None => (content.clone(), None),
        };
        let actual = run(&input, &name);
        if expected.as_deref() == Some(actual.as_str()) {
            passed += 1;
        } else if bless {
            std::fs::write(file, format!("{}{SEPARATOR}\n{actual}", input)).unwrap();
            blessed += 1;
        } else {
            failed += 1;
            eprintln!(
                "FAIL {name}\n--- expected\n{}\n--- actual\n{actual}",
                expected.unwrap_or_default()
            );
        }
    }
    eprintln!("filetests: {passed} passed, {failed} failed, {blessed} blessed");
    assert!(
        passed + failed + blessed > 0 || filter.is_some(),
        "no filetests found under {}",
        root.display()
    );
    if failed > 0 {
        std::process::exit(1);
    }
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, files);
        } else if path.extension().is_some_and(|e| e == "sir") {
            files.push(path);
        }
    }
}

/// Runs one test: the printed IR, or `error: ...` with a trailing newline.
fn run(input: &str, name: &str) -> String {
    let directive = |key: &str| {
        input
            .lines()
            .take_while(|l| l.starts_with("//"))
            .find_map(|l| {
                l.strip_prefix(&format!("// {key}"))
                    .map(|v| v.trim().to_string())
            })
    };
    let pipeline = directive("passes:").unwrap_or_default();
    let options = ManagerOptions {
        verify: directive("no-verify").is_none(),
        ..ManagerOptions::default()
    };
    let result = (|| -> Result<String, Box<dyn std::error::Error>> {
        let pipeline = parse_pipeline(&pipeline)?;
        let mut ir = text::parse(input, name)?;
        run_pipeline(&mut ir, &pipeline, &options, &mut std::io::sink())?;
        Ok(text::print(&ir))
    })();
    match result {
        Ok(printed) => printed,
        Err(error) => format!("error: {error}\n"),
    }
}
