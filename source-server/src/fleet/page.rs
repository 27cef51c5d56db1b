//! The fleet page (`/`) and the cluster pages (`/clusters/{name}`): server-rendered HTML with inline CSS and
//! no script, built by pure functions from the [`FleetView`] and [`ClusterDetail`] that the JSON API also
//! serves. The page refreshes itself (`<meta http-equiv=refresh>`), puts the counts per state at the top —
//! Unknown drawn apart from Synced — and filters by label selector and state through plain query parameters,
//! so every view is a link.
//!
//! The HTML is written with maud's `html!`: every interpolated value (`(value)`) is HTML-escaped unless it is
//! wrapped in `PreEscaped`, which only the fixed style sheet is. Clusters write much of what these pages show
//! (names, labels, errors, field managers, break-glass tickets), so escaping is the default, not a call that
//! each new field has to remember.

use jiff::Timestamp;
use maud::{DOCTYPE, Markup, PreEscaped, html};

use crate::fleet::status::ClusterState;
use crate::fleet::view::{ClusterDetail, ClusterRow, FleetView, human_age};
use crate::notify::break_glass::OpenBreakGlass;
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

/// A whole page: head (title, refresh, style), the header bar, `main` and the footer.
fn page(title: &str, generated_at: Timestamp, main: Markup) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width,initial-scale=1";
                meta http-equiv="refresh" content=(REFRESH_SECONDS);
                link rel="icon" href="data:,";
                title { (title) }
                style { (PreEscaped(CSS)) }
            }
            body {
                header {
                    h1 { a href="/" { "Windvane" } " · fleet status" }
                    span.meta {
                        "as of " (generated_at.strftime("%Y-%m-%d %H:%M:%S UTC")) " · refreshes every "
                        (REFRESH_SECONDS) "s"
                    }
                }
                (main)
                footer {
                    "Unknown = no heartbeat within the grace period (the last reported state is shown beside it); \
                     it is never counted as Synced. JSON: "
                    a href="/api/v1/fleet" { "/api/v1/fleet" } " · "
                    a href="/api/v1/drift" { "/api/v1/drift" } " · "
                    a href="/metrics" { "/metrics" }
                }
            }
        }
    }
    .into_string()
}

fn badge(state: ClusterState) -> Markup {
    let s = state.as_str();
    html! { span class={ "badge s-" (s) " " (s) } { (s) } }
}

fn labels(labels: &std::collections::BTreeMap<String, String>) -> Markup {
    html! {
        @for (key, value) in labels {
            span.label { (key) "=" (value) }
        }
    }
}

fn state_cell(row: &ClusterRow) -> Markup {
    html! {
        (badge(row.state))
        @if row.state == ClusterState::Unknown {
            " " span.muted { "last reported " (row.last_reported.map_or("nothing", |s| s.as_str())) }
        }
    }
}

fn serial(serial: Option<u64>) -> String {
    serial.map_or("–".to_owned(), |s| s.to_string())
}

fn release_cell(row: &ClusterRow) -> Markup {
    let serials = format!(
        "{} / {}",
        serial(row.applied_serial),
        serial(row.latest_serial)
    );
    html! {
        @if row.behind() {
            span.behind title="behind the channel's latest release" { (serials) }
        } @else {
            (serials)
        }
        @if let Some(channel) = &row.channel {
            " " span.muted { (channel) }
        }
    }
}

fn age_cell(row: &ClusterRow) -> Markup {
    html! {
        @match row.heartbeat_age_seconds {
            None => span.muted { "never" },
            Some(age) if row.state == ClusterState::Unknown => {
                span.warn { (human_age(age)) " ago" }
                " " span.muted { "(grace " (human_age(row.grace_seconds)) ")" }
            }
            Some(age) => { (human_age(age)) " ago" }
        }
    }
}

/// The fleet page; `break_glass` are the fleet's open break-glass changes, listed above the clusters.
pub fn fleet_page(
    view: &FleetView,
    selector: &str,
    states: &[ClusterState],
    break_glass: &[OpenBreakGlass],
) -> String {
    let main = html! {
        main {
            (state_counts(view, selector))
            (rollout_links(view))
            (filter_form(selector, states))
            (break_glass_table(break_glass))
            (clusters_table(view))
        }
    };
    page("Windvane · fleet", view.generated_at, main)
}

