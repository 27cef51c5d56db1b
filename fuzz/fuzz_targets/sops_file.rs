//! SOPS files as an agent opens them ([`windvane_shared::format::sops`]): the documents of one manifest file.
//!
//! Mode 0: the YAML stream's documents are opened as one SOPS file with a keyring that holds one identity:
//! any input is refused or opened without a panic. Mode 1: documents without SOPS metadata are sealed to that
//! identity's recipient and must open back to exactly themselves (every value type, every key path).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use windvane_shared::format::sops::{KUBERNETES_ENCRYPTED_REGEX, Keyring, open_file, parse_recipient, seal};
use windvane_shared::text::yaml::{YamlLimits, documents_to_json};

/// One identity for the whole run (what fails or opens does not depend on which).
fn keys() -> &'static (Keyring, String) {
    static KEYS: OnceLock<(Keyring, String)> = OnceLock::new();
    KEYS.get_or_init(|| {
        let (secret, recipient) = Keyring::generate();
        let mut keyring = Keyring::default();
        keyring
            .add_text(&secret, "fuzz")
            .expect("a generated identity reads");
        (keyring, recipient)
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((mode, data)) = windvane_fuzz::mode(data, 2) else {
        return;
    };
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(documents) = documents_to_json(text, "fuzz.yaml", YamlLimits::default()) else {
        return;
    };
    let documents: Vec<Value> = documents.into_iter().map(|(_, value)| value).collect();
    if documents.is_empty() {
        return;
    }
    let (keyring, recipient) = keys();
    if mode == 0 {
        let refs: Vec<&Value> = documents.iter().collect();
        let _ = open_file(&refs, keyring, "fuzz.yaml");
        return;
    }
    if documents
        .iter()
        .any(|d| !d.is_object() || d.get("sops").is_some())
    {
        return;
    }
    let recipients = [parse_recipient(recipient, "fuzz").expect("a generated recipient reads")];
    let sealed = seal(
        &documents,
        &recipients,
        KUBERNETES_ENCRYPTED_REGEX,
        "2026-12-04T20:00:00Z",
        "fuzz.yaml",
    )
    .expect("mappings seal");
    let refs: Vec<&Value> = sealed.iter().collect();
    let opened = open_file(&refs, keyring, "fuzz.yaml").expect("what seal wrote opens");
    assert_eq!(opened, documents, "seal then open is the identity");
});
