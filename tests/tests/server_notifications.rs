//! Notifications end to end: a real `windvane-server` with a notifications config whose sinks point at a
//! real hyper server in this test. Each notification (entering OutOfSync with critical RBAC drift, the drift
//! itself, recovery, silence turning Unknown) arrives exactly once per sink, the Slack sink gets only the
//! critical ones in Slack's shape, a sink that fails first gets it after a retry, and repeats within the
//! same release serial and alert episode are deduplicated — but a cluster that recovers and goes Unknown
//! again alerts again, once per episode, across restarts.

use std::time::Duration;

use jiff::Timestamp;
use windvane_shared::heartbeat::{DriftAction, DriftRecord};
use windvane_shared::status::SyncState;
use windvane_tests::heartbeat_agent::SimulatedAgent;
use windvane_tests::http::client;
use windvane_tests::server::{Options, ServerProcess};
use windvane_tests::webhook::{
    arrivals, count, receiver, stays_quiet, wait_for, wait_for_arrivals,
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

    // A restart rescans: the claims in the database keep it from sending anything twice.
    server.restart();
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
