//! A static file server for a Windvane store directory, for end-to-end tests that need a source they can
//! break on purpose: serve normally (with ETags and 304s, as any static host does), answer 503 with
//! Retry-After, serve tampered bytes, or stop listening. Real HTTP on loopback; the agent cannot tell it from
//! nginx or a CDN.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// How the server answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Serve the store as it is.
    Normal,
    /// `503 Service Unavailable` with `Retry-After: 1`.
    Unavailable,
    /// Serve every file with one byte flipped in the middle.
    Tampered,
}

/// A running store server; stops on drop.
#[derive(Debug)]
pub struct StoreServer {
    addr: SocketAddr,
    root: PathBuf,
    mode: Arc<Mutex<Mode>>,
    requests: Arc<Mutex<Vec<String>>>,
    task: Option<JoinHandle<()>>,
}

impl StoreServer {
    /// Serves `root` on a free loopback port.
    pub async fn start(root: PathBuf) -> anyhow::Result<Self> {
        Self::start_on(root, "127.0.0.1:0".parse()?).await
    }

    async fn start_on(root: PathBuf, addr: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let mode = Arc::new(Mutex::new(Mode::Normal));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(serve(
            listener,
            root.clone(),
            mode.clone(),
            requests.clone(),
        ));
        Ok(Self {
            addr,
            root,
            mode,
            requests,
            task: Some(task),
        })
    }

    /// The store's base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Changes how the server answers from now on.
    pub fn set_mode(&self, mode: Mode) {
        *self.mode.lock().expect("mode lock") = mode;
    }

    /// Paths requested so far.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().expect("requests lock").clone()
    }

    /// Stops listening: connections are refused until [`StoreServer::resume`].
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
            self.mode.clone(),
            self.requests.clone(),
        )));
        Ok(())
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn serve(
    listener: TcpListener,
    root: PathBuf,
    mode: Arc<Mutex<Mode>>,
    requests: Arc<Mutex<Vec<String>>>,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (root, mode, requests) = (root.clone(), mode.clone(), requests.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let response = respond(&request, &root, &mode, &requests);
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn respond(
    request: &Request<Incoming>,
    root: &std::path::Path,
    mode: &Mutex<Mode>,
    requests: &Mutex<Vec<String>>,
) -> Response<Full<Bytes>> {
    let path = request.uri().path().to_owned();
    requests.lock().expect("requests lock").push(path.clone());
    let mode = mode.lock().expect("mode lock").clone();
    let plain = |status: StatusCode| {
        Response::builder()
            .status(status)
            .body(Full::new(Bytes::new()))
            .expect("valid response")
    };
    if mode == Mode::Unavailable {
        let mut response = plain(StatusCode::SERVICE_UNAVAILABLE);
        response
            .headers_mut()
            .insert("retry-after", "1".parse().expect("valid header"));
        return response;
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
    let etag = format!("\"{}\"", windvane_shared::digest::sha256_hex(&bytes));
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
        .body(Full::new(Bytes::from(bytes)))
        .expect("valid response")
}
