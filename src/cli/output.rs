//! Where a command's main output goes: a file given with `-o FILE`, or standard output when
//! none is given or the file is `-` (the convention of Unix tools; before, `-o -` created a
//! file named `-`).

use anyhow::{bail, Context};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};

/// Names of standard output: `-`, and the device files that open descriptor 1 again (writing
/// through one of those beside a second output on standard output would interleave the two).
const STDOUT_NAMES: [&str; 4] = ["-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"];

/// The file `path` names, or `None` for standard output (absent, `-` or `/dev/stdout`).
pub fn file(path: Option<&Path>) -> Option<&Path> {
    path.filter(|path| !STDOUT_NAMES.iter().any(|name| path.as_os_str() == *name))
}

/// Whether `path` means standard output (see [`file`]).
pub fn is_stdout(path: Option<&Path>) -> bool {
    file(path).is_none()
}

/// Why the process cannot write its standard output, as [`see_unwritable_stdout`] saw it at
/// start-up: 0 it can, [`CLOSED`] or [`READ_ONLY`].
static STDOUT_STATE: AtomicU8 = AtomicU8::new(0);
const CLOSED: u8 = 1;
const READ_ONLY: u8 = 2;

/// Runs before `main` (an `.init_array` function, before the standard library's start-up,
/// which reopens a closed descriptor 1 on `/dev/null`): only here is a closed standard output
/// still visible as one.
#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array"]
static SEE_UNWRITABLE_STDOUT: extern "C" fn() = see_unwritable_stdout;

#[cfg(target_os = "linux")]
extern "C" fn see_unwritable_stdout() {
    // SAFETY: `fcntl(F_GETFL)` only queries the descriptor.
    let flags = unsafe { libc::fcntl(1, libc::F_GETFL) };
    let state = match flags {
        -1 => CLOSED,
        _ if flags & libc::O_ACCMODE == libc::O_RDONLY => READ_ONLY,
        _ => return,
    };
    STDOUT_STATE.store(state, Ordering::Relaxed);
}

/// A process started with standard output closed (`>&-`) would write its output to the
/// `/dev/null` the standard library put there, and one started with it open for reading only
/// (`1<file`) would have every write fail with `EBADF`, which the standard library takes for
/// success: both exit 0 with the output lost without a word. Descriptor 1 is pointed at
/// `/dev/full` instead (the file opened for reading is left as it is), so the first write
/// fails, and [`stdout_unwritable`] lets the error say why (exit 2, like any output that
/// cannot be written); a command that writes only files runs as usual. Call it first thing in
/// `main`.
pub fn guard_unwritable_stdout() {
    if stdout_unwritable().is_none() {
        return;
    }
    #[cfg(unix)]
    // SAFETY: `open` and `dup2` make descriptors the process owns, at startup, before any
    // other code uses descriptor 1.
    unsafe {
        let mut full = libc::open(c"/dev/full".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if full == -1 {
            // Without /dev/full: a pipe nobody reads, whose first write ends the process by
            // SIGPIPE (status 141, as a closed pipe does), which loses no output unsaid.
            let mut ends = [0; 2];
            if libc::pipe(ends.as_mut_ptr()) != 0 {
                return;
            }
            libc::close(ends[0]);
            full = ends[1];
        }
        if full != 1 {
            libc::dup2(full, 1);
            libc::close(full);
        }
    }
}

/// Why the process cannot write its standard output, in words (`it is closed`), if it
/// cannot (see [`guard_unwritable_stdout`]).
pub fn stdout_unwritable() -> Option<&'static str> {
    match STDOUT_STATE.load(Ordering::Relaxed) {
        CLOSED => Some("it is closed"),
        READ_ONLY => Some("it is open for reading only"),
        _ => None,
    }
}

/// Writes `text` to `path`, or to standard output (see [`file`]).
pub fn write(path: Option<&Path>, text: &str) -> anyhow::Result<()> {
    write_with(path, |out| out.write_all(text.as_bytes()))
}

