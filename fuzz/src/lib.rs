//! What the fuzz targets (`fuzz_targets/`) and the seed generator (`examples/gen_seeds.rs`) share: fixed keys,
//! a fixed clock, the fleet, channel and cluster they pretend to be, and the one-byte mode switch at the head of
//! an input. Fixed values keep every crash reproducible from its input file alone.

use std::collections::BTreeMap;

use ed25519_dalek::SigningKey;
use jiff::Timestamp;
use windvane_shared::crypto::keys::{TrustedKeys, signing_key_from_seed};
use windvane_shared::decide::render::ClusterIdentity;

/// The fleet every target expects.
pub const FLEET: &str = "acme";
/// The channel the release-pointer target follows.
pub const CHANNEL: &str = "stable";
/// The enrolled cluster of the heartbeat target.
pub const CLUSTER: &str = "prod-eu-1";
/// The highest serial the release-pointer target has "accepted" already.
pub const HIGHEST_ACCEPTED: u64 = 3;

/// The release key: signs pointers in the seeds, and in the targets' "signed payload" modes.
pub fn release_key() -> SigningKey {
    signing_key_from_seed([0x42; 32])
}

/// The cluster identity key of [`CLUSTER`]: signs heartbeats.
pub fn cluster_key() -> SigningKey {
    signing_key_from_seed([0x11; 32])
}

/// The trusted set holding only `key`'s public key.
pub fn trusting(key: &SigningKey) -> TrustedKeys {
    let mut trusted = TrustedKeys::new();
    trusted
        .insert(key.verifying_key())
        .expect("a key made from a seed is strong");
    trusted
}

/// The targets' clock.
pub fn now() -> Timestamp {
    "2026-05-01T12:00:00Z".parse().expect("a valid timestamp")
}

/// The cluster the bundle and fleet targets render for (its labels match the example fleet's selectors).
pub fn cluster() -> ClusterIdentity {
    ClusterIdentity {
        name: CLUSTER.to_owned(),
        labels: BTreeMap::from([
            ("env".to_owned(), "prod".to_owned()),
            ("region".to_owned(), "eu".to_owned()),
            (
                "topology.kubernetes.io/zone".to_owned(),
                "eu-west-1a".to_owned(),
            ),
        ]),
    }
}

/// Splits an input into its mode byte (taken modulo `modes`) and the rest; `None` for an empty input.
pub fn mode(data: &[u8], modes: u8) -> Option<(u8, &[u8])> {
    let (first, rest) = data.split_first()?;
    Some((first % modes, rest))
}
