//! `windvane seal` against real control planes: one Secret sealed to a group key (the prod group's, installed
//! in each prod cluster), one sealed to a single cluster's identity, both named in a recipients file in the
//! fleet tree. The cluster that holds both keys applies both; a prod cluster that joins after the release
//! opens the group's Secret of that earlier release but not the other cluster's, then follows the group key's
//! rotation (new key installed beside the old, re-sealed with `windvane seal`, old key removed); a dev cluster,
//! outside the group (env=dev, no group key), opens neither, and each failure names the recipient it needed
//! while its other objects are Synced. No value, as written or in base64, is in the store or in any cluster's
//! `/status`, `/metrics`, agent log, Events or control-plane log.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use serde_json::Value;
use windvane_tests::fleet::{Agent, AgentOptions, FleetTree, Publisher};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::process::binary;
use windvane_tests::secrets::{
    AGE_KEY_SECRET, age_secret_key, b64, ensure_not_in_cluster, ensure_not_in_files,
    install_age_identities,
};
use windvane_tests::store_server::StoreServer;

const WAIT: Duration = Duration::from_secs(90);
const GROUP_SECRET: &str = "Secret payments/group-token";
const CLUSTER_SECRET: &str = "Secret payments/eu-1-token";
const CONFIG: &str = "ConfigMap payments/settings";
const GROUP_VALUE: &str = "group-plaintext-9f3";
const GROUP_ROTATED: &str = "group-rotated-plaintext-2d8";
const CLUSTER_VALUE: &str = "cluster-plaintext-4c1";
/// Every value of the test, searched for wherever a value must not be in clear.
const VALUES: [&str; 3] = [GROUP_VALUE, GROUP_ROTATED, CLUSTER_VALUE];

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

/// The states of every object but `except`, which must all be Synced; the objects that are not.
fn not_synced<'a>(status: &'a Value, except: &[&str]) -> Vec<&'a Value> {
    status["objects"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|o| !except.iter().any(|e| o["object"] == *e) && o["state"] != "Synced")
        .collect()
}

/// Writes the plain Secret `name` with `value` into the tree and seals it in place with `windvane seal --to
/// to --recipients recipients.yaml`; the sealed text.
fn seal_into(tree: &FleetTree, name: &str, to: &str, value: &str) -> anyhow::Result<String> {
    let path = tree.path().join(format!("payments/{name}.yaml"));
    std::fs::write(&path, secret(name, value))?;
    let recipients = tree.path().join("recipients.yaml").display().to_string();
    let path_arg = path.display().to_string();
    windvane(&[
        "seal",
        &path_arg,
        "--in-place",
        "--to",
        to,
        "--recipients",
        &recipients,
    ])?;
    let sealed = std::fs::read_to_string(&path)?;
    ensure!(
        sealed.contains("ENC[AES256_GCM")
            && !sealed.contains(&b64(value))
            && !sealed.contains(value),
        "{sealed}"
    );
    Ok(sealed)
}

/// Starts an agent for `cluster`, labelled `env`, on a fresh control plane holding `keys`; waits until
/// `check` holds.
async fn run_cluster(
    server: &StoreServer,
    publisher: &Publisher,
    (cluster, env): (&str, &str),
    keys: &[(&str, &Path)],
    check: impl Fn(&Value) -> bool,
) -> anyhow::Result<(LocalKube, Agent, Value)> {
    let kube = LocalKube::start().await?;
    install_age_identities(&kube, keys).await?;
    let mut options = AgentOptions::new(&server.url(), &publisher.public_key_path(), cluster);
    options.labels = vec![format!("env={env}")];
    options
        .extra
        .extend(["--age-key-secret".to_owned(), AGE_KEY_SECRET.to_owned()]);
    let agent = Agent::start(&kube, &options).await?;
    let status = agent
        .wait_status(&format!("{cluster} settled"), WAIT, check)
        .await
        .with_context(|| format!("cluster {cluster}"))?;
    Ok((kube, agent, status))
}

