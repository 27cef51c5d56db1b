//! The admin server: `/livez` (the process runs), `/readyz` (this replica works: its election loop reaches
//! the API server, whether it leads or stands by — [`crate::report::replica`]), `/status` (the agent's status as JSON,
//! with the replica's role) and `/metrics` (Prometheus, with `windvane_agent_leader`). Plain HTTP on the
//! admin address; it serves nothing else, and needs no token, so it is kept small and close:
//!
//! - It listens on `127.0.0.1:8481` unless told otherwise (`--admin-listen`): `/status` names the cluster's
//!   objects and errors, which nobody off the machine needs. In a pod, the kubelet's probes and Prometheus
//!   connect to the pod's IP from outside the pod's network namespace, so the shipped manifests set
//!   `adminListen: 0.0.0.0:8481` — a pod's addresses are its own (the agent does not use the host's
//!   network), and a NetworkPolicy can narrow who reaches them.
//! - At most [`MAX_CONNECTIONS`] connections are open at once; a new one closes the oldest, so that a probe
//!   always gets in, however many connections a client leaves open.
//! - A client has [`HEADER_READ_TIMEOUT`] to send its request's headers, so a silent or trickling client
//!   frees its connection on its own; a connection serves one request (no keep-alive), so no idle
//!   connection is ever closed under a client about to reuse it.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tracing::{debug, info};

use crate::report::metrics::Metrics;
use crate::report::replica::{Replica, Role};
use crate::report::status::StatusRx;
use crate::{Error, Result};

/// The admin address when none is given: loopback only (see the module's documentation for pods).
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8481);
/// Most connections open at once: the kubelet's two probes and a scraper or two need a handful.
pub const MAX_CONNECTIONS: usize = 32;
/// How long a client may take to send a request's headers, or to start the next one on a kept-alive
/// connection. Probes time out after seconds, and send their request at once.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// A replica is NotReady once it has not reached the API server for this long: the Lease's duration, after
/// which a leader that could not renew stops on its own (standbys try every 2 s, the leader renews every 5 s).
pub const READY_STALE_AFTER: Duration = Duration::from_secs(15);

/// What the admin server reads: the agent's status, its metrics and the replica's election state.
#[derive(Debug, Clone)]
pub struct Sources {
    pub status: StatusRx,
    pub metrics: Arc<Metrics>,
    pub replica: watch::Receiver<Replica>,
}

/// Binds the admin address; returns the bound address (useful with port 0) and the serving future.
pub async fn serve(
    addr: SocketAddr,
    sources: Sources,
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
    if bound.ip().is_loopback() {
        info!(%bound, "admin server listening on loopback only (/livez, /readyz, /status, /metrics); in a pod, give --admin-listen 0.0.0.0:8481 so that the kubelet's probes reach it");
    } else {
        info!(%bound, "admin server listening (/livez, /readyz, /status, /metrics)");
    }
    let serving = async move {
        let slots = Arc::new(Slots::new(MAX_CONNECTIONS));
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = shutdown.changed() => return,
            };
            let Ok((stream, peer)) = accepted else {
                continue;
            };
            let (slot, closed) = slots.admit();
            let sources = sources.clone();
            let slots = Arc::clone(&slots);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let response = respond(&request, &sources);
                    async move { Ok::<_, Infallible>(response) }
                });
                // One request per connection: probes and scrapers open a connection each time anyway, and a
                // kept-alive connection the header timeout closes while idle races the client's next request
                // on it (a reset instead of an answer).
                let connection = hyper::server::conn::http1::Builder::new()
                    .keep_alive(false)
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    result = connection => if let Err(error) = result {
                        debug!(%error, %peer, "admin connection ended with an error");
                    },
                    // At debug level: a client opening connections in a loop would otherwise fill the log.
                    _ = closed => debug!(%peer, limit = MAX_CONNECTIONS, "admin connections at their limit: closed the oldest"),
                }
                slots.leave(slot);
            });
        }
    };
    Ok((bound, serving))
}

/// The open connections, oldest first, each with the signal that closes it.
#[derive(Debug)]
struct Slots {
    limit: usize,
    table: Mutex<SlotTable>,
}

