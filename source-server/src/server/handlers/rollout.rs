//! The rollout view of a channel: `GET /api/v1/rollouts/CHANNEL` (JSON, read by waiting agents' wave gates
//! and by `windvane rollout status`) and `GET /rollouts/CHANNEL` (the page). The release and its plan come
//! from the channel's pointer in the server's own store (read, not verified: the server is no authority on
//! releases, and an agent opens a wave only at its own signed time, whatever this says); the clusters and
//! their states from the database, as the fleet view computes them (Unknown when silent), with what each
//! waiting cluster's latest heartbeat says it waits for (`source.pending.message`). Built by
//! [`windvane_shared::decide::rollout::rollout_view`].
//!
//! Views are built at most once a second per channel and served as cached bytes with an ETag
//! ([`crate::server::rollout_cache`]); `If-None-Match` gets `304`. Agents ask for `?summary=1`: every
//! wave's counts and only its clusters not done (at most 20), O(waves) instead of O(fleet).
//!
//! Access: the read token when one is set — or the fleet registration token, which every agent holds; wrong
//! tokens count against the client's address ([`super::check_token`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use jiff::Timestamp;
use windvane_shared::decide::rollout::{ClusterFacts, RolloutView, rollout_view};
use windvane_shared::format::release::ReleasePointer;
use windvane_shared::spec::rollout::Rollout;

use crate::server::App;
use crate::server::db::Database;
use crate::server::view::ClusterRow;
use crate::server::{auth, page, route, view};

use super::{Body, JSON, TokenCheck, check_token, html, json_error};

/// Which representation a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Form {
    /// `GET /rollouts/CHANNEL`.
    Page,
    /// `GET /api/v1/rollouts/CHANNEL`: every cluster of every wave.
    Full,
    /// `GET /api/v1/rollouts/CHANNEL?summary=1`: what a wave gate needs
    /// ([`windvane_shared::decide::rollout::summary`]).
    Summary,
}

impl Form {
    /// The JSON form a query asks for.
    pub(super) fn of_query(query: Option<&str>) -> Form {
        let summary = query
            .unwrap_or_default()
            .split('&')
            .any(|pair| matches!(pair, "summary=1" | "summary=true" | "summary"));
        if summary { Form::Summary } else { Form::Full }
    }
}

pub(super) async fn handle(
    app: &Arc<App>,
    request: &Request<Incoming>,
    channel: &str,
    form: Form,
    client: IpAddr,
) -> Response<Body> {
    if let Some(denied) = check_access(app, request, client).await {
        return denied;
    }
    let Ok(file) = app.files.pointer(channel) else {
        return json_error(
            StatusCode::NOT_FOUND,
            "unknown_channel",
            &format!("channel {channel} has no release in the store"),
        );
    };
    let built = app
        .rollouts
        .get(channel, &file.etag, || async {
            app.metrics
                .rollout_view_builds
                .fetch_add(1, Ordering::Relaxed);
            let pointer = parse_pointer(channel, &file.body)
                .map_err(|detail| json_error(StatusCode::NOT_FOUND, "unknown_channel", &detail))?;
            build(app, channel, &pointer).await.map_err(|error| {
                tracing::error!(%error, "rollout view failed");
                json_error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    &error.to_string(),
                )
            })
        })
        .await;
    let built = match built {
        Ok(built) => built,
        Err(response) => return response,
    };
    let encoded = match form {
        Form::Page => return html(page::rollout_page(&built.view)),
        Form::Full => &built.full,
        Form::Summary => &built.summary,
    };
    let not_modified = request
        .headers()
        .get(header::IF_NONE_MATCH)
        .is_some_and(|v| route::if_none_match(v.as_bytes(), &[encoded.etag.as_bytes()]));
    let builder = Response::builder()
        .header(header::ETAG, encoded.etag.clone())
        .header(header::CACHE_CONTROL, "no-cache");
    let answered = if not_modified {
        &app.metrics.rollout_view_not_modified
    } else {
        &app.metrics.rollout_view_sent
    };
    answered.fetch_add(1, Ordering::Relaxed);
    let response = if not_modified {
        builder
            .status(StatusCode::NOT_MODIFIED)
            .body(Body::default())
    } else {
        builder
            .header(header::CONTENT_TYPE, JSON.clone())
            .body(Body::new(encoded.body.clone()))
    };
    response.unwrap_or_default()
}

/// `None` when the request may read the view (no read token is set, or it offers the read token or the
/// registration token), else the answer; wrong tokens count against the address like any other.
async fn check_access(
    app: &App,
    request: &Request<Incoming>,
    client: IpAddr,
) -> Option<Response<Body>> {
    let read_token = app.read_token.as_ref()?;
    let offered = auth::credential(
        request
            .headers()
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes),
    );
    let right = |t: &str| read_token.verify(t) || app.registration_token.verify(t);
    match check_token(app, client, offered, right, "read or registration token").await {
        TokenCheck::Passed => None,
        TokenCheck::Refused(response) => Some(response),
        TokenCheck::Missing => Some(json_error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the read token or the registration token is required (Authorization: Bearer …)",
        )),
    }
}

