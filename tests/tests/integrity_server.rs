//! The source server against a hostile cluster and anonymous clients (issue 42), over real HTTP against the
//! real `windvane-server`:
//!
//! - text a cluster reports (a field manager, an error) reaches Slack as text, never as a mention or a link,
//!   and webhooks and PagerDuty as JSON with no markup characters in the raw body (item 8);
//! - held long polls are capped per client address, and answered oldest first — so that the agent polls on
//!   its interval — rather than keep a heartbeat out when every connection is busy (item 9);
//! - an admin's rekey permission ends with the next good heartbeat of the bound key, or after `--rekey-ttl`
//!   (item 11);
//! - wrong read and rollout-view tokens are limited per address like the others, and token files shorter
//!   than 16 bytes are refused at start, naming the file (item 13);
//! - the admin endpoints take only a bearer token, and the server refuses an admin token equal to the read
//!   token (item 19).

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use serde_json::Value;
use windvane_shared::wire::heartbeat::{DriftAction, DriftRecord};
use windvane_shared::wire::status::SyncState;
use windvane_tests::heartbeat_agent::SimulatedAgent;
use windvane_tests::http::{assert_refused, client, client_from, json_of};
use windvane_tests::poll::eventually;
use windvane_tests::process::binary;
use windvane_tests::server::{ADMIN_TOKEN, CHANNEL, Options, READ_TOKEN, ServerProcess, TOKEN};
use windvane_tests::webhook::{count, receiver};

fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// A metric's value from `/metrics` (`name` with its labels, as the line starts).
async fn metric(http: &reqwest::Client, server: &ServerProcess, name: &str) -> Option<u64> {
    let text = http
        .get(format!("{}/metrics", server.url))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .and_then(|value| value.trim().parse().ok())
}

// ---- item 8: text from a cluster in notifications ----

const HOSTILE_MANAGER: &str = "<!channel> <https://evil.example/approve|Approve> & co";
const HOSTILE_ERROR: &str =
    "apply failed\n<!here> approve it at <https://evil.example|this link> & go";

