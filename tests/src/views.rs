//! The fleet as the server's views show it, reduced to what can be compared: each cluster's state and the
//! count per state, read from the JSON API (`/api/v1/fleet`) or from the fleet page's HTML (`/`). Tests
//! assert that the views agree — with each other, across replicas, and with `windvane status`.

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;

use crate::process::binary;
use crate::server::{SourceServer, query_escape};

/// Cluster name → state, and state → count (states with none left out), as one view shows them.
#[derive(Debug, PartialEq, Eq)]
pub struct Shown {
    pub states: BTreeMap<String, String>,
    pub counts: BTreeMap<String, u64>,
}

/// Reads `/api/v1/fleet`'s `clusters` (name, state) and `counts`.
pub fn from_api(fleet: &Value) -> Shown {
    let states = fleet["clusters"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or("?").to_owned(),
                c["state"].as_str().unwrap_or("?").to_owned(),
            )
        })
        .collect();
    let counts = fleet["counts"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(_, n)| n.as_u64().unwrap_or(0) > 0)
                .map(|(s, n)| (s.clone(), n.as_u64().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default();
    Shown { states, counts }
}

/// Reads the fleet page's rows (`<tr class="s-STATE"><td><a href="/clusters/NAME">`) and its counters
/// (`id="count-STATE" …><div class="n">N</div>`).
pub fn from_page(html: &str) -> Shown {
    let mut states = BTreeMap::new();
    for row in html.split("<tr class=\"s-").skip(1) {
        let state = row.split('"').next().unwrap_or("?").to_owned();
        if let Some(name) = row
            .split("href=\"/clusters/")
            .nth(1)
            .and_then(|r| r.split('"').next())
        {
            states.insert(name.to_owned(), state);
        }
    }
    let mut counts = BTreeMap::new();
    for counter in html.split("id=\"count-").skip(1) {
        let state = counter.split('"').next().unwrap_or("?");
        let n = counter
            .split("<div class=\"n\">")
            .nth(1)
            .and_then(|r| r.split('<').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        if state != "total" && n > 0 {
            counts.insert(state.to_owned(), n);
        }
    }
    Shown { states, counts }
}

/// Reads `windvane status`'s table: `N clusters: Synced 3 · Unknown 1`, a header, one row per cluster.
pub fn from_status_table(text: &str) -> Shown {
    let mut lines = text.lines();
    let summary = lines.next().unwrap_or_default();
    let counts = summary
        .split_once(": ")
        .map(|(_, parts)| {
            parts
                .split(" · ")
                .filter_map(|p| p.rsplit_once(' '))
                .filter_map(|(s, n)| Some((s.to_owned(), n.parse().ok()?)))
                .collect()
        })
        .unwrap_or_default();
    let states = lines
        .skip_while(|l| !l.starts_with("CLUSTER"))
        .skip(1)
        .filter_map(|l| {
            let mut cells = l.split_whitespace();
            Some((cells.next()?.to_owned(), cells.next()?.to_owned()))
        })
        .collect();
    Shown { states, counts }
}

/// Runs the `windvane` command line; its exit success, stdout and stderr.
pub fn windvane(args: &[&str]) -> anyhow::Result<(bool, String, String)> {
    let output = Command::new(binary("windvane")?).args(args).output()?;
    Ok((
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

/// The fleet page, the JSON API and `windvane status` — all filtered by `selector` when one is given —
/// show the same clusters in the same states with the same counts. Returns what they show.
pub async fn three_views_agree(
    server: &SourceServer,
    selector: Option<&str>,
) -> anyhow::Result<Shown> {
    let api = from_api(&server.fleet(selector).await?);
    let page_path = selector.map_or_else(
        || "/".to_owned(),
        |s| format!("/?selector={}", query_escape(s)),
    );
    let (code, html) = server.get(&page_path).await?;
    anyhow::ensure!(code == 200, "GET {page_path}: {code}");
    let page = from_page(&html);
    let mut args = vec!["status", "--server", &server.url];
    if let Some(selector) = selector {
        args.extend(["--selector", selector]);
    }
    let (_, table, stderr) = windvane(&args)?;
    let cli = from_status_table(&table);
    anyhow::ensure!(!api.states.is_empty(), "the API lists no cluster: {api:?}");
    anyhow::ensure!(
        api == page,
        "the page and the API disagree:\nAPI  {api:?}\npage {page:?}"
    );
    anyhow::ensure!(
        api == cli,
        "`windvane status` and the API disagree:\nAPI    {api:?}\nstatus {cli:?}\n{table}{stderr}"
    );
    Ok(api)
}
