//! The agent's client side against hostile peers, with the real agent binary and a real control plane
//! (localkube): a store that accepts and never answers or trickles a byte every few seconds (drift is still
//! repaired at once, a new release is not applied, the source is reported stale), a store that is busy
//! (`503` + `Retry-After`: waited for as told, a `Retry-After` of `u64::MAX` clamped instead of crashing the
//! agent), conditional polls (`If-None-Match` carries the ETag, a `304` is neither parsed nor verified),
//! and a source server whose enrolment and heartbeat replies never end (read up to a cap and refused, the
//! agent's memory bounded, enforcement untouched).

mod fault_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fault_support::{SYNC, config_map, data, holds_for, memory, metric, plain};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use windvane_tests::fleet::{Agent, AgentOptions, FleetTree, Publisher};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::store_server::{Mode, StoreServer, Target, etag_of};

const FLEET: &str = "fleet: acme\napps:\n  - name: app\n    path: app\n    values: {v: one}\n";
const VALUE: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: value, namespace: default}\ndata: {v: '${values.v}'}\n";

/// How long drift repair may take while the store misbehaves: normal latency is well under a second; a
/// poll blocking the engine would take the store's whole deadline (30 s and more).
const HEAL: Duration = Duration::from_secs(10);

fn tree_with(v: &str) -> anyhow::Result<FleetTree> {
    let tree = FleetTree::new()?;
    tree.write("fleet.yaml", &FLEET.replace("v: one", &format!("v: {v}")))?;
    tree.write("app/objects.yaml", VALUE)?;
    Ok(tree)
}

async fn value(kube: &LocalKube) -> anyhow::Result<Option<String>> {
    let cm = config_map(kube, "default", "value").await?;
    Ok(data(cm.as_ref(), "v").map(str::to_owned))
}

/// Edits the managed ConfigMap as an operator would and returns how long the agent took to revert it. Each
/// edit comes from another field manager: the same one taking the field again and again would be a
/// controller war, which the agent backs off from on purpose.
async fn drift_and_time_repair(kube: &LocalKube, expected: &str) -> anyhow::Result<Duration> {
    static EDITS: AtomicU64 = AtomicU64::new(0);
    let editor = format!("operator-{}", EDITS.fetch_add(1, Ordering::Relaxed));
    let config_maps = Api::<ConfigMap>::namespaced(kube.client(), "default");
    let started = Instant::now();
    config_maps
        .patch(
            "value",
            &PatchParams {
                field_manager: Some(editor),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({"data": {"v": "edited"}})),
        )
        .await?;
    wait_for("the edit reverted", HEAL, || async {
        Ok((value(kube).await?.as_deref() == Some(expected)).then_some(()))
    })
    .await?;
    Ok(started.elapsed())
}

/// A synced agent polling `server` every second.
async fn synced_agent(
    kube: &LocalKube,
    publisher: &Publisher,
    server: &StoreServer,
    extra: &[&str],
) -> anyhow::Result<Agent> {
    let mut options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1");
    options.extra = extra.iter().map(|s| (*s).to_owned()).collect();
    let agent = Agent::start(kube, &options).await?;
    agent
        .wait_status("synced", SYNC, |s| {
            s["state"] == "Synced" && s["source"]["appliedSerial"] == 1
        })
        .await?;
    Ok(agent)
}

/// Waits until the store has answered `count` more requests in `mode` than `before` of them.
async fn wait_requests(
    server: &StoreServer,
    mode: Mode,
    count: usize,
) -> anyhow::Result<Vec<windvane_tests::store_server::Seen>> {
    wait_for(
        &format!("{count} requests answered {mode:?}"),
        SYNC,
        || async {
            let seen: Vec<_> = server
                .seen()
                .into_iter()
                .filter(|s| s.mode == mode)
                .collect();
            Ok((seen.len() >= count).then_some(seen))
        },
    )
    .await
}

