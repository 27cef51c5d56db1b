//! Bundle acceptance: how fast the agent accepts a 10 MB release bundle — `release::verify_bundle` (size
//! cap, SHA-256 against the signed pointer, parse, validate) — against the raw SHA-256 of the same bytes,
//! which bounds it from below. Same construction as `shared/benches/accept_bundle.rs` (the criterion
//! benchmark that profiles it in depth); here the two alternate over a fixed number of rounds and the
//! medians are compared.

use std::hint::black_box;
use std::time::{Duration, Instant};

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
/// The bundle's size, about.
pub const TARGET_BYTES: usize = 10_000_000;

/// Median times of the two.
#[derive(Debug, Clone)]
pub struct BundleAcceptance {
    pub bytes: usize,
    pub objects: usize,
    pub rounds: usize,
    pub verify: Duration,
    pub sha256: Duration,
}

impl BundleAcceptance {
    /// Throughput of `verify_bundle`, MB/s.
    pub fn verify_mbps(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.verify.as_secs_f64()
    }

    /// Throughput of SHA-256, MB/s.
    pub fn sha256_mbps(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.sha256.as_secs_f64()
    }
}

/// A canonical bundle of [`APPS`] apps whose ConfigMaps (about 1 KB each) add up to at least `target`
/// bytes, and how many objects it holds.
fn bundle_of_about(target: usize) -> anyhow::Result<(Vec<u8>, usize)> {
    let value = "x".repeat(100);
    let config_map = |app: usize, n: usize| {
        let data: serde_json::Map<String, serde_json::Value> = (0..8)
            .map(|k| (format!("key-{k}"), json!(format!("{value}{n}"))))
            .collect();
        json!({
            "file": format!("apps/app-{app}/config-{n}.yaml"),
            "document": 0,
            "object": {
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("config-{n}"), "namespace": format!("app-{app}"),
                             "labels": {"app.kubernetes.io/name": format!("app-{app}"), "tier": "backend"}},
                "data": data,
            },
        })
    };
    let per_object = serde_json::to_vec(&config_map(0, 0))?.len();
    let objects = target.div_ceil(per_object);
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
    )?;
    let bytes = Bundle::from_json_slice(&raw, BundleLimits::default())?.to_json_bytes();
    Ok((bytes, objects))
}

/// A pointer to `bundle`, signed and verified as an agent verifies it.
fn verified_pointer(bundle: &[u8]) -> anyhow::Result<ReleasePointer> {
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
    trusted.insert(key.verifying_key())?;
    let envelope = pointer.sign(&key).to_json_bytes();
    Ok(verify_pointer(
        &envelope,
        &PointerExpectations::new(&trusted, FLEET, "stable", now),
    )?
    .pointer)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Builds the bundle and times `rounds` alternating rounds of each (after one warm-up round).
pub fn measure(rounds: usize) -> anyhow::Result<BundleAcceptance> {
    let (bytes, objects) = bundle_of_about(TARGET_BYTES)?;
    let pointer = verified_pointer(&bytes)?;
    let accept = || {
        verify_bundle(
            black_box(&bytes),
            &pointer,
            DEFAULT_MAX_BUNDLE_BYTES,
            BundleLimits::default(),
        )
    };
    accept()?;
    black_box(Sha256::digest(black_box(bytes.as_slice())));
    let (mut verify, mut sha256) = (Vec::new(), Vec::new());
    for _ in 0..rounds.max(1) {
        let started = Instant::now();
        black_box(accept()?);
        verify.push(started.elapsed());
        let started = Instant::now();
        black_box(Sha256::digest(black_box(bytes.as_slice())));
        sha256.push(started.elapsed());
    }
    Ok(BundleAcceptance {
        bytes: bytes.len(),
        objects,
        rounds: rounds.max(1),
        verify: median(verify),
        sha256: median(sha256),
    })
}
