//! What the server makes of the drift log for others, end to end on a real `windvane-server`: the audit
//! export to an HTTP endpoint (`--audit-export URL`: every stored drift record POSTed as JSON lines,
//! `application/x-ndjson`, to a real receiver in this test — retried when the endpoint fails — with the
//! documented fields, each record once), and the open break-glass changes on the API and the fleet page, until
//! the change is reverted or a release takes it in; drift rows past `--drift-retention` pruned when the
//! server (re)starts and hourly after.

use std::collections::BTreeSet;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::Value;
use windvane_shared::wire::heartbeat::{BreakGlassRecord, DriftAction, DriftRecord};
use windvane_shared::wire::status::SyncState;
use windvane_tests::heartbeat_agent::SimulatedAgent;
use windvane_tests::http::{client, get_json};
use windvane_tests::poll::eventually;
use windvane_tests::server::{Options, ServerProcess};
use windvane_tests::webhook::{Received, receiver};

fn drift(name: &str, action: DriftAction) -> DriftRecord {
    DriftRecord {
        app: "shop".into(),
        group: "apps".into(),
        kind: "Deployment".into(),
        namespace: Some("shop".into()),
        name: name.into(),
        fields: vec!["/spec/template/spec/containers/0/image".into()],
        deleted: false,
        manager: Some("kubectl-edit".into()),
        operation: Some("Update".into()),
        changed_at: Some(Timestamp::now()),
        detected_at: Timestamp::now(),
        reverted_at: (action == DriftAction::Reverted).then(Timestamp::now),
        action,
        break_glass: None,
        revert_requested_by: None,
    }
}

