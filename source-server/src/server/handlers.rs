//! Request handlers: turn a routed request into a response, reading the store through the file cache,
//! the database through [`Database`], and handing heartbeats to the ingest queue. Decisions live in the pure
//! modules ([`route`], [`ingest`], [`status`], [`view`], [`page`]); this module does the I/O around them and
//! picks status codes. Errors are JSON `{"error": message, "reason": code}`; secrets never reach a log.
//!
//! Who may do what: enrolment takes the registration token and binds a name not bound yet (or re-binds one an
//! admin allowed to rekey); a heartbeat is accepted only signed by the key bound to the cluster it names (an
//! unknown name is 404 `unknown_cluster`, another key 401 `bad_signature`: the agent enrols again on either);
//! rekey and forget take the admin token (`--admin-token-file`; 403 `admin_disabled` without one).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use jiff::Timestamp;
use serde::Serialize;
use tokio::sync::oneshot;
use windvane_shared::heartbeat::{EnrollReply, EnrollRequest, HeartbeatReply, MAX_HEARTBEAT_BYTES};

use super::App;
use super::db::{Database, EnrollOutcome, Enrollment, IngestOutcome};
use super::files::{CachedFile, FileError, FileKind};
use super::ingest::{self, ClusterKey, IngestJob, Refusal};
use super::metrics::{self, FleetGauges, HeartbeatResult};
use super::route::{self, Route};
use super::status::Filter;
use super::view::{self, ClusterDetail};
use super::{auth, page};

type Body = Full<Bytes>;

/// Largest enrolment or admin request body.
const MAX_SMALL_BODY: u64 = 64 * 1024;
/// Longest time a client may take to send a request body, once its headers are in (hyper bounds the headers
/// to 30 s), so that a trickled body cannot hold a connection open.
const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Most drift entries one page or API call returns.
const DRIFT_LIMIT: u32 = 500;

static CACHE_POINTER: HeaderValue = HeaderValue::from_static("no-cache");
static CACHE_BUNDLE: HeaderValue = HeaderValue::from_static("public, max-age=31536000, immutable");
static JSON: HeaderValue = HeaderValue::from_static("application/json");
static GZIP: HeaderValue = HeaderValue::from_static("gzip");
static VARY: HeaderValue = HeaderValue::from_static("Accept-Encoding");
static NOSNIFF: HeaderValue = HeaderValue::from_static("nosniff");

pub(super) async fn handle(
    app: &Arc<App>,
    request: Request<Incoming>,
    peer: SocketAddr,
) -> Response<Body> {
    let route = route::route(request.method(), request.uri().path());
    match route {
        Route::Pointer(channel) => store_file(&request, app.files.pointer(&channel)),
        Route::Bundle(digest) => store_file(&request, app.files.bundle(&digest)),
        Route::Livez => text(StatusCode::OK, "ok\n"),
        Route::Readyz => readyz(app).await,
        Route::Heartbeat(cluster) => heartbeat(app, request, &cluster).await,
        Route::Enroll(cluster) => enroll(app, request, &cluster, peer).await,
        Route::Rekey(cluster) => admin(app, request, &cluster, peer, true).await,
        Route::Forget(cluster) => admin(app, request, &cluster, peer, false).await,
        Route::FleetPage
        | Route::ClusterPage(_)
        | Route::ApiFleet
        | Route::ApiClusters
        | Route::ApiCluster(_)
        | Route::ApiDrift
        | Route::Metrics => {
            if let Some(denied) = check_read_token(app, &request) {
                return denied;
            }
            match read_route(app, &request, route).await {
                Ok(response) => response,
                Err(error) => {
                    tracing::error!(%error, "read request failed");
                    json_error(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "unavailable",
                        &error.to_string(),
                    )
                }
            }
        }
        Route::MethodNotAllowed(allow) => {
            let mut response = json_error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "method not allowed here",
            );
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allow));
            response
        }
        Route::BadPath => json_error(
            StatusCode::BAD_REQUEST,
            "bad_path",
            "malformed or disallowed path",
        ),
        Route::NotFound => json_error(StatusCode::NOT_FOUND, "not_found", "not found"),
    }
}

