//! Signed heartbeat ingestion: `windvane-server` with its SQLite database (WAL, `synchronous=FULL`, group
//! commit) takes signed heartbeats from many clusters at a fixed offered rate. Open loop: heartbeat `n` is due
//! at `start + n / rate` and its latency counts from then, so a stall delays everything queued behind it
//! instead of slowing the generator down (which would hide it). Heartbeats are enrolled and signed ahead of
//! time (the bench's CPU goes to sending, not signing); each connection carries a few clusters, each
//! cluster's sequence rising. After the run the server is killed with SIGKILL and the rows in its database
//! are counted: every heartbeat answered 2xx must be there (loss).
//!
//! Baselines, measured in the same run: the same offered load, same bodies, same connections, against a
//! trivial handler on the same hyper stack (a child process of this binary: HTTP/1.1, a two-thread tokio
//! runtime, reads the body and answers 200 with a small JSON) — the latency and CPU floor this machine and
//! this load generator allow any HTTP server; and the raw cost of one Ed25519 `verify_strict` (the check
//! every heartbeat needs), timed in this process on the same bodies. The server's CPU per heartbeat reads
//! against their sum.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use base64::Engine as _;
use ed25519_dalek::SigningKey;
use hyper::body::Bytes;
use jiff::Timestamp;
use windvane_shared::crypto::dsse::{self, Envelope};
use windvane_shared::crypto::keys::{signing_key_from_seed, verifying_key_to_pem};
use windvane_shared::wire::heartbeat::{
    AppReport, EnrollRequest, HEARTBEAT_PAYLOAD_TYPE, Heartbeat, SourceReport,
};
use windvane_shared::wire::status::SyncState;
use windvane_source_server::db::Database as _;
use windvane_source_server::db::sqlite::SqliteDb;
use windvane_tests::process::{ChildProcess, free_port};

use crate::drift::quantile;
use crate::report::{Goal, Row, Unit};
use crate::server::{Conn, ServerProcess, TOKEN};

/// The offered load.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Heartbeats per second offered.
    pub rate: u64,
    pub length: Duration,
    /// Enrolled clusters the heartbeats come from.
    pub clusters: u64,
    /// Keep-alive connections carrying them (each carries `clusters / connections` clusters).
    pub connections: u64,
}

/// One server's run under the offered load.
#[derive(Debug, Clone, Default)]
pub struct Run {
    pub offered: u64,
    /// Answered 2xx.
    pub ok: u64,
    /// Answered otherwise (429: shed).
    pub refused: u64,
    /// From the first heartbeat's due time to the last answer.
    pub elapsed: Duration,
    /// Latency from due time to answer, sorted.
    pub latencies: Vec<Duration>,
    /// The server's CPU over the run.
    pub cpu: Duration,
    /// The benchmark's (the load generator's) CPU over the run.
    pub bench_cpu: Duration,
    /// Other processes' CPU over the run: the noise.
    pub others_cpu: Duration,
}

impl Run {
    /// 2xx answers per second.
    pub fn rate(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64()
    }

    pub fn p(&self, q: f64) -> Duration {
        quantile(&self.latencies, q)
    }

    /// Cores other processes used during the run.
    pub fn others_cores(&self) -> f64 {
        self.others_cpu.as_secs_f64() / self.elapsed.as_secs_f64()
    }

    /// Server CPU per answered request, µs.
    pub fn cpu_us(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / (self.ok + self.refused).max(1) as f64
    }
}

/// Everything measured.
#[derive(Debug, Clone)]
pub struct Ingestion {
    pub windvane: Run,
    pub trivial: Run,
    /// Rows in the heartbeat log after the server was killed.
    pub stored: u64,
    /// Heartbeats stored per transaction, mean (from the server's metrics).
    pub mean_batch: f64,
    /// Signatures checked per batched check, mean (from the server's metrics).
    pub mean_signature_batch: f64,
    /// Time to store one batch (transaction and fsync), mean, ms (from the server's metrics).
    pub mean_commit_ms: f64,
    /// Transactions, and those that took over 10 ms and over 50 ms (from the server's commit histogram):
    /// a stalled commit holds up every heartbeat queued behind it, so these explain a long tail.
    pub commits: u64,
    pub commits_over_10ms: u64,
    pub commits_over_50ms: u64,
    /// One `verify_strict`, µs (median of the bodies).
    pub verify_us: f64,
    pub body_bytes: usize,
}

