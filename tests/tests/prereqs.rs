//! `tests/prereqs.sh`, the set-up check that `tests/run` and `./demo` run before they build anything, run
//! on a machine that lacks things: a PATH holding only the few programs the script itself uses. It must
//! name every missing piece with the install line, exit non-zero, and install nothing with `--check` or
//! `WINDVANE_NO_INSTALL=1`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The programs the script itself runs; every other program is missing on the bare PATH.
const SCRIPT_TOOLS: &[&str] = &["sed", "sort", "head", "cut", "id"];

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("prereqs.sh")
}

/// A directory with links to the script's own tools and nothing else.
fn bare_path() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temporary directory");
    for tool in SCRIPT_TOOLS {
        let found = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(tool))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{tool} is not in /usr/bin or /bin"));
        std::os::unix::fs::symlink(found, dir.path().join(tool)).expect("symlink");
    }
    dir
}

/// A stand-in `apt-get` on the bare PATH that records its arguments in `apt-get.log` beside it: the
/// script must never reach the real one from a test.
fn record_apt_get(dir: &Path) {
    let fake = dir.join("apt-get");
    let log = dir.join("apt-get.log");
    std::fs::write(
        &fake,
        format!("#!/bin/bash\necho \"$*\" >> '{}'\n", log.display()),
    )
    .expect("write apt-get");
    let mut permissions = std::fs::metadata(&fake).expect("stat").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&fake, permissions).expect("chmod");
}

fn apt_get_calls(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("apt-get.log")).unwrap_or_default()
}

fn run_bare(args: &[&str], envs: &[(&str, &str)]) -> Output {
    run_in(&bare_path(), args, envs)
}

fn run_in(path: &tempfile::TempDir, args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut command = Command::new("/bin/bash");
    command
        .arg(script())
        .args(args)
        .env_clear()
        .env("PATH", path.path());
    for (key, value) in envs {
        command.env(key, value);
    }
    command.output().expect("running tests/prereqs.sh")
}

#[test]
fn a_bare_machine_is_told_every_missing_piece_and_the_install_line() {
    let output = run_bare(&["--check", "tests"], &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    for piece in [
        "Go 1.26",
        "Rust 1.95",
        "cc (",
        "openssl (",
        "chromium (",
        "wrk (",
    ] {
        assert!(stderr.contains(piece), "{piece:?} not named in:\n{stderr}");
    }
    let install = stderr
        .lines()
        .find(|l| l.contains("apt-get install"))
        .unwrap_or_else(|| panic!("no install line in:\n{stderr}"));
    for package in ["build-essential", "openssl", "chromium", "wrk"] {
        assert!(
            install.split_whitespace().any(|w| w == package),
            "{package} missing from {install:?}"
        );
    }
}

#[test]
fn the_demo_needs_only_the_toolchains_and_a_compiler() {
    let output = run_bare(&["--check", "demo"], &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("build-essential"), "{stderr}");
    for not_needed in ["chromium", "wrk", "openssl", "postgresql"] {
        assert!(!stderr.contains(not_needed), "{not_needed} in:\n{stderr}");
    }
}

#[test]
fn no_install_is_attempted_when_told_not_to() {
    for (args, envs) in [
        (&["tests"][..], &[("WINDVANE_NO_INSTALL", "1")][..]),
        (&["--check", "tests"][..], &[][..]),
    ] {
        let path = bare_path();
        record_apt_get(path.path());
        let output = run_in(&path, args, envs);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(apt_get_calls(path.path()), "", "{args:?} ran apt-get");
        assert!(stderr.contains("needs what this machine lacks"), "{stderr}");
    }
}

#[test]
fn as_root_on_debian_the_missing_packages_are_installed() {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout == b"0\n");
    if !matches!(root, Ok(true)) || !Path::new("/etc/debian_version").exists() {
        eprintln!("skipped: the script installs only as root on Debian, and this is neither");
        return;
    }
    let path = bare_path();
    record_apt_get(path.path());
    let output = run_in(&path, &["tests"], &[]);
    let calls = apt_get_calls(path.path());
    let install = calls
        .lines()
        .find(|l| l.starts_with("install "))
        .unwrap_or_else(|| panic!("apt-get install not called; calls: {calls:?}"));
    for package in ["build-essential", "openssl", "chromium", "wrk"] {
        assert!(
            install.split_whitespace().any(|w| w == package),
            "{install}"
        );
    }
    // The toolchains are not Debian's to install: still missing, so the script still fails, naming them.
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("Go 1.26") && stderr.contains("Rust 1.95"),
        "{stderr}"
    );
}

#[test]
fn a_wrong_purpose_is_a_usage_error() {
    let output = run_bare(&["everything"], &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("usage: tests/prereqs.sh"));
}