/// The clusters per state, each a link to the fleet filtered by it (and by `selector`), then the total.
fn state_counts(view: &FleetView, selector: &str) -> Markup {
    let selector_param = if selector.is_empty() {
        String::new()
    } else {
        format!("selector={}", query_value(selector))
    };
    let filtered = |state: &str| {
        if selector_param.is_empty() {
            format!("/?state={state}")
        } else {
            format!("/?{selector_param}&state={state}")
        }
    };
    html! {
        nav.counts #counts aria-label="clusters per state" {
            @for (state, count) in &view.counts {
                @if *state == ClusterState::NeverSeen { span.sep {} }
                @let s = state.as_str();
                a class={ "count s-" (s) @if *count == 0 { " zero" } @if *state == ClusterState::Unknown { " unknown" } }
                    id={ "count-" (s) } href=(filtered(s)) title=(count_title(*state)) {
                    div.n { (count) }
                    div.l { (count_label(*state)) }
                }
            }
            a.count style="--c:var(--fg)" #count-total href={ "/?" (selector_param) } {
                div.n { (view.total) }
                div.l { "Total" }
            }
        }
    }
}

fn count_title(state: ClusterState) -> &'static str {
    match state {
        ClusterState::Unknown => "no heartbeat within the grace period",
        ClusterState::NeverSeen => "enrolled, never sent a heartbeat",
        _ => "",
    }
}

fn count_label(state: ClusterState) -> &'static str {
    match state {
        ClusterState::OutOfSync => "Out of sync",
        ClusterState::NeverSeen => "Never seen",
        other => other.as_str(),
    }
}

/// Links to the rollout page of every channel a listed cluster follows.
fn rollout_links(view: &FleetView) -> Markup {
    let channels: std::collections::BTreeSet<&str> = view
        .clusters
        .iter()
        .filter_map(|c| c.channel.as_deref())
        .collect();
    html! {
        @if !channels.is_empty() {
            p.muted #rollouts {
                "Rollouts:"
                @for channel in channels {
                    " " a href={ "/rollouts/" (channel) } { (channel) }
                }
            }
        }
    }
}

/// The label selector and state filter, showing the ones in force.
fn filter_form(selector: &str, states: &[ClusterState]) -> Markup {
    html! {
        form.filter method="get" action="/" {
            label for="selector" class="muted" { "Label selector" }
            input type="text" #selector name="selector" value=(selector) placeholder="env=prod,region in (eu,us)";
            label for="state" class="muted" { "State" }
            select #state name="state" {
                option value="" { "any" }
                @for state in ClusterState::ALL {
                    option value=(state.as_str()) selected[states.contains(&state)] { (state.as_str()) }
                }
            }
            button type="submit" { "Filter" }
            " " a href="/" { "clear" }
        }
    }
}

/// A row per cluster: name, labels, state, release, heartbeat age, drift count, last error.
fn clusters_table(view: &FleetView) -> Markup {
    html! {
        @if view.clusters.is_empty() {
            div.empty { "No cluster matches." }
        } @else {
            table #clusters {
                thead { tr {
                    th { "Cluster" } th { "Labels" } th { "State" }
                    th title="applied serial / latest serial of its channel in this store" { "Release" }
                    th { "Heartbeat" } th { "Drift" } th { "Last error" }
                } }
                tbody {
                    @for row in &view.clusters {
                        tr class={ "s-" (row.state.as_str()) } {
                            td { a href={ "/clusters/" (row.name) } { (row.name) } }
                            td { (labels(&row.labels)) }
                            td { (state_cell(row)) }
                            td.num { (release_cell(row)) }
                            td.num { (age_cell(row)) }
                            td.num { (row.drift_total) }
                            td.err { (row.last_error.as_deref().unwrap_or("")) }
                        }
                    }
                }
            }
        }
    }
}

/// The open break-glass changes: each is a production change made outside the release, to be reverted or
/// taken into a release before its hold ends.
fn break_glass_table(open: &[OpenBreakGlass]) -> Markup {
    html! {
        @if !open.is_empty() {
            h2 { "Open break-glass changes (" (open.len()) ")" }
            table #break-glass {
                thead { tr {
                    th { "Cluster" } th { "Object" } th { "Changed by" } th { "Approved by" } th { "Ticket" }
                    th { "Since" } th { "Reverted at" }
                } }
                tbody {
                    @for change in open {
                        tr {
                            td { a href={ "/clusters/" (change.cluster) } { (change.cluster) } }
                            td { (change.object) } td { (change.by) } td { (change.approver) }
                            td { (change.ticket) }
                            td { (opt_time(Some(change.detected_at))) }
                            td { (opt_time(Some(change.until))) }
                        }
                    }
                }
            }
        }
    }
}

