//! Build-time facts for `windvane version`: the git commit the binary is built from and the target triple,
//! as `WINDVANE_GIT_COMMIT` and `WINDVANE_TARGET`. A build without git or outside a checkout (a source
//! tarball, a container build without `.git`) says `unknown`; `WINDVANE_GIT_COMMIT` set in the environment
//! wins, for builds that know their commit another way.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=WINDVANE_GIT_COMMIT");
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown".to_owned());
    println!("cargo:rustc-env=WINDVANE_TARGET={target}");
    let commit = match std::env::var("WINDVANE_GIT_COMMIT") {
        Ok(commit) if !commit.trim().is_empty() => commit.trim().to_owned(),
        _ => git_commit().unwrap_or_else(|| "unknown".to_owned()),
    };
    println!("cargo:rustc-env=WINDVANE_GIT_COMMIT={commit}");
}

/// `git rev-parse --short=12 HEAD`; `None` without git or a checkout. Asks cargo to run this again when HEAD
/// or the branch it names moves (only files that exist: cargo reruns for a missing one on every build).
fn git_commit() -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    let git_dir = git(&["rev-parse", "--git-dir"]);
    let common_dir = git(&["rev-parse", "--git-common-dir"]);
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    let watched = [
        git_dir.as_ref().map(|d| Path::new(d).join("HEAD")),
        common_dir
            .as_ref()
            .map(|d| Path::new(d).join("packed-refs")),
        common_dir
            .as_ref()
            .zip(branch.as_ref())
            .map(|(d, b)| Path::new(d).join(b)),
    ];
    for path in watched.into_iter().flatten().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    Some(commit)
}
