//! `dependsOn` on a real cluster: app `web` depends on app `db`, whose Deployment's pod carries a readiness
//! gate that nobody sets at first (localkube's node keeps the pod unready). In order:
//!
//! 1. `db` applies; `web`'s ConfigMap is not sent: the agent reports it Progressing, naming `db` and why it
//!    is not ready, and app `tools` (no dependencies) is Synced meanwhile;
//! 2. the test (as the controller the gate belongs to) sets the gate's condition on the pod: the Deployment
//!    turns healthy and `web` follows without a new release — the agent looks again while apps wait.

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use windvane_tests::fleet::{Agent, AgentOptions, FleetTree, Publisher, object_state};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::store_server::StoreServer;

const WAIT: Duration = Duration::from_secs(90);
const GATE: &str = "example.com/migrated";

const FLEET: &str = "\
fleet: acme
apps:
  - name: web
    path: web
    dependsOn: [db]
  - name: db
    path: db
  - name: tools
    path: tools
";

const DB: &str = "\
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: db, namespace: shop}
spec:
  replicas: 1
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      readinessGates: [{conditionType: example.com/migrated}]
      containers: [{name: db, image: registry.example.com/db:1.0}]
";

const WEB: &str = "\
apiVersion: v1
kind: ConfigMap
metadata: {name: web, namespace: shop}
data: {database: db.shop.svc}
";

const TOOLS: &str = "\
apiVersion: v1
kind: ConfigMap
metadata: {name: tools, namespace: default}
data: {mode: ops}
";

fn message<'a>(status: &'a Value, object: &str) -> &'a str {
    status["objects"]
        .as_array()
        .and_then(|o| o.iter().find(|x| x["object"] == object))
        .and_then(|x| x["message"].as_str())
        .unwrap_or_default()
}

/// Sets the readiness gate's condition on the db pod, as the controller owning the gate would.
async fn open_gate(kube: &LocalKube) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(kube.client(), "shop");
    let listed = pods.list(&ListParams::default().labels("app=db")).await?;
    let pod = listed.items.first().context("the db pod")?;
    let name = pod.metadata.name.clone().context("pod name")?;
    let mut conditions = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    conditions.retain(|c| c.type_ != GATE);
    let mut conditions = serde_json::to_value(conditions)?;
    if let Some(list) = conditions.as_array_mut() {
        list.push(json!({"type": GATE, "status": "True", "lastTransitionTime": jiff::Timestamp::now().to_string()}));
    }
    pods.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"conditions": conditions}})),
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_is_applied_only_once_the_app_it_depends_on_is_healthy() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(67)?;
    let tree = FleetTree::new()?;
    tree.write("fleet.yaml", FLEET)?;
    tree.write("db/db.yaml", DB)?;
    tree.write("web/web.yaml", WEB)?;
    tree.write("tools/tools.yaml", TOOLS)?;
    publisher.publish(&tree, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1");
    let agent = Agent::start(&kube, &options).await?;

    // 1. db is applied but not healthy: web waits, naming why; tools does not wait for anyone.
    let status = agent
        .wait_status("web waiting for db", WAIT, |st| {
            object_state(st, "Deployment shop/db") == Some("Progressing")
                && object_state(st, "ConfigMap shop/web") == Some("Progressing")
                && message(st, "ConfigMap shop/web").contains("waits for app db")
                && object_state(st, "ConfigMap default/tools") == Some("Synced")
        })
        .await?;
    let why = message(&status, "ConfigMap shop/web");
    assert!(why.contains("Deployment shop/db is not healthy"), "{why}");
    let config_maps: Api<ConfigMap> = Api::namespaced(kube.client(), "shop");
    assert!(
        config_maps.get_opt("web").await?.is_none(),
        "web is never sent before db is healthy"
    );

    // 2. The gate opens: db turns healthy and web follows, with no new release.
    wait_for("the db pod", WAIT, || async {
        Ok(open_gate(&kube).await.ok())
    })
    .await?;
    agent
        .wait_status("web applied after db", WAIT, |st| {
            object_state(st, "Deployment shop/db") == Some("Synced")
                && object_state(st, "ConfigMap shop/web") == Some("Synced")
                && st["state"] == "Synced"
        })
        .await?;
    let web = config_maps.get("web").await?;
    assert_eq!(
        web.data
            .unwrap_or_default()
            .get("database")
            .map(String::as_str),
        Some("db.shop.svc")
    );
    Ok(())
}
