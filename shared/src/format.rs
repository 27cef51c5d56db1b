//! Layer 4: the signed release: the bundle (apps, manifests, policies) and its limits, the channel pointer and its
//! verification, and SOPS-encrypted files (opened on the agent, sealed by `windvane seal`).

pub mod bundle;
pub mod release;
pub mod sops;
