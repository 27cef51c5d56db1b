//! Two `windvane-server` replicas on one PostgreSQL behind a real HAProxy (round robin, health checks on
//! `/readyz`), as a fleet that outgrows one server runs them: any replica takes any heartbeat; a heartbeat
//! replayed to the other replica is refused; wrong tokens are counted for the fleet, not per replica, by the
//! client's address that the trusted balancer forwards (a forged `X-Forwarded-For` does not help); each
//! notification is sent once for the fleet, by the one replica leading the sender; the page and API agree
//! whichever replica answers; and when the leading replica dies the other takes over, notifications included.
//! Under load: 200 clusters heartbeat through the balancer while the leading replica is `kill -9`ed; every
//! heartbeat answered 2xx is in PostgreSQL, no cluster is ever shown Unknown, and each state change is
//! notified once (by id).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use windvane_shared::wire::status::SyncState;
use windvane_source_server::notify::outbox;
use windvane_tests::haproxy::{LoadBalancer, PROXY_SOURCE};
use windvane_tests::heartbeat_agent::{Answer, SimulatedAgent};
use windvane_tests::http::{client, get_json, json_body};
use windvane_tests::poll::wait_for as wait_until;
use windvane_tests::postgres::Postgres;
use windvane_tests::server::{Options, ServerProcess};
use windvane_tests::views::{Shown, from_api, from_page};
use windvane_tests::webhook::{receiver, stays_quiet, triggers, wait_for};

/// Two replicas on `pg`, each sending notifications to `hooks`, judging a cluster Unknown after
/// `unknown_after` of silence and trusting the balancer's address.
fn replicas(pg: &Postgres, hooks: &str, unknown_after: &str) -> Vec<ServerProcess> {
    let notifications = serde_json::json!({
        "sinks": [{ "name": "ops", "type": "webhook", "url": format!("{hooks}/hook") }]
    });
    (0..2)
        .map(|_| {
            ServerProcess::start(Options {
                database_url: Some(pg.url.clone()),
                notifications: Some(notifications.to_string()),
                unknown_after: Some(unknown_after.into()),
                extra: vec!["--trusted-proxy".into(), PROXY_SOURCE.into()],
                ..Options::default()
            })
        })
        .collect()
}

/// Heartbeats a replica accepted, from its `/metrics`.
async fn accepted_heartbeats(http: &reqwest::Client, server: &ServerProcess) -> f64 {
    metric(
        http,
        server,
        "windvane_heartbeats_total{result=\"accepted\"}",
    )
    .await
}

/// The index of the one replica that leads the notification sender, once exactly one does.
async fn sole_leader(http: &reqwest::Client, servers: &[ServerProcess]) -> usize {
    let what = "exactly one replica leading the notification sender";
    let found = wait_until(what, Duration::from_secs(10), || async {
        let mut leaders = Vec::new();
        for (i, server) in servers.iter().enumerate() {
            if metric(http, server, "windvane_notification_sender_leader").await == 1.0 {
                leaders.push(i);
            }
        }
        Ok((leaders.len() == 1).then(|| leaders[0]))
    })
    .await;
    found.unwrap_or_else(|error| {
        let logs: Vec<String> = servers.iter().map(ServerProcess::logs).collect();
        panic!("{error:#}; replica logs:\n{}", logs.join("\n----\n"))
    })
}

/// One series of a replica's `/metrics` (0 when absent).
async fn metric(http: &reqwest::Client, server: &ServerProcess, series: &str) -> f64 {
    let metrics = http
        .get(format!("{}/metrics", server.url))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body");
    windvane_tests::fleet::metric(&metrics, series).unwrap_or(0.0)
}

