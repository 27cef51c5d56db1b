//! Releases in seconds, still pull: an agent polling `windvane-server` every ten minutes sees a new pointer
//! within 1 s of `windvane publish` (the real command line) finishing — by the agent's own log line, so the
//! bound is on the long poll, not on fetching and applying the bundle — because the server holds its poll
//! until the pointer changes; the same agent against a static host that ignores `Prefer` polls on its
//! interval only.

mod fault_support;

use std::time::{Duration, Instant};

use anyhow::Context;
use fault_support::{SYNC, config_map, data};
use jiff::{SignedDuration, Timestamp};
use serde_json::Value;
use windvane_tests::fleet::{Agent, AgentOptions, FleetTree, Publisher};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::process::tail;
use windvane_tests::server::SourceServer;
use windvane_tests::store_server::StoreServer;

fn release(tree: &FleetTree, version: &str) -> anyhow::Result<()> {
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: web\n    path: web\n",
    )?;
    tree.write(
        "web/config.yaml",
        &format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: web, namespace: default}}\ndata: {{version: \"{version}\"}}\n"
        ),
    )?;
    Ok(())
}

/// The agent's log line saying it saw a new pointer (verified, its bundle not fetched yet).
const POINTER_SEEN: &str = "a new release pointer verified; fetching its bundle";

/// When the agent's JSON log says it saw the pointer of `serial` ([`POINTER_SEEN`]), by its own clock.
fn pointer_seen(log: &str, serial: u64) -> Option<Timestamp> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| {
            line["fields"]["message"] == POINTER_SEEN && line["fields"]["serial"] == serial
        })
        .and_then(|line| line["timestamp"].as_str()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_reaches_a_long_polling_agent_in_seconds() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(41)?;
    let tree = FleetTree::new()?;
    release(&tree, "1")?;
    publisher.publish_cli(&tree, "stable")?;
    let server = SourceServer::start(&publisher.store(), &[]).await?;
    let mut options = AgentOptions::new(&server.url, &publisher.public_key_path(), "prod-eu");
    // Plain polling would see the next release ten minutes from now.
    options.poll_interval = "10m".to_owned();
    options
        .extra
        .extend(["--log-format".to_owned(), "json".to_owned()]);
    let agent = Agent::start(&kube, &options).await?;
    agent
        .wait_status("release 1 Synced", SYNC, |s| {
            s["state"] == "Synced" && s["source"]["appliedSerial"] == 1
        })
        .await?;
    wait_for("the agent's poll held by the server", SYNC, || async {
        let (_, metrics) = server.get("/metrics").await?;
        Ok(metrics
            .lines()
            .any(|l| l == "windvane_held_polls 1")
            .then_some(()))
    })
    .await?;

    // The real command line, as an operator publishes; the clock starts when it has finished.
    release(&tree, "2")?;
    let started = Instant::now();
    publisher.publish_cli(&tree, "stable")?;
    let published = Timestamp::now();
    let command = started.elapsed();
    let seen = wait_for(
        "the agent saying it saw the serial 2 pointer",
        Duration::from_secs(30),
        || async { Ok(pointer_seen(&agent.process.log(), 2)) },
    )
    .await
    .with_context(|| tail(&agent.process.log(), 40))?;
    let latency = seen.duration_since(published);
    println!(
        "windvane publish ({command:?}) finished → the agent polling every 10 min saw the new pointer {:.3} s later",
        latency.as_secs_f64()
    );
    assert!(
        latency <= SignedDuration::from_secs(1),
        "the long-polling agent saw serial 2 {latency:#} after windvane publish finished (at most 1 s)"
    );

    wait_for("release 2 applied", Duration::from_secs(30), || async {
        let cm = config_map(&kube, "default", "web").await?;
        Ok((data(cm.as_ref(), "version") == Some("2")).then_some(()))
    })
    .await?;
    println!(
        "windvane publish finished → applied: {:?}",
        started.elapsed().saturating_sub(command)
    );
    agent
        .wait_status("release 2 Synced", SYNC, |s| {
            s["source"]["appliedSerial"] == 2
        })
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_host_is_polled_on_the_interval() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(42)?;
    let tree = FleetTree::new()?;
    release(&tree, "1")?;
    publisher.publish(&tree, "stable")?;
    let store = StoreServer::start(publisher.store()).await?;
    let mut options = AgentOptions::new(&store.url(), &publisher.public_key_path(), "prod-eu");
    options.poll_interval = "2s".to_owned();
    let agent = Agent::start(&kube, &options).await?;
    agent
        .wait_status("release 1 Synced", SYNC, |s| s["state"] == "Synced")
        .await?;
    // Over ten seconds a 2 s interval (±20 %) gives at most about six polls: the agent does not take the
    // static host's quick answers for held polls.
    let before = store.requests().len();
    let window = Instant::now();
    wait_for(
        "ten seconds of polling",
        Duration::from_secs(20),
        || async { Ok((window.elapsed() >= Duration::from_secs(10)).then_some(())) },
    )
    .await?;
    let polls = store.requests().len() - before;
    assert!(
        (3..=7).contains(&polls),
        "{polls} polls in 10 s of a 2 s interval"
    );
    Ok(())
}
