//! `windvane seal` against real control planes: one Secret sealed to a group key (the prod group's, installed
//! in each prod cluster), one sealed to a single cluster's identity, both named in a recipients file in the
//! fleet tree. The cluster that holds both keys applies both; a prod cluster that joins after the release
//! opens the group's Secret of that earlier release but not the other cluster's; a cluster outside the group
//! opens neither, and each failure names the recipient it needed while the rest stays Synced.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use windvane_tests::fleet::{AGENT_NAMESPACE, Agent, AgentOptions, FleetTree, Publisher};
use windvane_tests::localkube::LocalKube;
use windvane_tests::process::binary;
use windvane_tests::store_server::StoreServer;

const WAIT: Duration = Duration::from_secs(90);
const GROUP_SECRET: &str = "Secret payments/group-token";
const CLUSTER_SECRET: &str = "Secret payments/eu-1-token";
const CONFIG: &str = "ConfigMap payments/settings";

fn b64(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn windvane(args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(binary("windvane")?).args(args).output()?;
    ensure!(
        output.status.success(),
        "windvane {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

/// A new identity file from `windvane age-keygen`, and the recipient it prints.
fn keygen(dir: &Path, name: &str) -> anyhow::Result<(PathBuf, String)> {
    let path = dir.join(name);
    let recipient = windvane(&["age-keygen", "-o", &path.display().to_string()])?;
    Ok((path, recipient.trim().to_owned()))
}

fn secret(name: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: payments}}\ndata: {{token: {}}}\n",
        b64(value)
    )
}

async fn install(kube: &LocalKube, keys: &[(&str, &Path)]) -> anyhow::Result<()> {
    let mut data = serde_json::Map::new();
    for (key, path) in keys {
        data.insert(
            (*key).to_owned(),
            json!(b64(&std::fs::read_to_string(path)?)),
        );
    }
    let namespace = serde_json::from_value(json!({"metadata": {"name": AGENT_NAMESPACE}}))?;
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(kube.client())
        .create(&PostParams::default(), &namespace)
        .await;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "windvane-age", "namespace": AGENT_NAMESPACE},
        "data": data,
    }))?;
    Api::<Secret>::namespaced(kube.client(), AGENT_NAMESPACE)
        .create(&PostParams::default(), &secret)
        .await?;
    Ok(())
}

fn state<'a>(status: &'a Value, name: &str) -> (&'a str, &'a str) {
    let found = status["objects"]
        .as_array()
        .and_then(|o| o.iter().find(|o| o["object"] == name));
    (
        found.and_then(|o| o["state"].as_str()).unwrap_or(""),
        found.and_then(|o| o["message"].as_str()).unwrap_or(""),
    )
}

async fn token(kube: &LocalKube, name: &str) -> anyhow::Result<Option<String>> {
    let api: Api<Secret> = Api::namespaced(kube.client(), "payments");
    Ok(api.get_opt(name).await?.and_then(|s| {
        s.data?
            .get("token")
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
    }))
}

/// Starts an agent for `cluster` on a fresh control plane holding `keys`; waits until `check` holds.
async fn run_cluster(
    server: &StoreServer,
    publisher: &Publisher,
    cluster: &str,
    keys: &[(&str, &Path)],
    check: impl Fn(&Value) -> bool,
) -> anyhow::Result<(LocalKube, Agent, Value)> {
    let kube = LocalKube::start().await?;
    install(&kube, keys).await?;
    let mut options = AgentOptions::new(&server.url(), &publisher.public_key_path(), cluster);
    options.labels = vec!["env=prod".to_owned()];
    options
        .extra
        .extend(["--age-key-secret".to_owned(), "windvane-age".to_owned()]);
    let agent = Agent::start(&kube, &options).await?;
    let status = agent
        .wait_status(&format!("{cluster} settled"), WAIT, check)
        .await
        .with_context(|| format!("cluster {cluster}"))?;
    Ok((kube, agent, status))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_to_a_cluster_and_to_a_group() -> anyhow::Result<()> {
    let keys = tempfile::tempdir()?;
    let (eu1_key, eu1) = keygen(keys.path(), "eu-1.agekey")?;
    let (prod_key, prod) = keygen(keys.path(), "prod.agekey")?;
    let (dev_key, _dev) = keygen(keys.path(), "dev-1.agekey")?;

    let tree = FleetTree::new()?;
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: payments\n    path: payments\n    namespace: payments\n    createNamespace: true\n",
    )?;
    tree.write(
        "recipients.yaml",
        &format!("clusters:\n  eu-1: {eu1}\ngroups:\n  prod: {prod}\n"),
    )?;
    tree.write(
        "payments/settings.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: payments}\ndata: {a: b}\n",
    )?;
    let recipients = tree.path().join("recipients.yaml").display().to_string();
    for (name, to, value) in [
        ("group-token", "prod", "group-plaintext-9f3"),
        ("eu-1-token", "eu-1", "cluster-plaintext-4c1"),
    ] {
        let path = tree.path().join(format!("payments/{name}.yaml"));
        std::fs::write(&path, secret(name, value))?;
        let path = path.display().to_string();
        windvane(&[
            "seal",
            &path,
            "--in-place",
            "--to",
            to,
            "--recipients",
            &recipients,
        ])?;
        let sealed = std::fs::read_to_string(&path)?;
        ensure!(
            sealed.contains("ENC[AES256_GCM") && !sealed.contains(&b64(value)),
            "{sealed}"
        );
    }
    let publisher = Publisher::new(51)?;
    publisher.publish(&tree, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;

    // eu-1 holds its own identity and the prod group key: both apply.
    let (kube, agent, _) = run_cluster(
        &server,
        &publisher,
        "eu-1",
        &[("eu-1.agekey", &eu1_key), ("prod.agekey", &prod_key)],
        |s| state(s, GROUP_SECRET).0 == "Synced" && state(s, CLUSTER_SECRET).0 == "Synced",
    )
    .await?;
    ensure!(token(&kube, "group-token").await?.as_deref() == Some("group-plaintext-9f3"));
    ensure!(token(&kube, "eu-1-token").await?.as_deref() == Some("cluster-plaintext-4c1"));
    drop(agent);
    drop(kube);

    // us-2 joins the prod group after the release: the group key opens it, eu-1's Secret stays closed.
    let (kube, agent, status) = run_cluster(
        &server,
        &publisher,
        "us-2",
        &[("prod.agekey", &prod_key)],
        |s| state(s, GROUP_SECRET).0 == "Synced" && state(s, CLUSTER_SECRET).0 == "Failed",
    )
    .await?;
    ensure!(state(&status, CLUSTER_SECRET).1.contains(&eu1), "{status}");
    ensure!(state(&status, CONFIG).0 == "Synced", "{status}");
    ensure!(token(&kube, "eu-1-token").await?.is_none());
    drop(agent);
    drop(kube);

    // dev-1 is outside the group: neither opens, both name the recipient they need; the rest applies.
    let (kube, agent, status) = run_cluster(
        &server,
        &publisher,
        "dev-1",
        &[("dev-1.agekey", &dev_key)],
        |s| state(s, GROUP_SECRET).0 == "Failed" && state(s, CONFIG).0 == "Synced",
    )
    .await?;
    ensure!(state(&status, GROUP_SECRET).1.contains(&prod), "{status}");
    ensure!(state(&status, CLUSTER_SECRET).0 == "Failed", "{status}");
    ensure!(token(&kube, "group-token").await?.is_none());
    let log = agent.process.log();
    ensure!(!log.contains("AGE-SECRET-KEY"), "no identity in the log");
    Ok(())
}
