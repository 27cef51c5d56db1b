//! Layer 3: hashes (SHA-256 hex), Ed25519 keys and key ids, and DSSE envelopes (what signs a release, an approval
//! and a heartbeat).

pub mod digest;
pub mod dsse;
pub mod keys;
