//! A heartbeat answered 2xx survives `kill -9`: many agents send concurrently, the server process is killed
//! with SIGKILL mid-stream, and after a restart every acknowledged heartbeat is in the SQLite file and the
//! server refuses to take its sequence again.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use windvane_shared::wire::status::SyncState;
use windvane_tests::heartbeat_agent::SimulatedAgent;
use windvane_tests::http::client;
use windvane_tests::poll::eventually;
use windvane_tests::server::{Options, ServerProcess};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_heartbeats_survive_kill_9() {
    let mut server = ServerProcess::start(Options::default());
    let http = client();
    let agents = 16;
    for i in 0..agents {
        let agent = SimulatedAgent::new(&format!("c{i}"), i as u8 + 1, &[]);
        assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
    }

    let acked: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let mut senders = Vec::new();
    for i in 0..agents {
        let (http, url, acked) = (http.clone(), server.url.clone(), Arc::clone(&acked));
        senders.push(tokio::spawn(async move {
            let mut agent = SimulatedAgent::new(&format!("c{i}"), i as u8 + 1, &[]);
            loop {
                let hb = agent.next(SyncState::Synced);
                let sent = http
                    .post(format!("{url}/api/v1/clusters/{}/heartbeat", agent.name))
                    .body(agent.sign(&hb))
                    .send()
                    .await;
                match sent {
                    Ok(response) if response.status() == 200 => {
                        acked
                            .lock()
                            .expect("lock")
                            .push((agent.name.clone(), hb.sequence));
                    }
                    Ok(response) => panic!("unexpected {} before the kill", response.status()),
                    Err(_) => return, // the server is gone
                }
            }
        }));
    }
    // Let a good number be acknowledged, then kill without warning.
    eventually(
        "500 acknowledged heartbeats",
        Duration::from_secs(60),
        || {
            let acked = Arc::clone(&acked);
            async move { (acked.lock().expect("lock").len() >= 500).then_some(()) }
        },
    )
    .await;
    server.kill9();
    for sender in senders {
        sender.await.expect("sender");
    }
    let acked = acked.lock().expect("lock").clone();

    server.restart();
    let conn = rusqlite::Connection::open(server.db_path()).expect("open");
    let mut missing = Vec::new();
    for (cluster, sequence) in &acked {
        let found: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM heartbeat_log WHERE cluster = ?1 AND sequence = ?2",
                rusqlite::params![cluster, *sequence as i64],
                |r| r.get(0),
            )
            .expect("query");
        if found != 1 {
            missing.push((cluster.clone(), *sequence));
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged heartbeats lost: {:?}",
        missing.len(),
        acked.len(),
        &missing[..missing.len().min(10)]
    );
    assert!(server.stored_heartbeats(None) >= acked.len() as u64);

    // The restarted server knows the last sequence of each cluster and refuses a replay of it.
    let (cluster, sequence) = acked.last().expect("some").clone();
    let index: u8 = cluster[1..].parse().expect("index");
    let mut agent = SimulatedAgent::new(&cluster, index + 1, &[]);
    agent.sequence = sequence - 1;
    let replay = agent.next(SyncState::Synced);
    assert_eq!(
        agent
            .post(&http, &server.url, agent.sign(&replay))
            .await
            .status(),
        409
    );
}