/// Streams what `body` writes to `path`, or to standard output (see [`file`]), through a
/// buffer: for an output too large to hold as one string (a million-sample schedule JSON is
/// gigabytes). The buffer is concrete, so a serialiser's many small writes are copies into it;
/// only its flushes go through the file or standard output.
pub fn write_with(
    path: Option<&Path>,
    body: impl FnOnce(&mut Buffered<'_>) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    let (out, name): (Box<dyn Write>, _) = match file(path) {
        Some(path) => (
            Box::new(
                std::fs::File::create(path)
                    .with_context(|| format!("cannot write {}", path.display()))?,
            ),
            path.display().to_string(),
        ),
        None => {
            if let Some(why) = stdout_unwritable() {
                bail!("cannot write to standard output: {why}");
            }
            (
                Box::new(std::io::stdout().lock()),
                "to standard output".into(),
            )
        }
    };
    let mut out = std::io::BufWriter::with_capacity(1 << 16, out);
    body(&mut out)
        .and_then(|()| out.flush())
        .with_context(|| format!("cannot write {name}"))
}

/// The buffered output [`write_with`] hands its writer.
pub type Buffered<'a> = std::io::BufWriter<Box<dyn Write + 'a>>;

/// Refuses, before any work, an output file whose directory does not exist, or that is a
/// directory itself (a measurement that runs for minutes should not fail at its last line,
/// after writing the other outputs asked for).
pub fn check_directory(flag: &str, path: Option<&Path>) -> anyhow::Result<()> {
    let Some(path) = file(path) else {
        return Ok(());
    };
    if path.is_dir() {
        bail!("{flag} {}: is a directory, not a file", path.display());
    }
    let dir = directory_of(path);
    if dir.exists() && !dir.is_dir() {
        bail!(
            "{flag} {}: {} is a file, not a directory",
            path.display(),
            dir.display()
        );
    }
    if !dir.is_dir() {
        bail!(
            "{flag} {}: the directory {} does not exist",
            path.display(),
            dir.display()
        );
    }
    Ok(())
}

/// A file a command reads or writes, named by its flag (`("--batch", path)`).
pub type Named<'a> = (&'a str, Option<&'a Path>);

/// Standard output as an output of [`check_distinct`], when `used`: for what a command prints
/// there itself (`("--report json", stdout_if(json))`).
pub fn stdout_if(used: bool) -> Option<&'static Path> {
    used.then_some(Path::new("-"))
}

/// Refuses, before any work, an output that would overwrite one of the command's inputs (`-o
/// in.txt` beside `--batch in.txt` would replace the dataset) or another of its outputs (the
/// second write would lose the first), standard output (`-`) included: two outputs there would
/// mix; and, as [`check_directory`], an output that is a directory or in none. Absent paths
/// are skipped.
pub fn check_distinct(inputs: &[Named], outputs: &[Named]) -> anyhow::Result<()> {
    for &(flag, path) in outputs {
        check_directory(flag, path)?;
    }
    let on_stdout: Vec<(&str, &Path)> = outputs
        .iter()
        .filter_map(|&(flag, path)| path.filter(|_| is_stdout(path)).map(|path| (flag, path)))
        .collect();
    if let (Some((first, _)), Some(why)) = (on_stdout.first(), stdout_unwritable()) {
        bail!("{first} writes standard output, but {why}; redirect it");
    }
    if let [(first, _), (second, path), ..] = on_stdout[..] {
        bail!(
            "{second} {} and {first} would both write standard output and mix; give {second} \
             a file",
            path.display()
        );
    }
    let outputs: Vec<(&str, &Path)> = outputs
        .iter()
        .filter_map(|&(flag, path)| file(path).map(|path| (flag, path)))
        .collect();
    for (index, &(flag, path)) in outputs.iter().enumerate() {
        let input = inputs
            .iter()
            .filter_map(|&(input_flag, input)| file(input).map(|input| (input_flag, input)))
            .find(|&(_, input)| same_file(path, input));
        if let Some((input_flag, _)) = input {
            bail!(
                "{flag} {}: that is the {input_flag} file, which it would overwrite; write \
                 elsewhere",
                path.display()
            );
        }
        if let Some(&(other, _)) = outputs[..index]
            .iter()
            .find(|&&(_, earlier)| same_file(path, earlier))
        {
            bail!(
                "{flag} {}: {other} writes that file too; give each output its own",
                path.display()
            );
        }
    }
    Ok(())
}

