//! The Windvane agent: one per cluster, autonomous. It polls a signed release from a static store, verifies
//! it, renders this cluster's share, applies it with server-side apply and keeps it applied, reporting what it
//! does. Pure decisions live in [`plan`], [`allowlist`], [`inventory`], [`health`], [`report`], [`replica`]
//! (readiness) and [`backoff`]; I/O lives in [`source`] (HTTP), [`cluster`], [`apply`], [`watch`], [`state`]
//! and [`leader`] (Kubernetes) and [`admin`] (the admin server); [`engine`] runs the loop and [`config`]
//! resolves settings.

pub mod admin;
pub mod allowlist;
pub mod apply;
pub mod approval;
pub mod backoff;
pub mod clamp;
pub mod cluster;
pub mod compare;
pub mod config;
pub mod depends;
pub mod desired;
pub mod diff;
pub mod drift;
pub mod engine;
pub mod error;
pub mod fetcher;
pub mod handover;
pub mod heal;
pub mod heal_cli;
pub mod health;
pub mod http;
pub mod inventory;
pub mod kube_client;
pub mod leader;
pub mod metrics;
pub mod packed;
pub mod plan;
pub mod prevent;
pub mod preview;
pub mod replica;
pub mod report;
pub mod reporter;
pub mod retry;
pub mod revert_request;
pub mod run_once;
pub mod secrets;
pub mod source;
pub mod state;
pub mod watch;
pub mod wave;
pub mod windows;

pub use error::{Error, Result};
