//! Bundles as an agent receives them, and what it does next with an accepted one: render it for its cluster
//! and turn every object into what it applies.
//!
//! Mode 0: the bytes go straight to `Bundle::from_json_slice` (the parser and validator). Mode 1: the bytes
//! are bound by a pointer naming their real SHA-256 and size, so `verify_bundle` passes the digest check and
//! reaches the parser, as it does for a bundle a release key signed. An accepted bundle must survive its own
//! encoding, and rendering it must not panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use windvane_fuzz::{CHANNEL, FLEET, cluster, mode, now};
use windvane_shared::format::bundle::{Bundle, BundleLimits};
use windvane_shared::decide::desired::cluster_share;
use windvane_shared::crypto::digest::sha256_hex;
use windvane_shared::format::release::{BundleRef, DEFAULT_MAX_BUNDLE_BYTES, ReleasePointer, verify_bundle};

fuzz_target!(|data: &[u8]| {
    let Some((mode, data)) = mode(data, 2) else {
        return;
    };
    let limits = BundleLimits::default();
    let bundle = match mode {
        0 => Bundle::from_json_slice(data, limits),
        _ => {
            let pointer = ReleasePointer {
                fleet: FLEET.to_owned(),
                channel: CHANNEL.to_owned(),
                serial: 1,
                issued_at: now(),
                expires_at: now() + jiff::SignedDuration::from_hours(24),
                bundle: BundleRef {
                    sha256: sha256_hex(data),
                    size: data.len() as u64,
                },
                allow_empty: false,
                rollout: None,
            };
            verify_bundle(data, &pointer, DEFAULT_MAX_BUNDLE_BYTES, limits).inspect(|bundle| {
                assert_eq!(bundle.fleet, FLEET);
            })
        }
    };
    let Ok(bundle) = bundle else {
        return;
    };
    let encoded = bundle.to_json_bytes();
    Bundle::from_json_slice(&encoded, limits)
        .expect("an accepted bundle's own encoding is accepted");

    let cluster = cluster();
    for share in cluster_share(&bundle, &cluster) {
        let _ = share.objects;
    }
});
