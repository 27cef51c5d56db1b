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
    /// A Kubernetes API call failed; the message is the API server's own (its status message and code).
    #[error("{action}: {}", crate::kube::cluster::api_message(.source))]
    Api {
        action: String,
        #[source]
        source: kube::Error,
    },
    /// The API server answered a call without what the agent asked for.
    #[error("{action}: {detail}")]
    Answer { action: String, detail: String },
    /// A reply or an object is not the JSON it should be.
    #[error("{object}: not {expected}: {source}")]
    Json {
        object: String,
        expected: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// Pruning an object is under way but not finished (finalizers, graceful termination): it stays in the
    /// inventory and is checked again.
    #[error("pruning {object}: deletion pending on {waiting}")]
    PrunePending { object: String, waiting: String },
    /// The operator's allowlist refuses the object. The message is the reason alone: whoever reports it names
    /// the object beside it (the status, `diff`).
    #[error("{reason}")]
    NotAllowed { object: String, reason: String },
    /// A cluster-scoped object names a namespace.
    #[error(
        "{kind} is cluster-scoped but names namespace {namespace:?}; remove metadata.namespace"
    )]
    NamespaceOnClusterScoped {
        object: String,
        kind: String,
        namespace: String,
    },
    /// The API server's version (for prevention) does not read as a Kubernetes version.
    #[error("cannot read the Kubernetes version {version}")]
    KubeVersion { version: String },
    /// Prevention is on, but this cluster is too old for ValidatingAdmissionPolicy v1: drift is still
    /// detected and healed.
    #[error(
        "prevent is on, but Kubernetes {version} has no ValidatingAdmissionPolicy v1 (needs 1.{min_minor} or newer): drift is detected and healed, not prevented"
    )]
    PreventUnsupported { version: String, min_minor: u32 },
    /// Prevention is not in force on this cluster, for the reason found when the agent first asked (kept, and
    /// reported after every sync).
    #[error(transparent)]
    PreventionRefused(std::sync::Arc<Error>),
    /// A field Windvane stops sending is addressed by list position in managedFields: no apply can hand it
    /// over to another manager.
    #[error("{pointer} is addressed by list position ({token}); it cannot be handed over")]
    FieldPath { pointer: String, token: String },
    /// An operator's `windvane.io/hold-until` annotation is not a time (it holds nothing).
    #[error("annotation {annotation}={value:?} is not an RFC 3339 time: {source}")]
    HoldAnnotation {
        annotation: &'static str,
        value: String,
        #[source]
        source: jiff::Error,
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
            Error::Kube { .. } | Error::Api { .. } | Error::Answer { .. } => "kube",
            Error::Json { .. } => "decode",
            Error::PrunePending { .. } => "prune",
            Error::NotAllowed { .. } => "refused",
            Error::NamespaceOnClusterScoped { .. } => "apply",
            Error::KubeVersion { .. } | Error::PreventUnsupported { .. } => "prevent",
            Error::FieldPath { .. } => "apply",
            Error::PreventionRefused(inner) => inner.reason(),
            Error::HoldAnnotation { .. } => "hold",
            Error::Lease { .. } => "lease",
            Error::Admin { .. } => "admin",
        }
    }
}
