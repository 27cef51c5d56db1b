//! Two `windvane-server` replicas on one PostgreSQL behind a real HAProxy (round robin, health checks on
//! `/readyz`), as a fleet that outgrows one server runs them: any replica takes any heartbeat; a heartbeat
//! replayed to the other replica is refused; wrong tokens are counted for the fleet, not per replica, by the
//! client's address that the trusted balancer forwards (a forged `X-Forwarded-For` does not help); each
//! notification is sent once for the fleet, by the one replica leading the sender; the page and API agree
//! whichever replica answers; and when the leading replica dies the other takes over, notifications included.

use std::time::{Duration, Instant};

use serde_json::Value;
use windvane_shared::status::SyncState;
use windvane_tests::haproxy::{LoadBalancer, PROXY_SOURCE};
use windvane_tests::heartbeat_agent::SimulatedAgent;
use windvane_tests::http::{client, get_json, json_body};
use windvane_tests::poll::wait_for as wait_until;
use windvane_tests::postgres::Postgres;
use windvane_tests::server::{Options, ServerProcess};
use windvane_tests::webhook::{receiver, stays_quiet, triggers, wait_for};

/// Two replicas on `pg`, each sending notifications to `hooks` and trusting the balancer's address.
fn replicas(pg: &Postgres, hooks: &str) -> Vec<ServerProcess> {
    let notifications = serde_json::json!({
        "sinks": [{ "name": "ops", "type": "webhook", "url": format!("{hooks}/hook") }]
    });
    (0..2)
        .map(|_| {
            ServerProcess::start(Options {
                database_url: Some(pg.url.clone()),
                notifications: Some(notifications.to_string()),
                unknown_after: Some("3s".into()),
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

/// The fleet as the API reports it, without what changes by the second (ages).
fn fleet_summary(fleet: &Value) -> Value {
    serde_json::json!({ "total": fleet["total"], "counts": fleet["counts"] })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_behind_a_load_balancer_act_as_one_server() {
    let pg = Postgres::start();
    let (hooks, received) = receiver().await;
    let mut servers = replicas(&pg, &hooks);
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
    for server in &servers {
        let direct = get_json(&http, &format!("{}/api/v1/fleet", server.url)).await;
        assert_eq!(
            fleet_summary(&direct),
            fleet_summary(&through_balancer),
            "replica {} disagrees",
            server.url
        );
    }
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
    received: &std::sync::Arc<std::sync::Mutex<windvane_tests::webhook::Received>>,
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
