//! Hostile clients against a real `windvane-server` on loopback, each outcome asserted: spoofed keys and
//! borrowed cluster names, replays (the same bytes twice, many copies at once, a captured heartbeat delivered
//! late), clock skew inside and beyond the window, token guessing from one address while another enrols,
//! oversized, lying and malformed bodies on every POST endpoint, and slow or idle connections (trickled headers
//! and bodies time out; a flood of idle connections stays bounded while other clients are served). The
//! refusals `server_heartbeats.rs` already walks through one by one are not repeated here. A cluster can act
//! only as itself: the registration token every cluster holds enrols a free name and nothing more.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use windvane_shared::crypto::dsse;
use windvane_shared::wire::heartbeat::{HEARTBEAT_PAYLOAD_TYPE, MAX_HEARTBEAT_BYTES};
use windvane_shared::wire::status::SyncState;
use windvane_tests::heartbeat_agent::SimulatedAgent;
use windvane_tests::http::{assert_refused, client, client_from, get_json, json_body};
use windvane_tests::poll::eventually;
use windvane_tests::server::{ADMIN_TOKEN, FLEET, Options, ServerProcess, TOKEN};

/// The enrolment and admin endpoints' body cap (the server's `MAX_SMALL_BODY`).
const SMALL_BODY_CAP: u64 = 64 * 1024;

// ---- raw HTTP ----

