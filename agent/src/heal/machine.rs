//! The healer's decisions as a state machine over data. Each watch event, due timer or backstop finding on
//! a managed object comes in with the object as live shows it and the time; [`DriftMachine`] judges with
//! [`crate::heal::drift`] whether Windvane's fields were taken or the object deleted, and answers with the
//! [`Action`]s policy asks for: revert (at once, or after the grace period unless the change was taken back),
//! emit an Event, set the object's state. It keeps the baselines (what Windvane owned after its last write),
//! the open drift episodes with their timers (grace, hold, contested back-off, retry) and the drift records
//! the heartbeat carries. It does no I/O and reads no clock, so its tests drive grace periods, holds and
//! back-offs with tokio's paused clock; [`super::Healer`] carries the actions out against the cluster.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use jiff::Timestamp;
use kube::runtime::events::EventType;
use serde_json::Value;
use tokio::time::Instant;
use tracing::{info, warn};
use windvane_shared::wire::heartbeat::{BreakGlassRecord, DriftAction, DriftRecord};
use windvane_shared::wire::status::SyncState;

use crate::apply::desired::Desired;
use crate::apply::inventory::ObjectKey;
use crate::heal::drift::{self, Attribution, Baseline, ContestTracker, resource_version};
use crate::heal::revert_request;
use crate::live::health::assess;
use crate::prevent::policy;
use crate::report::status::object_state;

/// Most drift records kept in memory for the heartbeat and `/status`.
const MAX_DRIFT_RECORDS: usize = 1_000;
/// Most holds remembered per object (by value, with when each was first seen); the oldest is forgotten.
const MAX_HOLDS_REMEMBERED: usize = 8;
/// How long a failed revert waits before it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(2);
/// The reason of the Event that opens a drift episode (the executor counts drift by it).
pub const DRIFT_DETECTED: &str = "DriftDetected";

/// The time of a decision: the monotonic clock for timers, the wall clock for records, holds and the
/// contest window (both move together under tokio's paused clock in tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    pub at: Instant,
    pub wall: Timestamp,
}

impl Now {
    /// The present.
    pub fn current() -> Self {
        Self {
            at: Instant::now(),
            wall: Timestamp::now(),
        }
    }
}

/// What made the machine look at an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// A watch saw it change or vanish.
    Watch,
    /// One of its timers (grace, hold, back-off, retry) ended.
    Timer,
}

/// What the executor is to do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Write the release's object back with server-side apply, then report the outcome with
    /// [`DriftMachine::reverted`] or [`DriftMachine::revert_failed`].
    Revert { key: ObjectKey, fields: Vec<String> },
    /// The grace period ended: revert, unless applying the release would change nothing (the change was
    /// taken back), which is reported with [`DriftMachine::undone`].
    RevertUnlessUndone { key: ObjectKey, fields: Vec<String> },
    /// A Kubernetes Event on the object.
    Event {
        key: ObjectKey,
        uid: Option<String>,
        kind: EventType,
        reason: &'static str,
        note: String,
    },
    /// Mark the break-glass approval on the object spent (the change it allowed was made), so that the
    /// policy refuses a further change under it.
    SpendApproval { key: ObjectKey, patch: Value },
    /// Write on the object when its hold was first seen ([`drift::HOLD_SEEN_ANNOTATION`]), so that the hold
    /// cap survives an agent restart.
    RememberHold { key: ObjectKey, patch: Value },
    /// The object's state in the agent's status.
    SetState {
        key: ObjectKey,
        state: SyncState,
        message: String,
    },
}

/// One drift of one object, from detection until it is reverted or goes away.
#[derive(Debug, Clone)]
struct Episode {
    /// The sequence number of its drift record (see [`DriftRecords`]).
    record: u64,
    phase: Phase,
    /// When it was detected, for the time to repair.
    detected: Instant,
    /// The object as last seen while held, to tell whether a release's write kept the held change.
    held: Option<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting out the drift grace period.
    Grace(Instant),
    /// An operator holds the object.
    Held(Instant),
    /// Not fighting another manager until then.
    Contested(Instant),
    /// Reported only (selfHeal false), or just detected.
    Reported,
    /// Reverting failed; retry then.
    Retry(Instant),
}

