//! The one error type of the `shared` crate. Each variant is one step that failed, and carries what it failed
//! on (file, document, object as `kind ns/name`, key id), so that a message read in a log or a terminal says
//! what to fix. The release-verification variants double as the agent's reported refusal reasons: see
//! [`Error::reason`].

use std::path::PathBuf;

/// Result alias for the `shared` crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in Windvane's pure core.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- release verification: each is one reason to refuse a channel pointer or bundle ----
    /// The bytes are not a well-formed envelope, pointer or bundle.
    #[error("malformed {what}: {detail}")]
    Malformed { what: &'static str, detail: String },
    /// No signature was made by a trusted key.
    #[error(
        "signed by unknown key(s) {keyids:?}: trust the release key with --trusted-key, or check the channel"
    )]
    UnknownKey { keyids: Vec<String> },
    /// A key is a weak (small-order or non-canonical) Ed25519 key and is never trusted.
    #[error("weak Ed25519 key {keyid} refused{}", source_hint(.source_name))]
    WeakKey {
        keyid: String,
        source_name: Option<String>,
    },
    /// A signature by a trusted key did not verify.
    #[error("bad signature by key {keyid}")]
    BadSignature { keyid: String },
    /// The envelope's payload type is not the one expected.
    #[error("wrong payload type {found:?}, expected {expected:?}")]
    WrongPayloadType {
        expected: &'static str,
        found: String,
    },
    /// The release is for another fleet (a replay from elsewhere).
    #[error("release is for fleet {found:?}, this agent follows fleet {expected:?}")]
    OtherFleet { expected: String, found: String },
    /// The release is for another channel (a replay from elsewhere).
    #[error("release is for channel {found:?}, this agent follows channel {expected:?}")]
    OtherChannel { expected: String, found: String },
    /// The serial is lower than the highest already accepted.
    #[error("rollback: serial {offered} is below the highest accepted serial {highest}")]
    Rollback { highest: u64, offered: u64 },
    /// The same serial was seen before with another bundle digest.
    #[error(
        "equivocation: serial {serial} was accepted with bundle {accepted}, now offered with {offered}"
    )]
    Equivocation {
        serial: u64,
        accepted: String,
        offered: String,
    },
    /// The pointer's expiry has passed (freeze attack, or the publisher stopped re-signing).
    #[error("expired: the release pointer expired at {expires_at}; the publisher must re-publish")]
    Expired { expires_at: String },
    /// The pointer claims to be issued further in the future than the allowed clock skew.
    #[error(
        "issued in the future: issued_at {issued_at} is ahead of now {now} by more than the allowed skew"
    )]
    IssuedInFuture { issued_at: String, now: String },
    /// A body is larger than its cap (nothing beyond the cap is read).
    #[error("{what} exceeds the size cap of {limit} bytes")]
    SizeCap { what: &'static str, limit: u64 },
    /// The bundle's size differs from the size the signed pointer names.
    #[error("bundle size mismatch: pointer says {expected} bytes, got {found}")]
    SizeMismatch { expected: u64, found: u64 },
    /// The bundle's digest differs from the digest the signed pointer names.
    #[error("bundle digest mismatch: pointer says sha256 {expected}, got {found}")]
    DigestMismatch { expected: String, found: String },

    // ---- keys ----
    /// A key file could not be read as the expected PEM.
    #[error("{path}: not an Ed25519 {expected} key in PEM: {detail}")]
    KeyPem {
        path: String,
        expected: &'static str,
        detail: String,
    },

    // ---- SOPS-encrypted manifests (crate::format::sops); no message ever holds a decrypted value ----
    /// An age identity (`AGE-SECRET-KEY-1…`) or a recipient (`age1…`) could not be read.
    #[error("{source_name}: {detail}")]
    AgeKey { source_name: String, detail: String },
    /// A SOPS file's metadata or an encrypted value is not in the form `sops` writes, or uses a feature this
    /// reader does not support.
    #[error("{file}: SOPS: {detail}")]
    SopsFormat { file: String, detail: String },
    /// None of the identities held can unwrap the file's data key: names the recipients it was sealed to.
    #[error(
        "{file}: SOPS: no age identity for its recipients {}; this cluster holds {}",
        recipients.join(", "),
        if held.is_empty() { "none".to_owned() } else { held.join(", ") }
    )]
    SopsNoKey {
        file: String,
        recipients: Vec<String>,
        held: Vec<String>,
    },
    /// An encrypted value failed to decrypt (wrong data key, or the value or its key path was altered).
    #[error("{file}: SOPS: the value at {path} does not decrypt (altered value or key path)")]
    SopsValue { file: String, path: String },
    /// The values decrypted, but their MAC does not match the file's: the file was altered.
    #[error("{file}: SOPS: MAC mismatch: the file was altered after it was encrypted; refused")]
    SopsMac { file: String },
    /// Encrypting (sealing) a file failed.
    #[error("{file}: cannot seal: {detail}")]
    Seal { file: String, detail: String },

    // ---- fleet source tree and bundle ----
    /// Reading a file or directory failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A YAML or JSON document could not be parsed.
    #[error("{file}: {detail}")]
    Parse { file: String, detail: String },
    /// A YAML scalar that a YAML 1.1 reader (kubectl) and a YAML 1.2 reader would read differently.
    #[error(
        "{file}:{line}:{column}: {value:?} reads differently in YAML 1.1 and 1.2 ({detail}); write {suggestion}"
    )]
    AmbiguousYaml {
        file: String,
        line: usize,
        column: usize,
        value: String,
        detail: String,
        suggestion: String,
    },
    /// `fleet.yaml` has a missing or invalid field.
    #[error("{file}: field {field}: {detail}")]
    FleetConfig {
        file: String,
        field: String,
        detail: String,
    },
    /// A manifest document is not a valid Kubernetes object.
    #[error("{file} document {document}: {detail}")]
    Manifest {
        file: String,
        document: usize,
        detail: String,
    },
    /// A Windvane annotation on an object has a value it cannot take (`rule` says what it takes).
    #[error("{object}: annotation {annotation} {rule}, got {found:?}")]
    BadAnnotation {
        object: String,
        annotation: String,
        rule: &'static str,
        found: String,
    },
    /// A field of an object that must be a mapping is not.
    #[error("{object}: {field} must be a mapping")]
    NotAMapping { object: String, field: &'static str },
    /// The same object appears twice within one app.
    #[error("app {app}: {object} is defined twice: {first} and {second}")]
    DuplicateObject {
        app: String,
        object: String,
        first: String,
        second: String,
    },
    /// An `ignoreDifferences` entry has a pointer that is not RFC 6901.
    #[error(
        "app {app}: ignoreDifferences pointer {pointer:?} is not an RFC 6901 JSON pointer: {detail}"
    )]
    InvalidPointer {
        app: String,
        pointer: String,
        detail: String,
    },
    /// A fleet, app or namespace name is not a DNS label.
    #[error(
        "{name:?} is not a valid name: use at most 63 lower-case letters, digits and '-', starting and ending \
         with a letter or digit"
    )]
    InvalidName { name: String },
    /// An approval file already in the store signs another statement than the release being approved.
    #[error(
        "the approval file in the store for serial {serial} of channel {channel:?} signs something else; remove \
         it or check the store"
    )]
    ApprovalSignsOther { channel: String, serial: u64 },
    /// An app's `namespace:` is not a namespace name.
    #[error("app {app}: namespace: {detail}")]
    InvalidNamespace { app: String, detail: String },
    /// A label selector is invalid.
    #[error("invalid label selector{}: {detail}", context_hint(.context))]
    InvalidSelector { context: String, detail: String },
    /// A bundle has more objects or apps than its cap.
    #[error("bundle has {found} {what}, more than the cap of {limit}")]
    TooMany {
        what: &'static str,
        found: usize,
        limit: usize,
    },
    /// A maintenance window's field is out of bounds; `index` is its place in the app's `windows:` when known.
    #[error("{}{field} {value}: {detail}", window_index(.index))]
    InvalidWindow {
        index: Option<usize>,
        field: &'static str,
        value: String,
        detail: String,
    },
    /// A window's cron schedule cannot be read.
    #[error("schedule {schedule:?}: {detail}")]
    InvalidSchedule { schedule: String, detail: String },
    /// One field of a cron schedule (`minute`, `hour`, …) is not what cron takes.
    #[error("{field} {detail}")]
    CronField { field: &'static str, detail: String },
    /// A duration like `30s` could not be read.
    #[error("invalid duration {value:?}: {detail}")]
    InvalidDuration { value: String, detail: String },

    // ---- rendering engines (Helm, kustomize) at build time ----
    /// A rendering engine could not be run, failed, or wrote what Windvane cannot take.
    #[error("app {app}: {step}: {detail}")]
    Engine {
        app: String,
        step: String,
        detail: String,
    },
    /// A bundle's engine-rendered app has no variant for the customizations a cluster matches (the bundle was
    /// not written by `windvane build`).
    #[error(
        "app {app}: the bundle holds no rendering for customizations {customizations:?}; rebuild it with windvane build"
    )]
    NoVariant {
        app: String,
        customizations: Vec<usize>,
    },

    // ---- rendering ----
    /// A `${...}` names a variable that is not defined for this cluster.
    #[error(
        "app {app}, {file} document {document} ({object}) at {pointer}: undefined variable ${{{variable}}}"
    )]
    UndefinedVariable {
        app: String,
        file: String,
        document: usize,
        object: String,
        pointer: String,
        variable: String,
    },
    /// At build time: a `${values.…}` that neither the app's values nor any customization defines.
    #[error(
        "app {app}, {file} document {document} ({object}) at {pointer}: ${{{variable}}} is defined neither in \
         the app's values nor in any customization, so it would fail to render on every cluster; define it \
         under the app's values: in fleet.yaml (or write $${{ for a literal ${{)"
    )]
    NeverDefined {
        app: String,
        file: String,
        document: usize,
        object: String,
        pointer: String,
        variable: String,
    },
    /// A `${` that looks like a variable of ours is never closed.
    #[error("unterminated ${{ in {text:?}; close it with }} or write $${{ for a literal ${{")]
    UnterminatedVariable { text: String },
    /// `${cluster.…}` that is neither `cluster.name` nor `cluster.labels.KEY`; `meant` is the variable it is
    /// closest to.
    #[error(
        "unknown variable ${{{expression}}}: {}the variables are ${{cluster.name}}, ${{cluster.labels.KEY}} and \
         ${{values.NAME}}; write $${{ for a literal ${{",
        did_you_mean(.meant)
    )]
    UnknownVariable {
        expression: String,
        meant: Option<String>,
    },
    /// `${cluster.labels}` or `${cluster.labels.}`: no label key.
    #[error("${{{expression}}} names no label; write ${{cluster.labels.KEY}}")]
    NoLabelKey { expression: String },
    /// A label key in `${cluster.labels.KEY}` with a character a label key cannot have.
    #[error(
        "${{{expression}}}: a label key has letters, digits, '.', '_', '-' and '/' only, not {found:?}"
    )]
    BadLabelKeyChar { expression: String, found: char },
    /// `${values.a..b}`: an empty name between dots.
    #[error("${{{expression}}} has an empty name between dots")]
    EmptyValuesName { expression: String },
    /// A name in `${values.…}` with a character a name cannot have.
    #[error(
        "${{{expression}}}: a name in ${{values.…}} has letters, digits, '_' and '-' only, not {found:?}; write \
         $${{ for a literal ${{"
    )]
    BadValuesNameChar { expression: String, found: char },
    /// `${values.PATH}` names no value, but a defined one is close to it (`meant`).
    #[error("${{values.{path}}} is not defined; did you mean ${{{meant}}}?")]
    UndefinedValue { path: String, meant: String },
    /// A `${...}` expression is malformed or its value cannot stand where it is used.
    #[error("app {app}, {file} document {document} ({object}) at {pointer}: {detail}")]
    Template {
        app: String,
        file: String,
        document: usize,
        object: String,
        pointer: String,
        detail: String,
    },
}