/// One response read off a raw connection.
#[derive(Debug)]
struct RawResponse {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl RawResponse {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {}\n{}",
                self.head,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    fn reason(&self) -> String {
        self.json()["reason"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Reads one response (head, then `Content-Length` bytes of body); `None` if the connection ends first.
async fn read_response(stream: &mut (impl AsyncRead + Unpin)) -> Option<RawResponse> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let end = loop {
        if let Some(end) = find(&buf, b"\r\n\r\n") {
            break end;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().to_owned())
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[end + 4..].to_vec();
    while body.len() < length {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    body.truncate(length);
    Some(RawResponse { status, head, body })
}

/// Sends `request` on a new connection, half-closes it when `close_write`, and reads one response (30 s).
async fn exchange(addr: &str, request: &[u8], close_write: bool) -> RawResponse {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("write request");
    if close_write {
        stream.shutdown().await.expect("half-close");
    }
    tokio::time::timeout(Duration::from_secs(30), read_response(&mut stream))
        .await
        .unwrap_or_else(|_| panic!("no response within 30 s to {:?}", head_of(request)))
        .unwrap_or_else(|| {
            panic!(
                "connection closed without a response to {:?}",
                head_of(request)
            )
        })
}

fn head_of(request: &[u8]) -> String {
    let end = find(request, b"\r\n").unwrap_or(request.len().min(200));
    String::from_utf8_lossy(&request[..end]).into_owned()
}

/// A POST request with the registration token as bearer token (so admin endpoints get past the token) and
/// `content_length` announced, whatever `body` really is.
fn post_request(path: &str, content_length: usize, body: &[u8]) -> Vec<u8> {
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: windvane\r\nContent-Type: application/json\r\n\
         Authorization: Bearer {TOKEN}\r\nContent-Length: {content_length}\r\n\r\n"
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}

/// How a streamed body says how long it is.
#[derive(Debug, Clone, Copy)]
enum Framing {
    /// `Content-Length` of the whole body.
    Honest,
    /// `Transfer-Encoding: chunked`, no length.
    Chunked,
    /// `Content-Length` of this many bytes, followed by the whole body anyway.
    Lying(usize),
}

/// Streams a `total`-byte body while reading the response concurrently; returns the response and how many
/// body bytes the server let the client write before it stopped reading.
async fn stream_body(
    addr: &str,
    path: &str,
    total: usize,
    framing: Framing,
) -> (Option<RawResponse>, usize) {
    let chunked = matches!(framing, Framing::Chunked);
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut reader, mut writer) = stream.into_split();
    let response = tokio::spawn(async move {
        tokio::time::timeout(Duration::from_secs(60), read_response(&mut reader))
            .await
            .ok()
            .flatten()
    });
    let framing = match framing {
        Framing::Honest => format!("Content-Length: {total}"),
        Framing::Chunked => "Transfer-Encoding: chunked".to_owned(),
        Framing::Lying(length) => format!("Content-Length: {length}"),
    };
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: windvane\r\nContent-Type: application/json\r\n\
         Authorization: Bearer {TOKEN}\r\n{framing}\r\n\r\n"
    );
    let writing = tokio::spawn(async move {
        if writer.write_all(head.as_bytes()).await.is_err() {
            return 0;
        }
        let block = vec![b' '; 64 * 1024];
        let mut written = 0;
        while written < total {
            let n = block.len().min(total - written);
            let mut framed = Vec::with_capacity(n + 16);
            if chunked {
                framed.extend_from_slice(format!("{n:x}\r\n").as_bytes());
            }
            framed.extend_from_slice(&block[..n]);
            if chunked {
                framed.extend_from_slice(b"\r\n");
            }
            if writer.write_all(&framed).await.is_err() {
                return written;
            }
            written += n;
        }
        if chunked {
            let _ = writer.write_all(b"0\r\n\r\n").await;
        }
        written
    });
    let response = response.await.expect("reader task");
    // Once the server has answered it must stop taking the body: the writer fails soon after.
    let written = tokio::time::timeout(Duration::from_secs(60), writing)
        .await
        .expect("the server neither read the rest of the body nor closed the connection")
        .expect("writer task");
    (response, written)
}

// ---- spoofing, replay, clock ----

#[tokio::test]
async fn spoofed_keys_and_borrowed_names_are_refused_and_nothing_is_stored() {
    let server = ServerProcess::start(Options::default());
    let http = client();
    let mut c1 = SimulatedAgent::new("c1", 1, &[("env", "prod")]);
    let mut c2 = SimulatedAgent::new("c2", 2, &[("env", "staging")]);
    for agent in [&c1, &c2] {
        assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
    }
    c1.beat(&http, &server.url, SyncState::Synced).await;
    c2.beat(&http, &server.url, SyncState::Synced).await;
    let before = get_json(&http, &format!("{}/api/v1/clusters/c2", server.url)).await;

    // c1's key signs a heartbeat that claims to be c2, sent to c2's URL: the signature is checked against the
    // key c2 enrolled with, so a compromised cluster cannot report for another.
    let mut as_c2 = SimulatedAgent::new("c2", 1, &[]);
    as_c2.sequence = 100;
    let hb = as_c2.next(SyncState::Failed);
    let message = assert_refused(
        as_c2.post(&http, &server.url, as_c2.sign(&hb)).await,
        401,
        "bad_signature",
    )
    .await;
    assert!(
        message.contains("cluster c2 is enrolled with key"),
        "{message}"
    );

    // Claiming c2's name at enrolment, with another key or for another fleet, is refused.
    assert_refused(
        SimulatedAgent::new("c2", 7, &[])
            .enroll(&http, &server.url)
            .await,
        409,
        "key_conflict",
    )
    .await;
    let mut other_fleet = c2.enroll_request(TOKEN);
    other_fleet.fleet = "other-fleet".into();
    assert_refused(
        http.post(format!("{}/api/v1/clusters/c2/enroll", server.url))
            .body(json_body(&other_fleet))
            .send()
            .await
            .expect("post"),
        409,
        "fleet_conflict",
    )
    .await;

    // c2's own key, but a heartbeat for another fleet: refused.
    let mut hb = c2.next(SyncState::Failed);
    hb.fleet = "other-fleet".into();
    let message = assert_refused(
        c2.post(&http, &server.url, c2.sign(&hb)).await,
        403,
        "cluster_mismatch",
    )
    .await;
    assert!(message.contains(FLEET), "{message}");

    // Nothing of it was stored; c2 is as it was and keeps reporting with its own key.
    assert_eq!(server.stored_heartbeats(None), 2);
    let after = get_json(&http, &format!("{}/api/v1/clusters/c2", server.url)).await;
    assert_eq!(after["cluster"]["state"], "Synced");
    assert_eq!(after["cluster"]["sequence"], before["cluster"]["sequence"]);
    assert_eq!(after["cluster"]["keyid"], before["cluster"]["keyid"]);
    assert_eq!(after["cluster"]["labels"], before["cluster"]["labels"]);
    c2.beat(&http, &server.url, SyncState::Degraded).await;
    assert_eq!(server.stored_heartbeats(Some("c2")), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_are_refused_even_many_at_once_or_delivered_late() {
    let skew = 5;
    let server = ServerProcess::start(Options {
        extra: vec!["--max-clock-skew".into(), format!("{skew}s")],
        ..Options::default()
    });
    let http = client();
    let mut agent = SimulatedAgent::new("c1", 1, &[]);
    assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);

    // The same signed bytes twice: stored once.
    let hb = agent.next(SyncState::Synced);
    let first = agent.sign(&hb);
    assert_eq!(
        agent.post(&http, &server.url, first.clone()).await.status(),
        200
    );
    let message = assert_refused(agent.post(&http, &server.url, first).await, 409, "replay").await;
    assert!(
        message.contains("sequence 1 is not above the last stored sequence 1"),
        "{message}"
    );

    // Twenty copies of one fresh heartbeat at the same time: exactly one is stored.
    let hb = agent.next(SyncState::Degraded);
    let copy = agent.sign(&hb);
    let sends = (0..20).map(|_| {
        let (http, url, body) = (http.clone(), server.url.clone(), copy.clone());
        tokio::spawn(async move {
            http.post(format!("{url}/api/v1/clusters/c1/heartbeat"))
                .body(body)
                .send()
                .await
                .expect("post")
                .status()
                .as_u16()
        })
    });
    let mut statuses = Vec::new();
    for send in sends {
        statuses.push(send.await.expect("task"));
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [[200].as_slice(), &[409; 19]].concat());

    // An older sequence, freshly signed after newer ones: refused.
    agent.sequence = 9;
    agent.beat(&http, &server.url, SyncState::Synced).await;
    agent.sequence = 6;
    let older = agent.next(SyncState::Failed);
    assert_refused(
        agent.post(&http, &server.url, agent.sign(&older)).await,
        409,
        "replay",
    )
    .await;

    // A heartbeat captured on its way (a sequence never seen) and delivered after the skew window: refused.
    agent.sequence = 10;
    let captured = agent.next(SyncState::Failed);
    let captured_bytes = agent.sign(&captured);
    eventually(
        "the captured heartbeat to be older than the skew window",
        Duration::from_secs(60),
        || async {
            let age = Timestamp::now().as_millisecond() - captured.sent_at.as_millisecond();
            (age > (skew + 1) * 1000).then_some(())
        },
    )
    .await;
    let message = assert_refused(
        agent.post(&http, &server.url, captured_bytes.clone()).await,
        400,
        "clock_skew",
    )
    .await;
    assert!(message.contains("check the cluster's clock"), "{message}");
    agent.beat(&http, &server.url, SyncState::Synced).await;

    // Stored: sequences 1, 2, 10 and 12; the cluster's state is the last accepted one.
    assert_eq!(server.stored_heartbeats(Some("c1")), 4);
    let detail = get_json(&http, &format!("{}/api/v1/clusters/c1", server.url)).await;
    assert_eq!(detail["cluster"]["sequence"], 12);
    assert_eq!(detail["cluster"]["state"], "Synced");
}

#[tokio::test]
async fn clock_skew_inside_the_window_is_accepted_and_beyond_it_refused_with_the_reason() {
    let server = ServerProcess::start(Options::default()); // the default window: 5 minutes
    let http = client();
    let mut agent = SimulatedAgent::new("c1", 1, &[]);
    assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
    let at =
        |offset: i64| Timestamp::from_second(Timestamp::now().as_second() + offset).expect("time");

    // A clock up to the window off, either way, is fine.
    for offset in [-290, 290, 0] {
        let mut hb = agent.next(SyncState::Synced);
        hb.sent_at = at(offset);
        let response = agent.post(&http, &server.url, agent.sign(&hb)).await;
        assert_eq!(response.status(), 200, "offset {offset} s");
    }
    // Beyond it, far or just: refused, saying what to check.
    for offset in [-310, 310, -365 * 86_400, 365 * 86_400] {
        let mut hb = agent.next(SyncState::Failed);
        hb.sent_at = at(offset);
        let message = assert_refused(
            agent.post(&http, &server.url, agent.sign(&hb)).await,
            400,
            "clock_skew",
        )
        .await;
        assert!(
            message.contains("more than 5m away from the server's clock")
                && message.contains("check the cluster's clock"),
            "offset {offset} s: {message}"
        );
    }
    assert_eq!(server.stored_heartbeats(Some("c1")), 3);
    let detail = get_json(&http, &format!("{}/api/v1/clusters/c1", server.url)).await;
    assert_eq!(detail["cluster"]["sequence"], 3);
    assert_eq!(detail["cluster"]["state"], "Synced");
}

// ---- a cluster acts only as itself ----

/// Every cluster holds the registration token, so a compromised one is the attacker here: it may enrol a name
/// nobody holds, and nothing else. It cannot take an enrolled name, report for another cluster, or use an admin
/// action (rekey, forget) on one; the victim keeps reporting throughout. An admin (the admin token) can.
#[tokio::test]
async fn a_cluster_can_act_only_as_itself() {
    let server = ServerProcess::start(Options::default());
    let http = client();
    let mut victim = SimulatedAgent::new("victim", 1, &[]);
    let mut attacker = SimulatedAgent::new("attacker", 2, &[]);
    assert_eq!(victim.enroll(&http, &server.url).await.status(), 201);
    assert_eq!(attacker.enroll(&http, &server.url).await.status(), 201);
    victim.beat(&http, &server.url, SyncState::Degraded).await;
    attacker.beat(&http, &server.url, SyncState::Synced).await;
    let victim_keyid = get_json(&http, &format!("{}/api/v1/clusters/victim", server.url)).await
        ["cluster"]["keyid"]
        .clone();

    // Enrolment with the registration token binds only a free name: the victim's is taken.
    let mut squatter = SimulatedAgent::new("victim", 2, &[]);
    assert_refused(
        squatter.enroll(&http, &server.url).await,
        409,
        "key_conflict",
    )
    .await;

    // Heartbeats are accepted only signed by the key bound to the cluster they name.
    let forged = squatter.next(SyncState::Synced);
    let response = squatter
        .post(&http, &server.url, squatter.sign(&forged))
        .await;
    assert_refused(response, 401, "bad_signature").await;
    let response = attacker
        .post(&http, &server.url, attacker.sign(&forged))
        .await;
    assert_refused(response, 403, "cluster_mismatch").await;

    // No admin action works with the registration token, from any cluster's hands.
    for action in ["rekey", "forget"] {
        let response = http
            .post(format!("{}/api/v1/clusters/victim/{action}", server.url))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("post");
        assert_refused(response, 401, "bad_token").await;
    }
    assert_refused(
        squatter.enroll(&http, &server.url).await,
        409,
        "key_conflict",
    )
    .await;

    // The victim was never touched: same key, still reporting, its state its own.
    victim.beat(&http, &server.url, SyncState::Degraded).await;
    let view = get_json(&http, &format!("{}/api/v1/clusters/victim", server.url)).await;
    assert_eq!(view["cluster"]["keyid"], victim_keyid);
    assert_eq!(view["cluster"]["state"], "Degraded");
    assert_eq!(server.stored_heartbeats(Some("victim")), 2);

    // The admin token does what the registration token cannot: after a rekey the next enrolment binds a new
    // key, and from then on the old key is refused.
    let response = http
        .post(format!("{}/api/v1/clusters/victim/rekey", server.url))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 200);
    assert_eq!(squatter.enroll(&http, &server.url).await.status(), 200);
    squatter.sequence = 0;
    squatter.beat(&http, &server.url, SyncState::Synced).await;
    let old = victim.next(SyncState::Degraded);
    let response = victim.post(&http, &server.url, victim.sign(&old)).await;
    assert_refused(response, 401, "bad_signature").await;
    assert_refused(victim.enroll(&http, &server.url).await, 409, "key_conflict").await;
}

// ---- the registration token ----

#[tokio::test]
async fn token_guessing_is_limited_per_address_while_agents_and_other_addresses_carry_on() {
    let server = ServerProcess::start(Options::default());
    let here = client_from(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)));
    let elsewhere = client_from(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)));
    let mut c1 = SimulatedAgent::new("c1", 1, &[]);
    assert_eq!(c1.enroll(&here, &server.url).await.status(), 201);
    c1.beat(&here, &server.url, SyncState::Synced).await;

    // Ten wrong guesses from 127.0.0.1, at enrolment and at the admin endpoints (they count together).
    let guesser = SimulatedAgent::new("c2", 2, &[]);
    for i in 0..10 {
        let response = if i % 2 == 0 {
            here.post(format!("{}/api/v1/clusters/c2/enroll", server.url))
                .body(json_body(&guesser.enroll_request(&format!("guess-{i}"))))
                .send()
                .await
        } else {
            here.post(format!("{}/api/v1/clusters/c1/forget", server.url))
                .bearer_auth(format!("guess-{i}"))
                .send()
                .await
        };
        assert_refused(response.expect("post"), 401, "bad_token").await;
    }

    // That address now waits, even with the right token, on either kind of endpoint.
    for response in [
        guesser.enroll(&here, &server.url).await,
        here.post(format!("{}/api/v1/clusters/c1/forget", server.url))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("post"),
    ] {
        let retry_after: u64 = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .expect("a numeric Retry-After");
        assert!((1..=60).contains(&retry_after), "Retry-After {retry_after}");
        assert_refused(response, 429, "rate_limited").await;
    }

    // Another address enrols with the right token at once.
    let c2 = SimulatedAgent::new("c2", 2, &[]);
    assert_eq!(c2.enroll(&elsewhere, &server.url).await.status(), 201);
    // Heartbeats carry no token: a cluster behind the guessing address keeps reporting, and was not forgotten.
    c1.beat(&here, &server.url, SyncState::Degraded).await;
    assert_eq!(server.stored_heartbeats(Some("c1")), 2);
}

