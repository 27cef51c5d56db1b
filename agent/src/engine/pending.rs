//! A verified release that waits for this cluster's rollout wave. It is held in memory, not persisted: the
//! last known good stays what is enforced and healed, and a restart simply verifies it again and recomputes
//! the same signed schedule. The wave gate task ([`crate::gates::wave::run`]) says when it may be taken; the
//! server watcher ([`crate::gates::wave::watch_server`]) runs beside it only when an earlier wave has
//! `gate: healthy`. A newer control of the same serial (halt, resume) reaches the gate through its plan.

use std::time::Duration;

use jiff::Timestamp;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{info, warn};
use windvane_shared::release::AcceptedRelease;
use windvane_shared::rollout::ChangeSummary;

use super::{AbortOnDrop, Engine};
use crate::fetch::fetcher::NewRelease;
use crate::gates::approval::{self, ApprovalSource};
use crate::gates::wave::{self, GateEvent, GatePlan};

/// Longest time between two reads of the server's rollout view by a waiting agent.
const GATE_READ_EVERY: Duration = Duration::from_secs(5);

/// A release waiting for its wave, with the tasks that watch for it.
#[derive(Debug)]
pub(super) struct Pending {
    release: NewRelease,
    /// What taking it would change here, worked out once when it is held.
    changes: ChangeSummary,
    plan: watch::Sender<GatePlan>,
    pub(super) events: mpsc::Receiver<GateEvent>,
    _tasks: Vec<AbortOnDrop>,
}

impl Engine {
    /// This cluster's gate plan for a verified release: `None` when it takes it at once.
    pub(super) fn gate_plan(&self, release: &NewRelease) -> Option<GatePlan> {
        let labels = &self.config.identity.labels;
        let windows = crate::gates::windows::changed_app_windows(
            &self.enforced_apps,
            &release.bundle,
            labels,
        );
        GatePlan::for_release(
            &release.accepted,
            &self.config.identity.name,
            labels,
            windows,
            self.config.require_approvals,
        )
    }

    /// Holds a verified release until its wave opens, replacing any release held before. The fetcher is told
    /// it was taken, so that it does not fetch it again.
    pub(super) fn hold(&mut self, mut release: NewRelease, plan: GatePlan) {
        info!(
            serial = plan.serial,
            wave = plan.wave + 1,
            approval = plan.approval.is_some(),
            "a new release waits for its approval or this cluster's rollout wave; enforcing the last known good"
        );
        let (taken_tx, _) = oneshot::channel();
        let taken = std::mem::replace(&mut release.taken, taken_tx);
        let _ = taken.send(true);
        self.metrics.source_fetch("ok");
        let changes = crate::gates::preview::change_summary(
            &self.inventory,
            release.bundle.clone(),
            &self.config.identity,
        );
        info!(
            serial = plan.serial,
            create = changes.create,
            update = changes.update,
            prune = changes.prune,
            "what the held release would change here"
        );
        let needs_server = plan.needs_server();
        // The server is asked only from one read before the wave's signed time on (so that its view is
        // there when the time comes): before it, the schedule alone holds the wave.
        let every = self.config.poll_interval.min(GATE_READ_EVERY);
        let opens_at = windvane_shared::rollout::opens_at(&plan.rollout, plan.issued_at, plan.wave);
        let not_before = Duration::try_from(opens_at.duration_since(Timestamp::now()))
            .unwrap_or(Duration::ZERO)
            .saturating_sub(every);
        let approval = plan.approval.clone();
        let (plan_tx, plan_rx) = watch::channel(plan);
        let (seen_tx, seen_rx) = watch::channel(None);
        let (approvals_tx, approvals_rx) = watch::channel(None);
        let (events_tx, events) = mpsc::channel(4);
        let mut tasks = vec![AbortOnDrop(tokio::spawn(wave::run(
            plan_rx,
            seen_rx,
            approvals_rx,
            events_tx,
            Timestamp::now(),
        )))];
        match approval {
            Some(need) => {
                let source = ApprovalSource {
                    source_url: self.config.source_url.clone(),
                    approvers: self.config.approvers.clone(),
                    every: self.config.poll_interval.min(GATE_READ_EVERY),
                    metrics: self.metrics.clone(),
                };
                tasks.push(AbortOnDrop(tokio::spawn(approval::watch_store(
                    source,
                    need,
                    approvals_tx,
                ))));
            }
            // Keeps the gate's approvals channel open (the plan needs none, so it is never read).
            None => tasks.push(AbortOnDrop(tokio::spawn(async move {
                approvals_tx.closed().await;
            }))),
        }
        if needs_server {
            tasks.push(AbortOnDrop(tokio::spawn(wave::watch_server(
                self.config.rollout_server.clone(),
                self.config.channel.clone(),
                every,
                not_before,
                seen_tx,
            ))));
        }
        self.pending = Some(Pending {
            release,
            changes,
            plan: plan_tx,
            events,
            _tasks: tasks,
        });
    }

