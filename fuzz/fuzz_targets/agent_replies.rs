//! The agent's client side, from the bytes a store or the source server sends back: hyper's HTTP/1.1 client
//! parser (the one under the agent's reqwest) in-process over an in-memory stream, then every decision the
//! agent takes from the parsed reply before any other I/O — the pointer poll's judgement
//! (`source::judge_pointer`: 304, busy with `Retry-After`, failure, or a body and its ETag), the bundle
//! fetch's (`source::judge`), the capped body read (`http::check_length`, `http::append_capped`), the
//! enrolment and heartbeat replies (`heartbeat::enroll_reply`, `http::busy`, `heartbeat::heartbeat_reply`), and
//! the waits and deadlines built from them (`clamp`, `backoff`).
//!
//! The input is a raw HTTP response, as a hostile store or server would send it. Whatever it says, nothing
//! panics or overflows, every wait stays within the documented bounds, no body read grows past its cap and
//! no error quotes more than a bounded part of the peer's body.
#![no_main]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use windvane_agent::backoff::{after_busy, full_jitter, jittered};
use windvane_agent::fetch::source::{PointerAnswer, judge, judge_pointer};
use windvane_agent::fetch::http;
use windvane_agent::report::heartbeat;
use windvane_agent::{Error, clamp};
use windvane_fuzz::now;

/// A cap small enough that inputs reach it.
const CAP: u64 = 4096;
const URL: &str = "http://store.invalid/channels/stable.json";

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a tokio runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    runtime().block_on(async {
        let (client, mut server) = tokio::io::duplex(data.len() + (1 << 16));
        let server_side = async move {
            // Read the request (or some of it), answer with the input, hang up.
            let mut request = [0u8; 1024];
            let _ = server.read(&mut request).await;
            let _ = server.write_all(data).await;
            let _ = server.shutdown().await;
        };
        let client_side = async move {
            let Ok((mut sender, connection)) = http1::handshake(TokioIo::new(client)).await else {
                return;
            };
            let request = hyper::Request::get("/channels/stable.json")
                .header("host", "store.invalid")
                .body(Empty::<Bytes>::new())
                .expect("a valid request");
            let exchange = async move {
                let Ok(response) = sender.send_request(request).await else {
                    return;
                };
                interpret(response).await;
            };
            tokio::join!(
                async {
                    let _ = connection.await;
                },
                exchange
            );
        };
        tokio::join!(server_side, client_side);
    });
});

/// Every decision the agent takes from one reply.
async fn interpret(response: hyper::Response<hyper::body::Incoming>) {
    let (parts, mut body) = response.into_parts();
    let (status, headers) = (parts.status, parts.headers);
    match judge_pointer(URL, status, &headers, now()) {
        Ok(PointerAnswer::NotModified) => assert_eq!(status, 304),
        Ok(PointerAnswer::Body { etag }) => {
            assert!(status.is_success());
            assert!(etag.is_none_or(|etag| etag.len() <= 1024));
        }
        Err(error) => check_wait(&error),
    }
    if let Err(error) = judge(URL, status, &headers, now()) {
        check_wait(&error);
    } else {
        assert!(status.is_success());
    }
    if let Some(error) = http::busy(URL, status, &headers, now()) {
        check_wait(&error);
    }

    // The body, read as the agent reads it: refused past the cap, never kept beyond it.
    let length = headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    if http::check_length(length, CAP, "reply").is_err() {
        return;
    }
    let mut read = Vec::new();
    while let Some(Ok(frame)) = body.frame().await {
        let Ok(chunk) = frame.into_data() else {
            continue;
        };
        if http::append_capped(&mut read, &chunk, CAP, "reply").is_err() {
            break;
        }
        assert!(read.len() as u64 <= CAP);
    }

    match heartbeat::enroll_reply(URL, status, &read) {
        Ok(reply) => {
            assert!(status.is_success());
            let _ = reply.last_sequence.saturating_add(1);
        }
        Err(error) => check_quoted(&error),
    }
    match heartbeat::heartbeat_reply(URL, status, &read) {
        Ok(reply) => {
            let interval = clamp::heartbeat_interval(reply.next_interval_seconds);
            assert!(
                (clamp::MIN_HEARTBEAT_INTERVAL..=clamp::MAX_HEARTBEAT_INTERVAL).contains(&interval)
            );
            // The reporter's next timers, as it computes them.
            let next = jittered(interval, 0.2, 1.0);
            let _ = clamp::after(Instant::now(), next);
            let backoff = full_jitter(
                u32::MAX,
                Duration::from_secs(1),
                interval.max(Duration::from_secs(60)),
                1.0,
            );
            let _ = clamp::after(Instant::now(), backoff);
        }
        Err(error) => check_quoted(&error),
    }
}

/// A busy answer's wait is within bounds, and every wait built from it is a valid deadline.
fn check_wait(error: &Error) {
    if let Error::SourceBusy { retry_after, .. } = error {
        assert!((clamp::MIN_RETRY_AFTER..=clamp::MAX_RETRY_AFTER).contains(retry_after));
        for unit in [0.0, 0.5, 1.0] {
            let wait = after_busy(*retry_after, Duration::from_secs(300), unit);
            assert!(wait <= clamp::MAX_RETRY_AFTER.mul_f64(1.5));
            let _ = clamp::after(Instant::now(), wait);
            let _ = clamp::after_tokio(tokio::time::Instant::now(), wait);
        }
    }
}

/// An error quotes a bounded part of the peer's body (the URL, the status, a hint and at most
/// `MAX_QUOTED_CHARS` characters).
fn check_quoted(error: &Error) {
    let text = error.to_string();
    assert!(
        text.chars().count() <= clamp::MAX_QUOTED_CHARS + 400,
        "an error quoting too much: {} characters",
        text.chars().count()
    );
}