// ---- static store ----

fn store_file(
    request: &Request<Incoming>,
    file: Result<Arc<CachedFile>, FileError>,
) -> Response<Body> {
    let file = match file {
        Ok(file) => file,
        Err(FileError::NotFound) => {
            return json_error(StatusCode::NOT_FOUND, "not_found", "not found");
        }
        Err(FileError::TooLarge) => {
            return json_error(
                StatusCode::FORBIDDEN,
                "too_large",
                "file exceeds the size cap",
            );
        }
        Err(FileError::DigestMismatch) => {
            return json_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "digest_mismatch",
                "bundle content does not match its name",
            );
        }
        Err(FileError::Io(detail)) => {
            tracing::error!(%detail, "reading a store file failed");
            return json_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "io",
                "cannot read the file",
            );
        }
    };
    let headers = request.headers();
    let gzip = headers
        .get(header::ACCEPT_ENCODING)
        .is_some_and(|v| route::accepts_gzip(v.as_bytes()))
        .then(|| file.gzip())
        .flatten();
    let etag = if gzip.is_some() {
        &file.gzip_etag
    } else {
        &file.etag
    };
    let cache_control = match file.kind {
        FileKind::Pointer => &CACHE_POINTER,
        FileKind::Bundle => &CACHE_BUNDLE,
    };
    let not_modified = headers.get(header::IF_NONE_MATCH).is_some_and(|v| {
        route::if_none_match(
            v.as_bytes(),
            &[file.etag.as_bytes(), file.gzip_etag.as_bytes()],
        )
    });
    let mut builder = Response::builder()
        .header(header::ETAG, etag.clone())
        .header(header::CACHE_CONTROL, cache_control.clone())
        .header(header::VARY, VARY.clone());
    if not_modified {
        return builder
            .status(StatusCode::NOT_MODIFIED)
            .body(Body::default())
            .unwrap_or_default();
    }
    builder = builder
        .header(header::CONTENT_TYPE, JSON.clone())
        .header(header::X_CONTENT_TYPE_OPTIONS, NOSNIFF.clone());
    let body = match gzip {
        Some(gz) => {
            builder = builder.header(header::CONTENT_ENCODING, GZIP.clone());
            gz.clone()
        }
        None => file.body.clone(),
    };
    if request.method() == Method::HEAD {
        return builder
            .header(header::CONTENT_LENGTH, body.len())
            .body(Body::default())
            .unwrap_or_default();
    }
    builder.body(Body::new(body)).unwrap_or_default()
}

// ---- heartbeats ----

async fn heartbeat(app: &Arc<App>, request: Request<Incoming>, cluster: &str) -> Response<Body> {
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
        Ok(Err(detail)) => Err(Refusal::Unavailable(detail)),
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

fn forget_key(app: &App, cluster: &str) {
    app.keys
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .remove(cluster);
}

/// Reads a body of at most `limit` bytes within [`BODY_TIMEOUT`]: refused from `Content-Length` before reading,
/// or as soon as more arrives than the limit.
async fn read_body(request: Request<Incoming>, limit: u64) -> Result<Bytes, Refusal> {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(Refusal::TooLarge { limit });
    }
    let limited = Limited::new(
        request.into_body(),
        usize::try_from(limit).unwrap_or(usize::MAX),
    );
    let Ok(collected) = tokio::time::timeout(BODY_TIMEOUT, limited.collect()).await else {
        return Err(Refusal::BodyTimeout {
            seconds: BODY_TIMEOUT.as_secs(),
        });
    };
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            Err(Refusal::TooLarge { limit })
        }
        Err(error) => Err(Refusal::Malformed(format!("reading the body: {error}"))),
    }
}