/// The channel's pointer payload as the store holds it.
fn current_pointer(app: &App, channel: &str) -> Result<ReleasePointer, String> {
    let file = app
        .files
        .pointer(channel)
        .map_err(|_| format!("channel {channel} has no release in the store"))?;
    parse_pointer(channel, &file.body)
}

/// A pointer file's payload, read without verification (the server is no authority on releases).
fn parse_pointer(channel: &str, body: &[u8]) -> Result<ReleasePointer, String> {
    let envelope = windvane_shared::crypto::dsse::Envelope::from_json_slice(body)
        .map_err(|e| format!("channel {channel}: {e}"))?;
    let payload = envelope
        .payload_bytes()
        .map_err(|e| format!("channel {channel}: {e}"))?;
    serde_json::from_slice(&payload).map_err(|e| format!("channel {channel}: {e}"))
}

async fn build(app: &App, channel: &str, pointer: &ReleasePointer) -> crate::Result<RolloutView> {
    let now = Timestamp::now();
    let rows: Vec<ClusterRow> = app
        .db
        .list_clusters()
        .await?
        .into_iter()
        .map(|c| view::cluster_row(c, now, app.unknown_after, &|_| None))
        .collect();
    let waiting: HashMap<String, String> = app
        .db
        .waiting_reports()
        .await?
        .into_iter()
        .filter_map(|(name, payload)| Some((name, waiting_message(&payload, pointer.serial)?)))
        .collect();
    Ok(view_of(channel, pointer, &rows, &waiting, now))
}

/// Most characters of an agent's wait message shown in a rollout view (it comes from outside).
const MAX_WAITING_CHARS: usize = 300;

/// What a cluster's latest report says it waits for, when it holds release `serial` for later
/// (`source.pending.message`: `Pending (wave 2, opens in 14m)`, `Awaiting approval (0 of 1)`, `Pending
/// (maintenance window): …`); cut to [`MAX_WAITING_CHARS`]. Pure.
fn waiting_message(payload: &str, serial: u64) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Report {
        source: Source,
    }
    #[derive(serde::Deserialize)]
    struct Source {
        pending: Option<Pending>,
    }
    #[derive(serde::Deserialize)]
    struct Pending {
        serial: u64,
        message: String,
    }
    let pending = serde_json::from_str::<Report>(payload)
        .ok()?
        .source
        .pending?;
    (pending.serial == serial).then(|| pending.message.chars().take(MAX_WAITING_CHARS).collect())
}

/// The rollout view of `pointer` over the clusters of its fleet that follow `channel` (or have never said
/// which channel they follow: a silent cluster must hold a gate, not vanish from it).
fn view_of(
    channel: &str,
    pointer: &ReleasePointer,
    rows: &[ClusterRow],
    waiting: &HashMap<String, String>,
    now: Timestamp,
) -> RolloutView {
    let facts: Vec<ClusterFacts> = rows
        .iter()
        .filter(|r| r.fleet == pointer.fleet && r.channel.as_deref().is_none_or(|ch| ch == channel))
        .map(|row| ClusterFacts {
            name: &row.name,
            labels: &row.labels,
            state: row.state,
            applied_serial: row.applied_serial,
            waiting: waiting.get(&row.name).cloned(),
        })
        .collect();
    let single = Rollout::default();
    let rollout = pointer.rollout.as_ref().unwrap_or(&single);
    rollout_view(
        channel,
        pointer.serial,
        pointer.issued_at,
        rollout,
        &facts,
        now,
    )
}

/// The rollout metrics of every channel the fleet's clusters follow, in Prometheus text:
/// `windvane_rollout_clusters{channel,wave,phase}`, `windvane_rollout_serial{channel}`,
/// `windvane_rollout_complete{channel}` and `windvane_rollout_halted{channel}`.
pub(super) fn metrics(app: &App, rows: &[ClusterRow], now: Timestamp) -> String {
    let channels: std::collections::BTreeSet<&str> =
        rows.iter().filter_map(|r| r.channel.as_deref()).collect();
    let views: Vec<RolloutView> = channels
        .into_iter()
        .filter(|ch| windvane_store::check_channel_name(ch).is_ok())
        .filter_map(|ch| {
            current_pointer(app, ch)
                .ok()
                .map(|p| view_of(ch, &p, rows, &HashMap::new(), now))
        })
        .collect();
    render_metrics(&views)
}

