//! The `windvane` binary as the CLI tests run it: its output when it succeeds, its error when it fails.

use std::process::{Command, Output};

pub fn windvane(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_windvane"))
        .args(args)
        .output()
        .expect("windvane runs")
}

/// Runs `windvane args`, asserting it succeeds; its stdout.
pub fn ok(args: &[&str]) -> String {
    let out = windvane(args);
    assert!(
        out.status.success(),
        "windvane {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// Runs `windvane args`, asserting it fails; its stderr.
pub fn fails(args: &[&str]) -> String {
    let out = windvane(args);
    assert!(
        !out.status.success(),
        "windvane {args:?} should have failed"
    );
    String::from_utf8(out.stderr).expect("utf-8 output")
}
