//! Enrolment and signed heartbeats against a real `windvane-server` on loopback: the token, key binding and
//! rekey; every refusal (spoofed key, replayed sequence, clock skew both ways, oversized, malformed, wrong
//! cluster, unknown cluster) answered with a 4xx and a JSON reason while nothing is stored; Unknown after a
//! tiny `--unknown-after`; the read token; metrics and health.

use std::time::Duration;

use jiff::Timestamp;
use serde_json::Value;
use windvane_shared::crypto::keys::signing_key_from_seed;
use windvane_shared::wire::heartbeat::{DriftAction, DriftRecord, MAX_HEARTBEAT_BYTES};
use windvane_shared::wire::status::SyncState;
use windvane_tests::heartbeat_agent::SimulatedAgent;
use windvane_tests::http::{client, get_json, json_body, json_of};
use windvane_tests::poll::eventually;
use windvane_tests::server::{ADMIN_TOKEN, Options, READ_TOKEN, ServerProcess, TOKEN};

async fn refused(response: reqwest::Response, status: u16, reason: &str) {
    assert_eq!(response.status(), status);
    let body: Value = json_of(response).await;
    assert_eq!(body["reason"], reason, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{body}"
    );
}

#[tokio::test]
async fn enrolment_binds_one_key_until_an_admin_allows_another() {
    let server = ServerProcess::start(Options::default());
    let http = client();
    let agent = SimulatedAgent::new("prod-eu", 1, &[("env", "prod")]);

    let bad = http
        .post(format!("{}/api/v1/clusters/prod-eu/enroll", server.url))
        .header("content-type", "application/json")
        .body(json_body(&agent.enroll_request("wrong-token")))
        .send()
        .await
        .expect("post");
    refused(bad, 401, "bad_token").await;

    let first = agent.enroll(&http, &server.url).await;
    assert_eq!(first.status(), 201);
    let body: Value = json_of(first).await;
    assert_eq!(body["outcome"], "Enrolled");
    assert_eq!(body["lastSequence"], 0);
    assert_eq!(
        agent.enroll(&http, &server.url).await.status(),
        200,
        "same key again is fine"
    );

    let impostor = SimulatedAgent::new("prod-eu", 2, &[]);
    refused(
        impostor.enroll(&http, &server.url).await,
        409,
        "key_conflict",
    )
    .await;

    // Admin endpoints take the admin token as a bearer token, never the registration token.
    let rekey_url = format!("{}/api/v1/clusters/prod-eu/rekey", server.url);
    refused(
        http.post(&rekey_url)
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("post"),
        401,
        "bad_token",
    )
    .await;
    refused(
        impostor.enroll(&http, &server.url).await,
        409,
        "key_conflict",
    )
    .await;
    assert_eq!(
        http.post(&rekey_url).send().await.expect("post").status(),
        401
    );
    assert_eq!(
        http.post(&rekey_url)
            .bearer_auth("nope")
            .send()
            .await
            .expect("post")
            .status(),
        401
    );
    assert_eq!(
        http.post(&rekey_url)
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("post")
            .status(),
        200
    );
    let rekeyed = impostor.enroll(&http, &server.url).await;
    assert_eq!(rekeyed.status(), 200);
    assert_eq!(json_of(rekeyed).await["outcome"], "Rekeyed");
    refused(agent.enroll(&http, &server.url).await, 409, "key_conflict").await;

    let forget = http
        .post(format!("{}/api/v1/clusters/prod-eu/forget", server.url))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await;
    assert_eq!(forget.expect("post").status(), 200);
    assert_eq!(
        http.get(format!("{}/api/v1/clusters/prod-eu", server.url))
            .send()
            .await
            .expect("get")
            .status(),
        404
    );
    assert_eq!(
        agent.enroll(&http, &server.url).await.status(),
        201,
        "a forgotten cluster enrols afresh"
    );
}