// ---- enrolment and admin ----

fn rate_limited(app: &App, peer: SocketAddr) -> Option<Response<Body>> {
    let retry = app
        .limiter
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .check(peer.ip(), Instant::now())?;
    let mut response = json_error(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limited",
        "too many failed attempts from this address",
    );
    response.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from(retry.as_secs().max(1)),
    );
    Some(response)
}

/// Counts a wrong `token` (`"registration token"` or `"admin token"`) against the address and answers 401.
fn token_failed(app: &App, peer: SocketAddr, token: &str) -> Response<Body> {
    app.limiter
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .fail(peer.ip(), Instant::now());
    tracing::warn!(%peer, "wrong {token}");
    json_error(
        StatusCode::UNAUTHORIZED,
        "bad_token",
        &format!("wrong or missing {token}"),
    )
}

async fn enroll(
    app: &Arc<App>,
    request: Request<Incoming>,
    cluster: &str,
    peer: SocketAddr,
) -> Response<Body> {
    if let Some(limited) = rate_limited(app, peer) {
        return limited;
    }
    let body = match read_body(request, MAX_SMALL_BODY).await {
        Ok(body) => body,
        Err(refusal) => return refusal_response(&refusal),
    };
    let enroll: EnrollRequest = match serde_json::from_slice(&body) {
        Ok(enroll) => enroll,
        Err(e) => return refusal_response(&Refusal::Malformed(format!("enrolment body: {e}"))),
    };
    if !app.registration_token.verify(&enroll.token) {
        app.metrics
            .enrollments_refused
            .fetch_add(1, Ordering::Relaxed);
        return token_failed(app, peer, "registration token");
    }
    let checked = match ingest::check_enroll(cluster, &enroll) {
        Ok(checked) => checked,
        Err(refusal) => return refusal_response(&refusal),
    };
    let enrollment = Enrollment {
        cluster: cluster.to_owned(),
        fleet: enroll.fleet.clone(),
        keyid: checked.keyid.clone(),
        public_key_pem: checked.public_key_pem,
        labels: enroll.labels,
        at: Timestamp::now(),
    };
    let outcome = match app.db.enroll(enrollment).await {
        Ok(outcome) => outcome,
        Err(error) => {
            tracing::error!(cluster, %error, "enrolment could not be stored");
            return json_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                &error.to_string(),
            );
        }
    };
    forget_key(app, cluster);
    tracing::info!(cluster, keyid = %checked.keyid, ?outcome, "enrolment");
    let status = match outcome {
        EnrollOutcome::Enrolled => StatusCode::CREATED,
        EnrollOutcome::AlreadyEnrolled | EnrollOutcome::Rekeyed => StatusCode::OK,
        EnrollOutcome::KeyConflict => {
            app.metrics
                .enrollments_refused
                .fetch_add(1, Ordering::Relaxed);
            return refusal_response(&Refusal::KeyConflict(cluster.to_owned()));
        }
        EnrollOutcome::FleetConflict => {
            app.metrics
                .enrollments_refused
                .fetch_add(1, Ordering::Relaxed);
            return json_error(
                StatusCode::CONFLICT,
                "fleet_conflict",
                &format!(
                    "cluster {cluster} is enrolled in another fleet; an admin must rekey or forget it first"
                ),
            );
        }
    };
    app.metrics.enrollments_ok.fetch_add(1, Ordering::Relaxed);
    let last_sequence = match app.db.get_cluster(cluster).await {
        Ok(Some((summary, _))) => summary.last_sequence,
        _ => 0,
    };
    json(
        status,
        &EnrollReply {
            cluster: cluster.to_owned(),
            keyid: checked.keyid,
            outcome,
            last_sequence,
        },
    )
}

