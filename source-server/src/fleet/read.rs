//! Reads: the fleet page, the JSON API, `/metrics` (behind the read token when one is set) and `/readyz`;
//! views come from the pure [`view`], [`page`] and status modules.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use jiff::Timestamp;

use crate::db::Database;
use crate::fleet::metrics::{self, FleetGauges};
use crate::fleet::page;
use crate::fleet::status::Filter;
use crate::fleet::view::{self, ClusterDetail};
use crate::http::App;
use crate::http::auth;
use crate::http::route::{self, Route};

use crate::http::handlers::{Body, TokenCheck, check_token, html, json, json_error, text};

/// Most drift entries one page or API call returns.
const DRIFT_LIMIT: u32 = 500;

/// `None` when the request may read (no read token is set, or it offers it), else the answer: 401 asking for
/// the token, 401 for a wrong one (counted against the address), 429 while the address is refused.
pub(crate) async fn check_read_token(
    app: &App,
    request: &Request<Incoming>,
    client: IpAddr,
) -> Option<Response<Body>> {
    let expected = app.read_token.as_ref()?;
    let offered = auth::credential(
        request
            .headers()
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes),
    );
    let mut response =
        match check_token(app, client, offered, |t| expected.verify(t), "read token").await {
            TokenCheck::Passed => return None,
            TokenCheck::Refused(response) if response.status() == StatusCode::TOO_MANY_REQUESTS => {
                return Some(response);
            }
            TokenCheck::Refused(response) => response,
            TokenCheck::Missing => json_error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "a read token is required (Authorization: Bearer …)",
            ),
        };
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

pub(crate) async fn handle(
    app: &Arc<App>,
    request: &Request<Incoming>,
    route: Route,
) -> crate::Result<Response<Body>> {
    let query = request.uri().query();
    let now = Timestamp::now();
    match route {
        Route::FleetPage | Route::ApiFleet | Route::ApiClusters => {
            fleet(app, query, &route, now).await
        }
        Route::ClusterPage(ref name) => cluster(app, name, true, now).await,
        Route::ApiCluster(ref name) => cluster(app, name, false, now).await,
        Route::ApiDrift => drift(app, query, now).await,
        Route::ApiBreakGlass => {
            let open = open_break_glass(app, now).await?;
            Ok(json(
                StatusCode::OK,
                &serde_json::json!({ "breakGlass": open }),
            ))
        }
        Route::Metrics => prometheus(app, now).await,
        _ => Ok(json_error(StatusCode::NOT_FOUND, "not_found", "not found")),
    }
}

/// The fleet page, `/api/v1/fleet` or `/api/v1/clusters`, filtered by the query's `selector` and `state`s.
async fn fleet(
    app: &Arc<App>,
    query: Option<&str>,
    route: &Route,
    now: Timestamp,
) -> crate::Result<Response<Body>> {
    let selector = route::query_param(query, "selector");
    let states = route::query_params(query, "state");
    let states: Vec<&str> = states.iter().map(String::as_str).collect();
    let filter = match Filter::parse(selector.as_deref(), &states) {
        Ok(filter) => filter,
        Err(detail) => {
            return Ok(json_error(
                StatusCode::BAD_REQUEST,
                "bad_filter",
                &detail.to_string(),
            ));
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
    Ok(match route {
        Route::FleetPage => {
            let open = open_break_glass(app, now).await?;
            let selector = selector.unwrap_or_default();
            html(page::fleet_page(&fleet, &selector, &filter.states, &open))
        }
        Route::ApiFleet => json(StatusCode::OK, &fleet),
        _ => json(
            StatusCode::OK,
            &serde_json::json!({ "clusters": fleet.clusters }),
        ),
    })
}

/// One cluster's page (`is_page`) or `/api/v1/clusters/{name}`: its row, last report and drift log.
async fn cluster(
    app: &Arc<App>,
    name: &str,
    is_page: bool,
    now: Timestamp,
) -> crate::Result<Response<Body>> {
    let Some((summary, payload)) = app.db.get_cluster(name).await? else {
        return Ok(json_error(
            StatusCode::NOT_FOUND,
            "unknown_cluster",
            &format!("cluster {name} is not enrolled"),
        ));
    };
    let drift = app.db.drift(Some(name), None, DRIFT_LIMIT, 0).await?;
    let detail = ClusterDetail {
        cluster: view::cluster_row(summary, now, app.unknown_after, &latest_serial(app)),
        report: view::parse_report(payload.as_deref()),
        drift,
    };
    Ok(if is_page {
        html(page::cluster_page(&detail, now))
    } else {
        json(StatusCode::OK, &detail)
    })
}

/// `/api/v1/drift`: the drift log, by `cluster` and `since`, a page at a time.
async fn drift(
    app: &Arc<App>,
    query: Option<&str>,
    now: Timestamp,
) -> crate::Result<Response<Body>> {
    let cluster = route::query_param(query, "cluster").filter(|c| !c.is_empty());
    let since = match route::query_param(query, "since").filter(|s| !s.is_empty()) {
        Some(text) => match view::parse_since(&text, now) {
            Ok(t) => Some(t),
            Err(detail) => {
                return Ok(json_error(
                    StatusCode::BAD_REQUEST,
                    "bad_since",
                    &detail.to_string(),
                ));
            }
        },
        None => None,
    };
    let (limit, offset) = match page(query) {
        Ok(page) => page,
        Err(detail) => {
            return Ok(json_error(
                StatusCode::BAD_REQUEST,
                "bad_page",
                &detail.to_string(),
            ));
        }
    };
    let drift = app
        .db
        .drift(cluster.as_deref(), since, limit, offset)
        .await?;
    // The offset of the next page, while pages are full.
    let next = (drift.len() == limit as usize).then(|| offset + u64::from(limit));
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({ "drift": drift, "next": next }),
    ))
}

