//! Heartbeats: a bounded body, the key bound to the cluster it names (cached, looked up in the database on a
//! miss), then the ingest queue, whose batch commit answers; refusals carry the reason the agent acts on.

use std::sync::Arc;
use std::time::Instant;

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use jiff::Timestamp;
use tokio::sync::oneshot;
use windvane_shared::wire::heartbeat::{HeartbeatReply, MAX_HEARTBEAT_BYTES};

use crate::db::{Database, IngestOutcome};
use crate::fleet::metrics::HeartbeatResult;
use crate::http::App;
use crate::ingest::{self, ClusterKey, IngestJob, Refusal};

use crate::http::handlers::{Body, json, read_body, refusal_response};

pub(crate) async fn handle(
    app: &Arc<App>,
    request: Request<Incoming>,
    cluster: &str,
) -> Response<Body> {
    let started = Instant::now();
    let result = heartbeat_inner(app, request, cluster).await;
    let metric = match &result {
        Ok(_) => HeartbeatResult::Accepted,
        Err(refusal) => refusal.metric(),
    };
    app.metrics.heartbeat(metric);
    match result {
        Ok(reply) => {
            tracing::debug!(
                cluster,
                sequence = reply.acknowledged_sequence,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "heartbeat stored"
            );
            json(StatusCode::OK, &reply)
        }
        Err(refusal) => {
            if !matches!(refusal, Refusal::Overloaded { .. }) {
                tracing::info!(
                    cluster,
                    reason = refusal.reason(),
                    "heartbeat refused: {}",
                    refusal.message()
                );
            }
            refusal_response(&refusal)
        }
    }
}

async fn heartbeat_inner(
    app: &Arc<App>,
    request: Request<Incoming>,
    cluster: &str,
) -> Result<HeartbeatReply, Refusal> {
    // A full queue means storage is behind: shed before reading or verifying anything, so that a refusal
    // costs next to nothing and the heartbeats already accepted are not slowed down by ones that would be
    // refused after their signature check anyway.
    if app.ingest.capacity() == 0 {
        return Err(Refusal::Overloaded { retry_after: 5 });
    }
    let body = read_body(request, MAX_HEARTBEAT_BYTES).await?;
    // Bound the heartbeats being checked: beyond that the CPU is behind, and a heartbeat let in would only
    // wait longer (and make every other one wait); answer 429 at once instead, which costs little.
    let Ok(checking) = app.checking.try_acquire() else {
        return Err(Refusal::Overloaded { retry_after: 5 });
    };
    let now = Timestamp::now();
    let key = cluster_key(app, cluster, false).await?;
    let mut signed = ingest::open_heartbeat(&body, &key)?;
    let mut outcomes = Vec::with_capacity(1);
    for check in signed.take_checks() {
        outcomes.push(app.verifier.verify(check).await);
    }
    let mut outcomes = outcomes.into_iter();
    let checked = ingest::finish_heartbeat(
        cluster,
        signed,
        |candidate, _| candidate.signature.is_some() && outcomes.next() == Some(true),
        &key,
        now,
        app.max_clock_skew,
    );
    let verified = match checked {
        Err(refusal @ Refusal::BadSignature(_)) => {
            // The cached key may be stale (rekeyed through another replica): check once against the database.
            let fresh = cluster_key(app, cluster, true).await?;
            if fresh.keyid == key.keyid {
                return Err(refusal);
            }
            ingest::check_heartbeat(cluster, &body, &fresh, now, app.max_clock_skew)?
        }
        other => other?,
    };
    drop(checking);
    let sequence = verified.heartbeat.sequence;
    let agent_interval = verified.heartbeat.interval_seconds;
    let (reply_tx, reply_rx) = oneshot::channel();
    let job = IngestJob {
        heartbeat: verified,
        reply: reply_tx,
    };
    app.ingest.try_send(job).map_err(|e| match e {
        tokio::sync::mpsc::error::TrySendError::Full(_) => Refusal::Overloaded { retry_after: 5 },
        tokio::sync::mpsc::error::TrySendError::Closed(_) => {
            Refusal::Unavailable("shutting down".into())
        }
    })?;
    let queued = app.ingest_capacity - app.ingest.capacity();
    match reply_rx.await {
        Ok(Ok(IngestOutcome::Accepted { .. })) => Ok(HeartbeatReply {
            acknowledged_sequence: sequence,
            next_interval_seconds: ingest::next_interval(
                agent_interval,
                queued,
                app.ingest_capacity,
            ),
        }),
        Ok(Ok(IngestOutcome::Replay { last })) => Err(Refusal::Replay { sequence, last }),
        Ok(Ok(IngestOutcome::UnknownCluster)) => {
            forget_key(app, cluster);
            Err(Refusal::UnknownCluster(cluster.to_owned()))
        }
        Ok(Ok(IngestOutcome::KeyChanged)) => {
            forget_key(app, cluster);
            Err(Refusal::BadSignature(format!(
                "cluster {cluster} was re-keyed or forgotten; enrol again"
            )))
        }
        Ok(Err(error)) => Err(Refusal::Unavailable(error.to_string())),
        Err(_) => Err(Refusal::Unavailable("the ingest task stopped".into())),
    }
}

async fn cluster_key(
    app: &Arc<App>,
    cluster: &str,
    refresh: bool,
) -> Result<Arc<ClusterKey>, Refusal> {
    if !refresh
        && let Some(key) = app
            .keys
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(cluster)
    {
        return Ok(Arc::clone(key));
    }
    let stored = app
        .db
        .cluster_key(cluster)
        .await
        .map_err(|e| Refusal::Unavailable(e.to_string()))?;
    let Some((fleet, _keyid, pem)) = stored else {
        forget_key(app, cluster);
        return Err(Refusal::UnknownCluster(cluster.to_owned()));
    };
    let key = Arc::new(
        ClusterKey::from_stored(cluster, fleet, &pem).ok_or_else(|| {
            Refusal::Unavailable(format!("stored key of cluster {cluster} is unreadable"))
        })?,
    );
    app.keys
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .insert(cluster.to_owned(), Arc::clone(&key));
    Ok(key)
}

pub(crate) fn forget_key(app: &App, cluster: &str) {
    app.keys
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .remove(cluster);
}
