//! The wave gate: a verified release whose rollout wave has not opened for this cluster waits here, while the
//! engine keeps enforcing and healing the last known good. The decision is
//! [`windvane_shared::decide::rollout::decide`] (pure); this module runs it on time. [`run`] is a task per waiting
//! release: it wakes when the signed schedule opens the wave, when the server's rollout view changes (for a
//! `gate: healthy`), or when the publisher halts or resumes; it tells the engine what to report while it
//! waits and when the release may be taken ([`GateEvent`]). [`watch_server`] is the thin HTTP side: from the
//! wave's signed time on, it reads `GET /api/v1/rollouts/CHANNEL?summary=1` (revalidated with its ETag:
//! mostly `304`) from the source server every few seconds and publishes what it got, or why it got nothing —
//! an unreachable server keeps the gate closed. A release whose signed rollout requires
//! approval waits here first, until the tally from [`crate::gates::approval::watch_store`] meets its threshold
//! (`Awaiting approval (0 of 1)`), and only then for its wave; once the wave is open, it waits for the
//! maintenance windows of the apps it changes ([`crate::gates::windows`]).

use std::time::Duration;

use jiff::Timestamp;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::warn;
use windvane_shared::decide::rollout::{self, GateInput, RolloutView, WaveDecision};
use windvane_shared::spec::rollout::Rollout;
use windvane_shared::wire::heartbeat::PendingReport;

use windvane_shared::decide::approval;
use windvane_shared::format::release::AcceptedRelease;

use crate::fetch::http::{read_capped, with_deadline};
use crate::gates::approval::{ApprovalNeed, ApprovalObservation};
use crate::gates::windows::AppWindows;

/// Most bytes of a rollout view the agent reads.
const MAX_VIEW_BYTES: u64 = 4 * 1024 * 1024;
/// Longest sleep of a release held by a maintenance window before its windows are judged again.
const WINDOW_RECHECK: Duration = Duration::from_secs(3600);
/// Total deadline of one read of the rollout view.
const VIEW_DEADLINE: Duration = Duration::from_secs(10);

/// A waiting release as the gate sees it: its serial, issue time and rollout (the newest control the agent
/// has verified for it), and this cluster's wave (0-based).
#[derive(Debug, Clone, PartialEq)]
pub struct GatePlan {
    pub serial: u64,
    pub issued_at: Timestamp,
    pub rollout: Rollout,
    pub wave: usize,
    /// Set when the release requires approval: it waits for that first.
    pub approval: Option<ApprovalNeed>,
    /// The maintenance windows of the apps the release changes here: once its wave is open, it waits
    /// until all of them let it in ([`crate::gates::windows::window_wait`]).
    pub windows: Vec<AppWindows>,
}

impl GatePlan {
    /// The plan of a release with `rollout` for a cluster, or `None` when the cluster takes it at once (no
    /// rollout, or the first wave).
    pub fn of(
        serial: u64,
        issued_at: Timestamp,
        rollout: Option<&Rollout>,
        name: &str,
        labels: &windvane_shared::spec::selector::Labels,
    ) -> Option<GatePlan> {
        let rollout = rollout?;
        let wave = rollout::wave_of(rollout, name, labels);
        (wave > 0).then(|| GatePlan {
            serial,
            issued_at,
            rollout: rollout.clone(),
            wave,
            approval: None,
            windows: Vec::new(),
        })
    }

    /// The plan of a verified release for a cluster: its wave's, and its approval's when it requires one;
    /// `None` when the cluster takes it at once.
    pub fn for_release(
        accepted: &AcceptedRelease,
        name: &str,
        labels: &windvane_shared::spec::selector::Labels,
        windows: Vec<AppWindows>,
        require_approvals: u32,
    ) -> Option<GatePlan> {
        let pointer = &accepted.pointer;
        let rollout = pointer.rollout.as_ref();
        let plan = GatePlan::of(pointer.serial, pointer.issued_at, rollout, name, labels);
        let need = ApprovalNeed::of(accepted, require_approvals);
        if need.is_none() && windows.is_empty() {
            return plan;
        }
        let mut plan = plan.unwrap_or_else(|| GatePlan {
            serial: pointer.serial,
            issued_at: pointer.issued_at,
            rollout: rollout.cloned().unwrap_or_default(),
            wave: 0,
            approval: None,
            windows: Vec::new(),
        });
        plan.approval = need;
        plan.windows = windows;
        Some(plan)
    }