// ---- bodies ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_are_refused_on_every_post_endpoint_without_being_read() {
    let server = ServerProcess::start(Options::default());
    let http = client();
    let mut agent = SimulatedAgent::new("c1", 1, &[]);
    assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
    agent.beat(&http, &server.url, SyncState::Synced).await;
    let addr = server.addr();
    const TOTAL: usize = 256 << 20;

    for (path, cap) in [
        ("/api/v1/clusters/c1/heartbeat", MAX_HEARTBEAT_BYTES),
        ("/api/v1/clusters/c2/enroll", SMALL_BODY_CAP),
        ("/api/v1/clusters/c1/rekey", SMALL_BODY_CAP),
        ("/api/v1/clusters/c1/forget", SMALL_BODY_CAP),
    ] {
        // Announced over the cap (a terabyte, or one byte over) and never sent: answered at once.
        for announced in [1usize << 40, cap as usize + 1] {
            let started = Instant::now();
            let response = exchange(&addr, &post_request(path, announced, b""), false).await;
            assert_eq!(response.status, 413, "{path} {announced}: {response:?}");
            assert_eq!(response.reason(), "too_large");
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{path}: the server waited for a body it was going to refuse"
            );
        }
        // Sent with an honest Content-Length, or chunked without one: refused, and the rest never read.
        for framing in [Framing::Honest, Framing::Chunked] {
            let (response, written) = stream_body(&addr, path, TOTAL, framing).await;
            let response = response.unwrap_or_else(|| panic!("{path} {framing:?}: no response"));
            assert_eq!(response.status, 413, "{path} {framing:?}");
            assert_eq!(response.reason(), "too_large");
            assert!(
                written < TOTAL / 4,
                "{path} {framing:?}: the server took {written} of {TOTAL} bytes"
            );
        }
    }
    // A small Content-Length followed by the whole flood: the announced bytes are the body (malformed), the
    // rest is not a request, and it is not read either.
    for path in [
        "/api/v1/clusters/c1/heartbeat",
        "/api/v1/clusters/c2/enroll",
    ] {
        let (response, written) = stream_body(&addr, path, TOTAL, Framing::Lying(1000)).await;
        let response = response.unwrap_or_else(|| panic!("{path} lying: no response"));
        assert_eq!(response.status, 400, "{path} lying");
        assert_eq!(response.reason(), "malformed");
        assert!(
            written < TOTAL / 4,
            "{path} lying: the server took {written} of {TOTAL} bytes"
        );
    }

    // Nothing was stored, enrolled, re-keyed or forgotten; the server carries on.
    assert_eq!(server.stored_heartbeats(None), 1);
    let fleet = get_json(&http, &format!("{}/api/v1/fleet", server.url)).await;
    assert_eq!(fleet["total"], 1);
    agent.beat(&http, &server.url, SyncState::Synced).await;
}

