//! The gates stage's state: a verified release that waits for this cluster's rollout wave, approvals or
//! maintenance windows, and what the gates need to know of the enforced release. A held release is kept in
//! memory, not persisted: the last known good stays what is enforced and healed, and a restart simply
//! verifies it again and recomputes the same signed schedule. The wave gate task ([`crate::gates::wave::run`])
//! says when it may be taken; the server watcher ([`crate::gates::wave::watch_server`]) runs beside it only
//! when an earlier wave has `gate: healthy`. A newer control of the same serial (halt, resume) reaches the gate
//! through its plan.
//!
//! The engine's loop hands [`Gates`] each verified release and each event of the gate, and gets back values:
//! the plan to hold a release by ([`Gates::plan`]), and a [`GateStep`] — what to report while it waits (with
//! the [`crate::gates::preview`] of what it would change here), or the release to take. The loop reports and
//! takes; nothing here writes the status or the metrics.

use std::time::Duration;

use jiff::Timestamp;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{info, warn};
use windvane_shared::format::release::AcceptedRelease;
use windvane_shared::wire::heartbeat::ChangeSummary;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use windvane_shared::crypto::keys::TrustedKeys;
use windvane_shared::decide::render::ClusterIdentity;
use windvane_shared::wire::heartbeat::PendingReport;

use crate::apply::inventory::Inventory;
use crate::engine::AbortOnDrop;
use crate::fetch::fetcher::NewRelease;
use crate::gates::approval::{self, ApprovalSource};
use crate::gates::wave::{self, GateEvent, GatePlan, GateServer};
use crate::report::metrics::Metrics;

/// Longest time between two reads of the server's rollout view by a waiting agent.
const GATE_READ_EVERY: Duration = Duration::from_secs(5);

/// What the gates need of the agent's configuration.
#[derive(Debug, Clone)]
pub struct GateSettings {
    pub identity: ClusterIdentity,
    /// The operator's floor of approvals (`--require-approvals`).
    pub require_approvals: u32,
    /// The store, where the approval files are.
    pub source_url: String,
    pub channel: String,
    pub approvers: TrustedKeys,
    pub poll_interval: Duration,
    /// Where a `gate: healthy` reads the rollout view.
    pub rollout_server: Option<GateServer>,
    /// The approval watcher counts its reads.
    pub metrics: Arc<Metrics>,
}

/// The gates stage's state in the engine.
#[derive(Debug)]
pub struct Gates {
    settings: GateSettings,
    /// A verified release waiting for this cluster's rollout wave.
    pending: Option<Pending>,
    /// The digest of each app with windows of the enforced release ([`crate::gates::windows::app_digests`]):
    /// a new release's maintenance windows hold it only for the apps it changes.
    enforced_apps: BTreeMap<String, String>,
    /// The apps whose drift is only reported now, in a `heal: report` deny window.
    report_only: BTreeSet<String>,
}

/// What the loop does after an event of the gate.
#[derive(Debug)]
pub enum GateStep {
    /// Nothing (an event of a release no longer held).
    Nothing,
    /// The release waits for its approvals or its wave: report why, with what it would change here.
    Waiting(PendingReport),
    /// The release waits for a maintenance window: report why.
    Window(PendingReport),
    /// The gate opened on a release that expired meanwhile: it is dropped.
    Expired(u64),
    /// The gate opened: take the release.
    Open(Box<NewRelease>),
}

/// A release waiting for its wave, with the tasks that watch for it.
#[derive(Debug)]
struct Pending {
    release: NewRelease,
    /// What taking it would change here, worked out once when it is held.
    changes: ChangeSummary,
    plan: watch::Sender<GatePlan>,
    events: mpsc::Receiver<GateEvent>,
    _tasks: Vec<AbortOnDrop>,
}

impl Gates {
    /// Nothing held, no release enforced yet.
    pub fn new(settings: GateSettings) -> Self {
        Self {
            settings,
            pending: None,
            enforced_apps: BTreeMap::new(),
            report_only: BTreeSet::new(),
        }
    }

