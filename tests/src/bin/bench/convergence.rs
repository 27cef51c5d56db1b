//! Fleet convergence: 10,000 simulated agents against one `windvane-server`, from a publish until the server
//! has every cluster's acknowledgement of the new serial.
//!
//! The agents are tasks in this process, no cluster behind them. Each does what the agent does with the
//! source and the server (`agent/src/engine/`, `fetch/source.rs`, `report/heartbeat.rs`), through the same shared code:
//! enrols with the registration token and its own Ed25519 key; polls the channel pointer with
//! `If-None-Match` every poll interval with the agent's ±20 % jitter; verifies a changed pointer
//! (`release::verify_pointer`, rollback and equivocation included), fetches and verifies the bundle
//! (`verify_bundle`), renders its share for its labels (`desired::cluster_share`, the agent's
//! pipeline); then, instead of applying, reports at once with a signed heartbeat carrying
//! the accepted serial, and every heartbeat interval (jittered) after that. Simplifications, stated: one
//! keep-alive connection per agent carries both its polls and its heartbeats (the agent has one each; the
//! machine's file-descriptor limit is 20,000 per process), reopened when the server closes it; identity
//! encoding (the agent asks for gzip, which the server computes once per file and caches).
//!
//! Timeline: the first release is published, the server started, the agents enrolled (timed); the agents
//! start at random phases and converge on the first release (a cold start); the fleet then idles for a
//! while (the steady state's server CPU is measured); the second release is published and the clock runs
//! until the server's database shows every cluster on its serial. The database is read from this process
//! (read-only queries on the server's SQLite file: no load on the server), four times a second. The server's
//! CPU and memory come from `/proc`. The baseline is the poll schedule itself: when the last agent first
//! polled after the publish — no server can do better; what the server adds is the difference.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use hyper::body::Bytes;
use jiff::Timestamp;
use tokio::sync::watch;
use windvane_agent::gates::wave::{self, GateObservation, GatePlan, Unreachable};
use windvane_shared::crypto::dsse;
use windvane_shared::crypto::keys::TrustedKeys;
use windvane_shared::decide::desired::{all_or_first_error, cluster_share};
use windvane_shared::decide::render::ClusterIdentity;
use windvane_shared::decide::rollout::{self, RolloutView, WaveDecision};
use windvane_shared::format::bundle::BundleLimits;
use windvane_shared::format::release::{
    DEFAULT_MAX_BUNDLE_BYTES, PointerExpectations, ReleasePointer, verify_bundle, verify_pointer,
};
use windvane_shared::wire::heartbeat::{HEARTBEAT_PAYLOAD_TYPE, Heartbeat, SourceReport};
use windvane_shared::wire::status::SyncState;
use windvane_source_server::db::Database as _;
use windvane_source_server::db::sqlite::SqliteDb;
use windvane_tests::fleet::{FleetTree, Publisher};

use crate::agent::Memory;
use crate::report::{Goal, Row, Unit};
use crate::server::{Conn, ServerProcess, tree_memory};

/// The fleet's size and pace.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub agents: usize,
    /// Nominal poll interval; each wait is jittered ±20 %, as the agent's.
    pub poll_interval: Duration,
    /// Nominal heartbeat interval, jittered the same way.
    pub heartbeat_interval: Duration,
    /// How long the converged fleet idles before the second publish (steady-state CPU is measured over it).
    pub idle: Duration,
}

/// The agent's longest time between two reads of the rollout view while a gate holds its release.
pub const GATE_READ_EVERY: Duration = Duration::from_secs(5);

/// The agent's poll jitter: each wait is `interval × (1 ± JITTER)`.
pub const JITTER: f64 = 0.2;

pub const FLEET: &str = "acme";
pub const CHANNEL: &str = "stable";
const REGIONS: [&str; 4] = ["eu-west-1", "us-east-1", "ap-south-1", "sa-east-1"];
const ENVS: [&str; 3] = ["prod", "staging", "dev"];

/// What the agents did, counted.
#[derive(Debug, Default)]
struct Counters {
    polls: AtomicU64,
    not_modified: AtomicU64,
    bundles: AtomicU64,
    heartbeats: AtomicU64,
    /// 429s (heartbeats shed), then retried after `Retry-After`.
    shed: AtomicU64,
    /// Requests that failed (connection closed under it, refused answer) and were retried.
    errors: AtomicU64,
    reconnects: AtomicU64,
    /// Objects rendered, summed over accepted releases.
    objects: AtomicU64,
    /// Reads of the rollout view by held agents' wave gates, and those answered 304.
    gate_reads: AtomicU64,
    gate_not_modified: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> [u64; 8] {
        [
            &self.polls,
            &self.not_modified,
            &self.bundles,
            &self.heartbeats,
            &self.shed,
            &self.errors,
            &self.reconnects,
            &self.objects,
        ]
        .map(|c| c.load(Ordering::Relaxed))
    }
}

/// Per agent, when (ms since the run's epoch) it first saw a serial's pointer and when the server answered
/// 2xx to its first heartbeat carrying it; `u64::MAX` until then. Index: serial − 1 (two releases).
#[derive(Debug)]
struct Moments {
    saw: [Vec<AtomicU64>; 2],
    acked: [Vec<AtomicU64>; 2],
}