fn source_hint(source_name: &Option<String>) -> String {
    source_name
        .as_ref()
        .map(|s| format!(" ({s})"))
        .unwrap_or_default()
}

fn window_index(index: &Option<usize>) -> String {
    index.map(|i| format!("windows[{i}].")).unwrap_or_default()
}

fn did_you_mean(meant: &Option<String>) -> String {
    meant
        .as_ref()
        .map(|meant| format!("did you mean ${{{meant}}}? "))
        .unwrap_or_default()
}

fn context_hint(context: &str) -> String {
    if context.is_empty() {
        String::new()
    } else {
        format!(" in {context}")
    }
}

impl Error {
    /// A short, stable, machine-readable reason: what the agent reports and counts in metrics when it refuses
    /// a release (`rollback`, `expired`, …), and a coarse class for everything else.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Malformed { .. } => "malformed",
            Error::UnknownKey { .. } => "unknown_key",
            Error::WeakKey { .. } => "weak_key",
            Error::BadSignature { .. } => "bad_signature",
            Error::WrongPayloadType { .. } => "wrong_payload_type",
            Error::OtherFleet { .. } => "other_fleet",
            Error::OtherChannel { .. } => "other_channel",
            Error::Rollback { .. } => "rollback",
            Error::Equivocation { .. } => "equivocation",
            Error::Expired { .. } => "expired",
            Error::IssuedInFuture { .. } => "issued_in_future",
            Error::SizeCap { .. } => "size_cap",
            Error::SizeMismatch { .. } => "size_mismatch",
            Error::DigestMismatch { .. } => "digest_mismatch",
            Error::KeyPem { .. } => "key",
            Error::AgeKey { .. } => "age_key",
            Error::SopsFormat { .. } | Error::Seal { .. } => "sops_format",
            Error::SopsNoKey { .. } => "sops_no_key",
            Error::SopsValue { .. } | Error::SopsMac { .. } => "sops_mac",
            Error::Io { .. } => "io",
            Error::Parse { .. } | Error::AmbiguousYaml { .. } => "parse",
            Error::FleetConfig { .. }
            | Error::Manifest { .. }
            | Error::DuplicateObject { .. }
            | Error::BadAnnotation { .. }
            | Error::NotAMapping { .. }
            | Error::InvalidPointer { .. }
            | Error::InvalidNamespace { .. }
            | Error::InvalidName { .. }
            | Error::ApprovalSignsOther { .. }
            | Error::InvalidSelector { .. }
            | Error::TooMany { .. }
            | Error::InvalidDuration { .. }
            | Error::InvalidWindow { .. }
            | Error::InvalidSchedule { .. }
            | Error::CronField { .. }
            | Error::NoVariant { .. } => "invalid",
            Error::Engine { .. } => "engine",
            Error::UndefinedVariable { .. }
            | Error::NeverDefined { .. }
            | Error::Template { .. }
            | Error::UnterminatedVariable { .. }
            | Error::UnknownVariable { .. }
            | Error::NoLabelKey { .. }
            | Error::BadLabelKeyChar { .. }
            | Error::EmptyValuesName { .. }
            | Error::BadValuesNameChar { .. }
            | Error::UndefinedValue { .. } => "render",
        }
    }

    /// A failed read of `path`: what the publisher's fleet-tree reader reports for a file or directory.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
