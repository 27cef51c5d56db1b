//! Windvane's source server (`windvane-server`): [`server`] (the daemon: the static store over HTTP,
//! enrolment, heartbeats, fleet status, page, API, metrics, notifications) and [`error`]. The store's layout
//! and publishing live in `windvane-store`, shared with the `windvane` command line.

pub mod error;
pub mod server;

pub use error::{Error, Result};
