//! The healer's decisions, table by table, on tokio's paused clock: grace periods, holds and back-offs are
//! driven in microseconds, with no cluster. Objects are ConfigMaps whose `data.mode` Windvane owns until
//! another manager takes it.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use tokio::time::{Instant, advance};
use windvane_shared::decide::desired::DesiredObject;
use windvane_shared::format::bundle::ObjectRef;
use windvane_shared::wire::heartbeat::DriftAction;

use super::machine::{Action, Cause, DriftMachine, Now};
use crate::apply::desired::Desired;
use crate::apply::inventory::ObjectKey;
use crate::heal::drift::{Baseline, ContestTracker};

const HOUR: Duration = Duration::from_secs(3600);

/// Monotonic and wall clocks that move together with tokio's paused clock.
struct Clock {
    start: Instant,
    wall: Timestamp,
}

impl Clock {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            wall: "2026-12-03T10:00:00Z".parse().unwrap(),
        }
    }

    fn now(&self) -> Now {
        let at = Instant::now();
        let elapsed = SignedDuration::try_from(at - self.start).unwrap();
        Now {
            at,
            wall: self.wall.checked_add(elapsed).unwrap(),
        }
    }

    fn wall_after(&self, by: Duration) -> Timestamp {
        self.now().wall.checked_add(by).unwrap()
    }
}

fn key() -> ObjectKey {
    ObjectKey::of(&object_ref())
}

fn object_ref() -> ObjectRef {
    ObjectRef {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        namespace: Some("shop".into()),
        name: "settings".into(),
    }
}

fn desired(self_heal: bool, grace: Option<Duration>) -> Desired {
    Desired::of(desired_object(self_heal, grace))
}

fn desired_object(self_heal: bool, grace: Option<Duration>) -> DesiredObject {
    DesiredObject {
        app: "shop".into(),
        id: object_ref(),
        body: json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "settings", "namespace": "shop"}, "data": {"mode": "safe"}}),
        wave: 0,
        self_heal,
        prune: true,
        drift_grace_period: grace,
        prevent: false,
        ignored_pointers: Vec::new(),
        file: "shop/settings.yaml".into(),
        document: 0,
        default_namespace: None,
    }
}

fn mode_fields() -> Value {
    json!({"f:data": {"f:mode": {}}})
}

/// The object with Windvane owning `data.mode`.
fn in_step(resource_version: u64) -> Value {
    live(
        resource_version,
        vec![entry("windvane", "Apply", mode_fields())],
        None,
    )
}

/// The object after `manager` took `data.mode` from Windvane.
fn taken_by(manager: &str, resource_version: u64) -> Value {
    let entries = vec![
        entry("windvane", "Apply", json!({"f:metadata": {"f:labels": {}}})),
        entry(manager, "Update", mode_fields()),
    ];
    live(resource_version, entries, None)
}

fn held_until(until: Timestamp, resource_version: u64) -> Value {
    let mut held = taken_by("kubectl-edit", resource_version);
    held["metadata"]["annotations"] = json!({"windvane.io/hold-until": until.to_string()});
    held["metadata"]["managedFields"]
        .as_array_mut()
        .unwrap()
        .push(entry(
            "kubectl-annotate",
            "Update",
            json!({"f:metadata": {"f:annotations": {"f:windvane.io/hold-until": {}}}}),
        ));
    held
}

fn entry(manager: &str, operation: &str, fields: Value) -> Value {
    json!({"manager": manager, "operation": operation, "fieldsType": "FieldsV1", "fieldsV1": fields})
}

fn live(resource_version: u64, entries: Vec<Value>, annotations: Option<Value>) -> Value {
    let mut object = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": "shop", "uid": "u-1",
            "resourceVersion": resource_version.to_string(), "managedFields": entries},
        "data": {"mode": "safe"}});
    if let Some(annotations) = annotations {
        object["metadata"]["annotations"] = annotations;
    }
    object
}

/// A machine enforcing one object, last written at resourceVersion 1.
fn machine(desired: Desired) -> DriftMachine {
    let mut machine = DriftMachine::new(24 * HOUR, ContestTracker::default());
    machine.set_desired([desired]);
    machine.applied(&key(), Baseline::of(&in_step(1)), None, Clock::new().now());
    machine
}

/// The actions as short words, to compare whole answers at a glance.
fn summary(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .map(|action| match action {
            Action::Revert { fields, .. } => format!("revert {}", fields.join(",")),
            Action::RevertUnlessUndone { fields, .. } => {
                format!("revert unless undone {}", fields.join(","))
            }
            Action::Event { kind, reason, .. } => format!("{kind:?} {reason}"),
            Action::SetState { state, .. } => format!("state {state:?}"),
            Action::SpendApproval { .. } => "spend approval".to_owned(),
            Action::RememberHold { .. } => "remember hold".to_owned(),
        })
        .collect()
}

