//! The database contract, run the same way against SQLite and against PostgreSQL (a throwaway cluster from
//! Debian's packages, started by the harness; the test fails if it cannot start): enrolment decisions, batch
//! ingest with sequence and key checks inside the transaction, summaries, drift log, rekey/forget,
//! notification claims per alert episode, the notification outbox, and pruning.

use std::collections::BTreeMap;

use jiff::Timestamp;
use windvane_shared::crypto::keys::{keyid, verifying_key_to_pem};
use windvane_shared::wire::heartbeat::{DriftAction, DriftRecord};
use windvane_shared::wire::status::SyncState;
use windvane_source_server::db::EpisodeClaim::{self, Close, Open, Within};
use windvane_source_server::db::postgres::PostgresDb;
use windvane_source_server::db::sqlite::SqliteDb;
use windvane_source_server::db::{
    Database, EnrollOutcome, Enrollment, IngestOutcome, NewDelivery, Settled, VerifiedHeartbeat,
};
use windvane_tests::heartbeat_agent::SimulatedAgent;
use windvane_tests::postgres::Postgres;

/// One delivery to sink `ops` for a claim in `episode`.
fn queued(episode: u64) -> Vec<NewDelivery> {
    vec![NewDelivery {
        notification_id: format!("gamma/Failed#{episode}/3"),
        sink: "ops".into(),
        body: "{}".into(),
    }]
}

fn enrollment(agent: &SimulatedAgent, fleet: &str) -> Enrollment {
    Enrollment {
        cluster: agent.name.clone(),
        fleet: fleet.into(),
        keyid: keyid(&agent.key.verifying_key()),
        public_key_pem: verifying_key_to_pem(&agent.key.verifying_key()),
        labels: agent.labels.clone(),
        at: Timestamp::now(),
    }
}

fn verified(agent: &mut SimulatedAgent, state: SyncState) -> VerifiedHeartbeat {
    let heartbeat = agent.next(state);
    VerifiedHeartbeat {
        keyid: keyid(&agent.key.verifying_key()),
        received_at: Timestamp::now(),
        payload: serde_json::to_string(&heartbeat).expect("json"),
        heartbeat,
    }
}

