//! The agent's Prometheus metrics, kept by the Prometheus project's Rust client (`prometheus-client`, through
//! `windvane-metrics`, which also adds `windvane_build_info` and the process's memory and CPU, as on the
//! server) and written in the text exposition format on `/metrics`. The engine records syncs, applies and the
//! source's state; the healer (`heal/mod.rs`) records drift; the admin server renders.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use windvane_metrics::{AlwaysDescribed, prometheus_client};
use windvane_shared::wire::status::SyncState;

/// Upper bounds of the sync duration histogram, in seconds.
const SYNC_BUCKETS: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
/// Upper bounds of the drift repair histogram, in seconds: a revert at once takes milliseconds, one after a
/// grace period, a hold or a contested back-off takes minutes.
const REPAIR_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// Most field managers that get a `manager` label of their own on `windvane_drift_detected_total`.
const MAX_MANAGER_LABELS: usize = 20;
/// Longest manager name kept as a label (Kubernetes allows 128 bytes).
const MAX_MANAGER_LEN: usize = 64;
/// The label of drift by a manager past the cap, or with a name too long or unprintable.
pub const OTHER_MANAGER: &str = "other";
/// The label of drift no manager can be named for (a deletion, or found by the backstop).
pub const UNKNOWN_MANAGER: &str = "unknown";

