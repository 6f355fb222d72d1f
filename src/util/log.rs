//! Notices on stderr (which device runs, what was skipped, timings), which
//! `-q/--quiet` silences; errors are always printed.

use std::sync::atomic::{AtomicBool, Ordering};

static QUIET: AtomicBool = AtomicBool::new(false);

/// Silences [`notice`] for the rest of the process (`--quiet`).
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

pub fn is_quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// One line on stderr, unless `--quiet`.
pub fn notice(line: &str) {
    if !is_quiet() {
        eprintln!("{line}");
    }
}

/// `eprintln!` for notices: silenced by `--quiet`.
#[macro_export]
macro_rules! notice {
    ($($arg:tt)*) => {
        $crate::util::log::notice(&format!($($arg)*))
    };
}
