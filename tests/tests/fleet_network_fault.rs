//! An unreachable cluster made by a real network fault, not a stopped agent: the agent reaches the real
//! `windvane-server` (its source and its heartbeat endpoint) only through a loopback TCP proxy, which then
//! blackholes the traffic — connections stay open, nothing passes. The server shows the cluster Unknown once
//! the grace period passes, with its last reported state; the agent, cut off, keeps healing drift on its
//! cluster; once the proxy forwards again the cluster is Synced again and the drift it repaired meanwhile
//! reaches the server's drift log.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use windvane_tests::fleet::{AgentOptions, Cluster, FleetTree, Publisher};
use windvane_tests::poll::wait_for;
use windvane_tests::process::tail;
use windvane_tests::proxy::Proxy;
use windvane_tests::server::SourceServer;

const WAIT: Duration = Duration::from_secs(120);
/// The server's silence grace period and the agent's heartbeat interval: short, so the test is quick.
const UNKNOWN_AFTER: &str = "3s";
const HEARTBEAT: &str = "1s";
/// How long a repair during the outage may take: polls and heartbeats run in their own tasks with total
/// deadlines, so a blackholed source never holds up enforcement and a repair keeps its normal latency of
/// well under a second; 10 s leaves room for a loaded CI machine.
const REPAIR: Duration = Duration::from_secs(10);

const FLEET: &str = "fleet: acme\napps:\n  - name: web\n    path: web\n";
const WEB: &str = "\
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: registry.example.com/web:1.0}]
";

async fn replicas(cluster: &Cluster) -> anyhow::Result<Option<i32>> {
    let deployments: Api<Deployment> = Api::namespaced(cluster.kube.client(), "shop");
    Ok(deployments.get("web").await?.spec.replicas)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_cluster_is_unknown_keeps_healing_and_is_synced_again() -> anyhow::Result<()> {
    let publisher = Publisher::new(91)?;
    let tree = FleetTree::new()?;
    tree.write("fleet.yaml", FLEET)?;
    tree.write("web/objects.yaml", WEB)?;
    publisher.publish(&tree, "stable")?;
    let mut server =
        SourceServer::start(&publisher.store(), &["--unknown-after", UNKNOWN_AFTER]).await?;
    let target: SocketAddr = server
        .url
        .trim_start_matches("http://")
        .parse()
        .context("the server's address")?;
    let proxy = Proxy::start(target).await?;
    let options = AgentOptions::new(&proxy.url(), &publisher.public_key_path(), "edge-1")
        .reporting_to(&proxy.url(), &server.token_file, HEARTBEAT);
    let mut cluster = Cluster::start(options).await?;
    let log = |cluster: &Cluster| format!("agent log:\n{}", tail(&cluster.agent_log(), 60));
    server
        .wait_cluster("edge-1", "edge-1 Synced", WAIT, |v| {
            v["cluster"]["state"] == "Synced" && v["cluster"]["appliedSerial"] == 1
        })
        .await
        .with_context(|| log(&cluster))?;

    proxy.blackhole();
    let cut = Instant::now();
    let view = server
        .wait_cluster("edge-1", "edge-1 Unknown", WAIT, |v| {
            v["cluster"]["state"] == "Unknown"
        })
        .await?;
    eprintln!(
        "edge-1 Unknown {:.1}s after the network was cut",
        cut.elapsed().as_secs_f64()
    );
    assert!(
        view["cluster"]["heartbeatAgeSeconds"].as_u64().unwrap_or(0) >= 3
            && view["cluster"]["graceSeconds"] == 3,
        "Unknown only once the last heartbeat is older than the grace period: {view}"
    );
    assert_eq!(view["cluster"]["lastReported"], "Synced", "{view}");
    assert!(cluster.agent_pid().is_some(), "the agent still runs");

    // Cut off from the server, the agent still repairs drift on its own cluster, at its normal pace.
    let params = PatchParams {
        field_manager: Some("kubectl-scale".into()),
        ..PatchParams::default()
    };
    Api::<Deployment>::namespaced(cluster.kube.client(), "shop")
        .patch_scale(
            "web",
            &params,
            &Patch::Merge(json!({"spec": {"replicas": 6}})),
        )
        .await?;
    let scaled = Instant::now();
    wait_for("the scale reverted during the outage", REPAIR, || async {
        Ok((replicas(&cluster).await? == Some(2)).then_some(()))
    })
    .await
    .with_context(|| log(&cluster))?;
    eprintln!(
        "drift repaired {:.1}s after the scale, during the outage",
        scaled.elapsed().as_secs_f64()
    );
    let still = server.api("/api/v1/clusters/edge-1").await?;
    assert_eq!(
        still["cluster"]["state"], "Unknown",
        "repaired while still cut off: {still}"
    );

    proxy.forward();
    server
        .wait_cluster("edge-1", "edge-1 Synced again", WAIT, |v| {
            v["cluster"]["state"] == "Synced"
        })
        .await
        .with_context(|| log(&cluster))?;
    server
        .wait_drift(
            "edge-1",
            "the outage's drift in the server's drift log",
            WAIT,
            |e| {
                e["record"]["name"] == "web"
                    && e["record"]["manager"] == "kubectl-scale"
                    && !e["record"]["revertedAt"].is_null()
            },
        )
        .await
        .with_context(|| log(&cluster))?;

    cluster.stop().await?;
    server.stop().await;
    Ok(())
}