    /// What to report while the wave is open but a maintenance window holds the release, and when to look
    /// again; `None` once every window lets it in.
    pub fn window_wait(&self, now: Timestamp) -> Option<(PendingReport, Option<Timestamp>)> {
        let (message, look_again) = crate::gates::windows::window_wait(&self.windows, now)?;
        let report = PendingReport {
            serial: self.serial,
            wave: u32::try_from(self.wave + 1).unwrap_or(u32::MAX),
            waves: u32::try_from(rollout::wave_count(&self.rollout)).unwrap_or(u32::MAX),
            opens_at: look_again,
            halted: false,
            message,
            approval: None,
            changes: None,
        };
        Some((report, look_again))
    }

    /// What to report while this plan waits for approval, or `None` once approved (or when it needs none).
    pub fn awaiting_approval(&self, seen: &ApprovalObservation) -> Option<PendingReport> {
        let need = self.approval.as_ref()?;
        let tally = seen.clone().unwrap_or_default();
        if tally.meets(&need.policy) {
            return None;
        }
        let mut report =
            approval::awaiting_report(&self.rollout, self.serial, self.wave, &need.policy, &tally);
        if let Some(note) = need.floor_note() {
            report.message.push_str(" — ");
            report.message.push_str(&note);
        }
        Some(report)
    }

    /// Whether the gate needs the server's rollout view.
    pub fn needs_server(&self) -> bool {
        rollout::needs_gate(&self.rollout, self.wave)
    }
}

/// What the server last said: nothing yet, its view, or why there is none.
pub type GateObservation = Option<Result<RolloutView, Unreachable>>;

/// Why the server's rollout view could not be read: the gate stays closed and reports this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreachable(pub String);

/// What the gate tells the engine.
#[derive(Debug, Clone, PartialEq)]
pub enum GateEvent {
    /// Still waiting: what to report.
    Waiting(PendingReport),
    /// The wave is open, but a maintenance window of an app the release changes holds it: what to report.
    Window(PendingReport),
    /// The wave opened for this serial: take the release.
    Open(u64),
}

/// The decision for `plan` at `now`, from what the server last said. Pure.
pub fn judge(plan: &GatePlan, now: Timestamp, observed: &GateObservation) -> WaveDecision {
    let input = match observed {
        None => GateInput::NotAsked,
        Some(Ok(view)) => GateInput::View(view),
        Some(Err(Unreachable(why))) => GateInput::Unreachable(why),
    };
    rollout::decide(
        &plan.rollout,
        plan.serial,
        plan.issued_at,
        plan.wave,
        now,
        &input,
    )
}

