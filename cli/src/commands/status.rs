//! `windvane status`: the SRE's view of the fleet from a terminal or a pipeline. Reads the source server's
//! `/api/v1/fleet` (with an optional label selector and state filter), prints the table (or the JSON), and
//! exits 0 only when every selected cluster is Synced — Unknown and NeverSeen are not.

use std::process::ExitCode;

use clap::Args;
use windvane_shared::wire::fleet_api::{ClusterRow, ClusterState, FleetView};

use crate::args::{OutputArgs, ReadTokenArgs, SelectArgs, ServerArgs};
use crate::error::{Error, Result};
use crate::terminal::clean_line;
use crate::{http, inputs, output};

/// `windvane status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    server: ServerArgs,
    #[command(flatten)]
    select: SelectArgs,
    #[command(flatten)]
    token: ReadTokenArgs,
    #[command(flatten)]
    output: OutputArgs,
}

/// Prints the fleet table; exit 0 only when at least one cluster is selected and all are Synced.
pub fn status(args: StatusArgs) -> Result<ExitCode> {
    let url = format!(
        "{}/api/v1/fleet?{}",
        args.server.server.trim_end_matches('/'),
        args.select.query()
    );
    let token = inputs::read_token_file(args.token.read_token_file.as_ref())?;
    let fleet = parse_fleet(&url, &http::get(&url, token.as_deref())?)?;
    output::print(args.output.output, &fleet, "the fleet", || {
        render_table(&fleet)
    })?;
    let verdict = verdict(&fleet);
    if let Some(reason) = &verdict {
        eprintln!("not synced: {}", clean_line(reason));
    }
    Ok(if verdict.is_none() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Reads the body of `GET /api/v1/fleet` as the typed fleet view.
fn parse_fleet(url: &str, body: &[u8]) -> Result<FleetView> {
    serde_json::from_slice(body).map_err(|source| Error::NotFleetJson {
        url: url.to_owned(),
        source,
    })
}

/// `None` when every listed cluster is Synced (and there is at least one); otherwise why not.
fn verdict(fleet: &FleetView) -> Option<String> {
    if fleet.clusters.is_empty() {
        return Some("no cluster matches the selection".to_owned());
    }
    let not_synced: Vec<String> = fleet
        .clusters
        .iter()
        .filter(|r| r.state != ClusterState::Synced)
        .map(|r| format!("{} is {}", r.name, r.state))
        .collect();
    (!not_synced.is_empty()).then(|| output::summarize(&not_synced))
}

fn age(seconds: Option<u64>) -> String {
    seconds.map_or("never".to_owned(), |s| format!("{} ago", output::ago(s)))
}

/// The fleet as a text table: counts, then one row per cluster.
fn render_table(fleet: &FleetView) -> String {
    let parts: Vec<String> = fleet
        .counts
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(state, n)| format!("{state} {n}"))
        .collect();
    let mut out = format!(
        "{} clusters: {}\n\n",
        fleet.total,
        if parts.is_empty() {
            "none".to_owned()
        } else {
            parts.join(" · ")
        }
    );
    out.push_str(&clusters_table(&fleet.clusters));
    out
}

/// One row per cluster, worst first as the server sorted them (`status` and `get clusters`).
pub fn clusters_table(clusters: &[ClusterRow]) -> String {
    let header = [
        "CLUSTER",
        "STATE",
        "RELEASE",
        "HEARTBEAT",
        "DRIFT",
        "LABELS",
        "LAST ERROR",
    ];
    let rows: Vec<[String; 7]> = clusters.iter().map(table_row).collect();
    output::table(header, &rows)
}

/// One cluster's cells, in the order of the table's header (cleaned by `output::table`; the error is cleaned
/// here, before it is cut to its width).
fn table_row(row: &ClusterRow) -> [String; 7] {
    let state = match (row.state, row.last_reported) {
        (ClusterState::Unknown, Some(last)) => format!("Unknown (last {last})"),
        (state, _) => state.to_string(),
    };
    let serial = |s: Option<u64>| s.map_or("-".to_owned(), |s| s.to_string());
    let mut release = format!(
        "{}/{}",
        serial(row.applied_serial),
        serial(row.latest_serial)
    );
    if row.behind() {
        release.push_str(" behind");
    }
    let labels = row
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut error = clean_line(row.last_error.as_deref().unwrap_or(""));
    if error.chars().count() > 60 {
        error = format!("{}…", error.chars().take(59).collect::<String>());
    }
    [
        row.name.clone(),
        state,
        release,
        age(row.heartbeat_age_seconds),
        row.drift_total.to_string(),
        labels,
        error,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use windvane_shared::wire::status::SyncState;

    fn row(name: &str, state: ClusterState) -> ClusterRow {
        ClusterRow {
            name: name.to_owned(),
            fleet: "acme".to_owned(),
            labels: [("env".to_owned(), "prod".to_owned())].into(),
            state,
            last_reported: Some(SyncState::Synced),
            last_seen: None,
            heartbeat_age_seconds: Some(12),
            grace_seconds: 90,
            interval_seconds: Some(30),
            channel: Some("stable".to_owned()),
            applied_serial: Some(3),
            latest_serial: Some(4),
            drift_total: 1,
            last_error: None,
            enrolled_at: jiff::Timestamp::UNIX_EPOCH,
            keyid: "k".to_owned(),
            age_recipient: None,
            sequence: 1,
        }
    }

    fn fleet(states: &[ClusterState]) -> FleetView {
        let clusters: Vec<ClusterRow> = states
            .iter()
            .enumerate()
            .map(|(i, s)| row(&format!("c{i}"), *s))
            .collect();
        let mut counts: std::collections::BTreeMap<ClusterState, u64> =
            ClusterState::ALL.map(|s| (s, 0)).into();
        for state in states {
            *counts.entry(*state).or_default() += 1;
        }
        FleetView {
            generated_at: jiff::Timestamp::UNIX_EPOCH,
            total: states.len() as u64,
            counts,
            clusters,
        }
    }

    use ClusterState::{NeverSeen, Synced, Unknown};

    #[test]
    fn only_all_synced_passes() {
        assert_eq!(verdict(&fleet(&[Synced, Synced])), None);
        assert_eq!(
            verdict(&fleet(&[Synced, Unknown])).as_deref(),
            Some("c1 is Unknown")
        );
        assert_eq!(
            verdict(&fleet(&[NeverSeen])).as_deref(),
            Some("c0 is NeverSeen")
        );
        assert_eq!(
            verdict(&fleet(&[])).as_deref(),
            Some("no cluster matches the selection")
        );
        assert_eq!(
            verdict(&fleet(&[Unknown; 7])).as_deref(),
            Some(
                "c0 is Unknown, c1 is Unknown, c2 is Unknown, c3 is Unknown, c4 is Unknown, and 2 more"
            )
        );
    }

    #[test]
    fn table_shows_unknown_with_its_last_state() {
        let text = render_table(&fleet(&[Unknown, Synced]));
        assert!(
            text.starts_with("2 clusters: Unknown 1 · Synced 1\n"),
            "counts worst first, zeros left out: {text}"
        );
        assert!(text.contains("Unknown (last Synced)"), "{text}");
        assert!(text.contains("3/4 behind"), "{text}");
        assert!(text.contains("12s ago"), "{text}");
        assert!(text.contains("env=prod"), "{text}");
        assert!(
            text.lines()
                .nth(2)
                .is_some_and(|l| l.starts_with("CLUSTER")),
            "{text}"
        );
        assert_eq!(
            render_table(&fleet(&[])).lines().next(),
            Some("0 clusters: none")
        );
    }

    #[test]
    fn a_row_without_a_release_or_heartbeat_reads_as_such() {
        let mut never = row("quiet", NeverSeen);
        never.last_reported = None;
        never.heartbeat_age_seconds = None;
        never.applied_serial = None;
        never.last_error = Some(format!("line one\n{}", "x".repeat(80)));
        let cells = table_row(&never);
        assert_eq!(cells[1], "NeverSeen");
        assert_eq!(cells[2], "-/4");
        assert_eq!(cells[3], "never");
        assert!(!cells[6].contains('\n'), "{cells:?}");
        assert_eq!(cells[6].chars().count(), 60, "{cells:?}");
        assert!(cells[6].ends_with('…'), "{cells:?}");
    }

    #[test]
    fn a_body_that_is_not_the_fleet_names_the_url() {
        let err = parse_fleet("http://h/api/v1/fleet?", br#"{"clusters": "nope"}"#)
            .expect_err("not a fleet");
        assert!(
            format!("{err:#}").contains("http://h/api/v1/fleet?"),
            "{err:#}"
        );
        let body = serde_json::to_vec(&fleet(&[Synced])).expect("json");
        assert_eq!(parse_fleet("u", &body).expect("fleet"), fleet(&[Synced]));
    }
}
