//! Drift handling: the engine hands every watch event on a managed object to the [`Healer`], which asks its
//! pure [`machine::DriftMachine`] what policy says — revert at once (or after the grace period), only report
//! (selfHeal false), leave it held (`windvane.io/hold-until`), or stop fighting a manager that keeps taking
//! the same field (Contested, with a growing back-off) — and carries the answer out: server-side apply on the
//! [`Cluster`], Kubernetes Events on the object, the object's state in the agent's status, the drift metrics
//! (detected, reverted and the time to repair, counted as the actions are carried out; Contested and Held
//! objects, read from the machine after each batch). The machine keeps the drift records the heartbeat
//! carries; this executor is the only part that talks to the API.

pub mod cli;
pub mod compare;
pub mod diff;
pub mod drift;
pub mod handover;
pub mod machine;
pub mod revert_request;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder, Reporter};
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::{Instrument, info, info_span, warn};
use windvane_shared::wire::heartbeat::DriftRecord;

use crate::apply::desired::Desired;
use crate::apply::inventory::ObjectKey;
use crate::apply::run_once::{Finished, RunOnce};
use crate::heal::drift::{Baseline, ContestTracker};
use crate::kube::cluster::Cluster;
use crate::live::watch::LiveCache;
use crate::report::metrics::Metrics;
use crate::report::status::StatusTx;
use machine::{Action, Cause, DRIFT_DETECTED, DriftMachine, Now};

/// Watches over the managed objects' owned fields and heals drift by policy.
pub struct Healer {
    cluster: Cluster,
    live: LiveCache,
    machine: DriftMachine,
    metrics: Arc<Metrics>,
    /// Events go out in order from a background task, so emitting one never delays a revert.
    events: mpsc::UnboundedSender<(Event, ObjectReference)>,
    /// Run-once objects done for the body the release gives them ([`crate::apply::run_once`]): their absence is
    /// not drift.
    done: HashMap<ObjectKey, Finished>,
}

impl std::fmt::Debug for Healer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Healer")
            .field("machine", &self.machine)
            .finish_non_exhaustive()
    }
}

impl Healer {
    /// A healer reporting Events as `windvane-agent` instance `identity`, and drift on `metrics`.
    pub fn new(
        cluster: Cluster,
        live: LiveCache,
        identity: &str,
        hold_cap: Duration,
        contest: ContestTracker,
        metrics: Arc<Metrics>,
    ) -> Self {
        let reporter = Reporter {
            controller: "windvane-agent".to_owned(),
            instance: Some(identity.to_owned()),
        };
        let recorder = Recorder::new(cluster.client().clone(), reporter);
        let (events, mut queue) = mpsc::unbounded_channel::<(Event, ObjectReference)>();
        tokio::spawn(async move {
            while let Some((event, reference)) = queue.recv().await {
                if let Err(error) = recorder.publish(&event, &reference).await {
                    warn!(%error, reason = %event.reason, "cannot emit the Event");
                }
            }
        });
        Self {
            cluster,
            live,
            machine: DriftMachine::new(hold_cap, contest),
            metrics,
            events,
            done: HashMap::new(),
        }
    }

    /// The run-once objects done for the body they have now (from the inventory, after each sync).
    pub fn set_done(&mut self, done: impl IntoIterator<Item = (ObjectKey, Finished)>) {
        self.done = done.into_iter().collect();
    }

    /// A run-once object just finished: from now on its absence is not drift.
    pub fn mark_done(&mut self, key: &ObjectKey, how: Finished) {
        self.done.insert(key.clone(), how);
    }

    /// How a managed object runs once, if it does.
    pub fn run_once(&self, key: &ObjectKey) -> Option<RunOnce> {
        self.machine.desired(key).and_then(|d| d.run_once)
    }

    /// One more object of the release to watch over (a failed object that landed on a retry of its own).
    pub fn add_desired(&mut self, object: Desired) {
        self.machine.insert_desired(object);
    }

