//! The Windvane agent: one per cluster, autonomous. It polls a signed release from a static store, verifies
//! it, renders this cluster's share, applies it with server-side apply and keeps it applied, reporting what it
//! does. The folders are the stages a release goes through, in order:
//!
//! - [`fetch`]: polls the store and verifies what it gets, in a task of its own; a verified release goes to
//!   the engine through a channel.
//! - [`gates`]: what holds a verified release back on this cluster — its rollout wave, approvals, maintenance
//!   windows — and what it would change meanwhile (the preview the heartbeat carries).
//! - [`engine`]: the loop. It owns one state per stage and passes values between them: a release the gates
//!   let through is persisted, rendered and handed to [`apply`]; what was applied goes to [`heal`],
//!   [`prevent`] and [`report`].
//! - [`apply`]: the plan, the order (`dependsOn`), SOPS objects, the inventory and the prune decision, the
//!   retries of objects that failed alone, and the applies themselves.
//! - [`heal`]: drift from `managedFields`, the healer's state machine and its executor, the hand-over of
//!   fields Windvane stops sending, and the `diff` and `heal` commands that compare and revert by hand.
//! - [`prevent`]: the admission policy that refuses changes to guarded objects, decided purely and kept in
//!   the cluster.
//! - [`live`]: the watches' cache of every managed object and its health.
//! - [`kube`]: the Kubernetes plumbing: the client, discovery and apply ([`kube::cluster`]), the agent's
//!   persisted state, leader election.
//! - [`report`]: the status, the heartbeat to the server, the metrics and the admin server that serves them.
//!
//! At the top stay what every stage uses: [`config`] (flags, environment and the config file, resolved once
//! into each stage's settings), [`error`] (the one error type), [`clamp`] (every number from the network made
//! safe) and [`backoff`] (retry timing).

pub mod apply;
pub mod backoff;
pub mod clamp;
pub mod config;
pub mod engine;
pub mod error;
pub mod fetch;
pub mod gates;
pub mod heal;
pub mod kube;
pub mod live;
pub mod prevent;
pub mod report;

pub use error::{Error, Result};