/// Refuses, before any work, a file the command reads or writes that it would overwrite or
/// remove by writing `dir` (given with `flag`), where it owns the files whose names
/// `generated` accepts: `--dump-dir`'s dumps, `plan --out-dir`'s step files.
pub fn check_generated(
    flag: &str,
    dir: Option<&Path>,
    generated: impl Fn(&str) -> bool,
    files: &[Named],
) -> anyhow::Result<()> {
    let Some(dir) = dir else {
        return Ok(());
    };
    let placed = place(dir);
    for &(file_flag, path) in files {
        let Some(path) = file(path) else {
            continue;
        };
        let name = path
            .file_name()
            .and_then(|name| name.to_str())
            .unwrap_or("");
        if generated(name) && place(directory_of(path)) == placed {
            bail!(
                "{file_flag} {}: {flag} {} writes files of that name there; give it a \
                 directory of its own",
                path.display(),
                dir.display()
            );
        }
    }
    Ok(())
}

/// The names of the pass manager's dumps (`00-input.sir`, `NN-<pass>.before.sir`, ...).
pub fn is_dump_name(name: &str) -> bool {
    name.split_once('-')
        .is_some_and(|(number, _)| number.len() >= 2 && number.bytes().all(|b| b.is_ascii_digit()))
        && name.ends_with(".sir")
}

/// Whether two paths name one regular file: the same inode where both exist (links, `./x` and
/// `x`), else the same absolute path with its directory's links resolved. Devices and pipes
/// never clash (`--trace /dev/null --timeline /dev/null` writes nothing twice).
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => {
            if !(a.is_file() && b.is_file()) {
                return false;
            }
            #[cfg(unix)]
            {
                use std::os::unix::fs::MetadataExt;
                (a.dev(), a.ino()) == (b.dev(), b.ino())
            }
            #[cfg(not(unix))]
            {
                false
            }
        }
        (Err(_), Err(_)) => resolved(a) == resolved(b),
        // One exists and the other does not: two files.
        _ => false,
    }
}

/// `path` made absolute, its parent directory canonical when it exists.
fn resolved(path: &Path) -> PathBuf {
    match path.file_name() {
        Some(name) => place(directory_of(path)).join(name),
        None => std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
    }
}

/// A directory as paths are compared: canonical where it exists, else absolute (one not made
/// yet, as `--dump-dir` before the pass manager makes it).
fn place(dir: &Path) -> PathBuf {
    dir.canonicalize()
        .or_else(|_| std::path::absolute(dir))
        .unwrap_or_else(|_| dir.to_path_buf())
}

/// The directory `path` is in (`.` for a bare name).
fn directory_of(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_may_not_be_an_input_or_another_output() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.txt");
        std::fs::write(&input, "1\n").unwrap();
        let same = dir.path().join(".").join("in.txt");
        let fresh = dir.path().join("out.json");
        let stdout = Path::new("-");
        let error = check_distinct(
            &[],
            &[
                ("--report json", stdout_if(true)),
                ("--trace", Some(stdout)),
            ],
        )
        .unwrap_err()
        .to_string();
        assert!(error.starts_with("--trace - and --report json"), "{error}");
        let error = check_distinct(&[("--batch", Some(&input))], &[("-o", Some(&same))])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("-o") && error.contains("--batch file"),
            "{error}"
        );
        // Two outputs naming one file that does not exist yet.
        let error = check_distinct(&[], &[("-o", Some(&fresh)), ("--trace", Some(&fresh))])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("--trace") && error.contains("-o writes"),
            "{error}"
        );
        // Devices never clash.
        let null = Path::new("/dev/null");
        if null.exists() {
            check_distinct(
                &[("--batch", Some(null))],
                &[("-o", Some(null)), ("--trace", Some(null))],
            )
            .unwrap();
        }
        // Distinct files, standard output once and absent paths pass.
        check_distinct(
            &[("--batch", Some(&input)), ("--config", None)],
            &[
                ("-o", Some(&fresh)),
                ("--trace", Some(stdout)),
                ("--timeline", None),
            ],
        )
        .unwrap();
    }
}
