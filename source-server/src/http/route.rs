//! Request routing and header decisions as pure functions: which handler a method and raw path go to, and
//! the conditional-request and content-negotiation rules of the static store. The server (`super`) feeds
//! them hyper's method, raw path and headers and acts on the answer; nothing here does I/O.
//!
//! Only the store's own layout is ever served: `channels/<channel>.json` with a valid channel name and
//! `bundles/<sha256>.json` with 64 lower-case hex digits, and `approvals/<channel>/<serial>.json` (a
//! decimal serial). Anything else under the store — listings, dot
//! segments, percent-encoding (so no encoded `../`), doubled slashes, backslashes — is refused before a file
//! name is built.

use hyper::Method;

use windvane_store::check_channel_name;

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `GET|HEAD /channels/<channel>.json`
    Pointer(String),
    /// `GET|HEAD /bundles/<sha256>.json`
    Bundle(String),
    /// `GET|HEAD /approvals/<channel>/<serial>.json`
    Approval(String, u64),
    /// `GET /`: the fleet page.
    FleetPage,
    /// `GET /clusters/<name>`: one cluster's page.
    ClusterPage(String),
    /// `GET /api/v1/fleet`
    ApiFleet,
    /// `GET /api/v1/clusters`
    ApiClusters,
    /// `GET /api/v1/clusters/<name>`
    ApiCluster(String),
    /// `GET /api/v1/drift`
    ApiDrift,
    /// `GET /api/v1/rollouts/<channel>`
    ApiRollout(String),
    /// `GET /rollouts/<channel>`: the rollout page.
    RolloutPage(String),
    /// `GET /api/v1/break-glass`
    ApiBreakGlass,
    /// `POST /api/v1/clusters/<name>/enroll`
    Enroll(String),
    /// `POST /api/v1/clusters/<name>/heartbeat`
    Heartbeat(String),
    /// `POST /api/v1/clusters/<name>/rekey` (admin)
    Rekey(String),
    /// `POST /api/v1/clusters/<name>/forget` (admin)
    Forget(String),
    Metrics,
    Livez,
    Readyz,
    /// The path exists but not with this method; the value is the `Allow` header.
    MethodNotAllowed(&'static str),
    /// A path that is malformed or tries to leave the store's layout.
    BadPath,
    NotFound,
}

const GET_HEAD: &str = "GET, HEAD";
const POST: &str = "POST";

/// Routes a request by method and raw (still percent-encoded) path, without its query.
pub fn route(method: &Method, path: &str) -> Route {
    if !path_is_clean(path) {
        return Route::BadPath;
    }
    let is_read = method == Method::GET || method == Method::HEAD;
    let is_post = method == Method::POST;
    let read = |route: Route| {
        if is_read {
            route
        } else {
            Route::MethodNotAllowed(GET_HEAD)
        }
    };
    let post = |route: Route| {
        if is_post {
            route
        } else {
            Route::MethodNotAllowed(POST)
        }
    };

    let segments: Vec<&str> = path[1..].split('/').collect();
    match segments.as_slice() {
        ["channels", file] => match file.strip_suffix(".json") {
            Some(channel) if check_channel_name(channel).is_ok() => {
                read(Route::Pointer(channel.to_owned()))
            }
            _ => Route::NotFound,
        },
        ["bundles", file] => match file.strip_suffix(".json") {
            Some(digest) if windvane_shared::crypto::digest::is_sha256_hex(digest) => {
                read(Route::Bundle(digest.to_owned()))
            }
            _ => Route::NotFound,
        },
        ["approvals", channel, file] if check_channel_name(channel).is_ok() => {
            match file.strip_suffix(".json").map(str::parse::<u64>) {
                Some(Ok(serial)) if !file.starts_with('+') && !file.starts_with('0') => {
                    read(Route::Approval((*channel).to_owned(), serial))
                }
                _ => Route::NotFound,
            }
        }
        ["channels" | "bundles" | "approvals", ..] => Route::NotFound,
        [""] => read(Route::FleetPage),
        ["clusters", name] if valid_cluster_name(name) => {
            read(Route::ClusterPage((*name).to_owned()))
        }
        ["livez"] => read(Route::Livez),
        ["readyz"] => read(Route::Readyz),
        ["metrics"] => read(Route::Metrics),
        ["api", "v1", "fleet"] => read(Route::ApiFleet),
        ["api", "v1", "clusters"] => read(Route::ApiClusters),
        ["api", "v1", "drift"] => read(Route::ApiDrift),
        ["api", "v1", "rollouts", channel] if check_channel_name(channel).is_ok() => {
            read(Route::ApiRollout((*channel).to_owned()))
        }
        ["rollouts", channel] if check_channel_name(channel).is_ok() => {
            read(Route::RolloutPage((*channel).to_owned()))
        }
        ["api", "v1", "break-glass"] => read(Route::ApiBreakGlass),
        ["api", "v1", "clusters", name] if valid_cluster_name(name) => {
            read(Route::ApiCluster((*name).to_owned()))
        }
        ["api", "v1", "clusters", name, action] if valid_cluster_name(name) => {
            let name = (*name).to_owned();
            match *action {
                "enroll" => post(Route::Enroll(name)),
                "heartbeat" => post(Route::Heartbeat(name)),
                "rekey" => post(Route::Rekey(name)),
                "forget" => post(Route::Forget(name)),
                _ => Route::NotFound,
            }
        }
        _ => Route::NotFound,
    }
}

