//! Records the commit the binaries are built from, so that a report
//! (scoreboard's header) names the build it measured rather than whatever
//! checkout it happens to run in: `git rev-parse --short HEAD`, with
//! `-dirty` where tracked files differ from it, or `unknown` outside git.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let commit = match git(&["rev-parse", "--short", "HEAD"]) {
        Some(c) => match git(&["status", "--porcelain", "--untracked-files=no"]) {
            Some(changes) if !changes.is_empty() => format!("{c}-dirty"),
            _ => c,
        },
        None => "unknown".into(),
    };
    println!("cargo:rustc-env=LFM_BUILD_COMMIT={commit}");
    // Again when HEAD moves or a tracked source changes.
    let mut watch = vec![
        ".git/HEAD".to_string(),
        ".git/index".into(),
        "src".into(),
        "shaders".into(),
    ];
    if let Some(head) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push(format!(".git/{head}"));
    }
    for p in watch.iter().filter(|p| Path::new(p).exists()) {
        println!("cargo:rerun-if-changed={p}");
    }
}
