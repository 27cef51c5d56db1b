//! The PagerDuty Events API v2 sink, decided purely: a notification becomes one event — `trigger` for a
//! cluster entering an alerting state or critical drift, `resolve` for its recovery — with a `dedup_key`
//! stable for the cluster's alert episode (`windvane/<cluster>/episode-<N>`), so everything one episode
//! raises folds into one incident and its recovery resolves exactly that incident; the next episode gets a
//! new key. Critical drift reported while the cluster is not alerting (already reverted) has no episode to
//! join: it triggers an incident of its own, keyed by the object within the episode, for a person to
//! resolve. The notifier ([`crate::notify`]) claims, dedupes and delivers, as JSON with markup characters
//! escaped ([`crate::notify::escape::json`]); the summary, the incident's title, is kept to one line.

use serde_json::{Value, json};

use crate::fleet::status;
use crate::notify::escape;
use crate::notify::{Notification, Severity};

/// The Events API v2 endpoint.
pub const EVENTS_URL: &str = "https://events.pagerduty.com/v2/enqueue";
/// PagerDuty's limit on `payload.summary`.
const MAX_SUMMARY: usize = 1024;

/// The dedup key of a notification: its cluster's episode, or (drift outside an open episode) that object
/// in the episode.
pub fn dedup_key(notification: &Notification) -> String {
    let episode = format!(
        "windvane/{}/episode-{}",
        notification.cluster, notification.episode
    );
    match &notification.drift {
        Some(record)
            if notification.trigger == "Drift" && !status::is_alerting(notification.state) =>
        {
            let namespace = record.namespace.as_deref().unwrap_or("");
            format!(
                "{episode}/drift/{}/{}/{namespace}/{}",
                record.group, record.kind, record.name
            )
        }
        _ => episode,
    }
}

fn severity(severity: Severity) -> &'static str {
    match severity {
        Severity::Critical => "critical",
        Severity::Warning => "warning",
        Severity::Info => "info",
    }
}

/// The event to POST for `notification` with the integration's `routing_key`.
pub fn event(notification: &Notification, routing_key: &str) -> Value {
    let dedup_key = dedup_key(notification);
    if notification.trigger == "Recovered" {
        return json!({
            "routing_key": routing_key,
            "event_action": "resolve",
            "dedup_key": dedup_key,
        });
    }
    // PagerDuty shows the summary as the incident's title: one line, whatever the cluster wrote.
    let summary: String = escape::one_line(&notification.summary)
        .chars()
        .take(MAX_SUMMARY)
        .collect();
    let mut details = json!({
        "id": notification.id,
        "trigger": notification.trigger,
        "state": notification.state,
        "serial": notification.serial,
        "labels": notification.labels,
    });
    if let Some(message) = &notification.message {
        details["message"] = json!(message);
    }
    if let Some(drift) = &notification.drift {
        details["drift"] = json!(drift);
    }
    json!({
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": dedup_key,
        "payload": {
            "summary": summary,
            "source": notification.cluster,
            "severity": severity(notification.severity),
            "timestamp": notification.at.to_string(),
            "component": notification.drift.as_ref().map(|d| d.kind.clone()),
            "group": "windvane",
            "class": notification.trigger,
            "custom_details": details,
        },
    })
}

#[cfg(test)]
mod tests {
    use jiff::Timestamp;
    use windvane_shared::wire::heartbeat::{DriftAction, DriftRecord};

    use super::*;
    use crate::db::EpisodeClaim;
    use crate::fleet::status::ClusterState;

    fn notification(trigger: &str, state: ClusterState, episode: u64) -> Notification {
        Notification {
            id: format!("c1/{trigger}/3"),
            cluster: "c1".into(),
            trigger: trigger.into(),
            trigger_key: trigger.into(),
            claim: EpisodeClaim::Open,
            episode,
            severity: Severity::Critical,
            state,
            previous_state: None,
            serial: 3,
            labels: [("env".to_owned(), "prod".to_owned())].into(),
            summary: format!("cluster c1 is {trigger}"),
            message: Some("cannot apply".into()),
            drift: None,
            at: Timestamp::from_second(1_800_000_000).expect("valid"),
        }
    }

    fn rbac_drift() -> DriftRecord {
        DriftRecord {
            app: "access".into(),
            group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRoleBinding".into(),
            namespace: None,
            name: "viewers".into(),
            fields: vec!["/subjects".into()],
            deleted: false,
            manager: Some("kubectl-edit".into()),
            operation: None,
            changed_at: None,
            detected_at: Timestamp::from_second(1_800_000_000).expect("valid"),
            reverted_at: None,
            action: DriftAction::Reverted,
            break_glass: None,
            revert_requested_by: None,
        }
    }

    #[test]
    fn an_alert_triggers_and_its_recovery_resolves_the_same_key() {
        let failed = event(&notification("Failed", ClusterState::Failed, 2), "R0UT1NG");
        assert_eq!(failed["event_action"], "trigger");
        assert_eq!(failed["routing_key"], "R0UT1NG");
        assert_eq!(failed["dedup_key"], "windvane/c1/episode-2");
        assert_eq!(failed["payload"]["severity"], "critical");
        assert_eq!(failed["payload"]["source"], "c1");
        assert_eq!(failed["payload"]["summary"], "cluster c1 is Failed");
        assert_eq!(failed["payload"]["timestamp"], "2027-01-15T08:00:00Z");
        assert_eq!(
            failed["payload"]["custom_details"]["message"],
            "cannot apply"
        );
        assert_eq!(failed["payload"]["custom_details"]["serial"], 3);

        let recovered = event(
            &notification("Recovered", ClusterState::Synced, 2),
            "R0UT1NG",
        );
        assert_eq!(
            recovered,
            json!({"routing_key": "R0UT1NG", "event_action": "resolve", "dedup_key": "windvane/c1/episode-2"})
        );
        let next = event(
            &notification("Unknown", ClusterState::Unknown, 3),
            "R0UT1NG",
        );
        assert_eq!(next["dedup_key"], "windvane/c1/episode-3");
    }

    #[test]
    fn drift_joins_an_open_episode_or_keys_its_own_incident() {
        let mut within = notification("Drift", ClusterState::OutOfSync, 4);
        within.drift = Some(rbac_drift());
        let joined = event(&within, "k");
        assert_eq!(joined["dedup_key"], "windvane/c1/episode-4");
        assert_eq!(joined["payload"]["component"], "ClusterRoleBinding");
        assert_eq!(
            joined["payload"]["custom_details"]["drift"]["manager"],
            "kubectl-edit"
        );
        let mut reverted = notification("Drift", ClusterState::Synced, 4);
        reverted.drift = Some(rbac_drift());
        assert_eq!(
            event(&reverted, "k")["dedup_key"],
            "windvane/c1/episode-4/drift/rbac.authorization.k8s.io/ClusterRoleBinding//viewers"
        );
    }

    #[test]
    fn summaries_are_cut_to_pagerdutys_limit() {
        let mut long = notification("Failed", ClusterState::Failed, 1);
        long.summary = "é".repeat(2000);
        let sent = event(&long, "k");
        assert_eq!(
            sent["payload"]["summary"]
                .as_str()
                .map(|s| s.chars().count()),
            Some(1024)
        );
    }
}
