//! Manual heal and the audit export against a real control plane and a real source server: with selfHeal
//! false, a scale is only reported (OutOfSync); `kubectl annotate … windvane.io/revert=now` reverts it once,
//! records who asked (the field manager of the request) in the drift record, and the request annotation is
//! consumed; `windvane-agent heal --object` does the same and records the caller's user. The server exports every drift record it stores as a JSON line with the documented fields
//! (`--audit-export FILE`), and `/api/v1/drift` pages (`limit`, `offset`, `next`).

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use windvane_tests::fleet::{Agent, AgentOptions, FleetTree, Publisher, object_state};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::server::SourceServer;

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
    let audit_dir = tempfile::tempdir()?;
    let audit = audit_dir.path().join("drift.jsonl");
    let audit_arg = audit.display().to_string();
    let server = SourceServer::start(&publisher.store(), &["--audit-export", &audit_arg]).await?;
    let mut options = AgentOptions::new(&server.url, &publisher.public_key_path(), "c1");
    options.extra = vec![
        "--server".into(),
        server.url.clone(),
        "--registration-token-file".into(),
        server.token_file.display().to_string(),
        "--heartbeat-interval".into(),
        "1s".into(),
    ];
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

    // The same through `windvane-agent heal`, which records the caller's user name.
    kubectl(
        &kube,
        &["-n", "shop", "scale", "deployment/web", "--replicas=6"],
    )?;
    agent
        .wait_status("reported again", WAIT, |st| {
            object_state(st, "Deployment shop/web") == Some("OutOfSync")
        })
        .await?;
    let heal = std::process::Command::new(windvane_tests::process::binary("windvane-agent")?)
        .args([
            "heal",
            "--object",
            "Deployment.apps/shop/web",
            "--kubeconfig",
        ])
        .arg(kube.kubeconfig_path())
        .output()?;
    assert!(
        heal.status.success(),
        "{}",
        String::from_utf8_lossy(&heal.stderr)
    );
    let status = agent
        .wait_status("healed by the command", WAIT, |st| {
            st["drift"].as_array().is_some_and(|d| {
                d.iter()
                    .any(|r| r["revertRequestedBy"] == "windvane-heal:localkube-admin")
            })
        })
        .await?;
    assert_eq!(
        deployments.get("web").await?.spec.replicas,
        Some(2),
        "{status}"
    );

    // The server's JSON-lines export holds the drift as reported and as reverted, every line with the
    // documented fields.
    let lines = wait_for("the reverted drift exported", WAIT, || async {
        let text = std::fs::read_to_string(&audit).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()?;
        let reverted = lines.iter().filter(|l| l["action"] == "Reverted").count();
        Ok((reverted == 2).then_some(lines))
    })
    .await?;
    for line in &lines {
        for field in [
            "cluster",
            "release",
            "app",
            "group",
            "kind",
            "namespace",
            "name",
            "fields",
            "deleted",
            "who",
            "operation",
            "changedAt",
            "detectedAt",
            "repairedAt",
            "action",
            "revertRequestedBy",
            "receivedAt",
        ] {
            assert!(line.get(field).is_some(), "{field} missing from {line}");
        }
        assert_eq!(line["cluster"], "c1");
        assert_eq!(line["release"], 1);
        assert_eq!(line["name"], "web");
        assert_eq!(line["fields"], serde_json::json!(["/spec/replicas"]));
    }
    let askers: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["action"] == "Reverted")
        .map(|l| &l["revertRequestedBy"])
        .collect();
    assert!(
        askers.contains(&&serde_json::json!("kubectl-annotate")),
        "{askers:?}"
    );
    assert!(
        askers.contains(&&serde_json::json!("windvane-heal:localkube-admin")),
        "{askers:?}"
    );
    assert!(
        lines
            .iter()
            .filter(|l| l["action"] == "Reverted")
            .all(|l| l["repairedAt"].is_string())
    );

    // Every exported line is in the drift log, which pages.
    let all = server.api("/api/v1/drift?cluster=c1").await?;
    let stored = all["drift"].as_array().map_or(0, Vec::len);
    assert_eq!(stored, lines.len(), "{all}");
    assert!(all["next"].is_null(), "one page holds it all: {all}");
    let first = server.api("/api/v1/drift?cluster=c1&limit=1").await?;
    assert_eq!(first["drift"].as_array().map(Vec::len), Some(1));
    assert_eq!(first["next"], 1);
    let second = server
        .api("/api/v1/drift?cluster=c1&limit=1&offset=1")
        .await?;
    assert_ne!(first["drift"][0], second["drift"][0]);
    // No break-glass change is open in this fleet.
    let open = server.api("/api/v1/break-glass").await?;
    assert_eq!(open["breakGlass"], serde_json::json!([]), "{open}");
    Ok(())
}
