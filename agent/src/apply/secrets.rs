//! SOPS-encrypted manifests on the agent: the age identities its operator installed, and opening the
//! encrypted objects of this cluster's apps just before they render.
//!
//! Where the data comes from: the Secret named by `--age-key-secret` (`WINDVANE_AGE_KEY_SECRET`, config
//! `ageKeySecret`) in the agent's namespace; every data key ending in `.agekey` holds identities as
//! `age-keygen` writes them (`AGE-SECRET-KEY-1…` lines). It is read again at every sync, so that a key added
//! or removed (rotation) takes effect without a restart. Where it goes: opened objects render and apply like
//! any other, in memory only; an object that does not open (no identity for its recipients, altered file) is
//! a Failed object naming the recipients it needs, never sent, while every other object still applies. No
//! identity and no decrypted value is ever logged: messages name Secret keys, files and recipients only.
//! The cluster's own identity key (Secret `windvane-identity`, the one it enrolled with) is added too, as an
//! age identity, so that what `windvane seal --to-cluster` sealed to this one cluster opens here only.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use serde_json::{Value, json};
use tracing::warn;
use windvane_shared::decide::desired::DesiredObject;
use windvane_shared::decide::render::ClusterIdentity;
use windvane_shared::format::bundle::{Bundle, ObjectRef, Policy};
use windvane_shared::format::sops::{Keyring, Sealed, is_encrypted, open_app};

use crate::apply::desired::Desired;
use crate::apply::{ObjectResult, Outcome};

/// Suffix of the data keys of the identity Secret that hold age identities (as Flux names them).
pub const AGE_KEY_SUFFIX: &str = ".agekey";

/// The identities of one Secret, and a message for each data key that holds none.
pub fn keyring_of(secret: &Secret) -> (Keyring, Vec<String>) {
    let name = secret.metadata.name.as_deref().unwrap_or("");
    let mut keyring = Keyring::default();
    let mut problems = Vec::new();
    for (key, value) in secret.data.iter().flatten() {
        if !key.ends_with(AGE_KEY_SUFFIX) {
            continue;
        }
        let source = format!("Secret {name} key {key}");
        match std::str::from_utf8(&value.0) {
            Ok(text) => {
                if let Err(error) = keyring.add_text(text, &source) {
                    problems.push(error.to_string());
                }
            }
            Err(_) => problems.push(format!("{source}: not UTF-8 text")),
        }
    }
    if keyring.is_empty() && problems.is_empty() {
        problems.push(format!(
            "Secret {name} holds no age identity (no data key ending in {AGE_KEY_SUFFIX})"
        ));
    }
    (keyring, problems)
}

/// The identities of the configured Secret; none (with a warning) when it is not configured, missing or
/// unreadable, so that SOPS objects fail by name and everything else still applies.
pub async fn load_keyring(client: &kube::Client, namespace: &str, secret: Option<&str>) -> Keyring {
    let mut keyring = operator_keyring(client, namespace, secret).await;
    add_identity_key(client, namespace, &mut keyring).await;
    keyring
}

/// The cluster's own identity key (the one it enrolled with) opens what was sealed to the cluster itself
/// (`windvane seal --to-cluster`). Read, never created here: an agent that never reported has none.
async fn add_identity_key(client: &kube::Client, namespace: &str, keyring: &mut Keyring) {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = match api.get_opt(crate::report::heartbeat::IDENTITY_SECRET).await {
        Ok(secret) => secret,
        Err(error) => {
            warn!(secret = crate::report::heartbeat::IDENTITY_SECRET, %namespace, %error, "cannot read the cluster identity key");
            return;
        }
    };
    let object = format!(
        "Secret {namespace}/{}",
        crate::report::heartbeat::IDENTITY_SECRET
    );
    if let Some(key) = secret.and_then(|s| crate::report::heartbeat::key_of_secret(s, &object).ok())
    {
        keyring.add_cluster_key(&key);
    }
}

