//! How fast an agent accepts a new release bundle: `verify_bundle` (size, SHA-256, parse and
//! validate) on bundles of about 1 MB and 10 MB of ConfigMaps spread over many apps, next to the
//! raw SHA-256 of the same bytes, which bounds it from below. Throughput is reported in bytes, so
//! criterion prints MB/s.
//!
//! Run:
//!
//! ```text
//! cargo bench -p windvane-shared --bench accept_bundle -- --warm-up-time 1 --measurement-time 5
//! ```

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use jiff::Timestamp;
use serde_json::json;
use sha2::{Digest, Sha256};
use windvane_shared::crypto::digest::sha256_hex;
use windvane_shared::crypto::keys::{TrustedKeys, signing_key_from_seed};
use windvane_shared::format::bundle::{BUNDLE_API_VERSION, Bundle, BundleLimits};
use windvane_shared::format::release::{
    BundleRef, DEFAULT_MAX_BUNDLE_BYTES, PointerExpectations, ReleasePointer, verify_bundle,
    verify_pointer,
};

const FLEET: &str = "bench";
const APPS: usize = 50;

/// A canonical bundle of `APPS` apps whose ConfigMaps add up to at least `target_bytes`.
fn bundle_of_about(target_bytes: usize) -> Vec<u8> {
    // Each ConfigMap carries 8 entries of 100 bytes: about 1 KB of JSON with its metadata.
    let value = "x".repeat(100);
    let config_map = |app: usize, n: usize| {
        let data: serde_json::Map<String, serde_json::Value> = (0..8)
            .map(|k| (format!("key-{k}"), json!(format!("{value}{n}"))))
            .collect();
        json!({
            "file": format!("apps/app-{app}/config-{n}.yaml"),
            "document": 0,
            "object": {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": format!("config-{n}"),
                    "namespace": format!("app-{app}"),
                    "labels": {"app.kubernetes.io/name": format!("app-{app}"), "tier": "backend"},
                },
                "data": data,
            },
        })
    };
    let per_object = serde_json::to_vec(&config_map(0, 0)).map_or(1, |v| v.len());
    let objects = target_bytes.div_ceil(per_object);
    let apps: Vec<_> = (0..APPS)
        .map(|app| {
            let manifests: Vec<_> = (0..objects)
                .filter(|n| n % APPS == app)
                .map(|n| config_map(app, n))
                .collect();
            json!({"name": format!("app-{app}"), "values": {"replicas": 2}, "manifests": manifests})
        })
        .collect();
    let raw = serde_json::to_vec(
        &json!({"apiVersion": BUNDLE_API_VERSION, "fleet": FLEET, "apps": apps}),
    )
    .expect("json");
    Bundle::from_json_slice(&raw, BundleLimits::default())
        .expect("valid bundle")
        .to_json_bytes()
}

/// Signs a pointer to `bundle` and verifies it as an agent would, returning the verified pointer.
fn verified_pointer(bundle: &[u8]) -> ReleasePointer {
    let key = signing_key_from_seed([7; 32]);
    let now = Timestamp::now();
    let pointer = ReleasePointer {
        fleet: FLEET.to_owned(),
        channel: "stable".to_owned(),
        serial: 1,
        issued_at: now,
        expires_at: now + jiff::SignedDuration::from_hours(24),
        bundle: BundleRef {
            sha256: sha256_hex(bundle),
            size: bundle.len() as u64,
        },
        allow_empty: false,
        rollout: None,
    };
    let mut trusted = TrustedKeys::new();
    trusted.insert(key.verifying_key()).expect("strong key");
    let envelope = pointer.sign(&key).to_json_bytes();
    verify_pointer(
        &envelope,
        &PointerExpectations::new(&trusted, FLEET, "stable", now),
    )
    .expect("pointer")
    .pointer
}

fn accept_bundle(c: &mut Criterion) {
    let mut group = c.benchmark_group("accept_bundle");
    for (label, target) in [("1MB", 1_000_000), ("10MB", 10_000_000)] {
        let bytes = bundle_of_about(target);
        let pointer = verified_pointer(&bytes);
        verify_bundle(
            &bytes,
            &pointer,
            DEFAULT_MAX_BUNDLE_BYTES,
            BundleLimits::default(),
        )
        .expect("accepted");
        eprintln!("accept_bundle/{label}: {} bytes", bytes.len());

        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.sample_size(if target > 5_000_000 { 20 } else { 50 });
        group.bench_with_input(
            BenchmarkId::new("verify_bundle", label),
            &bytes,
            |b, bytes| {
                b.iter(|| {
                    verify_bundle(
                        black_box(bytes),
                        &pointer,
                        DEFAULT_MAX_BUNDLE_BYTES,
                        BundleLimits::default(),
                    )
                    .expect("accepted")
                });
            },
        );
        group.bench_with_input(BenchmarkId::new("sha256", label), &bytes, |b, bytes| {
            b.iter(|| Sha256::digest(black_box(bytes.as_slice())));
        });
    }
    group.finish();
}

criterion_group!(benches, accept_bundle);
criterion_main!(benches);
