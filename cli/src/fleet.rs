//! `windvane status` and `windvane cluster rekey|forget`: the SRE's view of the fleet from a terminal or a
//! pipeline. `status` reads the source server's `/api/v1/fleet` (with an optional label selector and state
//! filter), prints the table, and exits 0 only when every selected cluster is Synced — Unknown and
//! NeverSeen are not. `cluster rekey|forget` call the server's admin endpoints with the admin token (the
//! server's `--admin-token-file`; the registration token every cluster holds never authorises them).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::terminal::{MAX_REPLY_BYTES, clean, clean_line, read_capped};
use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use serde_json::Value;
use windvane_shared::wire::fleet_api::{ClusterRow, ClusterState, FleetView};

/// `windvane status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The source server, e.g. https://windvane.example.com.
    #[arg(long, env = "WINDVANE_SERVER", value_name = "URL")]
    server: String,
    /// Only clusters whose labels match this selector, e.g. "env=prod,region in (eu,us)".
    #[arg(long, env = "WINDVANE_SELECTOR", value_name = "SEL")]
    selector: Option<String>,
    /// Only clusters in these states (comma-separated or repeated): Failed, Degraded, Contested,
    /// OutOfSync, Unknown, Held, Progressing, Synced, NeverSeen.
    #[arg(
        long = "state",
        env = "WINDVANE_STATE",
        value_name = "STATE",
        value_delimiter = ','
    )]
    states: Vec<String>,
    /// File with the server's read token, if it requires one.
    #[arg(long, env = "WINDVANE_READ_TOKEN_FILE", value_name = "FILE")]
    read_token_file: Option<PathBuf>,
    /// Output format.
    #[arg(long, env = "WINDVANE_OUTPUT", default_value = "table", value_parser = ["table", "json"])]
    output: String,
}

/// `windvane cluster …`.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    action: ClusterAction,
}

#[derive(Debug, Subcommand)]
enum ClusterAction {
    /// Allow the cluster's next enrolment to bind a new identity key (after a reinstall or key loss); until
    /// then the old key keeps reporting, and once a new key is bound the old one is refused.
    Rekey(AdminArgs),
    /// Remove the cluster and everything stored about it; its agent, if still running, enrols again afresh
    /// at its next heartbeat (so it reappears), and a stopped one stays gone.
    Forget(AdminArgs),
}

#[derive(Debug, Args)]
struct AdminArgs {
    /// The cluster's name.
    name: String,
    /// The source server, e.g. https://windvane.example.com.
    #[arg(long, env = "WINDVANE_SERVER", value_name = "URL")]
    server: String,
    /// File with the server's admin token (what `windvane-server serve --admin-token-file` reads); the
    /// registration token does not authorise admin actions.
    #[arg(long, env = "WINDVANE_ADMIN_TOKEN_FILE", value_name = "FILE")]
    admin_token_file: PathBuf,
}

fn http_client() -> anyhow::Result<reqwest::Client> {
    // reqwest is built without a bundled crypto provider; ring is the one provider in the whole workspace.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(60))
        .build()
        .context("build the HTTP client")
}

fn read_token(path: &PathBuf) -> anyhow::Result<String> {
    let token = super::read_text(path)?;
    let token = token.trim();
    if token.is_empty() {
        bail!("{}: empty token", path.display());
    }
    Ok(token.to_owned())
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the runtime")
}

