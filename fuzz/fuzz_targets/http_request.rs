//! The server's HTTP request path, from the bytes on the socket: hyper's HTTP/1.1 parser (the same
//! `http1::Builder` the server runs) in-process over an in-memory stream, then what the server decides from the
//! parsed request before any I/O: `route::route` on the method and raw path, the conditional-request and
//! gzip negotiation and `Authorization` rules, the page/API query parameters (`selector`, `state`, `since`),
//! and, for `POST .../heartbeat` and `.../enroll`, the body checks.
//!
//! The input is one or more raw requests, as a client would send them. A route must keep every promise of the
//! store layout: a pointer or bundle route names exactly `channels/<valid channel>.json` or
//! `bundles/<sha256>.json`, cluster routes carry valid cluster names, and a selector the page accepts is shown
//! in a form that reads back as the same selector.
#![no_main]

use std::convert::Infallible;
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use windvane_fuzz::{CLUSTER, FLEET, cluster_key, now};
use windvane_shared::crypto::digest::is_sha256_hex;
use windvane_shared::wire::heartbeat::{EnrollRequest, MAX_HEARTBEAT_BYTES};
use windvane_shared::crypto::keys::verifying_key_to_pem;
use windvane_shared::spec::selector::LabelSelector;
use windvane_source_server::http::auth::credential;
use windvane_source_server::ingest::{ClusterKey, check_enroll, check_heartbeat};
use windvane_source_server::http::route::{
    Route, accepts_gzip, if_none_match, query_param, query_params, route, valid_cluster_name,
};
use windvane_source_server::fleet::status::Filter;
use windvane_source_server::fleet::view::parse_since;
use windvane_store::{bundle_path, channel_path, check_channel_name};

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a tokio runtime")
    })
}

fn bound_key() -> &'static ClusterKey {
    static KEY: OnceLock<ClusterKey> = OnceLock::new();
    KEY.get_or_init(|| {
        let pem = verifying_key_to_pem(&cluster_key().verifying_key());
        ClusterKey::from_stored(CLUSTER, FLEET.to_owned(), &pem).expect("a stored key reads")
    })
}

fuzz_target!(|data: &[u8]| {
    runtime().block_on(async {
        // Larger than any input, so that writing the whole request never waits for the server to read.
        let (mut client, server) = tokio::io::duplex(data.len() + (1 << 16));
        let connection =
            http1::Builder::new().serve_connection(TokioIo::new(server), service_fn(serve));
        // The connection (and its end of the stream) is dropped when it finishes, so the client sees EOF.
        let server_side = async move {
            let _ = connection.await;
        };
        let client_side = async move {
            let _ = client.write_all(data).await;
            let _ = client.shutdown().await;
            let mut responses = Vec::new();
            let _ = client.read_to_end(&mut responses).await;
        };
        tokio::join!(server_side, client_side);
    });
});

async fn serve(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path().to_owned();
    let routed = route(request.method(), &path);
    check_route(&path, &routed);

    let headers = request.headers();
    if let Some(value) = headers.get(header::IF_NONE_MATCH) {
        let etag: &[u8] = b"\"abc\"";
        let matched = if_none_match(value.as_bytes(), &[etag, b"\"abc.gz\""]);
        if value.as_bytes() == etag {
            assert!(matched);
        }
    }
    if let Some(value) = headers.get(header::ACCEPT_ENCODING) {
        let _ = accepts_gzip(value.as_bytes());
    }
    let _ = credential(headers.get(header::AUTHORIZATION).map(|v| v.as_bytes()));

    let query = request.uri().query().map(str::to_owned);
    let query = query.as_deref();
    match routed {
        Route::FleetPage | Route::ApiFleet | Route::ApiClusters => {
            let selector = query_param(query, "selector");
            let states = query_params(query, "state");
            let states: Vec<&str> = states.iter().map(String::as_str).collect();
            if let Ok(filter) = Filter::parse(selector.as_deref(), &states)
                && let Some(selector) = filter.selector
            {
                let shown = selector.to_string();
                let again = LabelSelector::parse(&shown)
                    .unwrap_or_else(|e| panic!("selector shown as {shown:?} does not parse: {e}"));
                assert_eq!(
                    again, selector,
                    "selector shown as {shown:?} reads back differently"
                );
            }
        }
        Route::ApiDrift => {
            if let Some(since) = query_param(query, "since") {
                let _ = parse_since(&since, now());
            }
        }
        Route::Heartbeat(cluster) => {
            if let Some(body) = read_body(request, MAX_HEARTBEAT_BYTES).await {
                let _ = check_heartbeat(
                    &cluster,
                    &body,
                    bound_key(),
                    now(),
                    Duration::from_secs(300),
                );
            }
        }
        Route::Enroll(cluster) => {
            if let Some(body) = read_body(request, 64 * 1024).await
                && let Ok(enroll) = serde_json::from_slice::<EnrollRequest>(&body)
            {
                let _ = check_enroll(&cluster, &enroll);
            }
        }
        _ => {}
    }
    Ok(Response::new(Full::new(Bytes::from_static(b"{}"))))
}

/// The body, read as the server reads it: at most `limit` bytes.
async fn read_body(request: Request<Incoming>, limit: u64) -> Option<Bytes> {
    let limited = Limited::new(request.into_body(), usize::try_from(limit).ok()?);
    limited
        .collect()
        .await
        .ok()
        .map(|collected| collected.to_bytes())
}

/// The promises of the store layout and the API paths, checked against the raw path routed.
fn check_route(path: &str, routed: &Route) {
    if *routed != Route::BadPath {
        assert!(path.starts_with('/'), "{path:?} routed as {routed:?}");
        let segments_clean = path == "/"
            || path[1..]
                .split('/')
                .all(|segment| !segment.is_empty() && segment != "." && segment != "..");
        assert!(
            segments_clean && !path.contains(['%', '\\']),
            "{path:?} routed as {routed:?}"
        );
    }
    match routed {
        Route::Pointer(channel) => {
            assert!(check_channel_name(channel).is_ok(), "{path:?}");
            assert_eq!(path[1..], channel_path(channel));
        }
        Route::Bundle(digest) => {
            assert!(is_sha256_hex(digest), "{path:?}");
            assert_eq!(path[1..], bundle_path(digest));
        }
        Route::ClusterPage(name)
        | Route::ApiCluster(name)
        | Route::Enroll(name)
        | Route::Heartbeat(name)
        | Route::Rekey(name)
        | Route::Forget(name) => assert!(valid_cluster_name(name), "{path:?}"),
        _ => {}
    }
}
