//! The static store: channel pointers and bundles from the file cache, with strong ETags, `304`, gzip and
//! the cache lifetimes each kind may have (pointers `no-cache`, bundles `immutable`).

use std::net::IpAddr;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};

use crate::http::App;
use crate::http::conns;
use crate::http::route::{self};
use crate::serve::files::{CachedFile, FileError, FileKind};
use crate::serve::long_poll::{self, HoldEnd};

use crate::http::handlers::{Body, JSON, NOSNIFF, json_error};

static CACHE_POINTER: HeaderValue = HeaderValue::from_static("no-cache");
static CACHE_BUNDLE: HeaderValue = HeaderValue::from_static("public, max-age=31536000, immutable");
static GZIP: HeaderValue = HeaderValue::from_static("gzip");
static VARY: HeaderValue = HeaderValue::from_static("Accept-Encoding");

static PREFERENCE_APPLIED: header::HeaderName =
    header::HeaderName::from_static("preference-applied");

/// A channel pointer; a `GET` with `If-None-Match` and `Prefer: wait=N` is held while the pointer is
/// unchanged ([`long_poll`]), and any answer to a `Prefer: wait` says `Preference-Applied: wait=N` — except
/// a poll evicted to make room, which closes its connection and says nothing, so the agent polls on its
/// interval next.
pub(crate) async fn serve_pointer(
    app: &Arc<App>,
    request: &Request<Incoming>,
    channel: &str,
    client: IpAddr,
) -> Response<Body> {
    let headers = request.headers();
    let wait = headers
        .get(&PREFER)
        .filter(|_| request.method() == Method::GET)
        .and_then(|prefer| long_poll::requested_wait(prefer.as_bytes()));
    let Some(wait) = wait else {
        return serve_file(request, app.files.pointer(channel));
    };
    let ended = match headers.get(header::IF_NONE_MATCH) {
        Some(if_none_match) => {
            // The connection's request counter, put there by the accept loop (absent in no other case).
            let connection = request.extensions().get::<conns::Busy>();
            let holder = (client, connection);
            long_poll::hold(app, channel, if_none_match.as_bytes(), wait, holder).await
        }
        None => HoldEnd::Answered,
    };
    let mut response = serve_file(request, app.files.pointer(channel));
    if ended == HoldEnd::Evicted {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return response;
    }
    if let Ok(applied) = HeaderValue::from_str(&format!("wait={}", wait.as_secs())) {
        response
            .headers_mut()
            .insert(PREFERENCE_APPLIED.clone(), applied);
    }
    response
}

static PREFER: header::HeaderName = header::HeaderName::from_static("prefer");

pub(crate) fn serve_file(
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
