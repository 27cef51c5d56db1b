//! Interoperability with the `openssl` command line, both ways: keys that `openssl genpkey` writes
//! load and sign here; keys written here are read by openssl into the same public key; signatures
//! over the DSSE PAE made by either side verify on the other. Operators may make and inspect
//! release keys with openssl alone.
//!
//! These tests need the `openssl` CLI (OpenSSL 3.0 or later, for `pkeyutl -rawin`); they fail, not
//! skip, when it is missing.

use std::path::Path;
use std::process::{Command, Output};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::Signer as _;
use jiff::Timestamp;
use windvane_shared::crypto::dsse::{self, Envelope, Signature};
use windvane_shared::crypto::keys::{
    TrustedKeys, keyid, signing_key_from_pem, signing_key_from_seed, signing_key_to_pem,
    verifying_key_from_pem, verifying_key_to_pem,
};
use windvane_shared::format::release::{
    BundleRef, PointerExpectations, RELEASE_PAYLOAD_TYPE, ReleasePointer, verify_pointer,
};

/// Runs `openssl ARGS` and returns its output, failing the test with install advice when openssl is
/// missing.
fn openssl(args: &[&str], dir: &Path) -> Output {
    match Command::new("openssl").args(args).current_dir(dir).output() {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "the `openssl` command line tool is not installed (or not on PATH). These interop \
             tests need OpenSSL 3.0 or later: install it (apt-get install openssl, dnf install \
             openssl, brew install openssl@3) and run the tests again."
        ),
        Err(e) => panic!("could not run openssl {args:?}: {e}"),
    }
}

/// Like [`openssl`], and fails the test when openssl exits unsuccessfully.
fn openssl_ok(args: &[&str], dir: &Path) -> Output {
    let output = openssl(args, dir);
    assert!(
        output.status.success(),
        "openssl {args:?} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("read {name}: {e}"))
}

fn now() -> Timestamp {
    "2026-05-01T12:00:00Z".parse().expect("timestamp")
}

fn pointer() -> ReleasePointer {
    ReleasePointer {
        fleet: "prod".to_owned(),
        channel: "stable".to_owned(),
        serial: 1,
        issued_at: now(),
        expires_at: now() + jiff::SignedDuration::from_hours(24),
        bundle: BundleRef {
            sha256: windvane_shared::crypto::digest::sha256_hex(b"bundle"),
            size: 6,
        },
        allow_empty: false,
        rollout: None,
    }
}

#[test]
fn openssl_generated_keys_load_and_sign_pointers_that_verify() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    openssl_ok(&["genpkey", "-algorithm", "ed25519", "-out", "k.pem"], d);
    openssl_ok(&["pkey", "-in", "k.pem", "-pubout", "-out", "k.pub"], d);

    let sk = signing_key_from_pem(&read(d, "k.pem"), "k.pem").expect("openssl private key");
    let vk = verifying_key_from_pem(&read(d, "k.pub"), "k.pub").expect("openssl public key");
    assert_eq!(
        sk.verifying_key(),
        vk,
        "the private and public files are one key pair"
    );

    let trusted = TrustedKeys::from_pems([("k.pub", read(d, "k.pub").as_str())]).expect("trusted");
    let bytes = pointer().sign(&sk).to_json_bytes();
    let accepted = verify_pointer(
        &bytes,
        &PointerExpectations::new(&trusted, "prod", "stable", now()),
    )
    .expect("a pointer signed with openssl's key verifies with openssl's public key");
    assert_eq!(accepted.keyid, keyid(&vk));
    assert_eq!(accepted.pointer, pointer());
}

