//! The fleet page (`/`) and the cluster pages (`/clusters/{name}`): server-rendered HTML with inline CSS and
//! no script, built by pure functions from the [`FleetView`] and [`ClusterDetail`] that the JSON API also
//! serves. The page refreshes itself (`<meta http-equiv=refresh>`), puts the counts per state at the top —
//! Unknown drawn apart from Synced — and filters by label selector and state through plain query parameters,
//! so every view is a link. Everything that came from a cluster or a query is HTML-escaped
//! ([`super::escape::html`]).

use std::fmt::Write as _;

use jiff::Timestamp;

use super::break_glass::OpenBreakGlass;
use super::escape::html as escape;
use super::status::ClusterState;
use super::view::{ClusterDetail, ClusterRow, FleetView, human_age};
use windvane_shared::wire::fleet_api::DriftEntry;
use windvane_shared::wire::heartbeat::Heartbeat;

/// Seconds between automatic refreshes.
pub const REFRESH_SECONDS: u32 = 15;

/// Percent-encodes a query parameter value.
fn query_value(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

const CSS: &str = r#"
:root{--fg:#1d2330;--muted:#5b6475;--line:#d9dee7;--bg:#f6f7f9;--card:#fff;
--failed:#b42318;--degraded:#c4320a;--contested:#9e3fb5;--outofsync:#b54708;--unknown:#475467;
--held:#3e4784;--progressing:#175cd3;--synced:#067647;--neverseen:#667085}
*{box-sizing:border-box}body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
header{display:flex;align-items:baseline;gap:16px;padding:12px 24px;background:#101828;color:#fff}
header h1{font-size:17px;margin:0;font-weight:600}header a{color:#fff;text-decoration:none}
header .meta{color:#98a2b3;font-size:12px;margin-left:auto}
main{padding:16px 24px;max-width:1500px}
.counts{display:flex;flex-wrap:wrap;gap:10px;margin:4px 0 16px}
.count{display:block;min-width:112px;padding:10px 14px;background:var(--card);border:1px solid var(--line);border-left:6px solid var(--c);border-radius:6px;color:inherit;text-decoration:none}
.count .n{font-size:26px;font-weight:650;font-variant-numeric:tabular-nums;color:var(--c)}
.count .l{font-size:12px;color:var(--muted);text-transform:uppercase;letter-spacing:.04em}
.count.zero{opacity:.55}.count.zero .n{color:var(--muted)}
.count.unknown{border-style:dashed;border-left-style:solid;background:repeating-linear-gradient(135deg,#fff,#fff 8px,#f2f4f7 8px,#f2f4f7 16px)}
.sep{width:1px;background:var(--line);margin:0 6px}
form.filter{display:flex;gap:8px;align-items:center;margin-bottom:12px;flex-wrap:wrap}
form.filter input[type=text]{width:340px;padding:6px 8px;border:1px solid var(--line);border-radius:4px;font:inherit}
form.filter select,form.filter button{padding:6px 8px;border:1px solid var(--line);border-radius:4px;font:inherit;background:#fff}
form.filter button{background:#101828;color:#fff;border-color:#101828;cursor:pointer}
table{border-collapse:collapse;width:100%;background:var(--card);border:1px solid var(--line);border-radius:6px;overflow:hidden}
th,td{text-align:left;padding:7px 10px;border-bottom:1px solid var(--line);vertical-align:top}
th{font-size:12px;color:var(--muted);font-weight:600;text-transform:uppercase;letter-spacing:.04em;background:#f9fafb}
td.num{font-variant-numeric:tabular-nums;white-space:nowrap}
tr:last-child td{border-bottom:0}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600;color:#fff;background:var(--c);white-space:nowrap}
.badge.Unknown{background:#fff;color:var(--unknown);border:1px dashed var(--unknown)}
.badge.NeverSeen{background:#fff;color:var(--neverseen);border:1px solid var(--neverseen)}
.s-Failed{--c:var(--failed)}.s-Degraded{--c:var(--degraded)}.s-Contested{--c:var(--contested)}.s-OutOfSync{--c:var(--outofsync)}
.s-Unknown{--c:var(--unknown)}.s-Held{--c:var(--held)}.s-Progressing{--c:var(--progressing)}.s-Synced{--c:var(--synced)}.s-NeverSeen{--c:var(--neverseen)}
.label{display:inline-block;margin:0 4px 2px 0;padding:0 6px;border:1px solid var(--line);border-radius:3px;font:12px ui-monospace,SFMono-Regular,Menlo,monospace;color:var(--muted);white-space:nowrap}
.muted{color:var(--muted)}.warn{color:var(--failed)}.behind{color:var(--outofsync);font-weight:600}
.err{font:12px ui-monospace,SFMono-Regular,Menlo,monospace;color:var(--failed);max-width:460px;overflow-wrap:anywhere}
a{color:#175cd3}h2{font-size:15px;margin:22px 0 8px}
dl.facts{display:grid;grid-template-columns:max-content auto;gap:4px 16px;background:var(--card);border:1px solid var(--line);border-radius:6px;padding:12px 16px;margin:0}
dl.facts dt{color:var(--muted)}dl.facts dd{margin:0;overflow-wrap:anywhere}
.mono{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px}
.empty{padding:18px;text-align:center;color:var(--muted);background:var(--card);border:1px solid var(--line);border-radius:6px}
footer{padding:16px 24px;color:var(--muted);font-size:12px}
"#;

fn head(out: &mut String, title: &str) {
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <meta http-equiv=\"refresh\" content=\"{REFRESH_SECONDS}\">\
         <link rel=\"icon\" href=\"data:,\"><title>{}</title><style>{CSS}</style></head><body>",
        escape(title)
    );
}

fn header(out: &mut String, generated_at: Timestamp) {
    let _ = write!(
        out,
        "<header><h1><a href=\"/\">Windvane</a> · fleet status</h1>\
         <span class=\"meta\">as of {} · refreshes every {REFRESH_SECONDS}s</span></header>",
        escape(&generated_at.strftime("%Y-%m-%d %H:%M:%S UTC").to_string())
    );
}

fn footer(out: &mut String) {
    out.push_str(
        "<footer>Unknown = no heartbeat within the grace period (the last reported state is shown beside it); \
         it is never counted as Synced. JSON: <a href=\"/api/v1/fleet\">/api/v1/fleet</a> · \
         <a href=\"/api/v1/drift\">/api/v1/drift</a> · <a href=\"/metrics\">/metrics</a></footer></body></html>",
    );
}

fn badge(state: ClusterState) -> String {
    format!("<span class=\"badge s-{0} {0}\">{0}</span>", state.as_str())
}

fn labels(out: &mut String, labels: &std::collections::BTreeMap<String, String>) {
    for (key, value) in labels {
        let _ = write!(
            out,
            "<span class=\"label\">{}={}</span>",
            escape(key),
            escape(value)
        );
    }
}

fn state_cell(row: &ClusterRow) -> String {
    let mut cell = badge(row.state);
    if row.state == ClusterState::Unknown {
        let last = row.last_reported.map_or("nothing", |s| s.as_str());
        let _ = write!(
            cell,
            " <span class=\"muted\">last reported {}</span>",
            escape(last)
        );
    }
    cell
}

fn release_cell(row: &ClusterRow) -> String {
    let applied = row.applied_serial.map_or("–".to_owned(), |s| s.to_string());
    let latest = row.latest_serial.map_or("–".to_owned(), |s| s.to_string());
    let channel = row
        .channel
        .as_deref()
        .map(|c| format!(" <span class=\"muted\">{}</span>", escape(c)))
        .unwrap_or_default();
    if row.behind() {
        format!(
            "<span class=\"behind\" title=\"behind the channel's latest release\">{applied} / {latest}</span>{channel}"
        )
    } else {
        format!("{applied} / {latest}{channel}")
    }
}

fn age_cell(row: &ClusterRow) -> String {
    match row.heartbeat_age_seconds {
        None => "<span class=\"muted\">never</span>".to_owned(),
        Some(age) if row.state == ClusterState::Unknown => {
            format!(
                "<span class=\"warn\">{} ago</span> <span class=\"muted\">(grace {})</span>",
                human_age(age),
                human_age(row.grace_seconds)
            )
        }
        Some(age) => format!("{} ago", human_age(age)),
    }
}

/// The fleet page; `break_glass` are the fleet's open break-glass changes, listed above the clusters.
pub fn fleet_page(
    view: &FleetView,
    selector: &str,
    states: &[ClusterState],
    break_glass: &[OpenBreakGlass],
) -> String {
    let mut out = String::with_capacity(16 * 1024 + view.clusters.len() * 512);
    head(&mut out, "Windvane · fleet");
    header(&mut out, view.generated_at);
    out.push_str("<main>");
    state_counts(&mut out, view, selector);
    rollout_links(&mut out, view);
    filter_form(&mut out, selector, states);
    break_glass_table(&mut out, break_glass);
    clusters_table(&mut out, view);
    out.push_str("</main>");
    footer(&mut out);
    out
}

/// The clusters per state, each a link to the fleet filtered by it (and by `selector`), then the total.
fn state_counts(out: &mut String, view: &FleetView, selector: &str) {
    out.push_str("<nav class=\"counts\" id=\"counts\" aria-label=\"clusters per state\">");
    let selector_param = if selector.is_empty() {
        String::new()
    } else {
        format!("selector={}&amp;", query_value(selector))
    };
    for (state, count) in &view.counts {
        if *state == ClusterState::NeverSeen {
            out.push_str("<span class=\"sep\"></span>");
        }
        let zero = if *count == 0 { " zero" } else { "" };
        let extra = if *state == ClusterState::Unknown {
            " unknown"
        } else {
            ""
        };
        let _ = write!(
            out,
            "<a class=\"count s-{s}{zero}{extra}\" id=\"count-{s}\" href=\"/?{selector_param}state={s}\" title=\"{title}\">\
             <div class=\"n\">{count}</div><div class=\"l\">{label}</div></a>",
            s = state.as_str(),
            title = match state {
                ClusterState::Unknown => "no heartbeat within the grace period",
                ClusterState::NeverSeen => "enrolled, never sent a heartbeat",
                _ => "",
            },
            label = match state {
                ClusterState::OutOfSync => "Out of sync",
                ClusterState::NeverSeen => "Never seen",
                other => other.as_str(),
            },
        );
    }
    let _ = write!(
        out,
        "<a class=\"count\" style=\"--c:var(--fg)\" id=\"count-total\" href=\"/?{}\"><div class=\"n\">{}</div><div class=\"l\">Total</div></a>",
        selector_param.trim_end_matches("&amp;"),
        view.total
    );
    out.push_str("</nav>");
}

/// Links to the rollout page of every channel a listed cluster follows.
fn rollout_links(out: &mut String, view: &FleetView) {
    let channels: std::collections::BTreeSet<&str> = view
        .clusters
        .iter()
        .filter_map(|c| c.channel.as_deref())
        .collect();
    if !channels.is_empty() {
        out.push_str("<p class=\"muted\" id=\"rollouts\">Rollouts:");
        for channel in channels {
            let channel = escape(channel);
            let _ = write!(out, " <a href=\"/rollouts/{channel}\">{channel}</a>");
        }
        out.push_str("</p>");
    }
}

/// The label selector and state filter, showing the ones in force.
fn filter_form(out: &mut String, selector: &str, states: &[ClusterState]) {
    let _ = write!(
        out,
        "<form class=\"filter\" method=\"get\" action=\"/\"><label for=\"selector\" class=\"muted\">Label selector</label>\
         <input type=\"text\" id=\"selector\" name=\"selector\" value=\"{}\" placeholder=\"env=prod,region in (eu,us)\">\
         <label for=\"state\" class=\"muted\">State</label><select id=\"state\" name=\"state\"><option value=\"\">any</option>",
        escape(selector)
    );
    for state in ClusterState::ALL {
        let selected = if states.contains(&state) {
            " selected"
        } else {
            ""
        };
        let _ = write!(
            out,
            "<option value=\"{0}\"{selected}>{0}</option>",
            state.as_str()
        );
    }
    out.push_str("</select><button type=\"submit\">Filter</button> <a href=\"/\">clear</a></form>");
}

/// A row per cluster: name, labels, state, release, heartbeat age, drift count, last error.
fn clusters_table(out: &mut String, view: &FleetView) {
    if view.clusters.is_empty() {
        out.push_str("<div class=\"empty\">No cluster matches.</div>");
    } else {
        out.push_str(
            "<table id=\"clusters\"><thead><tr><th>Cluster</th><th>Labels</th><th>State</th>\
             <th title=\"applied serial / latest serial of its channel in this store\">Release</th>\
             <th>Heartbeat</th><th>Drift</th><th>Last error</th></tr></thead><tbody>",
        );
        for row in &view.clusters {
            let _ = write!(
                out,
                "<tr class=\"s-{}\"><td><a href=\"/clusters/{name}\">{name}</a></td><td>",
                row.state.as_str(),
                name = escape(&row.name)
            );
            labels(out, &row.labels);
            let _ = write!(
                out,
                "</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"err\">{}</td></tr>",
                state_cell(row),
                release_cell(row),
                age_cell(row),
                row.drift_total,
                escape(row.last_error.as_deref().unwrap_or(""))
            );
        }
        out.push_str("</tbody></table>");
    }
}

/// The open break-glass changes: each is a production change made outside the release, to be reverted or
/// taken into a release before its hold ends.
fn break_glass_table(out: &mut String, open: &[OpenBreakGlass]) {
    if open.is_empty() {
        return;
    }
    let _ = write!(
        out,
        "<h2>Open break-glass changes ({})</h2><table id=\"break-glass\"><thead><tr><th>Cluster</th>\
         <th>Object</th><th>Changed by</th><th>Approved by</th><th>Ticket</th><th>Since</th>\
         <th>Reverted at</th></tr></thead><tbody>",
        open.len()
    );
    for change in open {
        let _ = write!(
            out,
            "<tr><td><a href=\"/clusters/{cluster}\">{cluster}</a></td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&change.object),
            escape(&change.by),
            escape(&change.approver),
            escape(&change.ticket),
            opt_time(Some(change.detected_at)),
            opt_time(Some(change.until)),
            cluster = escape(&change.cluster),
        );
    }
    out.push_str("</tbody></table>");
}

fn opt_time(t: Option<Timestamp>) -> String {
    t.map(|t| escape(&t.strftime("%Y-%m-%d %H:%M:%S").to_string()))
        .unwrap_or_else(|| "–".to_owned())
}

fn latency(from: Option<Timestamp>, to: Option<Timestamp>) -> String {
    match (from, to) {
        (Some(a), Some(b)) => {
            let ms = b.as_millisecond().saturating_sub(a.as_millisecond()).max(0);
            if ms < 10_000 {
                format!("{:.1}s", ms as f64 / 1000.0)
            } else {
                human_age(u64::try_from(ms / 1000).unwrap_or(0))
            }
        }
        _ => "–".to_owned(),
    }
}

/// One cluster's page: facts, apps, problem objects and the drift audit log.
pub fn cluster_page(detail: &ClusterDetail, now: Timestamp) -> String {
    let row = &detail.cluster;
    let mut out = String::with_capacity(16 * 1024);
    head(&mut out, &format!("{} · Windvane", row.name));
    header(&mut out, now);
    let _ = write!(
        out,
        "<main><h2 style=\"font-size:20px\">{} {}</h2><dl class=\"facts\">",
        escape(&row.name),
        state_cell(row)
    );
    cluster_facts(&mut out, detail);
    out.push_str("</dl>");
    apps_table(&mut out, detail.report.as_ref());
    problems_table(&mut out, detail.report.as_ref());
    drift_table(&mut out, &detail.drift);
    let _ = write!(
        out,
        "<p class=\"muted\">JSON: <a href=\"/api/v1/clusters/{0}\">/api/v1/clusters/{0}</a></p></main>",
        escape(&row.name)
    );
    footer(&mut out);
    out
}

/// The cluster's facts (`<dt>`/`<dd>` pairs): what the server stored, then what the agent last reported.
fn cluster_facts(out: &mut String, detail: &ClusterDetail) {
    let row = &detail.cluster;
    let mut fact = |name: &str, value: String| {
        let _ = write!(out, "<dt>{name}</dt><dd>{value}</dd>");
    };
    fact("Fleet", escape(&row.fleet));
    let mut label_html = String::new();
    labels(&mut label_html, &row.labels);
    fact("Labels", label_html);
    fact("Release (applied / latest)", release_cell(row));
    fact(
        "Last heartbeat",
        format!(
            "{} <span class=\"muted\">at {}</span>",
            age_cell(row),
            opt_time(row.last_seen)
        ),
    );
    fact(
        "Interval / grace",
        format!(
            "{} / {}",
            row.interval_seconds
                .map_or("–".to_owned(), |s| format!("{s}s")),
            human_age(row.grace_seconds)
        ),
    );
    fact("Sequence", row.sequence.to_string());
    fact(
        "Identity key",
        format!("<span class=\"mono\">{}</span>", escape(&row.keyid)),
    );
    fact("Enrolled", opt_time(Some(row.enrolled_at)));
    if let Some(report) = &detail.report {
        reported_facts(&mut fact, report);
    }
    if let Some(error) = &row.last_error {
        fact(
            "Last error",
            format!("<span class=\"err\">{}</span>", escape(error)),
        );
    }
}

/// The facts only the agent's last report tells: its version, the bundle applied, a stale source, a rollout
/// waiting, the last release refused.
fn reported_facts(fact: &mut impl FnMut(&str, String), report: &Heartbeat) {
    fact("Agent", escape(&report.agent_version));
    if let Some(digest) = &report.source.applied_sha256 {
        fact(
            "Applied bundle",
            format!("<span class=\"mono\">{}</span>", escape(digest)),
        );
    }
    if let Some(since) = report.source.stale_since {
        fact(
            "Source stale since",
            format!("<span class=\"warn\">{}</span>", opt_time(Some(since))),
        );
    }
    if let Some(pending) = &report.source.pending {
        let channel = escape(&report.source.channel);
        fact(
            "Rollout",
            format!(
                "<span class=\"warn\">serial {}: {}</span>{} <a href=\"/rollouts/{channel}\">rollout of {channel}</a>",
                pending.serial,
                escape(&pending.message),
                pending
                    .changes
                    .map_or_else(String::new, |c| format!(" — {}", c.describe()))
            ),
        );
    }
    if let Some(refusal) = &report.source.last_refusal {
        fact(
            "Last refused release",
            format!(
                "<span class=\"err\">{}: {}</span> <span class=\"muted\">at {}</span>",
                escape(&refusal.reason),
                escape(&refusal.message),
                opt_time(Some(refusal.at))
            ),
        );
    }
}

/// The apps the agent reported, with their states and object counts.
fn apps_table(out: &mut String, report: Option<&Heartbeat>) {
    out.push_str("<h2>Apps</h2>");
    match report {
        Some(report) if !report.apps.is_empty() => {
            out.push_str("<table id=\"apps\"><thead><tr><th>App</th><th>State</th><th>Objects</th></tr></thead><tbody>");
            for app in &report.apps {
                let _ = write!(
                    out,
                    "<tr><td>{}</td><td>{}</td><td class=\"num\">{}</td></tr>",
                    escape(&app.name),
                    badge(ClusterState::from_reported(app.state)),
                    app.objects
                );
            }
            out.push_str("</tbody></table>");
        }
        _ => out.push_str("<div class=\"empty\">No apps reported.</div>"),
    }
}

/// The objects the agent reported as not Synced, with why.
fn problems_table(out: &mut String, report: Option<&Heartbeat>) {
    out.push_str("<h2>Problem objects</h2>");
    match report {
        Some(report) if !report.problems.is_empty() => {
            out.push_str("<table id=\"problems\"><thead><tr><th>App</th><th>Object</th><th>State</th><th>Message</th></tr></thead><tbody>");
            for p in &report.problems {
                let _ = write!(
                    out,
                    "<tr><td>{}</td><td class=\"mono\">{}</td><td>{}</td><td class=\"err\">{}</td></tr>",
                    escape(&p.app),
                    escape(&p.object),
                    badge(ClusterState::from_reported(p.state)),
                    escape(&p.message)
                );
            }
            out.push_str("</tbody></table>");
        }
        _ => out.push_str("<div class=\"empty\">No problem objects.</div>"),
    }
}

/// The cluster's drift audit log: what changed, who changed it, what Windvane did and how fast.
fn drift_table(out: &mut String, drift: &[DriftEntry]) {
    out.push_str("<h2>Drift audit log</h2>");
    if drift.is_empty() {
        out.push_str("<div class=\"empty\">No drift recorded.</div>");
    } else {
        out.push_str(
            "<table id=\"drift\"><thead><tr><th>Changed</th><th>Object</th><th>Fields</th><th>By</th><th>Action</th>\
             <th title=\"changed → detected\">Detection</th><th title=\"detected → reverted\">Repair</th></tr></thead><tbody>",
        );
        for entry in drift {
            let d = &entry.record;
            let object = match &d.namespace {
                Some(ns) => format!("{} {ns}/{}", d.kind, d.name),
                None => format!("{} {}", d.kind, d.name),
            };
            let fields = if d.deleted {
                "(deleted)".to_owned()
            } else {
                d.fields.join(", ")
            };
            let who = match (&d.manager, &d.operation) {
                (Some(m), Some(op)) => format!("{m} ({op})"),
                (Some(m), None) => m.clone(),
                _ => "unknown".to_owned(),
            };
            let critical = super::notify::drift_severity(d) == super::notify::Severity::Critical;
            let _ = write!(
                out,
                "<tr><td class=\"num\">{}</td><td class=\"mono\">{}{}</td><td class=\"mono\">{}</td><td>{}</td><td>{:?}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
                opt_time(d.changed_at.or(Some(d.detected_at))),
                escape(&object),
                if critical {
                    " <span class=\"badge s-Failed\">critical</span>"
                } else {
                    ""
                },
                escape(&fields),
                escape(&who),
                d.action,
                latency(d.changed_at, Some(d.detected_at)),
                latency(Some(d.detected_at), d.reverted_at),
            );
        }
        out.push_str("</tbody></table>");
    }
}

/// The rollout page of a channel (`/rollouts/{channel}`): each wave with when it opens, its counts, why it is
/// held, and its clusters.
pub fn rollout_page(view: &windvane_shared::decide::rollout::RolloutView) -> String {
    let mut out = String::new();
    head(&mut out, &format!("Windvane · rollout of {}", view.channel));
    header(&mut out, Timestamp::now());
    let status = if view.complete {
        "complete"
    } else if view.halted {
        "halted"
    } else {
        "in progress"
    };
    let _ = write!(
        out,
        "<main><h2>Rollout of channel {} · serial {} · {status}</h2><p class=\"meta\">issued {}</p>",
        escape(&view.channel),
        view.serial,
        escape(&view.issued_at.to_string())
    );
    for wave in &view.waves {
        let _ = write!(
            out,
            "<section><h3>{} — {}, opens {}</h3><p>done {} · pending {} · failed {} · unknown {}{}</p>",
            escape(&wave.name),
            if wave.opened { "open" } else { "not open" },
            escape(&wave.opens_at.to_string()),
            wave.done,
            wave.pending,
            wave.failed,
            wave.unknown,
            wave.held
                .as_deref()
                .map(|h| format!(" · <strong class=\"held\">held: {}</strong>", escape(h)))
                .unwrap_or_default()
        );
        out.push_str(
            "<table><tr><th>cluster</th><th>state</th><th>serial</th><th>rollout</th><th>waiting for</th></tr>",
        );
        for cluster in &wave.clusters {
            let _ = write!(
                out,
                "<tr><td><a href=\"/clusters/{0}\">{0}</a></td><td>{1}</td><td>{2}</td><td>{3:?}</td><td>{4}</td></tr>",
                escape(&cluster.name),
                badge(cluster.state),
                cluster
                    .applied_serial
                    .map_or("–".to_owned(), |s| s.to_string()),
                cluster.phase,
                escape(cluster.waiting.as_deref().unwrap_or_default())
            );
        }
        out.push_str("</table></section>");
    }
    out.push_str("</main>");
    footer(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::db::ClusterSummary;
    use crate::server::status::Filter;
    use crate::server::view::fleet_view;
    use windvane_shared::wire::status::SyncState;

    #[test]
    fn the_fleet_page_shows_counts_and_escapes_cluster_data() {
        let now = Timestamp::from_second(1_800_000_000).expect("valid");
        let clusters = vec![ClusterSummary {
            name: "evil".into(),
            fleet: "acme".into(),
            keyid: "k".into(),
            labels: [("team".to_owned(), "<script>alert(1)</script>".to_owned())].into(),
            enrolled_at: now,
            rekey_allowed_until: None,
            last_sequence: 1,
            last_seen: Some(now),
            interval_seconds: Some(30),
            state: Some(SyncState::Failed),
            channel: Some("stable".into()),
            applied_serial: Some(1),
            last_error: Some("<img src=x onerror=alert(1)>".into()),
            drift_total: 2,
            public_key: String::new(),
        }];
        let view = fleet_view(clusters, now, None, &Filter::default(), &|_| Some(2));
        let html = fleet_page(&view, "team=\"x\"", &[], &[]);
        assert!(!html.contains("<script>alert"));
        assert!(!html.contains("<img src=x"));
        assert!(html.contains("&lt;script&gt;"));
        assert!(html.contains("value=\"team=&quot;x&quot;\""));
        assert!(html.contains("id=\"count-Failed\""));
        assert!(html.contains("id=\"count-Unknown\""));
        assert!(html.contains("<div class=\"n\">1</div><div class=\"l\">Failed</div>"));
        assert!(html.contains("http-equiv=\"refresh\""));
        assert!(!html.contains("<script"), "no script at all");
        assert!(!html.contains("break-glass"), "none open, no table");
    }

    #[test]
    fn open_break_glass_changes_are_listed_with_who_approved_and_the_ticket() {
        let now: Timestamp = "2026-12-04T12:00:00Z".parse().expect("time");
        let view = fleet_view(Vec::new(), now, None, &Filter::default(), &|_| None);
        let open = [OpenBreakGlass {
            cluster: "prod-eu".into(),
            object: "apps/Deployment shop/api".into(),
            by: "alice".into(),
            approver: "bob".into(),
            ticket: "INC-<42>".into(),
            detected_at: now,
            until: now + jiff::SignedDuration::from_hours(24),
        }];
        let html = fleet_page(&view, "", &[], &open);
        assert!(html.contains("Open break-glass changes (1)"), "{html}");
        assert!(html.contains("<a href=\"/clusters/prod-eu\">prod-eu</a>"));
        assert!(html.contains("<td>alice</td><td>bob</td><td>INC-&lt;42&gt;</td>"));
        assert!(html.contains("2026-12-05 12:00:00"), "when it is reverted");
    }
}