async fn admin(
    app: &Arc<App>,
    request: Request<Incoming>,
    cluster: &str,
    peer: SocketAddr,
    rekey: bool,
) -> Response<Body> {
    if let Some(limited) = rate_limited(app, peer) {
        return limited;
    }
    let offered = auth::credential(
        request
            .headers()
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes),
    );
    // The body means nothing here, but it is bounded like every other request's.
    if let Err(refusal) = read_body(request, MAX_SMALL_BODY).await {
        return refusal_response(&refusal);
    }
    // Only the admin token: every cluster holds the registration token, and a cluster may act only as itself.
    let Some(admin_token) = &app.admin_token else {
        return json_error(
            StatusCode::FORBIDDEN,
            "admin_disabled",
            "admin actions are disabled on this server: start windvane-server with --admin-token-file to allow \
             `windvane cluster rekey|forget`",
        );
    };
    if !offered.is_some_and(|t| admin_token.verify(&t)) {
        return token_failed(app, peer, "admin token");
    }
    let result = if rekey {
        app.db.allow_rekey(cluster).await
    } else {
        app.db.forget(cluster).await
    };
    forget_key(app, cluster);
    match result {
        Ok(true) => {
            let action = if rekey { "rekey_allowed" } else { "forgotten" };
            tracing::info!(cluster, action, "admin action");
            json(
                StatusCode::OK,
                &serde_json::json!({ "cluster": cluster, "result": action }),
            )
        }
        Ok(false) => json_error(
            StatusCode::NOT_FOUND,
            "unknown_cluster",
            &format!("cluster {cluster} is not enrolled"),
        ),
        Err(error) => json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            &error.to_string(),
        ),
    }
}

// ---- reads: page, API, metrics ----

fn check_read_token(app: &App, request: &Request<Incoming>) -> Option<Response<Body>> {
    let expected = app.read_token.as_ref()?;
    let offered = auth::credential(
        request
            .headers()
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes),
    );
    if offered.is_some_and(|t| expected.verify(&t)) {
        return None;
    }
    let mut response = json_error(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "a read token is required (Authorization: Bearer …)",
    );
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer, Basic realm=\"windvane\", charset=\"UTF-8\""),
    );
    Some(response)
}

fn latest_serial(app: &App) -> impl Fn(&str) -> Option<u64> + '_ {
    move |channel: &str| {
        windvane_store::check_channel_name(channel).ok()?;
        app.files.pointer(channel).ok()?.serial()
    }
}