/// Rotates the prod group key with `windvane seal` on a running prod cluster: the new key is installed beside
/// the old, the recipients file names it, the group's Secret is re-sealed to it alone (a new value) and
/// published; then the old key is removed from the cluster and the next release still opens everything the
/// cluster opened before. `old` and `new` are (identity file, recipient).
async fn rotate_group_key(
    (kube, agent): (&LocalKube, &Agent),
    (tree, publisher): (&FleetTree, &Publisher),
    old: (&Path, &str),
    new: (&Path, &str),
    eu1: &str,
) -> anyhow::Result<()> {
    install_age_identities(kube, &[("prod.agekey", old.0), ("prod-2.agekey", new.0)]).await?;
    tree.write(
        "recipients.yaml",
        &format!("clusters:\n  eu-1: {eu1}\ngroups:\n  prod: {}\n", new.1),
    )?;
    let sealed = seal_into(tree, "group-token", "prod", GROUP_ROTATED)?;
    ensure!(
        sealed.contains(new.1) && !sealed.contains(old.1),
        "sealed to the new key alone: {sealed}"
    );
    publisher.publish(tree, "stable")?;
    wait_for("the re-sealed group Secret applied", WAIT, || async {
        Ok((token(kube, "group-token").await?.as_deref() == Some(GROUP_ROTATED)).then_some(()))
    })
    .await?;
    install_age_identities(kube, &[("prod-2.agekey", new.0)]).await?;
    tree.write(
        "payments/settings.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: payments}\ndata: {a: c}\n",
    )?;
    publisher.publish(tree, "stable")?;
    let status = agent
        .wait_status("release 3 Synced without the old group key", WAIT, |s| {
            s["source"]["appliedSerial"] == 3
                && state(s, GROUP_SECRET).0 == "Synced"
                && state(s, CONFIG).0 == "Synced"
        })
        .await?;
    ensure!(
        not_synced(&status, &[CLUSTER_SECRET]).is_empty(),
        "{status}"
    );
    ensure!(token(kube, "group-token").await?.as_deref() == Some(GROUP_ROTATED));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_to_a_cluster_and_to_a_group() -> anyhow::Result<()> {
    let keys = tempfile::tempdir()?;
    let (eu1_key, eu1) = keygen(keys.path(), "eu-1.agekey")?;
    let (prod_key, prod) = keygen(keys.path(), "prod.agekey")?;
    let (prod2_key, prod2) = keygen(keys.path(), "prod-2.agekey")?;
    let (dev_key, _dev) = keygen(keys.path(), "dev-1.agekey")?;
    // The identities are secrets too: searched for with the values.
    let mut secrets = VALUES.map(str::to_owned).to_vec();
    for key in [&eu1_key, &prod_key, &prod2_key, &dev_key] {
        secrets.push(age_secret_key(key)?);
    }
    let secrets: Vec<&str> = secrets.iter().map(String::as_str).collect();

    let tree = FleetTree::new()?;
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: payments\n    path: payments\n    namespace: payments\n    createNamespace: true\n",
    )?;
    // The prod group is the env=prod clusters: its key is installed in those only.
    tree.write(
        "recipients.yaml",
        &format!("clusters:\n  eu-1: {eu1}\ngroups:\n  prod: {prod}\n"),
    )?;
    tree.write(
        "payments/settings.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: payments}\ndata: {a: b}\n",
    )?;
    seal_into(&tree, "group-token", "prod", GROUP_VALUE)?;
    seal_into(&tree, "eu-1-token", "eu-1", CLUSTER_VALUE)?;
    let publisher = Publisher::new(51)?;
    publisher.publish(&tree, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;

    // eu-1 holds its own identity and the prod group key: both apply.
    let (kube, agent, _) = run_cluster(
        &server,
        &publisher,
        ("eu-1", "prod"),
        &[("eu-1.agekey", &eu1_key), ("prod.agekey", &prod_key)],
        |s| state(s, GROUP_SECRET).0 == "Synced" && state(s, CLUSTER_SECRET).0 == "Synced",
    )
    .await?;
    ensure!(token(&kube, "group-token").await?.as_deref() == Some(GROUP_VALUE));
    ensure!(token(&kube, "eu-1-token").await?.as_deref() == Some(CLUSTER_VALUE));
    ensure_not_in_cluster(&kube, &agent, &secrets).await?;
    drop(agent);
    drop(kube);

    // us-2 joins the prod group after the release: the group key opens it, eu-1's Secret stays closed.
    let (kube, agent, status) = run_cluster(
        &server,
        &publisher,
        ("us-2", "prod"),
        &[("prod.agekey", &prod_key)],
        |s| state(s, GROUP_SECRET).0 == "Synced" && state(s, CLUSTER_SECRET).0 == "Failed",
    )
    .await?;
    ensure!(state(&status, CLUSTER_SECRET).1.contains(&eu1), "{status}");
    ensure!(state(&status, CONFIG).0 == "Synced", "{status}");
    ensure!(token(&kube, "eu-1-token").await?.is_none());

    // The group key is rotated with `windvane seal` while us-2 runs.
    let (old, new) = (
        (prod_key.as_path(), prod.as_str()),
        (prod2_key.as_path(), prod2.as_str()),
    );
    rotate_group_key((&kube, &agent), (&tree, &publisher), old, new, &eu1).await?;
    ensure_not_in_cluster(&kube, &agent, &secrets).await?;
    drop(agent);
    drop(kube);

    // dev-1 is outside the group (env=dev, and no group key): neither Secret opens, each names the recipient it
    // needs; every other object is Synced.
    let (kube, agent, status) = run_cluster(
        &server,
        &publisher,
        ("dev-1", "dev"),
        &[("dev-1.agekey", &dev_key)],
        |s| {
            s["source"]["appliedSerial"] == 3
                && state(s, GROUP_SECRET).0 == "Failed"
                && state(s, CONFIG).0 == "Synced"
        },
    )
    .await?;
    ensure!(state(&status, GROUP_SECRET).1.contains(&prod2), "{status}");
    ensure!(state(&status, CLUSTER_SECRET).0 == "Failed", "{status}");
    ensure!(state(&status, CLUSTER_SECRET).1.contains(&eu1), "{status}");
    ensure!(
        not_synced(&status, &[GROUP_SECRET, CLUSTER_SECRET]).is_empty(),
        "{status}"
    );
    ensure!(token(&kube, "group-token").await?.is_none());
    ensure!(token(&kube, "eu-1-token").await?.is_none());
    ensure_not_in_cluster(&kube, &agent, &secrets).await?;
    ensure_not_in_files(&[publisher.store()], &secrets)?;
    Ok(())
}

/// A sealed value is bound to its namespace: `windvane seal` refuses a document that names none (unless
/// `--namespace` gives one) and seals the namespace with the values, so the file applies in its own
/// namespace, and a copy whose namespace was edited to another app's does not open (its MAC fails).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_value_is_bound_to_its_namespace() -> anyhow::Result<()> {
    let keys = tempfile::tempdir()?;
    let (key, recipient) = keygen(keys.path(), "c1.agekey")?;
    let tree = FleetTree::new()?;
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: payments\n    path: payments\n    namespace: payments\n    createNamespace: true\n  \
         - name: other\n    path: other\n    namespace: other\n    createNamespace: true\n",
    )?;
    tree.write(
        "other/settings.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\ndata: {a: b}\n",
    )?;
    let plain = keys.path().join("plain.yaml");
    std::fs::write(
        &plain,
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: token}}\ndata: {{token: {}}}\n",
            b64(GROUP_VALUE)
        ),
    )?;
    std::fs::create_dir_all(tree.path().join("payments"))?;
    let sealed = tree.path().join("payments/token.yaml");
    let (plain_arg, sealed_arg) = (plain.display().to_string(), sealed.display().to_string());
    let bare = Command::new(binary("windvane")?)
        .args([
            "seal",
            &plain_arg,
            "-o",
            &sealed_arg,
            "--recipient",
            &recipient,
        ])
        .output()?;
    let said = String::from_utf8_lossy(&bare.stderr);
    ensure!(
        !bare.status.success() && said.contains("--namespace"),
        "sealed without a namespace: {said}"
    );
    windvane(&[
        "seal",
        &plain_arg,
        "-o",
        &sealed_arg,
        "--recipient",
        &recipient,
        "--namespace",
        "payments",
    ])?;
    let text = std::fs::read_to_string(&sealed)?;
    ensure!(text.contains("namespace: payments"), "{text}");
    // Copied into app `other`, its namespace edited to `other`.
    tree.write(
        "other/token.yaml",
        &text.replace("namespace: payments", "namespace: other"),
    )?;
    let publisher = Publisher::new(52)?;
    publisher.publish(&tree, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let (kube, _agent, status) = run_cluster(
        &server,
        &publisher,
        ("c1", "prod"),
        &[("c1.agekey", &key)],
        |s| {
            state(s, "Secret payments/token").0 == "Synced"
                && state(s, "Secret other/token").0 == "Failed"
        },
    )
    .await?;
    ensure!(token(&kube, "token").await?.as_deref() == Some(GROUP_VALUE));
    let moved: Api<Secret> = Api::namespaced(kube.client(), "other");
    ensure!(moved.get_opt("token").await?.is_none(), "{status}");
    Ok(())
}