impl Ingestion {
    /// Answered 2xx but not in the database.
    pub fn lost(&self) -> u64 {
        self.windvane.ok.saturating_sub(self.stored)
    }
}

/// A heartbeat as the agent sends it from a synced cluster running four apps.
pub fn heartbeat(
    name: &str,
    sequence: u64,
    serial: u64,
    labels: &BTreeMap<String, String>,
) -> Heartbeat {
    let apps = ["monitoring", "ingress", "api", "logging"];
    Heartbeat {
        cluster: name.to_owned(),
        fleet: "acme".into(),
        sequence,
        sent_at: Timestamp::now(),
        interval_seconds: 30,
        agent_version: "0.1.0".into(),
        labels: labels.clone(),
        state: SyncState::Synced,
        source: SourceReport {
            channel: "stable".into(),
            applied_serial: Some(serial),
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

/// The body of an enrolment request.
pub fn enroll_body(key: &SigningKey, labels: &BTreeMap<String, String>) -> Bytes {
    Bytes::from(
        serde_json::to_vec(&EnrollRequest {
            token: TOKEN.into(),
            fleet: "acme".into(),
            public_key: verifying_key_to_pem(&key.verifying_key()),
            labels: labels.clone(),
        })
        .expect("an enrolment request serialises"),
    )
}

/// The key of cluster `i` (distinct seeds, distinct keys).
pub fn cluster_key(i: u64) -> SigningKey {
    let mut seed = [0u8; 32];
    seed[..8].copy_from_slice(&(i + 1).to_le_bytes());
    seed[8] = 0x5e;
    signing_key_from_seed(seed)
}

pub(crate) fn labels() -> BTreeMap<String, String> {
    [("env", "prod"), ("region", "eu-west-1"), ("tier", "edge")]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Heartbeats to send: (number, path, body), numbered in due order.
pub(crate) type Scheduled = Vec<(u64, String, Bytes)>;

/// Runs the measurement with `binary` as the server.
pub async fn measure(binary: &Path, work: &Path, s: Settings) -> anyhow::Result<Ingestion> {
    let root = work.join("heartbeat-store");
    std::fs::create_dir_all(root.join("channels"))?;
    let mut server = ServerProcess::start(binary, &root, work, "heartbeat-server", &[]).await?;
    let names: Vec<String> = (0..s.clusters).map(|i| format!("cluster-{i:06}")).collect();
    let keys: Arc<Vec<SigningKey>> = Arc::new((0..s.clusters).map(cluster_key).collect());
    let clusters: Vec<Enrolment> = names.iter().map(|name| (name.clone(), labels())).collect();
    enroll_all(server.addr, &clusters, &keys).await?;

    let total = s.rate * s.length.as_secs().max(1);
    let connections = s.connections.min(s.clusters).max(1);
    let per_connection = sign_all(&names, &keys, total, connections);
    let body_bytes = per_connection
        .iter()
        .find_map(|c| c.first())
        .map_or(0, |(_, _, b)| b.len());
    let verify_us = time_verify(&per_connection, &keys, s.clusters);

    let trivial = {
        let trivial_server = TrivialServer::start(work)?;
        let pid = trivial_server.pid()?;
        offer(trivial_server.addr, &[pid], &per_connection, s.rate).await?
    };
    let windvane = offer(server.addr, &[server.pid()?], &per_connection, s.rate).await?;
    server.check_running()?;
    let server_metrics = match Conn::open(server.addr).await?.get("/metrics", &[]).await {
        Ok(answer) => crate::prom::parse(&String::from_utf8_lossy(&answer.body)),
        Err(_) => Vec::new(),
    };
    let metric = |name: &str| crate::prom::sum(&server_metrics, name, |_| true);
    let mean_batch = windvane.ok as f64 / metric("windvane_ingest_batches_total").max(1.0);
    let mean_signature_batch = metric("windvane_signature_batch_size_sum")
        / metric("windvane_signature_batch_size_count").max(1.0);
    let commits = metric("windvane_ingest_commit_duration_seconds_count");
    let mean_commit_ms =
        1e3 * metric("windvane_ingest_commit_duration_seconds_sum") / commits.max(1.0);
    let commits_within = |le: &str| {
        crate::prom::sum(
            &server_metrics,
            "windvane_ingest_commit_duration_seconds_bucket",
            |s| s.label("le") == le,
        )
    };
    let commits_over_10ms = (commits - commits_within("0.01")).max(0.0) as u64;
    let commits_over_50ms = (commits - commits_within("0.05")).max(0.0) as u64;
    server.kill();
    let db = SqliteDb::open(&server.data).context("opening the server's database after the run")?;
    let stored = db.heartbeat_count(None).await?;
    Ok(Ingestion {
        windvane,
        trivial,
        stored,
        mean_batch,
        mean_signature_batch,
        mean_commit_ms,
        commits: commits as u64,
        commits_over_10ms,
        commits_over_50ms,
        verify_us,
        body_bytes,
    })
}

/// A cluster to enrol: its name and labels.
pub type Enrolment = (String, BTreeMap<String, String>);

/// Enrols every cluster (name and labels; cluster `i` signs with `keys[i]`), 16 requests at a time.
pub async fn enroll_all(
    addr: SocketAddr,
    clusters: &[Enrolment],
    keys: &Arc<Vec<SigningKey>>,
) -> anyhow::Result<()> {
    let lanes = 16.min(clusters.len()).max(1);
    let mut tasks = Vec::new();
    for lane in 0..lanes {
        let mine: Vec<(usize, Enrolment)> = clusters
            .iter()
            .enumerate()
            .skip(lane)
            .step_by(lanes)
            .map(|(i, cluster)| (i, cluster.clone()))
            .collect();
        let keys = Arc::clone(keys);
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::open(addr).await?;
            for (i, (name, labels)) in mine {
                let body = enroll_body(&keys[i], &labels);
                let answer = conn
                    .post(&format!("/api/v1/clusters/{name}/enroll"), body)
                    .await?;
                anyhow::ensure!(
                    answer.status == 201 || answer.status == 200,
                    "enrolling {name}: {} {}",
                    answer.status,
                    String::from_utf8_lossy(&answer.body)
                );
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// Signs `total` heartbeats on two threads; heartbeat `n` is cluster `n % clusters`'s, sequence
/// `n / clusters + 1`, carried by connection `cluster % connections`.
pub(crate) fn sign_all(
    names: &[String],
    keys: &Arc<Vec<SigningKey>>,
    total: u64,
    connections: u64,
) -> Vec<Scheduled> {
    let clusters = names.len() as u64;
    let signed: Vec<(u64, String, Bytes)> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..2u64)
            .map(|t| {
                scope.spawn(move || {
                    let labels = labels();
                    (t..total)
                        .step_by(2)
                        .map(|n| {
                            let cluster = (n % clusters) as usize;
                            let name = &names[cluster];
                            let payload =
                                serde_json::to_vec(&heartbeat(name, n / clusters + 1, 42, &labels))
                                    .expect("a heartbeat serialises");
                            let body = dsse::sign(HEARTBEAT_PAYLOAD_TYPE, &payload, &keys[cluster])
                                .to_json_bytes();
                            (
                                n,
                                format!("/api/v1/clusters/{name}/heartbeat"),
                                Bytes::from(body),
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().expect("a signing thread panicked"))
            .collect()
    });
    let mut per_connection: Vec<Scheduled> = (0..connections).map(|_| Vec::new()).collect();
    let mut signed = signed;
    signed.sort_by_key(|(n, _, _)| *n);
    for item in signed {
        let cluster = item.0 % clusters;
        per_connection[(cluster % connections) as usize].push(item);
    }
    per_connection
}

/// The median time of one Ed25519 `verify_strict` over the PAE of up to 2,000 of the bodies.
fn time_verify(per_connection: &[Scheduled], keys: &[SigningKey], clusters: u64) -> f64 {
    let samples: Vec<(usize, Vec<u8>, ed25519_dalek::Signature)> = per_connection
        .iter()
        .flatten()
        .take(2_000)
        .filter_map(|(n, _, body)| {
            let envelope = Envelope::from_json_slice(body).ok()?;
            let payload = envelope.payload_bytes().ok()?;
            let sig = base64::engine::general_purpose::STANDARD
                .decode(&envelope.signatures.first()?.sig)
                .ok()?;
            Some((
                (n % clusters) as usize,
                dsse::pae(&envelope.payload_type, &payload),
                ed25519_dalek::Signature::from_slice(&sig).ok()?,
            ))
        })
        .collect();
    let verifying: Vec<_> = keys.iter().map(SigningKey::verifying_key).collect();
    let mut times: Vec<f64> = Vec::with_capacity(samples.len());
    for (cluster, message, signature) in &samples {
        let start = Instant::now();
        let ok = verifying[*cluster]
            .verify_strict(std::hint::black_box(message), signature)
            .is_ok();
        times.push(start.elapsed().as_secs_f64() * 1e6);
        assert!(ok, "a bench heartbeat does not verify");
    }
    crate::pointer::median(&times)
}

/// Offers every connection's heartbeats at `rate` in total (open loop) and records the answers.
pub(crate) async fn offer(
    addr: SocketAddr,
    pids: &[u32],
    per_connection: &[Scheduled],
    rate: u64,
) -> anyhow::Result<Run> {
    let ok = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let mut conns = Vec::with_capacity(per_connection.len());
    for _ in per_connection {
        conns.push(Conn::open(addr).await?);
    }
    let split = crate::server::CpuSplit::start_all(pids);
    let start = tokio::time::Instant::now() + Duration::from_millis(200);
    let mut tasks = Vec::new();
    for (items, mut conn) in per_connection.iter().cloned().zip(conns) {
        let (ok, refused) = (Arc::clone(&ok), Arc::clone(&refused));
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(items.len());
            for (n, path, body) in items {
                let due = start + Duration::from_secs_f64(n as f64 / rate as f64);
                tokio::time::sleep_until(due).await;
                let answer = conn.post(&path, body).await?;
                latencies.push(due.elapsed());
                if (200..300).contains(&answer.status) {
                    &ok
                } else {
                    &refused
                }
                .fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await??);
    }
    let elapsed = start.elapsed();
    let (cpu, bench_cpu, others_cpu) = split.stop_all(pids);
    latencies.sort_unstable();
    Ok(Run {
        offered: latencies.len() as u64,
        ok: ok.load(Ordering::Relaxed),
        refused: refused.load(Ordering::Relaxed),
        elapsed,
        latencies,
        cpu,
        bench_cpu,
        others_cpu,
    })
}

/// The trivial handler, run as `bench --trivial-server ADDR` in a child process.
struct TrivialServer {
    process: ChildProcess,
    addr: SocketAddr,
}

impl TrivialServer {
    fn start(work: &Path) -> anyhow::Result<Self> {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let process = ChildProcess::start(
            "trivial server",
            &std::env::current_exe()?,
            &["--trivial-server".to_owned(), addr.to_string()],
            &[],
            &work.join("trivial-server.log"),
        )?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(addr).is_err() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the trivial server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Self { process, addr })
    }

    fn pid(&self) -> anyhow::Result<u32> {
        self.process.pid().context("the trivial server exited")
    }
}

/// Serves `POST` (any path) with 200 and a heartbeat reply's JSON after reading the body, on a two-thread
/// runtime, until killed. The same hyper settings as windvane-server.
pub fn serve_trivial(addr: SocketAddr) -> anyhow::Result<()> {
    use http_body_util::{BodyExt as _, Full};
    use hyper::server::conn::http1;
    use hyper::service::service_fn;
    use hyper_util::rt::{TokioIo, TokioTimer};

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            let service = service_fn(
                |request: hyper::Request<hyper::body::Incoming>| async move {
                    let body = request.into_body().collect().await.map(|c| c.to_bytes());
                    std::hint::black_box(body.unwrap_or_default());
                    let mut response = hyper::Response::new(Full::new(Bytes::from_static(
                        b"{\"acknowledgedSequence\":1,\"nextIntervalSeconds\":30}",
                    )));
                    response.headers_mut().insert(
                        hyper::header::CONTENT_TYPE,
                        hyper::header::HeaderValue::from_static("application/json"),
                    );
                    Ok::<_, std::convert::Infallible>(response)
                },
            );
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(30))
                .serve_connection(TokioIo::new(stream), service);
            tokio::spawn(connection);
        }
    })
}

/// The rows: rate, p99, loss (with goals) and CPU per heartbeat.
pub fn report(m: &Ingestion, s: Settings, results: &mut crate::Results) {
    results.rows.push(rate_row(m, s));
    warn_noisy(m, results);
    results.rows.push(latency_row(m));
    results.rows.push(lost_row(m));
    results.rows.push(cpu_row(m));
    results
        .details
        .insert("heartbeat".into(), details_json(m, s));
}

/// Heartbeats stored per second, against the trivial handler under the same load.
fn rate_row(m: &Ingestion, s: Settings) -> Row {
    let w = &m.windvane;
    let t = &m.trivial;
    let load = format!(
        "offered {}/s for {} s (open loop) from {} clusters on {} connections, {}-byte signed bodies",
        s.rate,
        s.length.as_secs(),
        s.clusters,
        s.connections.min(s.clusters),
        m.body_bytes
    );
    Row::new(
        "heartbeat",
        "heartbeat_rate",
        "signed heartbeats stored per second",
        Unit::PerSecond,
        w.rate(),
    )
    .baseline("trivial 200 handler, same load", t.rate())
    .goal(Goal::AtLeast(10_000.0))
    .note(format!(
        "{load}; 2xx answers over the time from the first heartbeat's due time to the last answer: {} of {} \
         answered 2xx, {} refused (429 = shed); {:.0} heartbeats per SQLite transaction (group commit, \
         synchronous=FULL; {:.2} ms per transaction, fsync included), {:.1} signatures per batched check. \
         Baseline: the same bodies, connections and schedule against a handler on the \
         same hyper stack that only reads the body and answers 200. CPU during the run: server {:.1} s, \
         load generator {:.1} s, other processes {:.2} cores (trivial run: {:.2} cores)",
        w.ok,
        w.offered,
        w.refused,
        m.mean_batch,
        m.mean_commit_ms,
        m.mean_signature_batch,
        w.cpu.as_secs_f64(),
        w.bench_cpu.as_secs_f64(),
        w.others_cores(),
        t.others_cores(),
    ))
}

/// A run that shared the machine with other busy processes is flagged.
fn warn_noisy(m: &Ingestion, results: &mut crate::Results) {
    let (w, t) = (&m.windvane, &m.trivial);
    for (who, run) in [("windvane-server", w), ("the trivial handler", t)] {
        if run.others_cores() > crate::NOISY_CORES {
            results.warnings.push(format!(
                "noisy run: other processes on the machine used {:.2} cores while {who} took heartbeats; its \
                 rate and latency are those of a server sharing two cores — the CPU per heartbeat is the figure \
                 that holds; re-run when the machine is quiet",
                run.others_cores()
            ));
        }
    }
}

/// Latency from each heartbeat's due time, p99.
fn latency_row(m: &Ingestion) -> Row {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (w, t) = (&m.windvane, &m.trivial);
    Row::new(
        "heartbeat",
        "heartbeat_p99_ms",
        "heartbeat latency p99 (from due time)",
        Unit::Millis,
        ms(w.p(0.99)),
    )
    .baseline("trivial 200 handler, p99", ms(t.p(0.99)))
    .goal(Goal::AtMost(50.0))
    .note(format!(
        "p50 {:.1} ms, p90 {:.1} ms, p99.9 {:.1} ms, max {:.1} ms (trivial handler: p50 {:.1} ms, max {:.1} ms); \
         latency counts from when the heartbeat was due, so queueing in the generator counts too. Storage \
         stalls: {} of {} transactions took over 10 ms, {} over 50 ms (each holds up every heartbeat queued \
         behind it)",
        ms(w.p(0.5)),
        ms(w.p(0.9)),
        ms(w.p(0.999)),
        ms(w.p(1.0)),
        ms(t.p(0.5)),
        ms(t.p(1.0)),
        m.commits_over_10ms,
        m.commits,
        m.commits_over_50ms,
    ))
}

/// Heartbeats answered 2xx that the database does not hold after a SIGKILL.
fn lost_row(m: &Ingestion) -> Row {
    let w = &m.windvane;
    Row::new(
        "heartbeat",
        "heartbeat_lost",
        "heartbeats lost (answered 2xx, not in the database)",
        Unit::Count,
        m.lost() as f64,
    )
    .goal(Goal::AtMost(0.0))
    .note(format!(
        "the server was killed with SIGKILL after the run; {} rows in its heartbeat log for {} 2xx answers",
        m.stored, w.ok
    ))
}

/// The server's CPU per heartbeat, against the floor no server can go below.
fn cpu_row(m: &Ingestion) -> Row {
    let (w, t) = (&m.windvane, &m.trivial);
    Row::new(
        "heartbeat",
        "heartbeat_cpu_us",
        "server CPU per heartbeat",
        Unit::Micros,
        w.cpu_us(),
    )
    .baseline(
        "trivial handler per request + one Ed25519 verify_strict",
        t.cpu_us() + m.verify_us,
    )
    .note(format!(
        "server CPU (/proc) over the run per request answered ({} with 2xx, {} with 429, which costs far less); \
         the floor: the trivial handler's {:.1} µs per request on the same stack and load, plus {:.1} µs for \
         one verify_strict of the same bodies (median, one core, this process) — the signature check no \
         server can skip",
        w.ok,
        w.refused,
        t.cpu_us(),
        m.verify_us
    ))
}

/// The run's figures for `results.json`.
fn details_json(m: &Ingestion, s: Settings) -> serde_json::Value {
    let (w, t) = (&m.windvane, &m.trivial);
    serde_json::json!({
        "offeredPerSecond": s.rate,
        "seconds": s.length.as_secs(),
        "clusters": s.clusters,
        "connections": s.connections,
        "bodyBytes": m.body_bytes,
        "windvane": run_json(w),
        "trivial": run_json(t),
        "stored": m.stored,
        "lost": m.lost(),
        "meanBatch": m.mean_batch,
        "meanCommitMs": m.mean_commit_ms,
        "commits": m.commits,
        "commitsOver10ms": m.commits_over_10ms,
        "commitsOver50ms": m.commits_over_50ms,
        "meanSignatureBatch": m.mean_signature_batch,
        "verifyStrictUs": m.verify_us,
    })
}

fn run_json(r: &Run) -> serde_json::Value {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    serde_json::json!({
        "offered": r.offered,
        "ok": r.ok,
        "refused": r.refused,
        "seconds": r.elapsed.as_secs_f64(),
        "ratePerSecond": r.rate(),
        "p50Ms": ms(r.p(0.5)),
        "p90Ms": ms(r.p(0.9)),
        "p99Ms": ms(r.p(0.99)),
        "p999Ms": ms(r.p(0.999)),
        "maxMs": ms(r.p(1.0)),
        "cpuSeconds": r.cpu.as_secs_f64(),
        "cpuUsPerRequest": r.cpu_us(),
        "benchCpuSeconds": r.bench_cpu.as_secs_f64(),
        "otherProcessesCores": r.others_cores(),
    })
}
