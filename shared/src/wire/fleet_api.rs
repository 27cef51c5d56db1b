//! The source server's fleet API as data: the JSON that `GET /api/v1/fleet`, `/api/v1/clusters` and
//! `/api/v1/clusters/NAME` return. The server builds these values from its database and clock (how a row is
//! computed stays in the server's `view` and `status` modules) and serialises them; `windvane status`
//! deserialises the same types. The field names are a contract read by scripts and tests: change them only
//! with a new API version.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::wire::heartbeat::{DriftRecord, Heartbeat};
use crate::wire::status::SyncState;

/// A cluster's state as the server shows it: the agent's own [`SyncState`] while the cluster keeps
/// reporting, plus `Unknown` (silent past its grace period) and `NeverSeen` (enrolled, never reported).
/// `Ord` follows display order, worst first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ClusterState {
    Failed,
    Degraded,
    Contested,
    OutOfSync,
    /// No heartbeat within the grace period: the cluster may be anything, so never counted as Synced.
    Unknown,
    Held,
    Progressing,
    Synced,
    /// Enrolled but never heard from.
    NeverSeen,
}

impl ClusterState {
    /// Every state in display order, worst first; `Unknown` sits with the problems, `NeverSeen` apart at the
    /// end.
    pub const ALL: [ClusterState; 9] = [
        ClusterState::Failed,
        ClusterState::Degraded,
        ClusterState::Contested,
        ClusterState::OutOfSync,
        ClusterState::Unknown,
        ClusterState::Held,
        ClusterState::Progressing,
        ClusterState::Synced,
        ClusterState::NeverSeen,
    ];

    /// The name used in the API, metrics labels, query parameters and the page.
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterState::Failed => "Failed",
            ClusterState::Degraded => "Degraded",
            ClusterState::Contested => "Contested",
            ClusterState::OutOfSync => "OutOfSync",
            ClusterState::Unknown => "Unknown",
            ClusterState::Held => "Held",
            ClusterState::Progressing => "Progressing",
            ClusterState::Synced => "Synced",
            ClusterState::NeverSeen => "NeverSeen",
        }
    }

    /// Reads a state name (case-insensitive), as written in `?state=` or `windvane status --state`.
    pub fn parse(text: &str) -> Option<ClusterState> {
        Self::ALL
            .into_iter()
            .find(|s| s.as_str().eq_ignore_ascii_case(text.trim()))
    }

    /// The state an agent reported, as the server shows it while the cluster is fresh.
    pub fn from_reported(state: SyncState) -> ClusterState {
        match state {
            SyncState::Failed => ClusterState::Failed,
            SyncState::Degraded => ClusterState::Degraded,
            SyncState::Contested => ClusterState::Contested,
            SyncState::OutOfSync => ClusterState::OutOfSync,
            SyncState::Held => ClusterState::Held,
            SyncState::Progressing => ClusterState::Progressing,
            SyncState::Synced => ClusterState::Synced,
        }
    }
}

impl std::fmt::Display for ClusterState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One cluster as shown (an element of `clusters`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRow {
    pub name: String,
    pub fleet: String,
    pub labels: BTreeMap<String, String>,
    pub state: ClusterState,
    /// The state the agent last reported (differs from `state` when Unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_reported: Option<SyncState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_age_seconds: Option<u64>,
    pub grace_seconds: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_serial: Option<u64>,
    /// The serial of the channel's pointer in the server's store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_serial: Option<u64>,
    pub drift_total: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub enrolled_at: Timestamp,
    pub keyid: String,
    /// The age recipient of the cluster's enrolled key: `windvane seal --to-cluster` seals to it, and only
    /// that cluster's agent can open (`windvane_shared::format::sops::cluster_recipient`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_recipient: Option<String>,
    pub sequence: u64,
}

impl ClusterRow {
    /// Whether the cluster runs an older release than its channel's latest.
    pub fn behind(&self) -> bool {
        matches!((self.applied_serial, self.latest_serial), (Some(a), Some(l)) if a < l)
    }
}

/// The fleet as shown (`GET /api/v1/fleet`): counts per state over the clusters the selector picks, and the
/// rows that pass the whole filter, worst first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetView {
    pub generated_at: Timestamp,
    /// Clusters the selector picks (before the state filter).
    pub total: u64,
    /// Every state with its count (zeros included), worst first.
    pub counts: BTreeMap<ClusterState, u64>,
    pub clusters: Vec<ClusterRow>,
}

/// One drift audit log entry (`drift` in the cluster detail and `GET /api/v1/drift`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DriftEntry {
    pub cluster: String,
    pub sequence: u64,
    pub received_at: Timestamp,
    pub record: DriftRecord,
}

/// One cluster with its latest report and drift log (`GET /api/v1/clusters/NAME`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterDetail {
    pub cluster: ClusterRow,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<Heartbeat>,
    pub drift: Vec<DriftEntry>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_names_round_trip_and_counts_serialise_worst_first() {
        for state in ClusterState::ALL {
            assert_eq!(ClusterState::parse(state.as_str()), Some(state));
            assert_eq!(
                ClusterState::parse(&state.as_str().to_lowercase()),
                Some(state)
            );
            assert_eq!(
                serde_json::to_value(state).expect("json"),
                serde_json::Value::from(state.as_str())
            );
        }
        assert_eq!(ClusterState::parse("Bogus"), None);
        let counts: BTreeMap<ClusterState, u64> = ClusterState::ALL.map(|s| (s, 0)).into();
        let text = serde_json::to_string(&counts).expect("json");
        assert!(
            text.starts_with(r#"{"Failed":0,"Degraded":0"#) && text.ends_with(r#""NeverSeen":0}"#),
            "{text}"
        );
    }

    #[test]
    fn a_row_reads_back_with_the_api_field_names() {
        let json = serde_json::json!({
            "name": "eu-1", "fleet": "acme", "labels": {"env": "prod"}, "state": "Unknown",
            "lastReported": "Synced", "heartbeatAgeSeconds": 400, "graceSeconds": 90,
            "appliedSerial": 3, "latestSerial": 4, "driftTotal": 2,
            "enrolledAt": "2027-01-15T10:00:00Z", "keyid": "k", "sequence": 7
        });
        let row: ClusterRow = serde_json::from_value(json.clone()).expect("row");
        assert_eq!(row.state, ClusterState::Unknown);
        assert_eq!(row.last_reported, Some(SyncState::Synced));
        assert!(row.behind());
        assert_eq!(row.last_seen, None);
        assert_eq!(serde_json::to_value(&row).expect("json"), json);
    }
}