/// A drift as judged from one look at the object.
struct Drift {
    fields: Vec<String>,
    deleted: bool,
    who: Option<Attribution>,
    uid: Option<String>,
    /// True when this look opened the episode.
    new: bool,
    /// The episode's phase before this look (`Reported` for a new one).
    phase: Phase,
}

impl Drift {
    fn describe(&self) -> String {
        let by = self
            .who
            .as_ref()
            .map_or_else(String::new, |w| format!(" by {}", w.manager));
        if self.deleted {
            format!("deleted{by}")
        } else {
            format!("{} changed{by}", self.fields.join(", "))
        }
    }
}

/// The healer's state: desired objects, baselines, open episodes, timers and drift records.
#[derive(Debug)]
pub struct DriftMachine {
    desired: HashMap<ObjectKey, Desired>,
    /// Fields Windvane owned after its last apply, and that apply's resourceVersion.
    baseline: HashMap<ObjectKey, Baseline>,
    episodes: HashMap<ObjectKey, Episode>,
    contest: ContestTracker,
    timers: BTreeMap<Instant, BTreeSet<ObjectKey>>,
    records: DriftRecords,
    hold_cap: Duration,
    /// When each hold (an operator's `hold-until` time, a break-glass change's names) was first seen on an
    /// object: the cap runs from there, so looking again, or the drift closing and opening again, never
    /// extends it.
    holds_seen: HashMap<ObjectKey, Vec<(String, Timestamp)>>,
}

impl DriftMachine {
    /// A machine capping holds at `hold_cap` and noticing controller wars with `contest`.
    pub fn new(hold_cap: Duration, contest: ContestTracker) -> Self {
        Self {
            desired: HashMap::new(),
            baseline: HashMap::new(),
            episodes: HashMap::new(),
            contest,
            timers: BTreeMap::new(),
            records: DriftRecords::default(),
            hold_cap,
            holds_seen: HashMap::new(),
        }
    }

    /// The objects of the release now enforced, as applied; drift is judged against these.
    pub fn set_desired(&mut self, objects: impl IntoIterator<Item = Desired>) {
        self.desired = objects
            .into_iter()
            .map(|o| (ObjectKey::of(&o.id), o))
            .collect();
        let desired = &self.desired;
        self.baseline.retain(|key, _| desired.contains_key(key));
        self.episodes.retain(|key, _| desired.contains_key(key));
        self.holds_seen.retain(|key, _| desired.contains_key(key));
        self.contest.retain(|key| desired.contains_key(key));
    }

    /// Adds one object to the release's set (it landed after the others, on a retry of its own).
    pub fn insert_desired(&mut self, object: Desired) {
        self.desired.insert(ObjectKey::of(&object.id), object);
    }

    /// The desired object of `key`, when it is managed.
    pub fn desired(&self, key: &ObjectKey) -> Option<&Desired> {
        self.desired.get(key)
    }

    /// Every managed object's key.
    pub fn keys(&self) -> Vec<ObjectKey> {
        self.desired.keys().cloned().collect()
    }

