//! `windvane get clusters|cluster NAME|apps|drift`: the fleet as kubectl shows a cluster's objects. Reads the
//! source server's JSON API with the read token — `/api/v1/clusters` (with the selector and states),
//! `/api/v1/clusters/NAME` (a cluster's last report: its apps) and `/api/v1/drift` (a page at a time) — and
//! prints through `output.rs`: a table, or the server's objects as JSON or YAML. Only reads; the exit status is
//! 0 whenever the read succeeds.

use std::collections::BTreeSet;

use clap::{Args, Subcommand};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use windvane_shared::wire::fleet_api::{ClusterDetail, ClusterRow, ClusterState, DriftEntry};
use windvane_shared::wire::heartbeat::DriftAction;

use crate::args::{OutputArgs, ReadTokenArgs, SelectArgs, ServerArgs, reword};
use crate::commands::status::clusters_table;
use crate::error::{Error, Result};
use crate::output::{self, Format};
use crate::{http, inputs};

/// Most clusters `get apps` reads one by one (one request each).
const MAX_APP_CLUSTERS: usize = 500;
/// Most pages of 500 drift entries `get drift` follows.
const MAX_DRIFT_PAGES: usize = 20;

/// `windvane get …`.
#[derive(Debug, Args)]
pub struct GetArgs {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Subcommand)]
enum What {
    /// The clusters, worst first: state, release (applied/latest), last heartbeat, drift, labels, last error.
    Clusters(ClustersArgs),
    /// One cluster: its row, then the apps of its last report.
    Cluster(ClusterArgs),
    /// The apps of each selected cluster's last report, with their state and object count.
    Apps(AppsArgs),
    /// The drift log: who changed which fields of which object, and what Windvane did about it.
    Drift(DriftArgs),
}

/// The server, its read token and the output format: what every `get` reads with.
#[derive(Debug, Args)]
struct Source {
    #[command(flatten)]
    server: ServerArgs,
    #[command(flatten)]
    token: ReadTokenArgs,
    #[command(flatten)]
    output: OutputArgs,
}

impl Source {
    fn get<T: serde::de::DeserializeOwned>(&self, path_and_query: &str) -> Result<T> {
        let token = inputs::read_token_file(self.token.read_token_file.as_ref())?;
        let url = format!(
            "{}{path_and_query}",
            self.server.server.trim_end_matches('/')
        );
        http::get_json(&url, token.as_deref())
    }

    fn format(&self) -> Format {
        self.output.output
    }
}

#[derive(Debug, Args)]
struct ClustersArgs {
    #[command(flatten)]
    select: SelectArgs,
    #[command(flatten)]
    source: Source,
}

#[derive(Debug, Args)]
struct ClusterArgs {
    /// The cluster's name.
    name: String,
    #[command(flatten)]
    source: Source,
}

#[derive(Debug, Args)]
#[command(mut_args(|a| reword(a, "states",
    "Only apps in these states (comma-separated or repeated): Failed, Degraded, Contested, OutOfSync, Held, \
     Progressing, Synced"
)))]
struct AppsArgs {
    /// Only this cluster's apps.
    #[arg(long, value_name = "NAME", conflicts_with = "selector")]
    cluster: Option<String>,
    #[command(flatten)]
    select: SelectArgs,
    #[command(flatten)]
    source: Source,
}

#[derive(Debug, Args)]
#[command(mut_args(|a| reword(a, "states",
    "Only the drift of clusters now in these states (comma-separated or repeated): Failed, Degraded, \
     Contested, OutOfSync, Unknown, Held, Progressing, Synced, NeverSeen"
)))]
struct DriftArgs {
    /// Only this cluster's drift.
    #[arg(long, value_name = "NAME")]
    cluster: Option<String>,
    /// Only drift noticed since then: a duration back from now (1h, 2d) or an RFC 3339 time.
    #[arg(long, value_name = "DURATION|TIME", value_parser = parse_since, env = "WINDVANE_SINCE")]
    since: Option<String>,
    #[command(flatten)]
    select: SelectArgs,
    #[command(flatten)]
    source: Source,
}

/// The body of `GET /api/v1/clusters`.
#[derive(Debug, Serialize, Deserialize)]
struct ClusterList {
    clusters: Vec<ClusterRow>,
}

/// One app of a cluster's last report, named with its cluster (`get apps`).
#[derive(Debug, Clone, PartialEq, Serialize)]
struct AppRow {
    cluster: String,
    name: String,
    state: windvane_shared::wire::status::SyncState,
    objects: u64,
}

/// The body of a `GET /api/v1/drift` page.
#[derive(Debug, Deserialize)]
struct DriftPage {
    drift: Vec<DriftEntry>,
    next: Option<u64>,
}