async fn contract(db: &impl Database) {
    db.ping().await.expect("ping");
    let mut a = SimulatedAgent::new("alpha", 1, &[("env", "prod")]);
    let mut b = SimulatedAgent::new("beta", 2, &[("env", "staging")]);
    let impostor = SimulatedAgent::new("alpha", 3, &[]);

    // Enrolment.
    assert_eq!(
        db.enroll(enrollment(&a, "acme")).await.expect("enroll"),
        EnrollOutcome::Enrolled
    );
    assert_eq!(
        db.enroll(enrollment(&a, "acme")).await.expect("enroll"),
        EnrollOutcome::AlreadyEnrolled
    );
    assert_eq!(
        db.enroll(enrollment(&impostor, "acme"))
            .await
            .expect("enroll"),
        EnrollOutcome::KeyConflict
    );
    assert_eq!(
        db.enroll(enrollment(&a, "other")).await.expect("enroll"),
        EnrollOutcome::FleetConflict
    );
    assert_eq!(
        db.enroll(enrollment(&b, "acme")).await.expect("enroll"),
        EnrollOutcome::Enrolled
    );
    let (fleet, kid, pem) = db.cluster_key("alpha").await.expect("key").expect("bound");
    assert_eq!(
        (fleet.as_str(), kid),
        ("acme", keyid(&a.key.verifying_key()))
    );
    assert!(pem.contains("BEGIN PUBLIC KEY"));
    assert_eq!(db.cluster_key("nobody").await.expect("key"), None);

    // Never seen yet.
    let clusters = db.list_clusters().await.expect("list");
    assert_eq!(
        clusters.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        ["alpha", "beta"]
    );
    assert!(
        clusters
            .iter()
            .all(|c| c.last_seen.is_none() && c.state.is_none())
    );

    // A batch: in-order heartbeats, a replay inside the batch, an unknown cluster, a stale key.
    let a1 = verified(&mut a, SyncState::Progressing);
    let a2 = verified(&mut a, SyncState::Synced);
    let a2_again = a2.clone();
    let mut b1 = verified(&mut b, SyncState::OutOfSync);
    b1.heartbeat.drift = vec![DriftRecord {
        app: "rbac".into(),
        group: "rbac.authorization.k8s.io".into(),
        kind: "ClusterRole".into(),
        namespace: None,
        name: "viewer".into(),
        fields: vec!["/rules".into()],
        deleted: false,
        manager: Some("kubectl-edit".into()),
        operation: Some("Update".into()),
        changed_at: None,
        detected_at: Timestamp::now(),
        reverted_at: None,
        action: DriftAction::Reported,
        break_glass: None,
        revert_requested_by: None,
    }];
    let mut ghost = SimulatedAgent::new("ghost", 4, &[]);
    let g1 = verified(&mut ghost, SyncState::Synced);
    let mut stale = verified(&mut b, SyncState::Synced);
    stale.keyid = "0".repeat(64);
    let outcomes = db
        .ingest(vec![a1, a2, a2_again, b1, g1, stale].into())
        .await
        .expect("ingest");
    assert_eq!(
        outcomes,
        vec![
            IngestOutcome::Accepted { previous: None },
            IngestOutcome::Accepted {
                previous: Some(SyncState::Progressing)
            },
            IngestOutcome::Replay { last: 2 },
            IngestOutcome::Accepted { previous: None },
            IngestOutcome::UnknownCluster,
            IngestOutcome::KeyChanged,
        ]
    );
    assert_eq!(db.heartbeat_count(None).await.expect("count"), 3);
    assert_eq!(db.heartbeat_count(Some("alpha")).await.expect("count"), 2);

    let (alpha, report) = db.get_cluster("alpha").await.expect("get").expect("exists");
    assert_eq!(alpha.state, Some(SyncState::Synced));
    assert_eq!(alpha.last_sequence, 2);
    assert_eq!(alpha.interval_seconds, Some(30));
    assert_eq!(alpha.channel.as_deref(), Some("stable"));
    assert_eq!(alpha.applied_serial, Some(3));
    assert!(alpha.last_seen.is_some());
    assert_eq!(
        alpha.labels,
        BTreeMap::from([("env".to_owned(), "prod".to_owned())])
    );
    let report: serde_json::Value = serde_json::from_str(&report.expect("report")).expect("json");
    assert_eq!(report["sequence"], 2);
    let (beta, _) = db.get_cluster("beta").await.expect("get").expect("exists");
    assert_eq!(
        (beta.state, beta.drift_total),
        (Some(SyncState::OutOfSync), 1)
    );

    let drift = db.drift(None, None, 10, 0).await.expect("drift");
    assert_eq!(drift.len(), 1);
    assert_eq!(drift[0].cluster, "beta");
    assert_eq!(drift[0].record.manager.as_deref(), Some("kubectl-edit"));
    assert!(
        db.drift(Some("alpha"), None, 10, 0)
            .await
            .expect("drift")
            .is_empty()
    );
    let later = Timestamp::now()
        .checked_add(jiff::SignedDuration::from_hours(1))
        .expect("time");
    assert!(
        db.drift(None, Some(later), 10, 0)
            .await
            .expect("drift")
            .is_empty()
    );

    // A page past the end is empty; the retention deletes what was detected before it.
    assert!(db.drift(None, None, 10, 1).await.expect("drift").is_empty());
    assert_eq!(
        db.prune_drift(Timestamp::UNIX_EPOCH).await.expect("prune"),
        0
    );
    assert_eq!(db.drift(None, None, 10, 0).await.expect("drift").len(), 1);

    // Notification claims: once each per serial and alert episode; a recovery starts the next episode.
    let now = Timestamp::now();
    let claim = |trigger: &'static str, serial: u64, claim: EpisodeClaim| {
        db.claim_notification("beta", trigger, serial, now, claim, |_| Vec::new())
    };
    assert_eq!(claim("OutOfSync", 3, Open).await.expect("claim"), Some(1));
    assert_eq!(claim("OutOfSync", 3, Open).await.expect("claim"), None);
    assert_eq!(
        claim("OutOfSync", 4, Open).await.expect("claim"),
        Some(1),
        "per serial"
    );
    assert_eq!(
        claim("Drift apps/Deployment ns/x", 3, Within)
            .await
            .expect("claim"),
        Some(1)
    );
    assert_eq!(db.open_episodes().await.expect("open"), ["beta"]);
    assert_eq!(claim("Recovered", 3, Close).await.expect("claim"), Some(1));
    assert_eq!(
        claim("Recovered", 3, Close).await.expect("claim"),
        None,
        "recovered once per episode"
    );
    assert!(db.open_episodes().await.expect("open").is_empty());
    assert_eq!(
        claim("OutOfSync", 3, Open).await.expect("claim"),
        Some(2),
        "the next episode alerts again"
    );
    assert_eq!(claim("OutOfSync", 3, Open).await.expect("claim"), None);
    assert_eq!(claim("Recovered", 3, Close).await.expect("claim"), Some(2));

    // The outbox: a claim queues its deliveries in its transaction (a repeated claim queues nothing); each is
    // taken once per lease, taken again when its attempt asks for a retry, and never again once delivered.
    assert!(
        db.lead_notifications().await.expect("lead"),
        "the only server leads"
    );
    assert_eq!(
        db.claim_notification("gamma", "Failed", 3, now, Open, queued)
            .await
            .expect("claim"),
        Some(1)
    );
    assert_eq!(
        db.claim_notification("gamma", "Failed", 3, now, Open, queued)
            .await
            .expect("claim"),
        None
    );
    let lease = now
        .checked_add(jiff::SignedDuration::from_secs(60))
        .expect("time");
    let due = db.take_due_deliveries(now, lease, 10).await.expect("take");
    assert_eq!(due.len(), 1, "{due:?}");
    assert_eq!(
        (
            due[0].notification_id.as_str(),
            due[0].sink.as_str(),
            due[0].attempts
        ),
        ("gamma/Failed#1/3", "ops", 1)
    );
    assert!(
        db.take_due_deliveries(now, lease, 10)
            .await
            .expect("take")
            .is_empty(),
        "leased while its attempt runs"
    );
    db.settle_delivery(due[0].id, Settled::RetryAt(now), now)
        .await
        .expect("settle");
    let again = db.take_due_deliveries(now, lease, 10).await.expect("take");
    assert_eq!((again.len(), again[0].attempts), (1, 2), "{again:?}");
    db.settle_delivery(again[0].id, Settled::Delivered, now)
        .await
        .expect("settle");
    assert!(
        db.take_due_deliveries(later, later, 10)
            .await
            .expect("take")
            .is_empty(),
        "delivered once"
    );

    // Rekey: the next enrolment (within the permission's time) binds the new key and restarts the sequence.
    let until = Timestamp::now() + jiff::SignedDuration::from_hours(1);
    assert!(db.allow_rekey("alpha", until).await.expect("rekey"));
    assert!(!db.allow_rekey("nobody", until).await.expect("rekey"));
    assert_eq!(
        db.enroll(enrollment(&impostor, "acme"))
            .await
            .expect("enroll"),
        EnrollOutcome::Rekeyed
    );
    let mut new_alpha = SimulatedAgent::new("alpha", 3, &[]);
    let old = verified(&mut a, SyncState::Synced);
    let fresh = verified(&mut new_alpha, SyncState::Degraded);
    assert_eq!(
        db.ingest(vec![old, fresh].into()).await.expect("ingest"),
        vec![
            IngestOutcome::KeyChanged,
            IngestOutcome::Accepted {
                previous: Some(SyncState::Synced)
            }
        ]
    );

    // The drift retention deletes what was detected before its cut-off.
    assert_eq!(db.prune_drift(later).await.expect("prune drift"), 1);
    assert!(db.drift(None, None, 10, 0).await.expect("drift").is_empty());

    // Forget removes everything about the cluster.
    assert!(db.forget("beta").await.expect("forget"));
    assert!(!db.forget("beta").await.expect("forget"));
    assert_eq!(db.get_cluster("beta").await.expect("get"), None);
    assert!(
        db.drift(Some("beta"), None, 10, 0)
            .await
            .expect("drift")
            .is_empty()
    );
    assert_eq!(db.heartbeat_count(Some("beta")).await.expect("count"), 0);
    assert_eq!(
        db.claim_notification("beta", "OutOfSync", 3, now, Open, |_| Vec::new())
            .await
            .expect("claim"),
        Some(1),
        "claims and episodes forgotten too"
    );

    // Pruning the log keeps the clusters' latest state and what arrived since.
    let mut recent = verified(&mut new_alpha, SyncState::Synced);
    recent.received_at = later
        .checked_add(jiff::SignedDuration::from_secs(1))
        .expect("in range");
    assert_eq!(
        db.ingest(vec![recent].into()).await.expect("ingest"),
        vec![IngestOutcome::Accepted {
            previous: Some(SyncState::Degraded)
        }]
    );
    let pruned = db.prune(later).await.expect("prune");
    assert_eq!(
        pruned, 3,
        "alpha's rows before `later`: both sequence 1s (the old key's and the rekeyed agent's) and sequence 2"
    );
    assert_eq!(db.heartbeat_count(None).await.expect("count"), 1);
    assert_eq!(db.prune(later).await.expect("prune again"), 0);
    assert_eq!(
        db.get_cluster("alpha")
            .await
            .expect("get")
            .expect("exists")
            .0
            .state,
        Some(SyncState::Synced)
    );
}

