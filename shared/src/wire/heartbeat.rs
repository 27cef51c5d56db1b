//! The heartbeat and enrolment wire formats between an agent and the source server. An agent builds a
//! [`Heartbeat`] from its status, signs it as a DSSE envelope with its cluster identity key
//! ([`HEARTBEAT_PAYLOAD_TYPE`]) and POSTs it; the server verifies it against the key bound at enrolment
//! ([`EnrollRequest`]), checks sequence and clock skew, stores it and answers a [`HeartbeatReply`].

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::wire::status::SyncState;

/// DSSE payload type of a signed heartbeat.
pub const HEARTBEAT_PAYLOAD_TYPE: &str = "application/vnd.windvane.heartbeat.v1+json";
/// Largest heartbeat body (the envelope) a server reads.
pub const MAX_HEARTBEAT_BYTES: u64 = 256 * 1024;
/// Most drift records one heartbeat carries; the rest wait for the next.
pub const MAX_DRIFT_RECORDS_PER_HEARTBEAT: usize = 200;
/// Most per-object problems one heartbeat lists.
pub const MAX_PROBLEMS_PER_HEARTBEAT: usize = 100;

/// `POST /api/v1/clusters/{name}/enroll` body: binds the cluster's public key on first contact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnrollRequest {
    /// The fleet registration token (a secret: never logged).
    pub token: String,
    pub fleet: String,
    /// The cluster's Ed25519 identity public key, SPKI PEM.
    pub public_key: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// What enrolling decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EnrollOutcome {
    /// First enrolment: the key is bound.
    Enrolled,
    /// Same key again (an agent restarting): nothing changes but the labels.
    AlreadyEnrolled,
    /// An admin allowed a new key and this is it: bound, sequence reset.
    Rekeyed,
    /// Another key is bound and no admin allowed a change.
    KeyConflict,
    /// The cluster is enrolled in another fleet.
    FleetConflict,
}

/// The server's answer to an enrolment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnrollReply {
    pub cluster: String,
    pub keyid: String,
    pub outcome: EnrollOutcome,
    /// The last heartbeat sequence stored for this cluster: an agent that lost its counter continues above it.
    pub last_sequence: u64,
}

/// What an agent says about its cluster, signed with the cluster's identity key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Heartbeat {
    pub cluster: String,
    pub fleet: String,
    /// Strictly increasing per cluster: the server refuses a sequence at or below the last it stored.
    pub sequence: u64,
    pub sent_at: Timestamp,
    /// The agent's heartbeat interval: the server's grace period before Unknown is a multiple of it.
    pub interval_seconds: u64,
    pub agent_version: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The cluster's overall state (worst of its apps, or Failed when it refuses the source).
    pub state: SyncState,
    pub source: SourceReport,
    #[serde(default)]
    pub counts: BTreeMap<SyncState, u64>,
    #[serde(default)]
    pub apps: Vec<AppReport>,
    /// Objects that are not Synced, worst first, at most [`MAX_PROBLEMS_PER_HEARTBEAT`].
    #[serde(default)]
    pub problems: Vec<ObjectReport>,
    /// Drift seen since the last heartbeat the server acknowledged.
    #[serde(default)]
    pub drift: Vec<DriftRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// The agent's view of its source: what it applies, what it last saw, and why it refused anything.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SourceReport {
    pub channel: String,
    /// Serial and bundle digest being enforced (the last known good release).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_serial: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_sha256: Option<String>,
    /// Since when the source could not be reached or gave nothing acceptable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_since: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_refusal: Option<Refusal>,
    /// A newer release the agent verified but does not apply yet: its wave has not opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<PendingReport>,
}

/// Why the agent refused a release: a stable reason code (`rollback`, `expired`, …) and the message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Refusal {
    pub reason: String,
    pub message: String,
    pub at: Timestamp,
}

/// One app's state on the cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AppReport {
    pub name: String,
    pub state: SyncState,
    pub objects: u64,
}

/// One object that is not Synced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectReport {
    pub app: String,
    /// `kind ns/name` (or `kind name` when cluster-scoped).
    pub object: String,
    /// API group of the object, empty for the core group (the server grades RBAC and the like by it).
    #[serde(default)]
    pub group: String,
    pub kind: String,
    pub state: SyncState,
    pub message: String,
}

/// What happened about one drift.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DriftAction {
    /// Windvane put the fields back.
    Reverted,
    /// Only reported (selfHeal false, or within the grace period).
    Reported,
    /// Held by an operator's `windvane.io/hold-until`.
    Held,
    /// Windvane stopped fighting another manager for now.
    Contested,
    /// A release wrote the object while the change was held and kept the changed values: the release took
    /// the change in, so it is not reverted when the hold ends. (A release that wrote other values ended the
    /// change too; that is recorded as `Reverted`.)
    TakenIn,
}

/// Who changed what on a managed object, and when it was noticed and repaired.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DriftRecord {
    pub app: String,
    pub group: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    /// RFC 6901 pointers of the fields that changed; empty when the object was deleted.
    #[serde(default)]
    pub fields: Vec<String>,
    pub deleted: bool,
    /// The other field manager, e.g. `kubectl-scale`, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manager: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_at: Option<Timestamp>,
    pub detected_at: Timestamp,
    /// When the drift ended: reverted by Windvane (or by a release's write), or taken in by a release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverted_at: Option<Timestamp>,
    pub action: DriftAction,
    /// A two-person break-glass change on a prevented object: who, who approved, the ticket and until when
    /// it is held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub break_glass: Option<BreakGlassRecord>,
    /// Who asked for a manual revert (`windvane.io/revert=now`): the field manager that wrote the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revert_requested_by: Option<String>,
}

/// The names of a break-glass change, as the admission policy let them onto the object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BreakGlassRecord {
    pub by: String,
    pub approver: String,
    pub ticket: String,
    pub until: Timestamp,
}

/// The server's answer to an accepted heartbeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeartbeatReply {
    /// The sequence stored: drift records up to it need not be sent again.
    pub acknowledged_sequence: u64,
    /// The interval the server wants next (it may stretch it under load).
    pub next_interval_seconds: u64,
}

/// What an agent reports about a release it has not taken yet (in its heartbeat's source report).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PendingReport {
    pub serial: u64,
    /// 1-based, as shown.
    pub wave: u32,
    pub waves: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opens_at: Option<Timestamp>,
    pub halted: bool,
    /// Why it waits: `Pending (wave 2, opens in 14m)`, `Awaiting approval (0 of 1)`, or the gate's reason.
    pub message: String,
    /// Set while the release awaits approval: how many approvals count and how many it needs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalProgress>,
    /// What applying it would change here, when the agent worked it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes: Option<ChangeSummary>,
}

/// Approvals of a release awaiting approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApprovalProgress {
    pub approved: u32,
    pub threshold: u32,
}

/// How many objects applying a release would create, update and prune on a cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChangeSummary {
    pub create: u32,
    pub update: u32,
    pub prune: u32,
}

impl ChangeSummary {
    /// `would create 1, update 2 and prune 0 objects`, or `would change nothing`.
    pub fn describe(&self) -> String {
        if *self == ChangeSummary::default() {
            return "would change nothing".to_owned();
        }
        format!(
            "would create {}, update {} and prune {} objects",
            self.create, self.update, self.prune
        )
    }
}
