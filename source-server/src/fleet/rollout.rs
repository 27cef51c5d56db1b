//! The rollout view of a channel: `GET /api/v1/rollouts/CHANNEL` (JSON, read by waiting agents' wave gates
//! and by `windvane rollout status`) and `GET /rollouts/CHANNEL` (the page). The release and its plan come
//! from the channel's pointer in the server's own store (read, not verified: the server is no authority on
//! releases, and an agent opens a wave only at its own signed time, whatever this says); the clusters and
//! their states from the database, as the fleet view computes them (Unknown when silent), with what each
//! waiting cluster's latest heartbeat says it waits for (`source.pending.message`). Built by
//! [`windvane_shared::decide::rollout::rollout_view`].
//!
//! Views are built at most once a second per channel and served as cached bytes with an ETag
//! ([`crate::serve::rollout_cache`]); `If-None-Match` gets `304`. Agents ask for `?summary=1`: every
//! wave's counts and only its clusters not done (at most 20), O(waves) instead of O(fleet).
//!
//! Access: the read token when one is set — or the fleet registration token, which every agent holds; wrong
//! tokens count against the client's address ([`crate::http::handlers::check_token`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use jiff::Timestamp;
use windvane_shared::decide::rollout::{ClusterFacts, RolloutView, rollout_view};
use windvane_shared::format::release::ReleasePointer;
use windvane_shared::spec::rollout::Rollout;

use crate::db::Database;
use crate::fleet::view::ClusterRow;
use crate::fleet::{page, view};
use crate::http::App;
use crate::http::{auth, route};

use crate::http::handlers::{Body, JSON, TokenCheck, check_token, html, json_error};

/// Which representation a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
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
    pub(crate) fn of_query(query: Option<&str>) -> Form {
        let summary = query
            .unwrap_or_default()
            .split('&')
            .any(|pair| matches!(pair, "summary=1" | "summary=true" | "summary"));
        if summary { Form::Summary } else { Form::Full }
    }
}

pub(crate) async fn handle(
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
            app.metrics.rollout_view_builds.inc();
            let pointer = parse_pointer(channel, &file.body).map_err(|detail| {
                json_error(
                    StatusCode::NOT_FOUND,
                    "unknown_channel",
                    &detail.to_string(),
                )
            })?;
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
    app.metrics.rollout_view_read(not_modified);
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
fn current_pointer(app: &App, channel: &str) -> crate::Result<ReleasePointer> {
    let file = app
        .files
        .pointer(channel)
        .map_err(|_| crate::Error::NoRelease {
            channel: channel.to_owned(),
        })?;
    parse_pointer(channel, &file.body)
}

/// A pointer file's payload, read without verification (the server is no authority on releases).
fn parse_pointer(channel: &str, body: &[u8]) -> crate::Result<ReleasePointer> {
    let envelope_error = |source| crate::Error::PointerEnvelope {
        channel: channel.to_owned(),
        source,
    };
    let envelope =
        windvane_shared::crypto::dsse::Envelope::from_json_slice(body).map_err(envelope_error)?;
    let payload = envelope.payload_bytes().map_err(envelope_error)?;
    serde_json::from_slice(&payload).map_err(|source| crate::Error::PointerPayload {
        channel: channel.to_owned(),
        source,
    })
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
pub(crate) fn metrics(app: &App, rows: &[ClusterRow], now: Timestamp) -> String {
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

/// Prometheus text for rollout views, through a registry built for one scrape. Pure.
fn render_metrics(views: &[RolloutView]) -> String {
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    type ByChannel = Family<[(&'static str, String); 1], Gauge>;
    let mut registry = prometheus_client::registry::Registry::default();
    let clusters = Family::<[(&'static str, String); 3], Gauge>::default();
    let (serial, complete, halted) = (
        ByChannel::default(),
        ByChannel::default(),
        ByChannel::default(),
    );
    let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    for view in views {
        for wave in &view.waves {
            for (phase, count) in [
                ("done", wave.done),
                ("pending", wave.pending),
                ("failed", wave.failed),
                ("unknown", wave.unknown),
            ] {
                let labels = [
                    ("channel", view.channel.clone()),
                    ("wave", (wave.index + 1).to_string()),
                    ("phase", phase.to_owned()),
                ];
                clusters.get_or_create(&labels).set(gauge(count));
            }
        }
        let channel = [("channel", view.channel.clone())];
        serial.get_or_create(&channel).set(gauge(view.serial));
        complete
            .get_or_create(&channel)
            .set(i64::from(view.complete));
        halted.get_or_create(&channel).set(i64::from(view.halted));
    }
    registry.register(
        "windvane_rollout_clusters",
        "Clusters of each rollout wave of a channel's current release, by phase",
        windvane_metrics::AlwaysDescribed(clusters),
    );
    registry.register(
        "windvane_rollout_serial",
        "Serial of the channel's current release",
        windvane_metrics::AlwaysDescribed(serial),
    );
    registry.register(
        "windvane_rollout_complete",
        "1 when every cluster of the channel has its current release, Synced",
        windvane_metrics::AlwaysDescribed(complete),
    );
    registry.register(
        "windvane_rollout_halted",
        "1 while the publisher has halted the current release's rollout",
        windvane_metrics::AlwaysDescribed(halted),
    );
    windvane_metrics::encode(&registry)
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

    #[test]
    fn rollout_families_are_described_before_any_channel_has_a_release() {
        let text = render_metrics(&[]);
        for name in [
            "windvane_rollout_clusters",
            "windvane_rollout_serial",
            "windvane_rollout_complete",
            "windvane_rollout_halted",
        ] {
            assert!(text.contains(&format!("# TYPE {name} gauge\n")), "{text}");
        }
    }
}
