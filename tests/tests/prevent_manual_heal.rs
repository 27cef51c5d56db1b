//! Manual heal against a real control plane: with selfHeal false, a scale is only reported (OutOfSync);
//! `kubectl annotate … windvane.io/revert=now` reverts it once, records who asked (the field manager of the
//! request) in the drift record, and the request annotation is consumed.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use windvane_tests::fleet::{Agent, AgentOptions, FleetTree, Publisher, object_state};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::store_server::StoreServer;

const WAIT: Duration = Duration::from_secs(60);

const FLEET: &str =
    "fleet: acme\napps:\n  - name: web\n    path: web\n    policy: {selfHeal: false}\n";

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

fn kubectl(kube: &LocalKube, args: &[&str]) -> anyhow::Result<()> {
    let output = kube.kubectl(args).output()?;
    anyhow::ensure!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alert_only_drift_is_reverted_once_on_request() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(41)?;
    let tree = FleetTree::new()?;
    tree.write("fleet.yaml", FLEET)?;
    tree.write("web/objects.yaml", WEB)?;
    publisher.publish(&tree, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1");
    let agent = Agent::start(&kube, &options).await?;
    agent
        .wait_status("synced", WAIT, |st| st["state"] == "Synced")
        .await?;
    let deployments: Api<Deployment> = Api::namespaced(kube.client(), "shop");

    kubectl(
        &kube,
        &["-n", "shop", "scale", "deployment/web", "--replicas=5"],
    )?;
    agent
        .wait_status("reported", WAIT, |st| {
            object_state(st, "Deployment shop/web") == Some("OutOfSync")
        })
        .await?;
    assert_eq!(deployments.get("web").await?.spec.replicas, Some(5));

    kubectl(
        &kube,
        &[
            "-n",
            "shop",
            "annotate",
            "deployment/web",
            "windvane.io/revert=now",
        ],
    )?;
    wait_for("reverted on request", WAIT, || async {
        let web = deployments.get("web").await?;
        let consumed = !web
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("windvane.io/revert");
        Ok((web.spec.replicas == Some(2) && consumed).then_some(()))
    })
    .await?;
    let status = agent
        .wait_status("recorded", WAIT, |st| {
            st["drift"].as_array().is_some_and(|d| {
                d.iter()
                    .any(|r| r["action"] == "Reverted" && r["revertRequestedBy"].is_string())
            })
        })
        .await?;
    let record = status["drift"]
        .as_array()
        .and_then(|d| d.iter().find(|r| r["action"] == "Reverted"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(record["revertRequestedBy"], "kubectl-annotate", "{record}");
    assert_eq!(record["manager"], "kubectl", "{record}");
    Ok(())
}
