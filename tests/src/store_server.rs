//! A static file server for a Windvane store directory, for end-to-end tests that need a source they can
//! break on purpose: serve normally (with ETags and 304s, as any static host does), answer 503 with
//! Retry-After, serve tampered bytes, cut a body short, stream a body that never ends, accept and never
//! answer, trickle a body a byte at a time, or stop listening — for every file or only the channel pointers
//! or only the bundles. It records every request (path, `If-None-Match`, time, how it was answered). Real
//! HTTP on loopback; the agent cannot tell it from nginx or a CDN.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// How the server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Serve the store as it is.
    Normal,
    /// `503 Service Unavailable` with `Retry-After: 1`.
    Unavailable,
    /// `503 Service Unavailable` with this `Retry-After` value.
    Busy(&'static str),
    /// Accept the request and never answer (no status line, no byte), as a hung backend behind a proxy.
    Stuck,
    /// `200 OK` with the whole file's `Content-Length`, then the body one byte every [`TRICKLE_EVERY`].
    Trickle,
    /// Serve every file with one byte flipped in the middle.
    Tampered,
    /// Announce the whole file in `Content-Length`, send its first half, then drop the connection.
    Truncated,
    /// `200 OK` with no length, streaming filler bytes until the client hangs up (or [`ENDLESS_LIMIT`] is
    /// reached, so a client that never stops cannot keep the test busy forever).
    Endless,
}

/// Which requests a [`Mode`] applies to; the others are served normally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Every file.
    All,
    /// `channels/*.json` only.
    Pointers,
    /// `bundles/*.json` only.
    Bundles,
}

impl Target {
    fn matches(self, path: &str) -> bool {
        match self {
            Target::All => true,
            Target::Pointers => path.starts_with("/channels/"),
            Target::Bundles => path.starts_with("/bundles/"),
        }
    }
}

/// How often [`Mode::Trickle`] sends one byte.
pub const TRICKLE_EVERY: Duration = Duration::from_secs(3);

/// One request the server saw.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    /// The `If-None-Match` header the client sent.
    pub if_none_match: Option<String>,
    pub at: Instant,
    /// How it was answered.
    pub mode: Mode,
}

/// Most bytes one [`Mode::Endless`] response sends.
pub const ENDLESS_LIMIT: u64 = 1 << 30;

static ENDLESS_CHUNK: [u8; 64 * 1024] = [b' '; 64 * 1024];

type Body = BoxBody<Bytes, std::io::Error>;

/// A running store server; stops on drop.
#[derive(Debug)]
pub struct StoreServer {
    addr: SocketAddr,
    root: PathBuf,
    faults: Arc<Faults>,
    task: Option<JoinHandle<()>>,
}

/// What the server does wrong, and what it saw.
#[derive(Debug)]
struct Faults {
    mode: Mutex<(Mode, Target)>,
    requests: Mutex<Vec<Seen>>,
    /// Bytes sent by endless responses, and the most any one of them sent.
    endless_total: AtomicU64,
    endless_max: AtomicU64,
}

impl StoreServer {
    /// Serves `root` on a free loopback port.
    pub async fn start(root: PathBuf) -> anyhow::Result<Self> {
        Self::start_on(root, "127.0.0.1:0".parse()?).await
    }

    async fn start_on(root: PathBuf, addr: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let faults = Arc::new(Faults {
            mode: Mutex::new((Mode::Normal, Target::All)),
            requests: Mutex::new(Vec::new()),
            endless_total: AtomicU64::new(0),
            endless_max: AtomicU64::new(0),
        });
        let task = tokio::spawn(serve(listener, root.clone(), faults.clone()));
        Ok(Self {
            addr,
            root,
            faults,
            task: Some(task),
        })
    }

    /// The store's base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Changes how the server answers every request from now on.
    pub fn set_mode(&self, mode: Mode) {
        self.set_mode_for(Target::All, mode);
    }

    /// Answers the requests of `target` in `mode` from now on, and every other request normally.
    pub fn set_mode_for(&self, target: Target, mode: Mode) {
        *self.faults.mode.lock().expect("mode lock") = (mode, target);
    }

    /// Paths requested so far.
    pub fn requests(&self) -> Vec<String> {
        self.seen().into_iter().map(|seen| seen.path).collect()
    }

