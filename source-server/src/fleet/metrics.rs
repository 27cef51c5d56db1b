//! Prometheus metrics, written by hand in the text exposition format (a handful of counters and gauges do
//! not need a registry). Counters live in [`Metrics`] and are bumped by the handlers, the ingest task and
//! the notifier; fleet gauges are computed from the database at scrape time by the caller and passed to
//! [`render`]. Every name starts with `windvane_`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::fleet::status::ClusterState;

/// Why a heartbeat was answered as it was: the `result` label of `windvane_heartbeats_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeartbeatResult {
    Accepted,
    Malformed,
    TooLarge,
    UnknownCluster,
    BadSignature,
    ClusterMismatch,
    ClockSkew,
    Replay,
    Overloaded,
    Error,
}

impl HeartbeatResult {
    pub const ALL: [HeartbeatResult; 10] = [
        HeartbeatResult::Accepted,
        HeartbeatResult::Malformed,
        HeartbeatResult::TooLarge,
        HeartbeatResult::UnknownCluster,
        HeartbeatResult::BadSignature,
        HeartbeatResult::ClusterMismatch,
        HeartbeatResult::ClockSkew,
        HeartbeatResult::Replay,
        HeartbeatResult::Overloaded,
        HeartbeatResult::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HeartbeatResult::Accepted => "accepted",
            HeartbeatResult::Malformed => "malformed",
            HeartbeatResult::TooLarge => "too_large",
            HeartbeatResult::UnknownCluster => "unknown_cluster",
            HeartbeatResult::BadSignature => "bad_signature",
            HeartbeatResult::ClusterMismatch => "cluster_mismatch",
            HeartbeatResult::ClockSkew => "clock_skew",
            HeartbeatResult::Replay => "replay",
            HeartbeatResult::Overloaded => "overloaded",
            HeartbeatResult::Error => "error",
        }
    }
}

/// The server's counters.
#[derive(Debug)]
pub struct Metrics {
    heartbeats: [AtomicU64; 10],
    pub drift_events: AtomicU64,
    pub drift_critical: AtomicU64,
    pub enrollments_ok: AtomicU64,
    pub enrollments_refused: AtomicU64,
    pub notifications_sent: AtomicU64,
    pub notifications_failed: AtomicU64,
    pub notifications_dropped: AtomicU64,
    /// Whether this replica leads the notification sender ([`crate::notify::outbox`]).
    pub notification_sender_leader: AtomicBool,
    pub ingest_batches: AtomicU64,
    pub ingest_queue_depth: AtomicU64,
    /// Pointer polls being held (`Prefer: wait`).
    pub held_polls: AtomicU64,
    /// Held polls answered early to make room: for another poll of the same client address, and for a new
    /// connection when the connections were at their limit.
    pub held_polls_evicted_per_client: AtomicU64,
    pub held_polls_evicted_for_connection: AtomicU64,
    /// Rollout views built from the database (at most one per channel and second).
    pub rollout_view_builds: AtomicU64,
    /// Rollout view reads answered with the view (`200`) and with `304`.
    pub rollout_view_sent: AtomicU64,
    pub rollout_view_not_modified: AtomicU64,
    /// How long storing a batch of heartbeats took (one transaction, its fsync included).
    pub ingest_commit_seconds: Histogram<11>,
    /// Signatures per batched check.
    pub signature_batch_size: Histogram<7>,
}

/// A Prometheus histogram with fixed upper bounds, updated without locks.
#[derive(Debug)]
pub struct Histogram<const N: usize> {
    bounds: [f64; N],
    /// Observations at or below each bound (not cumulative; the last slot is above every bound).
    counts: [AtomicU64; N],
    above: AtomicU64,
    /// The sum, in millionths of the unit.
    sum_micros: AtomicU64,
}