pub fn get(args: GetArgs) -> Result<()> {
    match args.what {
        What::Clusters(args) => clusters(args),
        What::Cluster(args) => cluster(args),
        What::Apps(args) => apps(args),
        What::Drift(args) => drift(args),
    }
}

fn clusters(args: ClustersArgs) -> Result<()> {
    let list: ClusterList = args
        .source
        .get(&format!("/api/v1/clusters?{}", args.select.query()))?;
    output::print(args.source.format(), &list, "the clusters", || {
        clusters_table(&list.clusters)
    })
}

fn cluster(args: ClusterArgs) -> Result<()> {
    let detail = cluster_detail(&args.source, &args.name)?;
    output::print(args.source.format(), &detail, "the cluster", || {
        let mut text = clusters_table(std::slice::from_ref(&detail.cluster));
        text.push('\n');
        text.push_str(&apps_table(&apps_of(&detail)));
        text
    })
}

fn cluster_detail(source: &Source, name: &str) -> Result<ClusterDetail> {
    source.get(&format!("/api/v1/clusters/{}", path_segment(name)))
}

fn apps(args: AppsArgs) -> Result<()> {
    let names: Vec<String> = match &args.cluster {
        Some(name) => vec![name.clone()],
        None => {
            // The states pick apps here, not clusters: only the selector goes to the server.
            let list: ClusterList = args.source.get(&format!(
                "/api/v1/clusters?{}",
                args.select.selector.query()
            ))?;
            list.clusters.into_iter().map(|c| c.name).collect()
        }
    };
    if names.len() > MAX_APP_CLUSTERS {
        return Err(Error::TooManyClusters {
            count: names.len(),
            max: MAX_APP_CLUSTERS,
        });
    }
    let mut rows = Vec::new();
    for name in &names {
        rows.extend(apps_of(&cluster_detail(&args.source, name)?));
    }
    let rows = keep_states(rows, &args.select.states);
    let value = serde_json::json!({ "apps": rows });
    output::print(args.source.format(), &value, "the apps", || {
        apps_table(&rows)
    })
}

/// The apps of a cluster's last report (none before its first).
fn apps_of(detail: &ClusterDetail) -> Vec<AppRow> {
    let Some(report) = &detail.report else {
        return Vec::new();
    };
    report
        .apps
        .iter()
        .map(|app| AppRow {
            cluster: detail.cluster.name.clone(),
            name: app.name.clone(),
            state: app.state,
            objects: app.objects,
        })
        .collect()
}

/// The apps in one of `states` (all when none is given).
fn keep_states(rows: Vec<AppRow>, states: &[ClusterState]) -> Vec<AppRow> {
    rows.into_iter()
        .filter(|r| states.is_empty() || states.contains(&ClusterState::from_reported(r.state)))
        .collect()
}

fn apps_table(rows: &[AppRow]) -> String {
    let rows: Vec<[String; 4]> = rows
        .iter()
        .map(|r| {
            [
                r.cluster.clone(),
                r.name.clone(),
                r.state.to_string(),
                r.objects.to_string(),
            ]
        })
        .collect();
    output::table(["CLUSTER", "APP", "STATE", "OBJECTS"], &rows)
}

fn drift(args: DriftArgs) -> Result<()> {
    let picked = !args.select.states.is_empty() || args.select.selector.selector.is_some();
    let clusters: Option<BTreeSet<String>> = if picked {
        let list: ClusterList = args
            .source
            .get(&format!("/api/v1/clusters?{}", args.select.query()))?;
        Some(list.clusters.into_iter().map(|c| c.name).collect())
    } else {
        None
    };
    let mut entries = Vec::new();
    let mut offset = Some(0);
    for _ in 0..MAX_DRIFT_PAGES {
        let Some(at) = offset else { break };
        let page: DriftPage = args.source.get(&drift_query(&args, at))?;
        entries.extend(page.drift);
        offset = page.next;
    }
    if offset.is_some() {
        eprintln!(
            "warning: only the first {} drift entries are listed; narrow with --since, --cluster or --selector",
            entries.len()
        );
    }
    let entries: Vec<DriftEntry> = entries
        .into_iter()
        .filter(|e| clusters.as_ref().is_none_or(|c| c.contains(&e.cluster)))
        .collect();
    let value = serde_json::json!({ "drift": entries });
    output::print(args.source.format(), &value, "the drift log", || {
        drift_table(&entries, Timestamp::now())
    })
}

/// `/api/v1/drift?…` for one page from `offset`.
fn drift_query(args: &DriftArgs, offset: u64) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    if let Some(cluster) = &args.cluster {
        query.append_pair("cluster", cluster);
    }
    if let Some(since) = &args.since {
        query.append_pair("since", since);
    }
    query.append_pair("offset", &offset.to_string());
    format!("/api/v1/drift?{}", query.finish())
}

