//! The agent's view of the static store: polls the channel pointer with `If-None-Match` and fetches bundles
//! by digest, reading no more than a cap, honouring `Retry-After`. It only moves bytes; everything it returns
//! is verified by `windvane_shared::format::release` before anything parses it.

use std::time::Duration;

use jiff::Timestamp;
use reqwest::StatusCode;
use reqwest::header::{ETAG, HeaderMap, IF_NONE_MATCH};

use crate::fetch::http::{self, fetch_error, read_capped, with_deadline};
use crate::{Error, Result};

/// The longest ETag remembered (and sent back in `If-None-Match`); a longer one is not kept.
const MAX_ETAG_BYTES: usize = 1024;

/// Caps and timeouts for talking to the source.
#[derive(Debug, Clone)]
pub struct SourceLimits {
    pub max_pointer_bytes: u64,
    pub max_bundle_bytes: u64,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    /// Total deadline of one pointer poll (connect, send, read the whole body).
    pub pointer_deadline: Duration,
    /// Total deadline of one bundle fetch.
    pub bundle_deadline: Duration,
    /// How long a store that holds polls (`windvane-server`) may hold one while the pointer is unchanged
    /// (`Prefer: wait=N`); zero asks for no holding.
    pub long_poll_wait: Duration,
}

impl Default for SourceLimits {
    fn default() -> Self {
        Self {
            max_pointer_bytes: windvane_shared::format::release::DEFAULT_MAX_POINTER_BYTES,
            max_bundle_bytes: windvane_shared::format::release::DEFAULT_MAX_BUNDLE_BYTES,
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(60),
            pointer_deadline: Duration::from_secs(30),
            bundle_deadline: Duration::from_secs(300),
            long_poll_wait: Duration::from_secs(60),
        }
    }
}

/// The outcome of one poll of the channel pointer.
#[derive(Debug, PartialEq, Eq)]
pub enum Poll {
    /// `304 Not Modified`: same pointer as last time.
    Unchanged,
    /// A pointer body, not yet verified.
    Changed(Vec<u8>),
}

/// A client for one channel of one store.
#[derive(Debug)]
pub struct SourceClient {
    http: reqwest::Client,
    base: String,
    channel: String,
    limits: SourceLimits,
    etag: Option<String>,
    /// Whether the store's last answer said it holds polls (`Preference-Applied: wait=N`).
    holds_polls: bool,
}

impl SourceClient {
    /// A client for `base` (the store's URL) and `channel`.
    pub fn new(base: &str, channel: &str, limits: SourceLimits) -> Result<Self> {
        // A held poll sends nothing until the pointer changes or the wait ends.
        let read_timeout = limits
            .read_timeout
            .max(limits.long_poll_wait + Duration::from_secs(15));
        let http = reqwest::Client::builder()
            .connect_timeout(limits.connect_timeout)
            .read_timeout(read_timeout)
            .user_agent(concat!("windvane-agent/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::Config(format!("HTTP client: {e}")))?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
            channel: channel.to_owned(),
            limits,
            etag: None,
            holds_polls: false,
        })
    }

    /// Whether the store holds polls until the pointer changes: then the next poll can follow at once.
    pub fn holds_polls(&self) -> bool {
        self.holds_polls
    }

    /// The pointer's URL.
    pub fn pointer_url(&self) -> String {
        format!("{}/channels/{}.json", self.base, self.channel)
    }

    /// Forgets the ETag, so that the next poll fetches the pointer whole (after a refusal, to re-check).
    pub fn forget_etag(&mut self) {
        self.etag = None;
    }

    /// Polls the channel pointer, within the pointer deadline. The ETag is remembered only after a body was
    /// read whole.
    pub async fn poll_pointer(&mut self) -> Result<Poll> {
        let url = self.pointer_url();
        // Only a store that said it holds polls may take the wait on top of the deadline, and only when it
        // has an ETag to compare: a static host that stalls is given up on as before.
        let may_hold = self.holds_polls && self.etag.is_some();
        let deadline = self.limits.pointer_deadline
            + if may_hold {
                self.limits.long_poll_wait
            } else {
                Duration::ZERO
            };
        self.holds_polls = false;
        let (poll, etag, holds) = with_deadline(&url, deadline, self.request_pointer(&url)).await?;
        self.holds_polls = holds;
        if let Poll::Changed(_) = poll {
            self.etag = etag;
        }
        Ok(poll)
    }

