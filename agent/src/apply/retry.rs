//! Objects that failed to apply, retried alone. One object the API server will not take for a while (its
//! admission webhook has no backend, its CRD comes with another app) must not make the agent send the whole
//! release again: the rest is applied and healed as usual, and each failed object is tried again on its own
//! back-off (exponential with full jitter, from [`RETRY_BASE`] up to [`RETRY_CAP`]), until it lands, a new
//! release replaces it, or it leaves the release.
//!
//! Pure: the engine tells it what failed and what landed, with the time and a random unit, and asks what is
//! due and when to wake; the status message of a retried object says why and when next ([`Retrying::message`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use jiff::Timestamp;

use crate::apply::desired::Desired;
use crate::apply::inventory::ObjectKey;
use crate::backoff::full_jitter;
use crate::clamp;

/// First and longest wait before one failed object is tried again.
pub const RETRY_BASE: Duration = Duration::from_secs(1);
pub const RETRY_CAP: Duration = Duration::from_secs(300);

/// One object waiting for its next attempt.
#[derive(Debug, Clone)]
pub struct Retrying {
    pub object: Desired,
    /// The body hash it failed with: a new body starts its back-off again.
    body_hash: String,
    /// Failed attempts in a row.
    pub failures: u32,
    /// The API server's last answer.
    pub error: String,
    /// When the next attempt is due.
    at: Instant,
    /// The same, on the wall clock, for the status.
    pub next_wall: Timestamp,
}

impl Retrying {
    /// The object's status message: why it failed, and that it is retried alone, when next.
    pub fn message(&self) -> String {
        format!(
            "{} (retried alone: {} failed attempts, next at {})",
            self.error,
            self.failures,
            self.next_wall
                .round(jiff::Unit::Second)
                .unwrap_or(self.next_wall)
        )
    }
}

/// The failed objects of the enforced release, by key.
#[derive(Debug, Default)]
pub struct ObjectRetries {
    pending: BTreeMap<ObjectKey, Retrying>,
}

impl ObjectRetries {
    /// `object` failed with `error` at `now` (`wall` on the wall clock): its next attempt is scheduled, the
    /// back-off growing with each failure of the same body in a row. Returns the wait.
    pub fn failed(
        &mut self,
        object: Desired,
        error: String,
        now: Instant,
        wall: Timestamp,
        unit: f64,
    ) -> Duration {
        let key = ObjectKey::of(&object.id);
        let body_hash = object.body_hash();
        let failures = match self.pending.get(&key) {
            Some(previous) if previous.body_hash == body_hash => {
                previous.failures.saturating_add(1)
            }
            _ => 1,
        };
        let wait = full_jitter(failures - 1, RETRY_BASE, RETRY_CAP, unit);
        let next_wall = wall
            .checked_add(jiff::SignedDuration::try_from(wait).unwrap_or_default())
            .unwrap_or(wall);
        self.pending.insert(
            key,
            Retrying {
                object,
                body_hash,
                failures,
                error,
                at: clamp::after(now, wait),
                next_wall,
            },
        );
        wait
    }

    /// `key` applied (or is no longer to be applied): nothing more to retry.
    pub fn landed(&mut self, key: &ObjectKey) {
        self.pending.remove(key);
    }

    /// Keeps only the objects `keep` says are still failed objects of the release.
    pub fn retain(&mut self, mut keep: impl FnMut(&ObjectKey) -> bool) {
        self.pending.retain(|key, _| keep(key));
    }

    /// A new release: its own sync decides what fails.
    pub fn clear(&mut self) {
        self.pending.clear();
    }

    /// The objects whose attempt is due at `now`. Each stays queued (its status message with it) until the
    /// engine reports it [`landed`](ObjectRetries::landed) or [`failed`](ObjectRetries::failed) again.
    pub fn due(&mut self, now: Instant) -> Vec<Desired> {
        let due: Vec<ObjectKey> = self
            .pending
            .iter()
            .filter(|(_, r)| r.at <= now)
            .map(|(key, _)| key.clone())
            .collect();
        due.into_iter()
            .filter_map(|key| self.pending.get(&key).map(|r| r.object.clone()))
            .collect()
    }

    /// The earliest next attempt.
    pub fn next_at(&self) -> Option<Instant> {
        self.pending.values().map(|r| r.at).min()
    }

    pub fn get(&self, key: &ObjectKey) -> Option<&Retrying> {
        self.pending.get(key)
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Every object being retried, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&ObjectKey, &Retrying)> {
        self.pending.iter()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use windvane_shared::decide::desired::DesiredObject;
    use windvane_shared::format::bundle::ObjectRef;

    use super::*;

    fn ingress(host: &str) -> Desired {
        let body = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "web", "namespace": "a"}, "spec": {"rules": [{"host": host}]}});
        Desired::of(DesiredObject {
            app: "web".into(),
            id: ObjectRef::of(&body).unwrap(),
            body,
            wave: 0,
            self_heal: true,
            prune: true,
            drift_grace_period: None,
            prevent: false,
            ignored_pointers: Vec::new(),
            file: "i.yaml".into(),
            document: 0,
            default_namespace: None,
        })
    }

    #[test]
    fn a_failed_object_backs_off_alone_doubling_up_to_the_cap() {
        let start = Instant::now();
        let wall = Timestamp::UNIX_EPOCH;
        let mut retries = ObjectRetries::default();
        let waits: Vec<Duration> = (0..12)
            .map(|_| retries.failed(ingress("a"), "webhook down".into(), start, wall, 1.0))
            .collect();
        assert_eq!(waits[0], RETRY_BASE);
        assert_eq!(waits[1], RETRY_BASE * 2);
        assert_eq!(waits[4], RETRY_BASE * 16);
        assert_eq!(waits[11], RETRY_CAP, "capped");
        let key = ObjectKey::of(&ingress("a").id);
        let pending = retries.get(&key).unwrap();
        assert_eq!(pending.failures, 12);
        assert!(pending.message().contains("webhook down"));
        assert!(
            pending
                .message()
                .contains("12 failed attempts, next at 1970-01-01T00:05:00Z")
        );
        // A new body of the same object starts over.
        assert_eq!(
            retries.failed(ingress("b"), "webhook down".into(), start, wall, 1.0),
            RETRY_BASE
        );
    }

    #[test]
    fn only_due_objects_are_taken_and_a_landed_one_leaves_the_queue() {
        let start = Instant::now();
        let wall = Timestamp::UNIX_EPOCH;
        let mut retries = ObjectRetries::default();
        assert_eq!(retries.next_at(), None);
        retries.failed(ingress("a"), "down".into(), start, wall, 1.0);
        assert_eq!(retries.next_at(), Some(start + RETRY_BASE));
        assert!(retries.due(start).is_empty(), "not before its time");
        let due = retries.due(start + RETRY_BASE);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].id.name, "web");
        retries.landed(&ObjectKey::of(&due[0].id));
        assert!(retries.is_empty());
        assert_eq!(retries.next_at(), None);
    }

    #[test]
    fn jitter_spreads_the_wait_but_never_to_nothing() {
        let start = Instant::now();
        let mut retries = ObjectRetries::default();
        let wait = retries.failed(
            ingress("a"),
            "down".into(),
            start,
            Timestamp::UNIX_EPOCH,
            0.0,
        );
        assert_eq!(wait, RETRY_BASE / 10);
        let mut other = ObjectRetries::default();
        let half = other.failed(
            ingress("a"),
            "down".into(),
            start,
            Timestamp::UNIX_EPOCH,
            0.5,
        );
        assert_eq!(half, RETRY_BASE / 2);
    }
}
