//! The one error type of the agent library. Each variant is the step that failed and names what it failed
//! on: the URL it fetched, the object it applied (`kind ns/name`), the Secret it persisted to.

/// Result alias for the agent library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the agent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The agent's configuration is incomplete or invalid.
    #[error("configuration: {0}")]
    Config(String),
    /// Reading the configuration file or a key file failed.
    #[error("{path}: {detail}")]
    ConfigFile { path: String, detail: String },
    /// Fetching from the source failed (network, status, size cap).
    #[error("fetching {url}: {detail}")]
    Fetch { url: String, detail: String },
    /// The source or the server asked us to come back later (429/503 with Retry-After).
    #[error("{url}: busy, retry after {retry_after:?}")]
    SourceBusy {
        url: String,
        retry_after: std::time::Duration,
    },
    /// The source server refused an enrolment or a heartbeat with a 4xx (401/404: it no longer knows this
    /// cluster's key, so the agent enrols again; 409: the name is bound to another key).
    #[error("{url}: refused with HTTP {status}: {detail}")]
    ServerRefused {
        url: String,
        status: u16,
        detail: String,
    },
    /// The release, bundle or rendering was refused by the shared core (the reason is in the inner error).
    #[error(transparent)]
    Release(#[from] windvane_shared::Error),
    /// Discovering the API resource of a kind failed.
    #[error("discovering {api_version} {kind}: {detail}")]
    Discovery {
        api_version: String,
        kind: String,
        detail: String,
    },
    /// The kind's group version cannot be discovered now (its server fails or does not answer); only objects of
    /// that group wait for it.
    #[error("API group {api_version} is unavailable, so {kind} objects wait for it: {detail}")]
    GroupUnavailable {
        api_version: String,
        kind: String,
        detail: String,
    },
    /// Applying an object failed.
    #[error("applying {object}: {detail}")]
    Apply { object: String, detail: String },
    /// Deleting (pruning) an object failed.
    #[error("pruning {object}: {detail}")]
    Prune { object: String, detail: String },
    /// Reading or writing the agent's persisted state failed.
    #[error("persisting state in {object}: {detail}")]
    State { object: String, detail: String },
    /// The persisted state is unreadable (corrupted or written by another version).
    #[error("persisted state in {object} is unreadable: {detail}")]
    StateCorrupt { object: String, detail: String },
    /// A Kubernetes API call other than apply/prune failed.
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
    /// Leader election failed.
    #[error("leader election on Lease {lease}: {detail}")]
    Lease { lease: String, detail: String },
    /// The admin server could not start.
    #[error("admin server on {addr}: {detail}")]
    Admin { addr: String, detail: String },
}

impl Error {
    /// A short stable reason for metrics and status (`fetch`, `rollback`, `apply`, …).
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Config(_) | Error::ConfigFile { .. } => "config",
            Error::Fetch { .. } => "fetch",
            Error::SourceBusy { .. } => "busy",
            Error::ServerRefused { .. } => "refused",
            Error::Release(inner) => inner.reason(),
            Error::Discovery { .. } | Error::GroupUnavailable { .. } => "discovery",
            Error::Apply { .. } => "apply",
            Error::Prune { .. } => "prune",
            Error::State { .. } | Error::StateCorrupt { .. } => "state",
            Error::Kube { .. } => "kube",
            Error::Lease { .. } => "lease",
            Error::Admin { .. } => "admin",
        }
    }
}