    /// The fetcher verified the pointer of the serial already held or enforced: a newer control (halt,
    /// resume) of a held release goes to its gate.
    pub(super) fn on_control(&mut self, accepted: &AcceptedRelease) {
        let Some(pending) = &self.pending else {
            return;
        };
        let Some(rollout) = accepted.pointer.rollout.as_ref() else {
            return;
        };
        pending.plan.send_if_modified(|plan| {
            let newer =
                plan.serial == accepted.pointer.serial && rollout.control > plan.rollout.control;
            if newer {
                info!(
                    serial = plan.serial,
                    halted = rollout.halted,
                    "the rollout's control changed"
                );
                plan.rollout = rollout.clone();
            }
            newer
        });
    }

    /// Publishes why the held release waits, with what taking it would change here (status, heartbeat).
    fn report_pending(&self, mut report: windvane_shared::rollout::PendingReport) {
        report.changes = self.pending.as_ref().map(|p| p.changes);
        self.status
            .send_modify(|status| status.source.pending = Some(report));
    }

    /// What the gate said: report the wait, or take the release.
    pub(super) async fn on_gate(&mut self, event: GateEvent) -> bool {
        match event {
            GateEvent::Waiting(report) => {
                info!(serial = report.serial, wave = report.wave, message = %report.message, "waiting for the rollout wave");
                if let Some(progress) = report.approval {
                    self.metrics
                        .set_approvals(progress.threshold, progress.approved);
                } else {
                    self.metrics.set_approvals(0, 0);
                    self.metrics.set_rollout_wave(report.wave, true);
                }
                self.report_pending(report);
                false
            }
            GateEvent::Window(report) => {
                info!(serial = report.serial, message = %report.message, "waiting for a maintenance window");
                self.metrics.set_rollout_wave(0, false);
                self.metrics.set_approvals(0, 0);
                self.metrics.set_window_waiting(true);
                self.report_pending(report);
                false
            }
            GateEvent::Open(serial) => {
                let Some(pending) = self.pending.take() else {
                    return false;
                };
                if pending.release.accepted.pointer.serial != serial {
                    self.pending = Some(pending);
                    return false;
                }
                if pending.release.accepted.pointer.expires_at <= Timestamp::now() {
                    warn!(
                        serial,
                        "the held release expired before its wave opened; not taking it"
                    );
                    return false;
                }
                info!(serial, "the rollout wave opened; taking the release");
                self.metrics.set_rollout_wave(0, false);
                self.metrics.set_approvals(0, 0);
                self.metrics.set_window_waiting(false);
                self.accept(pending.release).await
            }
        }
    }
}

/// The next event of the held release's gate; never, when nothing is held.
pub(super) async fn next_gate_event(pending: &mut Option<Pending>) -> Option<GateEvent> {
    match pending {
        Some(pending) => pending.events.recv().await,
        None => std::future::pending().await,
    }
}
