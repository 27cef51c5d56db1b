//! The one error type of the source-server library: each variant is a step that failed, naming the file,
//! URL or channel it failed on.

use std::path::PathBuf;

/// Result alias for the source-server library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the source-server library.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file or directory of the store could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Another publisher holds the store's lock.
    #[error("{}: another publish to this store is running; try again when it has finished", path.display())]
    Locked { path: PathBuf },
    /// A channel name that cannot be a file name in the store.
    #[error(
        "invalid channel name {0:?}: use 1-63 characters a-z, 0-9, '-', '_' or '.', starting with a letter or digit"
    )]
    InvalidChannel(String),
    /// The channel's current pointer cannot be verified with the given keys, so publishing over it is refused.
    #[error("current pointer {}: {source}; refusing to publish over it (if the release key was rotated, add the old public key with --trusted-key)", path.display())]
    CurrentPointerUnverifiable {
        path: PathBuf,
        #[source]
        source: windvane_shared::Error,
    },
    /// The channel already carries another fleet's releases.
    #[error(
        "channel {channel:?} in this store belongs to fleet {current:?}; the bundle is for fleet {offered:?}"
    )]
    OtherFleetInStore {
        channel: String,
        current: String,
        offered: String,
    },
    /// An empty release would remove everything from every cluster, so it needs to be asked for.
    #[error(
        "the bundle has no objects: publishing it would remove every object on clusters that prune; pass --allow-empty if that is what you mean"
    )]
    EmptyWithoutAllow,
    /// The store has no pointer for this channel.
    #[error("{location}: no release published on channel {channel:?}")]
    NoSuchChannel { location: String, channel: String },
    /// Fetching from a store URL failed.
    #[error("GET {url}: {detail}")]
    Http { url: String, detail: String },
    // ---- windvane-server ----
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
    /// The notifications config file could not be read or is invalid.
    #[error("notifications config {}: {detail}", path.display())]
    NotificationConfig { path: PathBuf, detail: String },
    /// The heartbeat database could not be opened or migrated.
    #[error("open database {location}: {detail}")]
    DatabaseOpen { location: String, detail: String },
    /// A database operation (naming what it did, and on which cluster) failed.
    #[error("database: {operation}: {detail}")]
    Database { operation: String, detail: String },
    /// A release, bundle or key check in the shared core failed.
    #[error(transparent)]
    Shared(#[from] windvane_shared::Error),
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
