//! The HTTP client side shared by the source client ([`crate::fetch::source`]) and the heartbeat reporter
//! ([`crate::report::heartbeat`]): reading a body with a size cap and a total deadline, and judging a reply's
//! status and headers. The judgement is pure — (status, headers) in, a decision out — so that it can be fuzzed
//! with hostile answers; the reading is the thin I/O around it. Every number in a reply goes through
//! [`crate::clamp`].

use std::time::Duration;

use jiff::Timestamp;
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, RETRY_AFTER};

use crate::{Error, Result, clamp};

/// A 429 or 503: the peer is busy and says (in `Retry-After`, clamped) when to come back. `None` for any
/// other status.
pub fn busy(url: &str, status: StatusCode, headers: &HeaderMap, now: Timestamp) -> Option<Error> {
    matches!(
        status,
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
    )
    .then(|| Error::SourceBusy {
        url: url.to_owned(),
        retry_after: clamp::retry_after(headers.get(RETRY_AFTER).map(|v| v.as_bytes()), now),
    })
}

/// Refuses a body announced (in `Content-Length`) as longer than `cap`, before reading any of it.
pub fn check_length(content_length: Option<u64>, cap: u64, what: &'static str) -> Result<()> {
    if content_length.is_some_and(|len| len > cap) {
        return Err(too_big(what, cap));
    }
    Ok(())
}

/// Appends `chunk` to `body`, refusing (without keeping it) what would take the body over `cap`.
pub fn append_capped(body: &mut Vec<u8>, chunk: &[u8], cap: u64, what: &'static str) -> Result<()> {
    if (body.len() as u64).saturating_add(chunk.len() as u64) > cap {
        return Err(too_big(what, cap));
    }
    body.extend_from_slice(chunk);
    Ok(())
}

fn too_big(what: &'static str, cap: u64) -> Error {
    Error::Release(windvane_shared::Error::SizeCap { what, limit: cap })
}

/// Reads a response's body, whatever its status, refusing (and reading no further) anything over `cap`.
/// The caller bounds the whole request with [`with_deadline`].
pub async fn read_capped(
    url: &str,
    mut response: reqwest::Response,
    cap: u64,
    what: &'static str,
) -> Result<Vec<u8>> {
    check_length(response.content_length(), cap, what)?;
    // Sized once when the length is announced (it is within the cap): no copies while growing.
    let announced = response.content_length().unwrap_or(0).min(cap);
    let mut body = Vec::with_capacity(usize::try_from(announced).unwrap_or(0));
    while let Some(chunk) = response.chunk().await.map_err(|e| fetch_error(url, &e))? {
        append_capped(&mut body, &chunk, cap, what)?;
    }
    Ok(body)
}

/// Runs one whole request — connecting, sending, reading the body — within `deadline`: a peer that accepts
/// and never answers, or trickles a byte at a time, is given up on when it passes.
pub async fn with_deadline<T>(
    url: &str,
    deadline: Duration,
    request: impl Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(deadline, request)
        .await
        .unwrap_or_else(|_| {
            Err(Error::Fetch {
                url: url.to_owned(),
                detail: format!(
                    "no complete answer within {} s (total deadline)",
                    deadline.as_secs()
                ),
            })
        })
}

/// The error of a request that failed on the network, naming the URL.
pub fn fetch_error(url: &str, error: &reqwest::Error) -> Error {
    let detail = if error.is_timeout() {
        "timed out".to_owned()
    } else if error.is_connect() {
        format!("cannot connect: {error}")
    } else {
        error.to_string()
    };
    Error::Fetch {
        url: url.to_owned(),
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn busy_answers_carry_the_clamped_wait() {
        let now = Timestamp::UNIX_EPOCH;
        let mut headers = HeaderMap::new();
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("18446744073709551615"),
        );
        match busy("u", StatusCode::SERVICE_UNAVAILABLE, &headers, now) {
            Some(Error::SourceBusy { retry_after, .. }) => {
                assert_eq!(retry_after, clamp::MAX_RETRY_AFTER);
            }
            other => panic!("{other:?}"),
        }
        assert!(busy("u", StatusCode::OK, &headers, now).is_none());
        assert!(busy("u", StatusCode::INTERNAL_SERVER_ERROR, &headers, now).is_none());
    }

    #[test]
    fn bodies_stop_at_the_cap() {
        assert!(check_length(Some(11), 10, "x").is_err());
        assert!(check_length(Some(10), 10, "x").is_ok());
        assert!(check_length(None, 10, "x").is_ok());
        let mut body = Vec::new();
        append_capped(&mut body, b"12345", 8, "x").unwrap();
        assert!(append_capped(&mut body, b"6789", 8, "x").is_err());
        assert_eq!(body, b"12345", "the refused chunk is not kept");
    }
}
