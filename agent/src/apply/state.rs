//! The apply stage's state in the engine: the inventory (what Windvane applied here, persisted by
//! [`crate::kube::state`] after each sync) and the queue of objects that failed to apply, each retried alone
//! on its own back-off ([`crate::apply::retry`] decides when). The engine's loop hands it each sync's and each
//! retry's results; it answers with what to write into the objects' statuses (why and when an object is tried
//! again), which the loop gives the report stage. Nothing here talks to the cluster.

use std::collections::BTreeSet;
use std::time::Instant;

use jiff::Timestamp;
use tracing::warn;

use crate::apply::desired::Desired;
use crate::apply::inventory::{Applied, Inventory, ObjectKey};
use crate::apply::retry::ObjectRetries;
use crate::apply::run_once::Finished;
use crate::apply::{ObjectResult, Outcome};
use crate::backoff::random_unit;

/// The inventory and the retry queue.
#[derive(Debug)]
pub struct ApplyState {
    inventory: Inventory,
    retries: ObjectRetries,
}

impl ApplyState {
    /// The inventory as the cluster remembers it; nothing queued.
    pub fn new(inventory: Inventory) -> Self {
        Self {
            inventory,
            retries: ObjectRetries::default(),
        }
    }

    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    /// The inventory a sync computed ([`crate::apply::inventory::next`]) replaces the one before.
    pub fn set_inventory(&mut self, next: Inventory) {
        self.inventory = next;
    }

    /// Records that the run-once object `key` finished for the body it was applied with; false when it is
    /// not in the inventory or was done already (nothing to persist).
    pub fn mark_done(&mut self, key: &ObjectKey, done: Finished) -> bool {
        match self.inventory.entries.get_mut(key) {
            Some(entry) if entry.done.is_none() => {
                entry.done = Some(done);
                true
            }
            _ => false,
        }
    }

    /// Queues the sync's objects that failed to apply for retries of their own (not those in `sealed`,
    /// which the whole sync tries again) and drops the rest from the queue. Returns, for each queued object,
    /// the message its status gets: why and when it is tried next.
    pub fn queue_failures(
        &mut self,
        results: &[ObjectResult],
        sealed: &BTreeSet<ObjectKey>,
    ) -> Vec<(ObjectKey, String)> {
        let failed: BTreeSet<ObjectKey> = results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Failed(_)))
            .map(ObjectResult::key)
            .filter(|key| !sealed.contains(key))
            .collect();
        self.retries.retain(|key| failed.contains(key));
        let mut messages = Vec::new();
        for result in results {
            if let Outcome::Failed(error) = &result.outcome
                && failed.contains(&result.key())
            {
                messages.extend(self.schedule_retry(result, error));
            }
        }
        messages
    }

    /// Schedules the next attempt of a failed object; the message for its status.
    pub fn schedule_retry(
        &mut self,
        result: &ObjectResult,
        error: &str,
    ) -> Option<(ObjectKey, String)> {
        let key = result.key();
        let wait = self.retries.failed(
            result.object.clone(),
            error.to_owned(),
            Instant::now(),
            Timestamp::now(),
            random_unit(),
        );
        let retrying = self.retries.get(&key)?;
        warn!(object = %result.object.id, app = %result.object.app, failures = retrying.failures,
            wait_ms = wait.as_millis() as u64, %error, "apply failed; retrying this object alone");
        Some((key, retrying.message()))
    }

    /// The failed objects whose attempt is due.
    pub fn due(&mut self, now: Instant) -> Vec<Desired> {
        self.retries.due(now)
    }

    /// An object left the queue: it landed, or it can no longer be retried alone. `record` is its entry
    /// for the inventory when it landed.
    pub fn landed(&mut self, key: ObjectKey, record: Option<Applied>) {
        self.retries.landed(&key);
        if let Some(Applied::Yes(entry)) = record {
            self.inventory.entries.insert(key, entry);
        }
    }

    /// When the next retry is due.
    pub fn next_retry(&self) -> Option<Instant> {
        self.retries.next_at()
    }

    /// How many objects wait for a retry.
    pub fn retrying(&self) -> usize {
        self.retries.len()
    }
}
