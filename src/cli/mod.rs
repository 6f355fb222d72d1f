//! One module per tool: a clap `Args` struct and a `run` function. The
//! binaries in `src/bin` and the umbrella `lfm` are thin shims over these.
//!
//! Conventions shared by every tool: results on stdout, progress and timings
//! on stderr, `--json` (or `--format`) for machines, and exit codes
//! 0 success, 1 error (bad input file, failed run), 2 bad command line.

pub mod embed;

use std::io::Write;
use std::process::ExitCode;

/// Exit status for a run that failed (bad input, unusable model, device error).
pub const EXIT_FAILURE: u8 = 1;

/// Runs a tool's `run` and turns its result into an exit code: errors are
/// printed as one line on stderr; a closed stdout (`tool | head`) ends the
/// program quietly with success, as Unix filters do.
pub fn finish(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: {}", one_line(&e));
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// The error and its causes as one line, without repeating a cause that the
/// message above it already quotes.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out.replace('\n', " ")
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The roff man page for a clap command (used by `scripts/man` and the test
/// that keeps `man/` in sync).
pub fn man_page(cmd: clap::Command) -> String {
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd)
        .render(&mut out)
        .expect("rendering to a Vec cannot fail");
    String::from_utf8(out).expect("clap_mangen writes UTF-8")
}
