//! The server's Prometheus metrics, kept and written by the Prometheus project's Rust client
//! (`prometheus-client`, through `windvane-metrics`, which also adds `windvane_build_info` and the process's
//! memory and CPU). Counters, gauges and histograms live in [`Metrics`] and are bumped by the handlers, the
//! ingest task and the notifier; fleet gauges are computed from the database at scrape time by the caller and
//! passed to [`render`]. Every name of the server's own starts with `windvane_`; every labelled series exists
//! from the start (at 0), so a rate over it never starts mid-way.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

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

/// One label and its value.
type Label = [(&'static str, &'static str); 1];
/// A counter per value of one label.
type Counters = Family<Label, Counter>;
/// A gauge holding a float (`Gauge<f64>` keeps its bits in an `AtomicU64`).
type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// A counter family with a series for each of `values` of `label`, registered as `name`.
fn counters(
    registry: &mut Registry,
    (name, help): (&str, &str),
    label: &'static str,
    values: &[&'static str],
) -> Counters {
    let family = Counters::default();
    for value in values {
        let _ = family.get_or_create(&[(label, *value)]);
    }
    registry.register(name, help, family.clone());
    family
}

fn registered<M: prometheus_client::registry::Metric + Clone>(
    registry: &mut Registry,
    (name, help): (&str, &str),
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// The server's counters, gauges and histograms, and the registry that writes them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    heartbeats: Counters,
    drift: Counters,
    enrolments: Counters,
    notifications: Counters,
    /// 1 while this replica leads the notification sender ([`crate::notify::outbox`]).
    pub notification_sender_leader: Gauge,
    pub ingest_batches: Counter,
    pub ingest_queue_depth: Gauge,
    /// Pointer polls being held (`Prefer: wait`).
    pub held_polls: Gauge,
    /// Held polls answered early to make room: for another poll of the same client address (`per_client`),
    /// and for a new connection when the connections were at their limit (`connections`).
    held_polls_evicted: Counters,
    /// Rollout views built from the database (at most one per channel and second).
    pub rollout_view_builds: Counter,
    /// Rollout view reads answered with the view (`ok`) and with `304` (`not_modified`).
    rollout_view_reads: Counters,
    /// How long storing a batch of heartbeats took (one transaction, its fsync included).
    pub ingest_commit_seconds: Histogram,
    /// Signatures per batched check.
    pub signature_batch_size: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut r = windvane_metrics::registry("windvane-server", env!("CARGO_PKG_VERSION"));
        let results = HeartbeatResult::ALL.map(HeartbeatResult::as_str);
        Metrics {
            heartbeats: counters(
                &mut r,
                ("windvane_heartbeats", "Heartbeats received, by outcome"),
                "result",
                &results,
            ),
            drift: counters(
                &mut r,
                (
                    "windvane_drift_events",
                    "Drift records received in accepted heartbeats, by severity",
                ),
                "severity",
                &["critical", "warning"],
            ),
            enrolments: counters(
                &mut r,
                ("windvane_enrolments", "Enrolment requests, by outcome"),
                "result",
                &["accepted", "refused"],
            ),
            notifications: counters(
                &mut r,
                (
                    "windvane_notifications",
                    "Notifications, by outcome per sink delivery",
                ),
                "result",
                &["sent", "failed", "dropped"],
            ),
            notification_sender_leader: registered(
                &mut r,
                (
                    "windvane_notification_sender_leader",
                    "1 on the replica that sends the fleet's notifications",
                ),
                Gauge::default(),
            ),
            ingest_batches: registered(
                &mut r,
                ("windvane_ingest_batches", "Heartbeat batches committed"),
                Counter::default(),
            ),
            ingest_queue_depth: registered(
                &mut r,
                (
                    "windvane_ingest_queue_depth",
                    "Heartbeats waiting for a batch",
                ),
                Gauge::default(),
            ),
            held_polls: registered(
                &mut r,
                (
                    "windvane_held_polls",
                    "Channel pointer polls held until the pointer changes",
                ),
                Gauge::default(),
            ),
            held_polls_evicted: counters(
                &mut r,
                (
                    "windvane_held_polls_evicted",
                    "Held polls answered early to make room (the agent then polls on its interval): for another \
                     poll of the same client address (per_client), or for a new connection when the connections \
                     were at their limit (connections)",
                ),
                "reason",
                &["per_client", "connections"],
            ),
            rollout_view_builds: registered(
                &mut r,
                (
                    "windvane_rollout_view_builds",
                    "Rollout views built from the database (at most one per channel and second; reads in between \
                     are served from the cache)",
                ),
                Counter::default(),
            ),
            rollout_view_reads: counters(
                &mut r,
                (
                    "windvane_rollout_view_reads",
                    "Reads of a channel's rollout view (JSON), by answer",
                ),
                "answer",
                &["ok", "not_modified"],
            ),
            ingest_commit_seconds: registered(
                &mut r,
                (
                    "windvane_ingest_commit_duration_seconds",
                    "Time to store one batch of heartbeats (one transaction, fsync included)",
                ),
                Histogram::new([
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                ]),
            ),
            signature_batch_size: registered(
                &mut r,
                (
                    "windvane_signature_batch_size",
                    "Heartbeat signatures checked together in one batch",
                ),
                Histogram::new([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]),
            ),
            registry: r,
        }
    }
}

