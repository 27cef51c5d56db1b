//! Heartbeat ingestion scaled out: two `windvane-server` replicas on one PostgreSQL behind HAProxy (Debian's
//! packages, started the way `tests/tests/server_replicas.rs` starts them) against one server on SQLite — the
//! same signed heartbeats, the same connections and the same open-loop schedule (`heartbeat::offer`), in the
//! same run. Each cluster is enrolled with both before anything is measured. After each run the servers are
//! killed with SIGKILL and the stored rows counted: every heartbeat answered 2xx must be in the database.
//!
//! The figures say what one more moving part costs on these two shared cores (the replicas, PostgreSQL and
//! HAProxy all run here, beside the load generator), not what the same processes do on their own machines:
//! the CPU per heartbeat, split by process, is what `docs/capacity.md` scales from.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ed25519_dalek::SigningKey;
use windvane_source_server::db::Database as _;
use windvane_source_server::db::postgres::PostgresDb;
use windvane_source_server::db::sqlite::SqliteDb;
use windvane_tests::haproxy::LoadBalancer;
use windvane_tests::postgres::Postgres;

use crate::heartbeat::{self, Enrolment, Run, Settings, cluster_key, enroll_all, offer, sign_all};
use crate::report::{Goal, Row, Unit};
use crate::server::{ServerProcess, tree_cpu};

/// The longest each of the two runs lasts: the comparison needs a sustained rate, not the heartbeat
/// section's full minute twice over.
const MAX_LENGTH: Duration = Duration::from_secs(20);

/// Both runs and what each database holds afterwards.
#[derive(Debug, Clone)]
pub struct Scaled {
    pub sqlite: Run,
    pub sqlite_stored: u64,
    pub postgres: Run,
    pub postgres_stored: u64,
    /// CPU over the PostgreSQL run: the two replicas, PostgreSQL (postmaster and backends), HAProxy.
    pub replicas_cpu: Duration,
    pub database_cpu: Duration,
    pub balancer_cpu: Duration,
    pub length: Duration,
}

/// Runs both, SQLite first.
pub async fn measure(binary: &Path, work: &Path, s: Settings) -> anyhow::Result<Scaled> {
    let length = s.length.min(MAX_LENGTH);
    let root = work.join("replicas-store");
    std::fs::create_dir_all(root.join("channels"))?;
    let names: Vec<String> = (0..s.clusters).map(|i| format!("cluster-{i:06}")).collect();
    let keys: Arc<Vec<SigningKey>> = Arc::new((0..s.clusters).map(cluster_key).collect());
    let clusters: Vec<Enrolment> = names
        .iter()
        .map(|name| (name.clone(), heartbeat::labels()))
        .collect();
    let total = s.rate * length.as_secs().max(1);
    let per_connection = sign_all(&names, &keys, total, s.connections.min(s.clusters).max(1));

    let mut single = ServerProcess::start(binary, &root, work, "sqlite-server", &[]).await?;
    enroll_all(single.addr, &clusters, &keys).await?;
    let sqlite = offer(single.addr, &[single.pid()?], &per_connection, s.rate).await?;
    single.check_running()?;
    single.kill();
    let sqlite_stored = SqliteDb::open(&single.data)
        .context("opening the SQLite server's database after the run")?
        .heartbeat_count(None)
        .await?;

    let postgres = tokio::task::spawn_blocking(Postgres::start).await?;
    let url = postgres.database("windvane_bench").await;
    let mut replicas = Vec::new();
    for i in 0..2 {
        let name = format!("postgres-replica-{i}");
        let extra = ["--database-url", url.as_str()];
        replicas.push(ServerProcess::start(binary, &root, work, &name, &extra).await?);
    }
    let addrs: Vec<String> = replicas.iter().map(|r| r.addr.to_string()).collect();
    let balancer = LoadBalancer::start(&addrs).await?;
    let balancer_addr: SocketAddr = balancer.url.trim_start_matches("http://").parse()?;
    enroll_all(balancer_addr, &clusters, &keys).await?;

    let replica_pids = replicas
        .iter()
        .map(ServerProcess::pid)
        .collect::<anyhow::Result<Vec<u32>>>()?;
    let database_pid = postgres
        .postmaster_pid()
        .context("PostgreSQL is not running")?;
    let balancer_pid = balancer.pid().context("HAProxy exited")?;
    let before = cpu_of(&replica_pids, database_pid, balancer_pid);
    let all = [replica_pids.as_slice(), &[database_pid, balancer_pid]].concat();
    let scaled = offer(balancer_addr, &all, &per_connection, s.rate).await?;
    let after = cpu_of(&replica_pids, database_pid, balancer_pid);
    for replica in &mut replicas {
        replica.check_running()?;
        replica.kill();
    }
    let postgres_stored = PostgresDb::open(&url)
        .await
        .context("opening the replicas' PostgreSQL database after the run")?
        .heartbeat_count(None)
        .await?;
    Ok(Scaled {
        sqlite,
        sqlite_stored,
        postgres: scaled,
        postgres_stored,
        replicas_cpu: after.0.saturating_sub(before.0),
        database_cpu: after.1.saturating_sub(before.1),
        balancer_cpu: after.2.saturating_sub(before.2),
        length,
    })
}

