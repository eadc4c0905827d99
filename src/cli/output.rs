//! Where a command's main output goes: a file given with `-o FILE`, or standard output when
//! none is given or the file is `-` (the convention of Unix tools; before, `-o -` created a
//! file named `-`).

use anyhow::Context;
use std::io::Write;
use std::path::Path;

/// The file `path` names, or `None` for standard output (absent, or `-`).
pub fn file(path: Option<&Path>) -> Option<&Path> {
    path.filter(|path| path.as_os_str() != "-")
}

/// Whether `path` means standard output (see [`file`]).
pub fn is_stdout(path: Option<&Path>) -> bool {
    file(path).is_none()
}

/// Writes `text` to `path`, or to standard output (see [`file`]).
pub fn write(path: Option<&Path>, text: &str) -> anyhow::Result<()> {
    match file(path) {
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
