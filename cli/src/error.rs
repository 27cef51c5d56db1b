//! The one error type of the `windvane` command line. Each variant is one step that failed and carries what it
//! failed on (file, channel, store, cluster, serial, URL) and, where there is one, the error underneath. The
//! message of a variant says the step; where the error underneath already names the object (the shared
//! core's and the store's errors name their file or channel), the step is not followed by the object again.
//! `main` prints the whole chain on one line through [`report`].

use std::path::PathBuf;
use std::process::ExitStatus;

/// Result alias for the command line.
pub type Result<T, E = Error> = std::result::Result<T, E>;

type Shared = windvane_shared::Error;
type Store = windvane_store::Error;

/// Everything that can go wrong in a `windvane` command.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // ---- files named on the command line ----
    #[error("reading {}", path.display())]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {}", path.display())]
    WriteFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("creating {}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {what} to standard output")]
    Stdout {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: empty token", path.display())]
    EmptyToken { path: PathBuf },
    #[error("the signing key (--key)")]
    SigningKey {
        path: PathBuf,
        #[source]
        source: Shared,
    },
    #[error("a trusted key (--trusted-key)")]
    TrustedKey {
        path: PathBuf,
        #[source]
        source: Shared,
    },
    #[error("no --trusted-key given: name the release public key(s) that may sign this channel")]
    NoTrustedKey,
    #[error("trusting the signing key's own public key")]
    OwnKey {
        #[source]
        source: Shared,
    },
    #[error("the age identities (--age-key-file)")]
    AgeIdentities {
        path: PathBuf,
        #[source]
        source: Shared,
    },
    #[error("{}: no age identity in it", path.display())]
    NoAgeIdentity { path: PathBuf },

    // ---- key generation ----
    #[error("{} already exists; keygen never overwrites a key (choose another --out)", path.display())]
    KeyExists { path: PathBuf },
    #[error("reading the OS random source")]
    Random {
        #[source]
        source: getrandom::Error,
    },
    #[error("creating {} (an existing file is never overwritten)", path.display())]
    CreateKeyFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    // ---- fleet trees and bundles ----
    #[error("fleet tree {}", path.display())]
    FleetTreePath {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("creating a scratch directory for helm")]
    Scratch {
        #[source]
        source: std::io::Error,
    },
    #[error("reading the fleet tree {}", tree.display())]
    LoadTree {
        tree: PathBuf,
        #[source]
        source: Shared,
    },
    #[error("reading SOURCE as a built bundle (it is not a directory)")]
    ReadBundleFile {
        path: PathBuf,
        #[source]
        source: Store,
    },
    #[error("{}: not a fleet tree (no directory) nor a bundle", path.display())]
    NotTreeNorBundle {
        path: PathBuf,
        #[source]
        source: Shared,
    },
    #[error("writing the bundle")]
    WriteBundle {
        path: PathBuf,
        #[source]
        source: Store,
    },
    #[error("reading the current directory")]
    CurrentDir {
        #[source]
        source: std::io::Error,
    },

    // ---- stores: publishing, reading, verifying ----
    #[error("publishing on channel {channel:?} in {store}")]
    Publish {
        channel: String,
        store: String,
        #[source]
        source: Store,
    },
    #[error("--root and --channel are required to read a published release")]
    NeedRootAndChannel,
    #[error("--root {root:?}")]
    StoreLocation {
        root: String,
        #[source]
        source: Store,
    },
    #[error("reading the channel pointer")]
    ReadPointer {
        location: String,
        channel: String,
        #[source]
        source: Store,
    },
    #[error("refusing {location} channel {channel}")]
    RefusePointer {
        location: String,
        channel: String,
        #[source]
        source: Shared,
    },
    #[error("reading the bundle of {location} channel {channel}")]
    ReadChannelBundle {
        location: String,
        channel: String,
        #[source]
        source: Store,
    },
    #[error("refusing the bundle of {location} channel {channel}")]
    RefuseBundle {
        location: String,
        channel: String,
        #[source]
        source: Shared,
    },
    #[error("reading {} from the store", path.display())]
    ReadStoredBundle {
        path: PathBuf,
        #[source]
        source: Store,
    },
    #[error("{}: not in the store", path.display())]
    BundleNotInStore { path: PathBuf },
    #[error("{}: the file does not have its digest", path.display())]
    BundleDigest { path: PathBuf },
    #[error("{}", path.display())]
    BundleParse {
        path: PathBuf,
        #[source]
        source: Shared,
    },
    #[error(
        "{}: the bundle does not serialize back to the same bytes, so it cannot be signed again with the same \
         digest",
        path.display()
    )]
    BundleNotCanonical { path: PathBuf },
    #[error("{}: the bundle is fleet {found:?}'s, not {fleet:?}'s; refusing to sign it", path.display())]
    BundleOtherFleet {
        path: PathBuf,
        found: String,
        fleet: String,
    },

    // ---- render ----
    #[error("app {app}")]
    Unseal {
        app: String,
        #[source]
        source: Shared,
    },
    #[error("rendering for cluster {cluster}")]
    RenderCluster {
        cluster: String,
        #[source]
        source: Shared,
    },

    // ---- rollout control, rollback, promotion, approval ----
    #[error("channel {channel:?} in {store}")]
    SetHalted {
        channel: String,
        store: String,
        #[source]
        source: Store,
    },
    #[error("approving channel {channel:?} serial {serial}")]
    Approve {
        channel: String,
        serial: u64,
        #[source]
        source: Store,
    },
    #[error("reading the signed history of channel {channel:?}")]
    History {
        channel: String,
        #[source]
        source: Store,
    },
    #[error("choosing the release to go back to")]
    RollbackTarget {
        channel: String,
        #[source]
        source: Store,
    },
    #[error(
        "not promoting serial {serial} of {from}: not every {selector} cluster is Synced on it: {why}"
    )]
    NotSynced {
        serial: u64,
        from: String,
        selector: String,
        why: String,
    },

    // ---- the source server ----
    #[error("starting the async runtime")]
    Runtime {
        #[source]
        source: std::io::Error,
    },
    #[error("build the HTTP client")]
    HttpClient {
        #[source]
        source: reqwest::Error,
    },
    #[error("{request}")]
    Request {
        request: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{request}: {status}: {message}")]
    Refused {
        request: String,
        status: reqwest::StatusCode,
        message: String,
    },
    #[error("{request}: the reply is larger than {} MiB; refused", cap >> 20)]
    ReplyTooLarge { request: String, cap: usize },
    #[error("{request}: not the expected JSON")]
    UnexpectedJson {
        request: String,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "GET {url}: the body is not the fleet JSON of /api/v1/fleet (is the URL a Windvane source server of \
         this version?)"
    )]
    NotFleetJson {
        url: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("reading the channel's signed history at {path}")]
    ReadHistory {
        path: String,
        #[source]
        source: Store,
    },
    #[error(
        "{given:?} is not a cluster state; the states are Failed, Degraded, Contested, OutOfSync, Unknown, \
         Held, Progressing, Synced, NeverSeen"
    )]
    UnknownState { given: String },
    #[error(
        "the selection has {count} clusters, more than the {max} that `get apps` reads one by one; narrow it \
         with --selector or --cluster"
    )]
    TooManyClusters { count: usize, max: usize },
    #[error("cannot wait: {why}")]
    WaitImpossible { why: String },
    #[error("printing {what} as JSON")]
    PrintJson {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },

    // ---- seal ----
    #[error("{file}: no document to seal")]
    NothingToSeal { file: String },
    #[error("reading the manifest to seal")]
    ReadManifest {
        file: String,
        #[source]
        source: Shared,
    },
    #[error("{file}: document {document}")]
    SealDocument {
        file: String,
        document: usize,
        #[source]
        source: Box<Error>,
    },
    #[error(
        "names namespace {own:?}, not --namespace {given:?}: a sealed value is bound to one namespace"
    )]
    NamespaceMismatch { own: String, given: String },
    #[error(
        "--namespace {given:?} is not a namespace name (a DNS label: up to 63 of a-z, 0-9 and -)"
    )]
    BadNamespace { given: String },
    #[error("has no metadata")]
    NoMetadata,
    #[error(
        "names no namespace: set metadata.namespace or pass --namespace NS (a sealed value is bound to its \
         namespace, so that a copy of the file in another app cannot land in that app's namespace)"
    )]
    NoNamespace,
    #[error(
        "seal needs at least one --recipient, --to-cluster NAME with --server, or --to NAME with --recipients FILE"
    )]
    NoRecipients,
    #[error("an age recipient")]
    Recipient {
        recipient: String,
        #[source]
        source: Shared,
    },
    #[error("encrypting the documents")]
    Seal {
        file: String,
        #[source]
        source: Shared,
    },
    #[error("reading the recipients file")]
    RecipientsFile {
        file: String,
        #[source]
        source: Shared,
    },
    #[error("{file}: {section} must be a mapping of names to age recipients")]
    RecipientsNotMapping { file: String, section: &'static str },
    #[error("{file}: {section}.{name} must be an age recipient (age1…)")]
    RecipientNotText {
        file: String,
        section: &'static str,
        name: String,
    },
    #[error("{file}: {name} is both a cluster and a group")]
    RecipientTwice { file: String, name: String },
    #[error("{file}: no cluster or group {name:?} (known: {known})")]
    UnknownRecipient {
        file: String,
        name: String,
        known: String,
    },
    #[error("cluster {cluster:?} at {server}")]
    EnrolledCluster {
        cluster: String,
        server: String,
        #[source]
        source: Box<Error>,
    },
    #[error("{url}: no age recipient for cluster {cluster:?} (a server older than this windvane?)")]
    NoAgeRecipient { url: String, cluster: String },
    #[error(
        "{url}: the age recipient shown for cluster {cluster:?} ({recipient}) is not that of the key it says the \
         cluster enrolled ({keyid}): not sealing to it"
    )]
    RecipientNotOfKey {
        url: String,
        cluster: String,
        recipient: String,
        keyid: String,
    },
    #[error(
        "{url}: cluster {cluster:?} is enrolled with key {keyid} at the server, not the pinned {pin}: not sealing \
         to it (re-keyed? compare with the key id its agent logs)"
    )]
    KeyNotPinned {
        url: String,
        cluster: String,
        keyid: String,
        pin: String,
    },
    #[error(
        "--to-cluster {given:?}: expected CLUSTER=KEYID, the key id (at least 16 hex digits) the cluster's agent \
         logs at start"
    )]
    BadClusterPin { given: String },

    // ---- the build-time engines (helm, kustomize) ----
    #[error("{flag} {}: no such file; name the {name} binary to use", path.display())]
    EngineMissing {
        name: &'static str,
        flag: &'static str,
        path: PathBuf,
    },
    #[error(
        "{name} is needed and was not found on PATH; install it, pass {flag} PATH (or set {env}), or build it \
         from source with tests/tools/build.sh (it writes target/tools/{name})"
    )]
    EngineNotOnPath {
        name: &'static str,
        flag: &'static str,
        env: &'static str,
    },
    #[error("helm pull wrote {count} chart archives, expected one")]
    ChartArchives { count: usize },
    /// `helm pull` of an `oci://` chart printed no `Digest: sha256:…` line, so its pin cannot be checked.
    #[error("helm pull printed no manifest digest (no \"Digest: sha256:…\" line) for {reference}")]
    NoManifestDigest { reference: String },
    #[error("running {}", program.display())]
    EngineSpawn {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{command} did not finish within {timeout:?}; raise --engine-timeout if it needs longer"
    )]
    EngineTimeout {
        command: String,
        timeout: std::time::Duration,
    },
    #[error("waiting for {command}")]
    EngineWait {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("reading what {command} printed")]
    EngineOutput {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} failed ({status}): {stderr}")]
    EngineFailed {
        command: String,
        status: ExitStatus,
        stderr: String,
    },
    #[error("{command} printed more than {} MiB", cap >> 20)]
    EngineOutputTooLarge { command: String, cap: u64 },
    #[error("{command} printed what is not UTF-8")]
    EngineNotUtf8 {
        command: String,
        #[source]
        source: std::string::FromUtf8Error,
    },
    #[error("{}: more than {max} files", dir.display())]
    TooManyFiles { dir: PathBuf, max: usize },
    #[error("{}: more than {max} kustomizations", dir.display())]
    TooManyKustomizations { dir: PathBuf, max: usize },
    #[error(
        "{} is a symbolic link to {}, outside the fleet tree; the engines read only the fleet tree",
        path.display(),
        target.display()
    )]
    LinkOutside { path: PathBuf, target: PathBuf },
    #[error("{} (a link that does not resolve inside the fleet tree is refused)", path.display())]
    LinkUnresolved {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{}: {entry:?} is a remote resource; windvane builds only from the fleet tree — vendor it into the tree, \
         or pass --kustomize-remote and pin it to a commit (?ref=<40 hex digits>)",
        file.display()
    )]
    RemoteResource { file: PathBuf, entry: String },
    #[error(
        "{}: remote resource {entry:?} is not pinned to a commit; add ?ref=<40 hex digits>",
        file.display()
    )]
    RemoteNotPinned { file: PathBuf, entry: String },
    #[error("reading a kustomization")]
    ReadKustomization {
        file: PathBuf,
        #[source]
        source: Store,
    },
    #[error("{}: not UTF-8", file.display())]
    KustomizationNotUtf8 {
        file: PathBuf,
        #[source]
        source: std::string::FromUtf8Error,
    },
    #[error("reading a kustomization")]
    ParseKustomization {
        file: PathBuf,
        #[source]
        source: Shared,
    },
}

