//! HTTP helpers of the server tests: a client that shows the bytes on the wire (no decompression), one
//! from another loopback address, and assertions on JSON answers and refusals.

use std::time::Duration;

/// An HTTP client that does not decompress (so tests see the bytes on the wire).
pub fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_gzip()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// Like [`client`], but connecting from `local` (another loopback address is another client address to the
/// server), and opening a fresh connection for every request.
pub fn client_from(local: std::net::IpAddr) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_gzip()
        .local_address(local)
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// JSON of a GET, asserting 200.
pub async fn get_json(http: &reqwest::Client, url: &str) -> serde_json::Value {
    let response = http.get(url).send().await.expect("GET");
    assert_eq!(response.status(), 200, "GET {url}");
    json_of(response).await
}

/// The body of a response as JSON.
pub async fn json_of(response: reqwest::Response) -> serde_json::Value {
    let bytes = response.bytes().await.expect("body");
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
}

/// Asserts that `response` is a refusal with `status` and the JSON `reason`, and a non-empty `error` message;
/// returns the message.
pub async fn assert_refused(response: reqwest::Response, status: u16, reason: &str) -> String {
    assert_eq!(response.status(), status);
    let body = json_of(response).await;
    assert_eq!(body["reason"], reason, "{body}");
    let message = body["error"].as_str().unwrap_or_default().to_owned();
    assert!(!message.is_empty(), "{body}");
    message
}

/// A JSON POST body.
pub fn json_body<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("json")
}
