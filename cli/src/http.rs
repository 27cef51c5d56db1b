//! The command line's I/O plumbing: the single-threaded runtime every store and HTTP call runs on, and the
//! source server's client. Replies come from a server that is not ours: each is read up to a cap, and the
//! server's error message is made safe for a terminal before it is shown.

use std::time::Duration;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::terminal::clean_line;

/// Most bytes read of one reply from a source server: a fleet view of tens of thousands of clusters fits.
const MAX_REPLY_BYTES: usize = 32 << 20;

/// A fresh single-threaded runtime.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    // reqwest is built without a bundled crypto provider; ring is the one provider in the whole workspace.
    let _ = rustls::crypto::ring::default_provider().install_default();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| Error::Runtime { source })
}

/// Runs one future to its end on a fresh single-threaded runtime (the store's and HTTP calls).
pub fn block_on<F: Future>(future: F) -> Result<F::Output> {
    Ok(runtime()?.block_on(future))
}

fn client() -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|source| Error::HttpClient { source })
}

/// `GET url` (with a bearer token when given): the body of a successful reply; a non-success status is an
/// error carrying the server's message.
pub fn get(url: &str, token: Option<&str>) -> Result<Vec<u8>> {
    let request = format!("GET {url}");
    block_on(async {
        let mut builder = client()?.get(url);
        if let Some(token) = token {
            builder = builder.bearer_auth(token);
        }
        send(builder, &request, &request).await
    })?
}

/// `GET url` read as JSON of type `T`.
pub fn get_json<T: serde::de::DeserializeOwned>(url: &str, token: Option<&str>) -> Result<T> {
    let body = get(url, token)?;
    serde_json::from_slice(&body).map_err(|source| Error::UnexpectedJson {
        request: format!("GET {url}"),
        source,
    })
}

/// `POST url` with a bearer token; the body of a successful reply. A refusal is said as `refused_as: status:
/// message`.
pub fn post(url: &str, token: &str, refused_as: &str) -> Result<Vec<u8>> {
    block_on(async {
        let builder = client()?.post(url).bearer_auth(token);
        send(builder, &format!("POST {url}"), refused_as).await
    })?
}

async fn send(
    builder: reqwest::RequestBuilder,
    request: &str,
    refused_as: &str,
) -> Result<Vec<u8>> {
    let response = builder.send().await.map_err(|source| Error::Request {
        request: request.to_owned(),
        source,
    })?;
    let status = response.status();
    let body = read_capped(response, MAX_REPLY_BYTES, request).await?;
    if !status.is_success() {
        return Err(Error::Refused {
            request: refused_as.to_owned(),
            status,
            message: error_message(&body),
        });
    }
    Ok(body)
}

/// Reads a reply's body, refusing it (without reading further) when it is larger than `cap` bytes.
async fn read_capped(
    mut response: reqwest::Response,
    cap: usize,
    request: &str,
) -> Result<Vec<u8>> {
    let too_large = || Error::ReplyTooLarge {
        request: request.to_owned(),
        cap,
    };
    if response
        .content_length()
        .is_some_and(|len| len > cap as u64)
    {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|source| Error::Request {
        request: request.to_owned(),
        source,
    })? {
        if body.len() + chunk.len() > cap {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The server's error message (its JSON `error`, else the start of the body), made safe for a terminal.
fn error_message(body: &[u8]) -> String {
    let text = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned());
    clean_line(&text)
}