/// Waits until the plan's wave opens, then sends [`GateEvent::Open`] and ends. Time is `started_at` plus
/// tokio's clock since the start (so a paused clock drives it in tests). Sends [`GateEvent::Waiting`] each
/// time the kind of wait changes. Ends when the engine drops the receiver or the plan sender.
pub async fn run(
    mut plan: watch::Receiver<GatePlan>,
    mut observed: watch::Receiver<GateObservation>,
    mut approvals: watch::Receiver<ApprovalObservation>,
    events: mpsc::Sender<GateEvent>,
    started_at: Timestamp,
) {
    let base = Instant::now();
    let mut last_kind = None;
    let mut last_awaiting = None;
    let mut last_window = None;
    loop {
        let elapsed = jiff::SignedDuration::try_from(base.elapsed()).unwrap_or_default();
        let now = started_at.checked_add(elapsed).unwrap_or(Timestamp::MAX);
        let current = plan.borrow_and_update().clone();
        let awaiting = current.awaiting_approval(&approvals.borrow_and_update());
        if let Some(report) = awaiting {
            if last_awaiting.as_ref() != Some(&report) {
                last_awaiting = Some(report.clone());
                if events.send(GateEvent::Waiting(report)).await.is_err() {
                    return;
                }
            }
            tokio::select! {
                changed = plan.changed() => if changed.is_err() { return },
                changed = approvals.changed() => if changed.is_err() { return },
            }
            continue;
        }
        let seen = observed.borrow_and_update().clone();
        let decision = judge(&current, now, &seen);
        if decision == WaveDecision::Open {
            let Some((report, look_again)) = current.window_wait(now) else {
                let _ = events.send(GateEvent::Open(current.serial)).await;
                return;
            };
            if last_window.as_ref() != Some(&report) {
                last_window = Some(report.clone());
                if events.send(GateEvent::Window(report)).await.is_err() {
                    return;
                }
            }
            // Looked at again at least hourly: a window without a next opening within a year still may.
            let left = look_again.map_or(WINDOW_RECHECK, |at| {
                at.duration_since(now).unsigned_abs().min(WINDOW_RECHECK)
            });
            let at = base + base.elapsed() + left;
            tokio::select! {
                () = tokio::time::sleep_until(at) => {}
                changed = plan.changed() => if changed.is_err() { return },
            }
            continue;
        }
        let kind = wait_kind(&decision, &current, &seen);
        if last_kind != Some(kind) {
            last_kind = Some(kind);
            let report = rollout::pending_report(
                &current.rollout,
                current.serial,
                current.issued_at,
                current.wave,
                &decision,
                now,
            );
            if events.send(GateEvent::Waiting(report)).await.is_err() {
                return;
            }
        }
        let sleep = match &decision {
            WaveDecision::Scheduled { opens_at } => {
                Some(opens_at.duration_since(now).unsigned_abs())
            }
            _ => None,
        };
        tokio::select! {
            () = sleep_until(sleep.map(|left| base + base.elapsed() + left)) => {}
            changed = plan.changed() => if changed.is_err() { return },
            changed = observed.changed() => if changed.is_err() {
                // The watcher ended: nothing new will come; wait on the schedule and the plan only.
                let (_, rx) = watch::channel(observed.borrow().clone());
                observed = rx;
            },
        }
    }
}