#[tokio::test]
async fn failed_token_attempts_are_rate_limited_per_address() {
    let server = ServerProcess::start(Options::default());
    let http = client();
    let agent = SimulatedAgent::new("c1", 1, &[]);
    let url = format!("{}/api/v1/clusters/c1/enroll", server.url);
    let mut statuses = Vec::new();
    for _ in 0..12 {
        let response = http
            .post(&url)
            .body(json_body(&agent.enroll_request("guess")))
            .send()
            .await
            .expect("post");
        statuses.push(response.status().as_u16());
        if response.status() == 429 {
            assert!(response.headers().contains_key("retry-after"));
        }
    }
    assert_eq!(&statuses[..10], &[401; 10]);
    assert_eq!(&statuses[10..], &[429, 429]);
    assert_eq!(
        agent.enroll(&http, &server.url).await.status(),
        429,
        "even the right token waits out the window"
    );
}

#[tokio::test]
async fn heartbeats_are_refused_for_every_reason_and_nothing_is_stored() {
    let server = ServerProcess::start(Options::default());
    let http = client();
    let mut agent = SimulatedAgent::new("c1", 1, &[("env", "prod")]);
    assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
    let mut other = SimulatedAgent::new("c2", 3, &[]);
    assert_eq!(other.enroll(&http, &server.url).await.status(), 201);

    // One good heartbeat first.
    let hb = agent.next(SyncState::Synced);
    let ok = agent.post(&http, &server.url, agent.sign(&hb)).await;
    assert_eq!(ok.status(), 200);
    let reply: Value = json_of(ok).await;
    assert_eq!(reply["acknowledgedSequence"], 1);
    assert_eq!(reply["nextIntervalSeconds"], 30);
    assert_eq!(server.stored_heartbeats(Some("c1")), 1);
    let before = get_json(&http, &format!("{}/api/v1/clusters/c1", server.url)).await;

    // Spoofed key: signed by a key that is not the bound one.
    let hb = agent.next(SyncState::Degraded);
    let spoofed = agent.sign_with(&hb, &signing_key_from_seed([9; 32]));
    refused(
        agent.post(&http, &server.url, spoofed).await,
        401,
        "bad_signature",
    )
    .await;
    // Signed by another enrolled cluster's key.
    refused(
        agent.post(&http, &server.url, other.sign(&hb)).await,
        401,
        "bad_signature",
    )
    .await;

    // Replay of the accepted heartbeat, and a lower sequence.
    agent.sequence = 0;
    let replay = agent.next(SyncState::Failed);
    refused(
        agent.post(&http, &server.url, agent.sign(&replay)).await,
        409,
        "replay",
    )
    .await;

    // Clock skew both ways.
    for offset in [-400i64, 400] {
        let mut hb = agent.next(SyncState::Failed);
        hb.sequence = 100;
        hb.sent_at = Timestamp::from_second(Timestamp::now().as_second() + offset).expect("time");
        refused(
            agent.post(&http, &server.url, agent.sign(&hb)).await,
            400,
            "clock_skew",
        )
        .await;
    }

    // Oversized: refused from Content-Length, and when streamed without one.
    let big = vec![b' '; MAX_HEARTBEAT_BYTES as usize + 1];
    refused(
        agent.post(&http, &server.url, big.clone()).await,
        413,
        "too_large",
    )
    .await;
    assert_eq!(
        post_chunked(&server.url, "/api/v1/clusters/c1/heartbeat", &big).await,
        413,
        "chunked, no length"
    );

    // Malformed bodies.
    for body in [&b""[..], b"{", b"null", b"{\"payload\":\"!!\",\"payloadType\":\"application/vnd.windvane.heartbeat.v1+json\",\"signatures\":[{\"keyid\":\"x\",\"sig\":\"y\"}]}"] {
        refused(agent.post(&http, &server.url, body.to_vec()).await, 400, "malformed").await;
    }
    let not_a_heartbeat = windvane_shared::crypto::dsse::sign(
        windvane_shared::wire::heartbeat::HEARTBEAT_PAYLOAD_TYPE,
        b"{\"hello\":1}",
        &agent.key,
    );
    refused(
        agent
            .post(&http, &server.url, not_a_heartbeat.to_json_bytes())
            .await,
        400,
        "malformed",
    )
    .await;

    // Signed for another cluster, posted under this one's URL (by its own key: still refused).
    let mut hb = agent.next(SyncState::Failed);
    hb.cluster = "c2".into();
    hb.sequence = 200;
    refused(
        agent.post(&http, &server.url, agent.sign(&hb)).await,
        403,
        "cluster_mismatch",
    )
    .await;

    // Unknown cluster.
    let mut stranger = SimulatedAgent::new("nobody", 5, &[]);
    let hb = stranger.next(SyncState::Synced);
    refused(
        stranger.post(&http, &server.url, stranger.sign(&hb)).await,
        404,
        "unknown_cluster",
    )
    .await;

    // Nothing of the above was stored.
    assert_eq!(server.stored_heartbeats(None), 1);
    let after = get_json(&http, &format!("{}/api/v1/clusters/c1", server.url)).await;
    assert_eq!(after["cluster"]["sequence"], before["cluster"]["sequence"]);
    assert_eq!(after["cluster"]["state"], "Synced");
    assert_eq!(after["cluster"]["lastSeen"], before["cluster"]["lastSeen"]);

    // And the next good heartbeat goes through (a sequence gap is fine).
    agent.sequence = 10;
    agent.beat(&http, &server.url, SyncState::Degraded).await;
    other.beat(&http, &server.url, SyncState::Synced).await;
    assert_eq!(server.stored_heartbeats(None), 3);

    let metrics = http
        .get(format!("{}/metrics", server.url))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    for line in [
        "windvane_heartbeats_total{result=\"accepted\"} 3",
        "windvane_heartbeats_total{result=\"bad_signature\"} 2",
        "windvane_heartbeats_total{result=\"replay\"} 1",
        "windvane_heartbeats_total{result=\"clock_skew\"} 2",
        "windvane_heartbeats_total{result=\"too_large\"} 2",
        "windvane_heartbeats_total{result=\"cluster_mismatch\"} 1",
        "windvane_heartbeats_total{result=\"unknown_cluster\"} 1",
        "windvane_clusters{state=\"Degraded\"} 1",
        "windvane_clusters{state=\"Synced\"} 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "missing {line:?} in\n{metrics}"
        );
    }
}