async fn operator_keyring(client: &kube::Client, namespace: &str, secret: Option<&str>) -> Keyring {
    let Some(name) = secret else {
        return Keyring::default();
    };
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(Some(secret)) => {
            let (keyring, problems) = keyring_of(&secret);
            for problem in problems {
                warn!(%problem, "age identity Secret");
            }
            keyring
        }
        Ok(None) => {
            warn!(secret = %name, %namespace, "the age identity Secret does not exist");
            Keyring::default()
        }
        Err(error) => {
            warn!(secret = %name, %namespace, %error, "cannot read the age identity Secret");
            Keyring::default()
        }
    }
}

/// Where the SOPS objects of the apps selected for this cluster hold encrypted values, read before they are
/// opened: the JSON pointer of every `ENC[…]` value, by object kind and name. `windvane-agent diff` masks the
/// values at those pointers once opened, whatever the object's kind (a Secret's `data` is masked anyway; a
/// ConfigMap's or a custom resource's would be printed in clear). Objects are matched by kind and name only
/// (their namespace may be defaulted later), so two of them in different namespaces are both masked.
#[derive(Debug, Default)]
pub struct SealedPaths(BTreeMap<(String, String), BTreeSet<String>>);

impl SealedPaths {
    /// The encrypted values' pointers of the selected apps' SOPS objects in `bundle`.
    pub fn of(bundle: &Bundle, identity: &ClusterIdentity) -> SealedPaths {
        let mut paths = SealedPaths::default();
        let sealed = bundle
            .apps
            .iter()
            .filter(|app| app.selector.matches(&identity.labels))
            .flat_map(|app| &app.manifests)
            .filter(|m| is_encrypted(&m.object));
        for manifest in sealed {
            let kind = manifest.object["kind"].as_str().unwrap_or_default();
            let name = manifest
                .object
                .pointer("/metadata/name")
                .and_then(Value::as_str);
            let mut found = BTreeSet::new();
            for (key, value) in manifest.object.as_object().into_iter().flatten() {
                if key != windvane_shared::format::sops::METADATA_KEY {
                    encrypted_pointers(value, &mut format!("/{}", escape(key)), &mut found);
                }
            }
            paths
                .0
                .entry((kind.to_owned(), name.unwrap_or_default().to_owned()))
                .or_default()
                .extend(found);
        }
        paths
    }

    /// `object` (an object `id` as live shows it, or as it would be) with the values its SOPS file held
    /// encrypted masked.
    pub fn mask(&self, id: &ObjectRef, object: &Value) -> Value {
        match self.0.get(&(id.kind.clone(), id.name.clone())) {
            Some(pointers) => crate::heal::compare::mask_at(object, pointers),
            None => object.clone(),
        }
    }
}

/// A JSON pointer's escaping of one key.
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Adds the pointer of every `ENC[…]` value under `value` (at `at`) to `found`.
fn encrypted_pointers(value: &Value, at: &mut String, found: &mut BTreeSet<String>) {
    match value {
        Value::String(text) if text.starts_with("ENC[") => {
            found.insert(at.clone());
        }
        Value::Object(map) => {
            for (key, child) in map {
                let len = at.len();
                at.push('/');
                at.push_str(&escape(key));
                encrypted_pointers(child, at, found);
                at.truncate(len);
            }
        }
        Value::Array(items) => {
            for (index, child) in items.iter().enumerate() {
                let len = at.len();
                at.push_str(&format!("/{index}"));
                encrypted_pointers(child, at, found);
                at.truncate(len);
            }
        }
        _ => {}
    }
}

/// True when an app selected for this cluster holds a SOPS object: only then is the keyring needed.
pub fn any_sealed(bundle: &Bundle, identity: &ClusterIdentity) -> bool {
    bundle
        .apps
        .iter()
        .filter(|app| app.selector.matches(&identity.labels))
        .any(|app| app.manifests.iter().any(|m| is_encrypted(&m.object)))
}

