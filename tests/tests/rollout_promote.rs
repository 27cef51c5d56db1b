//! `windvane promote --require-synced` against a real `windvane-server`: promotion of staging's release to
//! prod is refused, naming the cluster, while a selected staging cluster is OutOfSync on it, and goes
//! through — with the exact bundle digest — once every selected cluster is Synced. The clusters are
//! simulated signing agents (`heartbeat_agent`) reporting the staging channel and serial.

use std::path::Path;
use std::process::{Command, Output};

use windvane_shared::crypto::dsse::Envelope;
use windvane_shared::wire::status::SyncState;
use windvane_tests::heartbeat_agent::SimulatedAgent;
use windvane_tests::http::client;
use windvane_tests::process::binary;
use windvane_tests::server::{Options, ServerProcess};

fn windvane(args: &[&str]) -> Output {
    Command::new(binary("windvane").expect("the windvane binary"))
        .args(args)
        .output()
        .expect("run windvane")
}

fn pointer(store: &Path, channel: &str) -> Option<serde_json::Value> {
    let bytes = std::fs::read(store.join(format!("channels/{channel}.json"))).ok()?;
    let envelope = Envelope::from_json_slice(&bytes).expect("envelope");
    serde_json::from_slice(&envelope.payload_bytes().expect("payload")).ok()
}

async fn beat(agent: &mut SimulatedAgent, http: &reqwest::Client, url: &str, state: SyncState) {
    let mut heartbeat = agent.next(state);
    heartbeat.source.channel = "staging".into();
    heartbeat.source.applied_serial = Some(1);
    let response = agent.post(http, url, agent.sign(&heartbeat)).await;
    assert_eq!(
        response.status(),
        200,
        "{}",
        response.text().await.unwrap_or_default()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promotion_waits_for_every_selected_cluster_synced_and_moves_the_exact_digest() {
    let server = ServerProcess::start(Options::default());
    let work = tempfile::tempdir().expect("dir");
    let d = |p: &str| work.path().join(p).display().to_string();
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/examples/fleet");
    assert!(
        windvane(&["keygen", "--out", &d("release")])
            .status
            .success()
    );
    let published = windvane(&[
        "publish",
        example,
        "--root",
        &d("store"),
        "--channel",
        "staging",
        "--key",
        &d("release.key"),
    ]);
    assert!(
        published.status.success(),
        "{}",
        String::from_utf8_lossy(&published.stderr)
    );

    let http = client();
    let mut s1 = SimulatedAgent::new("staging-eu", 1, &[("env", "staging")]);
    let mut s2 = SimulatedAgent::new("staging-us", 2, &[("env", "staging")]);
    let mut p1 = SimulatedAgent::new("prod-eu", 3, &[("env", "prod")]);
    for agent in [&s1, &s2, &p1] {
        assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
    }
    beat(&mut s1, &http, &server.url, SyncState::Synced).await;
    beat(&mut s2, &http, &server.url, SyncState::OutOfSync).await;
    p1.beat(&http, &server.url, SyncState::Degraded).await;

    let promote = [
        "promote",
        "--root",
        &d("store"),
        "--from",
        "staging",
        "--to",
        "prod",
        "--key",
        &d("release.key"),
        "--require-synced",
        "env=staging",
        "--server",
        &server.url,
    ];
    let refused = windvane(&promote);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "promoted past an OutOfSync staging cluster"
    );
    assert!(stderr.contains("staging-us is OutOfSync"), "{stderr}");
    assert!(
        pointer(work.path().join("store").as_path(), "prod").is_none(),
        "nothing published"
    );

    beat(&mut s2, &http, &server.url, SyncState::Synced).await;
    let promoted = windvane(&promote);
    assert!(
        promoted.status.success(),
        "{}",
        String::from_utf8_lossy(&promoted.stderr)
    );
    let store = work.path().join("store");
    let staging = pointer(&store, "staging").expect("staging");
    let prod = pointer(&store, "prod").expect("prod");
    assert_eq!(
        prod["bundle"], staging["bundle"],
        "the exact digest and size"
    );
    assert_eq!(prod["channel"], "prod");
}