#[test]
fn our_pem_files_are_the_ones_openssl_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let sk = signing_key_from_seed([0x5a; 32]);
    let ours_private = signing_key_to_pem(&sk);
    std::fs::write(d.join("ours.key"), &ours_private).expect("write key");

    let derived = openssl_ok(&["pkey", "-in", "ours.key", "-pubout"], d);
    assert_eq!(
        String::from_utf8_lossy(&derived.stdout),
        verifying_key_to_pem(&sk.verifying_key()),
        "openssl derives exactly our public key PEM from our private key PEM"
    );
    let rewritten = openssl_ok(&["pkey", "-in", "ours.key"], d);
    assert_eq!(
        String::from_utf8_lossy(&rewritten.stdout),
        ours_private,
        "openssl rewrites our private key PEM byte for byte (PKCS#8 v1)"
    );
}

#[test]
fn openssl_signature_over_pae_verifies_here() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    openssl_ok(&["genpkey", "-algorithm", "ed25519", "-out", "k.pem"], d);
    openssl_ok(&["pkey", "-in", "k.pem", "-pubout", "-out", "k.pub"], d);
    let vk = verifying_key_from_pem(&read(d, "k.pub"), "k.pub").expect("openssl public key");

    let payload = serde_json::to_vec(&pointer()).expect("json");
    std::fs::write(d.join("pae.bin"), dsse::pae(RELEASE_PAYLOAD_TYPE, &payload))
        .expect("write pae");
    openssl_ok(
        &[
            "pkeyutl", "-sign", "-inkey", "k.pem", "-rawin", "-in", "pae.bin", "-out", "sig.bin",
        ],
        d,
    );
    let sig = std::fs::read(d.join("sig.bin")).expect("read sig");
    assert_eq!(sig.len(), 64);

    let envelope = Envelope {
        payload: BASE64.encode(&payload),
        payload_type: RELEASE_PAYLOAD_TYPE.to_owned(),
        signatures: vec![Signature {
            keyid: keyid(&vk),
            sig: BASE64.encode(&sig),
        }],
    };
    let mut trusted = TrustedKeys::new();
    trusted.insert(vk).expect("trust");
    let (verified, signer) =
        dsse::verify(&envelope, RELEASE_PAYLOAD_TYPE, &trusted).expect("openssl's signature");
    assert_eq!(verified, payload);
    assert_eq!(signer, keyid(&vk));
    let accepted = verify_pointer(
        &envelope.to_json_bytes(),
        &PointerExpectations::new(&trusted, "prod", "stable", now()),
    )
    .expect("pointer signed by openssl");
    assert_eq!(accepted.pointer, pointer());
}

#[test]
fn our_signature_over_pae_verifies_with_openssl() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let sk = signing_key_from_seed([0xa5; 32]);
    std::fs::write(
        d.join("ours.pub"),
        verifying_key_to_pem(&sk.verifying_key()),
    )
    .expect("write pub");

    let envelope = pointer().sign(&sk);
    let payload = envelope.payload_bytes().expect("payload");
    let pae = dsse::pae(&envelope.payload_type, &payload);
    let sig = BASE64
        .decode(&envelope.signatures[0].sig)
        .expect("base64 sig");
    assert_eq!(
        sig,
        sk.sign(&pae).to_bytes(),
        "the envelope's signature is Ed25519 over the PAE"
    );
    std::fs::write(d.join("pae.bin"), &pae).expect("write pae");
    std::fs::write(d.join("sig.bin"), &sig).expect("write sig");

    let verify = [
        "pkeyutl", "-verify", "-pubin", "-inkey", "ours.pub", "-rawin", "-in", "pae.bin",
        "-sigfile", "sig.bin",
    ];
    let output = openssl_ok(&verify, d);
    assert!(String::from_utf8_lossy(&output.stdout).contains("Signature Verified Successfully"));

    // Negative control: openssl refuses the same signature over a changed message.
    let mut tampered = pae.clone();
    if let Some(last) = tampered.last_mut() {
        *last ^= 1;
    }
    std::fs::write(d.join("pae.bin"), &tampered).expect("write tampered pae");
    let output = openssl(&verify, d);
    assert!(
        !output.status.success(),
        "openssl accepted a signature over a changed message"
    );
}
