//! Admin actions, `rekey` and `forget`: authorised by the admin token only (`--admin-token-file`), never by
//! the registration token that every cluster holds.

use std::net::IpAddr;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};

use crate::server::App;
use crate::server::auth;
use crate::server::db::Database;

use super::{
    Body, MAX_SMALL_BODY, heartbeat, json, json_error, rate_limited, read_body, refusal_response,
    token_failed,
};

pub(super) async fn handle(
    app: &Arc<App>,
    request: Request<Incoming>,
    cluster: &str,
    client: IpAddr,
    rekey: bool,
) -> Response<Body> {
    if let Some(limited) = rate_limited(app, client).await {
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
        return token_failed(app, client, "admin token").await;
    }
    let result = if rekey {
        app.db.allow_rekey(cluster).await
    } else {
        app.db.forget(cluster).await
    };
    heartbeat::forget_key(app, cluster);
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
