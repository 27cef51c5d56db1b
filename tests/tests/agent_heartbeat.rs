//! An agent against localkube, polling the real source server and reporting to it: it enrols, heartbeats,
//! and shows up Synced in the API and in `windvane status`; drift it repairs reaches the drift audit log with
//! who did it; and when it goes silent the server shows it Unknown, never Synced. When an admin forgets the
//! cluster (`windvane cluster forget` with the admin token; the registration token cannot), the agent notices
//! at its next heartbeat (404), enrols again, and the cluster reappears.

use std::process::Command;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use windvane_tests::fleet::{Agent, AgentOptions, FleetTree, Publisher};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::process::{binary, tail};
use windvane_tests::server::SourceServer;

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_enrols_heartbeats_shows_synced_then_unknown_when_silent() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(31)?;
    let tree = FleetTree::new()?;
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: web\n    path: web\n",
    )?;
    tree.write(
        "web/deployment.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: default}\nspec:\n  replicas: 2\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec: {containers: [{name: web, image: registry.example.com/web:1.0}]}\n",
    )?;
    publisher.publish(&tree, "stable")?;
    let server = SourceServer::start(&publisher.store(), &["--unknown-after", "4s"]).await?;

    // The release command line reads the same store over HTTP, verifying it as an agent would.
    let key = publisher.public_key_path();
    let verify = Command::new(binary("windvane")?)
        .args([
            "verify",
            "--root",
            &server.url,
            "--channel",
            "stable",
            "--fleet",
            "acme",
            "--trusted-key",
        ])
        .arg(&key)
        .output()?;
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );
    assert!(String::from_utf8_lossy(&verify.stdout).contains("serial:   1"));

    let mut options = AgentOptions::new(&server.url, &publisher.public_key_path(), "prod-eu");
    options.labels = vec!["env=prod".into(), "region=eu".into()];
    options.extra = vec![
        "--server".into(),
        server.url.clone(),
        "--registration-token-file".into(),
        server.token_file.display().to_string(),
        "--heartbeat-interval".into(),
        "1s".into(),
    ];
    let mut agent = Agent::start(&kube, &options).await?;

    // Enrolled, heartbeating, Synced — in the API and in `windvane status`.
    let cluster = wait_for("prod-eu Synced on the server", WAIT, || async {
        let view = server.api("/api/v1/clusters/prod-eu").await?;
        Ok((view["cluster"]["state"] == "Synced").then_some(view))
    })
    .await?;
    assert_eq!(cluster["cluster"]["appliedSerial"], 1);
    assert_eq!(cluster["cluster"]["labels"]["region"], "eu");
    let status = Command::new(binary("windvane")?)
        .args(["status", "--server", &server.url, "--selector", "env=prod"])
        .output()?;
    assert!(
        status.status.success(),
        "{}{}",
        String::from_utf8_lossy(&status.stdout),
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(String::from_utf8_lossy(&status.stdout).contains("prod-eu"));

    // Drift repaired on the cluster reaches the server's audit log, naming who did it.
    let params = PatchParams {
        field_manager: Some("kubectl-scale".into()),
        ..PatchParams::default()
    };
    Api::<Deployment>::namespaced(kube.client(), "default")
        .patch_scale(
            "web",
            &params,
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await?;
    let drift = wait_for("drift in the audit log", WAIT, || async {
        let drift = server.api("/api/v1/drift?cluster=prod-eu").await?;
        let text = drift.to_string();
        Ok((text.contains("kubectl-scale") && text.contains("revertedAt")).then_some(drift))
    })
    .await?;
    assert!(drift.to_string().contains("/spec/replicas"), "{drift}");

    // Silent: Unknown, with its last reported state, and `windvane status` fails.
    agent.process.kill();
    let view = wait_for("prod-eu Unknown", WAIT, || async {
        let view = server.api("/api/v1/clusters/prod-eu").await?;
        Ok((view["cluster"]["state"] == "Unknown").then_some(view))
    })
    .await?;
    assert_eq!(view["cluster"]["lastReported"], "Synced");
    let fleet = server.api("/api/v1/fleet").await?;
    assert_eq!(fleet["counts"]["Unknown"], 1, "{fleet}");
    assert!(
        fleet["counts"]["Synced"].as_u64().unwrap_or(0) == 0,
        "a silent cluster is never counted Synced: {fleet}"
    );
    let status = Command::new(binary("windvane")?)
        .args(["status", "--server", &server.url])
        .output()?;
    assert!(!status.status.success());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgotten_cluster_enrols_again_and_reappears() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(32)?;
    let tree = FleetTree::new()?;
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: web\n    path: web\n",
    )?;
    tree.write(
        "web/config.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: web, namespace: default}\ndata: {a: b}\n",
    )?;
    publisher.publish(&tree, "stable")?;
    let server = SourceServer::start(&publisher.store(), &[]).await?;
    let options = AgentOptions::new(&server.url, &publisher.public_key_path(), "prod-eu")
        .reporting_to(&server.url, &server.token_file, "1s");
    let agent = Agent::start(&kube, &options).await?;
    wait_for("prod-eu Synced on the server", WAIT, || async {
        let view = server.api("/api/v1/clusters/prod-eu").await?;
        Ok((view["cluster"]["state"] == "Synced").then_some(()))
    })
    .await?;
    let forget = |token: &std::path::Path| -> anyhow::Result<std::process::Output> {
        Ok(Command::new(binary("windvane")?)
            .args(["cluster", "forget", "prod-eu", "--server", &server.url])
            .arg("--admin-token-file")
            .arg(token)
            .output()?)
    };

    // The registration token, which the agent holds, is no admin credential.
    let refused = forget(&server.token_file)?;
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("401"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    let forgotten = forget(&server.admin_token_file)?;
    assert!(
        forgotten.status.success(),
        "{}",
        String::from_utf8_lossy(&forgotten.stderr)
    );
    // The agent's next heartbeat is refused (404); it says so, enrols again, and the cluster is back.
    let enrolled_twice = "windvane_enrolments_total{result=\"enrolled\"} 2";
    wait_for("prod-eu enrolled again", WAIT, || async {
        Ok(agent
            .metrics()
            .await?
            .contains(enrolled_twice)
            .then_some(()))
    })
    .await
    .with_context(|| tail(&agent.process.log(), 40))?;
    let view = wait_for("prod-eu Synced on the server again", WAIT, || async {
        let view = server.api("/api/v1/clusters/prod-eu").await?;
        Ok((view["cluster"]["state"] == "Synced").then_some(view))
    })
    .await?;
    assert_eq!(view["cluster"]["appliedSerial"], 1);
    let log = agent.process.log();
    assert!(
        log.contains("no longer accepts this cluster's key") && log.contains("404"),
        "{}",
        tail(&log, 40)
    );
    Ok(())
}
