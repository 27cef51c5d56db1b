//! What the page, the JSON API and `windvane status` show, built by pure functions from database rows, the
//! clock and the store: one [`ClusterRow`] per cluster (its [`status::verdict`], applied vs latest serial,
//! heartbeat age, drift count, last error) and the [`FleetView`] roll-up over a [`Filter`]. The types are the
//! API's wire format, in `windvane_shared::wire::fleet_api` so that `windvane status` reads the same ones; the API
//! serialises them as they are, the page renders them as HTML.

use std::time::Duration;

use jiff::Timestamp;
pub use windvane_shared::wire::fleet_api::{ClusterDetail, ClusterRow, FleetView};
use windvane_shared::wire::heartbeat::Heartbeat;

use crate::db::ClusterSummary;
use crate::fleet::status::{self, ClusterFacts, Filter};

/// Builds one row.
pub fn cluster_row(
    summary: ClusterSummary,
    now: Timestamp,
    unknown_after: Option<Duration>,
    latest_serial: &dyn Fn(&str) -> Option<u64>,
) -> ClusterRow {
    let facts = ClusterFacts {
        last_seen: summary.last_seen,
        interval: summary.interval_seconds.map(Duration::from_secs),
        reported: summary.state,
    };
    let verdict = status::verdict(&facts, now, unknown_after);
    let latest = summary.channel.as_deref().and_then(latest_serial);
    ClusterRow {
        name: summary.name,
        fleet: summary.fleet,
        labels: summary.labels,
        state: verdict.state,
        last_reported: verdict.last_reported,
        last_seen: summary.last_seen,
        heartbeat_age_seconds: verdict.heartbeat_age.map(|a| a.as_secs()),
        grace_seconds: verdict.grace.as_secs(),
        interval_seconds: summary.interval_seconds,
        channel: summary.channel,
        applied_serial: summary.applied_serial,
        latest_serial: latest,
        drift_total: summary.drift_total,
        last_error: summary.last_error,
        enrolled_at: summary.enrolled_at,
        keyid: summary.keyid,
        age_recipient: windvane_shared::crypto::keys::verifying_key_from_pem(
            &summary.public_key,
            "",
        )
        .ok()
        .map(|key| windvane_shared::format::sops::cluster_recipient(&key)),
        sequence: summary.last_sequence,
    }
}

/// Builds the fleet view.
pub fn fleet_view(
    clusters: Vec<ClusterSummary>,
    now: Timestamp,
    unknown_after: Option<Duration>,
    filter: &Filter,
    latest_serial: &dyn Fn(&str) -> Option<u64>,
) -> FleetView {
    let selected: Vec<ClusterRow> = clusters
        .into_iter()
        .filter(|c| filter.matches_labels(&c.labels))
        .map(|c| cluster_row(c, now, unknown_after, latest_serial))
        .collect();
    let counts = status::rollup(selected.iter().map(|r| r.state))
        .into_iter()
        .collect();
    let total = selected.len() as u64;
    let mut rows: Vec<ClusterRow> = selected
        .into_iter()
        .filter(|r| filter.matches(&r.labels, r.state))
        .collect();
    rows.sort_by(|a, b| a.state.cmp(&b.state).then_with(|| a.name.cmp(&b.name)));
    FleetView {
        generated_at: now,
        total,
        counts,
        clusters: rows,
    }
}

/// Parses the stored report (the signed payload of the last heartbeat).
pub fn parse_report(payload: Option<&str>) -> Option<Heartbeat> {
    serde_json::from_str(payload?).ok()
}

/// Reads `since` as an RFC 3339 time or as a duration back from `now` (`1h`).
pub fn parse_since(text: &str, now: Timestamp) -> crate::Result<Timestamp> {
    if let Ok(t) = text.parse::<Timestamp>() {
        return Ok(t);
    }
    let back =
        windvane_shared::text::duration::parse_duration(text).map_err(|_| crate::Error::Since {
            text: text.to_owned(),
        })?;
    let millis = i64::try_from(back.as_millis()).unwrap_or(i64::MAX);
    Ok(
        Timestamp::from_millisecond(now.as_millisecond().saturating_sub(millis))
            .unwrap_or(Timestamp::MIN),
    )
}

