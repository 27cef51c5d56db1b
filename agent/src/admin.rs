//! The admin server: `/livez` (the process runs), `/readyz` (a release — the first one or the last known
//! good — is enforced), `/status` (the agent's status as JSON) and `/metrics` (Prometheus). Plain HTTP on the admin address; it serves nothing else.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::metrics::Metrics;
use crate::report::StatusRx;
use crate::{Error, Result};

/// Binds the admin address; returns the bound address (useful with port 0) and the serving future.
pub async fn serve(
    addr: SocketAddr,
    status: StatusRx,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(SocketAddr, impl Future<Output = ()>)> {
    let listener = TcpListener::bind(addr).await.map_err(|e| Error::Admin {
        addr: addr.to_string(),
        detail: e.to_string(),
    })?;
    let bound = listener.local_addr().map_err(|e| Error::Admin {
        addr: addr.to_string(),
        detail: e.to_string(),
    })?;
    info!(%bound, "admin server listening (/livez, /readyz, /metrics)");
    let serving = async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = shutdown.changed() => return,
            };
            let Ok((stream, _)) = accepted else { continue };
            let status = status.clone();
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let response = respond(&request, &status, &metrics);
                    async move { Ok::<_, Infallible>(response) }
                });
                if let Err(error) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    warn!(%error, "admin connection failed");
                }
            });
        }
    };
    Ok((bound, serving))
}

fn respond(
    request: &Request<Incoming>,
    status: &StatusRx,
    metrics: &Metrics,
) -> Response<Full<Bytes>> {
    let text = |code: StatusCode, body: String| {
        Response::builder()
            .status(code)
            .header("content-type", "text/plain; charset=utf-8")
            .body(Full::new(Bytes::from(body)))
            .expect("a static response is valid")
    };
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n".to_owned());
    }
    match request.uri().path() {
        "/livez" => text(StatusCode::OK, "ok\n".to_owned()),
        "/readyz" => {
            let status = status.borrow();
            if status.enforced {
                text(
                    StatusCode::OK,
                    format!(
                        "ok: enforcing serial {}\n",
                        status.source.applied_serial.unwrap_or_default()
                    ),
                )
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not ready: no release enforced yet\n".to_owned(),
                )
            }
        }
        "/status" => Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(
                status.borrow().to_json().to_string(),
            )))
            .expect("a static response is valid"),
        "/metrics" => Response::builder()
            .header("content-type", "text/plain; version=0.0.4; charset=utf-8")
            .body(Full::new(Bytes::from(metrics.render())))
            .expect("a static response is valid"),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /livez, /readyz, /status or /metrics\n".to_owned(),
        ),
    }
}
