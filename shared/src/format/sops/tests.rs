//! SOPS files made at run time by the real `sops` binary (tests/tools/build.sh builds it from
//! github.com/getsops/sops/v3), opened by [`super::open_file`]; hand-tampered variants refused; files sealed by
//! [`super::seal`] opened by the real `sops`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use super::*;
use crate::text::yaml::{YamlLimits, documents_to_json};

/// The real sops: `WINDVANE_SOPS` (set by tests/run), else the one tests/tools/build.sh writes.
fn sops_binary() -> PathBuf {
    let path = match std::env::var_os("WINDVANE_SOPS") {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tools/sops"),
    };
    assert!(
        path.is_file(),
        "{} is missing: run tests/tools/build.sh (or set WINDVANE_SOPS)",
        path.display()
    );
    path
}

const SECRET_AND_CONFIG: &str = "\
apiVersion: v1
kind: Secret
metadata:
  name: db
  namespace: app
  labels: {tier: \"1\"}
type: Opaque
data:
  password: aHVudGVyMg==
  # a comment, encrypted by sops and not covered by its MAC
  count: 3
  ratio: 1.5
  enabled: true
  empty: \"\"
  nothing: null
  list: [x, 2, false]
stringData:
  user: admin
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
data: {mode: fast}
";

/// Encrypts `plain` with the real sops, with `args` (recipients and rules), in a scratch directory.
fn sops_encrypt(plain: &str, args: &[&str]) -> String {
    sops_encrypt_with(plain, args, None)
}

/// [`sops_encrypt`] with a `.sops.yaml` creation rule beside the file.
fn sops_encrypt_with(plain: &str, args: &[&str], config: Option<&str>) -> String {
    let dir = tempfile::tempdir().unwrap();
    if let Some(config) = config {
        std::fs::write(dir.path().join(".sops.yaml"), config).unwrap();
    }
    let input = dir.path().join("secret.yaml");
    std::fs::write(&input, plain).unwrap();
    let output = Command::new(sops_binary())
        .current_dir(dir.path())
        .arg("encrypt")
        .args(args)
        .arg(&input)
        .env_remove("SOPS_AGE_KEY")
        .env_remove("SOPS_AGE_KEY_FILE")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "sops encrypt: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn documents(text: &str) -> Vec<Value> {
    documents_to_json(text, "secret.yaml", YamlLimits::default())
        .unwrap()
        .into_iter()
        .map(|(_, value)| value)
        .collect()
}

fn keyring(secret: &str) -> Keyring {
    let mut keyring = Keyring::default();
    keyring.add_text(secret, "test key").unwrap();
    keyring
}

fn open(encrypted: &[Value], keyring: &Keyring) -> Result<Vec<Value>> {
    let refs: Vec<&Value> = encrypted.iter().collect();
    open_file(&refs, keyring, "secret.yaml")
}

/// What sops's reader makes of the plain file: a null is kept, a comment is not.
fn expected() -> Vec<Value> {
    documents(SECRET_AND_CONFIG)
}

#[test]
fn a_file_from_the_real_sops_opens_to_its_plaintext() {
    let (secret, recipient) = Keyring::generate();
    let text = sops_encrypt(
        SECRET_AND_CONFIG,
        &[
            "--age",
            &recipient,
            "--encrypted-regex",
            KUBERNETES_ENCRYPTED_REGEX,
        ],
    );
    assert!(
        !text.contains("aHVudGVyMg=="),
        "sops encrypted the password"
    );
    let encrypted = documents(&text);
    assert!(encrypted.iter().all(is_encrypted));
    assert_eq!(recipients_of(&encrypted[0]), vec![recipient.clone()]);
    // The identity stays in clear, so a build places it without the key.
    assert_eq!(encrypted[0]["metadata"]["name"], "db");
    check_identity_in_clear("secret.yaml", 0, &encrypted[0]).unwrap();

    let opened = open(&encrypted, &keyring(&secret)).unwrap();
    assert_eq!(opened, expected());
    assert_eq!(opened[0]["data"]["count"], json!(3));
    assert_eq!(opened[0]["data"]["list"], json!(["x", 2, false]));
}

#[test]
fn every_value_encrypted_and_suffix_rules_open_too() {
    let (secret, recipient) = Keyring::generate();
    let keyring = keyring(&secret);
    // sops's default: every value, the identity included (windvane build refuses such a manifest).
    let all = documents(&sops_encrypt(SECRET_AND_CONFIG, &["--age", &recipient]));
    assert!(check_identity_in_clear("secret.yaml", 0, &all[0]).is_err());
    assert_eq!(open(&all, &keyring).unwrap(), expected());
    // Unencrypted suffix: `tier` is not encrypted, the rest is.
    let plain = SECRET_AND_CONFIG.replace("tier:", "tier_unencrypted:");
    let suffixed = documents(&sops_encrypt(
        &plain,
        &["--age", &recipient, "--unencrypted-suffix", "_unencrypted"],
    ));
    assert_eq!(suffixed[0]["metadata"]["labels"]["tier_unencrypted"], "1");
    assert_eq!(open(&suffixed, &keyring).unwrap(), documents(&plain));
    // Unencrypted regex.
    let regexed = documents(&sops_encrypt(
        SECRET_AND_CONFIG,
        &[
            "--age",
            &recipient,
            "--unencrypted-regex",
            "^(apiVersion|kind|metadata)$",
        ],
    ));
    assert_eq!(regexed[1]["metadata"]["name"], "settings");
    assert_eq!(open(&regexed, &keyring).unwrap(), expected());
}

#[test]
fn mac_only_encrypted_files_open() {
    let (secret, recipient) = Keyring::generate();
    let config = format!(
        "creation_rules:\n  - age: {recipient}\n    encrypted_regex: '{KUBERNETES_ENCRYPTED_REGEX}'\n    mac_only_encrypted: true\n"
    );
    let text = sops_encrypt_with(SECRET_AND_CONFIG, &[], Some(&config));
    assert!(text.contains("mac_only_encrypted: true"), "{text}");
    let mut encrypted = documents(&text);
    let keyring = keyring(&secret);
    assert_eq!(open(&encrypted, &keyring).unwrap(), expected());
    // A clear value is outside such a MAC: changing it is not detected, as in sops itself.
    encrypted[1]["metadata"]["name"] = json!("other");
    encrypted[0]["metadata"]["name"] = json!("other");
    assert!(open(&encrypted, &keyring).is_ok());
}

#[test]
fn a_missing_key_names_the_recipients_it_needs() {
    let (_, recipient) = Keyring::generate();
    let (other, held) = Keyring::generate();
    let encrypted = documents(&sops_encrypt(
        SECRET_AND_CONFIG,
        &[
            "--age",
            &recipient,
            "--encrypted-regex",
            KUBERNETES_ENCRYPTED_REGEX,
        ],
    ));
    let error = open(&encrypted, &keyring(&other)).unwrap_err();
    let Error::SopsNoKey {
        recipients,
        held: h,
        ..
    } = &error
    else {
        panic!("{error}");
    };
    assert_eq!(recipients, &vec![recipient.clone()]);
    assert_eq!(h, &vec![held.clone()]);
    let message = error.to_string();
    assert!(
        message.contains(&recipient) && message.contains(&held),
        "{message}"
    );
    let error = open(&encrypted, &Keyring::default()).unwrap_err();
    assert!(error.to_string().contains("holds none"), "{error}");
}

#[test]
fn tampered_files_are_refused() {
    let (secret, recipient) = Keyring::generate();
    let keyring = keyring(&secret);
    let encrypted = documents(&sops_encrypt(
        SECRET_AND_CONFIG,
        &[
            "--age",
            &recipient,
            "--encrypted-regex",
            KUBERNETES_ENCRYPTED_REGEX,
        ],
    ));
    let refused = |change: &dyn Fn(&mut Vec<Value>)| {
        let mut copy = encrypted.clone();
        change(&mut copy);
        open(&copy, &keyring).unwrap_err()
    };
    // A clear value changed: the MAC covers it.
    let error = refused(&|d| d[0]["metadata"]["labels"]["tier"] = json!("2"));
    assert!(matches!(error, Error::SopsMac { .. }), "{error}");
    // A value removed.
    let error = refused(&|d| {
        d[0]["data"].as_object_mut().unwrap().remove("count");
    });
    assert!(matches!(error, Error::SopsMac { .. }), "{error}");
    // A value added in clear outside the encrypted keys.
    let error = refused(&|d| d[1]["metadata"]["labels"] = json!({"x": "y"}));
    assert!(matches!(error, Error::SopsMac { .. }), "{error}");
    // The MAC itself altered, everywhere it appears.
    let mac = encrypted[0]["sops"]["mac"].as_str().unwrap().to_owned();
    let data_start = mac.find("data:").unwrap() + 5;
    let flipped = if &mac[data_start..=data_start] == "A" {
        "B"
    } else {
        "A"
    };
    let altered = format!("{}{flipped}{}", &mac[..data_start], &mac[data_start + 1..]);
    let error = refused(&|d| {
        for doc in d.iter_mut() {
            doc["sops"]["mac"] = json!(altered.clone());
        }
    });
    assert!(matches!(error, Error::SopsMac { .. }), "{error}");
    // An encrypted value moved to another key: its key path is its additional data.
    let error = refused(&|d| {
        let password = d[0]["data"]["password"].clone();
        d[0]["data"]["user"] = password;
    });
    assert!(
        matches!(error, Error::SopsValue { ref path, .. } if path == "data:user:"),
        "{error}"
    );
    // One document left out of the file.
    let error = refused(&|d| {
        d.pop();
    });
    assert!(matches!(error, Error::SopsMac { .. }), "{error}");
    // Documents with different metadata.
    let error = refused(&|d| d[1]["sops"]["lastmodified"] = json!("2020-01-01T00:00:00Z"));
    assert!(matches!(error, Error::SopsFormat { .. }), "{error}");
    // No message shows a plaintext value.
    assert!(!error.to_string().contains("hunter2") && !error.to_string().contains("admin"));
}

#[test]
fn either_recipient_opens_a_file_sealed_to_two() {
    let (old, old_recipient) = Keyring::generate();
    let (new, new_recipient) = Keyring::generate();
    let encrypted = documents(&sops_encrypt(
        SECRET_AND_CONFIG,
        &[
            "--age",
            &format!("{old_recipient},{new_recipient}"),
            "--encrypted-regex",
            KUBERNETES_ENCRYPTED_REGEX,
        ],
    ));
    assert_eq!(open(&encrypted, &keyring(&old)).unwrap(), expected());
    assert_eq!(open(&encrypted, &keyring(&new)).unwrap(), expected());
    let mut both = keyring(&old);
    both.add_text(&new, "second").unwrap();
    assert_eq!(both.recipients(), vec![old_recipient, new_recipient]);
}

#[test]
fn what_seal_writes_the_real_sops_decrypts() {
    let (secret, recipient) = Keyring::generate();
    let plain = expected();
    let recipients = [parse_recipient(&recipient, "test").unwrap()];
    let sealed = seal(
        &plain,
        &recipients,
        KUBERNETES_ENCRYPTED_REGEX,
        "2026-12-04T20:00:00Z",
        "secret.yaml",
    )
    .unwrap();
    assert_eq!(open(&sealed, &keyring(&secret)).unwrap(), plain);
    assert!(
        !serde_json::to_string(&sealed)
            .unwrap()
            .contains("aHVudGVyMg==")
    );

    // The real sops reads each document (one JSON file per document) with the identity in SOPS_AGE_KEY.
    let dir = tempfile::tempdir().unwrap();
    let one = seal(
        &plain[..1],
        &recipients,
        KUBERNETES_ENCRYPTED_REGEX,
        "2026-12-04T20:00:00Z",
        "one.json",
    )
    .unwrap();
    let path = dir.path().join("one.json");
    std::fs::write(&path, serde_json::to_string_pretty(&one[0]).unwrap()).unwrap();
    let output = Command::new(sops_binary())
        .args(["decrypt", "--input-type", "json", "--output-type", "json"])
        .arg(&path)
        .env("SOPS_AGE_KEY", secret.trim())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "sops decrypt: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let decrypted: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(decrypted, plain[0]);
}

#[test]
fn keyrings_read_age_keygen_files_and_refuse_other_text() {
    let (secret, recipient) = Keyring::generate();
    let file = format!("# created: 2026-12-04\n# public key: {recipient}\n{secret}\n\n");
    assert_eq!(keyring(&file).recipients(), vec![recipient.clone()]);
    let mut keyring = Keyring::default();
    let error = keyring.add_text("not a key", "secret/agekey").unwrap_err();
    assert!(
        error.to_string().contains("secret/agekey: line 1"),
        "{error}"
    );
    assert!(!format!("{keyring:?}").contains("AGE-SECRET-KEY"));
    assert!(parse_recipient("age1nope", "flag").is_err());
}

#[test]
fn an_app_opens_what_it_can_and_hands_back_the_rest() {
    let (secret, recipient) = Keyring::generate();
    let (_, stranger) = Keyring::generate();
    let args = |r: &str| {
        vec![
            "--age".to_owned(),
            r.to_owned(),
            "--encrypted-regex".into(),
            KUBERNETES_ENCRYPTED_REGEX.into(),
        ]
    };
    let ours = sops_encrypt(
        SECRET_AND_CONFIG,
        &args(&recipient)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let theirs = sops_encrypt(
        "apiVersion: v1\nkind: Secret\nmetadata: {name: other}\ndata: {k: dg==}\n",
        &args(&stranger)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let mut manifests = Vec::new();
    for (file, text) in [
        ("a/ours.yaml", ours.as_str()),
        (
            "b/plain.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: p}\n",
        ),
        ("c/theirs.yaml", theirs.as_str()),
    ] {
        manifests.extend(
            documents_to_json(text, file, YamlLimits::default())
                .unwrap()
                .into_iter()
                .map(|(document, object)| crate::format::bundle::Manifest {
                    file: file.to_owned(),
                    document,
                    object,
                }),
        );
    }
    let mut app: crate::format::bundle::App =
        serde_json::from_value(json!({"name": "app", "manifests": []})).unwrap();
    app.manifests = manifests;
    let sealed = open_app(&mut app, &keyring(&secret));
    let names: Vec<&str> = app
        .manifests
        .iter()
        .map(|m| m.object["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["db", "settings", "p"]);
    assert_eq!(app.manifests[0].object["data"]["password"], "aHVudGVyMg==");
    assert!(app.manifests.iter().all(|m| m.object.get("sops").is_none()));
    assert_eq!(sealed.len(), 1);
    assert_eq!(sealed[0].file, "c/theirs.yaml");
    assert_eq!(sealed[0].id.as_ref().unwrap().name, "other");
    assert!(sealed[0].error.to_string().contains(&stranger));
}

#[test]
fn a_file_sealed_to_a_clusters_enrolled_key_opens_with_that_key_only() {
    let cluster = crate::crypto::keys::signing_key_from_seed([21; 32]);
    let recipient = cluster_recipient(&cluster.verifying_key());
    assert!(recipient.starts_with("age1"), "{recipient}");
    let mut ring = Keyring::default();
    ring.add_cluster_key(&cluster);
    assert_eq!(ring.recipients(), vec![recipient.clone()]);
    // Sealed by the real sops to the derived recipient, as `windvane seal` does too.
    let encrypted = documents(&sops_encrypt(
        SECRET_AND_CONFIG,
        &[
            "--age",
            &recipient,
            "--encrypted-regex",
            KUBERNETES_ENCRYPTED_REGEX,
        ],
    ));
    assert_eq!(open(&encrypted, &ring).unwrap(), expected());
    let mut other = Keyring::default();
    other.add_cluster_key(&crate::crypto::keys::signing_key_from_seed([22; 32]));
    assert!(matches!(
        open(&encrypted, &other),
        Err(Error::SopsNoKey { .. })
    ));
}

#[test]
fn a_recipient_is_checked_against_the_key_id_it_claims() {
    for seed in [1u8, 2, 3, 77, 200] {
        let key = crate::crypto::keys::signing_key_from_seed([seed; 32]).verifying_key();
        let recipient = cluster_recipient(&key);
        assert!(
            recipient_of_keyid(&recipient, &crate::crypto::keys::keyid(&key)),
            "seed {seed}"
        );
        let other =
            crate::crypto::keys::signing_key_from_seed([seed.wrapping_add(1); 32]).verifying_key();
        assert!(!recipient_of_keyid(
            &recipient,
            &crate::crypto::keys::keyid(&other)
        ));
        assert!(!recipient_of_keyid(
            &cluster_recipient(&other),
            &crate::crypto::keys::keyid(&key)
        ));
    }
    assert!(!recipient_of_keyid("age1notbech32", "00"));
    let (_, generated) = Keyring::generate();
    assert!(!recipient_of_keyid(&generated, &"0".repeat(64)));
}
