//! Records the commit the binaries are built from, so that a report
//! (scoreboard's header) names the build it measured rather than whatever
//! checkout it happens to run in: `git rev-parse --short HEAD`, with
//! `-dirty` where the binary's sources differ from it, or `unknown`
//! outside git. Watches only what a build reads and the commit itself (not
//! git's index, which `git status` rewrites: a rebuild each time).

use std::path::Path;
use std::process::Command;

/// What the binaries are built from.
const SOURCES: [&str; 5] = ["src", "shaders", "build.rs", "Cargo.toml", "Cargo.lock"];

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let commit = match git(&["rev-parse", "--short", "HEAD"]) {
        Some(c) => {
            let mut status = vec!["status", "--porcelain", "--untracked-files=no", "--"];
            status.extend(SOURCES);
            match git(&status) {
                Some(changes) if !changes.is_empty() => format!("{c}-dirty"),
                _ => c,
            }
        }
        None => "unknown".into(),
    };
    println!("cargo:rustc-env=LFM_BUILD_COMMIT={commit}");
    // Again when HEAD moves (a checkout, or a commit on its branch) or a
    // source changes; git names its own files (a worktree keeps them
    // outside ./.git).
    let mut watch: Vec<String> = SOURCES.iter().map(|s| s.to_string()).collect();
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    for name in std::iter::once("HEAD").chain(branch.as_deref()) {
        watch.extend(git(&["rev-parse", "--git-path", name]));
    }
    for p in watch.iter().filter(|p| Path::new(p).exists()) {
        println!("cargo:rerun-if-changed={p}");
    }
}