/// Prints the fleet table; exit 0 only when at least one cluster is selected and all are Synced.
pub fn status(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let base = args.server.trim_end_matches('/');
    let mut query: Vec<(&str, String)> = Vec::new();
    if let Some(selector) = &args.selector {
        query.push(("selector", selector.clone()));
    }
    for state in &args.states {
        query.push(("state", state.clone()));
    }
    let query: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(query)
        .finish();
    let url = format!("{base}/api/v1/fleet?{query}");
    let token = args.read_token_file.as_ref().map(read_token).transpose()?;
    let fleet: FleetView = runtime()?.block_on(async {
        let mut request = http_client()?.get(&url);
        if let Some(token) = &token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.with_context(|| format!("GET {url}"))?;
        let status = response.status();
        let body = read_capped(response, MAX_REPLY_BYTES, &format!("GET {url}")).await?;
        if !status.is_success() {
            bail!("GET {url}: {status}: {}", error_message(&body));
        }
        parse_fleet(&url, &body)
    })?;
    if args.output == "json" {
        // JSON strings escape control characters themselves.
        println!("{}", serde_json::to_string_pretty(&fleet)?);
    } else {
        print!("{}", clean(&render_table(&fleet)));
    }
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

/// `GET url` (with a bearer token when given) read as JSON of type `T`; a non-success status is an error
/// carrying the server's message.
pub(crate) fn get_json<T: serde::de::DeserializeOwned>(
    url: &str,
    token: Option<&str>,
) -> anyhow::Result<T> {
    runtime()?.block_on(async {
        let mut request = http_client()?.get(url);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.with_context(|| format!("GET {url}"))?;
        let status = response.status();
        let body = read_capped(response, MAX_REPLY_BYTES, &format!("GET {url}")).await?;
        if !status.is_success() {
            bail!("GET {url}: {status}: {}", error_message(&body));
        }
        serde_json::from_slice(&body).with_context(|| format!("GET {url}: not the expected JSON"))
    })
}

/// Reads the body of `GET /api/v1/fleet` as the typed fleet view.
fn parse_fleet(url: &str, body: &[u8]) -> anyhow::Result<FleetView> {
    serde_json::from_slice(body).with_context(|| {
        format!("GET {url}: the body is not the fleet JSON of /api/v1/fleet (is the URL a Windvane source server of this version?)")
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
    match not_synced.len() {
        0 => None,
        n if n <= 5 => Some(not_synced.join(", ")),
        n => Some(format!(
            "{}, and {} more",
            not_synced[..5].join(", "),
            n - 5
        )),
    }
}

/// The server's error message (its JSON `error`, else the start of the body), made safe for a terminal.
fn error_message(body: &[u8]) -> String {
    let text = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned());
    clean_line(&text)
}

fn age(seconds: Option<u64>) -> String {
    match seconds {
        None => "never".to_owned(),
        Some(s) if s < 120 => format!("{s}s ago"),
        Some(s) if s < 7200 => format!("{}m ago", s / 60),
        Some(s) if s < 172_800 => format!("{}h ago", s / 3600),
        Some(s) => format!("{}d ago", s / 86_400),
    }
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
    let header = [
        "CLUSTER",
        "STATE",
        "RELEASE",
        "HEARTBEAT",
        "DRIFT",
        "LABELS",
        "LAST ERROR",
    ];
    let rows: Vec<[String; 7]> = fleet.clusters.iter().map(table_row).collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<w$}  "));
            }
        }
        text.trim_end().to_owned() + "\n"
    };
    out.push_str(&line(header.to_vec()));
    for row in &rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// One cluster's cells, in the order of the table's header.
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
        clean_line(&row.name),
        clean_line(&state),
        release,
        age(row.heartbeat_age_seconds),
        row.drift_total.to_string(),
        clean_line(&labels),
        error,
    ]
}

/// `windvane cluster rekey|forget NAME`.
pub fn cluster(args: ClusterArgs) -> anyhow::Result<()> {
    let (action, admin) = match args.action {
        ClusterAction::Rekey(admin) => ("rekey", admin),
        ClusterAction::Forget(admin) => ("forget", admin),
    };
    let token = read_token(&admin.admin_token_file)?;
    let url = format!(
        "{}/api/v1/clusters/{}/{action}",
        admin.server.trim_end_matches('/'),
        admin.name
    );
    let body = runtime()?.block_on(async {
        let response = http_client()?
            .post(&url)
            .bearer_auth(&token)
            .send()
            .await
            .with_context(|| format!("POST {url}"))?;
        let status = response.status();
        let body = read_capped(response, MAX_REPLY_BYTES, &format!("POST {url}")).await?;
        if !status.is_success() {
            bail!(
                "{action} {}: {status}: {}",
                admin.name,
                error_message(&body)
            );
        }
        anyhow::Ok(body)
    })?;
    match action {
        "rekey" => println!("{}", rekey_allowed(&admin.name, &body)),
        _ => println!("cluster {}: forgotten", admin.name),
    }
    Ok(())
}

/// What a rekey allows, from the server's reply: until when (the server's `--rekey-ttl`), and that the
/// cluster's current key withdraws it by reporting.
fn rekey_allowed(cluster: &str, reply: &[u8]) -> String {
    let until = serde_json::from_slice::<Value>(reply)
        .ok()
        .and_then(|v| v["until"].as_str().map(str::to_owned));
    match until {
        Some(until) => format!(
            "cluster {cluster}: an enrolment with a new key is allowed until {until} (a heartbeat of its \
             current key withdraws it)"
        ),
        None => format!("cluster {cluster}: its next enrolment may bind a new key"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use windvane_shared::wire::status::SyncState;

    #[test]
    fn a_rekey_says_until_when() {
        assert_eq!(
            rekey_allowed(
                "edge-7",
                br#"{"cluster":"edge-7","result":"rekey_allowed","until":"2026-12-07T13:00:00Z"}"#
            ),
            "cluster edge-7: an enrolment with a new key is allowed until 2026-12-07T13:00:00Z (a heartbeat \
             of its current key withdraws it)"
        );
        assert_eq!(
            rekey_allowed("edge-7", b"{}"),
            "cluster edge-7: its next enrolment may bind a new key"
        );
    }

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
