//! What the publisher refuses of SOPS-encrypted input: a sealed `List` (its items would lose the file's
//! metadata), a sealed object in an engine's output (Helm and kustomize cannot have decrypted it), and a file
//! whose identity fields were encrypted too. The files are sealed with the core's own sealer (what
//! `windvane seal` writes, tested against the real `sops` in the core's tests).

use serde_json::{Value, json};
use windvane_publisher::manifests::manifests_of;
use windvane_publisher::prerender::kustomize_manifests;
use windvane_shared::format::sops::{KUBERNETES_ENCRYPTED_REGEX, Keyring, parse_recipient, seal};

/// `object` sealed to a fresh recipient under `encrypted_regex`, as the text of one JSON document.
fn sealed(object: Value, encrypted_regex: &str) -> String {
    let (_, recipient) = Keyring::generate();
    let recipient = parse_recipient(&recipient, "test").unwrap();
    let documents = seal(
        &[object],
        &[recipient],
        encrypted_regex,
        "2026-12-04T20:00:00Z",
        "secret.yaml",
    )
    .unwrap();
    serde_json::to_string(&documents[0]).unwrap()
}

#[test]
fn build_refuses_sops_lists_and_sops_in_engine_output() {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "a"}, "data": {"k": "dg=="}}
    ]});
    let error = manifests_of(
        "list.json",
        &sealed(list, "^(data|stringData)$"),
        &mut Vec::new(),
    )
    .unwrap_err();
    assert!(error.to_string().contains("SOPS-encrypted List"), "{error}");

    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "a"}, "data": {"k": "dg=="}});
    let error = kustomize_manifests(
        "overlay",
        &sealed(secret, KUBERNETES_ENCRYPTED_REGEX),
        &mut Vec::new(),
    )
    .unwrap_err();
    assert!(
        error.to_string().contains("Helm or kustomize output"),
        "{error}"
    );

    let all = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "a"}});
    let error = manifests_of("all.json", &sealed(all, ""), &mut Vec::new()).unwrap_err();
    assert!(error.to_string().contains("--encrypted-regex"), "{error}");
}