fn message(actions: &[Action]) -> String {
    actions
        .iter()
        .find_map(|action| match action {
            Action::SetState { message, .. } => Some(message.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn drift_is_reverted_at_once_and_recorded_with_who_did_it() {
    let clock = Clock::new();
    let mut machine = machine(desired(true, None));
    let taken = taken_by("kubectl-edit", 2);
    let actions = machine.on_event(&key(), Some(&taken), clock.now(), Cause::Watch);
    assert_eq!(
        summary(&actions),
        ["Warning DriftDetected", "revert /data/mode"]
    );
    let Action::Event { note, uid, .. } = &actions[0] else {
        unreachable!()
    };
    assert_eq!(note, "drift: /data/mode changed by kubectl-edit (Update)");
    assert_eq!(uid.as_deref(), Some("u-1"));
    assert!(machine.is_drifting(&key()));

    let open = machine.open_drift(&key()).and_then(|r| r.manager.clone());
    assert_eq!(open.as_deref(), Some("kubectl-edit"));
    advance(Duration::from_millis(40)).await;
    let age = machine.drift_age(&key(), Instant::now());
    assert_eq!(age, Some(Duration::from_millis(40)));
    let fields = ["/data/mode".to_owned()];
    let answer = machine.reverted(&key(), &in_step(3), &fields, clock.now());
    assert_eq!(machine.drift_age(&key(), Instant::now()), None);
    assert_eq!(summary(&answer), ["Normal DriftReverted", "state Synced"]);
    assert!(!machine.is_drifting(&key()));
    let records = machine.records();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].manager.as_deref(), Some("kubectl-edit"));
    assert_eq!(records[0].action, DriftAction::Reverted);
    assert_eq!(records[0].reverted_at, Some(clock.now().wall));
    assert_eq!(machine.next_timer(), None, "nothing left to wake for");
}

#[tokio::test(start_paused = true)]
async fn the_records_revision_moves_when_a_record_is_made_or_changed_and_only_then() {
    let clock = Clock::new();
    let mut machine = machine(desired(true, None));
    let start = machine.records_revision();
    machine.on_event(&key(), Some(&in_step(1)), clock.now(), Cause::Watch);
    assert_eq!(
        machine.records_revision(),
        start,
        "an object as Windvane left it"
    );
    machine.on_event(
        &key(),
        Some(&taken_by("kubectl-edit", 2)),
        clock.now(),
        Cause::Watch,
    );
    let detected = machine.records_revision();
    assert_ne!(detected, start, "a drift is recorded");
    let fields = ["/data/mode".to_owned()];
    machine.reverted(&key(), &in_step(3), &fields, clock.now());
    let reverted = machine.records_revision();
    assert_ne!(reverted, detected, "its record says it was reverted");
    machine.on_event(&key(), Some(&in_step(3)), clock.now(), Cause::Watch);
    assert_eq!(
        machine.records_revision(),
        reverted,
        "the revert's own event"
    );
}

#[tokio::test(start_paused = true)]
async fn a_deleted_object_is_recreated_and_a_stale_event_says_nothing() {
    let clock = Clock::new();
    let mut machine = machine(desired(true, None));
    let stale = taken_by("kubectl-edit", 0);
    assert!(
        machine
            .on_event(&key(), Some(&stale), clock.now(), Cause::Watch)
            .is_empty(),
        "an event older than Windvane's last write is not drift"
    );
    let actions = machine.on_event(&key(), None, clock.now(), Cause::Watch);
    assert_eq!(summary(&actions), ["Warning DriftDetected", "revert "]);
    assert!(machine.records()[0].deleted);
}

#[tokio::test(start_paused = true)]
async fn report_only_never_reverts_and_says_so() {
    let clock = Clock::new();
    let mut machine = machine(desired(false, None));
    let taken = taken_by("kubectl-edit", 2);
    let actions = machine.on_event(&key(), Some(&taken), clock.now(), Cause::Watch);
    assert_eq!(
        summary(&actions),
        ["Warning DriftDetected", "state OutOfSync"]
    );
    assert_eq!(
        message(&actions),
        "drift reported, not reverted (self-heal off): /data/mode changed by kubectl-edit"
    );
    // Later events on the same drift: still only reported, no second DriftDetected.
    let again = machine.on_event(
        &key(),
        Some(&taken_by("kubectl-edit", 3)),
        clock.now(),
        Cause::Watch,
    );
    assert_eq!(summary(&again), ["state OutOfSync"]);
    assert_eq!(machine.next_timer(), None);
    assert_eq!(machine.records()[0].action, DriftAction::Reported);
}

#[tokio::test(start_paused = true)]
async fn the_grace_period_expires_then_the_drift_is_reverted() {
    let clock = Clock::new();
    let grace = Duration::from_secs(30);
    let mut machine = machine(desired(true, Some(grace)));
    let taken = taken_by("kubectl-edit", 2);
    let actions = machine.on_event(&key(), Some(&taken), clock.now(), Cause::Watch);
    assert_eq!(
        summary(&actions),
        ["Warning DriftDetected", "state OutOfSync"]
    );
    assert!(message(&actions).starts_with("drift, reverting after the grace period"));
    assert_eq!(machine.next_timer(), Some(clock.start + grace));

    advance(Duration::from_secs(29)).await;
    assert!(machine.due(Instant::now()).is_empty());
    let meanwhile = machine.on_event(
        &key(),
        Some(&taken_by("kubectl-edit", 3)),
        clock.now(),
        Cause::Watch,
    );
    assert!(
        meanwhile.is_empty(),
        "within the grace period: {meanwhile:?}"
    );

    advance(Duration::from_secs(1)).await;
    assert_eq!(
        machine.due(Instant::now()).into_iter().collect::<Vec<_>>(),
        [key()]
    );
    let at_end = machine.on_event(
        &key(),
        Some(&taken_by("kubectl-edit", 3)),
        clock.now(),
        Cause::Timer,
    );
    assert_eq!(summary(&at_end), ["revert unless undone /data/mode"]);
    assert_eq!(machine.next_timer(), None, "the timer was taken");
}

#[tokio::test(start_paused = true)]
async fn drift_taken_back_within_the_grace_period_needs_no_write() {
    let clock = Clock::new();
    let grace = Duration::from_secs(30);
    let mut machine = machine(desired(true, Some(grace)));
    machine.on_event(
        &key(),
        Some(&taken_by("kubectl-edit", 2)),
        clock.now(),
        Cause::Watch,
    );
    advance(grace).await;
    machine.due(Instant::now());
    // Set back by hand: the field stays with kubectl-edit, so the machine asks; the dry run said "as the
    // release says".
    let set_back = taken_by("kubectl-edit", 3);
    let actions = machine.on_event(&key(), Some(&set_back), clock.now(), Cause::Timer);
    assert_eq!(summary(&actions), ["revert unless undone /data/mode"]);
    assert_eq!(
        summary(&machine.undone(&key(), &set_back)),
        ["state Synced"]
    );
    assert!(!machine.is_drifting(&key()));
    let later = machine.on_event(
        &key(),
        Some(&taken_by("kubectl-edit", 4)),
        clock.now(),
        Cause::Watch,
    );
    assert_eq!(
        summary(&later),
        ["state Synced"],
        "judged against what it owns now"
    );

    // Or given back to Windvane (re-applied by it): the episode ends at once, before the timer.
    let mut machine = self::machine(desired(true, Some(grace)));
    machine.on_event(
        &key(),
        Some(&taken_by("kubectl-edit", 2)),
        clock.now(),
        Cause::Watch,
    );
    let given_back = machine.on_event(&key(), Some(&in_step(3)), clock.now(), Cause::Watch);
    assert_eq!(summary(&given_back), ["state Synced"]);
    assert!(!machine.is_drifting(&key()));
    advance(grace).await;
    assert_eq!(machine.due(Instant::now()).len(), 1);
    let at_end = machine.on_event(&key(), Some(&in_step(3)), clock.now(), Cause::Timer);
    assert_eq!(
        summary(&at_end),
        ["state Synced"],
        "no revert after it ended"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hold_defers_the_revert_until_it_ends_and_is_capped() {
    let clock = Clock::new();
    let mut machine = machine(desired(true, None));
    let held = held_until(clock.wall_after(HOUR), 2);
    let actions = machine.on_event(&key(), Some(&held), clock.now(), Cause::Watch);
    assert_eq!(
        summary(&actions),
        [
            "Warning DriftDetected",
            "remember hold",
            "Normal DriftHeld",
            "state Held"
        ]
    );
    assert!(message(&actions).starts_with("held by kubectl-annotate until 2026-12-03T11:00:00Z"));
    assert_eq!(machine.records()[0].action, DriftAction::Held);
    assert_eq!(machine.next_timer(), Some(clock.start + HOUR));

    let again = machine.on_event(
        &key(),
        Some(&held_until(clock.wall_after(HOUR), 3)),
        clock.now(),
        Cause::Watch,
    );
    assert_eq!(summary(&again), ["state Held"], "one DriftHeld per hold");
    assert_eq!(machine.contested_and_held(), (0, 1));

    advance(HOUR).await;
    assert_eq!(
        machine.due(Instant::now()).len(),
        1,
        "both looks scheduled the same end"
    );
    let expired = held_until(clock.wall, 3);
    let actions = machine.on_event(&key(), Some(&expired), clock.now(), Cause::Timer);
    assert_eq!(
        summary(&actions),
        ["revert /data/mode"],
        "a past hold holds nothing"
    );

    // A hold of two days ends at the 24-hour cap.
    let mut machine = self::machine(desired(true, None));
    let long = held_until(clock.wall_after(48 * HOUR), 2);
    machine.on_event(&key(), Some(&long), clock.now(), Cause::Watch);
    assert_eq!(machine.next_timer(), Some(Instant::now() + 24 * HOUR));
}

/// The hold's first detection is written on the object, so that an agent restarted 20 h later (a new
/// machine, nothing in memory) ends the hold 4 h later, not 24 h after its own first look.
#[tokio::test(start_paused = true)]
async fn a_hold_keeps_its_cap_from_the_first_detection_across_an_agent_restart() {
    let clock = Clock::new();
    let forever: Timestamp = "2099-01-01T00:00:00Z".parse().unwrap();
    let mut held = held_until(forever, 2);
    let actions =
        machine(desired(true, None)).on_event(&key(), Some(&held), clock.now(), Cause::Watch);
    let Some(Action::RememberHold { patch, .. }) = actions.get(1) else {
        panic!("{actions:?}")
    };
    let seen = &patch["metadata"]["annotations"]["windvane.io/hold-seen"];
    assert!(
        seen.as_str()
            .is_some_and(|v| v.starts_with("2026-12-03T10:00:00Z ")),
        "{seen}"
    );
    held["metadata"]["annotations"]["windvane.io/hold-seen"] = seen.clone();

    advance(20 * HOUR).await;
    let mut restarted = machine(desired(true, None));
    let actions = restarted.on_event(&key(), Some(&held), clock.now(), Cause::Watch);
    assert_eq!(
        summary(&actions),
        ["Warning DriftDetected", "Normal DriftHeld", "state Held"],
        "the remembered start is used, not written again"
    );
    assert_eq!(restarted.next_timer(), Some(Instant::now() + 4 * HOUR));

    // The annotation times only the hold it was written for: a new hold-until is timed afresh; a start in
    // the future is read as now.
    let renewed = held_until("2098-01-01T00:00:00Z".parse().unwrap(), 3);
    let mut renewed_with_old = renewed.clone();
    renewed_with_old["metadata"]["annotations"]["windvane.io/hold-seen"] = seen.clone();
    let mut fresh = machine(desired(true, None));
    let actions = fresh.on_event(&key(), Some(&renewed_with_old), clock.now(), Cause::Watch);
    assert_eq!(summary(&actions)[1], "remember hold");
    assert_eq!(fresh.next_timer(), Some(Instant::now() + 24 * HOUR));
    let mut future = held.clone();
    let digest = seen.as_str().unwrap().split_once(' ').unwrap().1;
    future["metadata"]["annotations"]["windvane.io/hold-seen"] =
        json!(format!("2090-01-01T00:00:00Z {digest}"));
    let mut forged = machine(desired(true, None));
    forged.on_event(&key(), Some(&future), clock.now(), Cause::Watch);
    assert_eq!(forged.next_timer(), Some(Instant::now() + 24 * HOUR));
}

#[tokio::test(start_paused = true)]
async fn a_far_future_hold_ends_at_the_cap_from_its_first_detection_however_often_it_is_seen() {
    let clock = Clock::new();
    let mut machine = machine(desired(true, None));
    let forever: Timestamp = "2099-01-01T00:00:00Z".parse().unwrap();
    let actions = machine.on_event(
        &key(),
        Some(&held_until(forever, 2)),
        clock.now(),
        Cause::Watch,
    );
    assert_eq!(
        summary(&actions),
        [
            "Warning DriftDetected",
            "remember hold",
            "Normal DriftHeld",
            "state Held"
        ]
    );
    let first_end = clock.start + 24 * HOUR;
    assert_eq!(machine.next_timer(), Some(first_end));
    // Seen again 12 h later (a watch event, another annotation written beside it): the end does not move.
    advance(12 * HOUR).await;
    let again = machine.on_event(
        &key(),
        Some(&held_until(forever, 3)),
        clock.now(),
        Cause::Watch,
    );
    assert!(
        message(&again).ends_with("until 2026-12-04T10:00:00Z"),
        "{}",
        message(&again)
    );
    assert_eq!(machine.next_timer(), Some(first_end));
    // At the cap's end the hold is over: reverted, not held for another day.
    advance(12 * HOUR).await;
    assert_eq!(machine.due(Instant::now()).len(), 1);
    let actions = machine.on_event(
        &key(),
        Some(&held_until(forever, 3)),
        clock.now(),
        Cause::Timer,
    );
    assert_eq!(summary(&actions), ["revert /data/mode"]);
    // Nor does the same hold, still on the object, hold the next drift.
    machine.reverted(&key(), &in_step(4), &["/data/mode".to_owned()], clock.now());
    advance(HOUR).await;
    let actions = machine.on_event(
        &key(),
        Some(&held_until(forever, 5)),
        clock.now(),
        Cause::Watch,
    );
    assert_eq!(
        summary(&actions),
        ["Warning DriftDetected", "revert /data/mode"]
    );
    // The backstop too judges it by its first detection.
    let actions = machine.on_backstop_drift(&key(), Some(&held_until(forever, 5)), clock.now());
    assert!(
        summary(&actions).contains(&"revert ".to_owned()),
        "{:?}",
        summary(&actions)
    );
}

/// One take of `data.mode` by `hpa-like` a second after the last, at `version`; a revert it asks for is
/// written at once.
async fn take(machine: &mut DriftMachine, clock: &Clock, version: u64) -> Vec<Action> {
    advance(Duration::from_secs(1)).await;
    let taken = taken_by("hpa-like", version);
    let actions = machine.on_event(&key(), Some(&taken), clock.now(), Cause::Watch);
    if actions.iter().any(|a| matches!(a, Action::Revert { .. })) {
        let fields = ["/data/mode".to_owned()];
        machine.reverted(&key(), &in_step(version + 1), &fields, clock.now());
    }
    actions
}

#[tokio::test(start_paused = true)]
async fn a_manager_taking_the_field_three_times_is_contested_with_a_growing_back_off() {
    let clock = Clock::new();
    let mut machine = machine(desired(true, None));
    let revert = ["Warning DriftDetected", "revert /data/mode"];
    assert_eq!(summary(&take(&mut machine, &clock, 2).await), revert);
    assert_eq!(summary(&take(&mut machine, &clock, 4).await), revert);
    let third = take(&mut machine, &clock, 6).await;
    assert_eq!(
        summary(&third),
        [
            "Warning DriftDetected",
            "Warning Contested",
            "state Contested"
        ]
    );
    assert_eq!(
        message(&third),
        "hpa-like keeps taking /data/mode; not reverting for 60s"
    );
    assert_eq!(machine.records()[2].action, DriftAction::Contested);
    assert_eq!(machine.contested_and_held(), (1, 0));
    let backing_off = Instant::now() + Duration::from_secs(60);
    assert_eq!(machine.next_timer(), Some(backing_off));
    assert!(
        take(&mut machine, &clock, 8).await.is_empty(),
        "no fight during the back-off"
    );

    advance(Duration::from_secs(59)).await;
    assert_eq!(machine.due(Instant::now()).len(), 1);
    let after = machine.on_event(
        &key(),
        Some(&taken_by("hpa-like", 8)),
        clock.now(),
        Cause::Timer,
    );
    assert_eq!(
        summary(&after),
        ["revert /data/mode"],
        "one more try when the back-off ends"
    );
    machine.reverted(&key(), &in_step(9), &["/data/mode".to_owned()], clock.now());

    // The next war on the same object backs off twice as long.
    assert_eq!(summary(&take(&mut machine, &clock, 10).await), revert);
    assert_eq!(summary(&take(&mut machine, &clock, 12).await), revert);
    let again = take(&mut machine, &clock, 14).await;
    assert_eq!(
        message(&again),
        "hpa-like keeps taking /data/mode; not reverting for 120s"
    );
    assert_eq!(
        machine.next_timer(),
        Some(Instant::now() + Duration::from_secs(120))
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_revert_is_retried_after_two_seconds() {
    let clock = Clock::new();
    let mut machine = machine(desired(true, None));
    machine.on_event(
        &key(),
        Some(&taken_by("kubectl-edit", 2)),
        clock.now(),
        Cause::Watch,
    );
    let failed = machine.revert_failed(&key(), "the API server is unavailable", clock.now());
    assert_eq!(summary(&failed), ["state Failed"]);
    assert_eq!(
        message(&failed),
        "cannot revert drift: the API server is unavailable"
    );
    let meanwhile = machine.on_event(
        &key(),
        Some(&taken_by("kubectl-edit", 3)),
        clock.now(),
        Cause::Watch,
    );
    assert!(meanwhile.is_empty(), "waits for the retry: {meanwhile:?}");
    advance(Duration::from_secs(2)).await;
    assert_eq!(machine.due(Instant::now()).len(), 1);
    let retry = machine.on_event(
        &key(),
        Some(&taken_by("kubectl-edit", 3)),
        clock.now(),
        Cause::Timer,
    );
    assert_eq!(summary(&retry), ["revert /data/mode"]);
}

#[tokio::test(start_paused = true)]
async fn the_backstop_reverts_unless_held_or_report_only() {
    let clock = Clock::new();
    let cases = [
        (true, in_step(2), vec!["Warning DriftDetected", "revert "]),
        (
            false,
            in_step(2),
            vec!["Warning DriftDetected", "state OutOfSync"],
        ),
        (
            true,
            held_until(clock.wall_after(HOUR), 2),
            vec!["Warning DriftDetected", "remember hold", "state OutOfSync"],
        ),
    ];
    for (self_heal, live, expected) in cases {
        let mut machine = machine(desired(self_heal, None));
        let actions = machine.on_backstop_drift(&key(), Some(&live), clock.now());
        assert_eq!(summary(&actions), expected, "self_heal {self_heal}");
        assert!(machine.is_drifting(&key()));
    }
}

#[test]
fn records_are_capped_oldest_first() {
    let wall: Timestamp = "2026-12-03T10:00:00Z".parse().unwrap();
    let now = Now {
        at: Instant::now(),
        wall,
    };
    let mut machine = machine(desired(false, None));
    for version in 0..1_005u64 {
        // Each look opens a new episode: the object is set back in between.
        machine.on_event(
            &key(),
            Some(&taken_by("kubectl-edit", 2 * version + 2)),
            now,
            Cause::Watch,
        );
        machine.on_event(&key(), Some(&in_step(2 * version + 3)), now, Cause::Watch);
    }
    let records = machine.records();
    assert_eq!(records.len(), 1_000);
    assert_eq!(records[0].fields, ["/data/mode"]);
    assert!(records.iter().all(|r| r.action == DriftAction::Reported));
}

/// The same object under another name, for a second key in one machine.
fn renamed(object: &Value, name: &str) -> Value {
    let mut object = object.clone();
    object["metadata"]["name"] = json!(name);
    object
}

#[test]
fn an_episode_whose_record_was_evicted_points_at_no_younger_record() {
    let wall: Timestamp = "2026-12-03T10:00:00Z".parse().unwrap();
    let now = Now {
        at: Instant::now(),
        wall,
    };
    let other_ref = ObjectRef {
        name: "other".into(),
        ..object_ref()
    };
    let other_key = ObjectKey::of(&other_ref);
    let mut machine = machine(desired(false, None));
    let mut other = desired_object(false, None);
    other.id = other_ref;
    other.body = renamed(&other.body, "other");
    machine.set_desired([desired(false, None), Desired::of(other)]);
    machine.applied(
        &other_key,
        Baseline::of(&renamed(&in_step(1), "other")),
        None,
        now,
    );

    // The first object's drift stays open (report-only) while the other's come and go past the record cap.
    machine.on_event(
        &key(),
        Some(&taken_by("kubectl-edit", 2)),
        now,
        Cause::Watch,
    );
    assert!(machine.open_drift(&key()).is_some());
    for version in 0..1_000u64 {
        let taken = renamed(&taken_by("helm", 2 * version + 2), "other");
        machine.on_event(&other_key, Some(&taken), now, Cause::Watch);
        let back = renamed(&in_step(2 * version + 3), "other");
        machine.on_event(&other_key, Some(&back), now, Cause::Watch);
    }
    assert_eq!(machine.records().len(), 1_000);
    assert!(
        machine.open_drift(&key()).is_none(),
        "the evicted record is gone, not replaced by another object's: {:?}",
        machine.open_drift(&key()).map(|r| &r.name)
    );
}

fn broken_glass(by: &str, approver: &str, resource_version: u64) -> Value {
    let mut changed = taken_by("kubectl-patch", resource_version);
    changed["metadata"]["annotations"] = json!({
        "windvane.io/break-glass-ticket": "INC-7",
        "windvane.io/break-glass-by": by,
        "windvane.io/break-glass-approver": approver,
    });
    changed
}

fn prevented() -> Desired {
    let mut object = desired_object(true, None);
    object.prevent = true;
    Desired::of(object)
}

#[tokio::test(start_paused = true)]
async fn a_two_person_break_glass_is_held_for_the_cap_naming_both_and_the_ticket() {
    let clock = Clock::new();
    let mut machine = machine(prevented());
    let changed = broken_glass("alice", "bob", 2);
    let actions = machine.on_event(&key(), Some(&changed), clock.now(), Cause::Watch);
    // The approval is marked spent: it served this change.
    assert_eq!(
        summary(&actions),
        [
            "Warning DriftDetected",
            "remember hold",
            "Normal DriftHeld",
            "spend approval",
            "state Held"
        ]
    );
    let Some(Action::SpendApproval { patch, .. }) = actions.get(3) else {
        panic!("{actions:?}")
    };
    assert_eq!(
        patch["metadata"]["annotations"]["windvane.io/break-glass-spent"],
        "break-glass by alice, approved by bob, ticket INC-7"
    );
    assert_eq!(
        message(&actions),
        "break-glass by alice, approved by bob, ticket INC-7 until 2026-12-04T10:00:00Z"
    );
    assert_eq!(machine.records()[0].action, DriftAction::Held);
    let names = machine.records()[0].break_glass.clone().unwrap();
    assert_eq!(
        (
            names.by.as_str(),
            names.approver.as_str(),
            names.ticket.as_str()
        ),
        ("alice", "bob", "INC-7")
    );
    assert_eq!(names.until, clock.wall_after(24 * HOUR));
    assert_eq!(machine.next_timer(), Some(clock.start + 24 * HOUR));

    // At the end of the cap it is reverted, however often it is looked at meanwhile.
    advance(HOUR).await;
    let mut spent = broken_glass("alice", "bob", 3);
    spent["metadata"]["annotations"]["windvane.io/break-glass-spent"] = json!("yes");
    let again = machine.on_event(&key(), Some(&spent), clock.now(), Cause::Watch);
    assert_eq!(summary(&again), ["state Held"], "spent once");
    advance(23 * HOUR).await;
    let actions = machine.on_event(
        &key(),
        Some(&broken_glass("alice", "bob", 3)),
        clock.now(),
        Cause::Timer,
    );
    assert_eq!(summary(&actions), ["revert /data/mode"]);
}

#[tokio::test(start_paused = true)]
async fn a_break_glass_expires_at_the_cap_from_its_first_detection_even_when_its_drift_reopens() {
    let clock = Clock::new();
    let mut machine = machine(prevented());
    machine.on_event(
        &key(),
        Some(&broken_glass("alice", "bob", 2)),
        clock.now(),
        Cause::Watch,
    );
    assert_eq!(machine.next_timer(), Some(clock.start + 24 * HOUR));
    // alice sets the field back (the drift closes), then takes it again 20 h after the first detection.
    advance(HOUR).await;
    let mut back = in_step(3);
    back["metadata"]["annotations"] =
        broken_glass("alice", "bob", 3)["metadata"]["annotations"].clone();
    machine.on_event(&key(), Some(&back), clock.now(), Cause::Watch);
    assert!(!machine.is_drifting(&key()));
    advance(19 * HOUR).await;
    machine.due(Instant::now());
    let actions = machine.on_event(
        &key(),
        Some(&broken_glass("alice", "bob", 4)),
        clock.now(),
        Cause::Watch,
    );
    // Held for the 4 h left of the first day, not a fresh 24 h.
    assert!(
        message(&actions).ends_with("until 2026-12-04T10:00:00Z"),
        "{}",
        message(&actions)
    );
    assert_eq!(machine.next_timer(), Some(clock.start + 24 * HOUR));
}

#[tokio::test(start_paused = true)]
async fn break_glass_holds_only_prevented_objects_with_two_people() {
    let clock = Clock::new();
    // Without prevention nobody checked who wrote the names: not a hold.
    let mut plain = machine(desired(true, None));
    let actions = plain.on_event(
        &key(),
        Some(&broken_glass("alice", "bob", 2)),
        clock.now(),
        Cause::Watch,
    );
    assert_eq!(
        summary(&actions),
        ["Warning DriftDetected", "revert /data/mode"]
    );
    // One person approving themself: not a hold.
    let mut alone = machine(prevented());
    let actions = alone.on_event(
        &key(),
        Some(&broken_glass("alice", "alice", 2)),
        clock.now(),
        Cause::Watch,
    );
    assert_eq!(
        summary(&actions),
        ["Warning DriftDetected", "revert /data/mode"]
    );
    // An expired hold of its own ends a break-glass at once.
    let mut expired = machine(prevented());
    let mut changed = broken_glass("alice", "bob", 2);
    changed["metadata"]["annotations"]["windvane.io/hold-until"] = json!(clock.wall.to_string());
    let actions = expired.on_event(&key(), Some(&changed), clock.now(), Cause::Watch);
    assert_eq!(
        summary(&actions),
        ["Warning DriftDetected", "revert /data/mode"]
    );
}

#[tokio::test(start_paused = true)]
async fn alert_only_drift_is_reverted_once_when_an_operator_asks() {
    let clock = Clock::new();
    let mut machine = machine(desired(false, None));
    let taken = taken_by("kubectl-edit", 2);
    let actions = machine.on_event(&key(), Some(&taken), clock.now(), Cause::Watch);
    assert_eq!(
        summary(&actions),
        ["Warning DriftDetected", "state OutOfSync"]
    );

    let mut asked = taken_by("kubectl-edit", 3);
    asked["metadata"]["annotations"] = json!({"windvane.io/revert": "now"});
    asked["metadata"]["managedFields"]
        .as_array_mut()
        .unwrap()
        .push(entry(
            "oncall-carol",
            "Update",
            json!({"f:metadata": {"f:annotations": {"f:windvane.io/revert": {}}}}),
        ));
    let actions = machine.on_event(&key(), Some(&asked), clock.now(), Cause::Watch);
    assert_eq!(
        summary(&actions),
        ["Normal RevertRequested", "revert /data/mode"]
    );
    let Action::Event { note, .. } = &actions[0] else {
        unreachable!()
    };
    assert_eq!(note, "revert of alert-only drift requested by oncall-carol");
    assert_eq!(
        machine.records()[0].revert_requested_by.as_deref(),
        Some("oncall-carol")
    );
    let fields = ["/data/mode".to_owned()];
    machine.reverted(&key(), &in_step(4), &fields, clock.now());
    assert_eq!(machine.records()[0].action, DriftAction::Reverted);

    // The next drift, without a request, is only reported again.
    let actions = machine.on_event(
        &key(),
        Some(&taken_by("kubectl-edit", 5)),
        clock.now(),
        Cause::Watch,
    );
    assert_eq!(
        summary(&actions),
        ["Warning DriftDetected", "state OutOfSync"]
    );
}

/// The object as a release's write leaves it: Windvane owns `data.mode` again, and it reads `mode`.
fn written_with(mode: &str, resource_version: u64) -> Value {
    let mut written = in_step(resource_version);
    written["data"]["mode"] = json!(mode);
    written
}

/// alice's break-glass change of `data.mode` to `fast`, approved by bob.
fn fast_break_glass(resource_version: u64) -> Value {
    let mut changed = broken_glass("alice", "bob", resource_version);
    changed["data"]["mode"] = json!("fast");
    changed
}

fn note(actions: &[Action]) -> String {
    actions
        .iter()
        .find_map(|action| match action {
            Action::Event { note, .. } => Some(note.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn a_release_that_takes_a_break_glass_change_in_closes_it_and_nothing_is_reverted() {
    let clock = Clock::new();
    let mut machine = machine(prevented());
    machine.on_event(
        &key(),
        Some(&fast_break_glass(2)),
        clock.now(),
        Cause::Watch,
    );
    assert_eq!(machine.records()[0].action, DriftAction::Held);
    advance(HOUR).await;
    // It is looked at again while held (alice touched it once more): the latest look counts.
    machine.on_event(
        &key(),
        Some(&fast_break_glass(3)),
        clock.now(),
        Cause::Watch,
    );

    // The next release says `fast` too and writes the object.
    let mut release = desired_object(true, None);
    release.prevent = true;
    release.body["data"]["mode"] = json!("fast");
    machine.set_desired([Desired::of(release)]);
    let written = written_with("fast", 4);
    let actions = machine.applied(&key(), Baseline::of(&written), Some(&written), clock.now());
    assert_eq!(summary(&actions), ["Normal DriftTakenIn"]);
    assert_eq!(
        note(&actions),
        "the break-glass change by alice (ticket INC-7) was taken in by the release: it is not reverted"
    );
    let record = &machine.records()[0];
    assert_eq!(record.action, DriftAction::TakenIn);
    assert_eq!(record.reverted_at, Some(clock.now().wall));
    assert_eq!(record.break_glass.as_ref().unwrap().by, "alice");
    assert!(!machine.is_drifting(&key()));
    assert_eq!(machine.contested_and_held(), (0, 0));

    // When the hold would have ended, there is nothing to revert.
    advance(23 * HOUR).await;
    assert_eq!(machine.due(Instant::now()).len(), 1);
    let at_end = machine.on_event(&key(), Some(&written), clock.now(), Cause::Timer);
    assert_eq!(summary(&at_end), ["state Synced"]);
    assert_eq!(machine.records().len(), 1, "no new drift");
}

#[tokio::test(start_paused = true)]
async fn a_release_that_writes_other_values_over_a_held_change_ends_it_as_reverted() {
    let clock = Clock::new();
    let mut machine = machine(prevented());
    machine.on_event(
        &key(),
        Some(&fast_break_glass(2)),
        clock.now(),
        Cause::Watch,
    );
    advance(HOUR).await;
    let written = written_with("careful", 3);
    let actions = machine.applied(&key(), Baseline::of(&written), Some(&written), clock.now());
    assert_eq!(summary(&actions), ["Normal DriftReverted"]);
    assert_eq!(
        note(&actions),
        "the break-glass change by alice (ticket INC-7) was replaced by the release's values"
    );
    let record = &machine.records()[0];
    assert_eq!(record.action, DriftAction::Reverted);
    assert_eq!(record.reverted_at, Some(clock.now().wall));
    assert!(!machine.is_drifting(&key()));
}

#[tokio::test(start_paused = true)]
async fn a_release_write_closes_an_operators_hold_too_and_leaves_other_drift_as_recorded() {
    let clock = Clock::new();
    // An operator's hold on a change the release then declares; the object after the write is not known.
    let mut held = machine(desired(true, None));
    held.on_event(
        &key(),
        Some(&held_until(clock.wall_after(HOUR), 2)),
        clock.now(),
        Cause::Watch,
    );
    let actions = held.applied(&key(), Baseline::of(&in_step(3)), None, clock.now());
    assert_eq!(summary(&actions), ["Normal DriftTakenIn"]);
    assert_eq!(
        note(&actions),
        "the held change was taken in by the release: it is not reverted"
    );
    assert_eq!(held.records()[0].action, DriftAction::TakenIn);

    // Drift that was only reported ends with the write as before: nothing to close, no Event.
    let mut reported = machine(desired(false, None));
    reported.on_event(
        &key(),
        Some(&taken_by("kubectl-edit", 2)),
        clock.now(),
        Cause::Watch,
    );
    let actions = reported.applied(&key(), Baseline::of(&in_step(3)), None, clock.now());
    assert!(actions.is_empty(), "{actions:?}");
    assert_eq!(reported.records()[0].action, DriftAction::Reported);
    assert_eq!(reported.records()[0].reverted_at, None);
    assert!(!reported.is_drifting(&key()));
}
