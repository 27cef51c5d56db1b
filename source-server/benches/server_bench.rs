//! Source-server benchmarks, printed side by side:
//!
//! 1. Channel-pointer `304 Not Modified` requests/s of `windvane-server` vs nginx (Debian's package, started
//!    here with a temporary config on loopback) serving the same file, driven by the same load generator
//!    (a hyper client in this file; `wrk` too when installed) with the same number of connections.
//! 2. Signed heartbeat ingestion into SQLite: heartbeats are signed ahead of time, then offered at a fixed
//!    rate (open loop: latency is measured from each request's scheduled time, so a stall is not hidden);
//!    reports the rate achieved, p50/p99 latency, and loss (rows stored vs 2xx answers).
//!
//! `cargo bench -p windvane-source-server --bench server_bench` runs the full version (60 s of ingestion).
//! Without `--bench` (as `cargo test --all-targets` runs it) it is a few-second smoke run. Knobs:
//! WINDVANE_BENCH_SECONDS, WINDVANE_BENCH_304_SECONDS, WINDVANE_BENCH_RATE, WINDVANE_BENCH_CONNECTIONS (304s),
//! WINDVANE_BENCH_INGEST_CONNECTIONS (heartbeats: one agent per connection, as in a fleet),
//! WINDVANE_BENCH_CLUSTERS.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ed25519_dalek::SigningKey;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use jiff::Timestamp;
use windvane_shared::dsse;
use windvane_shared::heartbeat::{
    AppReport, EnrollRequest, HEARTBEAT_PAYLOAD_TYPE, Heartbeat, SourceReport,
};
use windvane_shared::keys::{signing_key_from_seed, verifying_key_to_pem};
use windvane_shared::status::SyncState;

