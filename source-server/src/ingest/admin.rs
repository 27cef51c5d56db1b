//! Admin actions, `rekey` (allowed for `--rekey-ttl`, and withdrawn by the next heartbeat the bound key
//! signs) and `forget`: authorised by the admin token only (`--admin-token-file`), never by
//! the registration token that every cluster holds, and only as a bearer token: HTTP Basic credentials are
//! cached by browsers and sent again on their own ([`auth::bearer`]).

use std::net::IpAddr;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use jiff::{SignedDuration, Timestamp};

use crate::db::Database;
use crate::http::App;
use crate::http::auth;

use crate::http::handlers::{
    Body, MAX_SMALL_BODY, json, json_error, rate_limited, read_body, refusal_response, token_failed,
};
use crate::ingest::heartbeat;

pub(crate) async fn handle(
    app: &Arc<App>,
    request: Request<Incoming>,
    cluster: &str,
    client: IpAddr,
    rekey: bool,
) -> Response<Body> {
    if let Some(limited) = rate_limited(app, client).await {
        return limited;
    }
    let offered = auth::bearer(
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
        return token_failed(app, client, "admin token").await;
    }
    // A rekey is allowed for a while only: a permission nobody used would otherwise let anyone holding the
    // registration token take the name over at any later time.
    let until = rekey.then(|| rekey_deadline(Timestamp::now(), app.rekey_ttl));
    let result = match until {
        Some(until) => app.db.allow_rekey(cluster, until).await,
        None => app.db.forget(cluster).await,
    };
    heartbeat::forget_key(app, cluster);
    match result {
        Ok(true) => {
            let action = if rekey { "rekey_allowed" } else { "forgotten" };
            tracing::info!(cluster, action, ?until, "admin action");
            let mut reply = serde_json::json!({ "cluster": cluster, "result": action });
            if let Some(until) = until {
                reply["until"] = serde_json::json!(until);
            }
            json(StatusCode::OK, &reply)
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

/// When a rekey allowed at `now` for `ttl` ends (clamped to what a timestamp holds).
fn rekey_deadline(now: Timestamp, ttl: std::time::Duration) -> Timestamp {
    let ttl = SignedDuration::try_from(ttl).unwrap_or(SignedDuration::MAX);
    now.checked_add(ttl).unwrap_or(Timestamp::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rekey_ends_after_its_time_to_live_without_overflow() {
        let now: Timestamp = "2026-12-07T12:00:00Z".parse().expect("time");
        assert_eq!(
            rekey_deadline(now, std::time::Duration::from_secs(3600)),
            "2026-12-07T13:00:00Z".parse::<Timestamp>().expect("time")
        );
        assert_eq!(
            rekey_deadline(now, std::time::Duration::MAX),
            Timestamp::MAX
        );
    }
}
