//! The static store as `windvane-server` serves it, over real HTTP on loopback: conditional GETs (200, then
//! 304 for the same ETag), HEAD, gzip, cache headers, a new ETag after a publish, and every path-traversal
//! and odd-method attempt refused with a 4xx.

use std::io::Read as _;

use windvane_tests::http::client;
use windvane_tests::poll::eventually;
use windvane_tests::server::{CHANNEL, Options, ServerProcess, write_store};

#[tokio::test]
async fn pointers_answer_304_to_their_etag_and_change_after_a_publish() {
    let server = ServerProcess::start(Options::default());
    let http = client();
    let url = format!("{}/channels/{CHANNEL}.json", server.url);
    let pointer =
        std::fs::read(server.root().join(format!("channels/{CHANNEL}.json"))).expect("read");

    let first = http.get(&url).send().await.expect("GET");
    assert_eq!(first.status(), 200);
    let headers = first.headers().clone();
    let etag = headers["etag"].to_str().expect("etag").to_owned();
    assert_eq!(
        etag,
        format!(
            "\"{}\"",
            windvane_shared::crypto::digest::sha256_hex(&pointer)
        ),
        "strong ETag = sha256"
    );
    assert_eq!(headers["cache-control"], "no-cache");
    assert_eq!(headers["content-type"], "application/json");
    assert!(
        headers.get("content-encoding").is_none(),
        "no gzip unless asked"
    );
    assert_eq!(first.bytes().await.expect("body"), pointer);

    let not_modified = http
        .get(&url)
        .header("if-none-match", &etag)
        .send()
        .await
        .expect("GET");
    assert_eq!(not_modified.status(), 304);
    assert_eq!(not_modified.headers()["etag"], etag.as_str());
    assert!(not_modified.bytes().await.expect("body").is_empty());

    let weak = http
        .get(&url)
        .header("if-none-match", format!("W/{etag}"))
        .send()
        .await
        .expect("GET");
    assert_eq!(weak.status(), 304, "If-None-Match uses weak comparison");
    let other = http
        .get(&url)
        .header("if-none-match", "\"something-else\"")
        .send()
        .await
        .expect("GET");
    assert_eq!(other.status(), 200);

    let head = http.head(&url).send().await.expect("HEAD");
    assert_eq!(head.status(), 200);
    assert_eq!(head.headers()["etag"], etag.as_str());
    assert_eq!(
        head.headers()["content-length"],
        pointer.len().to_string().as_str()
    );
    assert!(head.bytes().await.expect("body").is_empty());

    // Publishing a new pointer (write, rename) changes the ETag within the cache's revalidation period
    // (100 ms); a second is the deadline here so that a loaded machine does not fail the test.
    write_store(&server.root(), 5);
    let published = std::time::Instant::now();
    let changed = eventually(
        "the new pointer to be served",
        std::time::Duration::from_secs(1),
        || async {
            let answer = http
                .get(&url)
                .header("if-none-match", &etag)
                .send()
                .await
                .expect("GET");
            (answer.status() != 304).then_some(answer)
        },
    )
    .await;
    assert_eq!(changed.status(), 200, "a new pointer is not 'not modified'");
    assert_ne!(changed.headers()["etag"], etag.as_str());
    eprintln!(
        "new pointer served {:?} after the publish",
        published.elapsed()
    );
}

#[tokio::test]
async fn bundles_are_immutable_and_gzipped_when_accepted() {
    let server = ServerProcess::start(Options::default());
    let http = client();
    let (bundle, sha256) = write_store(&server.root(), 4);
    let url = format!("{}/bundles/{sha256}.json", server.url);

    let plain = http.get(&url).send().await.expect("GET");
    assert_eq!(plain.status(), 200);
    assert_eq!(
        plain.headers()["etag"],
        format!("\"{sha256}\"").as_str(),
        "a bundle's ETag is its name"
    );
    assert_eq!(
        plain.headers()["cache-control"],
        "public, max-age=31536000, immutable"
    );
    assert_eq!(plain.bytes().await.expect("body"), bundle);

    let gz = http
        .get(&url)
        .header("accept-encoding", "br;q=1, gzip;q=0.8")
        .send()
        .await
        .expect("GET");
    assert_eq!(gz.status(), 200);
    assert_eq!(gz.headers()["content-encoding"], "gzip");
    assert_eq!(gz.headers()["vary"], "Accept-Encoding");
    let gz_etag = gz.headers()["etag"].to_str().expect("etag").to_owned();
    assert_ne!(
        gz_etag,
        format!("\"{sha256}\""),
        "the gzip representation has its own strong ETag"
    );
    let compressed = gz.bytes().await.expect("body");
    assert!(compressed.len() < bundle.len());
    let mut decoded = Vec::new();
    flate2::read::GzDecoder::new(&compressed[..])
        .read_to_end(&mut decoded)
        .expect("gunzip");
    assert_eq!(decoded, bundle);

    for tag in [gz_etag.as_str(), &format!("\"{sha256}\"")] {
        let again = http
            .get(&url)
            .header("accept-encoding", "gzip")
            .header("if-none-match", tag)
            .send()
            .await
            .expect("GET");
        assert_eq!(again.status(), 304, "{tag}");
    }
    let refused = http
        .get(&url)
        .header("accept-encoding", "gzip;q=0")
        .send()
        .await
        .expect("GET");
    assert!(refused.headers().get("content-encoding").is_none());
}

#[tokio::test]
async fn traversal_listing_and_odd_methods_are_refused() {
    let server = ServerProcess::start(Options::default());
    let outside = server.dir.join("secret.json");
    std::fs::write(&outside, b"{\"secret\":true}").expect("write");
    std::os::unix::fs::symlink(&outside, server.root().join("channels/leak.json"))
        .expect("symlink");
    std::fs::write(server.root().join("channels/.hidden.json"), b"{}").expect("write");

    let attempts = [
        "/channels/../../secret.json",
        "/channels/%2e%2e/%2e%2e/secret.json",
        "/channels/%2E%2E%2F%2E%2E%2Fsecret.json",
        "/channels/..%2f..%2fsecret.json",
        "/bundles/..%5c..%5csecret.json",
        "/channels/%2fetc%2fpasswd",
        "/channels/./stable.json",
        "/channels//stable.json",
        "/channels/stable.json/",
        "/channels/stable.json%00",
        "/channels/",
        "/channels",
        "/bundles/",
        "/root/channels/stable.json",
        "/channels/leak.json",
        "/channels/.hidden.json",
        "/channels/.stable.json.tmp",
        "/channels/Stable.json",
        "/bundles/notadigest.json",
        "/etc/passwd",
        "/secret.json",
        "/server.log",
        "/data/windvane.db",
    ];
    for path in attempts {
        // reqwest normalises dot segments in URLs, so send the raw request line over TCP.
        let status = raw_status(&server.url, "GET", path).await;
        assert!((400..500).contains(&status), "{path}: {status}");
    }
    for method in [
        "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "PROPFIND",
    ] {
        let status = raw_status(&server.url, method, &format!("/channels/{CHANNEL}.json")).await;
        assert_eq!(status, 405, "{method}");
    }
    assert_eq!(
        raw_status(&server.url, "GET", &format!("/channels/{CHANNEL}.json")).await,
        200,
        "the control"
    );
}

/// Sends one raw HTTP/1.1 request line and returns the status code.
async fn raw_status(base: &str, method: &str, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let addr = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response);
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{method} {path}: no status in {text:?}"))
}