impl Moments {
    fn new(agents: usize) -> Self {
        let column = || (0..agents).map(|_| AtomicU64::new(u64::MAX)).collect();
        Self {
            saw: [column(), column()],
            acked: [column(), column()],
        }
    }

    fn slot(column: &[Vec<AtomicU64>; 2], serial: u64, agent: usize) -> Option<&AtomicU64> {
        column
            .get(usize::try_from(serial).ok()?.checked_sub(1)?)?
            .get(agent)
    }

    /// The latest of a column for one serial, ms, if every agent has one.
    fn last(column: &[Vec<AtomicU64>; 2], serial: u64) -> Option<u64> {
        let values = column.get(usize::try_from(serial).ok()?.checked_sub(1)?)?;
        values
            .iter()
            .map(|v| v.load(Ordering::Relaxed))
            .try_fold(0, |max, v| (v != u64::MAX).then_some(max.max(v)))
    }

    /// The moments of a column for one serial since `from_ms`, by agent; `None` for agents without one.
    fn since_by_agent(
        column: &[Vec<AtomicU64>; 2],
        serial: u64,
        from_ms: u64,
    ) -> Vec<Option<Duration>> {
        let Some(values) = usize::try_from(serial)
            .ok()
            .and_then(|s| column.get(s.checked_sub(1)?))
        else {
            return Vec::new();
        };
        values
            .iter()
            .map(|v| match v.load(Ordering::Relaxed) {
                u64::MAX => None,
                ms => Some(Duration::from_millis(ms.saturating_sub(from_ms))),
            })
            .collect()
    }

    /// The moments of a column for one serial since `from_ms`, sorted; agents without one count as never.
    fn since(column: &[Vec<AtomicU64>; 2], serial: u64, from_ms: u64) -> Vec<Duration> {
        let Some(values) = usize::try_from(serial)
            .ok()
            .and_then(|s| column.get(s.checked_sub(1)?))
        else {
            return Vec::new();
        };
        let mut out: Vec<Duration> = values
            .iter()
            .map(|v| match v.load(Ordering::Relaxed) {
                u64::MAX => Duration::MAX,
                ms => Duration::from_millis(ms.saturating_sub(from_ms)),
            })
            .collect();
        out.sort();
        out
    }
}

/// What the agents share.
#[derive(Debug)]
struct Shared {
    addr: SocketAddr,
    trusted: TrustedKeys,
    settings: Settings,
    epoch: Instant,
    counters: Counters,
    moments: Moments,
    /// How often a held agent's wave gate reads the rollout view: `min(poll, 5 s)`, as the agent's
    /// (`GATE_READ_EVERY` in `agent/src/gates/pending.rs`).
    gate_every: Duration,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}

/// The measured convergence.
#[derive(Debug, Clone)]
pub struct Convergence {
    pub agents: usize,
    pub enrol: Duration,
    pub cold_start: Duration,
    /// Publish → the database shows every cluster on the new serial.
    pub converged: Duration,
    /// Publish → the last agent's first poll that saw the new pointer (the schedule's floor).
    pub last_saw: Duration,
    /// Publish → the agents' first polls that saw the new pointer, 99th percentile (nearest rank).
    pub saw_p99: Duration,
    /// Publish → the last 2xx answer to a heartbeat with the new serial, as the agents saw it.
    pub last_acked: Duration,
    /// Server CPU while converging, cores (CPU seconds per second).
    pub converging_cores: f64,
    /// The simulated agents' (this process's) and other processes' CPU while converging, cores.
    pub bench_cores: f64,
    pub others_cores: f64,
    /// Server CPU in the steady state, cores.
    pub idle_cores: f64,
    pub idle_length: Duration,
    /// Server memory: before the agents connected, at most while converging, at the end.
    pub memory_before: Memory,
    pub rss_peak_converging_mib: f64,
    pub memory_end: Memory,
    /// Counters over the convergence window: polls, 304s, bundles, heartbeats, 429s, errors, reconnects.
    pub during: [u64; 8],
    pub bundle_bytes: u64,
    /// Objects one agent rendered, on average.
    pub objects_per_agent: f64,
}

