//! The engine's side of retrying failed objects alone ([`crate::apply::retry`] decides when): after a sync, its
//! failed objects are queued, each with its own back-off; when one is due it is applied by itself, and the
//! inventory, the status, the healer and the watches learn of it as a sync would have told them. When the
//! last one lands, one more sync (which writes nothing unchanged) carries out what waited for it: its app's
//! prunes, and recording the release as completely applied.

use std::collections::BTreeSet;
use std::time::Instant;

use jiff::Timestamp;
use tracing::{info, warn};

use super::Engine;
use super::reconcile::{inventory_record, object_status};
use crate::apply::inventory::{Applied, ObjectKey};
use crate::apply::{ObjectResult, Outcome};
use crate::backoff::random_unit;

impl Engine {
    /// Queues the sync's objects that failed to apply for retries of their own (not those in `sealed`,
    /// which the whole sync tries again), drops the rest from the queue, and says so in their status.
    pub(super) fn queue_failures(
        &mut self,
        results: &[ObjectResult],
        sealed: &BTreeSet<ObjectKey>,
    ) {
        let failed: BTreeSet<ObjectKey> = results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Failed(_)))
            .map(ObjectResult::key)
            .filter(|key| !sealed.contains(key))
            .collect();
        self.retries.retain(|key| failed.contains(key));
        for result in results {
            if let Outcome::Failed(error) = &result.outcome
                && failed.contains(&result.key())
            {
                self.schedule_retry(result, error);
            }
        }
        self.metrics.set_apply_retrying(self.retries.len());
    }

    /// Schedules the next attempt of a failed object and writes why and when into its status.
    fn schedule_retry(&mut self, result: &ObjectResult, error: &str) {
        let key = result.key();
        let wait = self.retries.failed(
            result.object.clone(),
            error.to_owned(),
            Instant::now(),
            Timestamp::now(),
            random_unit(),
        );
        let Some(retrying) = self.retries.get(&key) else {
            return;
        };
        warn!(object = %result.object.id, app = %result.object.app, failures = retrying.failures,
            wait_ms = wait.as_millis() as u64, %error, "apply failed; retrying this object alone");
        let message = retrying.message();
        self.status.send_if_modified(|status| {
            let Some(object) = status.objects.get_mut(&key) else {
                return false;
            };
            object.message = message;
            true
        });
    }

    /// Applies the failed objects whose attempt is due, alone.
    pub(super) async fn retry_failed(&mut self) {
        let due = self.retries.due(Instant::now());
        if due.is_empty() {
            return;
        }
        let report = self.apply(due).await;
        self.count_outcomes(&report);
        let mut landed = Vec::new();
        for result in report.results {
            let key = result.key();
            let status = object_status(&self.live, &result);
            self.status.send_modify(|s| {
                s.objects.insert(key.clone(), status);
            });
            match &result.outcome {
                Outcome::Failed(error) => {
                    let error = error.clone();
                    self.schedule_retry(&result, &error);
                }
                Outcome::Applied { .. } => {
                    info!(object = %result.object.id, app = %result.object.app, "applied on its own retry");
                    self.retries.landed(&key);
                    if let Applied::Yes(entry) = inventory_record(&result, &self.live) {
                        self.inventory.entries.insert(key, entry);
                    }
                    landed.push(result);
                }
                Outcome::Refused(_) | Outcome::Waiting(_) => self.retries.landed(&key),
            }
        }
        self.metrics.set_apply_retrying(self.retries.len());
        if landed.is_empty() {
            return;
        }
        self.persist_inventory().await;
        self.take_landed(landed).await;
        if self.retries.is_empty() {
            // What waited for them (their app's prunes, the release's completeness) is done by one more
            // sync, which writes nothing that is unchanged.
            self.sync().await;
        }
    }

    /// Objects that landed on their own retry are watched and healed from now on.
    async fn take_landed(&mut self, landed: Vec<ObjectResult>) {
        let report = crate::apply::ApplyReport { results: landed };
        self.watch_applied(&report).await;
        for result in report.results {
            let key = result.key();
            self.healer.add_desired(result.object);
            if let Some(baseline) = result.applied {
                self.healer.applied(&key, baseline).await;
            }
        }
        self.publish_drift();
    }
}