    /// A done run-once object found gone: reported, not healed. True when that is what `key` is.
    fn gone_and_done(&self, key: &ObjectKey, live: Option<&Value>, status: &StatusTx) -> bool {
        let Some(how) = self.done.get(key).copied().filter(|_| live.is_none()) else {
            return false;
        };
        status.send_if_modified(|status| {
            let Some(object) = status.objects.get_mut(key) else {
                return false;
            };
            object.state = windvane_shared::wire::status::SyncState::Synced;
            object.message = how.gone_message();
            true
        });
        true
    }

    /// The objects of the release now enforced, as applied; drift is judged against these.
    pub fn set_desired(&mut self, objects: impl IntoIterator<Item = Desired>) {
        self.machine.set_desired(objects);
        self.publish_open();
    }

    /// Records what a release's apply returned: the fields Windvane owns from now on. A held change it
    /// ended is closed on its record (taken in, or replaced), with an Event saying which.
    pub async fn applied(&mut self, key: &ObjectKey, baseline: Baseline) {
        let was_drifting = self.machine.is_drifting(key);
        // Only a held change (rare) needs the object after the write, to tell taken in from replaced. The
        // apply's response is in the cache, unless a lagging watch event replaced it meanwhile: only an
        // object at least as new as the write shows what the write left; else it is read.
        let fresh = |live: &Value| drift::resource_version(live) >= baseline.resource_version;
        let live = if self.machine.is_held(key) {
            match self.live.get(key).filter(fresh) {
                Some(live) => Some(live),
                None => self.fetch(key).await.filter(fresh),
            }
        } else {
            None
        };
        let actions = self
            .machine
            .applied(key, baseline, live.as_ref(), Now::current());
        for action in actions {
            // A release's write only ends drift: the machine answers with Events alone.
            if let Action::Event {
                key,
                uid,
                kind,
                reason,
                note,
            } = action
            {
                self.event(&key, uid, kind, reason, note);
            }
        }
        if was_drifting {
            self.publish_open();
        }
    }

    /// The Contested and Held gauges, from the open episodes.
    fn publish_open(&self) {
        let (contested, held) = self.machine.contested_and_held();
        self.metrics.set_drift_open(contested, held);
    }

    /// True when an apply's baseline is known for `key`.
    pub fn has_baseline(&self, key: &ObjectKey) -> bool {
        self.machine.has_baseline(key)
    }

    /// Takes an object left unwritten as it is live: judged against what it shows now.
    pub fn adopt(&mut self, key: &ObjectKey, baseline: Baseline) {
        self.machine.adopt(key, baseline);
    }

    /// Every managed object's key.
    pub fn keys(&self) -> Vec<ObjectKey> {
        self.machine.keys()
    }

    /// The app a managed object belongs to.
    pub fn app_of(&self, key: &ObjectKey) -> Option<&str> {
        self.machine.desired(key).map(|d| d.app.as_str())
    }

    /// True while drift on `key` is open.
    pub fn is_drifting(&self, key: &ObjectKey) -> bool {
        self.machine.is_drifting(key)
    }

    /// The earliest pending re-check (grace, hold or back-off ending).
    pub fn next_timer(&self) -> Option<std::time::Instant> {
        self.machine
            .next_timer()
            .map(tokio::time::Instant::into_std)
    }

    /// Drift records, newest last.
    pub fn records(&self) -> Vec<DriftRecord> {
        self.machine.records()
    }

    /// Changes whenever a drift record is made or changed.
    pub fn records_revision(&self) -> u64 {
        self.machine.records_revision()
    }

    /// Re-checks the objects whose timers are due.
    pub async fn on_timers(&mut self, status: &StatusTx) {
        for key in self.machine.due(tokio::time::Instant::now()) {
            self.evaluate(&key, status, Cause::Timer).await;
        }
    }

    /// A watch saw `key` change (or vanish).
    pub async fn on_change(&mut self, key: &ObjectKey, status: &StatusTx) {
        self.evaluate(key, status, Cause::Watch).await;
    }

