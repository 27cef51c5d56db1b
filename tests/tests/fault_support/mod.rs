//! Helpers shared by the sync and fault tests (`agent_sync`, `source_faults`, `agent_faults`): reading ConfigMaps,
//! a CRD (`Widget`), the agent's
//! persisted inventory (through the agent's own state code) and its `/metrics`, the agent's memory from
//! `/proc`, fleet trees of many ConfigMaps, and releases signed by hand for cases `windvane publish` refuses
//! to make (an empty release without `allowEmpty`, a replayed serial, a pointer from the future).

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use ed25519_dalek::SigningKey;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use windvane_shared::crypto::keys::signing_key_from_seed;
use windvane_shared::format::bundle::{Bundle, BundleLimits};
use windvane_shared::format::release::{BundleRef, ReleasePointer};
use windvane_tests::fleet::{AGENT_NAMESPACE, FleetTree};
use windvane_tests::localkube::LocalKube;

/// A namespaced custom resource definition, `widgets.example.com`, for releases that carry a CRD.
pub const WIDGET_CRD: &str = "\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  names: {kind: Widget, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
";

/// Deadline for anything the agent does on its own (generous: a loaded 2-core machine).
pub const SYNC: Duration = Duration::from_secs(90);

pub async fn config_map(
    kube: &LocalKube,
    namespace: &str,
    name: &str,
) -> anyhow::Result<Option<ConfigMap>> {
    Ok(Api::<ConfigMap>::namespaced(kube.client(), namespace)
        .get_opt(name)
        .await?)
}

pub async fn wait_config_map(
    kube: &LocalKube,
    namespace: &str,
    name: &str,
    check: impl Fn(Option<&ConfigMap>) -> bool,
) -> anyhow::Result<()> {
    wait_for(&format!("ConfigMap {namespace}/{name}"), SYNC, || async {
        let cm = config_map(kube, namespace, name).await?;
        Ok(check(cm.as_ref()).then_some(()))
    })
    .await
}

pub fn data<'a>(cm: Option<&'a ConfigMap>, key: &str) -> Option<&'a str> {
    cm?.data.as_ref()?.get(key).map(String::as_str)
}

/// Names of the ConfigMaps in `namespace` whose name starts with `prefix`.
pub async fn config_map_names(
    kube: &LocalKube,
    namespace: &str,
    prefix: &str,
) -> anyhow::Result<BTreeSet<String>> {
    let list = Api::<ConfigMap>::namespaced(kube.client(), namespace)
        .list_metadata(&Default::default())
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|cm| cm.metadata.name)
        .filter(|name| name.starts_with(prefix))
        .collect())
}

/// The reason of the agent's last refusal of the source, if any.
pub fn refusal(status: &serde_json::Value) -> Option<&str> {
    status["source"]["lastRefusal"]["reason"].as_str()
}

#[allow(unused_imports)]
pub use windvane_tests::fleet::metric;
use windvane_tests::poll::wait_for;

/// The names (`Kind ns/name`) in the inventory the agent persisted in its state Secrets, read with the agent's
/// own state code.
pub async fn inventory(kube: &LocalKube) -> anyhow::Result<BTreeSet<String>> {
    let store =
        windvane_agent::kube::state::StateStore::new(kube.client(), AGENT_NAMESPACE, "windvane");
    let inventory = store.load_inventory().await?;
    Ok(inventory
        .entries
        .values()
        .map(|e| e.object_ref().to_string())
        .collect())
}

/// `VmRSS` and `VmHWM` (peak) of a process, in bytes, from `/proc/<pid>/status`.
pub fn memory(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .with_context(|| format!("no {name} in /proc/{pid}/status"))?;
        let kib: u64 = line
            .trim_start_matches(name)
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()?;
        Ok(kib * 1024)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// YAML of ConfigMaps `<prefix>-0` … `<prefix>-(n-1)` in `namespace`.
pub fn config_maps_yaml(namespace: &str, prefix: &str, n: usize) -> String {
    (0..n)
        .map(|i| {
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {prefix}-{i}, namespace: {namespace}}}\ndata: {{i: '{i}'}}\n"
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

/// Asserts that `check` holds for the whole window (the absence of an action can only be observed over
/// time).
pub async fn holds_for(
    window: Duration,
    mut check: impl AsyncFnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let end = Instant::now() + window;
    while Instant::now() < end {
        anyhow::ensure!(check().await?, "condition stopped holding");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// The release key of `Publisher::new(seed)` (same derivation), for signing pointers by hand.
pub fn release_key(seed: u8) -> SigningKey {
    signing_key_from_seed([seed; 32])
}

/// The bundle `windvane publish` would build from `tree`.
pub fn bundle_of(tree: &FleetTree) -> anyhow::Result<Bundle> {
    Ok(windvane_publisher::source::load_fleet_dir(
        tree.path(),
        BundleLimits::default(),
    )?)
}

/// Writes `bundle` into the store and a pointer to it on `channel`, signed by `key`, with the given serial,
/// issue time and `allowEmpty`, bypassing every check of `windvane publish`: what a buggy or hostile
/// publisher holding a release key could write.
pub fn sign_by_hand(
    store: &Path,
    key: &SigningKey,
    channel: &str,
    bundle: &Bundle,
    serial: u64,
    issued_at: jiff::Timestamp,
    allow_empty: bool,
) -> anyhow::Result<ReleasePointer> {
    let bytes = bundle.to_json_bytes();
    let sha256 = windvane_shared::crypto::digest::sha256_hex(&bytes);
    std::fs::write(store.join(windvane_store::bundle_path(&sha256)), &bytes)?;
    let pointer = ReleasePointer {
        fleet: bundle.fleet.clone(),
        channel: channel.to_owned(),
        serial,
        issued_at,
        expires_at: issued_at + jiff::SignedDuration::from_hours(24),
        bundle: BundleRef {
            sha256,
            size: bytes.len() as u64,
        },
        allow_empty,
        rollout: None,
    };
    std::fs::write(
        store.join(windvane_store::channel_path(channel)),
        pointer.sign(key).to_json_bytes(),
    )?;
    Ok(pointer)
}

/// The agent's log without terminal colour codes.
pub fn plain(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI sequence: ESC [ parameters final-byte.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// How many objects the agent's log says it pruned.
pub fn pruned_count(log: &str) -> usize {
    plain(log).matches(": pruned object=").count()
}
