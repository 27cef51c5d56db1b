//! The one error type of the source-server library: each variant is a step that failed, naming the file,
//! address, database operation or cluster it failed on.

use std::path::PathBuf;

/// Result alias for the source-server library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the source-server library.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server could not listen on its address.
    #[error("listen on {addr}: {source}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// A secret file (registration or read token) is missing, unreadable or empty.
    #[error("{}: {detail}", path.display())]
    TokenFile { path: PathBuf, detail: String },
    /// The admin token is the registration token, which every cluster holds, so it would let any cluster
    /// rekey or forget another.
    #[error(
        "the admin token (--admin-token-file) is the registration token, which every cluster holds: give admin actions a token of their own (e.g. `head -c 32 /dev/urandom | base64`)"
    )]
    AdminTokenIsRegistrationToken,
    /// The admin token is the read token: whoever may look at the fleet could rekey or forget clusters, and a
    /// browser that was given the read token would hold the admin token.
    #[error(
        "the admin token (--admin-token-file) is the read token (--read-token-file): give admin actions a token of their own (e.g. `head -c 32 /dev/urandom | base64`)"
    )]
    AdminTokenIsReadToken,
    /// The read token is the registration token: every cluster would read the whole fleet's view, and every
    /// browser given the read token could enrol clusters.
    #[error(
        "the read token (--read-token-file) is the registration token (--registration-token-file), which every cluster holds: give readers a token of their own (e.g. `head -c 32 /dev/urandom | base64`)"
    )]
    ReadTokenIsRegistrationToken,
    /// The notifications config file could not be read or is invalid.
    #[error("notifications config {}: {detail}", path.display())]
    NotificationConfig { path: PathBuf, detail: String },
    /// The heartbeat database could not be opened or migrated.
    #[error("open database {location}: {detail}")]
    DatabaseOpen { location: String, detail: String },
    /// A database operation (naming what it did, and on which cluster) failed.
    #[error("database: {operation}: {detail}")]
    Database { operation: String, detail: String },
    /// A label selector (a query's `selector`, a notification sink's `selector`) does not parse.
    #[error("{source}")]
    Selector {
        selector: String,
        #[source]
        source: windvane_shared::Error,
    },
    /// A `state` filter names no state the server shows.
    #[error(
        "unknown state {state:?}; use one of {}",
        crate::fleet::status::state_names()
    )]
    UnknownState { state: String },
    /// A drift query's `since` is neither an RFC 3339 time nor a duration.
    #[error("since={text:?}: use an RFC 3339 time or a duration such as 1h")]
    Since { text: String },
    /// A drift query's `limit` is not a number in range.
    #[error("limit must be a number from 1 to {max}, got {text:?}")]
    PageLimit { text: String, max: u32 },
    /// A drift query's `offset` is not a non-negative number.
    #[error("offset must be a non-negative number, got {text:?}")]
    PageOffset { text: String },
    /// A channel has no pointer in the server's store (for its rollout view).
    #[error("channel {channel} has no release in the store")]
    NoRelease { channel: String },
    /// A channel's pointer file is not a DSSE envelope with a release pointer inside.
    #[error("channel {channel}: {source}")]
    PointerEnvelope {
        channel: String,
        #[source]
        source: windvane_shared::Error,
    },
    /// A channel's pointer payload is not a release pointer.
    #[error("channel {channel}: {source}")]
    PointerPayload {
        channel: String,
        #[source]
        source: serde_json::Error,
    },
    /// The notifications config is YAML of more or fewer than one document.
    #[error("expected one YAML document, found {found}")]
    NotificationDocuments { found: usize },
    /// The notifications config does not have the config's shape.
    #[error("invalid config: {source}")]
    NotificationSchema {
        #[source]
        source: serde_json::Error,
    },
    /// A notification sink's URL is not HTTP(S).
    #[error("sink {sink}: url must be http:// or https://")]
    SinkUrl { sink: String },
    /// A PagerDuty sink without a routing key.
    #[error("sink {sink}: a pagerduty sink needs routingKey or routingKeyFile")]
    SinkRoutingKey { sink: String },
    /// A notification sink names a trigger that does not exist.
    #[error("sink {sink}: unknown trigger {trigger:?}; use {}", crate::notify::TRIGGER_NAMES.join(", "))]
    SinkTrigger { sink: String, trigger: String },
    /// A notification sink's label selector does not parse.
    #[error("sink {sink}: {source}")]
    SinkSelector {
        sink: String,
        #[source]
        source: Box<Error>,
    },
    /// Appending drift lines to the audit export file failed.
    #[error("{}: {source}", path.display())]
    AuditWrite {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The audit export endpoint could not be reached.
    #[error("{url}: {source}")]
    AuditSend {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The audit export endpoint answered with an error status.
    #[error("{url}: HTTP {status}")]
    AuditStatus {
        url: String,
        status: reqwest::StatusCode,
    },
    /// The audit export's HTTP client could not be built.
    #[error("{url}: no HTTP client")]
    AuditNoClient { url: String },
    /// The batch holding a heartbeat could not be stored (every heartbeat of the batch gets this answer).
    #[error("{0}")]
    BatchNotStored(std::sync::Arc<Error>),
    /// A command-line value is not a whole number of at least 1.
    #[error("expected a whole number of at least 1, got {text:?}")]
    NotAtLeastOne { text: String },
    /// A command-line duration is zero where it must be positive.
    #[error("must be more than zero")]
    ZeroDuration,
    /// Reading the static store (a file it serves, a token file) failed.
    #[error(transparent)]
    Store(#[from] windvane_store::Error),
    /// A release, bundle or key check in the shared core failed.
    #[error(transparent)]
    Shared(#[from] windvane_shared::Error),
}
