//! A webhook receiver for the notification tests: a real hyper server on a loopback port that records every
//! delivery by path (`/flaky` answers 500 to the first attempt of each notification, to exercise retries),
//! and the waits that assert what arrived — exactly, in order, and nothing more during a quiet period.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use crate::poll::eventually;

#[derive(Debug, Default)]
pub struct Received {
    /// Accepted deliveries per path, as JSON (`null` for a body that is not one JSON value).
    pub by_path: HashMap<String, Vec<Value>>,
    /// Accepted deliveries per path, as text (JSON lines, for one).
    pub raw_by_path: HashMap<String, Vec<String>>,
    /// Attempts seen per (path, id), to fail the first one on /flaky.
    attempts: HashMap<(String, String), u32>,
}

/// A webhook receiver on a loopback port; `/flaky` answers 500 to the first attempt of each notification (of
/// the first body, for bodies without an `id`).
pub async fn receiver() -> (String, Arc<Mutex<Received>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let received: Arc<Mutex<Received>> = Arc::default();
    let state = Arc::clone(&received);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let state = Arc::clone(&state);
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let state = Arc::clone(&state);
                    async move {
                        let path = request.uri().path().to_owned();
                        let body = request
                            .into_body()
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        let id = value["id"]
                            .as_str()
                            .or(value["text"].as_str())
                            .unwrap_or("")
                            .to_owned();
                        let mut state = state.lock().expect("lock");
                        let attempt = state.attempts.entry((path.clone(), id)).or_default();
                        *attempt += 1;
                        let status = if path == "/flaky" && *attempt == 1 {
                            500
                        } else {
                            let text = String::from_utf8_lossy(&body).into_owned();
                            state
                                .raw_by_path
                                .entry(path.clone())
                                .or_default()
                                .push(text);
                            state.by_path.entry(path).or_default().push(value);
                            200
                        };
                        Ok::<_, Infallible>(
                            Response::builder()
                                .status(status)
                                .body(Full::new(Bytes::new()))
                                .expect("response"),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (format!("http://{addr}"), received)
}

pub fn triggers(received: &Arc<Mutex<Received>>, path: &str) -> Vec<String> {
    let state = received.lock().expect("lock");
    let mut out: Vec<String> = state
        .by_path
        .get(path)
        .map(|list| {
            list.iter()
                .map(|v| v["trigger"].as_str().unwrap_or("slack").to_owned())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

pub fn count(received: &Arc<Mutex<Received>>, path: &str) -> usize {
    received
        .lock()
        .expect("lock")
        .by_path
        .get(path)
        .map_or(0, Vec::len)
}

pub async fn wait_for(received: &Arc<Mutex<Received>>, path: &str, expected: &[&str]) {
    let mut expected: Vec<String> = expected.iter().map(|s| (*s).to_owned()).collect();
    expected.sort();
    let what = format!("{path} to receive {expected:?}");
    eventually(&what, Duration::from_secs(30), || {
        let got = triggers(received, path);
        let expected = expected.clone();
        async move {
            assert!(
                got.len() <= expected.len(),
                "{path}: more than expected: {got:?}"
            );
            (got == expected).then_some(())
        }
    })
    .await;
}

/// No new delivery arrives on any path during `quiet` (a bounded check for "exactly once").
pub async fn stays_quiet(received: &Arc<Mutex<Received>>, quiet: Duration) {
    let snapshot: Vec<(String, usize)> = received
        .lock()
        .expect("lock")
        .by_path
        .iter()
        .map(|(k, v)| (k.clone(), v.len()))
        .collect();
    let start = Instant::now();
    while start.elapsed() < quiet {
        for (path, n) in &snapshot {
            assert_eq!(
                count(received, path),
                *n,
                "a duplicate arrived on {path}: {:?}",
                received.lock().expect("lock").by_path[path]
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The webhook's triggers in arrival order, with their ids.
pub fn arrivals(received: &Arc<Mutex<Received>>, path: &str) -> Vec<(String, String)> {
    received
        .lock()
        .expect("lock")
        .by_path
        .get(path)
        .map(|list| {
            list.iter()
                .map(|v| {
                    (
                        v["trigger"].as_str().unwrap_or_default().to_owned(),
                        v["id"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

pub async fn wait_for_arrivals(received: &Arc<Mutex<Received>>, expected: &[&str]) {
    let what = format!("/hook to receive {expected:?} in this order");
    eventually(&what, Duration::from_secs(30), || {
        let got: Vec<String> = arrivals(received, "/hook")
            .into_iter()
            .map(|(t, _)| t)
            .collect();
        async move {
            assert!(
                got.len() <= expected.len() && got.iter().zip(expected).all(|(g, e)| g == e),
                "/hook got {got:?}, expected {expected:?}"
            );
            (got.len() == expected.len()).then_some(())
        }
    })
    .await;
}