/// What a wait is reported by: once per kind of wait, not per change of its text (each report is a
/// heartbeat); for a gate, once more when what it rests on changes (no answer yet, the server's view,
/// unreachable); and again when the rollout's control changes.
fn wait_kind(
    decision: &WaveDecision,
    current: &GatePlan,
    seen: &GateObservation,
) -> (
    std::mem::Discriminant<WaveDecision>,
    u64,
    Option<Option<bool>>,
) {
    let rests_on =
        matches!(decision, WaveDecision::Gated { .. }).then(|| seen.as_ref().map(Result::is_ok));
    (
        std::mem::discriminant(decision),
        current.rollout.control,
        rests_on,
    )
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Where the gate reads the rollout view: the source server's base URL and a token it accepts (the fleet
/// registration token, or a read token).
#[derive(Debug, Clone)]
pub struct GateServer {
    pub url: String,
    pub token: String,
}

/// Reads the channel's rollout view every `every` and publishes it (or why it could not) until the
/// receivers are gone, starting `not_before` from now (one read before the wave's signed time: before it,
/// the schedule alone holds the wave, whatever the server says). It asks for the summary (`?summary=1`: every wave's
/// counts and only its clusters not done) with the ETag of the last answer, and a `304` keeps that answer.
/// Without a server, publishes once that there is none: the gate stays closed.
pub async fn watch_server(
    server: Option<GateServer>,
    channel: String,
    every: Duration,
    not_before: Duration,
    tx: watch::Sender<GateObservation>,
) {
    let Some(server) = server else {
        let _ = tx.send(Some(Err(Unreachable(
            "no --server configured to read the rollout status from".to_owned(),
        ))));
        tx.closed().await;
        return;
    };
    tokio::select! {
        () = tokio::time::sleep(not_before) => {}
        () = tx.closed() => return,
    }
    let client = reqwest::Client::new();
    let url = format!(
        "{}/api/v1/rollouts/{channel}?summary=1",
        server.url.trim_end_matches('/')
    );
    let mut last: Option<(String, RolloutView)> = None;
    loop {
        let observed = match fetch_view(&client, &url, &server.token, last.as_ref()).await {
            Ok(Fetched::Unchanged) => None,
            Ok(Fetched::View(etag, view)) => {
                last = etag.map(|etag| (etag, view.clone()));
                Some(Ok(view))
            }
            Err(why) => {
                warn!(%url, %why, "cannot read the rollout status; the wave gate stays closed");
                last = None;
                Some(Err(Unreachable(why.to_string())))
            }
        };
        if let Some(observed) = observed
            && tx.send(Some(observed)).is_err()
        {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = tx.closed() => return,
        }
    }
}

/// What one read of the rollout view brought.
enum Fetched {
    /// `304`: the view last read (whose ETag was sent) still holds.
    Unchanged,
    /// A view, and its ETag when the server sent one.
    View(Option<String>, RolloutView),
}

async fn fetch_view(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    last: Option<&(String, RolloutView)>,
) -> crate::Result<Fetched> {
    let fetched = with_deadline(url, VIEW_DEADLINE, async {
        let mut request = client.get(url).bearer_auth(token);
        if let Some((etag, _)) = last {
            request = request.header(reqwest::header::IF_NONE_MATCH, etag);
        }
        let response = request
            .send()
            .await
            .map_err(|e| crate::fetch::http::fetch_error(url, &e))?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_MODIFIED && last.is_some() {
            return Ok(None);
        }
        let etag = response
            .headers()
            .get(reqwest::header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = read_capped(url, response, MAX_VIEW_BYTES, "rollout view").await?;
        if !status.is_success() {
            return Err(crate::Error::Fetch {
                url: url.to_owned(),
                detail: format!("HTTP {status}"),
            });
        }
        Ok(Some((etag, body)))
    })
    .await?;
    let Some((etag, body)) = fetched else {
        return Ok(Fetched::Unchanged);
    };
    let view = serde_json::from_slice(&body).map_err(|source| crate::Error::Json {
        object: url.to_owned(),
        expected: "a rollout view",
        source,
    })?;
    Ok(Fetched::View(etag, view))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use windvane_shared::decide::rollout::{ClusterFacts, rollout_view};
    use windvane_shared::spec::rollout::{Gate, Wave};
    use windvane_shared::spec::selector::Labels;
    use windvane_shared::wire::fleet_api::ClusterState;

    use super::*;

    fn plan(soak: u64, gate: Gate) -> GatePlan {
        let mut canary = Wave {
            soak: Duration::from_secs(soak),
            gate,
            ..Wave::default()
        };
        canary
            .selector
            .match_labels
            .insert("tier".into(), "canary".into());
        GatePlan {
            serial: 3,
            issued_at: "2026-12-04T10:00:00Z".parse().expect("time"),
            rollout: Rollout {
                waves: vec![canary, Wave::default()],
                ..Rollout::default()
            },
            wave: 1,
            approval: None,
            windows: Vec::new(),
        }
    }

    fn channels(
        plan: GatePlan,
        observed: GateObservation,
    ) -> (
        watch::Sender<GatePlan>,
        watch::Sender<GateObservation>,
        mpsc::Receiver<GateEvent>,
        tokio::task::JoinHandle<()>,
    ) {
        let started = plan.issued_at;
        let (plan_tx, plan_rx) = watch::channel(plan);
        let (seen_tx, seen_rx) = watch::channel(observed);
        let (tx, rx) = mpsc::channel(8);
        let (_, approvals_rx) = watch::channel(None);
        let task = tokio::spawn(run(plan_rx, seen_rx, approvals_rx, tx, started));
        (plan_tx, seen_tx, rx, task)
    }

    #[test]
    fn the_first_wave_and_releases_without_rollout_need_no_gate() {
        let labels: Labels = [("tier".to_owned(), "canary".to_owned())].into();
        let rollout = plan(10, Gate::None).rollout;
        let issued = Timestamp::UNIX_EPOCH;
        assert!(GatePlan::of(1, issued, None, "a", &Labels::new()).is_none());
        assert!(GatePlan::of(1, issued, Some(&rollout), "a", &labels).is_none());
        let later = GatePlan::of(1, issued, Some(&rollout), "a", &Labels::new()).expect("wave 2");
        assert_eq!(later.wave, 1);
        assert!(!later.needs_server());
        assert!(plan(10, Gate::Healthy).needs_server());
    }

    #[tokio::test(start_paused = true)]
    async fn the_gate_wakes_when_the_wave_opens_and_not_before() {
        let (_plan, _seen, mut events, task) = channels(plan(600, Gate::None), None);
        match events.recv().await {
            Some(GateEvent::Waiting(report)) => {
                assert_eq!(report.message, "Pending (wave 2, opens in 10m)");
                assert_eq!(report.wave, 2);
            }
            other => panic!("{other:?}"),
        }
        tokio::time::sleep(Duration::from_secs(599)).await;
        assert!(events.try_recv().is_err(), "opened before its time");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(events.recv().await, Some(GateEvent::Open(3)));
        task.await.expect("gate task");
    }

    #[tokio::test(start_paused = true)]
    async fn awaiting_approval_is_reported_as_a_wait_not_as_a_window() {
        use windvane_shared::decide::approval::ApprovalStatement;
        use windvane_shared::spec::rollout::ApprovalPolicy;
        let mut first_wave = plan(0, Gate::None);
        first_wave.wave = 0;
        first_wave.approval = Some(ApprovalNeed {
            policy: ApprovalPolicy { threshold: 1 },
            statement: ApprovalStatement {
                fleet: "acme".into(),
                channel: "stable".into(),
                serial: 3,
                bundle_sha256: "0".repeat(64),
            },
            publisher_keyid: "publisher".into(),
            floor: 0,
        });
        let (_plan, _seen, mut events, _task) = channels(first_wave, None);
        match events.recv().await {
            Some(GateEvent::Waiting(report)) => {
                assert!(
                    report.message.starts_with("Awaiting approval (0 of 1)"),
                    "{}",
                    report.message
                );
                assert!(report.approval.is_some());
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_open_wave_still_waits_for_the_windows_of_the_apps_it_changes() {
        use windvane_shared::spec::window::{HealInWindow, Schedule, Window, WindowKind};
        // Issued 10:00Z; the app's deny window runs 09:00–10:30Z every day.
        let mut first_wave = plan(0, Gate::None);
        first_wave.wave = 0;
        first_wave.windows = vec![AppWindows {
            app: "web".into(),
            windows: vec![Window {
                kind: WindowKind::Deny,
                schedule: Schedule::parse("0 9 * * *").expect("schedule"),
                duration: Duration::from_secs(90 * 60),
                time_zone: "UTC".into(),
                heal: HealInWindow::Heal,
            }],
        }];
        let (_plan, _seen, mut events, task) = channels(first_wave, None);
        match events.recv().await {
            Some(GateEvent::Window(report)) => {
                assert!(report.message.contains("app web"), "{}", report.message);
                assert_eq!(
                    report.opens_at,
                    Some("2026-12-04T10:30:00Z".parse().expect("time"))
                );
            }
            other => panic!("{other:?}"),
        }
        tokio::time::sleep(Duration::from_secs(29 * 60)).await;
        assert!(events.try_recv().is_err(), "taken inside the deny window");
        tokio::time::sleep(Duration::from_secs(61)).await;
        assert_eq!(events.recv().await, Some(GateEvent::Open(3)));
        task.await.expect("gate task");
    }

    #[tokio::test(start_paused = true)]
    async fn a_healthy_gate_waits_for_the_server_and_fails_closed() {
        let plan = plan(10, Gate::Healthy);
        let rollout = plan.rollout.clone();
        let (_plan, seen, mut events, _task) = channels(plan, None);
        assert!(
            matches!(events.recv().await, Some(GateEvent::Waiting(r)) if r.message.contains("opens in 10s"))
        );
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert!(
            matches!(events.recv().await, Some(GateEvent::Waiting(r)) if r.message.contains("gated"))
        );
        seen.send(Some(Err(Unreachable("connection refused".into()))))
            .expect("send");
        assert!(
            matches!(events.recv().await, Some(GateEvent::Waiting(r)) if r.message.contains("connection refused"))
        );
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(
            events.try_recv().is_err(),
            "opened with the server unreachable"
        );

        let canary: Labels = [("tier".to_owned(), "canary".to_owned())].into();
        let facts = |state| ClusterFacts {
            name: "c1",
            labels: &canary,
            state,
            applied_serial: Some(3),
            waiting: None,
        };
        let issued = "2026-12-04T10:00:00Z".parse().expect("time");
        let degraded = rollout_view(
            "prod",
            3,
            issued,
            &rollout,
            &[facts(ClusterState::Degraded)],
            issued,
        );
        seen.send(Some(Ok(degraded))).expect("send");
        assert!(
            matches!(events.recv().await, Some(GateEvent::Waiting(r)) if r.message.contains("is Degraded"))
        );
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(events.try_recv().is_err(), "opened past a Degraded canary");
        let synced = rollout_view(
            "prod",
            3,
            issued,
            &rollout,
            &[facts(ClusterState::Synced)],
            issued,
        );
        seen.send(Some(Ok(synced))).expect("send");
        assert_eq!(events.recv().await, Some(GateEvent::Open(3)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_gate_reports_again_when_what_it_rests_on_changes_but_not_per_view() {
        let plan = plan(10, Gate::Healthy);
        let rollout = plan.rollout.clone();
        let (_plan, seen, mut events, _task) = channels(plan, None);
        assert!(
            matches!(events.recv().await, Some(GateEvent::Waiting(r)) if r.message.contains("opens in"))
        );
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert!(
            matches!(events.recv().await, Some(GateEvent::Waiting(r)) if r.message.contains("waiting for the server"))
        );
        let canary: Labels = [("tier".to_owned(), "canary".to_owned())].into();
        let issued = "2026-12-04T10:00:00Z".parse().expect("time");
        let view = |state| {
            rollout_view(
                "prod",
                3,
                issued,
                &rollout,
                &[ClusterFacts {
                    name: "c1",
                    labels: &canary,
                    state,
                    applied_serial: Some(3),
                    waiting: None,
                }],
                issued,
            )
        };
        // The first view after the wave's time: the report says what holds it.
        seen.send(Some(Ok(view(ClusterState::Degraded))))
            .expect("send");
        let report = events.recv().await;
        assert!(
            matches!(&report, Some(GateEvent::Waiting(r)) if r.message.contains("c1 (wave 1) is Degraded")),
            "{report:?}"
        );
        // Another view that still holds it: no new report (each one is a heartbeat).
        seen.send(Some(Ok(view(ClusterState::Progressing))))
            .expect("send");
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(events.try_recv().is_err(), "a report per view");
        seen.send(Some(Err(Unreachable("connection refused".into()))))
            .expect("send");
        assert!(
            matches!(events.recv().await, Some(GateEvent::Waiting(r)) if r.message.contains("cannot read the rollout status"))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_halt_holds_the_wave_past_its_time_and_a_resume_lets_it_go() {
        let mut halted = plan(10, Gate::None);
        halted.rollout.halted = true;
        halted.rollout.control = 1;
        let (plan_tx, _seen, mut events, _task) = channels(halted.clone(), None);
        assert!(matches!(events.recv().await, Some(GateEvent::Waiting(r)) if r.halted));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(events.try_recv().is_err(), "opened while halted");
        let mut resumed = halted;
        resumed.rollout.halted = false;
        resumed.rollout.control = 2;
        plan_tx.send(resumed).expect("send");
        assert_eq!(events.recv().await, Some(GateEvent::Open(3)));
    }
}