const TOKEN: &str = "bench-registration-token";

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Settings {
    full: bool,
    seconds_304: u64,
    seconds_ingest: u64,
    rate: u64,
    connections: u64,
    ingest_connections: u64,
    clusters: u64,
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let settings = Settings {
        full,
        seconds_304: env_or("WINDVANE_BENCH_304_SECONDS", if full { 10 } else { 2 }),
        seconds_ingest: env_or("WINDVANE_BENCH_SECONDS", if full { 60 } else { 2 }),
        rate: env_or("WINDVANE_BENCH_RATE", if full { 12_000 } else { 200 }),
        connections: env_or("WINDVANE_BENCH_CONNECTIONS", 64),
        ingest_connections: env_or(
            "WINDVANE_BENCH_INGEST_CONNECTIONS",
            if full { 512 } else { 32 },
        ),
        clusters: env_or("WINDVANE_BENCH_CLUSTERS", if full { 2_000 } else { 100 }),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root");
    let pointer = write_pointer(&root);
    std::fs::write(dir.path().join("token"), TOKEN).expect("token");

    println!(
        "== windvane-server benchmarks ({} run) ==",
        if full { "full" } else { "smoke" }
    );
    let results_304 = bench_304(&runtime, dir.path(), &pointer, &settings);
    let ingest = bench_ingest(&runtime, dir.path(), &settings);

    println!();
    println!(
        "{:<58} {:>14} {:>14} {:>8}",
        "benchmark", "windvane", "nginx", "ratio"
    );
    for (generator, windvane, nginx) in &results_304 {
        println!(
            "{:<58} {:>14.0} {:>14.0} {:>7.2}x",
            format!(
                "pointer 304 req/s ({generator}, {} conns)",
                settings.connections
            ),
            windvane,
            nginx,
            windvane / nginx
        );
    }
    println!(
        "{:<58} {:>14.0} {:>14} {:>8}",
        format!(
            "heartbeats stored/s (offered {}/s, {} s, {} conns)",
            settings.rate, settings.seconds_ingest, settings.ingest_connections
        ),
        ingest.rate,
        "goal 10000",
        ""
    );
    println!(
        "{:<58} {:>14.1} {:>14} {:>8}",
        "heartbeat latency p50 (ms)", ingest.p50_ms, "", ""
    );
    println!(
        "{:<58} {:>14.1} {:>14} {:>8}",
        "heartbeat latency p99 (ms)", ingest.p99_ms, "goal < 50", ""
    );
    println!(
        "{:<58} {:>14} {:>14} {:>8}",
        "heartbeats answered 2xx", ingest.ok, "", ""
    );
    println!(
        "{:<58} {:>14} {:>14} {:>8}",
        "heartbeats answered non-2xx (429 = shed)", ingest.refused, "", ""
    );
    println!(
        "{:<58} {:>14} {:>14} {:>8}",
        "rows stored in SQLite", ingest.stored, "", ""
    );
    println!(
        "{:<58} {:>14.1} {:>14} {:>8}",
        "heartbeats per transaction (mean)", ingest.mean_batch, "", ""
    );
    println!(
        "{:<58} {:>14.1} {:>14} {:>8}",
        "server CPU ms per 1000 heartbeats", ingest.cpu_ms_per_1000, "", ""
    );
    println!(
        "{:<58} {:>14} {:>14} {:>8}",
        "lost (2xx answered but not stored)",
        ingest.ok.saturating_sub(ingest.stored),
        "goal 0",
        ""
    );
    assert_eq!(
        ingest.stored, ingest.ok,
        "every heartbeat answered 2xx is stored"
    );
    assert!(ingest.ok > 0, "some heartbeats were stored");
}

// ---- the store and the servers ----

fn write_pointer(root: &Path) -> Vec<u8> {
    std::fs::create_dir_all(root.join("channels")).expect("mkdir");
    std::fs::create_dir_all(root.join("bundles")).expect("mkdir");
    // A pointer of realistic size (a DSSE envelope of about 600 bytes).
    let now = Timestamp::now();
    let pointer = windvane_shared::release::ReleasePointer {
        fleet: "acme".into(),
        channel: "stable".into(),
        serial: 42,
        issued_at: now,
        expires_at: now
            .checked_add(jiff::SignedDuration::from_hours(24))
            .expect("time"),
        bundle: windvane_shared::release::BundleRef {
            sha256: "ab".repeat(32),
            size: 123_456,
        },
        allow_empty: false,
    };
    let bytes = pointer
        .sign(&signing_key_from_seed([7; 32]))
        .to_json_bytes();
    std::fs::write(root.join("channels/stable.json"), &bytes).expect("write");
    bytes
}

/// A child process, stopped on drop: with SIGKILL, or (for nginx, whose workers would outlive a killed
/// master) with SIGTERM so that the master stops its workers.
struct Proc(Child, bool);

impl Drop for Proc {
    fn drop(&mut self) {
        if self.1 {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(self.0.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.0.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_windvane(dir: &Path, data: &str) -> (Proc, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_windvane-server"))
        .arg("serve")
        .arg("--root")
        .arg(dir.join("root"))
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--data")
        .arg(dir.join(data))
        .arg("--registration-token-file")
        .arg(dir.join("token"))
        .env("WINDVANE_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start windvane-server");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    let addr = line
        .trim()
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("bad first line {line:?}"));
    (Proc(child, false), addr.parse().expect("addr"))
}

fn start_nginx(dir: &Path) -> (Proc, SocketAddr) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let nginx_dir = dir.join("nginx");
    std::fs::create_dir_all(&nginx_dir).expect("mkdir");
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    let config = format!(
        "{user}worker_processes 2;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  keepalive_requests 1000000;\n  \
         server {{ listen 127.0.0.1:{port}; root {root}; location / {{ default_type application/json; }} }}\n}}\n",
        user = if is_root { "user root;\n" } else { "" },
        d = nginx_dir.display(),
        root = dir.join("root").display(),
    );
    let conf = nginx_dir.join("nginx.conf");
    std::fs::write(&conf, config).expect("write nginx.conf");
    let binary = ["/usr/sbin/nginx", "nginx"]
        .into_iter()
        .find(|b| Path::new(b).exists())
        .unwrap_or("nginx");
    let child = Command::new(binary)
        .arg("-c")
        .arg(&conf)
        .arg("-p")
        .arg(&nginx_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start nginx (install Debian's `nginx` package): {e}"));
    let child = Proc(child, true);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let start = Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "nginx did not start listening"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, addr)
}

// ---- load generation ----

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(addr: SocketAddr) -> Sender {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    sender
}

async fn get(
    sender: &mut Sender,
    addr: SocketAddr,
    path: &str,
    etag: Option<&str>,
) -> (u16, Bytes, Option<String>) {
    sender.ready().await.expect("ready");
    let mut request = Request::get(path).header("host", addr.to_string());
    if let Some(etag) = etag {
        request = request.header("if-none-match", etag);
    }
    let response = sender
        .send_request(request.body(Full::default()).expect("request"))
        .await
        .expect("send");
    let status = response.status().as_u16();
    let etag = response
        .headers()
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, body, etag)
}

/// Closed-loop 304 requests for `seconds` on `connections` connections; returns requests/s.
async fn hammer_304(addr: SocketAddr, etag: String, connections: u64, seconds: u64) -> f64 {
    let count = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let (count, etag) = (Arc::clone(&count), etag.clone());
        tasks.push(tokio::spawn(async move {
            let mut sender = connect(addr).await;
            let mut local = 0;
            while Instant::now() < deadline {
                let (status, _, _) =
                    get(&mut sender, addr, "/channels/stable.json", Some(&etag)).await;
                assert_eq!(status, 304);
                local += 1;
            }
            count.fetch_add(local, Ordering::Relaxed);
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    count.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn wrk(addr: SocketAddr, etag: &str, connections: u64, seconds: u64) -> Option<f64> {
    let output = Command::new("wrk")
        .args([
            "-t2",
            &format!("-c{connections}"),
            &format!("-d{seconds}s"),
            "-H",
        ])
        .arg(format!("If-None-Match: {etag}"))
        .arg(format!("http://{addr}/channels/stable.json"))
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        !text.contains("Non-2xx or 3xx responses"),
        "wrk saw errors:\n{text}"
    );
    text.lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
}

fn bench_304(
    runtime: &tokio::runtime::Runtime,
    dir: &Path,
    pointer: &[u8],
    s: &Settings,
) -> Vec<(String, f64, f64)> {
    let (_windvane, windvane_addr) = start_windvane(dir, "data-304");
    let (_nginx, nginx_addr) = start_nginx(dir);
    let etags = runtime.block_on(async {
        let mut etags = Vec::new();
        for addr in [windvane_addr, nginx_addr] {
            let mut sender = connect(addr).await;
            let (status, body, etag) = get(&mut sender, addr, "/channels/stable.json", None).await;
            assert_eq!(
                (status, &body[..]),
                (200, pointer),
                "both serve the same file"
            );
            let etag = etag.expect("etag");
            assert_eq!(
                get(&mut sender, addr, "/channels/stable.json", Some(&etag))
                    .await
                    .0,
                304
            );
            etags.push(etag);
        }
        etags
    });
    let mut results = Vec::new();
    let mut hyper_rates = Vec::new();
    for (addr, etag) in [(windvane_addr, &etags[0]), (nginx_addr, &etags[1])] {
        // Warm-up, then the measured run.
        runtime.block_on(hammer_304(addr, etag.clone(), s.connections, 1));
        hyper_rates.push(runtime.block_on(hammer_304(
            addr,
            etag.clone(),
            s.connections,
            s.seconds_304,
        )));
    }
    println!(
        "pointer 304, hyper client: windvane {:.0} req/s, nginx {:.0} req/s",
        hyper_rates[0], hyper_rates[1]
    );
    results.push(("hyper client".to_owned(), hyper_rates[0], hyper_rates[1]));
    if let (Some(w), Some(n)) = (
        wrk(windvane_addr, &etags[0], s.connections, s.seconds_304),
        wrk(nginx_addr, &etags[1], s.connections, s.seconds_304),
    ) {
        println!("pointer 304, wrk: windvane {w:.0} req/s, nginx {n:.0} req/s");
        results.push(("wrk -t2".to_owned(), w, n));
    } else if s.full {
        println!("(wrk not installed: only the hyper client figures)");
    }
    results
}

// ---- heartbeat ingestion ----

struct IngestResult {
    rate: f64,
    p50_ms: f64,
    p99_ms: f64,
    ok: u64,
    refused: u64,
    stored: u64,
    mean_batch: f64,
    cpu_ms_per_1000: f64,
}

/// CPU time (user + system) a process has used, from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks: f64 = fields.get(11..13).map_or(0.0, |f| {
        f.iter().filter_map(|v| v.parse::<f64>().ok()).sum()
    });
    ticks / 100.0
}

fn heartbeat(name: &str, sequence: u64) -> Heartbeat {
    let apps = ["monitoring", "ingress", "api", "logging"];
    Heartbeat {
        cluster: name.to_owned(),
        fleet: "acme".into(),
        sequence,
        sent_at: Timestamp::now(),
        interval_seconds: 30,
        agent_version: "0.1.0".into(),
        labels: [("env", "prod"), ("region", "eu-west-1"), ("tier", "edge")]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        state: SyncState::Synced,
        source: SourceReport {
            channel: "stable".into(),
            applied_serial: Some(42),
            applied_sha256: Some("ab".repeat(32)),
            ..SourceReport::default()
        },
        counts: BTreeMap::from([(SyncState::Synced, 37)]),
        apps: apps
            .iter()
            .map(|a| AppReport {
                name: (*a).into(),
                state: SyncState::Synced,
                objects: 9,
            })
            .collect(),
        problems: vec![],
        drift: vec![],
        last_error: None,
    }
}

fn bench_ingest(runtime: &tokio::runtime::Runtime, dir: &Path, s: &Settings) -> IngestResult {
    let (server, addr) = start_windvane(dir, "data-ingest");
    let keys: Vec<(String, SigningKey)> = (0..s.clusters)
        .map(|i| {
            let mut seed = [0u8; 32];
            seed[..8].copy_from_slice(&(i + 1).to_le_bytes());
            (format!("cluster-{i:06}"), signing_key_from_seed(seed))
        })
        .collect();
    runtime.block_on(async {
        let mut sender = connect(addr).await;
        for (name, key) in &keys {
            let body = serde_json::to_vec(&EnrollRequest {
                token: TOKEN.into(),
                fleet: "acme".into(),
                public_key: verifying_key_to_pem(&key.verifying_key()),
                labels: BTreeMap::new(),
            })
            .expect("json");
            sender.ready().await.expect("ready");
            let request = Request::post(format!("/api/v1/clusters/{name}/enroll"))
                .header("host", addr.to_string())
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body)))
                .expect("request");
            let response = sender.send_request(request).await.expect("enroll");
            assert_eq!(response.status(), 201, "enrol {name}");
            let _ = response.into_body().collect().await;
        }
    });

    // Sign everything ahead of time: connection c carries clusters c, c+C, …, each in sequence order.
    let total = s.rate * s.seconds_ingest;
    let connections = s.ingest_connections.min(s.clusters);
    let signing = Instant::now();
    let keys = Arc::new(keys);
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let keys = Arc::clone(&keys);
            let clusters = s.clusters;
            std::thread::spawn(move || {
                let mut out = Vec::new();
                for n in (t..total).step_by(2) {
                    let cluster = n % clusters;
                    let sequence = n / clusters + 1;
                    let (name, key) = &keys[cluster as usize];
                    let payload = serde_json::to_vec(&heartbeat(name, sequence)).expect("json");
                    let body = dsse::sign(HEARTBEAT_PAYLOAD_TYPE, &payload, key).to_json_bytes();
                    out.push((
                        n,
                        format!("/api/v1/clusters/{name}/heartbeat"),
                        Bytes::from(body),
                    ));
                }
                out
            })
        })
        .collect();
    let mut per_connection: Vec<Vec<(u64, String, Bytes)>> =
        (0..connections).map(|_| Vec::new()).collect();
    let mut all: Vec<(u64, String, Bytes)> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("signer"))
        .collect();
    all.sort_by_key(|(n, _, _)| *n);
    let body_size = all.first().map_or(0, |(_, _, b)| b.len());
    for item in all {
        let cluster = item.0 % s.clusters;
        per_connection[(cluster % connections) as usize].push(item);
    }
    println!(
        "signed {total} heartbeats ({body_size} bytes each) for {} clusters in {:.1} s",
        s.clusters,
        signing.elapsed().as_secs_f64()
    );

    // Offer them at a fixed rate: heartbeat n is due at start + n / rate.
    let ok = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let cpu_before = cpu_seconds(server.0.id());
    let rate = s.rate as f64;
    let (latencies, elapsed) = runtime.block_on(async {
        let start = tokio::time::Instant::now() + Duration::from_millis(200);
        let mut tasks = Vec::new();
        for items in per_connection {
            let (ok, refused) = (Arc::clone(&ok), Arc::clone(&refused));
            tasks.push(tokio::spawn(async move {
                let mut sender = connect(addr).await;
                let mut latencies = Vec::with_capacity(items.len());
                for (n, path, body) in items {
                    let due = start + Duration::from_secs_f64(n as f64 / rate);
                    tokio::time::sleep_until(due).await;
                    sender.ready().await.expect("ready");
                    let request = Request::post(path)
                        .header("host", addr.to_string())
                        .header("content-type", "application/json")
                        .body(Full::new(body))
                        .expect("request");
                    let response = sender.send_request(request).await.expect("send");
                    let status = response.status();
                    let _ = response.into_body().collect().await;
                    latencies.push(due.elapsed().as_micros() as u64);
                    if status.is_success() { &ok } else { &refused }
                        .fetch_add(1, Ordering::Relaxed);
                }
                latencies
            }));
        }
        let mut latencies = Vec::new();
        for task in tasks {
            latencies.extend(task.await.expect("task"));
        }
        (latencies, start.elapsed())
    });
    let mut latencies = latencies;
    latencies.sort_unstable();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0) as f64
            / 1000.0
    };
    let ok = ok.load(Ordering::Relaxed);
    let cpu = cpu_seconds(server.0.id()) - cpu_before;
    let batches = runtime.block_on(async {
        let mut sender = connect(addr).await;
        let (_, body, _) = get(&mut sender, addr, "/metrics", None).await;
        String::from_utf8_lossy(&body)
            .lines()
            .find_map(|l| l.strip_prefix("windvane_ingest_batches_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    });
    drop(server); // SIGKILL: what was answered must already be on disk.
    let conn = rusqlite::Connection::open(dir.join("data-ingest/windvane.db")).expect("open db");
    let stored: i64 = conn
        .query_row("SELECT COUNT(*) FROM heartbeats", [], |r| r.get(0))
        .expect("count");
    IngestResult {
        rate: ok as f64 / elapsed.as_secs_f64(),
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        ok,
        refused: refused.load(Ordering::Relaxed),
        stored: stored as u64,
        mean_batch: if batches > 0.0 {
            ok as f64 / batches
        } else {
            0.0
        },
        cpu_ms_per_1000: if ok > 0 {
            cpu * 1_000_000.0 / ok as f64
        } else {
            0.0
        },
    }
}