#[derive(Debug, Default)]
struct SlotTable {
    next_id: u64,
    /// Connection ids, oldest first, with the signal that closes each.
    open: VecDeque<(u64, oneshot::Sender<()>)>,
}

impl Slots {
    fn new(limit: usize) -> Self {
        Slots {
            limit: limit.max(1),
            table: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SlotTable> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a connection, closing the oldest when `limit` are open; its id and the signal to close it.
    fn admit(&self) -> (u64, oneshot::Receiver<()>) {
        let mut table = self.lock();
        while table.open.len() >= self.limit {
            if let Some((_, close)) = table.open.pop_front() {
                let _ = close.send(());
            }
        }
        let id = table.next_id;
        table.next_id += 1;
        let (close, closed) = oneshot::channel();
        table.open.push_back((id, close));
        (id, closed)
    }

    /// A connection ended.
    fn leave(&self, id: u64) {
        self.lock().open.retain(|(open_id, _)| *open_id != id);
    }

    #[cfg(test)]
    fn open(&self) -> usize {
        self.lock().open.len()
    }
}

fn respond(request: &Request<Incoming>, sources: &Sources) -> Response<Full<Bytes>> {
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
        "/readyz" => match readiness(sources) {
            Ok(body) => text(StatusCode::OK, body),
            Err(body) => text(StatusCode::SERVICE_UNAVAILABLE, body),
        },
        "/status" => {
            let mut json = sources.status.borrow().to_json();
            let role = sources.replica.borrow().role;
            json["replica"] =
                serde_json::json!({"role": role.as_str(), "leader": role == Role::Leader});
            Response::builder()
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(json.to_string())))
                .expect("a static response is valid")
        }
        "/metrics" => {
            let leader = u8::from(sources.replica.borrow().role == Role::Leader);
            let mut body = sources.metrics.render();
            body.push_str(&format!(
                "# HELP windvane_agent_leader 1 while this replica holds the Lease (polls, applies and heals), 0 while it stands by.\n\
                 # TYPE windvane_agent_leader gauge\nwindvane_agent_leader {leader}\n"
            ));
            Response::builder()
                .header("content-type", "text/plain; version=0.0.4; charset=utf-8")
                .body(Full::new(Bytes::from(body)))
                .expect("a static response is valid")
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /livez, /readyz, /status or /metrics\n".to_owned(),
        ),
    }
}

/// `/readyz`'s answer: the replica's readiness ([`Replica::readiness`]), and on the leader what it enforces.
fn readiness(sources: &Sources) -> Result<String, String> {
    let ready = sources
        .replica
        .borrow()
        .readiness(tokio::time::Instant::now(), READY_STALE_AFTER);
    let ready = match ready {
        Ok(ready) => ready,
        Err(why) => return Err(format!("{why}\n")),
    };
    if sources.replica.borrow().role != Role::Leader {
        return Ok(format!("{ready}\n"));
    }
    let status = sources.status.borrow();
    Ok(
        match status.source.applied_serial.filter(|_| status.enforced) {
            Some(serial) => format!("{ready}, enforcing serial {serial}\n"),
            None => format!("{ready}, no release enforced yet\n"),
        },
    )
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_connection_closes_the_oldest_at_the_limit() {
        let slots = Slots::new(2);
        let (first, mut first_closed) = slots.admit();
        let (second, mut second_closed) = slots.admit();
        let (third, mut third_closed) = slots.admit();
        assert_eq!(first_closed.try_recv(), Ok(()), "the oldest made room");
        assert!(second_closed.try_recv().is_err() && third_closed.try_recv().is_err());
        assert_eq!(slots.open(), 2);
        slots.leave(first);
        slots.leave(second);
        assert_eq!(slots.open(), 1);
        let (_, mut fourth_closed) = slots.admit();
        assert!(fourth_closed.try_recv().is_err() && third_closed.try_recv().is_err());
        slots.leave(third);
        assert_eq!(slots.open(), 1);
    }

    #[test]
    fn the_default_address_is_loopback() {
        assert!(DEFAULT_LISTEN.ip().is_loopback());
        assert_eq!(DEFAULT_LISTEN.port(), 8481);
    }
}
