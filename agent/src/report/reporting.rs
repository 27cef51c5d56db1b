//! The report stage's state in the engine: the sender of the agent's status (read by the admin server and
//! the heartbeat task), the metrics, and what of both was last published. The engine's loop hands it what
//! the other stages decided — a fetch's outcome, a gate's wait, a sync's report, a retry's message, the
//! healer's drift records — and it is the one place that writes them into the status and the metrics.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use windvane_shared::wire::heartbeat::PendingReport;

use crate::Error;
use crate::apply::inventory::ObjectKey;
use crate::apply::{ApplyReport, Outcome};
use crate::heal::Healer;
use crate::report::metrics::Metrics;
use crate::report::status::{ObjectStatus, StatusRx, StatusTx, SyncReport};

/// What the engine reports through.
#[derive(Debug)]
pub struct Reporting {
    status: StatusTx,
    metrics: Arc<Metrics>,
    /// The healer's drift records' revision when last published (`None`: not yet).
    records: Option<u64>,
    /// The status, seen once for every change: the object counts are counted again only after one.
    seen: StatusRx,
}

impl Reporting {
    /// Reports on `status` and `metrics`, for the source `channel`.
    pub fn new(status: StatusTx, metrics: Arc<Metrics>, channel: &str) -> Self {
        status.send_modify(|status| status.source.channel = channel.to_owned());
        Self {
            seen: status.subscribe(),
            status,
            metrics,
            records: None,
        }
    }

    /// The status, for the healer (which writes each object's drift state into it).
    pub fn status(&self) -> &StatusTx {
        &self.status
    }

    /// The metrics, for the stages that count into them as they act (the healer, the approval watcher).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// One answer of the source (`windvane_source_fetch_total{result}`).
    pub fn fetched(&self, result: &str) {
        self.metrics.source_fetch(result);
    }

    /// The source answered: it is no longer stale.
    pub fn source_fresh(&self) {
        self.status
            .send_modify(|status| status.source.stale_since = None);
        self.metrics.set_source_stale(false);
    }

    /// The source is unavailable, or a release could not be persisted: stale since the first such time.
    pub fn source_stale(&self, error: &Error) {
        self.metrics.set_source_stale(true);
        self.status.send_modify(|status| {
            status.source.stale_since.get_or_insert_with(Timestamp::now);
            status.last_error = Some(error.to_string());
        });
    }

    /// A release verified: any earlier refusal is over.
    pub fn clear_refusal(&self) {
        self.status
            .send_modify(|status| status.source.last_refusal = None);
    }

    /// The fetcher refused a release.
    pub fn refused(&self, error: &Error) {
        self.metrics.source_fetch(error.reason());
        self.status.send_modify(|status| {
            status.refuse(error.reason(), error.to_string(), Timestamp::now());
        });
    }

    /// A new release of `serial` is enforced: a held release it supersedes is no longer pending.
    pub fn accepted(&self, serial: u64) {
        self.metrics.source_fetch("ok");
        self.metrics.set_release_serial(serial);
        self.clear_refusal();
        self.source_fresh();
        self.status.send_modify(|status| {
            if status
                .source
                .pending
                .as_ref()
                .is_some_and(|p| p.serial <= serial)
            {
                status.source.pending = None;
            }
        });
    }

    /// The held release waits for its approvals or its rollout wave.
    pub fn gate_waiting(&self, report: PendingReport) {
        if let Some(progress) = report.approval {
            self.metrics
                .set_approvals(progress.threshold, progress.approved);
        } else {
            self.metrics.set_approvals(0, 0);
            self.metrics.set_rollout_wave(report.wave, true);
        }
        self.pending(report);
    }

    /// The held release waits for a maintenance window.
    pub fn window_waiting(&self, report: PendingReport) {
        self.metrics.set_rollout_wave(0, false);
        self.metrics.set_approvals(0, 0);
        self.metrics.set_window_waiting(true);
        self.pending(report);
    }

    /// The gate of the held release opened.
    pub fn gate_opened(&self) {
        self.metrics.set_rollout_wave(0, false);
        self.metrics.set_approvals(0, 0);
        self.metrics.set_window_waiting(false);
    }

    fn pending(&self, report: PendingReport) {
        self.status
            .send_modify(|status| status.source.pending = Some(report));
    }

    /// Counts the objects' outcomes (`windvane_apply_total`).
    pub fn count_outcomes(&self, report: &ApplyReport) {
        for result in &report.results {
            self.metrics.apply(match result.outcome {
                Outcome::Applied { written: true } => "written",
                Outcome::Applied { written: false } => "unchanged",
                Outcome::Refused(_) => "refused",
                Outcome::Failed(_) => "failed",
                Outcome::Waiting(_) => "waiting",
            });
        }
    }

    /// A sync finished: its report becomes the status, and the objects are counted.
    pub fn record_sync(&self, sync: SyncReport) {
        self.status.send_modify(|status| {
            status.record_sync(sync);
            self.metrics.set_objects(&status.counts());
        });
    }

    /// How long a sync took.
    pub fn observe_sync(&self, elapsed: Duration) {
        self.metrics.observe_sync(elapsed);
    }

    /// How many apps a deny window holds to reporting drift.
    pub fn report_only_apps(&self, apps: usize) {
        self.metrics.set_window_report_only_apps(apps);
    }

    /// How many objects wait for a retry of their own.
    pub fn retrying(&self, objects: usize) {
        self.metrics.set_apply_retrying(objects);
    }

    /// One object's state, after it was applied alone.
    pub fn object(&self, key: ObjectKey, status: ObjectStatus) {
        self.status.send_modify(|s| {
            s.objects.insert(key, status);
        });
    }

    /// Why and when an object is tried again, in its status (when the status has it).
    pub fn object_message(&self, key: &ObjectKey, message: String) {
        self.status.send_if_modified(|status| {
            let Some(object) = status.objects.get_mut(key) else {
                return false;
            };
            object.message = message;
            true
        });
    }

    /// Copies the healer's drift records into the status and counts the objects by state for the metrics —
    /// each only after it changed: this runs after every watch event, and both are as long as the release
    /// (up to a thousand records, every object).
    pub fn publish_drift(&mut self, healer: &Healer) {
        let revision = healer.records_revision();
        if self.records != Some(revision) {
            self.records = Some(revision);
            self.status
                .send_modify(|status| status.drift = healer.records());
        }
        if self.seen.has_changed().unwrap_or(false) {
            let counts = self.seen.borrow_and_update().counts();
            self.metrics.set_objects(&counts);
        }
    }
}
