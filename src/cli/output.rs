//! Where a command's main output goes: a file given with `-o FILE`, or standard output when
//! none is given or the file is `-` (the convention of Unix tools; before, `-o -` created a
//! file named `-`).

use anyhow::Context;
use std::io::Write;
use std::path::Path;

/// Whether `path` means standard output (absent, or `-`).
pub fn is_stdout(path: Option<&Path>) -> bool {
    path.is_none_or(|path| path.as_os_str() == "-")
}

/// Writes `text` to `path`, or to standard output (see [`is_stdout`]).
pub fn write(path: Option<&Path>, text: &str) -> anyhow::Result<()> {
    match path.filter(|_| !is_stdout(path)) {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
        }
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(text.as_bytes())?;
            stdout.flush()?;
            Ok(())
        }
    }
}