fn hostile_drift() -> DriftRecord {
    DriftRecord {
        app: "access".into(),
        group: "rbac.authorization.k8s.io".into(),
        kind: "ClusterRoleBinding".into(),
        namespace: None,
        name: "viewers".into(),
        fields: vec!["/subjects".into()],
        deleted: false,
        manager: Some(HOSTILE_MANAGER.into()),
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
async fn text_from_a_cluster_reaches_every_sink_as_text_not_markup() {
    let (hooks, received) = receiver().await;
    let config = serde_json::json!({
        "sinks": [
            { "name": "ops", "type": "webhook", "url": format!("{hooks}/hook") },
            { "name": "slack", "type": "slack", "url": format!("{hooks}/slack") },
            { "name": "pd", "type": "pagerduty", "url": format!("{hooks}/pd"),
              "routingKey": "0123456789abcdef0123456789abcdef" }
        ]
    });
    let server = ServerProcess::start(Options {
        notifications: Some(config.to_string()),
        ..Options::default()
    });
    let http = client();
    let mut agent = SimulatedAgent::new("prod-eu", 1, &[("env", "prod")]);
    assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
    agent.beat(&http, &server.url, SyncState::Synced).await;

    // OutOfSync with critical drift by a hostile field manager, and a hostile error: two notifications per sink.
    let mut hb = agent.next(SyncState::OutOfSync);
    hb.drift = vec![hostile_drift()];
    hb.last_error = Some(HOSTILE_ERROR.into());
    let response = agent.post(&http, &server.url, agent.sign(&hb)).await;
    assert_eq!(response.status(), 200);
    eventually(
        "two deliveries on each sink",
        Duration::from_secs(30),
        || {
            let all = ["/hook", "/slack", "/pd"]
                .iter()
                .all(|path| count(&received, path) == 2);
            async move { all.then_some(()) }
        },
    )
    .await;
    let state = received.lock().expect("lock");

    // Slack: no `<` at all (no mention, no link), the hostile text as entities, the error quoted line by line.
    for (text, raw) in state.by_path["/slack"]
        .iter()
        .zip(&state.raw_by_path["/slack"])
    {
        let text = text["text"].as_str().expect("a Slack text");
        // `>` only as our quote marker at the start of a line.
        let unquoted = text.replace("\n> ", "\n");
        assert!(!unquoted.contains('<') && !unquoted.contains('>'), "{text}");
        assert!(!raw.contains('<') && !raw.contains('>'), "{raw}");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[1..],
            [
                "> apply failed",
                "> &lt;!here&gt; approve it at &lt;https://evil.example|this link&gt; &amp; go"
            ],
            "the error stays inside the quote: {text}"
        );
    }
    let slack_drift = state.by_path["/slack"]
        .iter()
        .filter_map(|v| v["text"].as_str())
        .find(|t| t.contains("critical drift"))
        .expect("the drift's Slack message");
    assert!(
        slack_drift.contains(
            "changed by &lt;!channel&gt; &lt;https://evil.example/approve|Approve&gt; &amp; co"
        ),
        "{slack_drift}"
    );

    // The webhook: no markup characters in the raw body, the exact values once decoded.
    for raw in &state.raw_by_path["/hook"] {
        assert!(
            !raw.contains('<') && !raw.contains('>') && !raw.contains('&'),
            "{raw}"
        );
    }
    let drift = state.by_path["/hook"]
        .iter()
        .find(|n| n["trigger"] == "Drift")
        .expect("the drift notification");
    assert_eq!(drift["drift"]["manager"], HOSTILE_MANAGER);
    assert_eq!(drift["message"], HOSTILE_ERROR);

    // PagerDuty: the same JSON escaping, and a one-line title.
    for (event, raw) in state.by_path["/pd"].iter().zip(&state.raw_by_path["/pd"]) {
        assert!(!raw.contains('<') && !raw.contains('>'), "{raw}");
        let summary = event["payload"]["summary"].as_str().expect("summary");
        assert!(!summary.contains('\n'), "{summary:?}");
    }
    assert!(
        state.by_path["/pd"]
            .iter()
            .any(|e| e["payload"]["custom_details"]["message"] == HOSTILE_ERROR),
        "the details keep the exact text"
    );
}

// ---- item 9: held long polls ----

/// A long poll of the store's channel pointer from `http`, holding for up to a minute.
fn long_poll(
    http: &reqwest::Client,
    server: &ServerProcess,
    etag: &str,
) -> reqwest::RequestBuilder {
    http.get(format!("{}/channels/{CHANNEL}.json", server.url))
        .header("if-none-match", etag)
        .header("prefer", "wait=60")
}

async fn pointer_etag(http: &reqwest::Client, server: &ServerProcess) -> String {
    let first = http
        .get(format!("{}/channels/{CHANNEL}.json", server.url))
        .send()
        .await
        .expect("GET the pointer");
    assert_eq!(first.status(), 200);
    first.headers()["etag"].to_str().expect("etag").to_owned()
}

/// How an evicted poll is answered: the pointer unchanged, without `Preference-Applied` (so the agent polls
/// on its interval next), on a connection the server closes.
fn assert_evicted(answer: &reqwest::Response) {
    assert_eq!(answer.status(), 304);
    assert!(
        !answer.headers().contains_key("preference-applied"),
        "{:?}",
        answer.headers()
    );
    assert_eq!(answer.headers()["connection"], "close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holds_at_most_its_share_of_polls_and_its_oldest_polls_later() {
    let server = ServerProcess::start(Options {
        extra: vec!["--max-held-polls-per-client".into(), "3".into()],
        ..Options::default()
    });
    let observer = client();
    let crowd = client_from(loopback(2));
    let etag = pointer_etag(&observer, &server).await;
    let mut held = Vec::new();
    for n in 1..=3 {
        held.push(tokio::spawn(long_poll(&crowd, &server, &etag).send()));
        eventually(
            &format!("{n} polls held"),
            Duration::from_secs(10),
            || async {
                (metric(&observer, &server, "windvane_held_polls").await == Some(n)).then_some(())
            },
        )
        .await;
    }
    // A fourth from the same address: its oldest is answered at once; the other two stay held.
    let started = Instant::now();
    held.push(tokio::spawn(long_poll(&crowd, &server, &etag).send()));
    let oldest = held.remove(0).await.expect("task").expect("GET");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_evicted(&oldest);
    // Another address is not limited by the first one's polls.
    let other = client_from(loopback(3));
    let elsewhere = tokio::spawn(long_poll(&other, &server, &etag).send());
    eventually(
        "three held for 127.0.0.2 and one for 127.0.0.3",
        Duration::from_secs(10),
        || async {
            (metric(&observer, &server, "windvane_held_polls").await == Some(4)).then_some(())
        },
    )
    .await;
    assert!(held.iter().all(|poll| !poll.is_finished()) && !elsewhere.is_finished());
    assert_eq!(
        metric(
            &observer,
            &server,
            "windvane_held_polls_evicted_total{reason=\"per_client\"}"
        )
        .await,
        Some(1)
    );
    for poll in held.into_iter().chain([elsewhere]) {
        poll.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_polls_are_answered_to_make_room_before_a_heartbeat_is_refused() {
    // 128 open files: room for 96 connections (an eighth, at least 32, kept in reserve).
    let slots: u64 = 128 - 32;
    let server = ServerProcess::start(Options {
        wrapper: vec!["prlimit".into(), "--nofile=128".into(), "--".into()],
        ..Options::default()
    });
    let http = client_from(loopback(1));
    let mut agent = SimulatedAgent::new("c1", 1, &[]);
    assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
    let etag = pointer_etag(&http, &server).await;

    // Anonymous clients (fewer polls than one address may hold) take most of the slots with held polls...
    let crowd = client_from(loopback(2));
    let mut polls: Vec<_> = (0..slots - 8)
        .map(|_| tokio::spawn(long_poll(&crowd, &server, &etag).send()))
        .collect();
    eventually(
        "the crowd's polls held",
        Duration::from_secs(30),
        || async {
            (metric(&http, &server, "windvane_held_polls").await == Some(slots - 8)).then_some(())
        },
    )
    .await;
    // ...then one more poll at a time, a heartbeat after each, until every slot is busy holding a poll when
    // a heartbeat comes: it must still be served, by answering the oldest held poll (which comes back
    // evicted, not refused).
    let mut slowest = Duration::ZERO;
    let evicted = loop {
        assert!(
            polls.len() < 2 * slots as usize,
            "no held poll was answered to make room"
        );
        polls.push(tokio::spawn(long_poll(&crowd, &server, &etag).send()));
        let started = Instant::now();
        let hb = agent.next(SyncState::Synced);
        let response = agent.post(&http, &server.url, agent.sign(&hb)).await;
        assert_eq!(
            response.status(),
            200,
            "heartbeat {} with {} polls out",
            hb.sequence,
            polls.len()
        );
        slowest = slowest.max(started.elapsed());
        if let Some(at) = polls.iter().position(|poll| poll.is_finished()) {
            break polls.swap_remove(at);
        }
    };
    let answer = evicted
        .await
        .expect("task")
        .expect("an answer, not a refused connection");
    assert_evicted(&answer);
    assert!(
        slowest < Duration::from_secs(5),
        "a heartbeat took {slowest:?}"
    );
    assert_eq!(server.stored_heartbeats(Some("c1")), agent.sequence);
    let made_room = metric(
        &http,
        &server,
        "windvane_held_polls_evicted_total{reason=\"connections\"}",
    )
    .await
    .expect("the eviction counter");
    assert!(made_room >= 1, "{made_room}");
    eprintln!(
        "{} polls out; a heartbeat got in by answering a held poll; slowest heartbeat {slowest:?}",
        polls.len() + 1
    );
    for poll in polls {
        poll.abort();
    }
    let logs = server.logs();
    assert!(
        !logs.contains("every connection is busy: refusing a connection"),
        "a connection was refused while polls were held:\n{logs}"
    );
}

// ---- item 11: the rekey permission ----

async fn rekey(http: &reqwest::Client, server: &ServerProcess, cluster: &str) -> Value {
    let response = http
        .post(format!("{}/api/v1/clusters/{cluster}/rekey", server.url))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("rekey");
    assert_eq!(response.status(), 200);
    json_of(response).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rekey_permission_ends_with_a_good_heartbeat_or_its_time_to_live() {
    let server = ServerProcess::start(Options {
        extra: vec!["--rekey-ttl".into(), "2s".into()],
        ..Options::default()
    });
    let http = client();
    let mut owner = SimulatedAgent::new("prod-eu", 1, &[]);
    let impostor = SimulatedAgent::new("prod-eu", 2, &[]);
    assert_eq!(owner.enroll(&http, &server.url).await.status(), 201);
    owner.beat(&http, &server.url, SyncState::Synced).await;

    // The bound key reports after the rekey: it still has its key, so the permission is withdrawn.
    let allowed = rekey(&http, &server, "prod-eu").await;
    assert_eq!(allowed["result"], "rekey_allowed");
    owner.beat(&http, &server.url, SyncState::Synced).await;
    assert_refused(
        impostor.enroll(&http, &server.url).await,
        409,
        "key_conflict",
    )
    .await;

    // Nobody uses the permission: it ends after --rekey-ttl.
    let allowed = rekey(&http, &server, "prod-eu").await;
    let until: Timestamp = allowed["until"]
        .as_str()
        .expect("the reply says until when")
        .parse()
        .expect("a timestamp");
    let ttl = until.duration_since(Timestamp::now());
    assert!(
        ttl <= jiff::SignedDuration::from_secs(2) && ttl > jiff::SignedDuration::ZERO,
        "{ttl:?}"
    );
    // The condition is the clock passing the deadline the server named.
    let left = Duration::try_from(until.duration_since(Timestamp::now())).unwrap_or_default();
    tokio::time::sleep(left + Duration::from_millis(100)).await;
    assert_refused(
        impostor.enroll(&http, &server.url).await,
        409,
        "key_conflict",
    )
    .await;

    // Within its time to live, and before the old key reports, the new key is bound.
    rekey(&http, &server, "prod-eu").await;
    let rekeyed = impostor.enroll(&http, &server.url).await;
    assert_eq!(rekeyed.status(), 200);
    assert_eq!(json_of(rekeyed).await["outcome"], "Rekeyed");
}

// ---- items 13 and 19: tokens ----

/// Runs `windvane-server serve` with these token files (`(flag, contents)`; the registration token's file is
/// `--registration-token-file`), expecting it to refuse to start; returns its stderr and the directory the
/// files are in (for the error to name).
fn serve_refused(tokens: &[(&str, &str)]) -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("root")).expect("root");
    let mut command = Command::new(binary("windvane-server").expect("windvane-server binary"));
    command
        .arg("serve")
        .arg("--root")
        .arg(dir.path().join("root"))
        .arg("--data")
        .arg(dir.path().join("data"))
        .args(["--listen", "127.0.0.1:0"]);
    for (flag, contents) in tokens {
        let file = dir.path().join(flag.trim_start_matches("--"));
        std::fs::write(&file, contents).expect("token file");
        command.arg(flag).arg(&file);
    }
    let output = run_to_exit(command, Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "started: {stderr}");
    (stderr, dir)
}

/// Runs a command that should exit by itself within `limit`, killing it (and failing) if it does not.
fn run_to_exit(mut command: Command, limit: Duration) -> std::process::Output {
    let child = command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start windvane-server");
    let pid = child.id();
    let (done, waited) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    match waited.recv_timeout(limit) {
        Ok(output) => output.expect("wait"),
        Err(_) => {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!("windvane-server kept running; it should have refused to start")
        }
    }
}

fn path_in(dir: &Path, flag: &str) -> String {
    dir.join(flag.trim_start_matches("--"))
        .display()
        .to_string()
}

#[test]
fn short_tokens_and_tokens_shared_between_roles_are_refused_at_start() {
    let registration = (
        "--registration-token-file",
        "0123456789abcdef-registration\n",
    );
    for flag in ["--registration-token-file", "--read-token-file"] {
        let mut tokens = vec![registration];
        tokens.retain(|(f, _)| *f != flag);
        tokens.push((flag, "s3cret-15-bytes\n"));
        let (stderr, dir) = serve_refused(&tokens);
        assert!(
            stderr.contains(&format!(
                "{}: token too short (15 bytes, at least 16)",
                path_in(dir.path(), flag)
            )),
            "{flag}: the error names the file and the minimum: {stderr}"
        );
    }
    let (stderr, _dir) = serve_refused(&[
        registration,
        ("--read-token-file", "shared-by-admins-and-readers\n"),
        ("--admin-token-file", "shared-by-admins-and-readers"),
    ]);
    assert!(
        stderr
            .contains("the admin token (--admin-token-file) is the read token (--read-token-file)"),
        "{stderr}"
    );
    let (stderr, _dir) = serve_refused(&[
        registration,
        ("--read-token-file", "0123456789abcdef-registration"),
    ]);
    assert!(
        stderr.contains(
            "the read token (--read-token-file) is the registration token (--registration-token-file)"
        ),
        "a read token every cluster holds is refused: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_read_and_rollout_tokens_are_limited_per_address() {
    let server = ServerProcess::start(Options {
        read_token: true,
        ..Options::default()
    });
    let fleet = format!("{}/api/v1/fleet", server.url);
    let rollout = format!("{}/api/v1/rollouts/{CHANNEL}?summary=1", server.url);
    let guesser = client_from(loopback(2));
    let elsewhere = client_from(loopback(3));
    let browser = client_from(loopback(4));

    // Asking without a token is not guessing: a browser asks first, then prompts.
    for _ in 0..12 {
        let asked = browser.get(&fleet).send().await.expect("GET");
        assert_eq!(asked.status(), 401);
        assert!(asked.headers().contains_key("www-authenticate"));
    }
    let prompted = browser.get(&fleet).basic_auth("sre", Some(READ_TOKEN));
    assert_eq!(prompted.send().await.expect("GET").status(), 200);

    // Ten wrong guesses, at the page's API and at the rollout view (they count together).
    for i in 0..10 {
        let url = if i % 2 == 0 { &fleet } else { &rollout };
        let guess = guesser
            .get(url)
            .bearer_auth(format!("guess-{i}-0123456789"));
        assert_refused(guess.send().await.expect("GET"), 401, "unauthorized").await;
    }
    // That address now waits, even with the right tokens.
    for (url, token) in [
        (&fleet, READ_TOKEN),
        (&rollout, READ_TOKEN),
        (&rollout, TOKEN),
    ] {
        let response = guesser
            .get(url)
            .bearer_auth(token)
            .send()
            .await
            .expect("GET");
        let retry_after: u64 = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .expect("a numeric Retry-After");
        assert!((1..=60).contains(&retry_after), "Retry-After {retry_after}");
        assert_refused(response, 429, "rate_limited").await;
    }
    // Other addresses read on, with either token the rollout view takes.
    for (url, token) in [
        (&fleet, READ_TOKEN),
        (&rollout, READ_TOKEN),
        (&rollout, TOKEN),
    ] {
        let response = elsewhere
            .get(url)
            .bearer_auth(token)
            .send()
            .await
            .expect("GET");
        assert_eq!(response.status(), 200, "{url}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_endpoints_take_only_a_bearer_token() {
    let server = ServerProcess::start(Options::default());
    let http = client();
    let owner = SimulatedAgent::new("prod-eu", 1, &[]);
    let impostor = SimulatedAgent::new("prod-eu", 2, &[]);
    assert_eq!(owner.enroll(&http, &server.url).await.status(), 201);

    // The admin token as HTTP Basic, as a browser would send it again by itself: refused, nothing allowed.
    for action in ["rekey", "forget"] {
        let basic = http
            .post(format!("{}/api/v1/clusters/prod-eu/{action}", server.url))
            .basic_auth("admin", Some(ADMIN_TOKEN))
            .send()
            .await
            .expect("POST");
        assert_refused(basic, 401, "bad_token").await;
    }
    assert_refused(
        impostor.enroll(&http, &server.url).await,
        409,
        "key_conflict",
    )
    .await;
    assert_eq!(
        http.get(format!("{}/api/v1/clusters/prod-eu", server.url))
            .send()
            .await
            .expect("GET")
            .status(),
        200,
        "not forgotten"
    );

    // As a bearer token it works.
    let bearer = http
        .post(format!("{}/api/v1/clusters/prod-eu/rekey", server.url))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("POST");
    assert_eq!(bearer.status(), 200);
    assert_eq!(impostor.enroll(&http, &server.url).await.status(), 200);
}
