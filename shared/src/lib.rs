//! Windvane's pure core: the formats and decisions that the agent, the source server and the `windvane`
//! command line share. Nothing here talks to the network or to Kubernetes; the only I/O is reading a fleet
//! source tree from disk ([`source`]). Everything else is a function over bytes and data, tested with plain
//! `#[test]`s.
//!
//! Data flow: a release engineer's fleet tree ([`source`], via [`yaml`]) becomes a [`bundle::Bundle`], which
//! is published with a signed [`release::ReleasePointer`] in a [`dsse::Envelope`] (keys in [`keys`]). An agent
//! verifies the pointer and the bundle ([`release`]), picks the apps whose [`selector`] matches its cluster and
//! renders them ([`render`]). The source server's fleet API is typed in [`fleet_api`], shared with `windvane status`.

pub mod approval;
pub mod bundle;
pub mod desired;
pub mod digest;
pub mod dsse;
pub mod duration;
pub mod error;
pub mod fleet_api;
pub mod heartbeat;
pub mod keys;
pub mod prerender;
pub mod release;
pub mod render;
pub mod rollout;
pub mod selector;
pub mod sops;
pub mod source;
pub mod status;
pub mod variables;
pub mod window;
pub mod yaml;
pub mod yaml_out;

pub use error::{Error, Result};