    /// Records what a release's apply returned: the fields Windvane owns from now on. Windvane just wrote the
    /// object as the release says, so whatever drift was open is over. A held change (a break-glass, an
    /// operator's hold) is closed on its record rather than left open until its hold would have ended:
    /// `TakenIn` when `live`, the object after the write, still has the held values of every field the
    /// change took (the release declares them, or no longer declares them at all), `Reverted` when the
    /// release wrote others. `live` is `None` when the object after the write is not known: the release
    /// wrote it while it was held, which is taken as taking the change in.
    pub fn applied(
        &mut self,
        key: &ObjectKey,
        baseline: Baseline,
        live: Option<&Value>,
        now: Now,
    ) -> Vec<Action> {
        let before = self.baseline.insert(key.clone(), baseline);
        let Some(episode) = self.episodes.remove(key) else {
            return Vec::new();
        };
        let (Phase::Held(_), Some(held)) = (episode.phase, &episode.held) else {
            return Vec::new();
        };
        let taken: Vec<String> = before.map_or_else(Vec::new, |before| {
            drift::lost_fields(&before.owned, &Baseline::of(held).owned)
        });
        let kept = live.is_none_or(|live| {
            taken
                .iter()
                .all(|field| drift::value_at(held, field) == drift::value_at(live, field))
        });
        let Some(record) = self.records.get_mut(episode.record) else {
            return Vec::new();
        };
        record.reverted_at = Some(now.wall);
        record.action = if kept {
            DriftAction::TakenIn
        } else {
            DriftAction::Reverted
        };
        let what = record.break_glass.as_ref().map_or_else(
            || "the held change".to_owned(),
            |b| format!("the break-glass change by {} (ticket {})", b.by, b.ticket),
        );
        let (reason, note) = if kept {
            let note = format!("{what} was taken in by the release: it is not reverted");
            ("DriftTakenIn", note)
        } else {
            let note = format!("{what} was replaced by the release's values");
            ("DriftReverted", note)
        };
        info!(taken_in = kept, "a release wrote a held object");
        vec![Action::Event {
            key: key.clone(),
            uid: uid(held),
            kind: EventType::Normal,
            reason,
            note,
        }]
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

    /// The backstop found `key` as the release says: what it owns now is the baseline.
    pub fn confirmed(&mut self, key: &ObjectKey, live: &Value) {
        self.baseline.insert(key.clone(), Baseline::of(live));
    }

    /// True while drift on `key` is open (held, contested, in grace, reported or failing to revert).
    pub fn is_drifting(&self, key: &ObjectKey) -> bool {
        self.episodes.contains_key(key)
    }

    /// True while drift on `key` is held (by an operator's hold or a break-glass change).
    pub fn is_held(&self, key: &ObjectKey) -> bool {
        self.episodes
            .get(key)
            .is_some_and(|e| matches!(e.phase, Phase::Held(_)))
    }

    /// The earliest pending re-check (grace, hold or back-off ending).
    pub fn next_timer(&self) -> Option<Instant> {
        self.timers.keys().next().copied()
    }

    /// Takes the objects whose timers are due at `now`, each once.
    pub fn due(&mut self, now: Instant) -> BTreeSet<ObjectKey> {
        let later = self.timers.split_off(&(now + Duration::from_nanos(1)));
        let due = std::mem::replace(&mut self.timers, later);
        due.into_values().flatten().collect()
    }

    /// Drift records, newest last.
    pub fn records(&self) -> Vec<DriftRecord> {
        self.records.kept.iter().cloned().collect()
    }

    /// Changes whenever a drift record is made or changed: whoever copies the records out copies them again
    /// only when it moved.
    pub fn records_revision(&self) -> u64 {
        self.records.revision
    }

    /// Judges `key` as `live` shows it now (`None`: deleted).
    pub fn on_event(
        &mut self,
        key: &ObjectKey,
        live: Option<&Value>,
        now: Now,
        cause: Cause,
    ) -> Vec<Action> {
        if !self.desired.contains_key(key) {
            return Vec::new();
        }
        let lost = match live {
            None => Vec::new(),
            Some(live) => match self.lost_fields(key, live) {
                Some(lost) if !lost.is_empty() => lost,
                Some(_) => return vec![health(key, live)],
                None => return Vec::new(),
            },
        };
        // Only drift needs the desired object's policy: most events (status updates) end above.
        let Some(desired) = self.desired.get(key).cloned() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let drift = self.open(key, &desired, live, &lost, now, &mut out);
        if let Some(live) = live
            && let Some(held) = self.held(key, live, &drift, now)
        {
            out.extend(held);
            return out;
        }
        if !desired.self_heal
            && let Some(who) = live.and_then(revert_request::requested_by)
        {
            out.extend(self.revert_on_request(key, &drift, &who));
            return out;
        }
        out.extend(self.heal(key, &desired, &drift, now, cause));
        out
    }

    /// Alert-only drift that an operator asked to revert (`windvane.io/revert=now`): reverted once, with
    /// who asked recorded.
    fn revert_on_request(&mut self, key: &ObjectKey, drift: &Drift, who: &str) -> Vec<Action> {
        info!(requested_by = %who, "manual revert requested");
        if let Some(episode) = self.episodes.get(key)
            && let Some(record) = self.records.get_mut(episode.record)
        {
            record.revert_requested_by = Some(who.to_owned());
        }
        let note = format!("revert of alert-only drift requested by {who}");
        vec![
            event(key, drift, EventType::Normal, "RevertRequested", note),
            Action::Revert {
                key: key.clone(),
                fields: drift.fields.clone(),
            },
        ]
    }

    /// The fields `key` lost against its baseline; empty when none (the baseline then follows what it owns
    /// now, and an open episode ends), `None` when there is nothing to judge: no baseline (then only the
    /// health is reported, see `on_event`), or an event older than Windvane's last write.
    fn lost_fields(&mut self, key: &ObjectKey, live: &Value) -> Option<Vec<String>> {
        let Some(baseline) = self.baseline.get(key) else {
            return Some(Vec::new());
        };
        if resource_version(live) < baseline.resource_version {
            return None;
        }
        let current = Baseline::of(live);
        let lost = drift::lost_fields(&baseline.owned, &current.owned);
        if lost.is_empty() {
            if current.owned.is_superset(&baseline.owned) {
                self.baseline.insert(key.clone(), current);
            }
            if self.episodes.remove(key).is_some() {
                info!(object = ?key, "drift resolved by someone else");
            }
        }
        Some(lost)
    }

    /// The drift this look shows, opening an episode (record, log, `DriftDetected`) when none is open.
    fn open(
        &mut self,
        key: &ObjectKey,
        desired: &Desired,
        live: Option<&Value>,
        lost: &[String],
        now: Now,
        out: &mut Vec<Action>,
    ) -> Drift {
        let drift = Drift {
            fields: lost.iter().map(|f| drift::readable(f)).collect(),
            deleted: live.is_none(),
            who: live.and_then(|l| drift::attribute(l, lost)),
            uid: live.and_then(uid),
            new: !self.episodes.contains_key(key),
            phase: self.episodes.get(key).map_or(Phase::Reported, |e| e.phase),
        };
        if drift.new {
            self.open_episode(key, desired, &drift, now);
            let who = drift.who.as_ref().map_or_else(
                || "someone".to_owned(),
                |a| format!("{} ({})", a.manager, a.operation),
            );
            let what = if drift.deleted {
                "the object was deleted".to_owned()
            } else {
                format!("{} changed by {who}", drift.fields.join(", "))
            };
            let manager = drift.who.as_ref().map(|a| a.manager.as_str());
            warn!(fields = ?drift.fields, manager, deleted = drift.deleted, "drift detected");
            out.push(event(
                key,
                &drift,
                EventType::Warning,
                DRIFT_DETECTED,
                format!("drift: {what}"),
            ));
        }
        drift
    }

    /// An operator's hold wins over everything but deletion (a deleted object carries no hold).
    fn held(
        &mut self,
        key: &ObjectKey,
        live: &Value,
        drift: &Drift,
        now: Now,
    ) -> Option<Vec<Action>> {
        let break_glass = self
            .desired
            .get(key)
            .filter(|d| d.prevent)
            .and_then(|_| policy::break_glass(live));
        let mut out = Vec::new();
        let until = match self.hold_deadline(key, live, break_glass.as_ref(), now.wall, &mut out) {
            Ok(Some(until)) => until,
            Ok(None) => return None,
            Err(message) => {
                warn!(%message, "ignoring a malformed hold");
                return None;
            }
        };
        let setter = match &break_glass {
            Some(names) => names.to_string(),
            None => format!(
                "held by {}",
                drift::hold_setter(live).unwrap_or_else(|| "unknown".to_owned())
            ),
        };
        if !matches!(drift.phase, Phase::Held(_)) {
            let note = format!("{setter} until {until}: drift is not reverted until then");
            out.push(event(key, drift, EventType::Normal, "DriftHeld", note));
            self.set_action(key, DriftAction::Held);
            info!(%until, %setter, "drift held");
        }
        if let Some(names) = &break_glass
            && live_annotation_missing(live, policy::SPENT_ANNOTATION)
        {
            out.push(Action::SpendApproval {
                key: key.clone(),
                patch: policy::spend_approval(names),
            });
        }
        if let Some(names) = break_glass
            && let Some(episode) = self.episodes.get(key)
            && let Some(record) = self.records.get_mut(episode.record)
        {
            record.break_glass = Some(BreakGlassRecord {
                by: names.by,
                approver: names.approver,
                ticket: names.ticket,
                until,
            });
        }
        let at = now.at + until.duration_since(now.wall).unsigned_abs();
        self.set_phase(key, Phase::Held(at));
        if let Some(episode) = self.episodes.get_mut(key) {
            episode.held = Some(live.clone());
        }
        self.schedule(key, at);
        let message = format!("{setter} until {until}");
        out.push(set_state(key, SyncState::Held, message));
        Some(out)
    }

    /// Until when `live` is held at `now`: by its own `hold-until` (an expired one ends any hold), else by a
    /// break-glass change's names; either capped at the hold cap from when that hold was first seen on `key`.
    fn hold_deadline(
        &mut self,
        key: &ObjectKey,
        live: &Value,
        break_glass: Option<&policy::BreakGlass>,
        now: Timestamp,
        out: &mut Vec<Action>,
    ) -> crate::Result<Option<Timestamp>> {
        if let Some(until) = drift::hold_annotation(live)? {
            let since = self.first_seen(key, format!("hold-until {until}"), live, now, out);
            return Ok(drift::capped_hold(until, since, now, self.hold_cap));
        }
        let Some(names) = break_glass else {
            return Ok(None);
        };
        let since = self.first_seen(key, names.to_string(), live, now, out);
        Ok(policy::break_glass_until(since, now, self.hold_cap))
    }

    /// When the hold `what` was first seen on `key`: as remembered in memory, else as the object's own
    /// [`drift::HOLD_SEEN_ANNOTATION`] says (the agent restarted since), else `now`, which is then written on
    /// the object.
    fn first_seen(
        &mut self,
        key: &ObjectKey,
        what: String,
        live: &Value,
        now: Timestamp,
        out: &mut Vec<Action>,
    ) -> Timestamp {
        let seen = self.holds_seen.entry(key.clone()).or_default();
        if let Some((_, at)) = seen.iter().find(|(w, _)| *w == what) {
            return *at;
        }
        if seen.len() >= MAX_HOLDS_REMEMBERED {
            seen.remove(0);
        }
        let at = match drift::hold_seen(live, &what, now) {
            Some(at) => at,
            None => {
                let value = drift::hold_seen_value(&what, now);
                out.push(Action::RememberHold {
                    key: key.clone(),
                    patch: serde_json::json!({"metadata": {"annotations": {drift::HOLD_SEEN_ANNOTATION: value}}}),
                });
                now
            }
        };
        seen.push((what, at));
        at
    }

    /// What policy does with drift that is not held: report only, back off from a war, wait out the grace
    /// period, or revert.
    fn heal(
        &mut self,
        key: &ObjectKey,
        desired: &Desired,
        drift: &Drift,
        now: Now,
        cause: Cause,
    ) -> Vec<Action> {
        if !desired.self_heal {
            let message = format!(
                "drift reported, not reverted (self-heal off): {}",
                drift.describe()
            );
            return vec![set_state(key, SyncState::OutOfSync, message)];
        }
        if let Phase::Contested(until) = drift.phase
            && now.at < until
        {
            return Vec::new();
        }
        if drift.new
            && cause == Cause::Watch
            && let Some(who) = &drift.who
            && let Some(backoff) = self.contest.record(key, &who.manager, now.wall)
        {
            return self.contested(key, drift, &who.manager, backoff, now);
        }
        if let Some(grace) = desired.drift_grace_period.filter(|g| !g.is_zero())
            && drift.new
        {
            let at = now.at + grace;
            self.set_phase(key, Phase::Grace(at));
            self.schedule(key, at);
            let message = format!(
                "drift, reverting after the grace period: {}",
                drift.describe()
            );
            return vec![set_state(key, SyncState::OutOfSync, message)];
        }
        if let Phase::Grace(at) | Phase::Retry(at) = drift.phase
            && now.at < at
        {
            return Vec::new();
        }
        let fields = drift.fields.clone();
        let key = key.clone();
        // The grace period is there for changes that are taken back: one undone meanwhile needs no write.
        if matches!(drift.phase, Phase::Grace(_)) && !drift.deleted {
            vec![Action::RevertUnlessUndone { key, fields }]
        } else {
            vec![Action::Revert { key, fields }]
        }
    }

    fn contested(
        &mut self,
        key: &ObjectKey,
        drift: &Drift,
        manager: &str,
        backoff: Duration,
        now: Now,
    ) -> Vec<Action> {
        let at = now.at + backoff;
        self.set_phase(key, Phase::Contested(at));
        self.set_action(key, DriftAction::Contested);
        self.schedule(key, at);
        let message = format!(
            "{manager} keeps taking {}; not reverting for {}s",
            drift.fields.join(", "),
            backoff.as_secs()
        );
        warn!(%manager, backoff_s = backoff.as_secs(), "contested: backing off");
        vec![
            event(key, drift, EventType::Warning, "Contested", message.clone()),
            set_state(key, SyncState::Contested, message),
        ]
    }

    /// The backstop's dry run found `key` differing from the release although no watch showed it (a write
    /// under Windvane's own field manager, say): recorded as drift and reverted, unless held or report-only.
    pub fn on_backstop_drift(
        &mut self,
        key: &ObjectKey,
        live: Option<&Value>,
        now: Now,
    ) -> Vec<Action> {
        let Some(desired) = self.desired.get(key).cloned() else {
            return Vec::new();
        };
        warn!("backstop found drift the watches did not show");
        let drift = Drift {
            fields: Vec::new(),
            deleted: live.is_none(),
            who: None,
            uid: live.and_then(uid),
            new: true,
            phase: Phase::Reported,
        };
        self.open_episode(key, &desired, &drift, now);
        let note = "drift found by the periodic backstop".to_owned();
        let mut out = vec![event(
            key,
            &drift,
            EventType::Warning,
            DRIFT_DETECTED,
            note.clone(),
        )];
        let mut remember = Vec::new();
        let held = live.is_some_and(|l| {
            matches!(
                self.hold_deadline(key, l, None, now.wall, &mut remember),
                Ok(Some(_))
            )
        });
        out.extend(remember);
        if desired.self_heal && !held {
            let (key, fields) = (key.clone(), Vec::new());
            out.push(Action::Revert { key, fields });
        } else {
            out.push(set_state(key, SyncState::OutOfSync, note));
        }
        out
    }

    /// A revert of `key` was written: the drift is over, `live` is the new baseline.
    pub fn reverted(
        &mut self,
        key: &ObjectKey,
        live: &Value,
        fields: &[String],
        now: Now,
    ) -> Vec<Action> {
        if let Some(episode) = self.episodes.get(key)
            && let Some(record) = self.records.get_mut(episode.record)
        {
            record.reverted_at = Some(now.wall);
            record.action = DriftAction::Reverted;
        }
        self.baseline.insert(key.clone(), Baseline::of(live));
        self.episodes.remove(key);
        info!(fields = ?fields, "drift reverted");
        let what = if fields.is_empty() {
            "the object to the release".to_owned()
        } else {
            fields.join(", ")
        };
        vec![
            Action::Event {
                key: key.clone(),
                uid: uid(live),
                kind: EventType::Normal,
                reason: "DriftReverted",
                note: format!("reverted {what}"),
            },
            health(key, live),
        ]
    }

    /// A revert of `key` failed with `message`: it is tried again shortly.
    pub fn revert_failed(&mut self, key: &ObjectKey, message: &str, now: Now) -> Vec<Action> {
        warn!(error = %message, "cannot revert drift");
        let at = now.at + RETRY_AFTER;
        self.set_phase(key, Phase::Retry(at));
        self.schedule(key, at);
        let message = format!("cannot revert drift: {message}");
        vec![set_state(key, SyncState::Failed, message)]
    }

    /// The grace period ended on a change that was taken back: nothing to revert. Its fields stay with
    /// whoever set them back; the backstop and the object's next apply judge them by value.
    pub fn undone(&mut self, key: &ObjectKey, live: &Value) -> Vec<Action> {
        info!("drift undone within the grace period; nothing to revert");
        self.episodes.remove(key);
        self.baseline.insert(key.clone(), Baseline::of(live));
        vec![health(key, live)]
    }

    /// The record of the drift open on `key`, if any.
    pub fn open_drift(&self, key: &ObjectKey) -> Option<&DriftRecord> {
        self.records.get(self.episodes.get(key)?.record)
    }

    /// How long the drift open on `key` has been known at `now`.
    pub fn drift_age(&self, key: &ObjectKey, now: Instant) -> Option<Duration> {
        Some(now.saturating_duration_since(self.episodes.get(key)?.detected))
    }

    /// How many objects are Contested (backing off) and how many Held, now.
    pub fn contested_and_held(&self) -> (u64, u64) {
        let (mut contested, mut held) = (0, 0);
        for episode in self.episodes.values() {
            match episode.phase {
                Phase::Contested(_) => contested += 1,
                Phase::Held(_) => held += 1,
                Phase::Grace(_) | Phase::Reported | Phase::Retry(_) => {}
            }
        }
        (contested, held)
    }

    fn open_episode(&mut self, key: &ObjectKey, desired: &Desired, drift: &Drift, now: Now) {
        let record = self.record(desired, drift, now.wall);
        let episode = Episode {
            record,
            phase: Phase::Reported,
            detected: now.at,
            held: None,
        };
        self.episodes.insert(key.clone(), episode);
    }

    fn schedule(&mut self, key: &ObjectKey, at: Instant) {
        self.timers.entry(at).or_default().insert(key.clone());
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

    /// Adds a drift record (evicting the oldest past [`MAX_DRIFT_RECORDS`]); its sequence number.
    fn record(&mut self, desired: &Desired, drift: &Drift, now: Timestamp) -> u64 {
        let who = drift.who.as_ref();
        self.records.push(DriftRecord {
            app: desired.app.clone(),
            group: desired.id.group().to_owned(),
            kind: desired.id.kind.clone(),
            namespace: desired.id.namespace.clone(),
            name: desired.id.name.clone(),
            fields: drift.fields.clone(),
            deleted: drift.deleted,
            manager: who.map(|w| w.manager.clone()),
            operation: who.map(|w| w.operation.clone()),
            changed_at: who.and_then(|w| w.time),
            detected_at: now,
            reverted_at: None,
            action: DriftAction::Reported,
            break_glass: None,
            revert_requested_by: None,
        })
    }
}

/// True when `live` has no annotation `name`.
fn live_annotation_missing(live: &Value, name: &str) -> bool {
    live.pointer("/metadata/annotations")
        .and_then(|a| a.get(name))
        .is_none()
}

/// The drift records kept, oldest first, numbered as they are made; at most [`MAX_DRIFT_RECORDS`].
#[derive(Debug, Default)]
struct DriftRecords {
    kept: VecDeque<DriftRecord>,
    /// The sequence number of `kept[0]`: an episode whose record was evicted finds none instead of a younger
    /// one.
    first: u64,
    /// Moves on every record made or taken to change.
    revision: u64,
}

impl DriftRecords {
    /// The record with sequence number `number`, if it is still kept.
    fn get(&self, number: u64) -> Option<&DriftRecord> {
        self.kept
            .get(usize::try_from(number.checked_sub(self.first)?).ok()?)
    }

    /// The record with sequence number `number`, to change: the revision moves.
    fn get_mut(&mut self, number: u64) -> Option<&mut DriftRecord> {
        let record = self
            .kept
            .get_mut(usize::try_from(number.checked_sub(self.first)?).ok()?)?;
        self.revision += 1;
        Some(record)
    }

    /// Adds `record`, evicting the oldest past [`MAX_DRIFT_RECORDS`]; its sequence number.
    fn push(&mut self, record: DriftRecord) -> u64 {
        if self.kept.len() >= MAX_DRIFT_RECORDS {
            self.kept.pop_front();
            self.first += 1;
        }
        self.kept.push_back(record);
        self.revision += 1;
        self.first + self.kept.len() as u64 - 1
    }
}

fn uid(live: &Value) -> Option<String> {
    live.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

fn event(
    key: &ObjectKey,
    drift: &Drift,
    kind: EventType,
    reason: &'static str,
    note: String,
) -> Action {
    Action::Event {
        key: key.clone(),
        uid: drift.uid.clone(),
        kind,
        reason,
        note,
    }
}

fn set_state(key: &ObjectKey, state: SyncState, message: String) -> Action {
    Action::SetState {
        key: key.clone(),
        state,
        message,
    }
}

/// The object's state from its live health (Synced, Progressing or Degraded).
fn health(key: &ObjectKey, live: &Value) -> Action {
    let (state, message) = object_state(None, Some(&assess(&key.group, &key.kind, live)));
    set_state(key, state, message)
}