/// CPU so far of (the replicas, the database, the balancer), each with its direct children.
fn cpu_of(replicas: &[u32], database: u32, balancer: u32) -> (Duration, Duration, Duration) {
    (
        replicas.iter().map(|&pid| tree_cpu(pid)).sum(),
        tree_cpu(database),
        tree_cpu(balancer),
    )
}

/// The rows: rate, p99, loss and CPU per heartbeat of the replicas on PostgreSQL, against one SQLite server.
pub fn report(m: &Scaled, s: Settings, results: &mut crate::Results) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (p, q) = (&m.postgres, &m.sqlite);
    let per_heartbeat = |cpu: Duration| cpu.as_secs_f64() * 1e6 / p.ok.max(1) as f64;
    let load = format!(
        "offered {}/s for {} s (open loop) from {} clusters on {} connections, the same signed bodies for both",
        s.rate,
        m.length.as_secs(),
        s.clusters,
        s.connections.min(s.clusters)
    );
    results.rows.push(
        Row::new(
            "heartbeat-replicas",
            "heartbeat_replicas_rate",
            "heartbeats stored per second, two replicas on PostgreSQL behind HAProxy",
            Unit::PerSecond,
            p.rate(),
        )
        .baseline("one server on SQLite, same load, same run", q.rate())
        .note(format!(
            "{load}; {} of {} answered 2xx, {} refused (SQLite: {} of {}, {} refused). All on this machine's \
             two cores with the load generator ({:.1} s of CPU; other processes {:.2} cores)",
            p.ok,
            p.offered,
            p.refused,
            q.ok,
            q.offered,
            q.refused,
            p.bench_cpu.as_secs_f64(),
            p.others_cores(),
        )),
    );
    results.rows.push(
        Row::new(
            "heartbeat-replicas",
            "heartbeat_replicas_p99_ms",
            "heartbeat latency p99 (from due time), two replicas on PostgreSQL",
            Unit::Millis,
            ms(p.p(0.99)),
        )
        .baseline("one server on SQLite, p99", ms(q.p(0.99)))
        .note(format!(
            "p50 {:.1} ms, max {:.1} ms (SQLite: p50 {:.1} ms, max {:.1} ms)",
            ms(p.p(0.5)),
            ms(p.p(1.0)),
            ms(q.p(0.5)),
            ms(q.p(1.0)),
        )),
    );
    results.rows.push(
        Row::new(
            "heartbeat-replicas",
            "heartbeat_replicas_lost",
            "heartbeats lost (answered 2xx, not in PostgreSQL)",
            Unit::Count,
            p.ok.saturating_sub(m.postgres_stored) as f64,
        )
        .goal(Goal::AtMost(0.0))
        .note(format!(
            "both replicas were killed with SIGKILL after the run; {} rows for {} 2xx answers (SQLite: {} rows \
             for {})",
            m.postgres_stored, p.ok, m.sqlite_stored, q.ok
        )),
    );
    results.rows.push(
        Row::new(
            "heartbeat-replicas",
            "heartbeat_replicas_cpu_us",
            "CPU per stored heartbeat: replicas + PostgreSQL + HAProxy",
            Unit::Micros,
            per_heartbeat(p.cpu),
        )
        .baseline("one server on SQLite", q.cpu_us())
        .note(format!(
            "split: the two replicas {:.0} µs, PostgreSQL {:.0} µs, HAProxy {:.0} µs per heartbeat",
            per_heartbeat(m.replicas_cpu),
            per_heartbeat(m.database_cpu),
            per_heartbeat(m.balancer_cpu),
        )),
    );
}
