//! Windvane's source server (`windvane-server`), one folder per stage a request or a heartbeat goes through:
//!
//! - [`http`]: the server's setup, connection limits, forwarded headers, tokens and routing; hands each
//!   request to its stage.
//! - [`serve`]: the static store (pointers, bundles, approvals) with long polls, and the rollout cache.
//! - [`ingest`]: enrolments, signed heartbeats (batched signature checks, group commit) and admin actions.
//! - [`fleet`]: the fleet view computed at read time from the database: status, the page, the JSON API and
//!   `/metrics`.
//! - [`notify`]: notifications on state changes (Slack, webhooks, PagerDuty) through the outbox, the drift
//!   audit export and break-glass changes.
//! - [`db`]: the database (SQLite or PostgreSQL) every replica shares.
//!
//! [`error`] is the crate's one error type. The store's layout and publishing live in `windvane-store`,
//! shared with the `windvane` command line.

pub mod db;
pub mod error;
pub mod fleet;
pub mod http;
pub mod ingest;
pub mod notify;
pub mod serve;

pub use error::{Error, Result};
pub use http::{
    DEFAULT_INGEST_QUEUE, DEFAULT_MAX_BATCH, DEFAULT_MAX_CLOCK_SKEW, DEFAULT_MAX_HELD_PER_CLIENT,
    DEFAULT_REKEY_TTL, ServeConfig, Server,
};
