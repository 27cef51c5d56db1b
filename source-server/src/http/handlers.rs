//! Request handlers: turn a routed request into a response, reading the store through the file cache,
//! the database through [`Database`], and handing heartbeats to the ingest queue. Decisions live in the pure
//! modules ([`route`], [`ingest`], [`status`], [`view`], [`page`]); this module does the I/O around them and
//! picks status codes. Errors are JSON `{"error": message, "reason": code}`; secrets never reach a log.
//!
//! Who may do what: enrolment takes the registration token and binds a name not bound yet (or re-binds one an
//! admin allowed to rekey); a heartbeat is accepted only signed by the key bound to the cluster it names (an
//! unknown name is 404 `unknown_cluster`, another key 401 `bad_signature`: the agent enrols again on either);
//! rekey and forget take the admin token (`--admin-token-file`; 403 `admin_disabled` without one).
//!
//! One file per endpoint family, as the router names them: [`store`] (the static store), [`enroll`],
//! [`heartbeat`], [`admin`] (rekey, forget) and [`read`] (page, JSON API, metrics, readiness); this file
//! dispatches and holds what they share (bounded body reads, the token limiter's answers, response shapes).

use crate::fleet::{read, rollout};
use crate::ingest::{admin, enroll, heartbeat};
use crate::serve::handlers as store;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use serde::Serialize;

use jiff::Timestamp;

use crate::db::Database;
use crate::http::App;
use crate::http::forwarded;
use crate::http::route::{self, Route};
use crate::ingest::Refusal;

pub(crate) type Body = Full<Bytes>;

/// Largest enrolment or admin request body.
pub(crate) const MAX_SMALL_BODY: u64 = 64 * 1024;
/// Longest time a client may take to send a request body, once its headers are in (hyper bounds the headers
/// to 30 s), so that a trickled body cannot hold a connection open.
pub(crate) const BODY_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) static JSON: HeaderValue = HeaderValue::from_static("application/json");
pub(crate) static NOSNIFF: HeaderValue = HeaderValue::from_static("nosniff");

