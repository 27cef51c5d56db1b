//! Drift handling: the engine hands every watch event on a managed object to the [`Healer`], which decides
//! with [`crate::drift`] whether Windvane's fields were taken or the object deleted, records who did it, and
//! acts by policy — revert at once (or after the grace period), only report (selfHeal false), leave it held
//! (`windvane.io/hold-until`), or stop fighting a manager that keeps taking the same field (Contested, with a
//! growing back-off). It emits Kubernetes Events on the object and keeps drift records for the heartbeat.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::{Instrument, info, info_span, warn};
use windvane_shared::heartbeat::{DriftAction, DriftRecord};
use windvane_shared::status::SyncState;

use crate::cluster::Cluster;
use crate::desired::Desired;
use crate::drift::{self, Attribution, Baseline, ContestTracker, resource_version};
use crate::health::assess;
use crate::inventory::ObjectKey;
use crate::report::{StatusTx, object_state};
use crate::watch::LiveCache;

/// Most drift records kept in memory for the heartbeat and `/status`.
const MAX_DRIFT_RECORDS: usize = 1_000;

/// One drift of one object, from detection until it is reverted or goes away.
#[derive(Debug, Clone)]
struct Episode {
    record: usize,
    phase: Phase,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting out the drift grace period.
    Grace(Instant),
    /// An operator holds the object.
    Held(Instant),
    /// Not fighting another manager until then.
    Contested(Instant),
    /// Reported only (selfHeal false).
    Reported,
    /// Reverting failed; retry then.
    Retry(Instant),
}

/// Watches over the managed objects' owned fields and heals drift by policy.
pub struct Healer {
    cluster: Cluster,
    live: LiveCache,
    desired: HashMap<ObjectKey, Desired>,
    /// Fields Windvane owned after its last apply, and that apply's resourceVersion.
    baseline: HashMap<ObjectKey, Baseline>,
    episodes: HashMap<ObjectKey, Episode>,
    contest: ContestTracker,
    timers: BTreeMap<Instant, BTreeSet<ObjectKey>>,
    /// Events go out in order from a background task, so emitting one never delays a revert.
    events: mpsc::UnboundedSender<(Event, ObjectReference)>,
    records: VecDeque<DriftRecord>,
    hold_cap: Duration,
}

impl std::fmt::Debug for Healer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Healer")
            .field("objects", &self.desired.len())
            .field("drifting", &self.episodes.len())
            .finish()
    }
}

