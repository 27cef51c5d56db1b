//! The open break-glass changes of the fleet (`GET /api/v1/break-glass`), decided purely from the drift
//! log: an object's latest drift record (the log is newest first) that is Held with break-glass names whose
//! hold has not ended. A record reported again as Reverted, or as TakenIn (a release wrote the object and kept
//! the change), or a hold past its end, is closed.

use std::collections::BTreeSet;

use jiff::Timestamp;
use serde::Serialize;
use windvane_shared::wire::fleet_api::DriftEntry;
use windvane_shared::wire::heartbeat::DriftAction;

/// One open break-glass change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OpenBreakGlass {
    pub cluster: String,
    /// `group/Kind namespace/name`, as the page names objects.
    pub object: String,
    pub by: String,
    pub approver: String,
    pub ticket: String,
    pub detected_at: Timestamp,
    pub until: Timestamp,
}

/// `group/Kind namespace/name` of a record's object.
fn object_name(r: &windvane_shared::wire::heartbeat::DriftRecord) -> String {
    let group = if r.group.is_empty() {
        String::new()
    } else {
        format!("{}/", r.group)
    };
    match &r.namespace {
        Some(ns) => format!("{group}{} {ns}/{}", r.kind, r.name),
        None => format!("{group}{} {}", r.kind, r.name),
    }
}

/// The entries (newest first) that are open break-glass changes at `now`: each object's newest record of
/// one episode, Held with break-glass names and a hold not yet ended.
pub fn open_entries(entries: &[DriftEntry], now: Timestamp) -> Vec<&DriftEntry> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for entry in entries {
        let r = &entry.record;
        // Only an object's newest record of one episode counts.
        if !seen.insert((entry.cluster.clone(), object_name(r), r.detected_at)) {
            continue;
        }
        if r.action == DriftAction::Held && r.break_glass.as_ref().is_some_and(|b| b.until > now) {
            out.push(entry);
        }
    }
    out
}

/// The open break-glass changes among `entries` (newest first), at `now`.
pub fn open(entries: &[DriftEntry], now: Timestamp) -> Vec<OpenBreakGlass> {
    open_entries(entries, now)
        .into_iter()
        .filter_map(|entry| {
            let r = &entry.record;
            let names = r.break_glass.as_ref()?;
            Some(OpenBreakGlass {
                cluster: entry.cluster.clone(),
                object: object_name(r),
                by: names.by.clone(),
                approver: names.approver.clone(),
                ticket: names.ticket.clone(),
                detected_at: r.detected_at,
                until: names.until,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use windvane_shared::wire::heartbeat::{BreakGlassRecord, DriftRecord};

    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).expect("valid")
    }

    fn entry(name: &str, action: DriftAction, until: i64) -> DriftEntry {
        DriftEntry {
            cluster: "c1".into(),
            sequence: 1,
            received_at: at(1),
            record: DriftRecord {
                app: "web".into(),
                group: "apps".into(),
                kind: "Deployment".into(),
                namespace: Some("shop".into()),
                name: name.into(),
                fields: vec![],
                deleted: false,
                manager: None,
                operation: None,
                changed_at: None,
                detected_at: at(0),
                reverted_at: None,
                action,
                break_glass: Some(BreakGlassRecord {
                    by: "alice".into(),
                    approver: "bob".into(),
                    ticket: "INC-7".into(),
                    until: at(until),
                }),
                revert_requested_by: None,
            },
        }
    }

    #[test]
    fn held_changes_are_open_until_reverted_taken_in_or_past_their_end() {
        let entries = [
            entry("reverted", DriftAction::Reverted, 3600),
            entry("reverted", DriftAction::Held, 3600),
            entry("taken-in", DriftAction::TakenIn, 3600),
            entry("taken-in", DriftAction::Held, 3600),
            entry("held", DriftAction::Held, 3600),
            entry("ended", DriftAction::Held, 10),
        ];
        let open = open(&entries, at(60));
        assert_eq!(open.len(), 1, "{open:?}");
        assert_eq!(open[0].object, "apps/Deployment shop/held");
        assert_eq!(
            (
                open[0].by.as_str(),
                open[0].approver.as_str(),
                open[0].ticket.as_str()
            ),
            ("alice", "bob", "INC-7")
        );
        assert_eq!(open[0].until, at(3600));
    }

    #[test]
    fn drift_without_break_glass_is_not_listed() {
        let mut plain = entry("web", DriftAction::Held, 3600);
        plain.record.break_glass = None;
        assert!(open(&[plain], at(0)).is_empty());
    }
}