impl<const N: usize> Histogram<N> {
    pub fn new(bounds: [f64; N]) -> Self {
        Histogram {
            bounds,
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            above: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, value: f64) {
        match self.bounds.iter().position(|bound| value <= *bound) {
            Some(i) => self.counts[i].fetch_add(1, Ordering::Relaxed),
            None => self.above.fetch_add(1, Ordering::Relaxed),
        };
        self.sum_micros
            .fetch_add((value * 1e6).round() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        header(out, name, "histogram", help);
        let mut cumulative = 0;
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            cumulative += count.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        cumulative += self.above.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {cumulative}");
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            heartbeats: Default::default(),
            drift_events: AtomicU64::new(0),
            drift_critical: AtomicU64::new(0),
            enrollments_ok: AtomicU64::new(0),
            enrollments_refused: AtomicU64::new(0),
            notifications_sent: AtomicU64::new(0),
            notifications_failed: AtomicU64::new(0),
            notifications_dropped: AtomicU64::new(0),
            notification_sender_leader: AtomicBool::new(false),
            ingest_batches: AtomicU64::new(0),
            ingest_queue_depth: AtomicU64::new(0),
            held_polls: AtomicU64::new(0),
            held_polls_evicted_per_client: AtomicU64::new(0),
            held_polls_evicted_for_connection: AtomicU64::new(0),
            rollout_view_builds: AtomicU64::new(0),
            rollout_view_sent: AtomicU64::new(0),
            rollout_view_not_modified: AtomicU64::new(0),
            ingest_commit_seconds: Histogram::new([
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ]),
            signature_batch_size: Histogram::new([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]),
        }
    }
}

impl Metrics {
    pub fn heartbeat(&self, result: HeartbeatResult) {
        self.heartbeats[result as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn heartbeat_count(&self, result: HeartbeatResult) -> u64 {
        self.heartbeats[result as usize].load(Ordering::Relaxed)
    }
}

/// Fleet figures computed at scrape time.
#[derive(Debug, Default)]
pub struct FleetGauges {
    pub counts: Vec<(ClusterState, u64)>,
    /// Heartbeat age of every cluster that has sent one.
    pub ages: Vec<Duration>,
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A metric of one unlabelled series: its `(name, type)`, help and value.
fn single(out: &mut String, (name, kind): (&str, &str), help: &str, value: impl std::fmt::Display) {
    header(out, name, kind, help);
    let _ = writeln!(out, "{name} {value}");
}

/// A counter with one label, a series per `(label value, count)`.
fn labelled<'a>(
    out: &mut String,
    (name, label): (&str, &str),
    help: &str,
    series: impl IntoIterator<Item = (&'a str, u64)>,
) {
    header(out, name, "counter", help);
    for (value, count) in series {
        let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {count}");
    }
}

fn load(value: &AtomicU64) -> u64 {
    value.load(Ordering::Relaxed)
}

/// The exposition text.
pub fn render(metrics: &Metrics, fleet: &FleetGauges) -> String {
    let mut out = String::with_capacity(4096);
    render_fleet(&mut out, metrics, fleet);
    render_deliveries(&mut out, metrics);
    render_ingest(&mut out, metrics);
    out
}

/// The clusters: their states, their heartbeats and how long ago each last sent one.
fn render_fleet(out: &mut String, metrics: &Metrics, fleet: &FleetGauges) {
    header(
        out,
        "windvane_clusters",
        "gauge",
        "Enrolled clusters by the state the server shows.",
    );
    for (state, count) in &fleet.counts {
        let _ = writeln!(out, "windvane_clusters{{state=\"{state}\"}} {count}");
    }
    labelled(
        out,
        ("windvane_heartbeats_total", "result"),
        "Heartbeats received, by outcome.",
        HeartbeatResult::ALL.map(|result| (result.as_str(), metrics.heartbeat_count(result))),
    );
    let mut ages: Vec<f64> = fleet.ages.iter().map(Duration::as_secs_f64).collect();
    ages.sort_by(f64::total_cmp);
    header(
        out,
        "windvane_heartbeat_age_seconds",
        "summary",
        "Time since each cluster's last heartbeat, across the fleet.",
    );
    for q in [0.5, 0.9, 0.99, 1.0] {
        let value = quantile(&ages, q);
        let _ = writeln!(
            out,
            "windvane_heartbeat_age_seconds{{quantile=\"{q}\"}} {value:.3}"
        );
    }
    let _ = writeln!(
        out,
        "windvane_heartbeat_age_seconds_sum {:.3}",
        ages.iter().sum::<f64>()
    );
    let _ = writeln!(out, "windvane_heartbeat_age_seconds_count {}", ages.len());
}

/// What came in and went out besides heartbeats: drift records, enrolments, notifications.
fn render_deliveries(out: &mut String, metrics: &Metrics) {
    let critical = load(&metrics.drift_critical);
    labelled(
        out,
        ("windvane_drift_events_total", "severity"),
        "Drift records received in accepted heartbeats, by severity.",
        [
            ("critical", critical),
            (
                "warning",
                load(&metrics.drift_events).saturating_sub(critical),
            ),
        ],
    );
    labelled(
        out,
        ("windvane_enrollments_total", "result"),
        "Enrolment requests, by outcome.",
        [
            ("accepted", load(&metrics.enrollments_ok)),
            ("refused", load(&metrics.enrollments_refused)),
        ],
    );
    labelled(
        out,
        ("windvane_notifications_total", "result"),
        "Notifications, by outcome per sink delivery.",
        [
            ("sent", load(&metrics.notifications_sent)),
            ("failed", load(&metrics.notifications_failed)),
            ("dropped", load(&metrics.notifications_dropped)),
        ],
    );
    single(
        out,
        ("windvane_notification_sender_leader", "gauge"),
        "1 on the replica that sends the fleet's notifications.",
        u8::from(metrics.notification_sender_leader.load(Ordering::Relaxed)),
    );
}

/// The server's own work: heartbeat batches, held polls, rollout views.
fn render_ingest(out: &mut String, metrics: &Metrics) {
    single(
        out,
        ("windvane_ingest_batches_total", "counter"),
        "Heartbeat batches committed.",
        load(&metrics.ingest_batches),
    );
    single(
        out,
        ("windvane_ingest_queue_depth", "gauge"),
        "Heartbeats waiting for a batch.",
        load(&metrics.ingest_queue_depth),
    );
    single(
        out,
        ("windvane_held_polls", "gauge"),
        "Channel pointer polls held until the pointer changes.",
        load(&metrics.held_polls),
    );
    labelled(
        out,
        ("windvane_held_polls_evicted_total", "reason"),
        "Held polls answered early to make room (the agent then polls on its interval): for another poll of \
         the same client address (per_client), or for a new connection when the connections were at their \
         limit (connections).",
        [
            ("per_client", load(&metrics.held_polls_evicted_per_client)),
            (
                "connections",
                load(&metrics.held_polls_evicted_for_connection),
            ),
        ],
    );
    single(
        out,
        ("windvane_rollout_view_builds_total", "counter"),
        "Rollout views built from the database (at most one per channel and second; reads in between are served from the cache).",
        load(&metrics.rollout_view_builds),
    );
    labelled(
        out,
        ("windvane_rollout_view_reads_total", "answer"),
        "Reads of a channel's rollout view (JSON), by answer.",
        [
            ("ok", load(&metrics.rollout_view_sent)),
            ("not_modified", load(&metrics.rollout_view_not_modified)),
        ],
    );
    metrics.ingest_commit_seconds.render(
        out,
        "windvane_ingest_commit_duration_seconds",
        "Time to store one batch of heartbeats (one transaction, fsync included).",
    );
    metrics.signature_batch_size.render(
        out,
        "windvane_signature_batch_size",
        "Heartbeat signatures checked together in one batch.",
    );
}

/// The `q` quantile of sorted values (nearest rank); zero when there are none.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::status::rollup;

    #[test]
    fn exposition_has_every_family() {
        let metrics = Metrics::default();
        metrics.heartbeat(HeartbeatResult::Accepted);
        metrics.heartbeat(HeartbeatResult::Replay);
        metrics.drift_events.fetch_add(3, Ordering::Relaxed);
        metrics.drift_critical.fetch_add(1, Ordering::Relaxed);
        metrics.ingest_commit_seconds.observe(0.004);
        metrics.ingest_commit_seconds.observe(3.0);
        let fleet = FleetGauges {
            counts: rollup([ClusterState::Unknown, ClusterState::Synced]),
            ages: vec![Duration::from_secs(10), Duration::from_secs(100)],
        };
        let text = render(&metrics, &fleet);
        for line in [
            "windvane_clusters{state=\"Unknown\"} 1",
            "windvane_clusters{state=\"Synced\"} 1",
            "windvane_clusters{state=\"Failed\"} 0",
            "windvane_heartbeats_total{result=\"accepted\"} 1",
            "windvane_heartbeats_total{result=\"replay\"} 1",
            "windvane_heartbeat_age_seconds{quantile=\"1\"} 100.000",
            "windvane_heartbeat_age_seconds_count 2",
            "windvane_drift_events_total{severity=\"critical\"} 1",
            "windvane_drift_events_total{severity=\"warning\"} 2",
            "windvane_ingest_commit_duration_seconds_bucket{le=\"0.005\"} 1",
            "windvane_ingest_commit_duration_seconds_bucket{le=\"+Inf\"} 2",
            "windvane_ingest_commit_duration_seconds_sum 3.004",
            "windvane_ingest_commit_duration_seconds_count 2",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("windvane_"), "{line}");
        }
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let values = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&values, 0.5), 2.0);
        assert_eq!(quantile(&values, 1.0), 4.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }
}