/// The fleet tree of release `version`: eight apps, some for every cluster, some by region or environment,
/// with per-region values and `${cluster.name}`.
pub fn fleet_tree(version: u32) -> anyhow::Result<FleetTree> {
    let tree = FleetTree::new()?;
    let mut fleet = format!("fleet: {FLEET}\napps:\n");
    let apps: [(&str, &str); 8] = [
        ("base", ""),
        ("monitoring", ""),
        ("ingress", ""),
        ("logging", "    selector: {matchLabels: {env: prod}}\n"),
        (
            "payments",
            "    selector: {matchExpressions: [{key: region, operator: In, values: [eu-west-1, us-east-1]}]}\n",
        ),
        (
            "batch",
            "    selector: {matchExpressions: [{key: env, operator: NotIn, values: [prod]}]}\n",
        ),
        ("edge", "    selector: {matchLabels: {tier: edge}}\n"),
        (
            "search",
            "    selector: {matchLabels: {region: ap-south-1}}\n",
        ),
    ];
    for (app, selector) in apps {
        let _ = write!(
            fleet,
            "  - name: {app}\n    path: apps/{app}\n{selector}    values: {{replicas: 2, retention: 7d}}\n    \
             customizations:\n      - selector: {{matchLabels: {{region: eu-west-1}}}}\n        values: {{retention: 30d}}\n"
        );
        let mut manifests = format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {app}}}\n");
        for cm in 0..5 {
            let _ = write!(
                manifests,
                "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {app}-config-{cm}, namespace: {app}}}\n\
                 data:\n  cluster: '${{cluster.name}}'\n  region: '${{cluster.labels.region}}'\n  \
                 retention: '${{values.retention}}'\n  release: 'v{version}'\n  settings: '{}'\n",
                "s".repeat(200)
            );
        }
        let _ = write!(
            manifests,
            "---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {app}, namespace: {app}}}\nspec:\n  \
             replicas: 2\n  selector: {{matchLabels: {{app: {app}}}}}\n  template:\n    metadata: {{labels: {{app: {app}}}}}\n    \
             spec:\n      containers: [{{name: {app}, image: 'registry.example.com/{app}:1.{version}'}}]\n"
        );
        tree.write(&format!("apps/{app}/objects.yaml"), &manifests)?;
    }
    tree.write("fleet.yaml", &fleet)?;
    Ok(tree)
}

