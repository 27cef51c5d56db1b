//! Fetching the release. The [`fetcher`] is a task of its own: it polls the channel pointer through the
//! [`source`] client (HTTP, [`http`] reads each body with a cap and a deadline), verifies the pointer's
//! signature and the bundle's digest, and sends what it found — nothing new, a verified release, a refusal, the
//! store unavailable — to the engine's loop over a channel, so that the loop never waits on the network. The
//! engine keeps the enforced bundle's bytes as a [`packed::PackedBundle`] (compressed once rendered).

pub mod fetcher;
pub mod http;
pub mod packed;
pub mod source;
