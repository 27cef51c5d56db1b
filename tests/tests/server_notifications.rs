//! Notifications end to end: a real `windvane-server` with a notifications config whose sinks point at a
//! real hyper server in this test. Each notification (entering OutOfSync with critical RBAC drift, the drift
//! itself, recovery, silence turning Unknown) arrives exactly once per sink, the Slack sink gets only the
//! critical ones in Slack's shape, a sink that fails first gets it after a retry, and repeats within the
//! same release serial and alert episode are deduplicated — but a cluster that recovers and goes Unknown
//! again alerts again, once per episode, across restarts. A break-glass change notifies when opened, before
//! its hold ends and when reverted — or, taken in by a release, says so once and is never "expiring".

use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use windvane_shared::wire::heartbeat::{DriftAction, DriftRecord};
use windvane_shared::wire::status::SyncState;
use windvane_tests::heartbeat_agent::SimulatedAgent;
use windvane_tests::http::client;
use windvane_tests::poll::eventually;
use windvane_tests::server::{Options, ServerProcess};
use windvane_tests::webhook::{
    Received, arrivals, count, receiver, stays_quiet, wait_for, wait_for_arrivals,
};

fn rbac_drift() -> DriftRecord {
    DriftRecord {
        app: "access".into(),
        group: "rbac.authorization.k8s.io".into(),
        kind: "ClusterRoleBinding".into(),
        namespace: None,
        name: "viewers".into(),
        fields: vec!["/subjects".into()],
        deleted: false,
        manager: Some("kubectl-edit".into()),
        operation: Some("Update".into()),
        changed_at: Some(Timestamp::now()),
        detected_at: Timestamp::now(),
        reverted_at: None,
        action: DriftAction::Reported,
        break_glass: None,
        revert_requested_by: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_notification_is_delivered_exactly_once() {
    let (hooks, received) = receiver().await;
    let config = serde_json::json!({
        "sinks": [
            { "name": "ops", "type": "webhook", "url": format!("{hooks}/hook") },
            { "name": "flaky", "type": "webhook", "url": format!("{hooks}/flaky") },
            { "name": "slack", "type": "slack", "url": format!("{hooks}/slack"), "minSeverity": "critical" },
            { "name": "staging-only", "type": "webhook", "url": format!("{hooks}/staging"), "selector": "env=staging" }
        ]
    });
    let mut server = ServerProcess::start(Options {
        notifications: Some(config.to_string()),
        unknown_after: Some("3s".into()),
        ..Options::default()
    });
    let http = client();
    let mut agent = SimulatedAgent::new("prod-eu", 1, &[("env", "prod")]);
    assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
    agent.beat(&http, &server.url, SyncState::Synced).await;

    // OutOfSync with critical RBAC drift: two notifications, both critical.
    let mut hb = agent.next(SyncState::OutOfSync);
    hb.drift = vec![rbac_drift()];
    assert_eq!(
        agent
            .post(&http, &server.url, agent.sign(&hb))
            .await
            .status(),
        200
    );
    wait_for(&received, "/hook", &["OutOfSync", "Drift"]).await;
    {
        let state = received.lock().expect("lock");
        let hook = &state.by_path["/hook"];
        assert!(hook.iter().all(|n| n["severity"] == "critical"), "{hook:?}");
        let drift = hook
            .iter()
            .find(|n| n["trigger"] == "Drift")
            .expect("drift");
        assert_eq!(drift["cluster"], "prod-eu");
        assert_eq!(drift["serial"], 3);
        assert_eq!(drift["drift"]["manager"], "kubectl-edit");
        assert_eq!(
            drift["id"],
            "prod-eu/Drift rbac.authorization.k8s.io/ClusterRoleBinding viewers/3"
        );
    }
    wait_for(&received, "/slack", &["slack", "slack"]).await;
    assert!(
        received.lock().expect("lock").by_path["/slack"]
            .iter()
            .all(|v| v["text"]
                .as_str()
                .is_some_and(|t| t.starts_with("[CRITICAL]")))
    );
    wait_for(&received, "/flaky", &["OutOfSync", "Drift"]).await;

    // The same drift reported again within the same serial: nothing new.
    let mut hb = agent.next(SyncState::OutOfSync);
    hb.drift = vec![rbac_drift()];
    assert_eq!(
        agent
            .post(&http, &server.url, agent.sign(&hb))
            .await
            .status(),
        200
    );

    // Recovery: to the webhooks, not to Slack (below its minimum severity).
    agent.beat(&http, &server.url, SyncState::Synced).await;
    wait_for(&received, "/hook", &["OutOfSync", "Drift", "Recovered"]).await;
    wait_for(&received, "/flaky", &["OutOfSync", "Drift", "Recovered"]).await;

    // Silence: Unknown after the grace period.
    wait_for(
        &received,
        "/hook",
        &["OutOfSync", "Drift", "Recovered", "Unknown"],
    )
    .await;
    let unknown = received.lock().expect("lock").by_path["/hook"]
        .iter()
        .find(|n| n["trigger"] == "Unknown")
        .cloned()
        .expect("unknown");
    assert!(
        unknown["message"]
            .as_str()
            .is_some_and(|m| m.contains("last reported Synced")),
        "{unknown}"
    );

    // A restart rescans: the claims in the database keep it from sending anything twice, and what was still
    // waiting for a retry (the flaky sink's Unknown, when it had not got it yet) is in the outbox, and sent.
    server.restart();
    wait_for(
        &received,
        "/flaky",
        &["OutOfSync", "Drift", "Recovered", "Unknown"],
    )
    .await;
    stays_quiet(&received, Duration::from_secs(3)).await;
    assert_eq!(count(&received, "/slack"), 2);
    assert_eq!(
        count(&received, "/staging"),
        0,
        "the selector keeps prod out of the staging sink"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_goes_unknown_again_after_recovering_alerts_again_once_per_episode() {
    let (hooks, received) = receiver().await;
    let config = serde_json::json!({
        "sinks": [{ "name": "ops", "type": "webhook", "url": format!("{hooks}/hook") }]
    });
    let mut server = ServerProcess::start(Options {
        notifications: Some(config.to_string()),
        unknown_after: Some("2s".into()),
        ..Options::default()
    });
    let http = client();
    let mut agent = SimulatedAgent::new("prod-eu", 1, &[("env", "prod")]);
    assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);

    // Every heartbeat reports release serial 3: one release throughout.
    agent.beat(&http, &server.url, SyncState::Synced).await;
    wait_for_arrivals(&received, &["Unknown"]).await;
    agent.beat(&http, &server.url, SyncState::Synced).await;
    wait_for_arrivals(&received, &["Unknown", "Recovered"]).await;
    wait_for_arrivals(&received, &["Unknown", "Recovered", "Unknown"]).await;
    let ids: Vec<String> = arrivals(&received, "/hook")
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    assert_eq!(
        ids,
        [
            "prod-eu/Unknown/3",
            "prod-eu/Recovered/3",
            "prod-eu/Unknown#2/3"
        ],
        "each episode has its own id, so receivers do not fold the second into the first"
    );

    // A restart in the middle of the second episode sends nothing for it again; its recovery, once.
    server.restart();
    stays_quiet(&received, Duration::from_secs(3)).await;
    agent.beat(&http, &server.url, SyncState::Synced).await;
    wait_for_arrivals(&received, &["Unknown", "Recovered", "Unknown", "Recovered"]).await;
    let last = arrivals(&received, "/hook").pop().expect("arrivals");
    assert_eq!(last.1, "prod-eu/Recovered#2/3");
}

/// The PagerDuty events on `path` in arrival order: (event_action, dedup_key).
fn pagerduty_events(received: &Arc<Mutex<Received>>, path: &str) -> Vec<(String, String)> {
    received
        .lock()
        .expect("lock")
        .by_path
        .get(path)
        .map(|list| {
            list.iter()
                .map(|v| {
                    (
                        v["event_action"].as_str().unwrap_or_default().to_owned(),
                        v["dedup_key"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

async fn wait_for_pagerduty(
    received: &Arc<Mutex<Received>>,
    count: usize,
) -> Vec<(String, String)> {
    let what = format!("{count} PagerDuty events");
    eventually(&what, Duration::from_secs(30), || {
        let got = pagerduty_events(received, "/pd");
        async move {
            assert!(
                got.len() <= count,
                "more PagerDuty events than expected: {got:?}"
            );
            (got.len() == count).then_some(got)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pagerduty_gets_one_trigger_and_one_resolve_per_episode_with_its_own_key() {
    let (hooks, received) = receiver().await;
    let config = serde_json::json!({
        "sinks": [{
            "name": "pd", "type": "pagerduty", "url": format!("{hooks}/pd"), "routingKey": "test-routing-key",
            "triggers": ["Failed", "Unknown", "Drift", "Recovered"]
        }]
    });
    let server = ServerProcess::start(Options {
        notifications: Some(config.to_string()),
        unknown_after: Some("2s".into()),
        ..Options::default()
    });
    let http = client();
    let mut agent = SimulatedAgent::new("prod-eu", 1, &[("env", "prod")]);
    assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
    agent.beat(&http, &server.url, SyncState::Synced).await;

    // Episode 1: Failed (twice: one trigger), then Synced: one resolve, same key.
    agent.beat(&http, &server.url, SyncState::Failed).await;
    agent.beat(&http, &server.url, SyncState::Failed).await;
    let first = wait_for_pagerduty(&received, 1).await;
    agent.beat(&http, &server.url, SyncState::Synced).await;
    let events = wait_for_pagerduty(&received, 2).await;
    assert_eq!(events[0], first[0]);
    assert_eq!(events[0].0, "trigger");
    assert_eq!(events[1].0, "resolve");
    assert_eq!(events[0].1, events[1].1, "one episode, one dedup_key");
    {
        let state = received.lock().expect("lock");
        let trigger = &state.by_path["/pd"][0];
        assert_eq!(trigger["routing_key"], "test-routing-key");
        assert_eq!(trigger["payload"]["source"], "prod-eu");
        assert_eq!(trigger["payload"]["severity"], "critical");
    }

    // Episode 2: silence makes it Unknown; the heartbeat that follows resolves it. A new key.
    let events = wait_for_pagerduty(&received, 3).await;
    assert_eq!(events[2].0, "trigger");
    agent.beat(&http, &server.url, SyncState::Synced).await;
    let events = wait_for_pagerduty(&received, 4).await;
    assert_eq!(events[3].0, "resolve");
    assert_eq!(events[2].1, events[3].1);
    assert_ne!(
        events[0].1, events[2].1,
        "the second episode has a key of its own"
    );
    stays_quiet(&received, Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_glass_change_notifies_when_opened_before_it_ends_and_when_reverted() {
    let (hooks, received) = receiver().await;
    let config = serde_json::json!({
        "sinks": [{ "name": "ops", "type": "webhook", "url": format!("{hooks}/hook"), "triggers": ["BreakGlass"] }]
    });
    let server = ServerProcess::start(Options {
        notifications: Some(config.to_string()),
        unknown_after: Some("60s".into()),
        ..Options::default()
    });
    let http = client();
    let mut agent = SimulatedAgent::new("prod-eu", 1, &[("env", "prod")]);
    assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
    let mut record = rbac_drift();
    record.action = DriftAction::Held;
    record.break_glass = Some(windvane_shared::wire::heartbeat::BreakGlassRecord {
        by: "alice".into(),
        approver: "bob".into(),
        ticket: "INC-7".into(),
        until: Timestamp::now()
            .checked_add(jiff::SignedDuration::from_mins(30))
            .expect("time"),
    });
    let mut hb = agent.next(SyncState::Held);
    hb.drift = vec![record.clone()];
    assert_eq!(
        agent
            .post(&http, &server.url, agent.sign(&hb))
            .await
            .status(),
        200
    );
    wait_for(&received, "/hook", &["BreakGlass", "BreakGlass"]).await;
    record.action = DriftAction::Reverted;
    let mut hb = agent.next(SyncState::Synced);
    hb.drift = vec![record];
    assert_eq!(
        agent
            .post(&http, &server.url, agent.sign(&hb))
            .await
            .status(),
        200
    );
    wait_for(
        &received,
        "/hook",
        &["BreakGlass", "BreakGlass", "BreakGlass"],
    )
    .await;
    stays_quiet(&received, Duration::from_secs(2)).await;
    let summaries: Vec<String> = received.lock().expect("lock").by_path["/hook"]
        .iter()
        .map(|n| n["summary"].as_str().unwrap_or_default().to_owned())
        .collect();
    for phase in ["opened", "expiring", "reverted"] {
        assert!(
            summaries.iter().any(|s| s
                .starts_with(&format!("break-glass {phase} on cluster prod-eu"))
                && s.contains("alice, approved by bob, ticket INC-7")),
            "{phase}: {summaries:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_glass_change_a_release_took_in_notifies_that_and_never_expires() {
    let (hooks, received) = receiver().await;
    let config = serde_json::json!({
        "sinks": [{ "name": "ops", "type": "webhook", "url": format!("{hooks}/hook"), "triggers": ["BreakGlass"] }]
    });
    // Scans every 0.5 s, for expiring break-glass changes every 2.5 s.
    let server = ServerProcess::start(Options {
        notifications: Some(config.to_string()),
        unknown_after: Some("1s".into()),
        ..Options::default()
    });
    let http = client();
    let mut agent = SimulatedAgent::new("prod-eu", 1, &[("env", "prod")]);
    assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
    // Held and taken in between two heartbeats: the agent reports it taken in, its hold ending within the
    // hour (which would make an open change "expiring").
    let mut record = rbac_drift();
    record.action = DriftAction::TakenIn;
    record.reverted_at = Some(Timestamp::now());
    record.break_glass = Some(windvane_shared::wire::heartbeat::BreakGlassRecord {
        by: "alice".into(),
        approver: "bob".into(),
        ticket: "INC-7".into(),
        until: Timestamp::now()
            .checked_add(jiff::SignedDuration::from_mins(30))
            .expect("time"),
    });
    let mut hb = agent.next(SyncState::Synced);
    hb.drift = vec![record];
    assert_eq!(
        agent
            .post(&http, &server.url, agent.sign(&hb))
            .await
            .status(),
        200
    );
    wait_for(&received, "/hook", &["BreakGlass"]).await;
    // Longer than one expiring scan: nothing more, not "expiring", not "reverted".
    stays_quiet(&received, Duration::from_secs(4)).await;
    let summary = received.lock().expect("lock").by_path["/hook"][0]["summary"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        summary.starts_with("break-glass taken in on cluster prod-eu")
            && summary.contains("alice, approved by bob, ticket INC-7"),
        "{summary}"
    );
}