pub(crate) async fn handle(
    app: &Arc<App>,
    request: Request<Incoming>,
    peer: SocketAddr,
) -> Response<Body> {
    let route = route::route(request.method(), request.uri().path());
    match route {
        Route::Pointer(channel) => {
            let client = client_of(app, &request, peer);
            store::serve_pointer(app, &request, &channel, client).await
        }
        Route::Bundle(digest) => store::serve_file(&request, app.files.bundle(&digest)),
        Route::Approval(channel, serial) => {
            store::serve_file(&request, app.files.approval(&channel, serial))
        }
        Route::Livez => text(StatusCode::OK, "ok\n"),
        Route::Readyz => read::readyz(app).await,
        Route::Heartbeat(cluster) => heartbeat::handle(app, request, &cluster).await,
        Route::Enroll(cluster) => {
            let client = client_of(app, &request, peer);
            enroll::handle(app, request, &cluster, client).await
        }
        Route::Rekey(cluster) => {
            let client = client_of(app, &request, peer);
            admin::handle(app, request, &cluster, client, true).await
        }
        Route::Forget(cluster) => {
            let client = client_of(app, &request, peer);
            admin::handle(app, request, &cluster, client, false).await
        }
        Route::ApiRollout(channel) => {
            let client = client_of(app, &request, peer);
            let form = rollout::Form::of_query(request.uri().query());
            rollout::handle(app, &request, &channel, form, client).await
        }
        Route::RolloutPage(channel) => {
            let client = client_of(app, &request, peer);
            rollout::handle(app, &request, &channel, rollout::Form::Page, client).await
        }
        Route::FleetPage
        | Route::ClusterPage(_)
        | Route::ApiFleet
        | Route::ApiClusters
        | Route::ApiCluster(_)
        | Route::ApiDrift
        | Route::ApiBreakGlass
        | Route::Metrics => {
            let client = client_of(app, &request, peer);
            if let Some(denied) = read::check_read_token(app, &request, client).await {
                return denied;
            }
            match read::handle(app, &request, route).await {
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

/// Reads a body of at most `limit` bytes within [`BODY_TIMEOUT`]: refused from `Content-Length` before reading,
/// or as soon as more arrives than the limit.
pub(crate) async fn read_body(request: Request<Incoming>, limit: u64) -> Result<Bytes, Refusal> {
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

/// The client a request is from: the peer, or the client a trusted load balancer names
/// ([`crate::http::forwarded`]).
fn client_of(app: &App, request: &Request<Incoming>, peer: SocketAddr) -> IpAddr {
    let forwarded = request
        .headers()
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|value| value.to_str().ok());
    forwarded::client_address(peer.ip(), forwarded, &app.trusted_proxies)
}

/// Answers 429 when `client` offered too many wrong tokens lately (counted in the database, so on every
/// replica), 503 when the count cannot be read.
pub(crate) async fn rate_limited(app: &App, client: IpAddr) -> Option<Response<Body>> {
    let now = Timestamp::now();
    let since = app.limiter.window_start(now);
    let retry = match app
        .db
        .recent_token_failures(&client.to_string(), since)
        .await
    {
        Ok(recent) => app.limiter.blocked(recent, now)?,
        Err(error) => {
            tracing::error!(%error, "cannot read the record of wrong tokens; refusing");
            return Some(refusal_response(&Refusal::Unavailable(
                "the database is unavailable".to_owned(),
            )));
        }
    };
    tracing::info!(%client, retry_after = retry.as_secs(), "refused: too many wrong tokens from this address");
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

/// Counts a wrong `token` (`"registration token"`, `"admin token"`, …) against the address and answers 401.
pub(crate) async fn token_failed(app: &App, client: IpAddr, token: &str) -> Response<Body> {
    record_token_failure(app, client, token).await;
    json_error(
        StatusCode::UNAUTHORIZED,
        "bad_token",
        &format!("wrong or missing {token}"),
    )
}

/// Counts a wrong `token` against the address (in the database, for every replica's limiter).
async fn record_token_failure(app: &App, client: IpAddr, token: &str) {
    if let Err(error) = app
        .db
        .record_token_failure(&client.to_string(), Timestamp::now())
        .await
    {
        tracing::error!(%error, "cannot record a wrong token");
    }
    tracing::warn!(%client, "wrong {token}");
}

/// What a check of an offered token ([`check_token`]) decided.
pub(crate) enum TokenCheck {
    /// The token is right and the address is not refused.
    Passed,
    /// No token was offered (not counted: a browser asks before it prompts).
    Missing,
    /// Refused: the address offered too many wrong tokens lately (429), or this one is wrong (401, counted).
    Refused(Response<Body>),
}

/// Checks a token offered for a read (`token` names it in the log and the answer): an address that offered
/// too many wrong tokens lately is refused even with the right one, as at enrolment, so guessing any token
/// goes at the limiter's pace; a wrong token is counted.
pub(crate) async fn check_token(
    app: &App,
    client: IpAddr,
    offered: Option<String>,
    right: impl Fn(&str) -> bool,
    token: &str,
) -> TokenCheck {
    let Some(offered) = offered else {
        return TokenCheck::Missing;
    };
    if let Some(limited) = rate_limited(app, client).await {
        return TokenCheck::Refused(limited);
    }
    if right(&offered) {
        return TokenCheck::Passed;
    }
    record_token_failure(app, client, token).await;
    TokenCheck::Refused(json_error(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        &format!("wrong {token}"),
    ))
}

// ---- responses ----

pub(crate) fn json<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, JSON.clone())
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::new(Bytes::from(body)))
        .unwrap_or_default()
}

pub(crate) fn json_error(status: StatusCode, reason: &str, message: &str) -> Response<Body> {
    json(
        status,
        &serde_json::json!({ "error": message, "reason": reason }),
    )
}

pub(crate) fn refusal_response(refusal: &Refusal) -> Response<Body> {
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

pub(crate) fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Body::new(Bytes::from_static(body.as_bytes())))
        .unwrap_or_default()
}

pub(crate) fn html(body: String) -> Response<Body> {
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
