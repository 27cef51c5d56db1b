//! The rollout view over real HTTP on a real `windvane-server`: it carries a strong ETag, a read with that
//! ETag is `304` (the view is served from the server's cache, not rebuilt per request), the agents' summary
//! (`?summary=1`) lists only clusters not done, and the view still changes — with a new ETag — when a signed
//! heartbeat changes what it says, and when a new release is published. A waiting cluster's reason from
//! its heartbeat (`source.pending.message`) shows in the view, on the page and in `windvane rollout status`.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use windvane_shared::wire::heartbeat::PendingReport;
use windvane_shared::wire::status::SyncState;
use windvane_tests::fleet::metric;
use windvane_tests::heartbeat_agent::SimulatedAgent;
use windvane_tests::http::client;
use windvane_tests::poll::eventually;
use windvane_tests::process::binary;
use windvane_tests::server::{CHANNEL, Options, ServerProcess, TOKEN, write_store};

/// Status, ETag and JSON body (`Null` for a `304`) of one read of the view.
async fn read(http: &reqwest::Client, url: &str, etag: Option<&str>) -> (u16, String, Value) {
    let mut request = http.get(url).bearer_auth(TOKEN);
    if let Some(etag) = etag {
        request = request.header("if-none-match", etag);
    }
    let response = request.send().await.expect("GET rollout view");
    let status = response.status().as_u16();
    let tag = response
        .headers()
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response.bytes().await.expect("body");
    let json = if status == 304 {
        assert!(body.is_empty(), "a 304 with a body");
        Value::Null
    } else {
        serde_json::from_slice(&body).expect("a rollout view")
    };
    (status, tag, json)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rollout_view_is_revalidated_by_etag_and_follows_heartbeats_and_publishes() {
    let server = ServerProcess::start(Options::default());
    let http = client();
    let mut behind = SimulatedAgent::new("edge-behind", 1, &[("tier", "edge")]);
    let mut synced = SimulatedAgent::new("edge-synced", 2, &[("tier", "edge")]);
    for agent in [&behind, &synced] {
        assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
    }
    // The store's release is serial 4; the simulated agents report serial 3 unless told otherwise.
    behind.beat(&http, &server.url, SyncState::Synced).await;
    let mut on_four = synced.next(SyncState::Synced);
    on_four.source.applied_serial = Some(4);
    assert_eq!(
        synced
            .post(&http, &server.url, synced.sign(&on_four))
            .await
            .status(),
        200
    );

    let summary = format!("{}/api/v1/rollouts/{CHANNEL}?summary=1", server.url);
    let full = format!("{}/api/v1/rollouts/{CHANNEL}", server.url);
    let (status, etag, view) = read(&http, &summary, None).await;
    assert_eq!(status, 200, "{view}");
    assert!(etag.starts_with('"') && etag.len() > 2, "ETag {etag:?}");
    assert_eq!(view["serial"], 4);
    assert_eq!(view["complete"], false);
    assert_eq!(
        (&view["waves"][0]["done"], &view["waves"][0]["pending"]),
        (&1.into(), &1.into())
    );
    let listed: Vec<&str> = view["waves"][0]["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(
        listed,
        ["edge-behind"],
        "the summary lists only clusters not done"
    );

    let (status, again, _) = read(&http, &summary, Some(&etag)).await;
    assert_eq!((status, again.as_str()), (304, etag.as_str()));
    // Served from the cache: many reads, at most one build per second.
    let builds = || async {
        let text = http
            .get(format!("{}/metrics", server.url))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text");
        metric(&text, "windvane_rollout_view_builds_total").expect("builds metric")
    };
    let before = builds().await;
    let started = Instant::now();
    for _ in 0..50 {
        assert_eq!(read(&http, &summary, Some(&etag)).await.0, 304);
    }
    let built = builds().await - before;
    let bound = started.elapsed().as_secs_f64().ceil() + 1.0;
    assert!(
        built <= bound,
        "{built} builds for 50 reads in {:?}",
        started.elapsed()
    );
    let (status, full_etag, full_view) = read(&http, &full, None).await;
    assert_eq!(status, 200);
    assert_ne!(full_etag, etag, "the full view is another representation");
    assert_eq!(
        full_view["waves"][0]["clusters"].as_array().map(Vec::len),
        Some(2),
        "the full view lists every cluster"
    );
    let (status, _, _) = read(&http, &full, Some(&full_etag)).await;
    assert_eq!(status, 304);

    // The cluster reports what it waits for: the view, the page and `windvane rollout status` show it.
    let mut waiting = behind.next(SyncState::Synced);
    waiting.source.pending = Some(PendingReport {
        serial: 4,
        wave: 2,
        waves: 3,
        opens_at: None,
        halted: false,
        message: "Pending (wave 2, opens in 14m)".into(),
        approval: None,
        changes: None,
    });
    assert_eq!(
        behind
            .post(&http, &server.url, behind.sign(&waiting))
            .await
            .status(),
        200
    );
    let (etag, _) = eventually("the view to show the wait", Duration::from_secs(10), || {
        let (http, summary, etag) = (&http, &summary, &etag);
        async move {
            let (status, tag, view) = read(http, summary, Some(etag)).await;
            let shown = &view["waves"][0]["clusters"][0]["waiting"];
            (status == 200 && shown == "Pending (wave 2, opens in 14m)").then_some((tag, view))
        }
    })
    .await;
    let page = http
        .get(format!("{}/rollouts/{CHANNEL}", server.url))
        .send()
        .await
        .expect("page")
        .text()
        .await
        .expect("page text");
    assert!(page.contains("Pending (wave 2, opens in 14m)"), "{page}");
    let status = Command::new(binary("windvane").expect("the windvane binary"))
        .args([
            "rollout",
            "status",
            "--server",
            &server.url,
            "--channel",
            CHANNEL,
        ])
        .output()
        .expect("windvane rollout status");
    let printed = String::from_utf8_lossy(&status.stdout);
    assert!(!status.status.success(), "not complete: exit 1");
    assert!(
        printed
            .lines()
            .any(|l| l.contains("edge-behind") && l.ends_with("Pending (wave 2, opens in 14m)")),
        "{printed}"
    );

    // A heartbeat that changes what the view says: the same ETag is no longer current.
    let mut caught_up = behind.next(SyncState::Synced);
    caught_up.source.applied_serial = Some(4);
    assert_eq!(
        behind
            .post(&http, &server.url, behind.sign(&caught_up))
            .await
            .status(),
        200
    );
    let (newer, view) = eventually(
        "the view to show the heartbeat",
        Duration::from_secs(10),
        || {
            let (http, summary, etag) = (&http, &summary, &etag);
            async move {
                let (status, tag, view) = read(http, summary, Some(etag)).await;
                (status == 200).then_some((tag, view))
            }
        },
    )
    .await;
    assert_ne!(newer, etag);
    assert_eq!(view["complete"], true, "{view}");
    assert_eq!(view["waves"][0]["done"], 2);
    assert_eq!(view["waves"][0]["clusters"], serde_json::json!([]));
    let (status, _, _) = read(&http, &summary, Some(&newer)).await;
    assert_eq!(status, 304, "unchanged again: revalidated");

    // A publish changes the view (the pointer is part of the cache's key).
    write_store(&server.root(), 5);
    let view = eventually("the view of serial 5", Duration::from_secs(5), || {
        let (http, summary, newer) = (&http, &summary, &newer);
        async move {
            let (status, _, view) = read(http, summary, Some(newer)).await;
            (status == 200 && view["serial"] == 5).then_some(view)
        }
    })
    .await;
    assert_eq!(view["complete"], false);
    assert_eq!(view["waves"][0]["pending"], 2);
}
