//! Exit statuses a script can trust, and what makes each.
//!
//! - 0 ([`SUCCESS`]): the command did what was asked (also with `--allow-oom`).
//! - 2 ([`BAD_INPUT`]): bad input; one `error: ...` line names the file, flag or value and what
//!   would be valid. clap's usage errors (unknown flag, missing value) also exit 2, in clap's
//!   own form.
//! - 3 ([`DOES_NOT_FIT`]): the plan does not fit device memory on any candidate (or, with a
//!   strategy, the memory limit); the line gives the best candidate's peak and the capacity.
//!   `plan` writes every step first, then exits 3 if one does not fit device memory (its steps
//!   over the memory limit are re-planned and counted, not refused).
//! - 1 ([`INTERNAL`]): a bug in slimpack: a broken internal invariant panics, and the panic
//!   hook prints one line that says so.
//!
//! A closed standard output (`slimpack passes | head -c1`) ends the process the way it ends
//! `cat` or `yes`: quietly, by SIGPIPE, without a message. An output that cannot be written
//! otherwise (stdout on a full disk or `/dev/full`, or closed before the process started:
//! `>&-`) is an error line and exit 2, whichever subcommand wrote it.

/// The command did what was asked.
pub const SUCCESS: i32 = 0;
/// A bug in slimpack.
pub const INTERNAL: i32 = 1;
/// Bad input (a file, flag or value).
pub const BAD_INPUT: i32 = 2;
/// The plan does not fit device memory on any candidate.
pub const DOES_NOT_FIT: i32 = 3;

/// An error whose exit status is not [`BAD_INPUT`]; anything else in an error chain is bad input.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// The best plan found does not fit device memory (exit 3).
    #[error("{0}")]
    DoesNotFit(String),
}

/// The exit status of a command that failed with `error`.
pub fn status_of(error: &anyhow::Error) -> i32 {
    match error
        .chain()
        .find_map(|cause| cause.downcast_ref::<Failure>())
    {
        Some(Failure::DoesNotFit(_)) => DOES_NOT_FIT,
        None => BAD_INPUT,
    }
}

/// Restores the default action of SIGPIPE, which Rust's runtime ignores: a write to a closed
/// pipe then ends the process quietly, as it ends other command-line tools, instead of failing
/// every `print!` with "Broken pipe".
pub fn quiet_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to SIG_DFL at startup, before any thread exists,
    // installs no handler and touches no Rust state.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn status_follows_the_failure_anywhere_in_the_chain() {
        let plain = anyhow::anyhow!("--context: must be positive");
        assert_eq!(status_of(&plain), BAD_INPUT);
        let oom = anyhow::Error::from(Failure::DoesNotFit("peaks at 90 GiB".into()));
        assert_eq!(status_of(&oom), DOES_NOT_FIT);
        let wrapped: anyhow::Result<()> = Err(oom).context("step.json");
        assert_eq!(status_of(&wrapped.unwrap_err()), DOES_NOT_FIT);
    }
}
