//! The benchmark's source-server sections, run for a few seconds with a tiny load (`bench --smoke`) against
//! the debug build of `windvane-server` and Debian's nginx: the benchmark's own logic (servers started, 304s
//! compared, heartbeats offered and counted after a SIGKILL, simulated agents enrolled and converging on a
//! publish, simulated agents holding long polls and woken by a publish, the same heartbeats through HAProxy to
//! two replicas on a real PostgreSQL, simulated agents taking a release wave by wave behind the server's
//! gate) keeps working. The figures mean nothing at this size and in a debug build; the full run is
//! `cargo run --release -p windvane-tests --bin bench`.

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;
use windvane_tests::process::binary;

#[test]
fn the_server_sections_of_the_benchmark_run_and_report() -> anyhow::Result<()> {
    let server = binary("windvane-server")?;
    let dir = tempfile::tempdir()?;
    let json = dir.path().join("bench.json");
    let output = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args([
            "--smoke",
            "--only",
            "pointer-304,heartbeat,heartbeat-replicas,convergence,long-poll,waves",
        ])
        .args([
            "--agents",
            "40",
            "--poll-interval",
            "2s",
            "--heartbeat-rate",
            "200",
        ])
        .arg("--server")
        .arg(&server)
        .arg("--json")
        .arg(&json)
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "bench failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let document: Value = serde_json::from_slice(&std::fs::read(&json)?)?;
    let rows: BTreeMap<&str, &Value> = document["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| (r["key"].as_str().expect("key"), r))
        .collect();
    let value = |key: &str| -> f64 {
        rows.get(key)
            .and_then(|r| r["windvane"].as_f64())
            .unwrap_or_else(|| panic!("no row {key} in:\n{stdout}"))
    };
    let baseline = |key: &str| rows.get(key).and_then(|r| r["baseline"].as_f64());

    assert!(value("pointer_304_rps_hyper") > 0.0);
    assert!(baseline("pointer_304_rps_hyper").is_some_and(|nginx| nginx > 0.0));
    assert!(value("heartbeat_rate") > 0.0);
    assert_eq!(
        value("heartbeat_lost"),
        0.0,
        "every 2xx heartbeat is stored"
    );
    assert!(
        baseline("heartbeat_p99_ms").is_some(),
        "the trivial handler ran"
    );
    let heartbeat = &document["details"]["heartbeat"];
    assert_eq!(
        heartbeat["windvane"]["ok"].as_u64(),
        heartbeat["stored"].as_u64(),
        "a tiny load is answered 2xx in full and stored in full"
    );
    assert_eq!(heartbeat["windvane"]["offered"].as_u64(), Some(400));
    assert!(value("heartbeat_replicas_rate") > 0.0);
    assert!(baseline("heartbeat_replicas_rate").is_some_and(|sqlite| sqlite > 0.0));
    assert_eq!(
        value("heartbeat_replicas_lost"),
        0.0,
        "every heartbeat a replica answered 2xx is in PostgreSQL"
    );

    let converged = value("convergence_seconds");
    let floor = baseline("convergence_seconds").expect("the poll schedule's floor");
    assert!(
        converged >= floor && converged < 60.0,
        "converged after {converged} s, the schedule allowed {floor} s"
    );
    assert_eq!(
        document["details"]["convergence"]["agents"].as_u64(),
        Some(40)
    );
    assert!(document["details"]["convergence"]["bundles"].as_u64() >= Some(40));

    let long_poll = &document["details"]["long-poll"];
    assert_eq!(long_poll["agents"].as_u64(), Some(40));
    assert_eq!(
        long_poll["notHeld"].as_u64(),
        Some(0),
        "windvane-server applies the wait"
    );
    assert_eq!(long_poll["errors"].as_u64(), Some(0));
    assert!(long_poll["bundles"].as_u64() >= Some(40));
    let pointer_p99 = value("long_poll_pointer_p99_seconds");
    assert!(
        pointer_p99 < 10.0,
        "a publish woke the held polls: p99 {pointer_p99} s, well under the 60 s wait"
    );
    assert!(
        baseline("long_poll_pointer_p99_seconds").is_some(),
        "plain polling (the convergence section of the same run) is the baseline"
    );
    assert!(value("long_poll_bundle_p99_seconds") >= pointer_p99);

    // Three gated waves: every agent in one, every one acknowledged, none before its wave's signed time,
    // and the held agents' gates read the server's rollout view.
    let waves = &document["details"]["waves"];
    assert_eq!(waves["agents"].as_u64(), Some(40));
    let per_wave = waves["waves"].as_array().expect("waves");
    assert_eq!(per_wave.len(), 3);
    let members: u64 = per_wave.iter().filter_map(|w| w["agents"].as_u64()).sum();
    assert_eq!(members, 40, "{waves}");
    for wave in per_wave {
        assert_eq!(wave["unacked"].as_u64(), Some(0), "{wave}");
        let first = wave["firstAckSeconds"].as_f64().unwrap_or_default();
        let scheduled = wave["scheduledSeconds"].as_f64().expect("scheduled");
        assert!(
            wave["agents"] == 0 || first >= scheduled,
            "an agent took its release before its wave's signed time: {wave}"
        );
    }
    assert!(waves["gateReads"].as_u64() > Some(0), "{waves}");
    assert!(value("waves_rest_acked_seconds") < 60.0);
    assert!(
        baseline("waves_server_cores").is_some(),
        "the idle fleet is the baseline"
    );
    assert!(
        stdout.contains("| metric"),
        "the table is printed:\n{stdout}"
    );
    Ok(())
}