pub fn identity(i: usize) -> ClusterIdentity {
    let labels: BTreeMap<String, String> = [
        ("region", REGIONS[i % REGIONS.len()]),
        ("env", ENVS[(i / REGIONS.len()) % ENVS.len()]),
        ("tier", if i.is_multiple_of(5) { "edge" } else { "core" }),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    ClusterIdentity {
        name: format!("sim-{i:05}"),
        labels,
    }
}

/// A deterministic stream of numbers in [0, 1) per agent (splitmix64): jitter without a random source.
struct Jitter(u64);

impl Jitter {
    fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `interval × (1 ± JITTER)`, as the agent's `jittered`.
    fn around(&mut self, interval: Duration) -> Duration {
        interval.mul_f64(1.0 - JITTER + 2.0 * JITTER * self.unit())
    }
}

/// Runs the whole timeline with `binary` as the server.
pub async fn measure(binary: &Path, work: &Path, s: Settings) -> anyhow::Result<Convergence> {
    let (measured, _) = measure_with(binary, work, s, "convergence", &fleet_tree(2)?).await?;
    Ok(measured)
}

/// What a run leaves for a section that looks closer at the second release (the waves section).
#[derive(Debug)]
pub struct Published {
    /// The second release's pointer, as published.
    pub pointer: ReleasePointer,
    /// The wall-clock time just before it was published.
    pub at: Timestamp,
    /// Per agent (by index): when the server answered 2xx to its first heartbeat carrying the release,
    /// since the publish; `None` if it never did.
    pub acked: Vec<Option<Duration>>,
    /// Reads of the rollout view by the agents' wave gates, and of them `304`s, while converging.
    pub gate_reads: u64,
    pub gate_not_modified: u64,
}

/// Runs the timeline publishing `second` as the second release; `name` prefixes the progress lines and
/// names the server's log.
pub async fn measure_with(
    binary: &Path,
    work: &Path,
    s: Settings,
    name: &str,
    second: &FleetTree,
) -> anyhow::Result<(Convergence, Published)> {
    let publisher = Publisher::new(21)?;
    let first = publisher.publish(&fleet_tree(1)?, CHANNEL)?;
    let trusted = TrustedKeys::from_pems([(
        "release key",
        std::fs::read_to_string(publisher.public_key_path())?.as_str(),
    )])?;
    let mut server = ServerProcess::start(
        binary,
        &publisher.store(),
        work,
        &format!("{name}-server"),
        &[],
    )
    .await?;
    let pid = server.pid()?;
    let (identities, keys, enrol) = enroll(server.addr, s, name).await?;
    let memory_before = tree_memory(pid)?;

    let shared = Arc::new(Shared {
        addr: server.addr,
        trusted,
        settings: s,
        epoch: Instant::now(),
        counters: Counters::default(),
        moments: Moments::new(s.agents),
        gate_every: s.poll_interval.min(GATE_READ_EVERY),
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    crate::progress(&format!(
        "{name}: {} agents polling every {} s (±20 %), cold start on serial {}",
        s.agents,
        s.poll_interval.as_secs(),
        first.serial
    ));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(s.agents);
    for (i, identity) in identities.into_iter().enumerate() {
        let agent = SimAgent::new(i, identity, keys[i].clone(), Arc::clone(&shared));
        tasks.push(tokio::spawn(agent.run(stop_rx.clone())));
    }
    let db = SqliteDb::open(&server.data)?;
    let deadline = s.poll_interval * 4 + Duration::from_secs(120);
    let cold_start =
        wait_converged(&db, first.serial, s.agents, deadline, &mut server).await? - started;

    crate::progress(&format!(
        "{name}: cold start took {:.1} s; idling {} s",
        cold_start.as_secs_f64(),
        s.idle.as_secs()
    ));
    let (idle_cores, idle_length) = crate::cpu::cores_over(pid, s.idle).await?;
    let timeline = Timeline {
        publisher: &publisher,
        shared: &shared,
        db: &db,
        deadline,
        name,
    };
    let rollout = timeline.publish(second, &mut server).await?;
    let memory_end = tree_memory(pid)?;
    stop_tx.send_replace(true);
    for task in tasks {
        task.await??;
    }
    server.check_running()?;
    let convergence = Convergence {
        agents: s.agents,
        enrol,
        cold_start,
        converged: rollout.converged,
        last_saw: rollout.last_saw,
        saw_p99: rollout.saw_p99,
        last_acked: rollout.last_acked,
        converging_cores: rollout.cores[0],
        bench_cores: rollout.cores[1],
        others_cores: rollout.cores[2],
        idle_cores,
        idle_length,
        memory_before,
        rss_peak_converging_mib: rollout.rss_peak_mib,
        memory_end,
        during: rollout.during,
        bundle_bytes: rollout.published.pointer.bundle.size,
        objects_per_agent: rollout.during[7] as f64 / s.agents as f64,
    };
    Ok((convergence, rollout.published))
}

/// Enrols `s.agents` simulated clusters at the server: their identities, their keys and how long it took.
async fn enroll(
    addr: SocketAddr,
    s: Settings,
    name: &str,
) -> anyhow::Result<(Vec<ClusterIdentity>, Arc<Vec<SigningKey>>, Duration)> {
    crate::progress(&format!("{name}: enrolling {} agents", s.agents));
    let identities: Vec<ClusterIdentity> = (0..s.agents).map(identity).collect();
    let keys: Arc<Vec<SigningKey>> = Arc::new(
        (0..s.agents as u64)
            .map(crate::heartbeat::cluster_key)
            .collect(),
    );
    let enrolling = Instant::now();
    let clusters: Vec<crate::heartbeat::Enrolment> = identities
        .iter()
        .map(|id| (id.name.clone(), id.labels.clone()))
        .collect();
    crate::heartbeat::enroll_all(addr, &clusters, &keys).await?;
    Ok((identities, keys, enrolling.elapsed()))
}

/// What the second release's timeline needs: the fleet running, its server's database to watch.
struct Timeline<'a> {
    publisher: &'a Publisher,
    shared: &'a Arc<Shared>,
    db: &'a SqliteDb,
    /// How long the fleet may take to converge, soaks aside.
    deadline: Duration,
    name: &'a str,
}

/// The second release's convergence, as [`Timeline::publish`] measured it.
struct Rollout {
    converged: Duration,
    last_saw: Duration,
    saw_p99: Duration,
    last_acked: Duration,
    /// Cores used meanwhile by the server, this bench and other processes.
    cores: [f64; 3],
    rss_peak_mib: f64,
    /// The agents' counters' increase meanwhile.
    during: [u64; 8],
    published: Published,
}

impl Timeline<'_> {
    /// Publishes `second` and waits until every cluster acknowledged it, measuring the server meanwhile.
    async fn publish(
        &self,
        second: &FleetTree,
        server: &mut ServerProcess,
    ) -> anyhow::Result<Rollout> {
        let shared = self.shared;
        let pid = server.pid()?;
        let before = shared.counters.snapshot();
        let gate_before = [
            shared.counters.gate_reads.load(Ordering::Relaxed),
            shared.counters.gate_not_modified.load(Ordering::Relaxed),
        ];
        let split = crate::server::CpuSplit::start(pid);
        let publish_ms = shared.now_ms();
        let published_at = Instant::now();
        let published_wall = Timestamp::now();
        let second = self.publisher.publish(second, CHANNEL)?;
        crate::progress(&format!(
            "{}: published serial {}; waiting for every agent's acknowledgement",
            self.name, second.serial
        ));
        let sampler = RssSampler::start(pid);
        // A release in waves takes its soaks longer.
        let soaks: Duration = second
            .rollout
            .as_ref()
            .map(|r| r.waves.iter().map(|w| w.soak).sum())
            .unwrap_or_default();
        let agents = shared.settings.agents;
        let converged = wait_converged(
            self.db,
            second.serial,
            agents,
            self.deadline + soaks,
            server,
        )
        .await?
            - published_at;
        let (server_cpu, bench_cpu, others_cpu) = split.stop(pid);
        let per_second = |d: Duration| d.as_secs_f64() / converged.as_secs_f64().max(0.001);
        let rss_peak_mib = sampler.stop().await;
        let after = shared.counters.snapshot();
        let during: [u64; 8] = std::array::from_fn(|i| after[i] - before[i]);
        let since_publish = |ms: Option<u64>| {
            Duration::from_millis(
                ms.map_or(u64::MAX, |m| m.saturating_sub(publish_ms))
                    .min(u64::MAX / 2),
            )
        };
        let moments = &shared.moments;
        Ok(Rollout {
            converged,
            last_saw: since_publish(Moments::last(&moments.saw, second.serial)),
            saw_p99: crate::drift::quantile(
                &Moments::since(&moments.saw, second.serial, publish_ms),
                0.99,
            ),
            last_acked: since_publish(Moments::last(&moments.acked, second.serial)),
            cores: [server_cpu, bench_cpu, others_cpu].map(per_second),
            rss_peak_mib,
            during,
            published: Published {
                at: published_wall,
                acked: Moments::since_by_agent(&moments.acked, second.serial, publish_ms),
                gate_reads: shared.counters.gate_reads.load(Ordering::Relaxed) - gate_before[0],
                gate_not_modified: shared.counters.gate_not_modified.load(Ordering::Relaxed)
                    - gate_before[1],
                pointer: second,
            },
        })
    }
}

/// Reads the server's database four times a second until every cluster reports `serial`; returns when it
/// saw that.
async fn wait_converged(
    db: &SqliteDb,
    serial: u64,
    agents: usize,
    timeout: Duration,
    server: &mut ServerProcess,
) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + timeout;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let clusters = db.list_clusters().await?;
        let on_serial = clusters
            .iter()
            .filter(|c| c.applied_serial == Some(serial))
            .count();
        if on_serial >= agents {
            return Ok(Instant::now());
        }
        server.check_running()?;
        anyhow::ensure!(
            Instant::now() < deadline,
            "after {timeout:?}, {on_serial} of {agents} clusters report serial {serial}"
        );
    }
}

