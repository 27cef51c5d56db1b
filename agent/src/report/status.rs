//! The agent's status, as a pure function of what it knows: the source (what it enforces, what it refused),
//! each object's apply outcome and live health. Served on `/readyz` and `/metrics`, logged, and sent in the
//! heartbeat. The cluster's state is the worst of its objects', or Failed when it refuses the source.

use std::collections::BTreeMap;

use jiff::Timestamp;
use windvane_shared::wire::heartbeat::{AppReport, ObjectReport, Refusal, SourceReport};
use windvane_shared::wire::status::SyncState;

use crate::apply::inventory::ObjectKey;
use crate::live::health::Health;

/// What the agent knows about one object.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectStatus {
    pub app: String,
    /// `kind ns/name`.
    pub display: String,
    pub state: SyncState,
    pub message: String,
}

/// The state of an object from its last apply outcome and its live health.
pub fn object_state(apply_error: Option<&str>, health: Option<&Health>) -> (SyncState, String) {
    if let Some(error) = apply_error {
        return (SyncState::Failed, error.to_owned());
    }
    match health {
        None => (
            SyncState::Progressing,
            "waiting for the object to be observed".to_owned(),
        ),
        Some(Health::Healthy) => (SyncState::Synced, String::new()),
        Some(Health::Progressing(message)) => (SyncState::Progressing, message.clone()),
        Some(Health::Degraded(message)) => (SyncState::Degraded, message.clone()),
    }
}

/// The agent's status, published as a value: the engine and the healer change it (`send_modify`), the admin
/// endpoint and the heartbeat reporter read it (`borrow`), and the reporter wakes when it changes. Nobody
/// holds it across an `.await`.
pub type StatusTx = tokio::sync::watch::Sender<AgentStatus>;
/// The reading end of [`StatusTx`].
pub type StatusRx = tokio::sync::watch::Receiver<AgentStatus>;

/// The agent's whole status.
#[derive(Debug, Clone, Default)]
pub struct AgentStatus {
    pub source: SourceReport,
    /// True once the first release (or the last known good) has been enforced (`/readyz` names its serial).
    pub enforced: bool,
    pub objects: BTreeMap<ObjectKey, ObjectStatus>,
    /// Orphaned objects (left the release, not pruned), reported but not counted against the state.
    pub orphans: Vec<String>,
    /// A problem that is not about one object (rendering an app, pruning held back).
    pub last_error: Option<String>,
    /// Apps whose prunes wait for their own complete apply, with why ("prune of app a postponed: 1 object
    /// failed to apply"): shown with the app in `/status`.
    pub prune_postponed: BTreeMap<String, String>,
    /// Drift seen, newest last (bounded).
    pub drift: Vec<windvane_shared::wire::heartbeat::DriftRecord>,
}

impl AgentStatus {
    /// The cluster's state: Failed when the source is refused or nothing could be enforced; otherwise the
    /// worst object state.
    pub fn cluster_state(&self) -> SyncState {
        // Refusing the source is a failure even while the last known good is enforced: someone must look.
        if self.source.last_refusal.is_some() {
            return SyncState::Failed;
        }
        if !self.enforced {
            return SyncState::Progressing;
        }
        SyncState::worst(self.objects.values().map(|o| o.state))
    }

    /// Object counts per state.
    pub fn counts(&self) -> BTreeMap<SyncState, u64> {
        let mut counts = BTreeMap::new();
        for object in self.objects.values() {
            *counts.entry(object.state).or_insert(0) += 1;
        }
        counts
    }

    /// Per app: the worst state and the object count.
    pub fn apps(&self) -> Vec<AppReport> {
        let mut apps: BTreeMap<&str, (SyncState, u64)> = BTreeMap::new();
        for object in self.objects.values() {
            let entry = apps.entry(&object.app).or_insert((SyncState::Synced, 0));
            entry.0 = entry.0.min(object.state);
            entry.1 += 1;
        }
        apps.into_iter()
            .map(|(name, (state, objects))| AppReport {
                name: name.to_owned(),
                state,
                objects,
            })
            .collect()
    }

    /// Objects that are not Synced, worst first, at most `limit`.
    pub fn problems(&self, limit: usize) -> Vec<ObjectReport> {
        let mut problems: Vec<(&ObjectKey, &ObjectStatus)> = self
            .objects
            .iter()
            .filter(|(_, o)| o.state != SyncState::Synced)
            .collect();
        problems.sort_by_key(|(key, o)| (o.state, (*key).clone()));
        problems
            .into_iter()
            .take(limit)
            .map(|(key, o)| ObjectReport {
                app: o.app.clone(),
                object: o.display.clone(),
                group: key.group.clone(),
                kind: key.kind.clone(),
                state: o.state,
                message: o.message.clone(),
            })
            .collect()
    }

