//! The agent's Prometheus metrics, kept in memory and written in the text exposition format on `/metrics`.
//! Hand-rolled (a few counters and gauges) to keep the agent small.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

use windvane_shared::status::SyncState;

/// Upper bounds of the sync duration histogram, in seconds.
const SYNC_BUCKETS: [f64; 10] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

#[derive(Debug, Default)]
struct Values {
    source_fetch: BTreeMap<String, u64>,
    enrolments: BTreeMap<String, u64>,
    apply: BTreeMap<String, u64>,
    release_serial: Option<u64>,
    source_stale: bool,
    objects: BTreeMap<SyncState, u64>,
    sync_buckets: [u64; SYNC_BUCKETS.len()],
    sync_count: u64,
    sync_sum: f64,
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

    /// Whether the source is stale: it cannot be reached, so the last known good release is enforced.
    pub fn set_source_stale(&self, stale: bool) {
        self.lock().source_stale = stale;
    }

    /// Object counts per state.
    pub fn set_objects(&self, counts: &BTreeMap<SyncState, u64>) {
        self.lock().objects = counts.clone();
    }

    /// Records how long a sync took.
    pub fn observe_sync(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let mut values = self.lock();
        for (bucket, bound) in values.sync_buckets.iter_mut().zip(SYNC_BUCKETS) {
            if seconds <= bound {
                *bucket += 1;
            }
        }
        values.sync_count += 1;
        values.sync_sum += seconds;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Values> {
        self.values.lock().expect("metrics lock")
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let values = self.lock();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP windvane_source_fetch_total Polls of the release source, by result."
        );
        let _ = writeln!(out, "# TYPE windvane_source_fetch_total counter");
        for (result, count) in &values.source_fetch {
            let _ = writeln!(
                out,
                "windvane_source_fetch_total{{result=\"{result}\"}} {count}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP windvane_enrolments_total Enrolments at the source server, by result (more than one \
             `enrolled` means the server forgot this cluster and it enrolled again)."
        );
        let _ = writeln!(out, "# TYPE windvane_enrolments_total counter");
        for (result, count) in &values.enrolments {
            let _ = writeln!(
                out,
                "windvane_enrolments_total{{result=\"{result}\"}} {count}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP windvane_apply_total Object applies, by result."
        );
        let _ = writeln!(out, "# TYPE windvane_apply_total counter");
        for (result, count) in &values.apply {
            let _ = writeln!(out, "windvane_apply_total{{result=\"{result}\"}} {count}");
        }
        let _ = writeln!(
            out,
            "# HELP windvane_release_serial Serial of the release being enforced."
        );
        let _ = writeln!(out, "# TYPE windvane_release_serial gauge");
        if let Some(serial) = values.release_serial {
            let _ = writeln!(out, "windvane_release_serial {serial}");
        }
        let _ = writeln!(
            out,
            "# HELP windvane_source_stale 1 while the release source cannot be reached (the last known good release is enforced), else 0."
        );
        let _ = writeln!(out, "# TYPE windvane_source_stale gauge");
        let _ = writeln!(
            out,
            "windvane_source_stale {}",
            u8::from(values.source_stale)
        );
        let _ = writeln!(out, "# HELP windvane_objects Managed objects, by state.");
        let _ = writeln!(out, "# TYPE windvane_objects gauge");
        for state in SyncState::ALL {
            let count = values.objects.get(&state).copied().unwrap_or(0);
            let _ = writeln!(out, "windvane_objects{{state=\"{state}\"}} {count}");
        }
        let _ = writeln!(
            out,
            "# HELP windvane_sync_duration_seconds Time to render, apply and prune a release."
        );
        let _ = writeln!(out, "# TYPE windvane_sync_duration_seconds histogram");
        for (bound, count) in SYNC_BUCKETS.iter().zip(values.sync_buckets) {
            let _ = writeln!(
                out,
                "windvane_sync_duration_seconds_bucket{{le=\"{bound}\"}} {count}"
            );
        }
        let _ = writeln!(
            out,
            "windvane_sync_duration_seconds_bucket{{le=\"+Inf\"}} {}",
            values.sync_count
        );
        let _ = writeln!(
            out,
            "windvane_sync_duration_seconds_sum {}",
            values.sync_sum
        );
        let _ = writeln!(
            out,
            "windvane_sync_duration_seconds_count {}",
            values.sync_count
        );
        out
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
        metrics.set_source_stale(true);
        assert!(metrics.render().contains("windvane_source_stale 1"));
        assert!(text.contains("windvane_objects{state=\"Synced\"} 3"));
        assert!(text.contains("windvane_objects{state=\"Failed\"} 0"));
        assert!(text.contains("windvane_sync_duration_seconds_bucket{le=\"0.25\"} 0"));
        assert!(text.contains("windvane_sync_duration_seconds_bucket{le=\"0.5\"} 1"));
        assert!(text.contains("windvane_sync_duration_seconds_count 1"));
    }
}