#[tokio::test]
async fn lying_lengths_and_malformed_bodies_are_refused_and_nothing_is_stored() {
    let server = ServerProcess::start(Options::default());
    let http = client();
    let mut agent = SimulatedAgent::new("c1", 1, &[]);
    assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
    agent.beat(&http, &server.url, SyncState::Synced).await;
    let addr = server.addr();
    let heartbeat_path = "/api/v1/clusters/c1/heartbeat";
    let enroll_path = "/api/v1/clusters/c9/enroll";
    let hb = agent.next(SyncState::Failed);
    let good_heartbeat = agent.sign(&hb);
    let good_enrolment = json_body(&SimulatedAgent::new("c9", 9, &[]).enroll_request(TOKEN));

    for (path, good) in [
        (heartbeat_path, &good_heartbeat),
        (enroll_path, &good_enrolment),
    ] {
        // A Content-Length shorter than the body: only that much is the body (malformed), and what follows
        // is not taken for another request.
        let response = exchange(&addr, &post_request(path, 10, good), false).await;
        assert_eq!(response.status, 400, "{path}: {response:?}");
        assert_eq!(response.reason(), "malformed");
        // Longer than the body, and the client then stops sending: an incomplete body, refused.
        let response = exchange(&addr, &post_request(path, good.len() + 100, good), true).await;
        assert_eq!(response.status, 400, "{path}: {response:?}");
        assert_eq!(response.reason(), "malformed");
        // Two different lengths: refused before any handler runs.
        let mut twice = format!(
            "POST {path} HTTP/1.1\r\nHost: windvane\r\nContent-Length: {}\r\nContent-Length: 10\r\n\r\n",
            good.len()
        )
        .into_bytes();
        twice.extend_from_slice(good);
        let response = exchange(&addr, &twice, false).await;
        assert_eq!(response.status, 400, "{path}: {response:?}");
    }

    // Malformed bodies, on both endpoints that read one.
    let deep = "[".repeat(50_000);
    let malformed: Vec<(&str, Vec<u8>)> = vec![
        ("empty", b"".to_vec()),
        ("truncated JSON", b"{\"payload\":".to_vec()),
        ("not JSON", b"payload=1&token=2".to_vec()),
        (
            "wrong types",
            br#"{"payload":5,"payloadType":[],"signatures":"x","token":7,"fleet":{},"publicKey":null}"#
                .to_vec(),
        ),
        ("deep nesting", deep.clone().into_bytes()),
        (
            "deep nesting in a field",
            format!("{{\"payload\":{deep}").into_bytes(),
        ),
        (
            "invalid UTF-8",
            b"{\"payload\":\"\xff\xfe\xfd\",\"token\":\"\xc3\x28\"}".to_vec(),
        ),
        ("NUL bytes", vec![0u8; 1000]),
    ];
    for (what, body) in &malformed {
        for path in [heartbeat_path, enroll_path] {
            let response = http
                .post(format!("{}{path}", server.url))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await
                .expect("post");
            assert_eq!(response.status(), 400, "{what} to {path}");
            let message = assert_refused(response, 400, "malformed").await;
            assert!(
                message.starts_with("malformed request"),
                "{what}: {message}"
            );
        }
    }

    // Inside a validly signed envelope, the payload is just as untrusted as a body.
    let mut wrong_types = serde_json::to_value(agent.next(SyncState::Synced)).expect("json");
    wrong_types["sequence"] = Value::from("12");
    let payloads: Vec<(&str, Vec<u8>)> = vec![
        ("deep nesting", deep.clone().into_bytes()),
        (
            "deep nesting in a field",
            format!("{{\"cluster\":\"c1\",\"labels\":{deep}").into_bytes(),
        ),
        (
            "invalid UTF-8",
            b"{\"cluster\":\"c1\xff\",\"fleet\":\"acme\"}".to_vec(),
        ),
        (
            "wrong types",
            serde_json::to_vec(&wrong_types).expect("json"),
        ),
    ];
    for (what, payload) in &payloads {
        let envelope = dsse::sign(HEARTBEAT_PAYLOAD_TYPE, payload, &agent.key).to_json_bytes();
        let response = agent.post(&http, &server.url, envelope).await;
        assert_eq!(response.status(), 400, "signed payload: {what}");
        assert_refused(response, 400, "malformed").await;
    }

    // Nothing was stored or enrolled, and the server is fine.
    assert_eq!(server.stored_heartbeats(None), 1);
    let missing = http
        .get(format!("{}/api/v1/clusters/c9", server.url))
        .send()
        .await
        .expect("get");
    assert_eq!(missing.status(), 404);
    agent.beat(&http, &server.url, SyncState::Synced).await;
    assert_eq!(server.stored_heartbeats(None), 2);
}