impl Healer {
    /// A healer reporting Events as `windvane-agent` instance `identity`.
    pub fn new(
        cluster: Cluster,
        live: LiveCache,
        identity: &str,
        hold_cap: Duration,
        contest: ContestTracker,
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
            desired: HashMap::new(),
            baseline: HashMap::new(),
            episodes: HashMap::new(),
            contest,
            timers: BTreeMap::new(),
            events,
            records: VecDeque::new(),
            hold_cap,
        }
    }

    /// The objects of the release now enforced, as applied; drift is judged against these.
    pub fn set_desired(&mut self, objects: impl IntoIterator<Item = Desired>) {
        self.desired = objects
            .into_iter()
            .map(|o| (ObjectKey::of(&o.id), o))
            .collect();
        self.baseline
            .retain(|key, _| self.desired.contains_key(key));
        self.episodes
            .retain(|key, _| self.desired.contains_key(key));
        let desired = &self.desired;
        self.contest.retain(|key| desired.contains_key(key));
    }

    /// Records what an apply returned: the fields Windvane owns from now on.
    pub fn applied(&mut self, key: &ObjectKey, baseline: Baseline) {
        self.baseline.insert(key.clone(), baseline);
        // Windvane just wrote the object as the release says: whatever drift was open is over.
        self.episodes.remove(key);
    }

    /// True when an apply's baseline is known for `key` (always, but after a restart until the object is
    /// written or adopted).
    pub fn has_baseline(&self, key: &ObjectKey) -> bool {
        self.baseline.contains_key(key)
    }

    /// Takes an object left unwritten as it is live: judged against what it shows now.
    pub fn adopt(&mut self, key: &ObjectKey, baseline: Baseline) {
        self.baseline.entry(key.clone()).or_insert(baseline);
    }

    /// True while drift on `key` is open (held, contested, in grace, or failing to revert).
    pub fn is_drifting(&self, key: &ObjectKey) -> bool {
        self.episodes.contains_key(key)
    }

    /// The earliest pending re-check (grace, hold or back-off ending).
    pub fn next_timer(&self) -> Option<Instant> {
        self.timers.keys().next().copied()
    }

    /// Drift records, newest last.
    pub fn records(&self) -> Vec<DriftRecord> {
        self.records.iter().cloned().collect()
    }

    fn schedule(&mut self, key: &ObjectKey, at: Instant) {
        self.timers.entry(at).or_default().insert(key.clone());
    }

    /// Re-checks the objects whose timers are due.
    pub async fn on_timers(&mut self, status: &StatusTx) {
        let now = Instant::now();
        let due: Vec<Instant> = self.timers.range(..=now).map(|(at, _)| *at).collect();
        for at in due {
            for key in self.timers.remove(&at).unwrap_or_default() {
                self.evaluate(&key, status, true).await;
            }
        }
    }

    /// A watch saw `key` change (or vanish).
    pub async fn on_change(&mut self, key: &ObjectKey, status: &StatusTx) {
        self.evaluate(key, status, false).await;
    }

    async fn evaluate(&mut self, key: &ObjectKey, status: &StatusTx, from_timer: bool) {
        let Some(desired) = self.desired.get(key).cloned() else {
            return;
        };
        let span = info_span!("drift", object = %desired.id, app = %desired.app);
        self.judge(key, desired, status, from_timer)
            .instrument(span)
            .await;
    }

    async fn judge(
        &mut self,
        key: &ObjectKey,
        desired: Desired,
        status: &StatusTx,
        from_timer: bool,
    ) {
        let live = self.live.get(key);
        let now = Timestamp::now();
        let (lost, deleted) = match &live {
            None => (Vec::new(), true),
            Some(live) => {
                let Some(baseline) = self.baseline.get(key) else {
                    set_health(status, key, Some(live));
                    return;
                };
                // An event older than Windvane's last write says nothing about drift after it.
                if resource_version(live) < baseline.resource_version {
                    return;
                }
                let current = Baseline::of(live);
                let lost = drift::lost_fields(&baseline.owned, &current.owned);
                if lost.is_empty() {
                    if current.owned.is_superset(&baseline.owned) {
                        self.baseline.insert(key.clone(), current);
                    }
                    if self.episodes.remove(key).is_some() {
                        info!(object = %desired.id, "drift resolved by someone else");
                    }
                    set_health(status, key, Some(live));
                    return;
                }
                (lost, false)
            }
        };
        let attribution = live.as_ref().and_then(|l| drift::attribute(l, &lost));
        let fields: Vec<String> = lost.iter().map(|f| drift::readable(f)).collect();
        let new_episode = !self.episodes.contains_key(key);
        if new_episode {
            let record = self.record(&desired, &fields, deleted, attribution.as_ref(), now);
            self.episodes.insert(
                key.clone(),
                Episode {
                    record,
                    phase: Phase::Reported,
                },
            );
            let who = attribution.as_ref().map_or_else(
                || "someone".to_owned(),
                |a| format!("{} ({})", a.manager, a.operation),
            );
            let what = if deleted {
                "the object was deleted".to_owned()
            } else {
                format!("{} changed by {who}", fields.join(", "))
            };
            warn!(fields = ?fields, manager = attribution.as_ref().map(|a| a.manager.as_str()), deleted, "drift detected");
            self.event(
                &desired,
                live.as_ref(),
                EventType::Warning,
                "DriftDetected",
                &format!("drift: {what}"),
            );
        }
        let episode_phase = self.episodes.get(key).map(|e| e.phase);

        // An operator's hold wins over everything but deletion (a deleted object carries no hold).
        if let Some(live) = &live {
            match drift::hold_until(live, now, self.hold_cap) {
                Ok(Some(until)) => {
                    let setter = drift::hold_setter(live).unwrap_or_else(|| "unknown".to_owned());
                    let wait = until.duration_since(now).unsigned_abs();
                    if !matches!(episode_phase, Some(Phase::Held(_))) {
                        self.event(
                            &desired,
                            Some(live),
                            EventType::Normal,
                            "DriftHeld",
                            &format!(
                                "held by {setter} until {until}: drift is not reverted until then"
                            ),
                        );
                        self.set_action(key, DriftAction::Held);
                        info!(%until, %setter, "drift held");
                    }
                    let at = Instant::now() + wait;
                    self.set_phase(key, Phase::Held(at));
                    self.schedule(key, at);
                    set_state(
                        status,
                        key,
                        SyncState::Held,
                        format!("held by {setter} until {until}"),
                    );
                    return;
                }
                Ok(None) => {}
                Err(message) => warn!(%message, "ignoring a malformed hold"),
            }
        }
        if !desired.self_heal {
            set_state(
                status,
                key,
                SyncState::OutOfSync,
                format!(
                    "drift reported, not reverted (self-heal off): {}",
                    describe(&fields, deleted, attribution.as_ref())
                ),
            );
            return;
        }
        if let Some(Phase::Contested(until)) = episode_phase
            && Instant::now() < until
        {
            return;
        }
        if new_episode
            && !from_timer
            && let Some(who) = &attribution
            && let Some(backoff) = self.contest.record(key, &who.manager, now)
        {
            let at = Instant::now() + backoff;
            self.set_phase(key, Phase::Contested(at));
            self.set_action(key, DriftAction::Contested);
            self.schedule(key, at);
            let message = format!(
                "{} keeps taking {}; not reverting for {}s",
                who.manager,
                fields.join(", "),
                backoff.as_secs()
            );
            warn!(manager = %who.manager, backoff_s = backoff.as_secs(), "contested: backing off");
            self.event(
                &desired,
                live.as_ref(),
                EventType::Warning,
                "Contested",
                &message,
            );
            set_state(status, key, SyncState::Contested, message);
            return;
        }
        if let Some(grace) = desired.drift_grace_period.filter(|g| !g.is_zero())
            && new_episode
        {
            let at = Instant::now() + grace;
            self.set_phase(key, Phase::Grace(at));
            self.schedule(key, at);
            set_state(
                status,
                key,
                SyncState::OutOfSync,
                format!(
                    "drift, reverting after the grace period: {}",
                    describe(&fields, deleted, attribution.as_ref())
                ),
            );
            return;
        }
        if let Some(Phase::Grace(at) | Phase::Retry(at)) = episode_phase
            && Instant::now() < at
        {
            return;
        }
        // The grace period is there for changes that are taken back: one undone meanwhile (the object is as
        // the release says) needs no write. Its fields stay with whoever set them back; the backstop and
        // the object's next apply judge them by value.
        if let Some(Phase::Grace(_)) = episode_phase
            && let Some(live) = &live
            && self.matches_release(&desired, live).await
        {
            info!(fields = ?fields, "drift undone within the grace period; nothing to revert");
            self.episodes.remove(key);
            self.baseline.insert(key.clone(), Baseline::of(live));
            set_health(status, key, Some(live));
            return;
        }
        self.revert(key, &desired, status, &fields).await;
    }

    /// True when applying the release would change nothing on `live` (a server-side dry run, compared as the
    /// backstop compares). False when it cannot tell: then the drift is reverted.
    async fn matches_release(&self, desired: &Desired, live: &Value) -> bool {
        let Ok(resolved) = self
            .cluster
            .resolve(&desired.id.api_version, &desired.id.kind)
            .await
        else {
            return false;
        };
        self.cluster
            .apply(&desired.id, &resolved, &desired.body(), true)
            .await
            .is_ok_and(|dry_run| !crate::compare::would_change(Some(live), &dry_run))
    }

    /// The backstop: a server-side-apply dry run of every managed object, compared with live state, catching
    /// whatever the watches missed (a write made under Windvane's own field manager, say). Differences are
    /// recorded as drift and re-applied, unless held or reported-only. Returns how many objects differed.
    pub async fn backstop(&mut self, status: &StatusTx) -> usize {
        let mut differing = 0;
        let keys: Vec<ObjectKey> = self.desired.keys().cloned().collect();
        for key in keys {
            if self.episodes.contains_key(&key) {
                continue;
            }
            let Some(desired) = self.desired.get(&key).cloned() else {
                continue;
            };
            let Ok(resolved) = self
                .cluster
                .resolve(&desired.id.api_version, &desired.id.kind)
                .await
            else {
                continue;
            };
            let live = match self.live.get(&key) {
                Some(live) => Some(live),
                None => self
                    .cluster
                    .get(&desired.id, &resolved)
                    .await
                    .ok()
                    .flatten(),
            };
            let Ok(dry_run) = self
                .cluster
                .apply(&desired.id, &resolved, &desired.body(), true)
                .await
            else {
                continue;
            };
            if !crate::compare::would_change(live.as_ref(), &dry_run) {
                if let Some(live) = &live {
                    self.baseline.insert(key.clone(), Baseline::of(live));
                }
                continue;
            }
            differing += 1;
            let span = info_span!("backstop", object = %desired.id, app = %desired.app);
            async {
                warn!("backstop found drift the watches did not show");
                let now = Timestamp::now();
                let record = self.record(&desired, &[], live.is_none(), None, now);
                self.episodes.insert(
                    key.clone(),
                    Episode {
                        record,
                        phase: Phase::Reported,
                    },
                );
                self.event(
                    &desired,
                    live.as_ref(),
                    EventType::Warning,
                    "DriftDetected",
                    "drift found by the periodic backstop",
                );
                let held = live.as_ref().is_some_and(|l| {
                    matches!(drift::hold_until(l, now, self.hold_cap), Ok(Some(_)))
                });
                if desired.self_heal && !held {
                    self.revert(&key, &desired, status, &[]).await;
                } else {
                    set_state(
                        status,
                        &key,
                        SyncState::OutOfSync,
                        "drift found by the periodic backstop".to_owned(),
                    );
                }
            }
            .instrument(span)
            .await;
        }
        info!(objects = self.desired.len(), differing, "backstop finished");
        differing
    }

    async fn revert(
        &mut self,
        key: &ObjectKey,
        desired: &Desired,
        status: &StatusTx,
        fields: &[String],
    ) {
        let resolved = match self
            .cluster
            .resolve(&desired.id.api_version, &desired.id.kind)
            .await
        {
            Ok(resolved) => resolved,
            Err(error) => {
                warn!(%error, "cannot revert drift");
                return self.retry_later(key, status, error.to_string());
            }
        };
        match self
            .cluster
            .apply(&desired.id, &resolved, &desired.body(), false)
            .await
        {
            Ok(live) => {
                let now = Timestamp::now();
                if let Some(episode) = self.episodes.get(key)
                    && let Some(record) = self.records.get_mut(episode.record)
                {
                    record.reverted_at = Some(now);
                    record.action = DriftAction::Reverted;
                }
                self.live.observe(&live);
                self.applied(key, Baseline::of(&live));
                info!(fields = ?fields, "drift reverted");
                self.event(
                    desired,
                    Some(&live),
                    EventType::Normal,
                    "DriftReverted",
                    &format!(
                        "reverted {}",
                        if fields.is_empty() {
                            "the object to the release".to_owned()
                        } else {
                            fields.join(", ")
                        }
                    ),
                );
                set_health(status, key, Some(&live));
            }
            Err(failure) => {
                warn!(error = %failure.message, "cannot revert drift");
                self.retry_later(key, status, failure.message);
            }
        }
    }

    fn retry_later(&mut self, key: &ObjectKey, status: &StatusTx, message: String) {
        let at = Instant::now() + Duration::from_secs(2);
        self.set_phase(key, Phase::Retry(at));
        self.schedule(key, at);
        set_state(
            status,
            key,
            SyncState::Failed,
            format!("cannot revert drift: {message}"),
        );
    }

    fn set_phase(&mut self, key: &ObjectKey, phase: Phase) {
        if let Some(episode) = self.episodes.get_mut(key) {
            episode.phase = phase;
        }
    }

    fn set_action(&mut self, key: &ObjectKey, action: DriftAction) {
        if let Some(episode) = self.episodes.get(key)
            && let Some(record) = self.records.get_mut(episode.record)
        {
            record.action = action;
        }
    }

    fn record(
        &mut self,
        desired: &Desired,
        fields: &[String],
        deleted: bool,
        who: Option<&Attribution>,
        now: Timestamp,
    ) -> usize {
        if self.records.len() >= MAX_DRIFT_RECORDS {
            self.records.pop_front();
            for episode in self.episodes.values_mut() {
                episode.record = episode.record.saturating_sub(1);
            }
        }
        self.records.push_back(DriftRecord {
            app: desired.app.clone(),
            group: desired.id.group().to_owned(),
            kind: desired.id.kind.clone(),
            namespace: desired.id.namespace.clone(),
            name: desired.id.name.clone(),
            fields: fields.to_vec(),
            deleted,
            manager: who.map(|w| w.manager.clone()),
            operation: who.map(|w| w.operation.clone()),
            changed_at: who.and_then(|w| w.time),
            detected_at: now,
            reverted_at: None,
            action: DriftAction::Reported,
        });
        self.records.len() - 1
    }

    fn event(
        &self,
        desired: &Desired,
        live: Option<&Value>,
        kind: EventType,
        reason: &str,
        note: &str,
    ) {
        let reference = ObjectReference {
            api_version: Some(desired.id.api_version.clone()),
            kind: Some(desired.id.kind.clone()),
            name: Some(desired.id.name.clone()),
            namespace: desired.id.namespace.clone(),
            uid: live
                .and_then(|l| l.pointer("/metadata/uid"))
                .and_then(Value::as_str)
                .map(str::to_owned),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: kind,
            reason: reason.to_owned(),
            note: Some(note.to_owned()),
            action: "Reconcile".to_owned(),
            secondary: None,
        };
        let _ = self.events.send((event, reference));
    }
}

fn describe(fields: &[String], deleted: bool, who: Option<&Attribution>) -> String {
    let by = who.map_or_else(String::new, |w| format!(" by {}", w.manager));
    if deleted {
        format!("deleted{by}")
    } else {
        format!("{} changed{by}", fields.join(", "))
    }
}

fn set_state(status: &StatusTx, key: &ObjectKey, state: SyncState, message: String) {
    status.send_if_modified(|status| {
        let Some(object) = status.objects.get_mut(key) else {
            return false;
        };
        object.state = state;
        object.message = message;
        true
    });
}

fn set_health(status: &StatusTx, key: &ObjectKey, live: Option<&Value>) {
    let health = live.map(|live| assess(&key.group, &key.kind, live));
    let (state, message) = object_state(None, health.as_ref());
    set_state(status, key, state, message);
}
