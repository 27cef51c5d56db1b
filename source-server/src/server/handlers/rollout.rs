//! The rollout view of a channel: `GET /api/v1/rollouts/CHANNEL` (JSON, read by waiting agents' wave gates
//! and by `windvane rollout status`) and `GET /rollouts/CHANNEL` (the page). The release and its plan come
//! from the channel's pointer in the server's own store (read, not verified: the server is no authority on
//! releases, and an agent opens a wave only at its own signed time, whatever this says); the clusters and
//! their states from the database, as the fleet view computes them (Unknown when silent). Built by
//! [`windvane_shared::rollout::rollout_view`].
//!
//! Access: the read token when one is set — or the fleet registration token, which every agent holds.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use jiff::Timestamp;
use windvane_shared::release::ReleasePointer;
use windvane_shared::rollout::{ClusterFacts, Rollout, RolloutView, rollout_view};

use crate::server::App;
use crate::server::db::Database;
use crate::server::{auth, page, view};

use super::{Body, html, json, json_error};

pub(super) async fn handle(
    app: &Arc<App>,
    request: &Request<Incoming>,
    channel: &str,
    is_page: bool,
) -> Response<Body> {
    if !allowed(app, request) {
        return json_error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the read token or the registration token is required (Authorization: Bearer …)",
        );
    }
    let pointer = match current_pointer(app, channel) {
        Ok(pointer) => pointer,
        Err(detail) => return json_error(StatusCode::NOT_FOUND, "unknown_channel", &detail),
    };
    match build(app, channel, &pointer).await {
        Ok(view) if is_page => html(page::rollout_page(&view)),
        Ok(view) => json(StatusCode::OK, &view),
        Err(error) => {
            tracing::error!(%error, "rollout view failed");
            json_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                &error.to_string(),
            )
        }
    }
}

fn allowed(app: &App, request: &Request<Incoming>) -> bool {
    let Some(read_token) = app.read_token.as_ref() else {
        return true;
    };
    let offered = auth::credential(
        request
            .headers()
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes),
    );
    offered.is_some_and(|t| read_token.verify(&t) || app.registration_token.verify(&t))
}

/// The channel's pointer payload as the store holds it.
fn current_pointer(app: &App, channel: &str) -> Result<ReleasePointer, String> {
    let file = app
        .files
        .pointer(channel)
        .map_err(|_| format!("channel {channel} has no release in the store"))?;
    let envelope = windvane_shared::dsse::Envelope::from_json_slice(&file.body)
        .map_err(|e| format!("channel {channel}: {e}"))?;
    let payload = envelope
        .payload_bytes()
        .map_err(|e| format!("channel {channel}: {e}"))?;
    serde_json::from_slice(&payload).map_err(|e| format!("channel {channel}: {e}"))
}

async fn build(app: &App, channel: &str, pointer: &ReleasePointer) -> crate::Result<RolloutView> {
    let now = Timestamp::now();
    let clusters = app.db.list_clusters().await?;
    let rows: Vec<_> = clusters
        .into_iter()
        .filter(|c| c.fleet == pointer.fleet && c.channel.as_deref().is_none_or(|ch| ch == channel))
        .map(|c| view::cluster_row(c, now, app.unknown_after, &|_| None))
        .collect();
    let facts: Vec<ClusterFacts> = rows
        .iter()
        .map(|row| ClusterFacts {
            name: &row.name,
            labels: &row.labels,
            state: row.state,
            applied_serial: row.applied_serial,
            waiting: None,
        })
        .collect();
    let single = Rollout::default();
    let rollout = pointer.rollout.as_ref().unwrap_or(&single);
    Ok(rollout_view(
        channel,
        pointer.serial,
        pointer.issued_at,
        rollout,
        &facts,
        now,
    ))
}