    /// The status as JSON, for the admin server's `/status` (what the heartbeat will carry, for humans).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "state": self.cluster_state(),
            "enforced": self.enforced,
            "source": self.source,
            "counts": self.counts(),
            "apps": self.apps().into_iter().map(|app| {
                let mut json = serde_json::json!(app);
                if let Some(message) = self.prune_postponed.get(&app.name) {
                    json["message"] = message.as_str().into();
                }
                json
            }).collect::<Vec<_>>(),
            "objects": self.objects.values().map(|o| serde_json::json!({
                "app": o.app, "object": o.display, "state": o.state, "message": o.message,
            })).collect::<Vec<_>>(),
            "orphans": self.orphans,
            "lastError": self.last_error,
            "prunePostponed": self.prune_postponed,
            "drift": self.drift,
        })
    }

    /// Records a refusal of the source (the reason code and message), keeping what is enforced.
    pub fn refuse(&mut self, reason: &str, message: String, now: Timestamp) {
        self.source.last_refusal = Some(Refusal {
            reason: reason.to_owned(),
            message,
            at: now,
        });
    }

    /// Records a finished sync: what is enforced now, each object's state, the orphans, and the first problem
    /// that is not about one object.
    pub fn record_sync(&mut self, sync: SyncReport) {
        self.source.applied_serial = Some(sync.serial);
        self.source.applied_sha256 = Some(sync.sha256);
        self.enforced = true;
        self.last_error = sync.errors.into_iter().next();
        self.prune_postponed = sync.prune_postponed;
        self.objects = sync.objects;
        self.orphans = sync.orphans;
    }
}

/// What one sync of a release found, for [`AgentStatus::record_sync`].
#[derive(Debug, Clone, Default)]
pub struct SyncReport {
    pub serial: u64,
    pub sha256: String,
    /// Problems that are not about one object (render, prune), most important first.
    pub errors: Vec<String>,
    pub prune_postponed: BTreeMap<String, String>,
    pub objects: BTreeMap<ObjectKey, ObjectStatus>,
    /// `kind ns/name` of every orphan.
    pub orphans: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(states: &[(&str, SyncState)]) -> AgentStatus {
        let mut s = AgentStatus::default();
        for (i, (app, state)) in states.iter().enumerate() {
            let key = ObjectKey {
                group: String::new(),
                kind: "ConfigMap".into(),
                namespace: Some("ns".into()),
                name: format!("o{i}"),
            };
            s.objects.insert(
                key,
                ObjectStatus {
                    app: (*app).into(),
                    display: format!("ConfigMap ns/o{i}"),
                    state: *state,
                    message: String::new(),
                },
            );
        }
        s.source.applied_serial = Some(1);
        s
    }

    #[test]
    fn apply_errors_fail_and_health_decides_the_rest() {
        assert_eq!(
            object_state(Some("denied"), Some(&Health::Healthy)).0,
            SyncState::Failed
        );
        assert_eq!(object_state(None, None).0, SyncState::Progressing);
        assert_eq!(
            object_state(None, Some(&Health::Degraded("x".into()))).0,
            SyncState::Degraded
        );
        assert_eq!(
            object_state(None, Some(&Health::Healthy)).0,
            SyncState::Synced
        );
    }

    #[test]
    fn the_cluster_is_its_worst_object_or_failed_when_it_refuses_the_source() {
        let mut s = status(&[
            ("a", SyncState::Synced),
            ("a", SyncState::Progressing),
            ("b", SyncState::Synced),
        ]);
        assert_eq!(s.cluster_state(), SyncState::Progressing);
        assert_eq!(
            s.apps()
                .iter()
                .map(|a| (a.name.as_str(), a.state, a.objects))
                .collect::<Vec<_>>(),
            vec![
                ("a", SyncState::Progressing, 2),
                ("b", SyncState::Synced, 1)
            ]
        );
        assert_eq!(s.problems(10).len(), 1);
        s.refuse(
            "rollback",
            "serial 1 is below 2".into(),
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(s.cluster_state(), SyncState::Failed);
        let mut empty = status(&[]);
        empty.enforced = true;
        assert_eq!(empty.cluster_state(), SyncState::Synced);
    }
}