fn opt_time(t: Option<Timestamp>) -> String {
    t.map(|t| t.strftime("%Y-%m-%d %H:%M:%S").to_string())
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
    let main = html! {
        main {
            h2 style="font-size:20px" { (row.name) " " (state_cell(row)) }
            dl.facts { (cluster_facts(detail)) }
            (apps_table(detail.report.as_ref()))
            (problems_table(detail.report.as_ref()))
            (drift_table(&detail.drift))
            p.muted {
                "JSON: " a href={ "/api/v1/clusters/" (row.name) } { "/api/v1/clusters/" (row.name) }
            }
        }
    };
    page(&format!("{} · Windvane", row.name), now, main)
}

fn fact(name: &str, value: Markup) -> Markup {
    html! { dt { (name) } dd { (value) } }
}

/// The cluster's facts (`<dt>`/`<dd>` pairs): what the server stored, then what the agent last reported.
fn cluster_facts(detail: &ClusterDetail) -> Markup {
    let row = &detail.cluster;
    let interval = row
        .interval_seconds
        .map_or("–".to_owned(), |s| format!("{s}s"));
    html! {
        (fact("Fleet", html! { (row.fleet) }))
        (fact("Labels", labels(&row.labels)))
        (fact("Release (applied / latest)", release_cell(row)))
        (fact("Last heartbeat", html! { (age_cell(row)) " " span.muted { "at " (opt_time(row.last_seen)) } }))
        (fact("Interval / grace", html! { (interval) " / " (human_age(row.grace_seconds)) }))
        (fact("Sequence", html! { (row.sequence) }))
        (fact("Identity key", html! { span.mono { (row.keyid) } }))
        (fact("Enrolled", html! { (opt_time(Some(row.enrolled_at))) }))
        @if let Some(report) = &detail.report { (reported_facts(report)) }
        @if let Some(error) = &row.last_error {
            (fact("Last error", html! { span.err { (error) } }))
        }
    }
}

/// The facts only the agent's last report tells: its version, the bundle applied, a stale source, a rollout
/// waiting, the last release refused.
fn reported_facts(report: &Heartbeat) -> Markup {
    let source = &report.source;
    html! {
        (fact("Agent", html! { (report.agent_version) }))
        @if let Some(digest) = &source.applied_sha256 {
            (fact("Applied bundle", html! { span.mono { (digest) } }))
        }
        @if let Some(since) = source.stale_since {
            (fact("Source stale since", html! { span.warn { (opt_time(Some(since))) } }))
        }
        @if let Some(pending) = &source.pending {
            (fact("Rollout", html! {
                span.warn { "serial " (pending.serial) ": " (pending.message) }
                @if let Some(changes) = pending.changes { " — " (changes.describe()) }
                " " a href={ "/rollouts/" (source.channel) } { "rollout of " (source.channel) }
            }))
        }
        @if let Some(refusal) = &source.last_refusal {
            (fact("Last refused release", html! {
                span.err { (refusal.reason) ": " (refusal.message) }
                " " span.muted { "at " (opt_time(Some(refusal.at))) }
            }))
        }
    }
}

/// The apps the agent reported, with their states and object counts.
fn apps_table(report: Option<&Heartbeat>) -> Markup {
    let apps = report.map_or(&[][..], |r| &r.apps[..]);
    html! {
        h2 { "Apps" }
        @if apps.is_empty() {
            div.empty { "No apps reported." }
        } @else {
            table #apps {
                thead { tr { th { "App" } th { "State" } th { "Objects" } } }
                tbody {
                    @for app in apps {
                        tr {
                            td { (app.name) }
                            td { (badge(ClusterState::from_reported(app.state))) }
                            td.num { (app.objects) }
                        }
                    }
                }
            }
        }
    }
}

/// The objects the agent reported as not Synced, with why.
fn problems_table(report: Option<&Heartbeat>) -> Markup {
    let problems = report.map_or(&[][..], |r| &r.problems[..]);
    html! {
        h2 { "Problem objects" }
        @if problems.is_empty() {
            div.empty { "No problem objects." }
        } @else {
            table #problems {
                thead { tr { th { "App" } th { "Object" } th { "State" } th { "Message" } } }
                tbody {
                    @for p in problems {
                        tr {
                            td { (p.app) }
                            td.mono { (p.object) }
                            td { (badge(ClusterState::from_reported(p.state))) }
                            td.err { (p.message) }
                        }
                    }
                }
            }
        }
    }
}