/// A path the server is willing to look at: absolute, printable ASCII, no percent-encoding, no dot segments,
/// no empty segment except the root, no backslash.
fn path_is_clean(path: &str) -> bool {
    if !path.starts_with('/') || path.len() > 1024 {
        return false;
    }
    if !path.bytes().all(|b| b.is_ascii_graphic()) || path.contains(['%', '\\']) {
        return false;
    }
    if path == "/" {
        return true;
    }
    path[1..]
        .split('/')
        .all(|segment| !segment.is_empty() && segment != "." && segment != "..")
}

/// A cluster name: 1–253 characters of lower-case letters, digits, `-` and `.`, starting and ending with a
/// letter or digit (a DNS subdomain, as Kubernetes names are).
pub fn valid_cluster_name(name: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    (1..=253).contains(&name.len())
        && name.bytes().all(|b| alnum(b) || b == b'-' || b == b'.')
        && name.bytes().next().is_some_and(alnum)
        && name.bytes().last().is_some_and(alnum)
        && !name.contains("..")
}

/// Whether an `If-None-Match` header value matches any of `etags` (each with its quotes), with the weak
/// comparison RFC 9110 prescribes for `If-None-Match`; `*` matches anything.
pub fn if_none_match(header: &[u8], etags: &[&[u8]]) -> bool {
    let header = trim(header);
    if header == b"*" {
        return true;
    }
    header.split(|b| *b == b',').any(|candidate| {
        let candidate = trim(candidate);
        let candidate = candidate.strip_prefix(b"W/").unwrap_or(candidate);
        etags
            .iter()
            .any(|etag| !candidate.is_empty() && candidate == *etag)
    })
}

fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |i| i + 1);
    &bytes[start..end]
}

/// Whether an `Accept-Encoding` header value accepts gzip (`gzip`, `x-gzip` or `*` with a non-zero q).
pub fn accepts_gzip(header: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(header) else {
        return false;
    };
    let mut gzip: Option<bool> = None;
    let mut star: Option<bool> = None;
    for item in text.split(',') {
        let mut parts = item.split(';');
        let coding = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let accepted = parts.all(|p| {
            let p = p.trim();
            match p.strip_prefix("q=").or_else(|| p.strip_prefix("Q=")) {
                Some(q) => q.trim().parse::<f32>().map(|q| q > 0.0).unwrap_or(false),
                None => true,
            }
        });
        match coding.as_str() {
            "gzip" | "x-gzip" => gzip = Some(accepted),
            "*" => star = Some(accepted),
            _ => {}
        }
    }
    gzip.or(star).unwrap_or(false)
}