/// Every JSON line the endpoint accepted on `path`.
fn lines(received: &std::sync::Mutex<Received>, path: &str) -> Vec<Value> {
    let state = received.lock().expect("lock");
    state
        .raw_by_path
        .get(path)
        .into_iter()
        .flatten()
        .flat_map(|body| body.lines().map(str::to_owned).collect::<Vec<_>>())
        .map(|line| serde_json::from_str(&line).expect("each line is one JSON object"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stored_drift_record_is_posted_once_as_a_json_line() {
    let (hooks, received) = receiver().await;
    // The first POST fails (500): the export must retry it.
    let server = ServerProcess::start(Options {
        extra: vec!["--audit-export".into(), format!("{hooks}/flaky")],
        ..Options::default()
    });
    let http = client();
    let mut agent = SimulatedAgent::new("prod-eu", 1, &[("env", "prod")]);
    assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
    let mut heartbeat = agent.next(SyncState::OutOfSync);
    heartbeat.drift = vec![
        drift("api", DriftAction::Reverted),
        drift("web", DriftAction::Reported),
    ];
    let signed = agent.sign(&heartbeat);
    assert_eq!(agent.post(&http, &server.url, signed).await.status(), 200);
    // A break-glass change a release took in.
    let mut worker = drift("worker", DriftAction::TakenIn);
    worker.reverted_at = Some(Timestamp::now());
    worker.break_glass = held_break_glass().break_glass;
    let mut heartbeat = agent.next(SyncState::Synced);
    heartbeat.drift = vec![worker];
    let signed = agent.sign(&heartbeat);
    assert_eq!(agent.post(&http, &server.url, signed).await.status(), 200);

    let exported = eventually("three audit lines", Duration::from_secs(30), || {
        let got = lines(&received, "/flaky");
        async move {
            assert!(got.len() <= 3, "more lines than drift records: {got:?}");
            (got.len() == 3).then_some(got)
        }
    })
    .await;
    let names: BTreeSet<&str> = exported.iter().filter_map(|l| l["name"].as_str()).collect();
    assert_eq!(names, BTreeSet::from(["api", "web", "worker"]));
    for line in &exported {
        assert_eq!(line["cluster"], "prod-eu", "{line}");
        assert_eq!(line["kind"], "Deployment", "{line}");
        assert_eq!(line["namespace"], "shop", "{line}");
        assert_eq!(line["who"], "kubectl-edit", "{line}");
        assert_eq!(line["fields"][0], "/spec/template/spec/containers/0/image");
        for field in ["changedAt", "detectedAt", "receivedAt", "action", "release"] {
            assert!(line.get(field).is_some(), "{field} missing: {line}");
        }
    }
    let api = exported.iter().find(|l| l["name"] == "api").expect("api");
    assert_eq!(api["action"], "Reverted");
    assert!(api["repairedAt"].is_string(), "{api}");
    let web = exported.iter().find(|l| l["name"] == "web").expect("web");
    assert_eq!(web["action"], "Reported");
    assert!(web["repairedAt"].is_null(), "{web}");
    assert!(web["breakGlass"].is_null(), "{web}");
    let worker = exported
        .iter()
        .find(|l| l["name"] == "worker")
        .expect("worker");
    assert_eq!(worker["action"], "TakenIn");
    assert!(worker["repairedAt"].is_string(), "{worker}");
    assert_eq!(
        (
            &worker["breakGlass"]["by"],
            &worker["breakGlass"]["approver"],
            &worker["breakGlass"]["ticket"]
        ),
        (
            &Value::from("alice"),
            &Value::from("bob"),
            &Value::from("INC-7")
        ),
        "{worker}"
    );
    assert!(worker["breakGlass"]["until"].is_string(), "{worker}");
}

/// alice's break-glass change of `api`, approved by bob, held for two hours.
fn held_break_glass() -> DriftRecord {
    let mut held = drift("api", DriftAction::Held);
    held.break_glass = Some(BreakGlassRecord {
        by: "alice".into(),
        approver: "bob".into(),
        ticket: "INC-7".into(),
        until: Timestamp::now() + jiff::SignedDuration::from_hours(2),
    });
    held
}

/// Sends one heartbeat in `state` carrying `drift`.
async fn report(
    agent: &mut SimulatedAgent,
    http: &reqwest::Client,
    server: &ServerProcess,
    state: SyncState,
    drift: DriftRecord,
) {
    let mut heartbeat = agent.next(state);
    heartbeat.drift = vec![drift];
    let signed = agent.sign(&heartbeat);
    assert_eq!(agent.post(http, &server.url, signed).await.status(), 200);
}

async fn fleet_page(http: &reqwest::Client, server: &ServerProcess) -> String {
    http.get(format!("{}/", server.url))
        .send()
        .await
        .expect("page")
        .text()
        .await
        .expect("page body")
}

#[tokio::test]
async fn an_open_break_glass_change_is_listed_on_the_api_and_the_page_until_reverted() {
    let server = ServerProcess::start(Options::default());
    let http = client();
    let mut agent = SimulatedAgent::new("prod-eu", 1, &[("env", "prod")]);
    assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
    let held = held_break_glass();
    report(&mut agent, &http, &server, SyncState::Held, held.clone()).await;

    let open = get_json(&http, &format!("{}/api/v1/break-glass", server.url)).await;
    let listed = &open["breakGlass"];
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{open}");
    assert_eq!(listed[0]["cluster"], "prod-eu");
    assert_eq!(listed[0]["object"], "apps/Deployment shop/api");
    assert_eq!(
        (
            &listed[0]["by"],
            &listed[0]["approver"],
            &listed[0]["ticket"]
        ),
        (
            &Value::from("alice"),
            &Value::from("bob"),
            &Value::from("INC-7")
        )
    );
    let page = fleet_page(&http, &server).await;
    assert!(page.contains("Open break-glass changes (1)"), "{page}");
    assert!(
        page.contains("<td>alice</td><td>bob</td><td>INC-7</td>"),
        "{page}"
    );

    // Reverted at the end of its hold: no longer open, on the API or the page.
    let mut reverted = held;
    reverted.action = DriftAction::Reverted;
    reverted.reverted_at = Some(Timestamp::now());
    report(&mut agent, &http, &server, SyncState::Synced, reverted).await;
    let open = get_json(&http, &format!("{}/api/v1/break-glass", server.url)).await;
    assert_eq!(open["breakGlass"], serde_json::json!([]), "{open}");
    let page = fleet_page(&http, &server).await;
    assert!(!page.contains("break-glass"), "{page}");
}

#[tokio::test]
async fn a_break_glass_change_a_release_took_in_is_no_longer_open_though_its_hold_runs_on() {
    let server = ServerProcess::start(Options::default());
    let http = client();
    let mut agent = SimulatedAgent::new("prod-eu", 1, &[("env", "prod")]);
    assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
    let held = held_break_glass();
    report(&mut agent, &http, &server, SyncState::Held, held.clone()).await;
    let open = get_json(&http, &format!("{}/api/v1/break-glass", server.url)).await;
    assert_eq!(
        open["breakGlass"].as_array().map(Vec::len),
        Some(1),
        "{open}"
    );

    // A release wrote the object keeping the change: closed, though its hold would run two more hours.
    let mut taken_in = held;
    taken_in.action = DriftAction::TakenIn;
    taken_in.reverted_at = Some(Timestamp::now());
    report(&mut agent, &http, &server, SyncState::Synced, taken_in).await;
    let open = get_json(&http, &format!("{}/api/v1/break-glass", server.url)).await;
    assert_eq!(open["breakGlass"], serde_json::json!([]), "{open}");
    let page = fleet_page(&http, &server).await;
    assert!(!page.contains("break-glass"), "{page}");
    let log = get_json(&http, &format!("{}/api/v1/drift", server.url)).await;
    assert!(
        log.to_string().contains("\"action\":\"TakenIn\""),
        "the drift log keeps how it ended: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_detected_longer_ago_than_the_retention_is_pruned() {
    let mut server = ServerProcess::start(Options {
        extra: vec!["--drift-retention".into(), "2d".into()],
        ..Options::default()
    });
    let http = client();
    let mut agent = SimulatedAgent::new("prod-eu", 1, &[("env", "prod")]);
    assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
    let mut old = drift("old", DriftAction::Reverted);
    old.detected_at = Timestamp::now() - jiff::SignedDuration::from_hours(72);
    old.changed_at = Some(old.detected_at);
    let recent = drift("recent", DriftAction::Reverted);
    report(&mut agent, &http, &server, SyncState::Synced, old).await;
    report(&mut agent, &http, &server, SyncState::Synced, recent).await;
    let names = |log: &Value| -> BTreeSet<String> {
        log["drift"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["record"]["name"].as_str().map(str::to_owned))
            .collect()
    };
    let url = format!("{}/api/v1/drift", server.url);
    // Stored as sent: the server prunes hourly, first when it starts (before these arrived).
    let log = get_json(&http, &url).await;
    assert_eq!(names(&log), BTreeSet::from(["old".into(), "recent".into()]));

    // Started again, it prunes at once: the row detected three days ago goes, the recent one stays.
    server.restart();
    let url = format!("{}/api/v1/drift", server.url);
    eventually("the old drift row pruned", Duration::from_secs(30), || {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let log = get_json(&http, &url).await;
            (names(&log) == BTreeSet::from(["recent".to_owned()])).then_some(())
        }
    })
    .await;
    assert!(
        server.logs().contains("pruned the drift log"),
        "{}",
        server.logs()
    );
}
