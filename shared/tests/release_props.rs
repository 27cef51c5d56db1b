//! Property tests for release verification: no single-byte change to a signed channel pointer or to
//! a bundle gets past `verify_pointer` / `verify_bundle`, and no input makes them panic.

use jiff::Timestamp;
use proptest::prelude::*;
use serde_json::json;
use windvane_shared::crypto::digest::sha256_hex;
use windvane_shared::crypto::keys::{TrustedKeys, signing_key_from_seed};
use windvane_shared::format::bundle::{BUNDLE_API_VERSION, BundleLimits};
use windvane_shared::format::release::{
    BundleRef, DEFAULT_MAX_BUNDLE_BYTES, PointerExpectations, ReleasePointer, verify_bundle,
    verify_pointer,
};

const FLEET: &str = "prod";
const CHANNEL: &str = "stable";

fn now() -> Timestamp {
    "2026-05-01T12:00:00Z".parse().expect("timestamp")
}

fn bundle_bytes() -> Vec<u8> {
    let apps: Vec<_> = ["web", "api"]
        .iter()
        .map(|app| {
            json!({
                "name": app,
                "values": {"replicas": 2},
                "manifests": [{
                    "file": format!("apps/{app}/config.yaml"),
                    "document": 0,
                    "object": {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "metadata": {"name": app, "namespace": app},
                        "data": {"greeting": "hello", "replicas": "${values.replicas}"},
                    },
                }],
            })
        })
        .collect();
    serde_json::to_vec(&json!({"apiVersion": BUNDLE_API_VERSION, "fleet": FLEET, "apps": apps}))
        .expect("json")
}

fn pointer(bundle: &[u8]) -> ReleasePointer {
    ReleasePointer {
        fleet: FLEET.to_owned(),
        channel: CHANNEL.to_owned(),
        serial: 7,
        issued_at: now() - jiff::SignedDuration::from_mins(1),
        expires_at: now() + jiff::SignedDuration::from_hours(24),
        bundle: BundleRef {
            sha256: sha256_hex(bundle),
            size: bundle.len() as u64,
        },
        allow_empty: false,
        rollout: None,
    }
}

struct Fixture {
    trusted: TrustedKeys,
    envelope: Vec<u8>,
    bundle: Vec<u8>,
    pointer: ReleasePointer,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: std::sync::OnceLock<Fixture> = std::sync::OnceLock::new();
    FIXTURE.get_or_init(|| {
        let key = signing_key_from_seed([42; 32]);
        let mut trusted = TrustedKeys::new();
        trusted.insert(key.verifying_key()).expect("strong key");
        let bundle = bundle_bytes();
        let pointer = pointer(&bundle);
        let envelope = pointer.sign(&key).to_json_bytes();
        Fixture {
            trusted,
            envelope,
            bundle,
            pointer,
        }
    })
}

fn expectations(f: &Fixture) -> PointerExpectations<'_> {
    let mut expect = PointerExpectations::new(&f.trusted, FLEET, CHANNEL, now());
    expect.highest_accepted = Some((f.pointer.serial, f.pointer.bundle.sha256.as_str()));
    expect
}

/// True when `verify_bundle` accepts `bytes` for `pointer` with the default caps.
fn bundle_accepted(bytes: &[u8], pointer: &ReleasePointer) -> bool {
    verify_bundle(
        bytes,
        pointer,
        DEFAULT_MAX_BUNDLE_BYTES,
        BundleLimits::default(),
    )
    .is_ok()
}

#[test]
fn unmodified_fixture_is_accepted() {
    let f = fixture();
    let accepted = verify_pointer(&f.envelope, &expectations(f)).expect("pointer");
    assert_eq!(accepted.pointer, f.pointer);
    verify_bundle(
        &f.bundle,
        &accepted.pointer,
        DEFAULT_MAX_BUNDLE_BYTES,
        BundleLimits::default(),
    )
    .expect("bundle");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_single_byte_flip_of_a_signed_pointer_is_refused(
        index in any::<prop::sample::Index>(),
        mask in 1u8..=255,
    ) {
        let f = fixture();
        let mut bytes = f.envelope.clone();
        let at = index.index(bytes.len());
        bytes[at] ^= mask;
        let result = verify_pointer(&bytes, &expectations(f));
        prop_assert!(result.is_err(), "flip {mask:#04x} at {at} of {} accepted", bytes.len());
    }

    #[test]
    fn any_single_byte_flip_of_a_bundle_is_refused(
        index in any::<prop::sample::Index>(),
        mask in 1u8..=255,
    ) {
        let f = fixture();
        let mut bytes = f.bundle.clone();
        let at = index.index(bytes.len());
        bytes[at] ^= mask;
        prop_assert!(
            !bundle_accepted(&bytes, &f.pointer),
            "flip {mask:#04x} at {at} of {} accepted",
            bytes.len()
        );
    }

    #[test]
    fn arbitrary_bytes_are_refused_without_panicking(
        bytes in prop::collection::vec(any::<u8>(), 0..2048),
    ) {
        let f = fixture();
        prop_assert!(verify_pointer(&bytes, &expectations(f)).is_err());
        prop_assert!(!bundle_accepted(&bytes, &f.pointer));
    }

    #[test]
    fn truncated_or_extended_pointers_are_refused(
        cut in any::<prop::sample::Index>(),
        extra in prop::collection::vec(any::<u8>(), 1..16),
    ) {
        let f = fixture();
        let truncated = &f.envelope[..cut.index(f.envelope.len())];
        prop_assert!(verify_pointer(truncated, &expectations(f)).is_err());
        let mut extended = f.envelope.clone();
        extended.extend_from_slice(&extra);
        // Trailing JSON whitespace is insignificant, so an extension of only whitespace may be
        // accepted: it changes nothing that was signed. Anything else is refused.
        if !extra.iter().all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r')) {
            prop_assert!(verify_pointer(&extended, &expectations(f)).is_err());
        }
    }
}