/// The value of one query parameter (first occurrence), percent-decoded; and every value of a repeatable one.
pub fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    query_params(query, name).into_iter().next()
}

/// Every value of a query parameter, percent-decoded, in order.
pub fn query_params(query: Option<&str>, name: &str) -> Vec<String> {
    let Some(query) = query else {
        return Vec::new();
    };
    form_urlencoded::parse(query.as_bytes())
        .filter(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    #[test]
    fn rollout_paths_route_by_channel() {
        assert_eq!(
            route(&Method::GET, "/api/v1/rollouts/prod"),
            Route::ApiRollout("prod".into())
        );
        assert_eq!(
            route(&Method::GET, "/rollouts/prod"),
            Route::RolloutPage("prod".into())
        );
        assert_eq!(
            route(&Method::GET, "/api/v1/rollouts/Bad!"),
            Route::NotFound
        );
        assert_eq!(
            route(&Method::POST, "/api/v1/rollouts/prod"),
            Route::MethodNotAllowed(GET_HEAD)
        );
    }

    #[test]
    fn store_paths_route_to_files() {
        assert_eq!(
            route(&Method::GET, "/approvals/prod/42.json"),
            Route::Approval("prod".into(), 42)
        );
        for bad in [
            "/approvals/prod/042.json",
            "/approvals/prod/x.json",
            "/approvals/prod/+4.json",
        ] {
            assert_eq!(route(&Method::GET, bad), Route::NotFound, "{bad}");
        }
        assert_eq!(
            route(&Method::GET, "/channels/prod.json"),
            Route::Pointer("prod".into())
        );
        assert_eq!(
            route(&Method::HEAD, "/channels/prod.json"),
            Route::Pointer("prod".into())
        );
        assert_eq!(
            route(&Method::GET, &format!("/bundles/{DIGEST}.json")),
            Route::Bundle(DIGEST.into())
        );
    }

    #[test]
    fn traversal_and_odd_paths_are_refused() {
        for path in [
            "/channels/../../etc/passwd",
            "/channels/%2e%2e/%2e%2e/etc/passwd",
            "/channels/..%2f..%2fetc%2fpasswd",
            "/channels/%2E%2E%2Fsecret.json",
            "/bundles/..%5c..%5cetc",
            "/channels/./prod.json",
            "/channels//prod.json",
            "//channels/prod.json",
            "/channels/prod.json/",
            "/channels\\prod.json",
            "/channels/prod.json%00",
            "/channels/pr od.json",
            "channels/prod.json",
            "/..",
            "/channels/",
            "/bundles/",
        ] {
            assert_eq!(route(&Method::GET, path), Route::BadPath, "{path}");
        }
        for path in [
            "/channels",
            "/bundles",
            "/channels/Prod.json",
            "/channels/.hidden.json",
            "/channels/.prod.json.tmp",
            "/channels/prod.json.tmp",
            "/channels/prod",
            "/channels/a/b.json",
            "/bundles/abc.json",
            &format!("/bundles/{}.json", DIGEST.to_uppercase()),
            &format!("/bundles/{DIGEST}.json.gz"),
            "/store/channels/prod.json",
            "/etc/passwd",
            "/api/v1/clusters/x/other",
            "/clusters/UPPER",
        ] {
            assert_eq!(route(&Method::GET, path), Route::NotFound, "{path}");
        }
    }

    #[test]
    fn odd_methods_are_refused_with_allow() {
        for method in [
            Method::POST,
            Method::PUT,
            Method::DELETE,
            Method::OPTIONS,
            Method::TRACE,
            Method::PATCH,
        ] {
            assert_eq!(
                route(&method, "/channels/prod.json"),
                Route::MethodNotAllowed("GET, HEAD"),
                "{method}"
            );
        }
        let propfind = Method::from_bytes(b"PROPFIND").expect("method");
        assert_eq!(route(&propfind, "/"), Route::MethodNotAllowed("GET, HEAD"));
        assert_eq!(
            route(&Method::GET, "/api/v1/clusters/a/heartbeat"),
            Route::MethodNotAllowed("POST")
        );
    }

    #[test]
    fn api_routes() {
        assert_eq!(
            route(&Method::POST, "/api/v1/clusters/prod-eu/enroll"),
            Route::Enroll("prod-eu".into())
        );
        assert_eq!(
            route(&Method::POST, "/api/v1/clusters/prod-eu/heartbeat"),
            Route::Heartbeat("prod-eu".into())
        );
        assert_eq!(
            route(&Method::POST, "/api/v1/clusters/a.b/rekey"),
            Route::Rekey("a.b".into())
        );
        assert_eq!(
            route(&Method::POST, "/api/v1/clusters/a/forget"),
            Route::Forget("a".into())
        );
        assert_eq!(
            route(&Method::GET, "/api/v1/clusters/a"),
            Route::ApiCluster("a".into())
        );
        assert_eq!(route(&Method::GET, "/api/v1/clusters"), Route::ApiClusters);
        assert_eq!(route(&Method::GET, "/api/v1/fleet"), Route::ApiFleet);
        assert_eq!(route(&Method::GET, "/api/v1/drift"), Route::ApiDrift);
        assert_eq!(
            route(&Method::GET, "/api/v1/break-glass"),
            Route::ApiBreakGlass
        );
        assert_eq!(route(&Method::GET, "/"), Route::FleetPage);
        assert_eq!(
            route(&Method::GET, "/clusters/prod-eu"),
            Route::ClusterPage("prod-eu".into())
        );
        assert_eq!(route(&Method::GET, "/metrics"), Route::Metrics);
        assert_eq!(route(&Method::GET, "/livez"), Route::Livez);
        assert_eq!(route(&Method::HEAD, "/readyz"), Route::Readyz);
    }

    #[test]
    fn cluster_names() {
        for good in ["a", "prod-eu-1", "a.b.c", &"x".repeat(253)] {
            assert!(valid_cluster_name(good), "{good}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a_b",
            "a..b",
            ".a",
            "a/b",
            &"x".repeat(254),
        ] {
            assert!(!valid_cluster_name(bad), "{bad}");
        }
    }

    #[test]
    fn conditional_request_matching() {
        let etag: &[u8] = b"\"abc\"";
        let gz: &[u8] = b"\"abc.gz\"";
        assert!(if_none_match(b"\"abc\"", &[etag]));
        assert!(if_none_match(b"W/\"abc\"", &[etag]));
        assert!(if_none_match(b"\"x\", \"abc\"", &[etag]));
        assert!(if_none_match(b" * ", &[etag]));
        assert!(if_none_match(b"\"abc.gz\"", &[etag, gz]));
        assert!(!if_none_match(b"\"abcd\"", &[etag]));
        assert!(!if_none_match(b"abc", &[etag]));
        assert!(!if_none_match(b"", &[etag]));
        assert!(!if_none_match(b",", &[etag]));
    }

    #[test]
    fn gzip_negotiation() {
        assert!(accepts_gzip(b"gzip"));
        assert!(accepts_gzip(b"br, gzip;q=0.5, deflate"));
        assert!(accepts_gzip(b"*"));
        assert!(accepts_gzip(b"x-gzip"));
        assert!(!accepts_gzip(b"gzip;q=0"));
        assert!(!accepts_gzip(b"*, gzip;q=0"));
        assert!(!accepts_gzip(b"identity"));
        assert!(!accepts_gzip(b""));
        assert!(!accepts_gzip(b"br"));
    }

    #[test]
    fn query_parameters_are_decoded() {
        let q = Some("selector=env%3Dprod%2Cregion+in+%28eu%29&state=Unknown&state=Failed");
        assert_eq!(
            query_param(q, "selector").as_deref(),
            Some("env=prod,region in (eu)")
        );
        assert_eq!(query_params(q, "state"), vec!["Unknown", "Failed"]);
        assert_eq!(query_param(q, "missing"), None);
        assert_eq!(query_param(None, "selector"), None);
    }
}