    /// This cluster's gate plan for a verified release: `None` when it takes it at once.
    pub fn plan(&self, release: &NewRelease) -> Option<GatePlan> {
        let labels = &self.settings.identity.labels;
        let windows = crate::gates::windows::changed_app_windows(
            &self.enforced_apps,
            &release.bundle,
            labels,
        );
        GatePlan::for_release(
            &release.accepted,
            &self.settings.identity.name,
            labels,
            windows,
            self.settings.require_approvals,
        )
    }

    /// A release is enforced now: `apps` are the digests of its apps with windows.
    pub fn enforcing(&mut self, apps: BTreeMap<String, String>) {
        self.enforced_apps = apps;
    }

    /// Drops the held release (a newer one is taken, or its gate stopped).
    pub fn drop_held(&mut self) {
        self.pending = None;
    }

    /// The apps a deny window holds to reporting now are `report_only`: returns those whose window just
    /// ended, which heal again by their own policy.
    pub fn report_only_now(&mut self, report_only: BTreeSet<String>) -> BTreeSet<String> {
        let ended = self.report_only.difference(&report_only).cloned().collect();
        self.report_only = report_only;
        ended
    }

    /// Holds a verified release until its wave opens, replacing any release held before. The fetcher is told
    /// it was taken, so that it does not fetch it again. `inventory` is what Windvane last applied here, for
    /// the preview of what the release would change.
    pub fn hold(&mut self, mut release: NewRelease, plan: GatePlan, inventory: &Inventory) {
        info!(
            serial = plan.serial,
            wave = plan.wave + 1,
            approval = plan.approval.is_some(),
            "a new release waits for its approval or this cluster's rollout wave; enforcing the last known good"
        );
        let (taken_tx, _) = oneshot::channel();
        let taken = std::mem::replace(&mut release.taken, taken_tx);
        let _ = taken.send(true);
        let changes = crate::gates::preview::change_summary(
            inventory,
            release.bundle.clone(),
            &self.settings.identity,
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
        let every = self.settings.poll_interval.min(GATE_READ_EVERY);
        let opens_at =
            windvane_shared::decide::rollout::opens_at(&plan.rollout, plan.issued_at, plan.wave);
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
                    source_url: self.settings.source_url.clone(),
                    approvers: self.settings.approvers.clone(),
                    every: self.settings.poll_interval.min(GATE_READ_EVERY),
                    metrics: self.settings.metrics.clone(),
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
                self.settings.rollout_server.clone(),
                self.settings.channel.clone(),
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
    pub fn on_control(&mut self, accepted: &AcceptedRelease) {
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

    /// What the gate said: the report of the wait (with what taking the release would change here), or the
    /// release to take.
    pub fn on_gate(&mut self, event: GateEvent) -> GateStep {
        match event {
            GateEvent::Waiting(report) => {
                info!(serial = report.serial, wave = report.wave, message = %report.message, "waiting for the rollout wave");
                GateStep::Waiting(self.with_changes(report))
            }
            GateEvent::Window(report) => {
                info!(serial = report.serial, message = %report.message, "waiting for a maintenance window");
                GateStep::Window(self.with_changes(report))
            }
            GateEvent::Open(serial) => {
                let Some(pending) = self.pending.take() else {
                    return GateStep::Nothing;
                };
                if pending.release.accepted.pointer.serial != serial {
                    self.pending = Some(pending);
                    return GateStep::Nothing;
                }
                if pending.release.accepted.pointer.expires_at <= Timestamp::now() {
                    warn!(
                        serial,
                        "the held release expired before its wave opened; not taking it"
                    );
                    return GateStep::Expired(serial);
                }
                info!(serial, "the rollout wave opened; taking the release");
                GateStep::Open(Box::new(pending.release))
            }
        }
    }

    /// `report` with what taking the held release would change here (status, heartbeat).
    fn with_changes(&self, mut report: PendingReport) -> PendingReport {
        report.changes = self.pending.as_ref().map(|p| p.changes);
        report
    }

    /// The next event of the held release's gate; never, when nothing is held.
    pub async fn next_event(&mut self) -> Option<GateEvent> {
        match &mut self.pending {
            Some(pending) => pending.events.recv().await,
            None => std::future::pending().await,
        }
    }
}