/// Samples a process's VmRSS every 100 ms until stopped; returns the largest, MiB.
pub struct RssSampler {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<f64>,
}

impl RssSampler {
    pub fn start(pid: u32) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut peak: f64 = 0.0;
            loop {
                if let Ok(memory) = tree_memory(pid) {
                    peak = peak.max(memory.rss_mib);
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = stopped.changed() => return peak,
                }
            }
        });
        Self { stop, task }
    }

    pub async fn stop(self) -> f64 {
        self.stop.send_replace(true);
        self.task.await.unwrap_or(0.0)
    }
}

/// One simulated agent.
struct SimAgent {
    index: usize,
    identity: ClusterIdentity,
    key: SigningKey,
    shared: Arc<Shared>,
    conn: Option<Conn>,
    jitter: Jitter,
    etag: Option<String>,
    /// The accepted release: pointer and its bundle's digest.
    accepted: Option<ReleasePointer>,
    /// The serial reported as applied.
    applied: Option<u64>,
    sequence: u64,
    /// A heartbeat with a serial not yet acknowledged.
    unreported: bool,
    /// A verified release waiting for this agent's rollout wave, with the gate's last view.
    held: Option<Held>,
}

/// A release held for its wave, as the agent holds it (`agent/src/gates/pending.rs`): the agent's own
/// [`GatePlan`] decides, with the rollout view the gate last read (and its ETag, for `If-None-Match`).
struct Held {
    pointer: ReleasePointer,
    plan: GatePlan,
    /// The gate's last view of the server, and that answer's ETag.
    view: (Option<String>, GateObservation),
}

impl Held {
    /// The hold of a verified release for this cluster; `None` when it takes it at once.
    fn of(pointer: &ReleasePointer, identity: &ClusterIdentity) -> Option<Held> {
        let plan = GatePlan::of(
            pointer.serial,
            pointer.issued_at,
            pointer.rollout.as_ref(),
            &identity.name,
            &identity.labels,
        )?;
        Some(Held {
            pointer: pointer.clone(),
            plan,
            view: (None, None),
        })
    }

    /// How long until the wave's signed time: the gate reads the server only from then on.
    fn opens_in(&self) -> Duration {
        rollout::opens_at(&self.plan.rollout, self.plan.issued_at, self.plan.wave)
            .duration_since(Timestamp::now())
            .try_into()
            .unwrap_or(Duration::ZERO)
    }
}

/// Why a request did not get a usable answer.
enum Trouble {
    /// 429: try again after this long.
    Busy(Duration),
    /// Anything else: counted, retried at the next turn.
    Failed,
}

impl SimAgent {
    fn new(index: usize, identity: ClusterIdentity, key: SigningKey, shared: Arc<Shared>) -> Self {
        Self {
            index,
            identity,
            key,
            shared,
            conn: None,
            jitter: Jitter(index as u64 ^ 0x5EED),
            etag: None,
            accepted: None,
            applied: None,
            sequence: 0,
            unreported: false,
            held: None,
        }
    }

    async fn run(mut self, mut stop: watch::Receiver<bool>) -> anyhow::Result<()> {
        let settings = self.shared.settings;
        // As if it had been running: the first poll and heartbeat at a random phase.
        let start = tokio::time::Instant::now();
        let mut next_poll = start + settings.poll_interval.mul_f64(self.jitter.unit());
        let mut next_heartbeat = start + settings.heartbeat_interval.mul_f64(self.jitter.unit());
        // The held release's next gate check (the wave's signed time, then every `gate_every`).
        let mut next_gate: Option<tokio::time::Instant> = None;
        loop {
            let wake = next_poll.min(next_heartbeat);
            let wake = next_gate.map_or(wake, |gate| gate.min(wake));
            tokio::select! {
                _ = tokio::time::sleep_until(wake) => {}
                _ = stop.changed() => return Ok(()),
            }
            let now = tokio::time::Instant::now();
            if now >= next_poll {
                next_poll = match self.poll().await {
                    Ok(()) => now + self.jitter.around(settings.poll_interval),
                    Err(Trouble::Busy(wait)) => now + wait,
                    Err(Trouble::Failed) => now + Duration::from_secs(1),
                };
                if self.unreported {
                    next_heartbeat = now;
                }
                if next_gate.is_none()
                    && let Some(held) = &self.held
                {
                    // As the agent: from one gate read before the wave's signed time on.
                    next_gate = Some(now + held.opens_in().saturating_sub(self.shared.gate_every));
                }
            }
            if next_gate.is_some_and(|at| now >= at) {
                next_gate = self.gate().await.map(|wait| now + wait);
                if next_gate.is_none() {
                    // The wave opened and the release was taken: report it at once.
                    next_heartbeat = now;
                }
            }
            if tokio::time::Instant::now() >= next_heartbeat {
                next_heartbeat = match self.heartbeat().await {
                    Ok(()) => {
                        tokio::time::Instant::now()
                            + self.jitter.around(settings.heartbeat_interval)
                    }
                    Err(Trouble::Busy(wait)) => tokio::time::Instant::now() + wait,
                    Err(Trouble::Failed) => tokio::time::Instant::now() + Duration::from_secs(1),
                };
            }
        }
    }