async fn read_route(
    app: &Arc<App>,
    request: &Request<Incoming>,
    route: Route,
) -> crate::Result<Response<Body>> {
    let query = request.uri().query();
    let now = Timestamp::now();
    let filter = || {
        let selector = route::query_param(query, "selector");
        let states = route::query_params(query, "state");
        let states: Vec<&str> = states.iter().map(String::as_str).collect();
        Filter::parse(selector.as_deref(), &states).map(|f| (f, selector.unwrap_or_default()))
    };
    Ok(match route {
        Route::FleetPage | Route::ApiFleet | Route::ApiClusters => {
            let (filter, selector) = match filter() {
                Ok(parsed) => parsed,
                Err(detail) => {
                    return Ok(json_error(StatusCode::BAD_REQUEST, "bad_filter", &detail));
                }
            };
            let clusters = app.db.list_clusters().await?;
            let fleet = view::fleet_view(
                clusters,
                now,
                app.unknown_after,
                &filter,
                &latest_serial(app),
            );
            match route {
                Route::FleetPage => html(page::fleet_page(&fleet, &selector, &filter.states)),
                Route::ApiFleet => json(StatusCode::OK, &fleet),
                _ => json(
                    StatusCode::OK,
                    &serde_json::json!({ "clusters": fleet.clusters }),
                ),
            }
        }
        Route::ClusterPage(ref name) | Route::ApiCluster(ref name) => {
            let is_page = matches!(route, Route::ClusterPage(_));
            let name = name.clone();
            let Some((summary, payload)) = app.db.get_cluster(&name).await? else {
                return Ok(json_error(
                    StatusCode::NOT_FOUND,
                    "unknown_cluster",
                    &format!("cluster {name} is not enrolled"),
                ));
            };
            let drift = app.db.drift(Some(&name), None, DRIFT_LIMIT).await?;
            let detail = ClusterDetail {
                cluster: view::cluster_row(summary, now, app.unknown_after, &latest_serial(app)),
                report: view::parse_report(payload.as_deref()),
                drift,
            };
            if is_page {
                html(page::cluster_page(&detail, now))
            } else {
                json(StatusCode::OK, &detail)
            }
        }
        Route::ApiDrift => {
            let cluster = route::query_param(query, "cluster").filter(|c| !c.is_empty());
            let since = match route::query_param(query, "since").filter(|s| !s.is_empty()) {
                Some(text) => match view::parse_since(&text, now) {
                    Ok(t) => Some(t),
                    Err(detail) => {
                        return Ok(json_error(StatusCode::BAD_REQUEST, "bad_since", &detail));
                    }
                },
                None => None,
            };
            let drift = app.db.drift(cluster.as_deref(), since, DRIFT_LIMIT).await?;
            json(StatusCode::OK, &serde_json::json!({ "drift": drift }))
        }
        Route::Metrics => {
            let clusters = app.db.list_clusters().await?;
            let fleet = view::fleet_view(
                clusters,
                now,
                app.unknown_after,
                &Filter::default(),
                &|_| None,
            );
            let gauges = FleetGauges {
                counts: fleet.count_list.clone(),
                ages: fleet
                    .clusters
                    .iter()
                    .filter_map(|c| c.heartbeat_age_seconds)
                    .map(Duration::from_secs)
                    .collect(),
            };
            app.metrics.ingest_queue_depth.store(
                (app.ingest_capacity - app.ingest.capacity()) as u64,
                Ordering::Relaxed,
            );
            let body = metrics::render(&app.metrics, &gauges);
            Response::builder()
                .header(
                    header::CONTENT_TYPE,
                    "text/plain; version=0.0.4; charset=utf-8",
                )
                .body(Body::new(Bytes::from(body)))
                .unwrap_or_default()
        }
        _ => json_error(StatusCode::NOT_FOUND, "not_found", "not found"),
    })
}

async fn readyz(app: &Arc<App>) -> Response<Body> {
    if let Err(error) = app.db.ping().await {
        return json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "database",
            &error.to_string(),
        );
    }
    if !app.files.root().is_dir() {
        return json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "store",
            "the store root is not a readable directory",
        );
    }
    text(StatusCode::OK, "ready\n")
}

// ---- responses ----

fn json<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, JSON.clone())
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::new(Bytes::from(body)))
        .unwrap_or_default()
}

fn json_error(status: StatusCode, reason: &str, message: &str) -> Response<Body> {
    json(
        status,
        &serde_json::json!({ "error": message, "reason": reason }),
    )
}

fn refusal_response(refusal: &Refusal) -> Response<Body> {
    let mut response = json_error(refusal.status(), refusal.reason(), &refusal.message());
    match refusal {
        Refusal::Overloaded { retry_after } => {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(*retry_after));
        }
        Refusal::BodyTimeout { .. } => {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        _ => {}
    }
    response
}

fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Body::new(Bytes::from_static(body.as_bytes())))
        .unwrap_or_default()
}

fn html(body: String) -> Response<Body> {
    Response::builder()
        .header(header::CONTENT_TYPE, "text/html; charset=utf-8")
        .header(header::CACHE_CONTROL, "no-store")
        .header(
            "content-security-policy",
            "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; frame-ancestors 'none'",
        )
        .header(header::X_CONTENT_TYPE_OPTIONS, NOSNIFF.clone())
        .body(Body::new(Bytes::from(body)))
        .unwrap_or_default()
}