/// `/metrics`: the server's own metrics, the fleet's gauges and the rollouts'.
async fn prometheus(app: &Arc<App>, now: Timestamp) -> crate::Result<Response<Body>> {
    let clusters = app.db.list_clusters().await?;
    let fleet = view::fleet_view(
        clusters,
        now,
        app.unknown_after,
        &Filter::default(),
        &|_| None,
    );
    let gauges = FleetGauges {
        counts: fleet.counts.iter().map(|(s, n)| (*s, *n)).collect(),
        ages: fleet
            .clusters
            .iter()
            .filter_map(|c| c.heartbeat_age_seconds)
            .map(Duration::from_secs)
            .collect(),
    };
    app.metrics
        .ingest_queue_depth
        .set(i64::try_from(app.ingest_capacity - app.ingest.capacity()).unwrap_or(i64::MAX));
    let mut body = metrics::render(&app.metrics, &gauges);
    body.push_str(&crate::fleet::rollout::metrics(app, &fleet.clusters, now));
    Ok(Response::builder()
        .header(header::CONTENT_TYPE, windvane_metrics::CONTENT_TYPE)
        .body(Body::new(Bytes::from(body)))
        .unwrap_or_default())
}

pub(crate) async fn readyz(app: &Arc<App>) -> Response<Body> {
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

/// The `limit` (1 to [`DRIFT_LIMIT`], default [`DRIFT_LIMIT`]) and `offset` (default 0) of a drift page.
fn page(query: Option<&str>) -> crate::Result<(u32, u64)> {
    let limit = match route::query_param(query, "limit").filter(|s| !s.is_empty()) {
        None => DRIFT_LIMIT,
        Some(text) => match text.parse::<u32>() {
            Ok(n) if (1..=DRIFT_LIMIT).contains(&n) => n,
            _ => {
                return Err(crate::Error::PageLimit {
                    text: text.to_owned(),
                    max: DRIFT_LIMIT,
                });
            }
        },
    };
    let offset = match route::query_param(query, "offset").filter(|s| !s.is_empty()) {
        None => 0,
        Some(text) => text.parse::<u64>().map_err(|_| crate::Error::PageOffset {
            text: text.to_owned(),
        })?,
    };
    Ok((limit, offset))
}

/// The fleet's open break-glass changes, from the drift log.
async fn open_break_glass(
    app: &App,
    now: Timestamp,
) -> crate::Result<Vec<crate::notify::break_glass::OpenBreakGlass>> {
    // Holds are capped (24 h by default): a week of the log covers every one still open.
    let since = now
        .checked_sub(jiff::SignedDuration::from_hours(24 * 7))
        .ok();
    let drift = app.db.drift(None, since, DRIFT_LIMIT, 0).await?;
    Ok(crate::notify::break_glass::open(&drift, now))
}

#[cfg(test)]
mod page_tests {
    use super::*;

    #[test]
    fn pages_default_to_the_limit_and_refuse_nonsense() {
        assert_eq!(page(None).expect("default"), (DRIFT_LIMIT, 0));
        assert_eq!(page(Some("limit=10&offset=20")).expect("given"), (10, 20));
        assert!(matches!(
            page(Some("limit=0")),
            Err(crate::Error::PageLimit { text, .. }) if text == "0"
        ));
        assert!(page(Some(&format!("limit={}", DRIFT_LIMIT + 1))).is_err());
        let offset = page(Some("offset=-1")).expect_err("negative offset");
        assert!(matches!(&offset, crate::Error::PageOffset { text } if text == "-1"));
        assert_eq!(
            offset.to_string(),
            "offset must be a non-negative number, got \"-1\""
        );
    }
}