    async fn request_pointer(&self, url: &str) -> Result<(Poll, Option<String>, bool)> {
        let mut request = self.http.get(url);
        if let Some(etag) = &self.etag {
            request = request.header(IF_NONE_MATCH, etag);
        }
        let wait = self.limits.long_poll_wait.as_secs();
        if wait > 0 {
            request = request.header("prefer", format!("wait={wait}"));
        }
        let response = request.send().await.map_err(|e| fetch_error(url, &e))?;
        let holds = holds_polls(response.headers());
        match judge_pointer(url, response.status(), response.headers(), Timestamp::now())? {
            PointerAnswer::NotModified => Ok((Poll::Unchanged, None, holds)),
            PointerAnswer::Body { etag } => {
                let cap = self.limits.max_pointer_bytes;
                let body = read_capped(url, response, cap, "channel pointer").await?;
                Ok((Poll::Changed(body), etag, holds))
            }
        }
    }

    /// Fetches a bundle by digest, reading at most the bundle cap, within the bundle deadline.
    pub async fn fetch_bundle(&self, sha256: &str) -> Result<Vec<u8>> {
        let url = format!("{}/bundles/{sha256}.json", self.base);
        with_deadline(&url, self.limits.bundle_deadline, async {
            let response = self
                .http
                .get(&url)
                .send()
                .await
                .map_err(|e| fetch_error(&url, &e))?;
            judge(
                &url,
                response.status(),
                response.headers(),
                Timestamp::now(),
            )?;
            read_capped(&url, response, self.limits.max_bundle_bytes, "bundle").await
        })
        .await
    }
}

/// Whether a store's answer says it held (or would hold) the poll: `Preference-Applied: wait=N` (RFC 7240).
/// Pure.
pub fn holds_polls(headers: &HeaderMap) -> bool {
    headers
        .get_all("preference-applied")
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|preference| {
            preference
                .split(['=', ';'])
                .next()
                .is_some_and(|name| name.trim().eq_ignore_ascii_case("wait"))
        })
}

/// What a reply to a pointer poll means, from its status and headers alone. Pure.
#[derive(Debug, PartialEq, Eq)]
pub enum PointerAnswer {
    /// `304 Not Modified`: nothing to read, nothing to verify.
    NotModified,
    /// A body to read, and the ETag to remember once it was read whole.
    Body { etag: Option<String> },
}

/// Judges a reply to a pointer poll: 304, busy (with the clamped `Retry-After`), failed, or a body to read.
pub fn judge_pointer(
    url: &str,
    status: StatusCode,
    headers: &HeaderMap,
    now: Timestamp,
) -> Result<PointerAnswer> {
    if status == StatusCode::NOT_MODIFIED {
        return Ok(PointerAnswer::NotModified);
    }
    judge(url, status, headers, now)?;
    let etag = headers
        .get(ETAG)
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.len() <= MAX_ETAG_BYTES)
        .map(str::to_owned);
    Ok(PointerAnswer::Body { etag })
}

/// Judges a reply whose body is wanted: busy (429/503, with the clamped `Retry-After`), failed (any other
/// non-2xx), or fine. Pure.
pub fn judge(url: &str, status: StatusCode, headers: &HeaderMap, now: Timestamp) -> Result<()> {
    if let Some(busy) = http::busy(url, status, headers, now) {
        return Err(busy);
    }
    if !status.is_success() {
        return Err(Error::Fetch {
            url: url.to_owned(),
            detail: format!("HTTP {status}"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(
                "preference-applied",
                HeaderValue::from_str(value).expect("header"),
            );
        }
        headers
    }

    #[test]
    fn only_an_applied_wait_preference_means_the_store_holds_polls() {
        assert!(holds_polls(&headers(&["wait=60"])));
        assert!(holds_polls(&headers(&["return=minimal, Wait=5"])));
        assert!(holds_polls(&headers(&["return=minimal", "wait=5;x=y"])));
        assert!(!holds_polls(&headers(&[])));
        assert!(!holds_polls(&headers(&["return=minimal"])));
        assert!(!holds_polls(&headers(&["waiting=5"])));
    }
}