/// POSTs `body` with chunked transfer encoding (no Content-Length) over raw TCP; returns the status.
async fn post_chunked(base: &str, path: &str, body: &[u8]) -> u16 {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let addr = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.expect("write");
    for chunk in body.chunks(16 * 1024) {
        let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
        framed.extend_from_slice(chunk);
        framed.extend_from_slice(b"\r\n");
        if stream.write_all(&framed).await.is_err() {
            break; // the server may stop reading once over the cap
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response);
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"))
}

#[tokio::test]
async fn a_silent_cluster_becomes_unknown_with_its_last_state_and_the_api_filters() {
    let server = ServerProcess::start(Options {
        unknown_after: Some("1s".into()),
        ..Options::default()
    });
    let http = client();
    let mut prod = SimulatedAgent::new("prod-1", 1, &[("env", "prod")]);
    let mut staging = SimulatedAgent::new("staging-1", 2, &[("env", "staging")]);
    let silent = SimulatedAgent::new("never-1", 3, &[("env", "prod")]);
    for agent in [&prod, &staging, &silent] {
        assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
    }
    prod.beat(&http, &server.url, SyncState::Synced).await;
    staging.beat(&http, &server.url, SyncState::Synced).await;

    let url = format!("{}/api/v1/clusters/prod-1", server.url);
    let unknown = eventually("prod-1 to turn Unknown", Duration::from_secs(20), || {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let body = get_json(&http, &url).await;
            (body["cluster"]["state"] == "Unknown").then_some(body)
        }
    })
    .await;
    assert_eq!(unknown["cluster"]["lastReported"], "Synced");
    assert!(unknown["cluster"]["heartbeatAgeSeconds"].as_u64().is_some());
    staging.beat(&http, &server.url, SyncState::Synced).await;

    let fleet = get_json(
        &http,
        &format!("{}/api/v1/fleet?selector=env%3Dprod", server.url),
    )
    .await;
    assert_eq!(fleet["total"], 2);
    assert_eq!(fleet["counts"]["Unknown"], 1);
    assert_eq!(fleet["counts"]["NeverSeen"], 1);
    assert_eq!(
        fleet["counts"]["Synced"], 0,
        "Unknown is never counted as Synced"
    );
    let names: Vec<&str> = fleet["clusters"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["prod-1", "never-1"]);
    let filtered = get_json(
        &http,
        &format!("{}/api/v1/clusters?state=NeverSeen", server.url),
    )
    .await;
    assert_eq!(filtered["clusters"].as_array().expect("rows").len(), 1);
    let bad = http
        .get(format!("{}/api/v1/fleet?selector=env+in+(", server.url))
        .send()
        .await
        .expect("get");
    assert_eq!(bad.status(), 400);

    // A heartbeat brings it back.
    prod.beat(&http, &server.url, SyncState::Synced).await;
    assert_eq!(get_json(&http, &url).await["cluster"]["state"], "Synced");
}

