//! Secrets in end-to-end tests: the age identity Secret the operator installs for the agent
//! (`--age-key-secret`), and the search for secret values where they must never be in clear. The places are
//! every file under a directory (the store, the server's database and log) and what a cluster shows outside
//! itself: the agent's `/status`, `/metrics` and log, every Event of the cluster (core/v1, all namespaces)
//! and the control plane's log. Each value is looked for as written and in base64, the form a Secret's
//! `data` holds.

use std::path::{Path, PathBuf};

use anyhow::ensure;
use k8s_openapi::api::core::v1::{Event, Namespace, Secret};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

use crate::fleet::{AGENT_NAMESPACE, Agent};
use crate::localkube::LocalKube;

/// The name tests give the age identity Secret (`--age-key-secret`).
pub const AGE_KEY_SECRET: &str = "windvane-age";

/// Standard base64, as in a Secret's `data`.
pub fn b64(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// Each value as written and in base64: what a search for it must cover.
pub fn forms(values: &[&str]) -> Vec<String> {
    values
        .iter()
        .flat_map(|v| [(*v).to_owned(), b64(v)])
        .collect()
}

/// The secret half (`AGE-SECRET-KEY-1…`) of an age identity file, as age-keygen writes it: a value to search
/// for too.
pub fn age_secret_key(file: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(file)?;
    text.lines()
        .find(|l| l.starts_with("AGE-SECRET-KEY-"))
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("{}: no AGE-SECRET-KEY line", file.display()))
}

/// Installs, or replaces, the age identity Secret [`AGE_KEY_SECRET`] in the agent's namespace: one entry per
/// `(key, identity file)` (the agent reads every `*.agekey` entry). Creates the namespace if it is missing.
pub async fn install_age_identities(
    kube: &LocalKube,
    files: &[(&str, &Path)],
) -> anyhow::Result<()> {
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": AGENT_NAMESPACE}}))?;
    match Api::<Namespace>::all(kube.client())
        .create(&PostParams::default(), &namespace)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(error) => return Err(error.into()),
    }
    let mut data = serde_json::Map::new();
    for (key, path) in files {
        data.insert(
            (*key).to_owned(),
            json!(b64(&std::fs::read_to_string(path)?)),
        );
    }
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": AGE_KEY_SECRET, "namespace": AGENT_NAMESPACE},
        "data": data,
    }))?;
    let api: Api<Secret> = Api::namespaced(kube.client(), AGENT_NAMESPACE);
    match api.get_opt(AGE_KEY_SECRET).await? {
        Some(_) => {
            api.replace(AGE_KEY_SECRET, &PostParams::default(), &secret)
                .await?
        }
        None => api.create(&PostParams::default(), &secret).await?,
    };
    Ok(())
}

/// Every file under `dir` whose bytes contain `needle`.
pub fn files_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if std::fs::read(&path)
                .is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle.as_bytes()))
            {
                found.push(path);
            }
        }
    }
    found
}

/// Fails, naming the value's form and the files, if any file under `dirs` holds one of `values`.
pub fn ensure_not_in_files(dirs: &[PathBuf], values: &[&str]) -> anyhow::Result<()> {
    for needle in forms(values) {
        for dir in dirs {
            let found = files_containing(dir, &needle);
            ensure!(found.is_empty(), "{needle:?} in {found:?}");
        }
    }
    Ok(())
}

/// What a cluster shows outside itself, as `(place, text)`: the agent's `/status`, `/metrics` and log, each
/// Event (all namespaces, as JSON) and the control plane's log.
pub async fn cluster_faces(
    kube: &LocalKube,
    agent: &Agent,
) -> anyhow::Result<Vec<(String, String)>> {
    let mut faces = vec![
        ("/status".to_owned(), agent.status().await?.to_string()),
        ("/metrics".to_owned(), agent.metrics().await?),
        (
            "the agent's log".to_owned(),
            read_lossy(agent.process.log_path())?,
        ),
    ];
    let events = Api::<Event>::all(kube.client())
        .list(&ListParams::default())
        .await?;
    for event in events.items {
        let place = format!(
            "Event {}/{} ({})",
            event.metadata.namespace.as_deref().unwrap_or_default(),
            event.metadata.name.as_deref().unwrap_or_default(),
            event.reason.as_deref().unwrap_or_default()
        );
        faces.push((place, serde_json::to_string(&event)?));
    }
    faces.push((
        "the localkube log".to_owned(),
        read_lossy(&kube.log_path())?,
    ));
    Ok(faces)
}

/// A log file as text, whatever bytes it holds (a value must not hide behind one invalid byte).
fn read_lossy(path: &Path) -> anyhow::Result<String> {
    Ok(String::from_utf8_lossy(&std::fs::read(path)?).into_owned())
}

/// Fails, naming the place, if one of `values` (either form) shows in the cluster's faces; returns the faces
/// searched, so that a test can check the search covered what it expects (e.g. a drift Event).
pub async fn ensure_not_in_cluster(
    kube: &LocalKube,
    agent: &Agent,
    values: &[&str],
) -> anyhow::Result<Vec<(String, String)>> {
    let faces = cluster_faces(kube, agent).await?;
    for needle in forms(values) {
        for (place, text) in &faces {
            ensure!(!text.contains(&needle), "{needle:?} in {place}");
        }
    }
    Ok(faces)
}