/// Prometheus text for rollout views. Pure.
fn render_metrics(views: &[RolloutView]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    out.push_str("# HELP windvane_rollout_clusters Clusters of each rollout wave of a channel's current release, by phase.\n# TYPE windvane_rollout_clusters gauge\n");
    for view in views {
        for wave in &view.waves {
            for (phase, count) in [
                ("done", wave.done),
                ("pending", wave.pending),
                ("failed", wave.failed),
                ("unknown", wave.unknown),
            ] {
                let _ = writeln!(
                    out,
                    "windvane_rollout_clusters{{channel=\"{}\",wave=\"{}\",phase=\"{phase}\"}} {count}",
                    view.channel,
                    wave.index + 1
                );
            }
        }
    }
    for (name, help) in [
        (
            "windvane_rollout_serial",
            "Serial of the channel's current release.",
        ),
        (
            "windvane_rollout_complete",
            "1 when every cluster of the channel has its current release, Synced.",
        ),
        (
            "windvane_rollout_halted",
            "1 while the publisher has halted the current release's rollout.",
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for view in views {
            let value = match name {
                "windvane_rollout_serial" => view.serial,
                "windvane_rollout_complete" => u64::from(view.complete),
                _ => u64::from(view.halted),
            };
            let _ = writeln!(out, "{name}{{channel=\"{}\"}} {value}", view.channel);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use windvane_shared::wire::fleet_api::ClusterState;

    fn row(name: &str, state: ClusterState, serial: u64, channel: Option<&str>) -> ClusterRow {
        serde_json::from_value(serde_json::json!({
            "name": name, "fleet": "acme", "labels": BTreeMap::<String, String>::new(),
            "state": state, "graceSeconds": 90, "appliedSerial": serial,
            "channel": channel, "driftTotal": 0, "enrolledAt": "2026-12-04T10:00:00Z",
            "keyid": "k", "sequence": 1
        }))
        .expect("row")
    }

    #[test]
    fn a_waiting_cluster_shows_what_its_report_says_for_this_serial_only() {
        let report = |serial: u64, message: &str| {
            serde_json::json!({"cluster": "b", "source": {"channel": "prod", "pending": {
                "serial": serial, "wave": 2, "waves": 3, "halted": false, "message": message}}})
            .to_string()
        };
        assert_eq!(
            waiting_message(&report(4, "Pending (wave 2, opens in 14m)"), 4).as_deref(),
            Some("Pending (wave 2, opens in 14m)")
        );
        assert_eq!(
            waiting_message(&report(3, "Awaiting approval (0 of 1)"), 4),
            None
        );
        assert_eq!(
            waiting_message(r#"{"source": {"channel": "prod"}}"#, 4),
            None
        );
        assert_eq!(waiting_message("not json", 4), None);
        let long = waiting_message(&report(4, &"x".repeat(5000)), 4).expect("cut");
        assert_eq!(long.chars().count(), MAX_WAITING_CHARS);

        let pointer: ReleasePointer = serde_json::from_value(serde_json::json!({
            "fleet": "acme", "channel": "prod", "serial": 4,
            "issuedAt": "2026-12-04T10:00:00Z", "expiresAt": "2026-12-05T10:00:00Z",
            "bundle": {"sha256": "0".repeat(64), "size": 1}, "allowEmpty": false
        }))
        .expect("pointer");
        let rows = [
            row("a", ClusterState::Synced, 4, Some("prod")),
            row("b", ClusterState::Synced, 3, Some("prod")),
        ];
        let waiting = HashMap::from([("b".to_owned(), "Awaiting approval (0 of 1)".to_owned())]);
        let view = view_of(
            "prod",
            &pointer,
            &rows,
            &waiting,
            "2026-12-04T10:01:00Z".parse().expect("time"),
        );
        let shown: Vec<Option<&str>> = view.waves[0]
            .clusters
            .iter()
            .map(|c| c.waiting.as_deref())
            .collect();
        assert_eq!(shown, [None, Some("Awaiting approval (0 of 1)")]);
    }

    #[test]
    fn the_view_takes_the_channels_clusters_and_the_silent_ones_and_renders_metrics() {
        let pointer: ReleasePointer = serde_json::from_value(serde_json::json!({
            "fleet": "acme", "channel": "prod", "serial": 4,
            "issuedAt": "2026-12-04T10:00:00Z", "expiresAt": "2026-12-05T10:00:00Z",
            "bundle": {"sha256": "0".repeat(64), "size": 1}, "allowEmpty": false
        }))
        .expect("pointer");
        let rows = [
            row("a", ClusterState::Synced, 4, Some("prod")),
            row("b", ClusterState::Synced, 3, Some("prod")),
            row("c", ClusterState::Synced, 9, Some("staging")),
            row("d", ClusterState::NeverSeen, 0, None),
        ];
        let now = "2026-12-04T10:01:00Z".parse().expect("time");
        let view = view_of("prod", &pointer, &rows, &HashMap::new(), now);
        assert_eq!(view.waves.len(), 1);
        let names: Vec<&str> = view.waves[0]
            .clusters
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, ["a", "b", "d"]);
        assert_eq!(
            (
                view.waves[0].done,
                view.waves[0].pending,
                view.waves[0].unknown
            ),
            (1, 1, 1)
        );
        let text = render_metrics(&[view]);
        assert!(
            text.contains(
                "windvane_rollout_clusters{channel=\"prod\",wave=\"1\",phase=\"done\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("windvane_rollout_complete{channel=\"prod\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("windvane_rollout_serial{channel=\"prod\"} 4"),
            "{text}"
        );
    }
}