    async fn evaluate(&mut self, key: &ObjectKey, status: &StatusTx, cause: Cause) {
        let Some(desired) = self.machine.desired(key) else {
            return;
        };
        let span = info_span!("drift", object = %desired.id, app = %desired.app);
        let live = self.live.get(key);
        if self.gone_and_done(key, live.as_ref(), status) {
            span.in_scope(|| info!("run-once object finished and removed; not recreated"));
            return;
        }
        let actions = span.in_scope(|| {
            self.machine
                .on_event(key, live.as_ref(), Now::current(), cause)
        });
        self.execute(actions, status).instrument(span).await;
    }

    /// Carries out the machine's actions in order; a revert's outcome goes back to the machine, whose answer
    /// is carried out next.
    async fn execute(&mut self, actions: Vec<Action>, status: &StatusTx) {
        let mut queue = VecDeque::from(actions);
        while let Some(action) = queue.pop_front() {
            match action {
                Action::Event {
                    key,
                    uid,
                    kind,
                    reason,
                    note,
                } => {
                    if reason == DRIFT_DETECTED {
                        let manager = self
                            .machine
                            .open_drift(&key)
                            .and_then(|r| r.manager.as_deref());
                        self.metrics.drift_detected(&key.kind, manager);
                    }
                    self.event(&key, uid, kind, reason, note);
                }
                Action::SetState {
                    key,
                    state,
                    message,
                } => {
                    status.send_if_modified(|status| {
                        let Some(object) = status.objects.get_mut(&key) else {
                            return false;
                        };
                        object.state = state;
                        object.message = message;
                        true
                    });
                }
                Action::Revert { key, fields } => queue.extend(self.revert(&key, &fields).await),
                Action::SpendApproval { key, patch } => {
                    self.annotate(
                        &key,
                        &patch,
                        "break-glass approval spent: a further change needs the revert first",
                    )
                    .await
                }
                Action::RememberHold { key, patch } => {
                    self.annotate(
                        &key,
                        &patch,
                        "hold first seen: its cap runs from now, across restarts",
                    )
                    .await
                }
                Action::RevertUnlessUndone { key, fields } => {
                    let follow = match self.live.get(&key) {
                        Some(live) if self.matches_release(&key, &live).await => {
                            self.machine.undone(&key, &live)
                        }
                        _ => self.revert(&key, &fields).await,
                    };
                    queue.extend(follow);
                }
            }
        }
        self.publish_open();
    }

    /// True when applying the release would change nothing on `live` (a server-side dry run, compared as the
    /// backstop compares). False when it cannot tell: then the drift is reverted.
    async fn matches_release(&self, key: &ObjectKey, live: &Value) -> bool {
        match self.dry_run(key).await {
            Some(dry_run) => !compare::would_change(Some(live), &dry_run),
            None => false,
        }
    }

    async fn dry_run(&self, key: &ObjectKey) -> Option<Value> {
        let desired = self.machine.desired(key)?;
        let id = &desired.id;
        let resolved = self.cluster.resolve(&id.api_version, &id.kind).await.ok()?;
        self.cluster
            .apply(id, &resolved, desired.raw_body(), true)
            .await
            .ok()
    }

    /// The backstop: a server-side-apply dry run of every managed object, compared with live state, catching
    /// whatever the watches missed (a write made under Windvane's own field manager, say). Differences are
    /// recorded as drift and re-applied, unless held or reported-only. Returns how many objects differed.
    pub async fn backstop(&mut self, status: &StatusTx) -> usize {
        let mut differing = 0;
        let keys = self.machine.keys();
        let objects = keys.len();
        for key in keys {
            if self.machine.is_drifting(&key) {
                continue;
            }
            let Some(desired) = self.machine.desired(&key) else {
                continue;
            };
            let span = info_span!("backstop", object = %desired.id, app = %desired.app);
            let live = match self.live.get(&key) {
                Some(live) => Some(live),
                None => self.fetch(&key).await,
            };
            if self.gone_and_done(&key, live.as_ref(), status) {
                continue;
            }
            let Some(dry_run) = self.dry_run(&key).await else {
                continue;
            };
            if !compare::would_change(live.as_ref(), &dry_run) {
                if let Some(live) = &live {
                    self.machine.confirmed(&key, live);
                }
                continue;
            }
            differing += 1;
            let actions = span.in_scope(|| {
                self.machine
                    .on_backstop_drift(&key, live.as_ref(), Now::current())
            });
            self.execute(actions, status).instrument(span).await;
        }
        info!(objects, differing, "backstop finished");
        differing
    }

