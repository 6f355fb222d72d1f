//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A model fetched by `scripts/setup`; tests that need one fail (not skip)
/// when it is missing, with the command that fetches it.
pub fn model(rel: &str) -> PathBuf {
    let p = repo().join("samples/models").join(rel);
    assert!(p.exists(), "{} is missing: run scripts/setup", p.display());
    p
}

pub fn smollm2() -> PathBuf {
    model("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// A fresh scratch directory under the target directory.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lfm-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs a binary of this crate with `args`.
pub fn run(bin: &str, args: &[&str]) -> Output {
    Command::new(bin).args(args).output().expect("binary runs")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// Asserts a failed run: exit code 1, one `error:` line naming `needles`,
/// and no panic.
#[track_caller]
pub fn assert_clean_failure(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "expected exit 1, stderr: {err}");
    assert!(!err.contains("panicked"), "panicked: {err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line in: {err}"));
    for n in needles {
        assert!(
            line.contains(n),
            "error line {line:?} does not mention {n:?}"
        );
    }
}

/// Asserts a bad command line: exit code 2, an `error:` line naming
/// `needles`, and no panic.
#[track_caller]
pub fn assert_usage_failure(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "expected exit 2, stderr: {err}");
    assert!(!err.contains("panicked"), "panicked: {err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line in: {err}"));
    for n in needles {
        assert!(
            line.contains(n),
            "error line {line:?} does not mention {n:?}"
        );
    }
}