// ---- slow and idle connections ----

/// Connects, writes `prefix`, then (when `trickle`) one more byte every 200 ms, until the server closes the
/// connection; returns what the server sent and how long the connection stayed open. Panics when the server
/// keeps it open longer than `limit`.
async fn hold_open(
    addr: String,
    prefix: Vec<u8>,
    trickle: bool,
    limit: Duration,
) -> (String, Duration) {
    let started = Instant::now();
    let stream = TcpStream::connect(&addr).await.expect("connect");
    let (mut reader, mut writer) = stream.into_split();
    let reading = tokio::spawn(async move {
        let mut got = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            match reader.read(&mut chunk).await {
                Ok(0) | Err(_) => return got,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            }
        }
    });
    writer.write_all(&prefix).await.expect("write");
    let mut pace = tokio::time::interval(Duration::from_millis(200));
    while !reading.is_finished() {
        assert!(
            started.elapsed() < limit,
            "the server kept a slow connection open for {limit:?} (prefix {:?})",
            head_of(&prefix)
        );
        pace.tick().await;
        if trickle && writer.write_all(b"a").await.is_err() {
            break;
        }
    }
    let got = tokio::time::timeout(Duration::from_secs(10), reading)
        .await
        .expect("the connection ends")
        .expect("reader");
    (
        String::from_utf8_lossy(&got).into_owned(),
        started.elapsed(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_timed_out_while_everyone_else_is_served() {
    let server = ServerProcess::start(Options::default());
    let http = client();
    let mut agent = SimulatedAgent::new("c1", 1, &[]);
    assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
    let addr = server.addr();
    // hyper's header timeout and the handlers' body timeout are both 30 s.
    let limit = Duration::from_secs(60);

    let headers = tokio::spawn(hold_open(
        addr.clone(),
        b"GET /livez HTTP/1.1\r\nHost: windvane\r\nX-Slow: ".to_vec(),
        true,
        limit,
    ));
    let body = tokio::spawn(hold_open(
        addr.clone(),
        format!(
            "POST /api/v1/clusters/c1/heartbeat HTTP/1.1\r\nHost: windvane\r\nContent-Length: {}\r\n\r\n{{",
            MAX_HEARTBEAT_BYTES
        )
        .into_bytes(),
        true,
        limit,
    ));
    let idle = tokio::spawn(hold_open(addr.clone(), Vec::new(), false, limit));

    // Meanwhile, an agent and a reader are served promptly.
    let mut served = 0;
    let mut slowest = Duration::ZERO;
    while !(headers.is_finished() && body.is_finished() && idle.is_finished()) {
        let started = Instant::now();
        agent.beat(&http, &server.url, SyncState::Synced).await;
        let live = http
            .get(format!("{}/livez", server.url))
            .send()
            .await
            .expect("livez");
        assert_eq!(live.status(), 200);
        slowest = slowest.max(started.elapsed());
        served += 1;
        tokio::time::sleep(Duration::from_millis(250)).await; // pacing the other clients, not a condition
    }
    let (_, header_time) = headers.await.expect("headers task");
    let (body_reply, body_time) = body.await.expect("body task");
    let (_, idle_time) = idle.await.expect("idle task");
    assert!(
        body_reply.starts_with("HTTP/1.1 408") && body_reply.contains("body_timeout"),
        "{body_reply}"
    );
    assert!(
        slowest < Duration::from_secs(5),
        "a normal request took {slowest:?} while slow clients were connected"
    );
    assert!(served >= 20, "only {served} normal rounds in {body_time:?}");
    assert_eq!(server.stored_heartbeats(Some("c1")), served);
    eprintln!(
        "closed after: trickled headers {header_time:?}, trickled body {body_time:?}, idle {idle_time:?}; {served} \
         normal rounds, slowest {slowest:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_connections_stays_bounded_and_other_clients_are_served() {
    // With 128 open files, 600 idle connections would exhaust the server's descriptors without a bound:
    // accept would fail and nobody would be served until the header timeout (30 s) freed some.
    let server = ServerProcess::start(Options {
        wrapper: vec!["prlimit".into(), "--nofile=128".into(), "--".into()],
        ..Options::default()
    });
    let addr = server.addr();
    let http = client_from(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let mut agent = SimulatedAgent::new("c1", 1, &[]);
    assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);

    let flood_started = Instant::now();
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(TcpStream::connect(&addr).await.expect("connect"));
    }
    // More keep coming while other clients work.
    let flood = {
        let addr = addr.clone();
        tokio::spawn(async move {
            let mut more = Vec::new();
            for _ in 0..300 {
                more.push(TcpStream::connect(&addr).await.expect("connect"));
                tokio::task::yield_now().await;
            }
            more
        })
    };
    let mut slowest = Duration::ZERO;
    for _ in 0..20 {
        let started = Instant::now();
        agent.beat(&http, &server.url, SyncState::Synced).await;
        let live = http
            .get(format!("{}/livez", server.url))
            .send()
            .await
            .expect("livez");
        assert_eq!(live.status(), 200);
        slowest = slowest.max(started.elapsed());
    }
    idle.extend(flood.await.expect("flood"));
    assert!(
        slowest < Duration::from_secs(5),
        "a normal request took {slowest:?} during the flood"
    );

    // The server closed idle connections to stay within its bound, long before the header timeout would.
    let limit = 128 - 32;
    let closed = eventually(
        "the server to close all but its limit of idle connections",
        Duration::from_secs(20),
        || {
            let closed = idle
                .iter()
                .filter(|s| {
                    let mut byte = [0u8; 1];
                    match s.try_read(&mut byte) {
                        Ok(_) => true,
                        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                    }
                })
                .count();
            async move { (closed >= 600 - limit).then_some(closed) }
        },
    )
    .await;
    assert!(
        flood_started.elapsed() < Duration::from_secs(30),
        "too slow to tell eviction from the header timeout"
    );
    let logs = server.logs();
    assert!(
        !logs.contains("Too many open files") && !logs.contains("accept failed"),
        "the server ran out of descriptors:\n{logs}"
    );
    eprintln!(
        "{closed} of {} idle connections closed by the server; slowest normal request {slowest:?}",
        idle.len()
    );
    drop(idle);
    agent.beat(&http, &server.url, SyncState::Synced).await;
    assert_eq!(server.stored_heartbeats(Some("c1")), 21);
}