/// Opens the SOPS objects of the apps selected for this cluster, in place; those that do not open come back
/// as desired objects that are never sent (their identity only, no data), with why.
pub fn open_selected(
    bundle: &mut Bundle,
    identity: &ClusterIdentity,
    keyring: &Keyring,
) -> Vec<(Desired, String)> {
    let mut failed = Vec::new();
    for app in bundle
        .apps
        .iter_mut()
        .filter(|app| app.selector.matches(&identity.labels))
    {
        let (policy, namespace) = (app.policy.clone(), app.namespace.clone());
        for sealed in open_app(app, keyring) {
            if let Some(desired) = stand_in(&sealed, &policy, namespace.as_deref()) {
                failed.push((desired, sealed.error.to_string()));
            }
        }
    }
    failed
}

/// The object a sealed manifest stands for: its identity in the namespace it would get, no content.
fn stand_in(sealed: &Sealed, policy: &Policy, namespace: Option<&str>) -> Option<Desired> {
    let Some(mut id) = sealed.id.clone() else {
        warn!(app = %sealed.app, file = %sealed.file, "a SOPS object without a readable identity");
        return None;
    };
    if id.namespace.is_none() && id.kind != "Namespace" {
        id.namespace = Some(namespace.unwrap_or("default").to_owned());
    }
    let body = json!({
        "apiVersion": id.api_version,
        "kind": id.kind,
        "metadata": {"name": id.name, "namespace": id.namespace},
    });
    Some(Desired::of(DesiredObject {
        app: sealed.app.clone(),
        id,
        body,
        wave: 0,
        self_heal: policy.self_heal,
        prune: false,
        drift_grace_period: None,
        // Never sent, so never under admission prevention.
        prevent: false,
        ignored_pointers: Vec::new(),
        file: sealed.file.clone(),
        document: sealed.document,
        default_namespace: None,
    }))
}