    /// Every request so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.faults.requests.lock().expect("requests lock").clone()
    }

    /// Bytes sent by [`Mode::Endless`] responses so far: in total, and the most any one response sent
    /// before its client hung up.
    pub fn endless_bytes(&self) -> (u64, u64) {
        (
            self.faults.endless_total.load(Ordering::Relaxed),
            self.faults.endless_max.load(Ordering::Relaxed),
        )
    }

    /// Stops listening and closes open connections: connections are refused until [`StoreServer::resume`].
    pub fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    /// Listens again on the same address.
    pub async fn resume(&mut self) -> anyhow::Result<()> {
        self.stop();
        let listener = TcpListener::bind(self.addr).await?;
        self.task = Some(tokio::spawn(serve(
            listener,
            self.root.clone(),
            self.faults.clone(),
        )));
        Ok(())
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn serve(listener: TcpListener, root: PathBuf, faults: Arc<Faults>) {
    // Connections live in this task's set, so stopping the server (aborting this task) also closes the
    // keep-alive connections clients hold, as a server that goes down would.
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (root, faults) = (root.clone(), faults.clone());
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let response = respond(&request, &root, &faults);
                async move {
                    match response {
                        Some(response) => Ok::<_, Infallible>(response),
                        // Stuck: the connection stays open with no answer until the client gives up.
                        None => futures::future::pending().await,
                    }
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// The answer to `request`; `None` for no answer at all ([`Mode::Stuck`]).
fn respond(
    request: &Request<Incoming>,
    root: &std::path::Path,
    faults: &Arc<Faults>,
) -> Option<Response<Body>> {
    let path = request.uri().path().to_owned();
    let (mode, target) = *faults.mode.lock().expect("mode lock");
    let mode = if target.matches(&path) {
        mode
    } else {
        Mode::Normal
    };
    faults.requests.lock().expect("requests lock").push(Seen {
        path: path.clone(),
        if_none_match: request
            .headers()
            .get("if-none-match")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        at: Instant::now(),
        mode,
    });
    if mode == Mode::Stuck {
        return None;
    }
    Some(answer(request, &path, mode, root, faults))
}

fn answer(
    request: &Request<Incoming>,
    path: &str,
    mode: Mode,
    root: &std::path::Path,
    faults: &Arc<Faults>,
) -> Response<Body> {
    let plain = |status: StatusCode| {
        Response::builder()
            .status(status)
            .body(full(Bytes::new()))
            .expect("valid response")
    };
    match mode {
        Mode::Unavailable => {
            let mut response = plain(StatusCode::SERVICE_UNAVAILABLE);
            response
                .headers_mut()
                .insert("retry-after", "1".parse().expect("valid header"));
            return response;
        }
        Mode::Busy(retry_after) => {
            let mut response = plain(StatusCode::SERVICE_UNAVAILABLE);
            response
                .headers_mut()
                .insert("retry-after", retry_after.parse().expect("valid header"));
            return response;
        }
        Mode::Endless => return endless(faults.clone()),
        Mode::Normal | Mode::Tampered | Mode::Truncated | Mode::Trickle | Mode::Stuck => {}
    }
    let relative = path.trim_start_matches('/');
    let allowed = relative.split('/').count() == 2
        && (relative.starts_with("channels/") || relative.starts_with("bundles/"))
        && !relative.contains("..");
    let Some(mut bytes) = allowed
        .then(|| std::fs::read(root.join(relative)).ok())
        .flatten()
    else {
        return plain(StatusCode::NOT_FOUND);
    };
    if mode == Mode::Tampered && !bytes.is_empty() {
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x01;
    }
    if mode == Mode::Truncated {
        // The announced length is the whole file; the body ends with an error after half of it, which makes
        // hyper drop the connection mid-body, as a proxy that dies or a network that breaks would.
        let length = bytes.len();
        bytes.truncate(length / 2);
        let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
            Ok(Frame::data(Bytes::from(bytes))),
            Err(std::io::Error::other("connection cut on purpose")),
        ];
        return Response::builder()
            .header("content-length", length)
            .header("content-type", "application/json")
            .body(StreamBody::new(futures::stream::iter(frames)).boxed())
            .expect("valid response");
    }
    if mode == Mode::Trickle {
        return trickle(bytes);
    }
    let etag = etag_of(&bytes);
    if request
        .headers()
        .get("if-none-match")
        .and_then(|v| v.to_str().ok())
        == Some(etag.as_str())
    {
        let mut response = plain(StatusCode::NOT_MODIFIED);
        response
            .headers_mut()
            .insert("etag", etag.parse().expect("valid header"));
        return response;
    }
    Response::builder()
        .header("etag", etag)
        .header("content-type", "application/json")
        .body(full(bytes))
        .expect("valid response")
}

/// The ETag the server gives a file: its SHA-256, quoted.
pub fn etag_of(bytes: &[u8]) -> String {
    format!("\"{}\"", windvane_shared::crypto::digest::sha256_hex(bytes))
}

/// The whole file announced, then sent one byte every [`TRICKLE_EVERY`]: every read gets a byte long before
/// a per-read timeout, the body takes an age.
fn trickle(bytes: Vec<u8>) -> Response<Body> {
    let length = bytes.len();
    let stream = futures::stream::unfold((bytes, 0usize), |(bytes, sent)| async move {
        if sent >= bytes.len() {
            return None;
        }
        if sent > 0 {
            tokio::time::sleep(TRICKLE_EVERY).await;
        }
        let byte = Bytes::copy_from_slice(&bytes[sent..=sent]);
        Some((
            Ok::<_, std::io::Error>(Frame::data(byte)),
            (bytes, sent + 1),
        ))
    });
    Response::builder()
        .header("content-length", length)
        .header("content-type", "application/json")
        .body(StreamBody::new(stream).boxed())
        .expect("valid response")
}

/// Counts what one endless response sent; the count is published when the body is dropped (the client hung
/// up, or the limit was reached).
struct EndlessCount {
    faults: Arc<Faults>,
    sent: u64,
}

impl Drop for EndlessCount {
    fn drop(&mut self) {
        self.faults
            .endless_max
            .fetch_max(self.sent, Ordering::Relaxed);
    }
}

fn endless(faults: Arc<Faults>) -> Response<Body> {
    let count = EndlessCount { faults, sent: 0 };
    let stream = futures::stream::unfold(count, |mut count| async move {
        if count.sent >= ENDLESS_LIMIT {
            return None;
        }
        let chunk = Bytes::from_static(&ENDLESS_CHUNK);
        count.sent += chunk.len() as u64;
        count
            .faults
            .endless_total
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        Some((Ok::<_, std::io::Error>(Frame::data(chunk)), count))
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(StreamBody::new(stream).boxed())
        .expect("valid response")
}