/// "3m12s ago"-style text for ages.
pub fn human_age(seconds: u64) -> String {
    let d = Duration::from_secs(seconds);
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let mut text = windvane_shared::text::duration::format_duration(Duration::from_secs(
        d.as_secs() / 60 * 60,
    ));
    if seconds >= 86_400 {
        text = windvane_shared::text::duration::format_duration(Duration::from_secs(
            d.as_secs() / 3600 * 3600,
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::status::ClusterState;
    use windvane_shared::wire::status::SyncState;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).expect("valid")
    }

    fn summary(
        name: &str,
        env: &str,
        last_seen: Option<i64>,
        state: Option<SyncState>,
    ) -> ClusterSummary {
        ClusterSummary {
            name: name.into(),
            fleet: "acme".into(),
            keyid: "k".into(),
            labels: [("env".to_owned(), env.to_owned())].into(),
            enrolled_at: at(-1000),
            rekey_allowed_until: None,
            last_sequence: 1,
            last_seen: last_seen.map(at),
            interval_seconds: Some(30),
            state,
            channel: Some("stable".into()),
            applied_serial: Some(3),
            last_error: None,
            drift_total: 0,
            public_key: String::new(),
        }
    }

    #[test]
    fn fleet_view_counts_the_selection_and_lists_the_filtered_rows_worst_first() {
        let clusters = vec![
            summary("a", "prod", Some(0), Some(SyncState::Synced)),
            summary("b", "prod", Some(-500), Some(SyncState::Synced)),
            summary("c", "prod", None, None),
            summary("d", "staging", Some(0), Some(SyncState::Failed)),
        ];
        let latest = |ch: &str| (ch == "stable").then_some(4);
        let filter = Filter::parse(Some("env=prod"), &[]).expect("filter");
        let view = fleet_view(clusters.clone(), at(10), None, &filter, &latest);
        assert_eq!(view.total, 3);
        assert_eq!(view.counts[&ClusterState::Synced], 1);
        assert_eq!(view.counts[&ClusterState::Unknown], 1);
        assert_eq!(view.counts[&ClusterState::NeverSeen], 1);
        assert_eq!(view.counts[&ClusterState::Failed], 0);
        assert_eq!(view.counts.len(), ClusterState::ALL.len());
        let names: Vec<_> = view.clusters.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            ["b", "a", "c"],
            "Unknown before Synced, NeverSeen last"
        );
        assert_eq!(view.clusters[0].last_reported, Some(SyncState::Synced));
        assert!(view.clusters[1].behind());
        assert_eq!(view.clusters[1].latest_serial, Some(4));

        let only_unknown = Filter::parse(None, &["Unknown"]).expect("filter");
        let view = fleet_view(clusters, at(10), None, &only_unknown, &latest);
        assert_eq!(view.total, 4);
        assert_eq!(view.clusters.len(), 1);
        assert_eq!(view.clusters[0].name, "b");
    }

    #[test]
    fn since_reads_times_and_durations() {
        assert_eq!(
            parse_since("2027-01-15T10:00:00Z", at(0)).expect("time"),
            "2027-01-15T10:00:00Z".parse::<Timestamp>().expect("t")
        );
        assert_eq!(parse_since("1h", at(0)).expect("duration"), at(-3600));
        assert!(parse_since("yesterday", at(0)).is_err());
    }

    #[test]
    fn ages_read_at_a_glance() {
        assert_eq!(human_age(5), "5s");
        assert_eq!(human_age(119), "119s");
        assert_eq!(human_age(185), "3m");
        assert_eq!(human_age(2 * 86_400 + 3700), "2d1h");
    }
}
