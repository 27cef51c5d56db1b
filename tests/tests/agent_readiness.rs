//! Every replica of the agent is Ready when it works (issue 45, item 4): `/readyz` answers 200 on the leader
//! and on a standby alike, because both run their election loop and reach the API server; which replica leads
//! is `windvane_agent_leader` and the `replica` field of `/status`. A replica that cannot reach the API server
//! is NotReady, with the reason. Before this change a standby answered 503 ("no release enforced yet") for
//! as long as it stood by, so `kubectl rollout status` never ended on a cluster of several nodes.
//!
//! The real agent binary on a simulated-node localkube: readiness is the agent's own answer, which the
//! kubelet only relays (the real-node install in `realnode_install.rs` shows the kubelet's side).

use std::time::Duration;

use windvane_tests::fleet::{Agent, AgentOptions, FleetTree, Publisher};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::process::free_port;
use windvane_tests::store_server::StoreServer;

const WAIT: Duration = Duration::from_secs(60);

/// `/readyz`'s status code and body.
async fn readyz(agent: &Agent) -> anyhow::Result<(u16, String)> {
    let response = reqwest::get(format!("http://{}/readyz", agent.admin)).await?;
    Ok((response.status().as_u16(), response.text().await?))
}

/// The value of the unlabelled gauge `name` in `/metrics`.
async fn gauge(agent: &Agent, name: &str) -> anyhow::Result<Option<String>> {
    let metrics = agent.metrics().await?;
    Ok(metrics
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .map(str::to_owned))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_is_ready_and_leadership_is_a_metric_and_a_status_field() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(45)?;
    let tree = FleetTree::new()?;
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: app\n    path: app\n",
    )?;
    tree.write(
        "app/settings.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: default}\ndata: {mode: strict}\n",
    )?;
    publisher.publish(&tree, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let mut options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1");
    options.identity = "replica-a".into();
    let leader = Agent::start(&kube, &options).await?;
    leader
        .wait_status("the leader synced", WAIT, |s| s["state"] == "Synced")
        .await?;
    options.identity = "replica-b".into();
    let standby = Agent::start(&kube, &options).await?;
    wait_for("replica-b stands by", WAIT, || async {
        Ok(standby.process.log().contains("standing by").then_some(()))
    })
    .await?;

    let (code, body) = readyz(&standby).await?;
    assert_eq!((code, body.trim()), (200, "ok: standby"), "a standby works");
    let (code, body) = readyz(&leader).await?;
    assert_eq!(code, 200, "{body}");
    assert!(
        body.starts_with("ok: leader, enforcing serial "),
        "the leader says what it enforces: {body}"
    );
    assert_eq!(
        gauge(&standby, "windvane_agent_leader").await?.as_deref(),
        Some("0")
    );
    assert_eq!(
        gauge(&leader, "windvane_agent_leader").await?.as_deref(),
        Some("1")
    );
    let status = standby.status().await?;
    assert_eq!(status["replica"]["role"], "standby", "{status}");
    assert_eq!(status["replica"]["leader"], false, "{status}");
    let status = leader.status().await?;
    assert_eq!(status["replica"]["role"], "leader", "{status}");

    // A replica that cannot reach the API server does not work: NotReady, saying why. Its kubeconfig names a
    // port nobody listens on.
    let dead = kube.data_dir().join("dead.kubeconfig");
    let config = std::fs::read_to_string(kube.kubeconfig_path())?;
    let port = free_port()?;
    std::fs::write(
        &dead,
        config.replace(kube.server_url(), &format!("https://127.0.0.1:{port}")),
    )?;
    options.identity = "replica-c".into();
    options.kubeconfig = Some(dead);
    let cut_off = Agent::start(&kube, &options).await?;
    let body = wait_for("replica-c answers /readyz", WAIT, || async {
        Ok(readyz(&cut_off).await.ok())
    })
    .await?;
    assert_eq!(body.0, 503, "{}", body.1);
    assert!(
        body.1.contains("has not reached the API server"),
        "{}",
        body.1
    );
    Ok(())
}