async fn a_stalled_store_does_not_pause_healing(mode: Mode) -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(41)?;
    publisher.publish(&tree_with("one")?, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let agent = synced_agent(&kube, &publisher, &server, &[]).await?;
    let normal = drift_and_time_repair(&kube, "one").await?;

    server.set_mode(mode);
    // A new release the stalled store cannot deliver.
    publisher.publish(&tree_with("two")?, "stable")?;
    wait_requests(&server, mode, 1).await?;
    // The agent is waiting on the store now; drift is repaired as fast as ever, again and again.
    let mut stalled = Vec::new();
    for _ in 0..3 {
        stalled.push(drift_and_time_repair(&kube, "one").await?);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // The deadline passes: the source is reported stale, the new release is not applied.
    let status = agent
        .wait_status("source reported stale", SYNC, |s| {
            s["source"]["staleSince"].is_string()
        })
        .await?;
    assert!(
        status["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("/channels/stable.json")),
        "the error names the pointer: {status}"
    );
    assert_eq!(status["source"]["appliedSerial"], 1, "{status}");
    assert_eq!(value(&kube).await?.as_deref(), Some("one"));
    let metrics = agent.metrics().await?;
    assert_eq!(metric(&metrics, "windvane_source_stale"), Some(1.0));
    stalled.push(drift_and_time_repair(&kube, "one").await?);
    println!("{mode:?}: repaired in {normal:?} before, {stalled:?} while stalled");

    // The store recovers: the waiting release is taken.
    server.set_mode(Mode::Normal);
    agent
        .wait_status("release 2 applied", SYNC, |s| {
            s["source"]["appliedSerial"] == 2 && s["source"]["staleSince"].is_null()
        })
        .await?;
    assert_eq!(value(&kube).await?.as_deref(), Some("two"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_never_answers_does_not_pause_healing() -> anyhow::Result<()> {
    a_stalled_store_does_not_pause_healing(Mode::Stuck).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_trickles_does_not_pause_healing() -> anyhow::Result<()> {
    a_stalled_store_does_not_pause_healing(Mode::Trickle).await
}

fn not_modified(metrics: &str) -> f64 {
    metric(
        metrics,
        "windvane_source_fetch_total{result=\"not_modified\"}",
    )
    .unwrap_or(0.0)
}

/// Waits until at least `count` polls were answered 304; returns the metrics then.
async fn polls_answered_304(agent: &Agent, count: f64) -> anyhow::Result<String> {
    wait_for(&format!("{count} polls answered 304"), SYNC, || async {
        let text = agent.metrics().await?;
        Ok((not_modified(&text) >= count).then_some(text))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polls_send_the_etag_and_a_304_is_neither_parsed_nor_verified() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(42)?;
    publisher.publish(&tree_with("one")?, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let agent = synced_agent(&kube, &publisher, &server, &[]).await?;
    let not_modified = |text: &str| {
        metric(text, "windvane_source_fetch_total{result=\"not_modified\"}").unwrap_or(0.0)
    };
    let first = polls_answered_304(&agent, 2.0).await?;
    let verified = metric(&first, "windvane_source_fetch_total{result=\"ok\"}");
    assert_eq!(
        verified,
        Some(1.0),
        "the pointer was verified once: {first}"
    );
    let bundles = || {
        server
            .requests()
            .iter()
            .filter(|p| p.starts_with("/bundles/"))
            .count()
    };
    let bundles_before = bundles();
    let later = polls_answered_304(&agent, not_modified(&first) + 3.0).await?;
    assert_eq!(
        metric(&later, "windvane_source_fetch_total{result=\"ok\"}"),
        verified,
        "a 304 is not verified again: {later}"
    );
    assert_eq!(bundles(), bundles_before, "nor is the bundle fetched again");

    let pointer = std::fs::read(publisher.pointer_path("stable"))?;
    let etag = etag_of(&pointer);
    let polled: Vec<_> = server
        .seen()
        .into_iter()
        .filter(|s| s.path == "/channels/stable.json")
        .collect();
    assert_eq!(polled[0].if_none_match, None, "the first poll has no ETag");
    assert!(polled.len() >= 5, "{polled:?}");
    for seen in &polled[1..] {
        assert_eq!(
            seen.if_none_match.as_deref(),
            Some(etag.as_str()),
            "every later poll sends the ETag it got"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_store_is_waited_for_as_told_and_a_huge_retry_after_is_clamped() -> anyhow::Result<()>
{
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(43)?;
    publisher.publish(&tree_with("one")?, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let mut agent = synced_agent(&kube, &publisher, &server, &[]).await?;

    // Retry-After: 2 — the agent waits at least that (and spreads up to half again), not its 1 s interval.
    let two = Mode::Busy("2");
    server.set_mode_for(Target::Pointers, two);
    let busy = wait_requests(&server, two, 4).await?;
    for pair in busy.windows(2) {
        let gap = pair[1].at - pair[0].at;
        assert!(
            gap >= Duration::from_millis(1_950) && gap <= Duration::from_secs(4),
            "the next poll came {gap:?} after a 503 asking for 2 s"
        );
    }
    let metrics = agent.metrics().await?;
    assert!(
        metric(&metrics, "windvane_source_fetch_total{result=\"busy\"}").is_some_and(|n| n >= 4.0),
        "{metrics}"
    );

    // Retry-After: u64::MAX — clamped to an hour: no overflow, no crash, healing goes on.
    let huge = Mode::Busy("18446744073709551615");
    server.set_mode_for(Target::Pointers, huge);
    wait_requests(&server, huge, 1).await?;
    wait_for("the clamped wait logged", SYNC, || async {
        Ok(plain(&agent.process.log())
            .contains("busy, retry after 3600s")
            .then_some(()))
    })
    .await?;
    drift_and_time_repair(&kube, "one").await?;
    let asked = server.seen().len();
    holds_for(Duration::from_secs(5), async || {
        Ok(server.seen().len() == asked && agent.process.is_running())
    })
    .await?;
    let log = plain(&agent.process.log());
    assert!(!log.contains("panicked"), "{log}");
    assert_eq!(agent.readyz().await?, 200);
    Ok(())
}

/// A source server whose replies never end: `/enroll` answers with an endless JSON string the first
/// `endless_enrolments` times, then enrols the agent; every heartbeat is answered with an endless body.
#[derive(Debug, Default)]
struct Endless {
    enrolments: AtomicU64,
    heartbeats: AtomicU64,
    /// The most bytes one reply got out before the agent hung up.
    max_sent: AtomicU64,
}

/// Most bytes one endless reply sends (the test ends long before on a capped reader).
const ENDLESS_LIMIT: u64 = 4 << 30;

async fn endless_server(endless_enrolments: u64) -> anyhow::Result<(String, Arc<Endless>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let seen = Arc::new(Endless::default());
    let counts = seen.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(answer_endlessly(socket, counts.clone(), endless_enrolments));
        }
    });
    Ok((url, seen))
}

async fn answer_endlessly(mut socket: tokio::net::TcpStream, seen: Arc<Endless>, endless: u64) {
    let mut request = vec![0u8; 64 * 1024];
    let Ok(n) = socket.read(&mut request).await else {
        return;
    };
    let head = String::from_utf8_lossy(&request[..n]).into_owned();
    let opening = if head.contains("/enroll ") {
        if seen.enrolments.fetch_add(1, Ordering::Relaxed) >= endless {
            let reply = r#"{"cluster":"c1","keyid":"k","outcome":"Enrolled","lastSequence":0}"#;
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{reply}",
                reply.len()
            );
            let _ = socket.write_all(response.as_bytes()).await;
            return;
        }
        "\""
    } else {
        seen.heartbeats.fetch_add(1, Ordering::Relaxed);
        "{\"acknowledgedSequence\":\""
    };
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n{opening}"
    );
    if socket.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    let chunk = vec![b'a'; 64 * 1024];
    let mut sent = 0u64;
    while sent < ENDLESS_LIMIT && socket.write_all(&chunk).await.is_ok() {
        sent += chunk.len() as u64;
    }
    seen.max_sent.fetch_max(sent, Ordering::Relaxed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_replies_from_the_server_are_capped_and_healing_goes_on() -> anyhow::Result<()> {
    const MIB: u64 = 1024 * 1024;
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(44)?;
    publisher.publish(&tree_with("one")?, "stable")?;
    let store = StoreServer::start(publisher.store()).await?;
    let (server, seen) = endless_server(2).await?;
    let token = tempfile::NamedTempFile::new()?;
    std::fs::write(token.path(), "registration-token\n")?;
    let options = AgentOptions::new(&store.url(), &publisher.public_key_path(), "c1").reporting_to(
        &server,
        token.path(),
        "1s",
    );
    let agent = Agent::start(&kube, &options).await?;
    let pid = agent.process.pid().expect("the agent runs");

    // While the server answers without end — two enrolments, then heartbeats — the agent's memory stays
    // bounded, sampled all along, and it syncs and heals all the same.
    let mut peak = 0;
    let mut repaired = None;
    let deadline = Instant::now() + SYNC;
    loop {
        let (rss, _) = memory(pid)?;
        peak = peak.max(rss);
        assert!(
            rss < 100 * MIB,
            "agent RSS {} MiB while reading endless replies",
            rss / MIB
        );
        if repaired.is_none() && value(&kube).await?.as_deref() == Some("one") {
            repaired = Some(drift_and_time_repair(&kube, "one").await?);
        }
        let (enrolments, heartbeats) = (
            seen.enrolments.load(Ordering::Relaxed),
            seen.heartbeats.load(Ordering::Relaxed),
        );
        if repaired.is_some() && enrolments >= 3 && heartbeats >= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "timed out: {enrolments} enrolments, {heartbeats} heartbeats, repaired {repaired:?}; log:\n{}",
            agent.process.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = plain(&agent.process.log());
    assert!(
        log.contains("enrolment reply exceeds the size cap of 65536 bytes"),
        "the refusal is logged: {log}"
    );
    assert!(
        log.contains("heartbeat reply exceeds the size cap of 65536 bytes"),
        "{log}"
    );
    // What the server got out before the agent hung up: the cap plus what the sockets buffer.
    let max_sent = seen.max_sent.load(Ordering::Relaxed);
    assert!(max_sent < 64 * MIB, "one reply sent {} MiB", max_sent / MIB);
    assert_eq!(
        agent.status().await?["state"],
        "Synced",
        "enforcement is untouched"
    );
    println!(
        "peak RSS {} MiB, drift repaired in {repaired:?}, largest reply sent {} KiB",
        peak / MIB,
        max_sent / 1024
    );
    Ok(())
}