/// The cluster's drift audit log: what changed, who changed it, what Windvane did and how fast.
fn drift_table(drift: &[DriftEntry]) -> Markup {
    html! {
        h2 { "Drift audit log" }
        @if drift.is_empty() {
            div.empty { "No drift recorded." }
        } @else {
            table #drift {
                thead { tr {
                    th { "Changed" } th { "Object" } th { "Fields" } th { "By" } th { "Action" }
                    th title="changed → detected" { "Detection" } th title="detected → reverted" { "Repair" }
                } }
                tbody { @for entry in drift { (drift_row(entry)) } }
            }
        }
    }
}

fn drift_row(entry: &DriftEntry) -> Markup {
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
    let critical = crate::notify::drift_severity(d) == crate::notify::Severity::Critical;
    html! {
        tr {
            td.num { (opt_time(d.changed_at.or(Some(d.detected_at)))) }
            td.mono { (object) @if critical { " " span class="badge s-Failed" { "critical" } } }
            td.mono { (fields) }
            td { (who) }
            td { (format!("{:?}", d.action)) }
            td.num { (latency(d.changed_at, Some(d.detected_at))) }
            td.num { (latency(Some(d.detected_at), d.reverted_at)) }
        }
    }
}

/// The rollout page of a channel (`/rollouts/{channel}`): each wave with when it opens, its counts, why it is
/// held, and its clusters.
pub fn rollout_page(view: &windvane_shared::decide::rollout::RolloutView) -> String {
    let status = if view.complete {
        "complete"
    } else if view.halted {
        "halted"
    } else {
        "in progress"
    };
    let main = html! {
        main {
            h2 { "Rollout of channel " (view.channel) " · serial " (view.serial) " · " (status) }
            p.meta { "issued " (view.issued_at) }
            @for wave in &view.waves {
                section {
                    h3 {
                        (wave.name) " — " (if wave.opened { "open" } else { "not open" }) ", opens "
                        (wave.opens_at)
                    }
                    p {
                        "done " (wave.done) " · pending " (wave.pending) " · failed " (wave.failed)
                        " · unknown " (wave.unknown)
                        @if let Some(held) = &wave.held { " · " strong.held { "held: " (held) } }
                    }
                    table {
                        tr { th { "cluster" } th { "state" } th { "serial" } th { "rollout" } th { "waiting for" } }
                        @for cluster in &wave.clusters {
                            tr {
                                td { a href={ "/clusters/" (cluster.name) } { (cluster.name) } }
                                td { (badge(cluster.state)) }
                                td { (serial(cluster.applied_serial)) }
                                td { (format!("{:?}", cluster.phase)) }
                                td { (cluster.waiting.as_deref().unwrap_or_default()) }
                            }
                        }
                    }
                }
            }
        }
    };
    page(
        &format!("Windvane · rollout of {}", view.channel),
        Timestamp::now(),
        main,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::ClusterSummary;
    use crate::fleet::status::Filter;
    use crate::fleet::view::fleet_view;
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

    /// Markup a cluster might write into any text it reports: a script, an element with a handler, and a
    /// quote that would end an attribute value.
    const HOSTILE: &str =
        "x\"><script>alert('x')</script><img src=x onerror=alert(1)>\" onmouseover=\"alert(2)";

    /// Everything a page shows that a cluster wrote, in one place: labels, error, channel, fleet, key id,
    /// agent version, bundle digest, rollout message, refusal, apps, problem objects, drift records and
    /// break-glass changes.
    fn hostile_cluster(now: Timestamp) -> (ClusterDetail, FleetView, Vec<OpenBreakGlass>) {
        use windvane_shared::wire::heartbeat::{
            AppReport, BreakGlassRecord, DriftAction, DriftRecord, ObjectReport, Refusal,
            SourceReport,
        };
        let h = || HOSTILE.to_owned();
        let summary = ClusterSummary {
            name: h(),
            fleet: h(),
            keyid: h(),
            labels: [(h(), h())].into(),
            enrolled_at: now,
            rekey_allowed_until: None,
            last_sequence: 1,
            last_seen: Some(now),
            interval_seconds: Some(30),
            state: Some(SyncState::Failed),
            channel: Some(h()),
            applied_serial: Some(1),
            last_error: Some(h()),
            drift_total: 1,
            public_key: String::new(),
        };
        let drift = DriftRecord {
            app: h(),
            group: h(),
            kind: h(),
            namespace: Some(h()),
            name: h(),
            fields: vec![h(), h()],
            deleted: false,
            manager: Some(h()),
            operation: Some(h()),
            changed_at: Some(now),
            detected_at: now,
            reverted_at: None,
            action: DriftAction::Held,
            break_glass: Some(BreakGlassRecord {
                by: h(),
                approver: h(),
                ticket: h(),
                until: now + jiff::SignedDuration::from_hours(1),
            }),
            revert_requested_by: None,
        };
        let pending: windvane_shared::wire::heartbeat::PendingReport = serde_json::from_value(
            serde_json::json!({"serial": 2, "wave": 1, "waves": 2, "halted": false, "message": HOSTILE}),
        )
        .expect("pending report");
        let report = Heartbeat {
            cluster: h(),
            fleet: h(),
            sequence: 1,
            sent_at: now,
            interval_seconds: 30,
            agent_version: h(),
            labels: [(h(), h())].into(),
            state: SyncState::Failed,
            source: SourceReport {
                channel: h(),
                applied_serial: Some(1),
                applied_sha256: Some(h()),
                stale_since: Some(now),
                last_refusal: Some(Refusal {
                    reason: h(),
                    message: h(),
                    at: now,
                }),
                pending: Some(pending),
            },
            counts: Default::default(),
            apps: vec![AppReport {
                name: h(),
                state: SyncState::Failed,
                objects: 1,
            }],
            problems: vec![ObjectReport {
                app: h(),
                object: h(),
                group: h(),
                kind: h(),
                state: SyncState::Failed,
                message: h(),
            }],
            drift: vec![drift.clone()],
            last_error: Some(h()),
        };
        let entry = DriftEntry {
            cluster: h(),
            sequence: 1,
            received_at: now,
            record: drift,
        };
        let open = crate::notify::break_glass::open(std::slice::from_ref(&entry), now);
        assert_eq!(
            open.len(),
            1,
            "the hostile drift is an open break-glass change"
        );
        let view = fleet_view(
            vec![summary.clone()],
            now,
            None,
            &Filter::default(),
            &|_| Some(2),
        );
        let detail = ClusterDetail {
            cluster: view.clusters[0].clone(),
            report: Some(report),
            drift: vec![entry],
        };
        (detail, view, open)
    }

    /// No text a cluster wrote becomes markup or leaves its attribute: each page carries it only escaped.
    fn assert_inert(html: &str, at_least: usize) {
        assert!(!html.contains("<script"), "a script element: {html}");
        assert!(!html.contains("<img"), "an img element: {html}");
        assert!(
            !html.contains("\" onmouseover=\""),
            "an attribute broken out of: {html}"
        );
        let escaped = html.matches("&lt;script&gt;alert(").count();
        assert!(
            escaped >= at_least,
            "{escaped} escaped copies, expected at least {at_least}: {html}"
        );
    }

    #[test]
    fn cluster_written_markup_is_escaped_in_every_field_each_page_shows() {
        let now: Timestamp = "2026-12-07T12:00:00Z".parse().expect("time");
        let (detail, view, open) = hostile_cluster(now);
        // Fleet: name (twice: link text and href), 2 label parts, channel (rollout link twice, row once),
        // last error, the selector echoed in the form, and the break-glass row's seven texts.
        assert_inert(&fleet_page(&view, HOSTILE, &[], &open), 8);
        // Cluster page: every fact, app, problem and drift cell listed in `hostile_cluster`.
        assert_inert(&cluster_page(&detail, now), 20);
        let rollout = windvane_shared::decide::rollout::RolloutView {
            channel: HOSTILE.to_owned(),
            serial: 2,
            issued_at: now,
            halted: false,
            complete: false,
            waves: vec![windvane_shared::decide::rollout::WaveView {
                index: 0,
                name: HOSTILE.to_owned(),
                opens_at: now,
                opened: true,
                held: Some(HOSTILE.to_owned()),
                soak_seconds: 0,
                gate: Default::default(),
                done: 0,
                pending: 1,
                failed: 0,
                unknown: 0,
                clusters: vec![windvane_shared::decide::rollout::WaveCluster {
                    name: HOSTILE.to_owned(),
                    state: ClusterState::Failed,
                    applied_serial: Some(1),
                    phase: windvane_shared::decide::rollout::RolloutPhase::Failed,
                    done: false,
                    waiting: Some(HOSTILE.to_owned()),
                }],
            }],
        };
        assert_inert(&rollout_page(&rollout), 5);
    }
}
