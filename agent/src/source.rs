//! The agent's view of the static store: polls the channel pointer with `If-None-Match` and fetches bundles
//! by digest, reading no more than a cap, honouring `Retry-After`. It only moves bytes; everything it returns
//! is verified by `windvane_shared::release` before anything parses it.

use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::{ETAG, IF_NONE_MATCH, RETRY_AFTER};

use crate::{Error, Result};

/// Caps and timeouts for talking to the source.
#[derive(Debug, Clone)]
pub struct SourceLimits {
    pub max_pointer_bytes: u64,
    pub max_bundle_bytes: u64,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
}

impl Default for SourceLimits {
    fn default() -> Self {
        Self {
            max_pointer_bytes: windvane_shared::release::DEFAULT_MAX_POINTER_BYTES,
            max_bundle_bytes: windvane_shared::release::DEFAULT_MAX_BUNDLE_BYTES,
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(60),
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
}

impl SourceClient {
    /// A client for `base` (the store's URL) and `channel`.
    pub fn new(base: &str, channel: &str, limits: SourceLimits) -> Result<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(limits.connect_timeout)
            .read_timeout(limits.read_timeout)
            .user_agent(concat!("windvane-agent/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::Config(format!("HTTP client: {e}")))?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
            channel: channel.to_owned(),
            limits,
            etag: None,
        })
    }

    /// The pointer's URL.
    pub fn pointer_url(&self) -> String {
        format!("{}/channels/{}.json", self.base, self.channel)
    }

    /// Forgets the ETag, so that the next poll fetches the pointer whole (after a refusal, to re-check).
    pub fn forget_etag(&mut self) {
        self.etag = None;
    }

    /// Polls the channel pointer. The ETag is remembered only after a body was read whole.
    pub async fn poll_pointer(&mut self) -> Result<Poll> {
        let url = self.pointer_url();
        let mut request = self.http.get(&url);
        if let Some(etag) = &self.etag {
            request = request.header(IF_NONE_MATCH, etag);
        }
        let response = request.send().await.map_err(|e| fetch_error(&url, &e))?;
        if response.status() == StatusCode::NOT_MODIFIED {
            return Ok(Poll::Unchanged);
        }
        let etag = response
            .headers()
            .get(ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = read_capped(
            &url,
            response,
            self.limits.max_pointer_bytes,
            "channel pointer",
        )
        .await?;
        self.etag = etag;
        Ok(Poll::Changed(body))
    }

    /// Fetches a bundle by digest, reading at most the bundle cap.
    pub async fn fetch_bundle(&self, sha256: &str) -> Result<Vec<u8>> {
        let url = format!("{}/bundles/{sha256}.json", self.base);
        let response = self
            .http
            .get(&url)
            .send()
            .await
            .map_err(|e| fetch_error(&url, &e))?;
        read_capped(&url, response, self.limits.max_bundle_bytes, "bundle").await
    }
}

fn fetch_error(url: &str, error: &reqwest::Error) -> Error {
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

/// Reads a successful response's body, refusing (without reading further) anything over `cap`.
async fn read_capped(
    url: &str,
    mut response: reqwest::Response,
    cap: u64,
    what: &'static str,
) -> Result<Vec<u8>> {
    let status = response.status();
    if matches!(
        status,
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
    ) {
        return Err(Error::SourceBusy {
            url: url.to_owned(),
            retry_after: retry_after(response.headers()),
        });
    }
    if !status.is_success() {
        return Err(Error::Fetch {
            url: url.to_owned(),
            detail: format!("HTTP {status}"),
        });
    }
    let too_big = || Error::Release(windvane_shared::Error::SizeCap { what, limit: cap });
    if response.content_length().is_some_and(|len| len > cap) {
        return Err(too_big());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| fetch_error(url, &e))? {
        if (body.len() + chunk.len()) as u64 > cap {
            return Err(too_big());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The wait a 429 or 503 asks for in `Retry-After` (delay-seconds); 30 s when it says nothing usable.
pub(crate) fn retry_after(headers: &reqwest::header::HeaderMap) -> Duration {
    headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(Duration::from_secs(30), Duration::from_secs)
}
