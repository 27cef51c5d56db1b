//! The engine's side of retrying failed objects alone ([`crate::apply::retry`] decides when): after a sync, its
//! failed objects are queued, each with its own back-off; when one is due it is applied by itself, and the
//! inventory, the status, the healer and the watches learn of it as a sync would have told them. When the
//! last one lands, one more sync (which writes nothing unchanged) carries out what waited for it: its app's
//! prunes, and recording the release as completely applied.

use std::collections::BTreeSet;
use std::time::Instant;

use tracing::info;

use super::Engine;
use super::reconcile::{inventory_record, object_status};
use crate::apply::inventory::ObjectKey;
use crate::apply::{ObjectResult, Outcome};

impl Engine {
    /// Queues the sync's objects that failed to apply for retries of their own (not those in `sealed`,
    /// which the whole sync tries again), drops the rest from the queue, and says so in their status.
    pub(super) fn queue_failures(
        &mut self,
        results: &[ObjectResult],
        sealed: &BTreeSet<ObjectKey>,
    ) {
        for (key, message) in self.apply.queue_failures(results, sealed) {
            self.report.object_message(&key, message);
        }
        self.report.retrying(self.apply.retrying());
    }

    /// Applies the failed objects whose attempt is due, alone.
    pub(super) async fn retry_failed(&mut self) {
        let due = self.apply.due(Instant::now());
        if due.is_empty() {
            return;
        }
        let report = self.apply(due).await;
        self.report.count_outcomes(&report);
        let mut landed = Vec::new();
        for result in report.results {
            let key = result.key();
            self.report
                .object(key.clone(), object_status(&self.live, &result));
            match &result.outcome {
                Outcome::Failed(error) => {
                    let error = error.clone();
                    if let Some((key, message)) = self.apply.schedule_retry(&result, &error) {
                        self.report.object_message(&key, message);
                    }
                }
                Outcome::Applied { .. } => {
                    info!(object = %result.object.id, app = %result.object.app, "applied on its own retry");
                    let record = inventory_record(&result, &self.live);
                    self.apply.landed(key, Some(record));
                    landed.push(result);
                }
                Outcome::Refused(_) | Outcome::Waiting(_) => self.apply.landed(key, None),
            }
        }
        self.report.retrying(self.apply.retrying());
        if landed.is_empty() {
            return;
        }
        self.persist_inventory().await;
        self.take_landed(landed).await;
        if self.apply.retrying() == 0 {
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