#[tokio::test]
async fn sqlite_keeps_the_contract() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = SqliteDb::open(dir.path()).expect("open");
    contract(&db).await;
    // And it is all on disk for the next process.
    drop(db);
    let again = SqliteDb::open(dir.path()).expect("reopen");
    assert_eq!(again.list_clusters().await.expect("list").len(), 1);
}

#[tokio::test]
async fn postgres_keeps_the_contract() {
    let pg = Postgres::start();
    let url = pg.database("contract").await;
    let db = PostgresDb::open(&url).await.expect("open");
    contract(&db).await;
    drop(db);
    let again = PostgresDb::open(&url).await.expect("reopen");
    assert_eq!(again.list_clusters().await.expect("list").len(), 1);
}

/// The heartbeat log's first layout, as an earlier server created it.
const OLD_LOG: &str = "CREATE TABLE heartbeats (cluster TEXT NOT NULL, sequence BIGINT NOT NULL, \
     received_ms BIGINT NOT NULL, state TEXT NOT NULL, PRIMARY KEY (cluster, sequence)); \
     INSERT INTO heartbeats VALUES ('alpha', 2, 2000, 'Synced'), ('alpha', 1, 1000, 'Progressing');";

#[tokio::test]
async fn sqlite_moves_an_old_heartbeat_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir
        .path()
        .join(windvane_source_server::db::sqlite::FILE_NAME);
    rusqlite::Connection::open(&file)
        .and_then(|c| c.execute_batch(OLD_LOG))
        .expect("old layout");
    let db = SqliteDb::open(dir.path()).expect("open migrates");
    assert_eq!(db.heartbeat_count(Some("alpha")).await.expect("count"), 2);
    drop(db);
    let conn = rusqlite::Connection::open(&file).expect("open");
    let (old_tables, first): (i64, i64) = conn
        .query_row(
            "SELECT (SELECT COUNT(*) FROM sqlite_master WHERE name = 'heartbeats'), \
             (SELECT sequence FROM heartbeat_log ORDER BY id LIMIT 1)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("query");
    assert_eq!(
        (old_tables, first),
        (0, 1),
        "old table dropped, rows oldest first"
    );
    SqliteDb::open(dir.path()).expect("opening again is a no-op");
}

#[tokio::test]
async fn postgres_moves_an_old_heartbeat_log() {
    let pg = Postgres::start();
    let url = pg.database("migrate").await;
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client.batch_execute(OLD_LOG).await.expect("old layout");
    let db = PostgresDb::open(&url).await.expect("open migrates");
    assert_eq!(db.heartbeat_count(Some("alpha")).await.expect("count"), 2);
    let row = client
        .query_one(
            "SELECT to_regclass('heartbeats') IS NULL, \
             (SELECT sequence FROM heartbeat_log ORDER BY id LIMIT 1)",
            &[],
        )
        .await
        .expect("query");
    assert!(row.get::<_, bool>(0), "old table dropped");
    assert_eq!(row.get::<_, i64>(1), 1, "rows oldest first");
    drop(db);
    PostgresDb::open(&url)
        .await
        .expect("opening again is a no-op");
}