/// The JSON API and the fleet page, through the balancer and from each replica directly, show the same
/// clusters in the same states with the same counts; what they show.
async fn views_agree(http: &reqwest::Client, lb: &str, servers: &[ServerProcess]) -> Shown {
    let through_balancer = from_api(&get_json(http, &format!("{lb}/api/v1/fleet")).await);
    let bases = std::iter::once(lb).chain(servers.iter().map(|s| s.url.as_str()));
    for base in bases {
        let api = from_api(&get_json(http, &format!("{base}/api/v1/fleet")).await);
        let response = http.get(format!("{base}/")).send().await.expect("GET /");
        assert_eq!(response.status(), 200, "GET {base}/");
        let page = from_page(&response.text().await.expect("page"));
        assert_eq!(api, through_balancer, "the API at {base} disagrees");
        assert_eq!(page, through_balancer, "the page at {base} disagrees");
    }
    through_balancer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_behind_a_load_balancer_act_as_one_server() {
    let pg = Postgres::start();
    let (hooks, received) = receiver().await;
    let mut servers = replicas(&pg, &hooks, "3s");
    let addrs: Vec<String> = servers.iter().map(ServerProcess::addr).collect();
    let balancer = LoadBalancer::start(&addrs).await.expect("haproxy");
    let lb = balancer.url.clone();
    let http = client();

    // Enrolment and heartbeats through the balancer land on both replicas in turn.
    let mut agents: Vec<SimulatedAgent> = (0..3)
        .map(|i| SimulatedAgent::new(&format!("prod-{i}"), i + 1, &[("env", "prod")]))
        .collect();
    for agent in &agents {
        assert_eq!(agent.enroll(&http, &lb).await.status(), 201);
    }
    for _ in 0..2 {
        for agent in &mut agents {
            agent.beat(&http, &lb, SyncState::Synced).await;
        }
    }
    let through_balancer = get_json(&http, &format!("{lb}/api/v1/fleet")).await;
    assert_eq!(through_balancer["total"], 3, "{through_balancer}");
    assert_eq!(
        through_balancer["counts"]["Synced"], 3,
        "{through_balancer}"
    );
    let shown = views_agree(&http, &lb, &servers).await;
    assert_eq!(shown.states.len(), 3, "{shown:?}");
    for server in &servers {
        assert!(
            accepted_heartbeats(&http, server).await > 0.0,
            "replica {} took no part",
            server.url
        );
    }

    // A heartbeat accepted by one replica is a replay at the other.
    let agent = &mut agents[0];
    let heartbeat = agent.next(SyncState::Synced);
    let signed = agent.sign(&heartbeat);
    assert_eq!(
        agent
            .post(&http, &servers[0].url, signed.clone())
            .await
            .status(),
        200
    );
    assert_eq!(
        agent.post(&http, &servers[1].url, signed).await.status(),
        409
    );

    wrong_tokens_are_counted_for_the_fleet(&http, &lb, &servers).await;
    notifications_are_sent_once_for_the_fleet(&http, &lb, &mut agents, &received).await;

    // The replica leading the notification sender dies: the balancer stops sending to the dead one, the
    // other takes the lead and carries on — silence included: prod-1 keeps beating through the balancer,
    // prod-0 and prod-2 fall silent and turn Unknown, notified once each by the new leader.
    let leader = sole_leader(&http, &servers).await;
    servers[leader].kill9();
    let survivor = &servers[1 - leader];
    let deadline = Instant::now() + Duration::from_secs(30);
    while triggers(&received, "/hook").len() < 4 {
        assert!(
            Instant::now() < deadline,
            "no Unknown: {:?}",
            triggers(&received, "/hook")
        );
        agents[1].beat(&http, &lb, SyncState::Synced).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    wait_for(
        &received,
        "/hook",
        &["Degraded", "Recovered", "Unknown", "Unknown"],
    )
    .await;
    agents[1].beat(&http, &lb, SyncState::Synced).await;
    assert_eq!(
        metric(&http, survivor, "windvane_notification_sender_leader").await,
        1.0
    );
    let fleet = get_json(&http, &format!("{lb}/api/v1/fleet")).await;
    assert_eq!(fleet["counts"]["Unknown"], 2, "{fleet}");
    assert_eq!(fleet["counts"]["Synced"], 1, "{fleet}");
}

/// Ten wrong tokens through the balancer, spread over both replicas and each with a different forged
/// `X-Forwarded-For`, block the client's address on both replicas; another client address is not blocked.
async fn wrong_tokens_are_counted_for_the_fleet(
    http: &reqwest::Client,
    lb: &str,
    servers: &[ServerProcess],
) {
    let guesser = SimulatedAgent::new("guesser", 9, &[]);
    let enroll = |base: &str| format!("{base}/api/v1/clusters/guesser/enroll");
    for i in 0..10 {
        let response = http
            .post(enroll(lb))
            .header("x-forwarded-for", format!("198.51.100.{i}"))
            .body(json_body(&guesser.enroll_request("guess")))
            .send()
            .await
            .expect("post");
        assert_eq!(response.status(), 401, "guess {i}");
    }
    let response = http
        .post(enroll(lb))
        .header("x-forwarded-for", "198.51.100.200")
        .body(json_body(&guesser.enroll_request("guess")))
        .send()
        .await
        .expect("post");
    assert_eq!(
        response.status(),
        429,
        "the eleventh guess, on either replica"
    );
    assert!(response.headers().contains_key("retry-after"));
    // Blocked is the client's address, not the balancer's: another client is only told its token is wrong.
    let other = windvane_tests::http::client_from("127.0.0.3".parse().expect("ip"));
    let response = other
        .post(enroll(lb))
        .body(json_body(&guesser.enroll_request("guess")))
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 401);
    // Direct to each replica, the blocked client is blocked there too: the count is in the database.
    for server in servers {
        let response = http
            .post(enroll(&server.url))
            .body(json_body(&guesser.enroll_request("guess")))
            .send()
            .await
            .expect("post");
        assert_eq!(response.status(), 429, "replica {}", server.url);
    }
}

/// A cluster goes Degraded and recovers with its heartbeats alternating between the replicas: one
/// notification each, not one per replica.
async fn notifications_are_sent_once_for_the_fleet(
    http: &reqwest::Client,
    lb: &str,
    agents: &mut [SimulatedAgent],
    received: &Arc<Mutex<windvane_tests::webhook::Received>>,
) {
    for state in [SyncState::Degraded, SyncState::Synced] {
        for _ in 0..4 {
            for (i, agent) in agents.iter_mut().enumerate() {
                agent
                    .beat(http, lb, if i == 2 { state } else { SyncState::Synced })
                    .await;
            }
        }
        if state == SyncState::Degraded {
            wait_for(received, "/hook", &["Degraded"]).await;
        }
    }
    wait_for(received, "/hook", &["Degraded", "Recovered"]).await;
    stays_quiet(received, Duration::from_secs(1)).await;
}

/// Clusters reporting in [`a_replica_killed_under_load_loses_no_heartbeat_and_no_cluster_turns_unknown`].
const FLEET_SIZE: usize = 200;
/// Their heartbeat interval (announced in each heartbeat), ±20 % as the agent jitters it.
const BEAT: Duration = Duration::from_secs(1);
/// Silence before the replicas call a cluster Unknown: set explicitly (the default, 3 × the announced 1 s
/// interval, is the threshold of a fleet beating every second) and comfortably above a failover, which
/// costs an agent one failed heartbeat and a retry within a second or two (HAProxy takes the dead replica
/// out after two failed checks 200 ms apart, and meanwhile redispatches refused connections).
const UNKNOWN_AFTER: &str = "10s";
/// The clusters that report Degraded before the kill (their notifications may be in the dead leader's
/// hands) and recover after it, and those that go Degraded and recover after it.
const DEGRADED_BEFORE: std::ops::Range<usize> = 0..3;
const DEGRADED_AFTER: std::ops::Range<usize> = 3..8;

/// What the test tells the simulated fleet (the state each cluster reports, when to stop) and what it
/// sees of it as it runs (heartbeats acknowledged per cluster).
struct Script {
    states: Mutex<Vec<SyncState>>,
    acknowledged: Vec<AtomicU64>,
    stop: AtomicBool,
}

impl Script {
    fn new(clusters: usize) -> Script {
        Script {
            states: Mutex::new(vec![SyncState::Synced; clusters]),
            acknowledged: (0..clusters).map(|_| AtomicU64::new(0)).collect(),
            stop: AtomicBool::new(false),
        }
    }

    fn set(&self, clusters: std::ops::Range<usize>, state: SyncState) {
        let mut states = self.states.lock().expect("lock");
        for i in clusters {
            states[i] = state;
        }
    }

    fn acknowledged(&self) -> Vec<u64> {
        self.acknowledged
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect()
    }
}

/// One simulated cluster's record of the run: its heartbeats answered 2xx (sequence, when), and those that
/// were not (sequence, HTTP status if any came back).
#[derive(Debug, Default)]
struct Reported {
    name: String,
    acknowledged: Vec<(u64, Instant)>,
    failed: Vec<(u64, Option<u16>)>,
}

/// Heartbeats through the balancer every [`BEAT`] in the state the script says, retrying a failed one the
/// way the real agent's reporter does (a new heartbeat with the next sequence after its back-off), until
/// the script says stop.
async fn report(
    mut agent: SimulatedAgent,
    index: usize,
    http: reqwest::Client,
    lb: String,
    script: Arc<Script>,
) -> Reported {
    let mut out = Reported {
        name: agent.name.clone(),
        ..Reported::default()
    };
    let mut failures = 0;
    while !script.stop.load(Ordering::Relaxed) {
        let state = script.states.lock().expect("lock")[index];
        let sent = Instant::now();
        let (sequence, answer) = agent.try_beat(&http, &lb, state).await;
        let wait = answer.wait(failures, BEAT);
        if answer != Answer::Acknowledged || sent.elapsed() > Duration::from_secs(3) {
            // Seen only when the test fails (or with --nocapture): what a cluster went through.
            println!(
                "{} heartbeat {sequence}: {answer:?} after {:?}; next in {wait:?}",
                agent.name,
                sent.elapsed()
            );
        }
        match answer {
            Answer::Acknowledged => {
                failures = 0;
                out.acknowledged.push((sequence, Instant::now()));
                script.acknowledged[index].fetch_add(1, Ordering::Relaxed);
            }
            Answer::Failed { status, .. } => {
                failures += 1;
                out.failed.push((sequence, status));
            }
        }
        tokio::time::sleep(wait).await;
    }
    out
}

/// Reads the fleet API of `url` every 200 ms until the script says stop: every cluster it ever showed
/// Unknown, and how many times it looked.
async fn unknown_seen(
    http: reqwest::Client,
    url: String,
    script: Arc<Script>,
) -> (BTreeSet<String>, u32) {
    let mut unknown = BTreeSet::new();
    let mut looks = 0;
    while !script.stop.load(Ordering::Relaxed) {
        // A look that fails (the survivor slow under the load) proves nothing either way: skip it.
        let answer = http.get(format!("{url}/api/v1/fleet")).send().await;
        let body = match answer.and_then(reqwest::Response::error_for_status) {
            Ok(response) => response.bytes().await.ok(),
            Err(_) => None,
        };
        let Some(body) = body.and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let shown = from_api(&body);
        looks += 1;
        unknown.extend(
            shown
                .states
                .into_iter()
                .filter(|(_, state)| state == "Unknown")
                .map(|(name, _)| name),
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (unknown, looks)
}

/// The name of the `i`th simulated cluster.
fn edge(i: usize) -> String {
    format!("edge-{i:03}")
}

/// Waits until the fleet API of `url` shows exactly the clusters in `degraded` Degraded and every other one of
/// the [`FLEET_SIZE`] Synced. Counts alone are not enough: a cluster whose recovery is not in yet can stand in
/// for one whose degradation is not in yet, and the test would move on before the latter ever reported it.
async fn fleet_shows(http: &reqwest::Client, url: &str, degraded: std::ops::Range<usize>) {
    let what = format!("{url} to show edge-{degraded:?} Degraded and the rest Synced");
    let shown = wait_until(&what, Duration::from_secs(30), || async {
        let states = from_api(&get_json(http, &format!("{url}/api/v1/fleet")).await).states;
        let expected = |i: usize| {
            if degraded.contains(&i) {
                "Degraded"
            } else {
                "Synced"
            }
        };
        let wrong: Vec<_> = (0..FLEET_SIZE)
            .map(|i| (edge(i), expected(i)))
            .filter(|(name, want)| states.get(name).map(String::as_str) != Some(*want))
            .collect();
        if wrong.is_empty() {
            Ok(Some(()))
        } else {
            Err(anyhow::anyhow!("not yet as expected: {wrong:?}"))
        }
    })
    .await;
    shown.unwrap_or_else(|error| panic!("{error:#}"));
}

/// Every (cluster, sequence) the heartbeat log in PostgreSQL holds.
async fn stored_heartbeats(url: &str) -> HashSet<(String, u64)> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to PostgreSQL");
    tokio::spawn(connection);
    client
        .query("SELECT cluster, sequence FROM heartbeat_log", &[])
        .await
        .expect("read heartbeat_log")
        .iter()
        .map(|row| {
            let sequence: i64 = row.get(1);
            (row.get(0), u64::try_from(sequence).expect("a sequence"))
        })
        .collect()
}

/// Two replicas behind HAProxy with 200 clusters heartbeating through it every second; the replica leading
/// the notification sender is `kill -9`ed mid-stream. Every heartbeat answered 2xx is a row in PostgreSQL,
/// no cluster is ever shown Unknown (the survivor's fleet API, read every 200 ms, and the notifications),
/// and each state change — Degraded and Recovered, on clusters that changed before and after the kill — is
/// notified under one id. Notifications are at least once: a delivery the dead leader had taken may come
/// again with the same id after its lease (15 s), so duplicates of the same id are counted and allowed only
/// for notifications that existed before the kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_under_load_loses_no_heartbeat_and_no_cluster_turns_unknown() {
    let pg = Postgres::start();
    let (hooks, received) = receiver().await;
    let mut servers = replicas(&pg, &hooks, UNKNOWN_AFTER);
    let addrs: Vec<String> = servers.iter().map(ServerProcess::addr).collect();
    let balancer = LoadBalancer::start(&addrs).await.expect("haproxy");
    let http = client();
    let leader = sole_leader(&http, &servers).await;
    let survivor = servers[1 - leader].url.clone();

    let script = Arc::new(Script::new(FLEET_SIZE));
    let fleet = start_fleet(&http, &balancer.url, &script).await;
    let watcher = tokio::spawn(unknown_seen(
        http.clone(),
        survivor.clone(),
        Arc::clone(&script),
    ));
    fleet_shows(&http, &survivor, 0..0).await;

    script.set(DEGRADED_BEFORE, SyncState::Degraded);
    fleet_shows(&http, &survivor, DEGRADED_BEFORE).await;
    let killed = kill_the_leader(&http, &mut servers, leader, &script).await;
    script.set(DEGRADED_BEFORE, SyncState::Synced);
    script.set(DEGRADED_AFTER, SyncState::Degraded);
    fleet_shows(&http, &survivor, DEGRADED_AFTER).await;
    script.set(DEGRADED_AFTER, SyncState::Synced);
    fleet_shows(&http, &survivor, 0..0).await;
    // The fleet keeps beating while the notifications are watched, so that silence cannot pass for a flap.
    let changed = |range: std::ops::Range<usize>| -> Vec<String> { range.map(edge).collect() };
    one_notification_per_state_change(
        &received,
        &changed(DEGRADED_BEFORE),
        &changed(DEGRADED_AFTER),
        killed,
    )
    .await;

    script.stop.store(true, Ordering::Relaxed);
    let mut reports = Vec::new();
    for task in fleet {
        reports.push(task.await.expect("a simulated cluster"));
    }
    let (unknown, looks) = watcher.await.expect("the fleet API watcher");
    assert!(
        looks >= 10,
        "the survivor's fleet API was read {looks} times"
    );
    assert!(
        unknown.is_empty(),
        "shown Unknown during the run: {unknown:?}"
    );
    every_acknowledged_heartbeat_is_stored(&pg.url, &reports, killed).await;
}

/// Enrols [`FLEET_SIZE`] simulated clusters through the balancer at `lb` and starts each reporting.
async fn start_fleet(
    http: &reqwest::Client,
    lb: &str,
    script: &Arc<Script>,
) -> Vec<tokio::task::JoinHandle<Reported>> {
    let mut fleet = Vec::new();
    for i in 0..FLEET_SIZE {
        let seed = u8::try_from(i + 1).expect("a seed per cluster");
        let mut agent = SimulatedAgent::new(&edge(i), seed, &[("env", "edge")]);
        agent.interval_seconds = BEAT.as_secs();
        assert_eq!(agent.enroll(http, lb).await.status(), 201);
        let run = report(agent, i, http.clone(), lb.to_owned(), Arc::clone(script));
        fleet.push(tokio::spawn(run));
    }
    fleet
}

/// `kill -9`s the replica leading the notification sender while the fleet reports, and waits until the
/// other leads and has heard every cluster twice since; when the kill happened.
async fn kill_the_leader(
    http: &reqwest::Client,
    servers: &mut [ServerProcess],
    leader: usize,
    script: &Script,
) -> Instant {
    let at_kill = script.acknowledged();
    servers[leader].kill9();
    let killed = Instant::now();
    let survivor = &servers[1 - leader];
    let takeover = wait_until("the survivor leading", Duration::from_secs(10), || async {
        let leads = metric(http, survivor, "windvane_notification_sender_leader").await;
        Ok((leads == 1.0).then_some(()))
    });
    takeover
        .await
        .expect("the survivor takes over the notification sender");
    let what = "every cluster heard twice since the kill";
    let beating = wait_until(what, Duration::from_secs(30), || {
        let now = script.acknowledged();
        let all = now.iter().zip(&at_kill).all(|(now, then)| *now >= then + 2);
        async move { Ok(all.then_some(())) }
    });
    beating
        .await
        .expect("the fleet keeps reporting through the survivor");
    killed
}

/// Every heartbeat a simulated cluster had answered 2xx is in the heartbeat log; the figures of the run
/// are printed.
async fn every_acknowledged_heartbeat_is_stored(url: &str, reports: &[Reported], killed: Instant) {
    let stored = stored_heartbeats(url).await;
    let acknowledged: HashSet<(String, u64)> = reports
        .iter()
        .flat_map(|r| r.acknowledged.iter().map(|(seq, _)| (r.name.clone(), *seq)))
        .collect();
    let mut lost: Vec<&(String, u64)> = acknowledged.difference(&stored).collect();
    lost.sort();
    assert!(
        lost.is_empty(),
        "{} acknowledged heartbeats not in PostgreSQL: {lost:?}",
        lost.len()
    );

    let mut failed: BTreeMap<String, usize> = BTreeMap::new();
    for (_, status) in reports.iter().flat_map(|r| &r.failed) {
        // A failure is the dead replica's doing (no answer, or the balancer's 502/503/504) or a busy
        // server's 429/503; a 4xx would be a valid heartbeat refused.
        assert!(
            !status.is_some_and(|s| (400..500).contains(&s) && s != 429),
            "a valid heartbeat refused with {status:?}"
        );
        let what = status.map_or_else(|| "no answer".to_owned(), |s| s.to_string());
        *failed.entry(what).or_default() += 1;
    }
    let after_kill: usize = reports
        .iter()
        .map(|r| r.acknowledged.iter().filter(|(_, at)| *at > killed).count())
        .sum();
    let longest_gap = reports
        .iter()
        .flat_map(|r| r.acknowledged.windows(2).map(|w| w[1].1 - w[0].1))
        .max()
        .unwrap_or_default();
    let unacknowledged_rows = stored.difference(&acknowledged).count();
    println!(
        "{FLEET_SIZE} clusters every {BEAT:?}: {} heartbeats acknowledged ({after_kill} after the kill), all {} \
         in PostgreSQL ({} rows); {} attempts failed {failed:?}; {unacknowledged_rows} stored without an \
         acknowledgement (in flight at the kill); longest gap between two acknowledged heartbeats of one \
         cluster {:.2} s (Unknown after {UNKNOWN_AFTER})",
        acknowledged.len(),
        acknowledged.len(),
        stored.len(),
        failed.values().sum::<usize>(),
        longest_gap.as_secs_f64(),
    );
}

/// The webhook got each state change — `before` clusters' Degraded (before the kill) and Recovered (after
/// it), `after` clusters' Degraded and Recovered (after it) — under one id each, and nothing else (no
/// Unknown). Deliveries are watched until the dead leader's leases have run out ([`outbox::LEASE`] after
/// the kill, and a margin), so that a duplicate it left behind would be seen; a duplicate (the same id
/// again) is allowed only for the notifications that existed before the kill.
async fn one_notification_per_state_change(
    received: &Arc<Mutex<windvane_tests::webhook::Received>>,
    before: &[String],
    after: &[String],
    killed: Instant,
) {
    let expected: BTreeSet<(String, String)> = before
        .iter()
        .chain(after)
        .flat_map(|c| {
            [
                (c.clone(), "Degraded".to_owned()),
                (c.clone(), "Recovered".to_owned()),
            ]
        })
        .collect();
    let seen = || -> Vec<(String, String, String)> {
        received
            .lock()
            .expect("lock")
            .by_path
            .get("/hook")
            .map_or_else(Vec::new, |list| {
                list.iter()
                    .map(|v| {
                        let text = |key: &str| v[key].as_str().unwrap_or_default().to_owned();
                        (text("cluster"), text("trigger"), text("id"))
                    })
                    .collect()
            })
    };
    let watch_until = (killed + outbox::LEASE + Duration::from_secs(3))
        .max(Instant::now() + Duration::from_secs(2));
    let what = "one notification per state change, until the dead leader's leases ran out";
    // Generous: a delivery that timed out on a loaded machine is retried on a back-off of up to 30 s.
    let watched = wait_until(what, Duration::from_secs(180), || {
        let arrived = seen();
        let changes: BTreeSet<(String, String)> = arrived
            .iter()
            .map(|(c, t, _)| (c.clone(), t.clone()))
            .collect();
        let unexpected: Vec<_> = changes.difference(&expected).collect();
        assert!(
            unexpected.is_empty(),
            "notified: {unexpected:?}; all: {arrived:?}"
        );
        let done = changes == expected && Instant::now() >= watch_until;
        async move { Ok(done.then_some(arrived)) }
    });
    let arrived = watched
        .await
        .unwrap_or_else(|error| panic!("{error:#}: {:?}", seen()));

    let mut ids: BTreeMap<(String, String), BTreeMap<String, usize>> = BTreeMap::new();
    for (cluster, trigger, id) in &arrived {
        *ids.entry((cluster.clone(), trigger.clone()))
            .or_default()
            .entry(id.clone())
            .or_default() += 1;
    }
    let mut duplicates = 0;
    for (change, by_id) in &ids {
        assert_eq!(
            by_id.len(),
            1,
            "{change:?} notified under several ids: {by_id:?}"
        );
        let copies = by_id.values().sum::<usize>();
        let existed_before_kill = change.1 == "Degraded" && before.contains(&change.0);
        assert!(
            copies == 1 || existed_before_kill,
            "{change:?} sent {copies} times, though it came after the kill: {by_id:?}"
        );
        duplicates += copies - 1;
    }
    println!(
        "notifications: {} state changes, {} deliveries, {duplicates} duplicates (same id, a lease of the dead leader)",
        ids.len(),
        arrived.len()
    );
}