/// The Failed result of an object that did not open.
pub fn failed_result(object: Desired, message: String) -> ObjectResult {
    ObjectResult {
        body_hash: object.body_hash(),
        object,
        outcome: Outcome::Failed(message),
        applied: None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;

    use super::*;

    fn secret(data: &[(&str, &str)]) -> Secret {
        let mut secret = Secret::default();
        secret.metadata.name = Some("windvane-age".to_owned());
        secret.data = Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect::<BTreeMap<_, _>>(),
        );
        secret
    }

    /// A bundle of two apps: `plain` (one ConfigMap, every cluster) and `vault` (one SOPS-encrypted
    /// Secret, only clusters labelled `tier=secure`).
    fn bundle_with_a_sealed_app() -> Bundle {
        let config_map = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "plain", "namespace": "default"}, "data": {"a": "b"}});
        let sealed = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "vault", "namespace": "default"},
            "data": {"password": "ENC[AES256_GCM,data:…]"},
            "sops": {"mac": "ENC[AES256_GCM,data:…]", "age": []}});
        serde_json::from_value(serde_json::json!({
            "apiVersion": "windvane.io/bundle/v1", "fleet": "acme", "apps": [
                {"name": "plain", "manifests": [{"file": "cm.yaml", "document": 0, "object": config_map}]},
                {"name": "vault", "selector": {"matchLabels": {"tier": "secure"}},
                 "manifests": [{"file": "secret.yaml", "document": 0, "object": sealed}]},
            ]
        }))
        .expect("bundle")
    }

    #[test]
    fn the_keyring_is_needed_only_when_an_app_of_this_cluster_holds_a_sops_object() {
        let bundle = bundle_with_a_sealed_app();
        let cluster = |labels: &[(&str, &str)]| ClusterIdentity {
            name: "edge-1".to_owned(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        assert!(any_sealed(&bundle, &cluster(&[("tier", "secure")])));
        assert!(!any_sealed(&bundle, &cluster(&[("tier", "open")])));
        assert!(!any_sealed(&bundle, &cluster(&[])));
    }

    #[test]
    fn identities_come_from_every_agekey_entry_and_problems_name_the_key_only() {
        let (one, one_public) = Keyring::generate();
        let (two, two_public) = Keyring::generate();
        let (keyring, problems) = keyring_of(&secret(&[
            ("old.agekey", &one),
            (
                "new.agekey",
                &format!("# public key: {two_public}\n{two}\n"),
            ),
            ("README", "ignored"),
        ]));
        assert!(problems.is_empty(), "{problems:?}");
        let mut held = keyring.recipients();
        held.sort();
        let mut expected = vec![one_public, two_public];
        expected.sort();
        assert_eq!(held, expected);

        let (keyring, problems) = keyring_of(&secret(&[("bad.agekey", "AGE-SECRET-KEY-1NOPE")]));
        assert!(keyring.is_empty());
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("key bad.agekey") && !problems[0].contains("NOPE"));

        let (_, problems) = keyring_of(&secret(&[("other", "x")]));
        assert!(problems[0].contains("no age identity"), "{problems:?}");
    }

    /// A sealed SOPS document (made by `seal`, which the real sops reads: shared's tests).
    fn sealed(name: &str, namespace: Option<&str>, recipient: &str) -> Value {
        let mut metadata = json!({"name": name});
        if let Some(namespace) = namespace {
            metadata["namespace"] = json!(namespace);
        }
        let plain = json!({"apiVersion": "v1", "kind": "Secret", "metadata": metadata,
            "data": {"password": "aHVudGVyMg=="}});
        let recipient = windvane_shared::format::sops::parse_recipient(recipient, "test").unwrap();
        windvane_shared::format::sops::seal(
            &[plain],
            &[recipient],
            windvane_shared::format::sops::KUBERNETES_ENCRYPTED_REGEX,
            "2026-12-04T20:00:00Z",
            "x",
        )
        .unwrap()
        .remove(0)
    }

    #[test]
    fn selected_apps_open_and_the_rest_stand_in_without_content() {
        let (secret, mine) = Keyring::generate();
        let (_, theirs) = Keyring::generate();
        let mut keyring = Keyring::default();
        keyring.add_text(&secret, "test").unwrap();
        let manifest =
            |file: &str, object: Value| json!({"file": file, "document": 0, "object": object});
        let mut bundle: Bundle = serde_json::from_value(json!({
            "apiVersion": "windvane.io/bundle/v1", "fleet": "acme",
            "apps": [
                {"name": "app", "namespace": "team", "manifests": [
                    manifest("a.yaml", sealed("mine", Some("x"), &mine)),
                    manifest("b.yaml", sealed("theirs", None, &theirs)),
                ]},
                {"name": "other", "selector": {"matchLabels": {"env": "dev"}}, "manifests": [
                    manifest("c.yaml", sealed("elsewhere", None, &theirs)),
                ]},
            ],
        }))
        .unwrap();
        let identity = ClusterIdentity::default();
        let failed = open_selected(&mut bundle, &identity, &keyring);
        // Only the selected app is opened; the unopened object stands in by identity only.
        assert_eq!(failed.len(), 1);
        let (object, message) = &failed[0];
        assert_eq!(object.id.to_string(), "Secret team/theirs");
        assert!(
            message.contains(&theirs) && message.contains(&mine),
            "{message}"
        );
        assert_eq!(object.body().get("data"), None);
        let app = &bundle.apps[0];
        assert_eq!(app.manifests.len(), 1);
        assert_eq!(app.manifests[0].object["data"]["password"], "aHVudGVyMg==");
        assert!(app.manifests[0].object.get("sops").is_none());
        assert!(is_encrypted(&bundle.apps[1].manifests[0].object));
        let result = failed_result(failed[0].0.clone(), failed[0].1.clone());
        assert!(matches!(result.outcome, Outcome::Failed(_)));
    }
}