/// The drift log as a table, newest first as the server lists it.
fn drift_table(entries: &[DriftEntry], now: Timestamp) -> String {
    let rows: Vec<[String; 7]> = entries
        .iter()
        .map(|e| {
            let r = &e.record;
            let object = match &r.namespace {
                Some(ns) => format!("{} {ns}/{}", r.kind, r.name),
                None => format!("{} {}", r.kind, r.name),
            };
            let fields = if r.deleted {
                "(deleted)".to_owned()
            } else {
                shorten(&r.fields.join(","), 60)
            };
            let age = now.duration_since(r.detected_at).as_secs().max(0);
            [
                e.cluster.clone(),
                r.app.clone(),
                object,
                fields,
                action_name(r.action).to_owned(),
                r.manager.clone().unwrap_or_else(|| "-".to_owned()),
                output::ago(age.unsigned_abs()),
            ]
        })
        .collect();
    let header = [
        "CLUSTER", "APP", "OBJECT", "FIELDS", "ACTION", "MANAGER", "DETECTED",
    ];
    output::table(header, &rows)
}

fn action_name(action: DriftAction) -> &'static str {
    match action {
        DriftAction::Reverted => "Reverted",
        DriftAction::Reported => "Reported",
        DriftAction::Held => "Held",
        DriftAction::Contested => "Contested",
        DriftAction::TakenIn => "TakenIn",
    }
}

/// `text` cut to `max` characters, an ellipsis marking the cut.
fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    text.chars().take(max - 1).collect::<String>() + "…"
}

/// `--since`: a duration back from now or an RFC 3339 time, checked here and sent as written (the server
/// reads both).
fn parse_since(text: &str) -> Result<String, windvane_shared::Error> {
    if text.parse::<Timestamp>().is_err() {
        windvane_shared::text::duration::parse_duration(text)?;
    }
    Ok(text.to_owned())
}

/// `name` as one segment of a URL path: anything but letters, digits and `-._~` percent-encoded.
fn path_segment(name: &str) -> String {
    let mut out = String::new();
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use windvane_shared::wire::heartbeat::DriftRecord;
    use windvane_shared::wire::status::SyncState;

    use super::*;

    fn app(cluster: &str, name: &str, state: SyncState) -> AppRow {
        AppRow {
            cluster: cluster.to_owned(),
            name: name.to_owned(),
            state,
            objects: 3,
        }
    }

    #[test]
    fn apps_are_picked_by_their_own_state() {
        let rows = vec![
            app("eu", "web", SyncState::Synced),
            app("eu", "db", SyncState::Degraded),
        ];
        assert_eq!(
            keep_states(rows.clone(), &[ClusterState::Degraded]),
            [rows[1].clone()]
        );
        assert_eq!(keep_states(rows.clone(), &[]), rows);
        assert_eq!(
            apps_table(&rows),
            "CLUSTER   APP   STATE      OBJECTS\neu        web   Synced     3\neu        db    Degraded   3\n"
        );
    }

    #[test]
    fn a_drift_row_names_the_object_fields_and_age() {
        let now: Timestamp = "2026-12-08T10:00:00Z".parse().expect("time");
        let record = DriftRecord {
            app: "web".to_owned(),
            group: "apps".to_owned(),
            kind: "Deployment".to_owned(),
            namespace: Some("shop".to_owned()),
            name: "front".to_owned(),
            fields: vec!["/spec/replicas".to_owned()],
            deleted: false,
            manager: Some("kubectl-scale\u{1b}[2J".to_owned()),
            operation: None,
            changed_at: None,
            detected_at: "2026-12-08T09:55:00Z".parse().expect("time"),
            reverted_at: None,
            action: DriftAction::Reverted,
            break_glass: None,
            revert_requested_by: None,
        };
        let entry = DriftEntry {
            cluster: "eu".to_owned(),
            sequence: 1,
            received_at: now,
            record,
        };
        let text = drift_table(&[entry], now);
        let row = text.lines().nth(1).expect("a row");
        assert!(
            row.starts_with("eu        web   Deployment shop/front   /spec/replicas   Reverted"),
            "{text}"
        );
        assert!(row.ends_with("kubectl-scale\\u{1b}[2J   5m"), "{text}");
    }

    #[test]
    fn since_and_names_are_checked_and_encoded() {
        assert!(parse_since("2h").is_ok());
        assert!(parse_since("2026-12-08T09:00:00Z").is_ok());
        assert!(parse_since("yesterday").is_err());
        assert_eq!(path_segment("eu-1.a"), "eu-1.a");
        assert_eq!(path_segment("a/b c"), "a%2Fb%20c");
        assert_eq!(shorten("abcdef", 4), "abc…");
    }
}