/// The exit status of every `windvane` command, one rule (in `windvane --help` and the README): 0 when the
/// command did what it was asked and any check it makes passed; 1 when a check it makes answered no — not
/// every selected cluster Synced (`status`), a rollout not complete (`rollout status`), a condition not met
/// before the timeout (`wait`), a release or history entry that does not verify (`verify`, `render --root`,
/// `history`), `promote --require-synced` not met; 2 for a usage error (clap's own) or any other failure
/// (unreadable files, a server that refuses or cannot be reached, a bad store).
pub mod exit {
    /// Done, and every check passed.
    pub const OK: u8 = 0;
    /// A check answered no.
    pub const NOT_MET: u8 = 1;
    /// A usage error or a failure: the command could not decide.
    pub const ERROR: u8 = 2;
}

impl Error {
    /// This failure's exit status ([`exit`]): [`exit::NOT_MET`] for the refusals that are a check's answer,
    /// [`exit::ERROR`] for everything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::RefusePointer { .. } | Error::RefuseBundle { .. } | Error::NotSynced { .. } => {
                exit::NOT_MET
            }
            _ => exit::ERROR,
        }
    }
}

/// An error and every error under it on one line, `step: cause: cause…`. A cause whose text the line already
/// holds is left out: the shared core's and the store's messages quote their own cause.
pub fn report(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        let text = next.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = next.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_check_s_no_exits_1_every_other_failure_2() {
        let refused = Error::RefusePointer {
            location: "store".to_owned(),
            channel: "prod".to_owned(),
            source: windvane_shared::Error::Malformed {
                what: "release pointer",
                detail: "x".to_owned(),
            },
        };
        assert_eq!(refused.exit_code(), exit::NOT_MET);
        let not_synced = Error::NotSynced {
            serial: 3,
            from: "staging".to_owned(),
            selector: "env=staging".to_owned(),
            why: "eu is Degraded".to_owned(),
        };
        assert_eq!(not_synced.exit_code(), exit::NOT_MET);
        let unreadable = Error::ReadPointer {
            location: "store".to_owned(),
            channel: "prod".to_owned(),
            source: windvane_store::Error::NoSuchChannel {
                location: "store".to_owned(),
                channel: "prod".to_owned(),
            },
        };
        assert_eq!(unreadable.exit_code(), exit::ERROR);
        assert_eq!(Error::NoTrustedKey.exit_code(), exit::ERROR);
    }

    #[test]
    fn a_report_names_the_step_then_each_cause_once() {
        let io = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let error = Error::ReadBundleFile {
            path: "b.json".into(),
            source: windvane_store::Error::Io {
                path: "b.json".into(),
                source: io(),
            },
        };
        // The store's message quotes the I/O error already: it is not repeated.
        assert_eq!(
            report(&error),
            format!(
                "reading SOURCE as a built bundle (it is not a directory): b.json: {}",
                io()
            )
        );
        let error = Error::SealDocument {
            file: "s.yaml".to_owned(),
            document: 2,
            source: Box::new(Error::NoMetadata),
        };
        assert_eq!(report(&error), "s.yaml: document 2: has no metadata");
    }
}
