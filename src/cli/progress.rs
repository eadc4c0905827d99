//! Progress on stderr while it is a terminal; hidden otherwise (a pipe, a file, CI), so that a
//! log holds results only.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// A spinner that counts up (for work whose size is not known in advance).
pub(crate) fn spinner(template: &str) -> ProgressBar {
    styled(ProgressBar::new_spinner(), template)
}

/// A bar of `len` units (it can grow with `inc_length`).
pub(crate) fn bar(len: u64, template: &str) -> ProgressBar {
    styled(ProgressBar::new(len), template)
}

fn styled(bar: ProgressBar, template: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}
