//! The agent's Prometheus metrics, kept in memory and written in the text exposition format on `/metrics`.
//! Hand-rolled (a few counters, gauges and histograms) to keep the agent small. The engine records syncs,
//! applies and the source's state; the healer (`heal/mod.rs`) records drift; the admin server renders.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

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

/// A cumulative histogram over fixed bounds.
#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    buckets: Vec<u64>,
    count: u64,
    sum: f64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            buckets: vec![0; bounds.len()],
            count: 0,
            sum: 0.0,
        }
    }

    fn observe(&mut self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        for (bucket, bound) in self.buckets.iter_mut().zip(self.bounds) {
            if seconds <= *bound {
                *bucket += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        header(out, name, "histogram", help);
        for (bound, count) in self.bounds.iter().zip(&self.buckets) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {count}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

#[derive(Debug)]
struct Values {
    source_fetch: BTreeMap<String, u64>,
    enrolments: BTreeMap<String, u64>,
    apply: BTreeMap<String, u64>,
    /// Objects that failed to apply and are retried alone ([`crate::apply::retry`]).
    apply_retrying: u64,
    release_serial: Option<u64>,
    source_stale: bool,
    /// The wave (1-based) a held release waits for; 0 when none waits.
    rollout_waiting_wave: u32,
    /// Whether a held release waits for the maintenance windows of the apps it changes.
    window_waiting: bool,
    /// Apps whose drift is only reported now, inside a `heal: report` deny window.
    window_report_only_apps: u64,
    /// Approvals the held release needs, and how many count so far (0, 0 when none waits for approval).
    approvals_required: u32,
    approvals_valid: u32,
    /// Approval signatures refused (forged, wrong release, publisher's key, unknown key), by counting.
    approvals_refused: u64,
    objects: BTreeMap<SyncState, u64>,
    sync: Histogram,
    /// Drift detected, by (kind, manager label).
    drift_detected: BTreeMap<(String, String), u64>,
    /// The managers that have a label of their own (at most [`MAX_MANAGER_LABELS`]).
    drift_managers: BTreeSet<String>,
    drift_reverted: u64,
    drift_repair: Histogram,
    drift_contested: u64,
    drift_held: u64,
}

impl Default for Values {
    fn default() -> Self {
        Self {
            source_fetch: BTreeMap::new(),
            enrolments: BTreeMap::new(),
            apply: BTreeMap::new(),
            apply_retrying: 0,
            release_serial: None,
            source_stale: false,
            rollout_waiting_wave: 0,
            window_waiting: false,
            window_report_only_apps: 0,
            approvals_required: 0,
            approvals_valid: 0,
            approvals_refused: 0,
            objects: BTreeMap::new(),
            sync: Histogram::new(SYNC_BUCKETS),
            drift_detected: BTreeMap::new(),
            drift_managers: BTreeSet::new(),
            drift_reverted: 0,
            drift_repair: Histogram::new(REPAIR_BUCKETS),
            drift_contested: 0,
            drift_held: 0,
        }
    }
}

/// The agent's metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    values: Mutex<Values>,
}

impl Metrics {
    /// Counts a poll of the source by result (`ok`, `not_modified`, a refusal reason, `fetch`, …).
    pub fn source_fetch(&self, result: &str) {
        *self
            .lock()
            .source_fetch
            .entry(result.to_owned())
            .or_default() += 1;
    }

    /// Counts an enrolment at the source server by result (`enrolled`, `already_enrolled`, `rekeyed`,
    /// `conflict`, `refused`, `error`).
    pub fn enrolment(&self, result: &str) {
        *self.lock().enrolments.entry(result.to_owned()).or_default() += 1;
    }

    /// Counts an object apply by result (`written`, `unchanged`, `failed`, `refused`).
    pub fn apply(&self, result: &str) {
        *self.lock().apply.entry(result.to_owned()).or_default() += 1;
    }

    /// The serial of the release being enforced.
    pub fn set_release_serial(&self, serial: u64) {
        self.lock().release_serial = Some(serial);
    }

    /// The wave a held release waits for (`waiting`), or none.
    pub fn set_rollout_wave(&self, wave: u32, waiting: bool) {
        self.lock().rollout_waiting_wave = if waiting { wave } else { 0 };
    }

    /// Whether a held release waits for a maintenance window.
    pub fn set_window_waiting(&self, waiting: bool) {
        self.lock().window_waiting = waiting;
    }

    /// How many apps only report drift now, inside a `heal: report` deny window.
    pub fn set_window_report_only_apps(&self, apps: usize) {
        self.lock().window_report_only_apps = apps as u64;
    }

    /// The approvals a held release needs and has (both 0 when none waits for approval).
    pub fn set_approvals(&self, required: u32, valid: u32) {
        let mut values = self.lock();
        values.approvals_required = required;
        values.approvals_valid = valid;
    }

    /// Counts approval signatures that were refused when the approval file was read anew.
    pub fn approvals_refused(&self, count: usize) {
        self.lock().approvals_refused += count as u64;
    }

    /// Whether the source is stale: it cannot be reached, so the last known good release is enforced.
    pub fn set_source_stale(&self, stale: bool) {
        self.lock().source_stale = stale;
    }

    /// How many objects that failed to apply are retried alone.
    pub fn set_apply_retrying(&self, objects: usize) {
        self.lock().apply_retrying = objects as u64;
    }

    /// Object counts per state.
    pub fn set_objects(&self, counts: &BTreeMap<SyncState, u64>) {
        self.lock().objects = counts.clone();
    }

    /// Records how long a sync took.
    pub fn observe_sync(&self, elapsed: Duration) {
        self.lock().sync.observe(elapsed);
    }

    /// Counts a drift detected on an object of `kind`, made by field manager `manager` (`None` when none
    /// can be named). The manager label is clamped with [`manager_label`].
    pub fn drift_detected(&self, kind: &str, manager: Option<&str>) {
        let mut values = self.lock();
        let label = manager_label(manager, &values.drift_managers);
        if manager == Some(label) {
            values.drift_managers.insert(label.to_owned());
        }
        let key = (kind.to_owned(), label.to_owned());
        *values.drift_detected.entry(key).or_default() += 1;
    }

    /// Counts a drift reverted, `after` its detection when that is known.
    pub fn drift_reverted(&self, after: Option<Duration>) {
        let mut values = self.lock();
        values.drift_reverted += 1;
        if let Some(after) = after {
            values.drift_repair.observe(after);
        }
    }

    /// How many objects are Contested and how many Held now.
    pub fn set_drift_open(&self, contested: u64, held: u64) {
        let mut values = self.lock();
        values.drift_contested = contested;
        values.drift_held = held;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Values> {
        self.values.lock().expect("metrics lock")
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let values = self.lock();
        let mut text = String::new();
        render_source(&mut text, &values);
        render_rollout(&mut text, &values);
        let out = &mut text;
        header(
            out,
            "windvane_objects",
            "gauge",
            "Managed objects, by state.",
        );
        for state in SyncState::ALL {
            let count = values.objects.get(&state).copied().unwrap_or(0);
            let _ = writeln!(out, "windvane_objects{{state=\"{state}\"}} {count}");
        }
        values.sync.render(
            out,
            "windvane_sync_duration_seconds",
            "Time to render, apply and prune a release.",
        );
        render_drift(out, &values);
        text
    }
}

/// What the agent fetched and applied: polls, enrolments, applies, the release enforced and the source's state.
fn render_source(out: &mut String, values: &Values) {
    by_result(
        out,
        "windvane_source_fetch_total",
        "Polls of the release source, by result.",
        &values.source_fetch,
    );
    by_result(
        out,
        "windvane_enrolments_total",
        "Enrolments at the source server, by result (more than one `enrolled` means the server forgot \
         this cluster and it enrolled again).",
        &values.enrolments,
    );
    by_result(
        out,
        "windvane_apply_total",
        "Object applies, by result.",
        &values.apply,
    );
    single(
        out,
        ("windvane_apply_retrying", "gauge"),
        "Objects that failed to apply and are retried alone, each on its own back-off.",
        values.apply_retrying,
    );
    header(
        out,
        "windvane_release_serial",
        "gauge",
        "Serial of the release being enforced.",
    );
    if let Some(serial) = values.release_serial {
        let _ = writeln!(out, "windvane_release_serial {serial}");
    }
    single(
        out,
        ("windvane_source_stale", "gauge"),
        "1 while the release source cannot be reached (the last known good release is enforced), else 0.",
        u8::from(values.source_stale),
    );
}

/// What holds a newer release back: its rollout wave, maintenance windows and approvals.
fn render_rollout(out: &mut String, values: &Values) {
    single(
        out,
        ("windvane_rollout_waiting_wave", "gauge"),
        "The rollout wave (1-based) a verified newer release waits for on this cluster, 0 when none waits.",
        values.rollout_waiting_wave,
    );
    single(
        out,
        ("windvane_window_waiting", "gauge"),
        "1 while a verified newer release waits for the maintenance windows of the apps it changes, else 0.",
        u8::from(values.window_waiting),
    );
    single(
        out,
        ("windvane_window_report_only_apps", "gauge"),
        "Apps whose drift is only reported, not healed, because a deny window with heal: report is active.",
        values.window_report_only_apps,
    );
    single(
        out,
        ("windvane_approvals_required", "gauge"),
        "Approvals the verified release waiting for approval needs, 0 when none waits.",
        values.approvals_required,
    );
    single(
        out,
        ("windvane_approvals_valid", "gauge"),
        "Approvals of the waiting release that count (trusted approver keys, not the publisher's).",
        values.approvals_valid,
    );
    single(
        out,
        ("windvane_approvals_refused_total", "counter"),
        "Approval signatures refused: bad signature, another release, the publisher's key or an unknown key.",
        values.approvals_refused,
    );
}

fn render_drift(out: &mut String, values: &Values) {
    let help = format!(
        "Drift detected on managed objects, by kind and the field manager that made it (`{UNKNOWN_MANAGER}` \
         when none can be named, `{OTHER_MANAGER}` past the first {MAX_MANAGER_LABELS} managers).",
    );
    header(out, "windvane_drift_detected_total", "counter", &help);
    for ((kind, manager), count) in &values.drift_detected {
        let (kind, manager) = (escape_label(kind), escape_label(manager));
        let _ = writeln!(
            out,
            "windvane_drift_detected_total{{kind=\"{kind}\",manager=\"{manager}\"}} {count}"
        );
    }
    single(
        out,
        ("windvane_drift_reverted_total", "counter"),
        "Drifts reverted by the healer.",
        values.drift_reverted,
    );
    values.drift_repair.render(
        out,
        "windvane_drift_repair_seconds",
        "Time from a drift's detection to its revert being applied (grace periods, holds and back-offs included).",
    );
    single(
        out,
        ("windvane_drift_contested_objects", "gauge"),
        "Objects whose drift is not reverted for a back-off because another manager keeps taking their fields.",
        values.drift_contested,
    );
    single(
        out,
        ("windvane_drift_held_objects", "gauge"),
        "Objects whose drift is not reverted because an operator holds them (windvane.io/hold-until).",
        values.drift_held,
    );
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

/// A label value as the text format writes it: backslash, double quote and line feed escaped.
fn escape_label(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '"' => escaped.push_str("\\\""),
            '\n' => escaped.push_str("\\n"),
            c => escaped.push(c),
        }
    }
    escaped
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A metric of one unlabelled series: its `(name, type)`, help and value.
fn single(out: &mut String, (name, kind): (&str, &str), help: &str, value: impl std::fmt::Display) {
    header(out, name, kind, help);
    let _ = writeln!(out, "{name} {value}");
}

/// A counter labelled by `result` (results are the agent's own words, never escaped).
fn by_result(out: &mut String, name: &str, help: &str, counts: &BTreeMap<String, u64>) {
    header(out, name, "counter", help);
    for (result, count) in counts {
        let _ = writeln!(out, "{name}{{result=\"{result}\"}} {count}");
    }
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
        let detected = family(&text, "windvane_drift_detected_total");
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
        assert_eq!(escape_label("plain-name"), "plain-name");
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
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
