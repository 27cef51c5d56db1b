//! `windvane-server` on PostgreSQL, as several replicas would run it: started with `--database-url` and no
//! `--data`, it enrols agents, takes their signed heartbeats, refuses a replay, keeps everything across a
//! `kill -9` and restart, and serves the fleet from the database.

use windvane_shared::wire::heartbeat::PendingReport;
use windvane_shared::wire::status::SyncState;
use windvane_tests::heartbeat_agent::SimulatedAgent;
use windvane_tests::http::{client, get_json};
use windvane_tests::postgres::Postgres;
use windvane_tests::server::{Options, ServerProcess};

#[tokio::test]
async fn a_server_on_postgresql_needs_no_data_directory_and_keeps_the_fleet() {
    let pg = Postgres::start();
    let mut server = ServerProcess::start(Options {
        database_url: Some(pg.url.clone()),
        ..Options::default()
    });
    assert!(
        !server.dir.join("data").exists(),
        "nothing is written to a data directory"
    );
    let http = client();
    let mut prod = SimulatedAgent::new("prod-1", 1, &[("env", "prod")]);
    let mut dev = SimulatedAgent::new("dev-1", 2, &[("env", "dev")]);
    for agent in [&prod, &dev] {
        assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
    }
    prod.beat(&http, &server.url, SyncState::Synced).await;
    let mut waiting = dev.next(SyncState::OutOfSync);
    waiting.source.pending = Some(PendingReport {
        serial: 4,
        wave: 2,
        waves: 2,
        opens_at: None,
        halted: false,
        message: "Awaiting approval (0 of 1)".into(),
        approval: None,
        changes: None,
    });
    assert_eq!(
        dev.post(&http, &server.url, dev.sign(&waiting))
            .await
            .status(),
        200
    );
    // The rollout view reads the waiting clusters' reports from PostgreSQL too.
    let rollout = get_json(&http, &format!("{}/api/v1/rollouts/stable", server.url)).await;
    let waits: Vec<&str> = rollout["waves"][0]["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .filter_map(|c| c["waiting"].as_str())
        .collect();
    assert_eq!(waits, ["Awaiting approval (0 of 1)"], "{rollout}");

    // A replayed heartbeat is refused on PostgreSQL too.
    let replay = prod.next(SyncState::Synced);
    let signed = prod.sign(&replay);
    assert_eq!(
        prod.post(&http, &server.url, signed.clone()).await.status(),
        200
    );
    assert_eq!(prod.post(&http, &server.url, signed).await.status(), 409);

    server.kill9();
    server.restart();
    // A new client: the old one's kept-alive connection died with the server.
    let http = client();
    let fleet = get_json(&http, &format!("{}/api/v1/fleet", server.url)).await;
    assert_eq!(fleet["total"], 2, "{fleet}");
    assert_eq!(fleet["counts"]["Synced"], 1, "{fleet}");
    assert_eq!(fleet["counts"]["OutOfSync"], 1, "{fleet}");
    prod.beat(&http, &server.url, SyncState::Synced).await;
    assert!(
        !server.dir.join("data").exists(),
        "still no data directory after a restart"
    );
}
