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
    /// Reading the static store (a file it serves, a token file) failed.
    #[error(transparent)]
    Store(#[from] windvane_store::Error),
    /// A release, bundle or key check in the shared core failed.
    #[error(transparent)]
    Shared(#[from] windvane_shared::Error),
}
