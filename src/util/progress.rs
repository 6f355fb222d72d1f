//! Progress bars on stderr, shown only when stderr is a terminal so pipes and
//! logs stay clean.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// A bar over `len` steps labelled `what`; hidden when stderr is not a terminal.
pub fn bar(len: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() || super::log::is_quiet() {
        return ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden());
    }
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(
            "{msg:>12} [{bar:30}] {pos}/{len} {elapsed_precise} eta {eta}",
        )
        .expect("static progress template")
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// A counter of steps whose total is not known in advance, labelled `what`;
/// hidden when stderr is not a terminal.
pub fn counter(what: &str, unit: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() || super::log::is_quiet() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new_spinner();
    pb.set_style(
        ProgressStyle::with_template(&format!(
            "{{msg:>12}} {{spinner}} {{pos}} {unit} {{elapsed_precise}}"
        ))
        .expect("static progress template"),
    );
    pb.set_message(what.to_string());
    pb
}