    /// Sends a request on the agent's connection, reopening it once if the server closed it.
    async fn request(
        &mut self,
        path: &str,
        body: Option<Bytes>,
        etag: Option<&str>,
    ) -> Option<crate::server::Answer> {
        for _ in 0..2 {
            if self.conn.as_ref().is_none_or(|c| !c.is_open()) {
                self.shared
                    .counters
                    .reconnects
                    .fetch_add(1, Ordering::Relaxed);
                self.conn = Conn::open(self.shared.addr).await.ok();
            }
            let conn = self.conn.as_mut()?;
            let result = match &body {
                Some(body) => conn.post(path, body.clone()).await,
                None => {
                    let headers: Vec<(&str, &str)> =
                        etag.map(|e| ("if-none-match", e)).into_iter().collect();
                    conn.get(path, &headers).await
                }
            };
            match result {
                Ok(answer) => return Some(answer),
                Err(_) => {
                    self.shared.counters.errors.fetch_add(1, Ordering::Relaxed);
                    self.conn = None;
                }
            }
        }
        None
    }

    async fn poll(&mut self) -> Result<(), Trouble> {
        let counters = &self.shared.counters;
        counters.polls.fetch_add(1, Ordering::Relaxed);
        let etag = self.etag.clone();
        let path = format!("/channels/{CHANNEL}.json");
        let answer = self
            .request(&path, None, etag.as_deref())
            .await
            .ok_or(Trouble::Failed)?;
        let counters = &self.shared.counters;
        match answer.status {
            304 => {
                counters.not_modified.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            200 => {}
            429 => {
                return Err(Trouble::Busy(
                    answer.retry_after.unwrap_or(Duration::from_secs(5)),
                ));
            }
            _ => {
                counters.errors.fetch_add(1, Ordering::Relaxed);
                return Err(Trouble::Failed);
            }
        }
        let highest = self
            .accepted
            .as_ref()
            .map(|p| (p.serial, p.bundle.sha256.as_str()));
        let mut expect =
            PointerExpectations::new(&self.shared.trusted, FLEET, CHANNEL, Timestamp::now());
        expect.highest_accepted = highest;
        let Ok(release) = verify_pointer(&answer.body, &expect) else {
            counters.errors.fetch_add(1, Ordering::Relaxed);
            return Err(Trouble::Failed);
        };
        let pointer = release.pointer;
        if let Some(slot) = Moments::slot(&self.shared.moments.saw, pointer.serial, self.index) {
            let _ = slot.compare_exchange(
                u64::MAX,
                self.shared.now_ms(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        let held_already = self
            .held
            .as_ref()
            .is_some_and(|h| h.pointer.bundle.sha256 == pointer.bundle.sha256);
        if held_already
            || self
                .accepted
                .as_ref()
                .is_some_and(|p| p.bundle.sha256 == pointer.bundle.sha256)
        {
            self.etag = answer.etag;
            return Ok(());
        }
        let bundle_path = format!("/bundles/{}.json", pointer.bundle.sha256);
        let bundle = self
            .request(&bundle_path, None, None)
            .await
            .ok_or(Trouble::Failed)?;
        let counters = &self.shared.counters;
        counters.bundles.fetch_add(1, Ordering::Relaxed);
        if bundle.status != 200 {
            counters.errors.fetch_add(1, Ordering::Relaxed);
            return Err(Trouble::Failed);
        }
        let Ok(bundle) = verify_bundle(
            &bundle.body,
            &pointer,
            DEFAULT_MAX_BUNDLE_BYTES,
            BundleLimits::default(),
        ) else {
            counters.errors.fetch_add(1, Ordering::Relaxed);
            return Err(Trouble::Failed);
        };
        // The agent's render: every selected app, then its desired objects.
        let objects = all_or_first_error(cluster_share(&bundle, &self.identity))
            .map_err(|_| Trouble::Failed)?
            .len();
        counters
            .objects
            .fetch_add(objects as u64, Ordering::Relaxed);
        self.etag = answer.etag;
        if let Some(held) = Held::of(&pointer, &self.identity) {
            // Verified, and waits for its wave while the last known good stays.
            self.held = Some(held);
            return Ok(());
        }
        self.take(pointer);
        Ok(())
    }

    /// Takes a verified release: applied (simulated), to be reported at once.
    fn take(&mut self, pointer: ReleasePointer) {
        self.held = None;
        self.applied = Some(pointer.serial);
        self.accepted = Some(pointer);
        self.unreported = true;
    }

    /// The held release's gate, as the agent's (`agent/src/gates/wave.rs`): the agent's own decision
    /// ([`wave::judge`]) on the rollout view it reads from the server (`?summary=1`, revalidated with its
    /// ETag) when the plan needs it. Takes the release when the wave opens; otherwise, when to look again.
    async fn gate(&mut self) -> Option<Duration> {
        let needs_server = self.held.as_ref()?.plan.needs_server();
        if needs_server {
            self.read_gate().await;
        }
        let held = self.held.as_ref()?;
        match wave::judge(&held.plan, Timestamp::now(), &held.view.1) {
            WaveDecision::Open => {
                let pointer = held.pointer.clone();
                self.take(pointer);
                None
            }
            WaveDecision::Scheduled { .. } => Some(held.opens_in().max(Duration::from_millis(10))),
            WaveDecision::Halted | WaveDecision::Gated { .. } => Some(self.shared.gate_every),
        }
    }

    /// Reads the rollout view for the gate: a `304` keeps the last one; a failure is the gate's reason to
    /// stay closed.
    async fn read_gate(&mut self) {
        let counters = &self.shared.counters;
        counters.gate_reads.fetch_add(1, Ordering::Relaxed);
        let etag = self.held.as_ref().and_then(|h| h.view.0.clone());
        let path = format!("/api/v1/rollouts/{CHANNEL}?summary=1");
        let answer = self.request(&path, None, etag.as_deref()).await;
        let counters = &self.shared.counters;
        let seen = match answer {
            Some(answer) if answer.status == 304 && etag.is_some() => {
                counters.gate_not_modified.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Some(answer) if answer.status == 200 => {
                match serde_json::from_slice::<RolloutView>(&answer.body) {
                    Ok(view) => (answer.etag, Ok(view)),
                    Err(error) => (
                        None,
                        Err(Unreachable(format!("not a rollout view: {error}"))),
                    ),
                }
            }
            Some(answer) => (None, Err(Unreachable(format!("HTTP {}", answer.status)))),
            None => (
                None,
                Err(Unreachable("the server did not answer".to_owned())),
            ),
        };
        if seen.1.is_err() {
            counters.errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(held) = self.held.as_mut() {
            held.view = (seen.0, Some(seen.1));
        }
    }

    async fn heartbeat(&mut self) -> Result<(), Trouble> {
        self.sequence += 1;
        let heartbeat = Heartbeat {
            cluster: self.identity.name.clone(),
            fleet: FLEET.into(),
            sequence: self.sequence,
            sent_at: Timestamp::now(),
            interval_seconds: self.shared.settings.heartbeat_interval.as_secs().max(1),
            agent_version: "0.1.0".into(),
            labels: self.identity.labels.clone(),
            state: if self.applied.is_some() {
                SyncState::Synced
            } else {
                SyncState::Progressing
            },
            source: SourceReport {
                channel: CHANNEL.into(),
                applied_serial: self.applied,
                applied_sha256: self.accepted.as_ref().map(|p| p.bundle.sha256.clone()),
                ..SourceReport::default()
            },
            counts: BTreeMap::new(),
            apps: vec![],
            problems: vec![],
            drift: vec![],
            last_error: None,
        };
        let payload = serde_json::to_vec(&heartbeat).map_err(|_| Trouble::Failed)?;
        let body =
            Bytes::from(dsse::sign(HEARTBEAT_PAYLOAD_TYPE, &payload, &self.key).to_json_bytes());
        let path = format!("/api/v1/clusters/{}/heartbeat", self.identity.name);
        let answer = self
            .request(&path, Some(body), None)
            .await
            .ok_or(Trouble::Failed)?;
        let counters = &self.shared.counters;
        counters.heartbeats.fetch_add(1, Ordering::Relaxed);
        match answer.status {
            200..=299 => {
                if let Some(serial) = self.applied
                    && let Some(slot) =
                        Moments::slot(&self.shared.moments.acked, serial, self.index)
                {
                    let _ = slot.compare_exchange(
                        u64::MAX,
                        self.shared.now_ms(),
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                }
                self.unreported = false;
                Ok(())
            }
            429 => {
                counters.shed.fetch_add(1, Ordering::Relaxed);
                Err(Trouble::Busy(
                    answer.retry_after.unwrap_or(Duration::from_secs(5)),
                ))
            }
            _ => {
                counters.errors.fetch_add(1, Ordering::Relaxed);
                Err(Trouble::Failed)
            }
        }
    }
}

/// The rows: convergence against the poll schedule (goal), the server's own delay (goal), its CPU and memory,
/// and the enrolment.
pub fn report(m: &Convergence, s: Settings, results: &mut crate::Results) {
    results.rows.push(convergence_row(m, s));
    results.rows.extend(server_rows(m));
    results
        .details
        .insert("convergence".into(), details_json(m, s));
}

/// Publish until every cluster acknowledged, against the poll schedule's floor.
fn convergence_row(m: &Convergence, s: Settings) -> Row {
    let secs = |d: Duration| d.as_secs_f64();
    let interval = s.poll_interval.as_secs_f64();
    let longest_wait = interval * (1.0 + JITTER);
    let [
        polls,
        not_modified,
        bundles,
        heartbeats,
        shed,
        errors,
        reconnects,
        _,
    ] = m.during;
    let agents = format_count(m.agents);
    Row::new(
        "convergence",
        "convergence_seconds",
        &format!("fleet convergence, {agents} simulated agents"),
        Unit::Seconds,
        secs(m.converged),
    )
    .baseline("poll schedule: last agent's first poll after publish", secs(m.last_saw))
    .goal(Goal::AtMost(longest_wait + 5.0))
    .note(format!(
        "publish until the server's database shows every cluster on the new serial (read 4×/s); poll \
         interval {interval:.0} s with the agent's ±20 % jitter, so an agent may wait up to {longest_wait:.0} s: \
         the goal is that longest poll interval + 5 s. The last 2xx to a heartbeat with the new serial came \
         {:.1} s after the publish. While converging: {polls} polls ({not_modified} answered 304), {bundles} \
         bundle downloads ({} bytes each), {heartbeats} heartbeats, {shed} shed with 429, {errors} failed \
         requests retried, {reconnects} connections (re)opened; each agent rendered {:.0} objects for its \
         labels. Cold start (agents starting at random phases on the first release): {:.1} s",
        secs(m.last_acked),
        m.bundle_bytes,
        m.objects_per_agent,
        secs(m.cold_start),
    ))
}

/// What the server added and spent: its delay beyond the schedule, its CPU and memory, the enrolment.
fn server_rows(m: &Convergence) -> [Row; 4] {
    let secs = |d: Duration| d.as_secs_f64();
    let agents = format_count(m.agents);
    [
        Row::new(
            "convergence",
            "convergence_server_delay_seconds",
            "convergence: server's delay beyond the poll schedule",
            Unit::Seconds,
            secs(m.converged.saturating_sub(m.last_saw)),
        )
        .goal(Goal::AtMost(5.0))
        .note(
            "convergence minus the schedule's floor: the last bundle download, verification, render and \
             heartbeat round trip, and the database read's resolution (0.25 s)",
        ),
        Row::new(
            "convergence",
            "convergence_server_cores",
            &format!("server CPU while converging, {agents} agents"),
            Unit::Cores,
            m.converging_cores,
        )
        .baseline("same fleet idle (304s and heartbeats)", m.idle_cores)
        .note(format!(
            "CPU seconds per second of windvane-server (/proc) from the publish until converged; idle: over {:.0} s \
             of the converged fleet polling and reporting before the publish. Meanwhile the simulated agents \
             used {:.2} cores, other processes on the machine {:.2}",
            secs(m.idle_length),
            m.bench_cores,
            m.others_cores
        )),
        Row::new(
            "convergence",
            "convergence_server_rss_mib",
            &format!("server RSS while converging, {agents} agents"),
            Unit::MiB,
            m.rss_peak_converging_mib,
        )
        .baseline("before the agents connected", m.memory_before.rss_mib)
        .note(format!(
            "largest VmRSS sampled every 100 ms while converging; {agents} keep-alive connections open. Before: {}; \
             at the end: {}",
            m.memory_before.describe(),
            m.memory_end.describe()
        )),
        Row::new(
            "convergence",
            "enrolment_seconds",
            &format!("enrolment of {agents} agents (registration token)"),
            Unit::Seconds,
            secs(m.enrol),
        )
        .note(format!(
            "16 at a time, one SQLite transaction (fsync) each: {:.0} enrolments/s",
            m.agents as f64 / secs(m.enrol).max(0.001)
        )),
    ]
}

/// The names of [`Convergence::during`]'s counters in `results.json`, in its order.
const DURING_NAMES: [&str; 7] = [
    "polls",
    "notModified",
    "bundles",
    "heartbeats",
    "shed",
    "errors",
    "reconnects",
];

/// The run's figures for `results.json`.
fn details_json(m: &Convergence, s: Settings) -> serde_json::Value {
    let secs = |d: Duration| d.as_secs_f64();
    let interval = s.poll_interval.as_secs_f64();
    let mut details = serde_json::json!({
        "agents": m.agents,
        "pollIntervalSeconds": interval,
        "jitter": JITTER,
        "enrolSeconds": secs(m.enrol),
        "coldStartSeconds": secs(m.cold_start),
        "convergedSeconds": secs(m.converged),
        "lastSawSeconds": secs(m.last_saw),
        "sawP99Seconds": secs(m.saw_p99),
        "lastAckedSeconds": secs(m.last_acked),
        "convergingCores": m.converging_cores,
        "agentsCores": m.bench_cores,
        "otherProcessesCores": m.others_cores,
        "idleCores": m.idle_cores,
        "rssBeforeMiB": m.memory_before.rss_mib,
        "rssPeakConvergingMiB": m.rss_peak_converging_mib,
        "rssEndMiB": m.memory_end.rss_mib,
        "hwmEndMiB": m.memory_end.peak_mib,
        "bundleBytes": m.bundle_bytes,
        "objectsPerAgent": m.objects_per_agent,
    });
    for (name, count) in DURING_NAMES.iter().zip(m.during) {
        details[*name] = count.into();
    }
    details
}

/// `10,000`.
pub fn format_count(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