impl Metrics {
    pub fn heartbeat(&self, result: HeartbeatResult) {
        self.heartbeats
            .get_or_create(&[("result", result.as_str())])
            .inc();
    }

    pub fn heartbeat_count(&self, result: HeartbeatResult) -> u64 {
        self.heartbeats
            .get_or_create(&[("result", result.as_str())])
            .get()
    }

    /// Counts the drift records of an accepted heartbeat, `critical` of them critical.
    pub fn drift(&self, records: usize, critical: usize) {
        let warning = records.saturating_sub(critical);
        self.drift
            .get_or_create(&[("severity", "critical")])
            .inc_by(critical as u64);
        self.drift
            .get_or_create(&[("severity", "warning")])
            .inc_by(warning as u64);
    }

    /// Counts an enrolment request, `accepted` or refused.
    pub fn enrolment(&self, accepted: bool) {
        let result = if accepted { "accepted" } else { "refused" };
        self.enrolments.get_or_create(&[("result", result)]).inc();
    }

    /// Counts a notification delivery by result: `sent`, `failed` (given up) or `dropped` (queue full).
    pub fn notification(&self, result: &'static str) {
        self.notifications
            .get_or_create(&[("result", result)])
            .inc();
    }

    /// Counts a held poll answered early to make room, by reason: `per_client` or `connections`.
    pub fn held_poll_evicted(&self, reason: &'static str) {
        self.held_polls_evicted
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    /// Counts a read of a rollout view, answered with `304` or with the view.
    pub fn rollout_view_read(&self, not_modified: bool) {
        let answer = if not_modified { "not_modified" } else { "ok" };
        self.rollout_view_reads
            .get_or_create(&[("answer", answer)])
            .inc();
    }
}

/// Fleet figures computed at scrape time.
#[derive(Debug, Default)]
pub struct FleetGauges {
    pub counts: Vec<(ClusterState, u64)>,
    /// Heartbeat age of every cluster that has sent one.
    pub ages: Vec<Duration>,
}

/// The exposition text: the server's metrics, then the fleet's.
pub fn render(metrics: &Metrics, fleet: &FleetGauges) -> String {
    let mut text = windvane_metrics::encode(&metrics.registry);
    text.push_str(&windvane_metrics::encode(&fleet_registry(fleet)));
    text
}

/// The clusters by state and how long ago each last sent a heartbeat, in a registry built for one scrape.
/// The ages are written as a summary's series (`quantile` 0.5, 0.9, 0.99 and 1, `_sum`, `_count`); the client
/// has no summary type, so each is a gauge of that name.
fn fleet_registry(fleet: &FleetGauges) -> Registry {
    let mut registry = Registry::default();
    let clusters = Family::<[(&'static str, String); 1], Gauge>::default();
    for (state, count) in &fleet.counts {
        clusters
            .get_or_create(&[("state", state.as_str().to_owned())])
            .set(i64::try_from(*count).unwrap_or(i64::MAX));
    }
    registry.register(
        "windvane_clusters",
        "Enrolled clusters by the state the server shows",
        windvane_metrics::AlwaysDescribed(clusters),
    );
    let mut ages: Vec<f64> = fleet.ages.iter().map(Duration::as_secs_f64).collect();
    ages.sort_by(f64::total_cmp);
    let quantiles = Family::<[(&'static str, String); 1], FloatGauge>::default();
    for q in [0.5, 0.9, 0.99, 1.0] {
        quantiles
            .get_or_create(&[("quantile", q.to_string())])
            .set(quantile(&ages, q));
    }
    const AGE_HELP: &str = "Time since each cluster's last heartbeat, across the fleet";
    registry.register("windvane_heartbeat_age_seconds", AGE_HELP, quantiles);
    let sum = FloatGauge::default();
    sum.set(ages.iter().sum::<f64>());
    registry.register("windvane_heartbeat_age_seconds_sum", AGE_HELP, sum);
    let count = Gauge::<i64>::default();
    count.set(i64::try_from(ages.len()).unwrap_or(i64::MAX));
    registry.register("windvane_heartbeat_age_seconds_count", AGE_HELP, count);
    registry
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
        metrics.drift(3, 1);
        metrics.enrolment(false);
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
            "windvane_heartbeat_age_seconds{quantile=\"1\"} 100.0",
            "windvane_enrolments_total{result=\"refused\"} 1",
            "windvane_enrolments_total{result=\"accepted\"} 0",
            "windvane_build_info{binary=\"windvane-server\",version=\"0.1.0\"} 1",
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
            assert!(
                line.starts_with("windvane_") || line.starts_with("process_"),
                "{line}"
            );
        }
        assert!(
            !text.contains("enrollments"),
            "one spelling on both binaries"
        );
        assert!(text.contains("\nprocess_resident_memory_bytes "), "{text}");
        assert!(text.contains("\nprocess_cpu_seconds_total "), "{text}");
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let values = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&values, 0.5), 2.0);
        assert_eq!(quantile(&values, 1.0), 4.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }
}