    /// The object from the API server, when the watch cache does not hold it.
    async fn fetch(&self, key: &ObjectKey) -> Option<Value> {
        let id = &self.machine.desired(key)?.id;
        let resolved = self.cluster.resolve(&id.api_version, &id.kind).await.ok()?;
        self.cluster.get(id, &resolved).await.ok().flatten()
    }

    /// Marks a break-glass approval spent on the object (the agent is exempt from the policy that keeps
    /// everyone else from writing the mark).
    /// Merge-patches annotations the agent keeps on a managed object (`done` says what the write means, for
    /// the log); a failure is logged, not retried: the next look writes it again.
    async fn annotate(&self, key: &ObjectKey, patch: &Value, done: &'static str) {
        let Some(desired) = self.machine.desired(key) else {
            return;
        };
        let id = &desired.id;
        let Ok(resolved) = self.cluster.resolve(&id.api_version, &id.kind).await else {
            return;
        };
        match self.cluster.merge_patch(id, &resolved, patch).await {
            Ok(_) => info!(object = %id, "{done}"),
            Err(failure) => {
                warn!(object = %id, error = %failure.message, patch = %patch, "cannot write an annotation the agent keeps")
            }
        }
    }

    /// Writes the release's object back; the machine's answer to the outcome comes back.
    async fn revert(&mut self, key: &ObjectKey, fields: &[String]) -> Vec<Action> {
        let Some(desired) = self.machine.desired(key) else {
            return Vec::new();
        };
        let id = &desired.id;
        // A break-glass change ends with its revert: its approval is not to be used again. A manual revert
        // request is consumed by it.
        let clear = self.live.get(key).and_then(|live| {
            let break_glass =
                desired.prevent && crate::prevent::policy::break_glass(&live).is_some();
            let requested = revert_request::requested_by(&live).is_some();
            match (break_glass, requested) {
                (false, false) => None,
                (true, false) => Some(crate::prevent::policy::clear_break_glass()),
                (false, true) => Some(revert_request::clear()),
                (true, true) => {
                    let mut patch = crate::prevent::policy::clear_break_glass();
                    patch["metadata"]["annotations"][revert_request::REVERT_ANNOTATION] =
                        Value::Null;
                    Some(patch)
                }
            }
        });
        let written = match self.cluster.resolve(&id.api_version, &id.kind).await {
            Ok(resolved) => {
                let applied = self
                    .cluster
                    .apply(id, &resolved, desired.raw_body(), false)
                    .await;
                match (applied, &clear) {
                    (Ok(_), Some(patch)) => {
                        info!("reverted; clearing the break-glass or revert request annotations");
                        self.cluster.merge_patch(id, &resolved, patch).await
                    }
                    (applied, _) => applied,
                }
                .map_err(|failure| failure.message)
            }
            Err(error) => Err(error.to_string()),
        };
        match written {
            Ok(live) => {
                self.live.observe(&live);
                let now = Now::current();
                self.metrics
                    .drift_reverted(self.machine.drift_age(key, now.at));
                self.machine.reverted(key, &live, fields, now)
            }
            Err(message) => self.machine.revert_failed(key, &message, Now::current()),
        }
    }

    fn event(
        &self,
        key: &ObjectKey,
        uid: Option<String>,
        kind: kube::runtime::events::EventType,
        reason: &str,
        note: String,
    ) {
        let Some(desired) = self.machine.desired(key) else {
            return;
        };
        let reference = ObjectReference {
            api_version: Some(desired.id.api_version.clone()),
            kind: Some(desired.id.kind.clone()),
            name: Some(desired.id.name.clone()),
            namespace: desired.id.namespace.clone(),
            uid,
            ..ObjectReference::default()
        };
        let event = Event {
            type_: kind,
            reason: reason.to_owned(),
            note: Some(note),
            action: "Reconcile".to_owned(),
            secondary: None,
        };
        let _ = self.events.send((event, reference));
    }
}
