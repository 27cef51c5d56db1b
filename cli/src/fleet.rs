//! `windvane status` and `windvane cluster rekey|forget`: the SRE's view of the fleet from a terminal or a
//! pipeline. `status` reads the source server's `/api/v1/fleet` (with an optional label selector and state
//! filter), prints the table, and exits 0 only when every selected cluster is Synced — Unknown and
//! NeverSeen are not. `cluster rekey|forget` call the server's admin endpoints with the admin token (the
//! server's `--admin-token-file`; the registration token every cluster holds never authorises them).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use serde_json::Value;

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
    let fleet: Value = runtime()?.block_on(async {
        let mut request = http_client()?.get(&url);
        if let Some(token) = &token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.with_context(|| format!("GET {url}"))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .with_context(|| format!("GET {url}"))?;
        if !status.is_success() {
            bail!("GET {url}: {status}: {}", error_message(&body));
        }
        serde_json::from_slice(&body).with_context(|| format!("GET {url}: not the fleet JSON"))
    })?;
    if args.output == "json" {
        println!("{}", serde_json::to_string_pretty(&fleet)?);
    } else {
        print!("{}", render_table(&fleet));
    }
    let verdict = verdict(&fleet);
    if let Some(reason) = &verdict {
        eprintln!("not synced: {reason}");
    }
    Ok(if verdict.is_none() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `None` when every listed cluster is Synced (and there is at least one); otherwise why not.
fn verdict(fleet: &Value) -> Option<String> {
    let rows = fleet["clusters"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if rows.is_empty() {
        return Some("no cluster matches the selection".to_owned());
    }
    let not_synced: Vec<String> = rows
        .iter()
        .filter(|r| r["state"] != "Synced")
        .map(|r| {
            format!(
                "{} is {}",
                r["name"].as_str().unwrap_or("?"),
                r["state"].as_str().unwrap_or("?")
            )
        })
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

fn error_message(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned())
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
fn render_table(fleet: &Value) -> String {
    let mut out = String::new();
    if let Some(counts) = fleet["counts"].as_object() {
        let parts: Vec<String> = counts
            .iter()
            .filter(|(_, n)| n.as_u64().unwrap_or(0) > 0)
            .map(|(state, n)| format!("{state} {n}"))
            .collect();
        let total = fleet["total"].as_u64().unwrap_or(0);
        out.push_str(&format!(
            "{total} clusters: {}\n\n",
            if parts.is_empty() {
                "none".to_owned()
            } else {
                parts.join(" · ")
            }
        ));
    }
    let header = [
        "CLUSTER",
        "STATE",
        "RELEASE",
        "HEARTBEAT",
        "DRIFT",
        "LABELS",
        "LAST ERROR",
    ];
    let mut rows: Vec<[String; 7]> = Vec::new();
    for row in fleet["clusters"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let state = row["state"].as_str().unwrap_or("?");
        let state = match (state, row["lastReported"].as_str()) {
            ("Unknown", Some(last)) => format!("Unknown (last {last})"),
            _ => state.to_owned(),
        };
        let serial = |key: &str| row[key].as_u64().map_or("-".to_owned(), |s| s.to_string());
        let mut release = format!("{}/{}", serial("appliedSerial"), serial("latestSerial"));
        if matches!((row["appliedSerial"].as_u64(), row["latestSerial"].as_u64()), (Some(a), Some(l)) if a < l)
        {
            release.push_str(" behind");
        }
        let labels = row["labels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        let mut error = row["lastError"].as_str().unwrap_or("").replace('\n', " ");
        if error.chars().count() > 60 {
            error = format!("{}…", error.chars().take(59).collect::<String>());
        }
        rows.push([
            row["name"].as_str().unwrap_or("?").to_owned(),
            state,
            release,
            age(row["heartbeatAgeSeconds"].as_u64()),
            row["driftTotal"].as_u64().unwrap_or(0).to_string(),
            labels,
            error,
        ]);
    }
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
    runtime()?.block_on(async {
        let response = http_client()?
            .post(&url)
            .bearer_auth(&token)
            .send()
            .await
            .with_context(|| format!("POST {url}"))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .with_context(|| format!("POST {url}"))?;
        if !status.is_success() {
            bail!(
                "{action} {}: {status}: {}",
                admin.name,
                error_message(&body)
            );
        }
        anyhow::Ok(())
    })?;
    match action {
        "rekey" => println!(
            "cluster {}: its next enrolment may bind a new key",
            admin.name
        ),
        _ => println!("cluster {}: forgotten", admin.name),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet(states: &[&str]) -> Value {
        let clusters: Vec<Value> = states
            .iter()
            .enumerate()
            .map(|(i, s)| {
                serde_json::json!({"name": format!("c{i}"), "state": s, "labels": {"env": "prod"},
                "appliedSerial": 3, "latestSerial": 4, "heartbeatAgeSeconds": 12, "driftTotal": 1,
                "lastReported": "Synced"})
            })
            .collect();
        serde_json::json!({"total": states.len(), "counts": {"Synced": 1, "Unknown": 1, "Failed": 0}, "clusters": clusters})
    }

    #[test]
    fn only_all_synced_passes() {
        assert_eq!(verdict(&fleet(&["Synced", "Synced"])), None);
        assert_eq!(
            verdict(&fleet(&["Synced", "Unknown"])).as_deref(),
            Some("c1 is Unknown")
        );
        assert!(verdict(&fleet(&["NeverSeen"])).is_some());
        assert_eq!(
            verdict(&fleet(&[])).as_deref(),
            Some("no cluster matches the selection")
        );
    }

    #[test]
    fn table_shows_unknown_with_its_last_state() {
        let text = render_table(&fleet(&["Unknown", "Synced"]));
        assert!(
            text.starts_with("2 clusters: Synced 1 · Unknown 1\n"),
            "{text}"
        );
        assert!(text.contains("Unknown (last Synced)"), "{text}");
        assert!(text.contains("3/4 behind"), "{text}");
        assert!(text.contains("12s ago"), "{text}");
        assert!(
            text.lines()
                .nth(2)
                .is_some_and(|l| l.starts_with("CLUSTER")),
            "{text}"
        );
    }
}
