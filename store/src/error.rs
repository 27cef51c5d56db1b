//! The one error type of the store library: each variant is a step that failed, naming the file, URL or
//! channel it failed on.

use std::path::PathBuf;

/// Result alias for the store library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong reading or publishing a store.
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
    /// `windvane rollback` found no signed history entry before the current serial.
    #[error(
        "channel {channel:?} has no signed history before serial {serial} ({} is missing): rollback goes back \
         only to releases whose signed pointers the store kept; stores written before this version keep them \
         from their next publish on (publish once more, then roll back to that or later releases)",
        path.display()
    )]
    NoSignedHistory {
        channel: String,
        serial: u64,
        path: PathBuf,
    },
    /// A signed history entry that does not verify or is not the entry its name says.
    #[error("{}: {detail}; the store's signed history was altered — restore it from a backup", path.display())]
    HistoryEntry { path: PathBuf, detail: String },
    /// A pointer read from the store that is not the one the command asked about.
    #[error("{}: {detail}; refusing to sign anything on the strength of it", path.display())]
    NotWhatWasAsked { path: PathBuf, detail: String },
    /// `windvane rollback` cannot take the target it was given or would pick.
    #[error("rolling back channel {channel:?}: {detail}")]
    RollbackTarget { channel: String, detail: String },
    /// A halt or resume of a release that has no rollout.
    #[error(
        "channel {channel:?} serial {serial} has no rollout: every cluster takes it at once, there is nothing to halt or resume"
    )]
    NoRollout { channel: String, serial: u64 },
    /// A halt of a halted rollout, or a resume of a running one.
    #[error("channel {channel:?} serial {serial} is already {}", if *.halted { "halted" } else { "running (not halted)" })]
    AlreadyInState {
        channel: String,
        serial: u64,
        halted: bool,
    },
    /// `windvane approve` of a serial that is not the channel's current one.
    #[error("channel {channel:?} is at serial {current}, not {asked}: approve the current release")]
    NotCurrentSerial {
        channel: String,
        current: u64,
        asked: u64,
    },
    /// `windvane approve` with the key that signed the release: it would not count.
    #[error(
        "channel {channel:?} serial {serial} was published with this key ({keyid}); an approval needs a second person's key"
    )]
    SelfApproval {
        channel: String,
        serial: u64,
        keyid: String,
    },
    /// The approval file in the store cannot take another signature.
    #[error("{}: {detail}", path.display())]
    ApprovalFile { path: PathBuf, detail: String },
    /// A store location that is neither a directory nor an `s3://` bucket (a static host is read-only).
    #[error(
        "{location}: not a store that can be written; give a directory or s3://BUCKET[/PREFIX] (an http(s):// host is read by agents, not published to)"
    )]
    UnsupportedStore { location: String },
    /// A request to the object store failed (`detail` is its first line, with the S3 error code).
    #[error("{location}: {detail}")]
    Object { location: String, detail: String },
    /// The AWS profile in the shared configuration files cannot be used.
    #[error("AWS profile {profile:?}: {detail}")]
    AwsProfile { profile: String, detail: String },
    /// A conditional write lost: another publisher or approver changed the file after it was read.
    #[error(
        "{location}: changed by someone else after it was read (another publish, halt or approval ran at the same time); nothing of this change took effect — run the command again"
    )]
    ChangedConcurrently { location: String },
    /// The pointer read back after publishing is not there at all.
    #[error("{location}: read back after writing: the pointer is gone right after it was written")]
    PointerGoneAfterWrite { location: String },
    /// The pointer read back after publishing is another release of the same or an earlier serial: the object
    /// store let two publishers both win.
    #[error(
        "{location}: read back after writing: serial {found_serial} with bundle {found_bundle} is there instead of \
         the serial {written_serial} just written: another publisher wrote at the same time and the object store \
         did not honour the conditional write (If-Match); this release did not land — use a store that supports \
         conditional writes, then publish again"
    )]
    PointerOvertaken {
        location: String,
        found_serial: u64,
        found_bundle: String,
        written_serial: u64,
    },
    /// What was read back after publishing is not a pointer signed by a trusted key.
    #[error(
        "{location}: read back after writing: what is there is not a release pointer signed by a trusted key; \
         the store was changed by someone else right after the write"
    )]
    PointerNotTrusted { location: String },
    /// The AWS profile assumes a role, uses SSO or runs a credential process, which windvane does not do.
    #[error(
        "AWS profile {profile:?}: profile {profile:?} assumes a role, uses SSO or runs a credential process, which \
         windvane does not do; export AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (e.g. from `aws configure \
         export-credentials --format env`) or use web identity or instance credentials"
    )]
    AwsProfileUnsupported { profile: String },
    /// Fetching from a store URL failed.
    #[error("GET {url}: {detail}")]
    Http { url: String, detail: String },
    /// A release, bundle or key check in the shared core failed.
    #[error(transparent)]
    Shared(#[from] windvane_shared::Error),
}

impl Error {
    pub(crate) fn object(location: impl Into<String>, source: &object_store::Error) -> Self {
        Error::Object {
            location: location.into(),
            detail: object_error_detail(&source.to_string()),
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

/// The first line of an object store error, with the S3 error document (XML) it quotes reduced to its code
/// and message: the client nests the same text three deep.
fn object_error_detail(text: &str) -> String {
    let between = |open: &str, close: &str| {
        let start = text.find(open)? + open.len();
        let end = text[start..].find(close)? + start;
        Some(text[start..end].to_owned())
    };
    let head = text.split("<?xml").next().unwrap_or(text);
    let head = head
        .lines()
        .next()
        .unwrap_or(head)
        .trim_end_matches([':', ' ']);
    let mut detail: String = head.chars().take(400).collect();
    if let Some(code) = between("<Code>", "</Code>") {
        detail.push_str(&format!(": {code}"));
        if let Some(message) = between("<Message>", "</Message>") {
            detail.push_str(&format!(" ({message})"));
        }
    }
    detail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_s3_error_is_one_line_with_its_code() {
        let text = "Denied for path a: Error performing GET http://s3/a in 2ms - Server returned non-2xx status code: 403 Forbidden: <?xml version=\"1.0\"?>\n<Error><Code>SignatureDoesNotMatch</Code><Message>Check your key.</Message></Error>: Denied for path a: <?xml ...";
        assert_eq!(
            object_error_detail(text),
            "Denied for path a: Error performing GET http://s3/a in 2ms - Server returned non-2xx status code: 403 Forbidden: SignatureDoesNotMatch (Check your key.)"
        );
        assert_eq!(
            object_error_detail("connection refused"),
            "connection refused"
        );
    }
}
