//! `windvane-agent diff` against a real control plane: exit 1 with the objects to create on an empty
//! cluster, 0 once the agent has applied the release, 1 with the changed line after someone edits a managed
//! field; Secret values never printed; fields under ignoreDifferences never shown; 2 on a refused release.

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use windvane_tests::fleet::{Agent, AgentOptions, FleetTree, Publisher};
use windvane_tests::localkube::LocalKube;
use windvane_tests::process::binary;
use windvane_tests::store_server::StoreServer;

const OBJECTS: &str = "\
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: default}
data: {mode: strict}
---
apiVersion: v1
kind: Secret
metadata: {name: credentials, namespace: default}
stringData: {password: hunter2-do-not-print}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: registry.example.com/web:1.0}]
";

fn diff(kube: &LocalKube, options: &AgentOptions) -> anyhow::Result<(i32, String, String)> {
    let output = Command::new(binary("windvane-agent")?)
        .args([
            "diff",
            "--source",
            &options.source,
            "--channel",
            &options.channel,
            "--fleet",
            &options.fleet,
            "--cluster",
            &options.cluster,
        ])
        .arg("--trusted-key")
        .arg(&options.trusted_keys[0])
        .arg("--kubeconfig")
        .arg(kube.kubeconfig_path())
        .output()?;
    Ok((
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout)?,
        String::from_utf8(output.stderr)?,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_exit_codes_changes_and_masked_secrets() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(21)?;
    let tree = FleetTree::new()?;
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: app\n    path: app\n    policy: {ignoreDifferences: [{group: apps, kind: Deployment, jsonPointers: [/spec/replicas]}]}\n",
    )?;
    tree.write("app/objects.yaml", OBJECTS)?;
    publisher.publish(&tree, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1");

    // Nothing applied yet: everything is to create.
    let (code, out, err) = diff(&kube, &options)?;
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("+++ desired/ConfigMap default/settings") && out.contains("+  mode: strict"),
        "{out}"
    );
    assert!(
        out.contains("0 unchanged, 0 to change, 3 to create, 0 failed"),
        "{out}"
    );
    assert!(!out.contains("hunter2"), "Secret values are masked: {out}");

    // Applied by the agent: no difference.
    let agent = Agent::start(&kube, &options).await?;
    agent
        .wait_status("synced", Duration::from_secs(60), |s| {
            s["counts"]["Synced"] == 3
        })
        .await?;
    drop(agent);
    let (code, out, err) = diff(&kube, &options)?;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("3 unchanged, 0 to change"), "{out}");

    // The HPA's field is not Windvane's business; an edited managed field is.
    let params = PatchParams {
        field_manager: Some("hpa-like".into()),
        ..PatchParams::default()
    };
    Api::<Deployment>::namespaced(kube.client(), "default")
        .patch_scale(
            "web",
            &params,
            &Patch::Merge(json!({"spec": {"replicas": 7}})),
        )
        .await?;
    let (code, out, _) = diff(&kube, &options)?;
    assert_eq!(code, 0, "replicas are ignored: {out}");
    let params = PatchParams {
        field_manager: Some("kubectl-edit".into()),
        ..PatchParams::default()
    };
    Api::<ConfigMap>::namespaced(kube.client(), "default")
        .patch(
            "settings",
            &params,
            &Patch::Merge(json!({"data": {"mode": "lax"}})),
        )
        .await?;
    let (code, out, _) = diff(&kube, &options)?;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("--- live/ConfigMap default/settings")
            && out.contains("-  mode: lax")
            && out.contains("+  mode: strict"),
        "{out}"
    );
    assert!(!out.contains("replicas"), "{out}");

    // A release the agent would refuse is an error.
    let stranger = Publisher::new(22)?;
    let mut wrong_key = options.clone();
    wrong_key.trusted_keys = vec![stranger.public_key_path()];
    let (code, _, err) = diff(&kube, &wrong_key)?;
    assert_eq!(code, 2);
    assert!(err.contains("unknown key"), "{err}");
    Ok(())
}
