//! Windvane's pure core: the formats and decisions that the agent, the source server, the `windvane` command
//! line and the publisher crate share. Nothing here does I/O (no files, network or Kubernetes) or reads the
//! clock: every function is over bytes and data, and those that judge time take the instant they judge.
//!
//! The modules are grouped in layers; a module uses only modules of lower layers (or of its own folder,
//! without a cycle), which `tests/layers.rs` enforces from the table [`LAYERS`]:
//!
//! | rank | folder     | modules                                  | job                                          |
//! |------|------------|------------------------------------------|----------------------------------------------|
//! | 0    | `error`    | [`error`]                                | the crate's one error enum                   |
//! | 1    | [`text`]   | duration, yaml, yaml_out                 | text codecs                                  |
//! | 2    | [`wire`]   | status, heartbeat, fleet_api             | what agents, server and CLI exchange         |
//! | 2    | [`spec`]   | selector, rollout, window                | what a fleet declares (carried in a bundle)  |
//! | 3    | [`crypto`] | digest, keys, dsse                       | hashes, Ed25519 keys, signed envelopes       |
//! | 4    | [`format`] | bundle, release, sops                    | the signed release, its bundle, SOPS files   |
//! | 5    | [`decide`] | rollout, approval, variables, render, desired | the decisions over a verified release   |
//!
//! Data flow: the publisher crate (`windvane_publisher`) reads a fleet tree into a [`format::bundle::Bundle`],
//! published with a signed [`format::release::ReleasePointer`] in a [`crypto::dsse::Envelope`] (keys in
//! [`crypto::keys`]). An agent verifies the pointer and the bundle ([`format::release`]), decides whether its
//! wave may take it ([`decide::rollout`], [`decide::approval`], [`spec::window`]), picks the apps whose
//! [`spec::selector`] matches its cluster and renders them ([`decide::render`], [`decide::desired`]). Its
//! [`wire::heartbeat`] goes to the source server, whose fleet API is typed in [`wire::fleet_api`], shared with
//! `windvane status`.

pub mod error;

pub mod crypto;
pub mod decide;
pub mod format;
pub mod spec;
pub mod text;
pub mod wire;

pub use error::{Error, Result};

/// The layer table: each folder of the crate (and the root `error` module) with its rank. A module may use a
/// module of a lower rank, or of its own folder; `tests/layers.rs` fails the build on any other import, on a
/// module missing from this table, and on an import cycle.
pub const LAYERS: &[(&str, u8)] = &[
    ("error", 0),
    ("text", 1),
    ("wire", 2),
    ("spec", 2),
    ("crypto", 3),
    ("format", 4),
    ("decide", 5),
];