#[tokio::test]
async fn drift_is_logged_and_queried() {
    let server = ServerProcess::start(Options::default());
    let http = client();
    let mut agent = SimulatedAgent::new("c1", 1, &[]);
    assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
    let mut hb = agent.next(SyncState::OutOfSync);
    let detected = Timestamp::now();
    hb.drift = vec![DriftRecord {
        app: "monitoring".into(),
        group: "apps".into(),
        kind: "Deployment".into(),
        namespace: Some("monitoring".into()),
        name: "prometheus".into(),
        fields: vec!["/spec/replicas".into()],
        deleted: false,
        manager: Some("kubectl-scale".into()),
        operation: Some("Update".into()),
        changed_at: Some(detected),
        detected_at: detected,
        reverted_at: None,
        action: DriftAction::Reported,
        break_glass: None,
        revert_requested_by: None,
    }];
    assert_eq!(
        agent
            .post(&http, &server.url, agent.sign(&hb))
            .await
            .status(),
        200
    );
    let all = get_json(&http, &format!("{}/api/v1/drift", server.url)).await;
    assert_eq!(all["drift"][0]["record"]["manager"], "kubectl-scale");
    assert_eq!(all["drift"][0]["cluster"], "c1");
    let recent = get_json(
        &http,
        &format!("{}/api/v1/drift?cluster=c1&since=1h", server.url),
    )
    .await;
    assert_eq!(recent["drift"].as_array().expect("list").len(), 1);
    let none = get_json(&http, &format!("{}/api/v1/drift?cluster=other", server.url)).await;
    assert!(none["drift"].as_array().expect("list").is_empty());
    let future = get_json(
        &http,
        &format!("{}/api/v1/drift?since=2999-01-01T00:00:00Z", server.url),
    )
    .await;
    assert!(future["drift"].as_array().expect("list").is_empty());
    let detail = get_json(&http, &format!("{}/api/v1/clusters/c1", server.url)).await;
    assert_eq!(detail["cluster"]["driftTotal"], 1);
    assert_eq!(detail["report"]["apps"][0]["name"], "monitoring");
}

#[tokio::test]
async fn the_read_token_guards_page_api_and_metrics_but_not_the_store_or_health() {
    let server = ServerProcess::start(Options {
        read_token: true,
        ..Options::default()
    });
    let http = client();
    for path in [
        "/",
        "/api/v1/fleet",
        "/api/v1/clusters",
        "/api/v1/drift",
        "/metrics",
    ] {
        let url = format!("{}{path}", server.url);
        let denied = http.get(&url).send().await.expect("get");
        assert_eq!(denied.status(), 401, "{path}");
        assert!(denied.headers().contains_key("www-authenticate"));
        assert_eq!(
            http.get(&url)
                .bearer_auth("wrong")
                .send()
                .await
                .expect("get")
                .status(),
            401,
            "{path}"
        );
        assert_eq!(
            http.get(&url)
                .bearer_auth(READ_TOKEN)
                .send()
                .await
                .expect("get")
                .status(),
            200,
            "{path}"
        );
        let basic = http
            .get(&url)
            .basic_auth("sre", Some(READ_TOKEN))
            .send()
            .await
            .expect("get");
        assert_eq!(basic.status(), 200, "{path} with Basic");
    }
    for path in ["/livez", "/readyz", "/channels/stable.json"] {
        assert_eq!(
            http.get(format!("{}{path}", server.url))
                .send()
                .await
                .expect("get")
                .status(),
            200,
            "{path}"
        );
    }
}