/// Counters by the `result` the agent names (its own words: `ok`, `written`, a refusal reason, …).
type ByResult = Family<[(&'static str, String); 1], Counter>;

/// A gauge from a count (clamped: a gauge holds an `i64`).
fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The agent's metrics and the registry that writes them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    source_fetch: ByResult,
    enrolments: ByResult,
    apply: ByResult,
    /// Objects that failed to apply and are retried alone ([`crate::retry`]).
    apply_retrying: Gauge,
    /// The serial enforced: no sample until a release is.
    release_serial: Family<Vec<(String, String)>, Gauge>,
    source_stale: Gauge,
    /// The wave (1-based) a held release waits for; 0 when none waits.
    rollout_waiting_wave: Gauge,
    /// Whether a held release waits for the maintenance windows of the apps it changes.
    window_waiting: Gauge,
    /// Apps whose drift is only reported now, inside a `heal: report` deny window.
    window_report_only_apps: Gauge,
    /// Approvals the held release needs, and how many count so far (0, 0 when none waits for approval).
    approvals_required: Gauge,
    approvals_valid: Gauge,
    /// Approval signatures refused (forged, wrong release, publisher's key, unknown key), by counting.
    approvals_refused: Counter,
    objects: Family<[(&'static str, &'static str); 1], Gauge>,
    sync: Histogram,
    /// Drift detected, by kind and manager label.
    drift_detected: Family<[(&'static str, String); 2], Counter>,
    /// The managers that have a label of their own (at most [`MAX_MANAGER_LABELS`]).
    drift_managers: Mutex<BTreeSet<String>>,
    drift_reverted: Counter,
    drift_repair: Histogram,
    drift_contested: Gauge,
    drift_held: Gauge,
}

/// Registers `metric` as `name`, written with its HELP and TYPE even before its first sample (as the agent
/// always wrote them), and returns it.
fn registered<M: prometheus_client::registry::Metric + Clone>(
    registry: &mut Registry,
    (name, help): (&str, &str),
    metric: M,
) -> M {
    registry.register(name, help, AlwaysDescribed(metric.clone()));
    metric
}

impl Default for Metrics {
    fn default() -> Self {
        let mut r = windvane_metrics::registry("windvane-agent", env!("CARGO_PKG_VERSION"));
        // Help texts have no final period: the registry adds one.
        let source_fetch = registered(
            &mut r,
            (
                "windvane_source_fetch",
                "Polls of the release source, by result",
            ),
            ByResult::default(),
        );
        let enrolments = registered(
            &mut r,
            (
                "windvane_enrolments",
                "Enrolments at the source server, by result (more than one `enrolled` means the server forgot \
                 this cluster and it enrolled again)",
            ),
            ByResult::default(),
        );
        let apply = registered(
            &mut r,
            ("windvane_apply", "Object applies, by result"),
            ByResult::default(),
        );
        let apply_retrying = registered(
            &mut r,
            (
                "windvane_apply_retrying",
                "Objects that failed to apply and are retried alone, each on its own back-off",
            ),
            Gauge::default(),
        );
        let release_serial = registered(
            &mut r,
            (
                "windvane_release_serial",
                "Serial of the release being enforced",
            ),
            Family::default(),
        );
        let source_stale = registered(
            &mut r,
            (
                "windvane_source_stale",
                "1 while the release source cannot be reached (the last known good release is enforced), else 0",
            ),
            Gauge::default(),
        );
        let rollout_waiting_wave = registered(
            &mut r,
            (
                "windvane_rollout_waiting_wave",
                "The rollout wave (1-based) a verified newer release waits for on this cluster, 0 when none waits",
            ),
            Gauge::default(),
        );
        let window_waiting = registered(
            &mut r,
            (
                "windvane_window_waiting",
                "1 while a verified newer release waits for the maintenance windows of the apps it changes, else 0",
            ),
            Gauge::default(),
        );
        let window_report_only_apps = registered(
            &mut r,
            (
                "windvane_window_report_only_apps",
                "Apps whose drift is only reported, not healed, because a deny window with heal: report is active",
            ),
            Gauge::default(),
        );
        let approvals_required = registered(
            &mut r,
            (
                "windvane_approvals_required",
                "Approvals the verified release waiting for approval needs, 0 when none waits",
            ),
            Gauge::default(),
        );
        let approvals_valid = registered(
            &mut r,
            (
                "windvane_approvals_valid",
                "Approvals of the waiting release that count (trusted approver keys, not the publisher's)",
            ),
            Gauge::default(),
        );
        let approvals_refused = registered(
            &mut r,
            (
                "windvane_approvals_refused",
                "Approval signatures refused: bad signature, another release, the publisher's key or an unknown key",
            ),
            Counter::default(),
        );
        let objects = Family::default();
        for state in SyncState::ALL {
            let _ = objects.get_or_create(&[("state", state.as_str())]);
        }
        let objects = registered(
            &mut r,
            ("windvane_objects", "Managed objects, by state"),
            objects,
        );
        let sync = registered(
            &mut r,
            (
                "windvane_sync_duration_seconds",
                "Time to render, apply and prune a release",
            ),
            Histogram::new(SYNC_BUCKETS.iter().copied()),
        );
        let drift_help = format!(
            "Drift detected on managed objects, by kind and the field manager that made it (`{UNKNOWN_MANAGER}` \
             when none can be named, `{OTHER_MANAGER}` past the first {MAX_MANAGER_LABELS} managers)",
        );
        let drift_detected = registered(
            &mut r,
            ("windvane_drift_detected", &drift_help),
            Family::default(),
        );
        let drift_reverted = registered(
            &mut r,
            ("windvane_drift_reverted", "Drifts reverted by the healer"),
            Counter::default(),
        );
        let drift_repair = registered(
            &mut r,
            (
                "windvane_drift_repair_seconds",
                "Time from a drift's detection to its revert being applied (grace periods, holds and back-offs \
                 included)",
            ),
            Histogram::new(REPAIR_BUCKETS.iter().copied()),
        );
        let drift_contested = registered(
            &mut r,
            (
                "windvane_drift_contested_objects",
                "Objects whose drift is not reverted for a back-off because another manager keeps taking their \
                 fields",
            ),
            Gauge::default(),
        );
        let drift_held = registered(
            &mut r,
            (
                "windvane_drift_held_objects",
                "Objects whose drift is not reverted because an operator holds them (windvane.io/hold-until)",
            ),
            Gauge::default(),
        );
        Metrics {
            registry: r,
            source_fetch,
            enrolments,
            apply,
            apply_retrying,
            release_serial,
            source_stale,
            rollout_waiting_wave,
            window_waiting,
            window_report_only_apps,
            approvals_required,
            approvals_valid,
            approvals_refused,
            objects,
            sync,
            drift_detected,
            drift_managers: Mutex::new(BTreeSet::new()),
            drift_reverted,
            drift_repair,
            drift_contested,
            drift_held,
        }
    }
}

impl Metrics {
    /// Counts a poll of the source by result (`ok`, `not_modified`, a refusal reason, `fetch`, …).
    pub fn source_fetch(&self, result: &str) {
        self.source_fetch
            .get_or_create(&[("result", result.to_owned())])
            .inc();
    }

    /// Counts an enrolment at the source server by result (`enrolled`, `already_enrolled`, `rekeyed`,
    /// `conflict`, `refused`, `error`).
    pub fn enrolment(&self, result: &str) {
        self.enrolments
            .get_or_create(&[("result", result.to_owned())])
            .inc();
    }

    /// Counts an object apply by result (`written`, `unchanged`, `failed`, `refused`).
    pub fn apply(&self, result: &str) {
        self.apply
            .get_or_create(&[("result", result.to_owned())])
            .inc();
    }

    /// The serial of the release being enforced.
    pub fn set_release_serial(&self, serial: u64) {
        self.release_serial
            .get_or_create(&Vec::new())
            .set(count(serial));
    }

    /// The wave a held release waits for (`waiting`), or none.
    pub fn set_rollout_wave(&self, wave: u32, waiting: bool) {
        self.rollout_waiting_wave
            .set(if waiting { i64::from(wave) } else { 0 });
    }

    /// Whether a held release waits for a maintenance window.
    pub fn set_window_waiting(&self, waiting: bool) {
        self.window_waiting.set(i64::from(waiting));
    }

    /// How many apps only report drift now, inside a `heal: report` deny window.
    pub fn set_window_report_only_apps(&self, apps: usize) {
        self.window_report_only_apps.set(count(apps as u64));
    }

    /// The approvals a held release needs and has (both 0 when none waits for approval).
    pub fn set_approvals(&self, required: u32, valid: u32) {
        self.approvals_required.set(i64::from(required));
        self.approvals_valid.set(i64::from(valid));
    }

    /// Counts approval signatures that were refused when the approval file was read anew.
    pub fn approvals_refused(&self, refused: usize) {
        self.approvals_refused.inc_by(refused as u64);
    }

    /// Whether the source is stale: it cannot be reached, so the last known good release is enforced.
    pub fn set_source_stale(&self, stale: bool) {
        self.source_stale.set(i64::from(stale));
    }

    /// How many objects that failed to apply are retried alone.
    pub fn set_apply_retrying(&self, objects: usize) {
        self.apply_retrying.set(count(objects as u64));
    }

    /// Object counts per state.
    pub fn set_objects(&self, counts: &BTreeMap<SyncState, u64>) {
        for state in SyncState::ALL {
            let n = counts.get(&state).copied().unwrap_or(0);
            self.objects
                .get_or_create(&[("state", state.as_str())])
                .set(count(n));
        }
    }

    /// Records how long a sync took.
    pub fn observe_sync(&self, elapsed: Duration) {
        self.sync.observe(elapsed.as_secs_f64());
    }

    /// Counts a drift detected on an object of `kind`, made by field manager `manager` (`None` when none
    /// can be named). The manager label is clamped with [`manager_label`].
    pub fn drift_detected(&self, kind: &str, manager: Option<&str>) {
        let label = {
            let mut managers = self.drift_managers.lock().expect("metrics lock");
            let label = manager_label(manager, &managers);
            if manager == Some(label) {
                managers.insert(label.to_owned());
            }
            label.to_owned()
        };
        self.drift_detected
            .get_or_create(&[("kind", kind.to_owned()), ("manager", label)])
            .inc();
    }

    /// Counts a drift reverted, `after` its detection when that is known.
    pub fn drift_reverted(&self, after: Option<Duration>) {
        self.drift_reverted.inc();
        if let Some(after) = after {
            self.drift_repair.observe(after.as_secs_f64());
        }
    }

    /// How many objects are Contested and how many Held now.
    pub fn set_drift_open(&self, contested: u64, held: u64) {
        self.drift_contested.set(count(contested));
        self.drift_held.set(count(held));
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        windvane_metrics::encode(&self.registry)
    }
}

/// The `manager` label for drift by `manager`, given the managers labelled so far. The cluster, not the
/// release, names field managers, and anyone who can write an object can pick any name (up to 128 bytes) for
/// every write: left unclamped, a hostile or buggy client could make one series per write and exhaust the
/// agent's memory and the Prometheus server. So only the first [`MAX_MANAGER_LABELS`] managers seen, of at
/// most [`MAX_MANAGER_LEN`] printable ASCII characters, have a label of their own; the rest count as
/// [`OTHER_MANAGER`], and so do managers spelled like the two fixed labels, which cannot be taken over.
pub fn manager_label<'a>(manager: Option<&'a str>, labelled: &BTreeSet<String>) -> &'a str {
    let Some(manager) = manager else {
        return UNKNOWN_MANAGER;
    };
    if labelled.contains(manager) {
        return manager;
    }
    let printable = manager.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
    let reserved = manager == OTHER_MANAGER || manager == UNKNOWN_MANAGER;
    if labelled.len() >= MAX_MANAGER_LABELS
        || manager.is_empty()
        || manager.len() > MAX_MANAGER_LEN
        || !printable
        || reserved
    {
        return OTHER_MANAGER;
    }
    manager
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_every_metric() {
        let metrics = Metrics::default();
        metrics.source_fetch("ok");
        metrics.source_fetch("ok");
        metrics.apply("written");
        metrics.enrolment("enrolled");
        metrics.set_release_serial(7);
        metrics.set_objects(&BTreeMap::from([(SyncState::Synced, 3)]));
        metrics.observe_sync(Duration::from_millis(300));
        let text = metrics.render();
        assert!(
            text.contains("windvane_source_fetch_total{result=\"ok\"} 2"),
            "{text}"
        );
        assert!(text.contains("windvane_apply_total{result=\"written\"} 1"));
        assert!(text.contains("windvane_enrolments_total{result=\"enrolled\"} 1"));
        assert!(text.contains(&format!(
            "windvane_build_info{{binary=\"windvane-agent\",version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        )));
        assert!(text.contains("\nprocess_resident_memory_bytes "), "{text}");
        assert!(text.contains("windvane_release_serial 7"));
        assert!(text.contains("windvane_source_stale 0"));
        assert!(text.contains("windvane_rollout_waiting_wave 0"));
        assert!(text.contains("windvane_approvals_required 0"));
        metrics.set_approvals(1, 0);
        metrics.approvals_refused(2);
        let approvals = metrics.render();
        assert!(approvals.contains("windvane_approvals_required 1"));
        assert!(approvals.contains("windvane_approvals_refused_total 2"));
        metrics.set_rollout_wave(2, true);
        assert!(metrics.render().contains("windvane_rollout_waiting_wave 2"));
        assert!(text.contains("windvane_window_waiting 0"));
        metrics.set_window_waiting(true);
        metrics.set_window_report_only_apps(2);
        let windows = metrics.render();
        assert!(windows.contains("windvane_window_waiting 1"), "{windows}");
        assert!(
            windows.contains("windvane_window_report_only_apps 2"),
            "{windows}"
        );
        metrics.set_source_stale(true);
        assert!(metrics.render().contains("windvane_source_stale 1"));
        assert!(text.contains("windvane_objects{state=\"Synced\"} 3"));
        assert!(text.contains("windvane_objects{state=\"Failed\"} 0"));
        assert!(text.contains("windvane_sync_duration_seconds_bucket{le=\"0.25\"} 0"));
        assert!(text.contains("windvane_sync_duration_seconds_bucket{le=\"0.5\"} 1"));
        assert!(text.contains("windvane_sync_duration_seconds_count 1"));
    }

    /// The lines of `text` about metric `name`: its HELP and TYPE lines and its samples.
    fn family<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        text.lines()
            .filter(|l| {
                let sample = l
                    .strip_prefix("# HELP ")
                    .or_else(|| l.strip_prefix("# TYPE "));
                let metric = sample.unwrap_or(l);
                metric.starts_with(name) && metric[name.len()..].starts_with([' ', '{', '_'])
            })
            .collect()
    }

    #[test]
    fn every_metric_has_help_and_type_before_its_samples() {
        let metrics = Metrics::default();
        metrics.source_fetch("ok");
        metrics.drift_detected("Deployment", Some("kubectl-scale"));
        metrics.drift_reverted(Some(Duration::from_millis(20)));
        let text = metrics.render();
        let mut seen = BTreeSet::new();
        let mut lines = text.lines().peekable();
        while let Some(line) = lines.next() {
            let help = line
                .strip_prefix("# HELP ")
                .expect("a HELP line opens each metric");
            let (name, words) = help.split_once(' ').expect("HELP has text");
            assert!(!words.trim().is_empty(), "{name}: empty HELP");
            let kind = lines
                .next()
                .and_then(|l| l.strip_prefix(&format!("# TYPE {name} ")));
            assert!(
                matches!(kind, Some("counter" | "gauge" | "histogram")),
                "{name}: {kind:?}"
            );
            assert!(seen.insert(name.to_owned()), "{name} twice");
            while let Some(sample) = lines.next_if(|l| !l.starts_with('#')) {
                assert!(sample.starts_with(name), "{sample} under {name}");
                let value = sample.rsplit_once(' ').map(|(_, v)| v);
                assert!(value.is_some_and(|v| v.parse::<f64>().is_ok()), "{sample}");
            }
        }
        for drift in [
            "windvane_drift_detected_total",
            "windvane_drift_reverted_total",
            "windvane_drift_repair_seconds",
            "windvane_drift_contested_objects",
            "windvane_drift_held_objects",
        ] {
            assert!(seen.contains(drift), "{drift} missing");
        }
    }

    #[test]
    fn drift_metrics_count_revert_time_and_open_objects() {
        let metrics = Metrics::default();
        let text = metrics.render();
        assert_eq!(
            family(&text, "windvane_drift_detected_total").len(),
            2,
            "no samples before any drift"
        );
        assert!(text.contains("windvane_drift_reverted_total 0\n"));
        assert!(text.contains("windvane_drift_contested_objects 0\n"));
        assert!(text.contains("windvane_drift_held_objects 0\n"));

        metrics.drift_detected("Deployment", Some("kubectl-scale"));
        metrics.drift_detected("Deployment", Some("kubectl-scale"));
        metrics.drift_detected("ConfigMap", None);
        metrics.drift_reverted(Some(Duration::from_millis(30)));
        metrics.drift_reverted(Some(Duration::from_secs(120)));
        metrics.drift_reverted(None);
        metrics.set_drift_open(2, 1);
        let text = metrics.render();
        let mut detected = family(&text, "windvane_drift_detected_total");
        detected[2..].sort_unstable();
        assert_eq!(
            detected[2..],
            [
                "windvane_drift_detected_total{kind=\"ConfigMap\",manager=\"unknown\"} 1",
                "windvane_drift_detected_total{kind=\"Deployment\",manager=\"kubectl-scale\"} 2",
            ]
        );
        assert!(text.contains("# TYPE windvane_drift_detected_total counter\n"));
        assert!(text.contains("# TYPE windvane_drift_repair_seconds histogram\n"));
        assert!(text.contains("# TYPE windvane_drift_held_objects gauge\n"));
        assert!(text.contains("windvane_drift_reverted_total 3\n"));
        // Only the reverts whose detection is known are timed.
        assert!(text.contains("windvane_drift_repair_seconds_bucket{le=\"0.01\"} 0\n"));
        assert!(text.contains("windvane_drift_repair_seconds_bucket{le=\"0.05\"} 1\n"));
        assert!(text.contains("windvane_drift_repair_seconds_bucket{le=\"60\"} 1\n"));
        assert!(text.contains("windvane_drift_repair_seconds_bucket{le=\"300\"} 2\n"));
        assert!(text.contains("windvane_drift_repair_seconds_bucket{le=\"+Inf\"} 2\n"));
        assert!(text.contains("windvane_drift_repair_seconds_sum 120.03\n"));
        assert!(text.contains("windvane_drift_repair_seconds_count 2\n"));
        assert!(text.contains("windvane_drift_contested_objects 2\n"));
        assert!(text.contains("windvane_drift_held_objects 1\n"));
    }

    #[test]
    fn label_values_are_escaped() {
        let metrics = Metrics::default();
        metrics.drift_detected("Odd\"Kind\n", Some("say \"hi\" \\o/"));
        let text = metrics.render();
        assert!(
            text.contains(
                "windvane_drift_detected_total{kind=\"Odd\\\"Kind\\n\",manager=\"say \\\"hi\\\" \\\\o/\"} 1\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn manager_labels_are_clamped() {
        let mut labelled = BTreeSet::new();
        assert_eq!(manager_label(None, &labelled), UNKNOWN_MANAGER);
        assert_eq!(
            manager_label(Some("kubectl-edit"), &labelled),
            "kubectl-edit"
        );
        for refused in [
            "",
            "unknown",
            "other",
            "tab\there",
            "caf\u{e9}",
            &"x".repeat(65),
        ] {
            assert_eq!(
                manager_label(Some(refused), &labelled),
                OTHER_MANAGER,
                "{refused:?}"
            );
        }
        assert_eq!(manager_label(Some(&"x".repeat(64)), &labelled).len(), 64);
        for n in 0..MAX_MANAGER_LABELS {
            labelled.insert(format!("manager-{n}"));
        }
        assert_eq!(manager_label(Some("manager-3"), &labelled), "manager-3");
        assert_eq!(
            manager_label(Some("one-too-many"), &labelled),
            OTHER_MANAGER
        );
    }

    #[test]
    fn a_flood_of_manager_names_makes_a_bounded_number_of_series() {
        let metrics = Metrics::default();
        for n in 0..1_000 {
            metrics.drift_detected("ConfigMap", Some(&format!("attacker-{n}")));
        }
        metrics.drift_detected("ConfigMap", Some("attacker-0"));
        let text = metrics.render();
        let series = family(&text, "windvane_drift_detected_total");
        assert_eq!(series.len(), 2 + MAX_MANAGER_LABELS + 1, "{text}");
        assert!(text.contains("{kind=\"ConfigMap\",manager=\"attacker-0\"} 2\n"));
        let other = 1_000 - MAX_MANAGER_LABELS;
        assert!(text.contains(&format!(
            "{{kind=\"ConfigMap\",manager=\"other\"}} {other}\n"
        )));
    }
}
