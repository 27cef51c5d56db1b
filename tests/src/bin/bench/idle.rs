//! Steady state: with the large release synced and nothing changing, what does the agent ask of the
//! apiserver? Two scrapes of the apiserver's `/metrics`, one idle window apart.
//!
//! - Writes by the agent (its FlowSchemas, see [`crate::apiserver`]), Leases and Events apart: the goal is
//!   none. Lease renewals are the agent's leader election (a GET and a PUT every 5 s, 720 writes an hour
//!   whatever the number of objects) and are reported on their own row.
//! - Requests per managed object per hour, every verb, without the Lease renewals and without watches
//!   (long-lived; they only restart when the apiserver ends them): the goal is ≤ 1.
//! - For context, every client's writes on the same apiserver in the same window (`apiserver_request_total`,
//!   Leases, Events and dry runs left out): the control plane's own background, the agent included.
//!
//! The agent's backstop (a server-side dry-run of every object, hourly by default) is the one periodic
//! request it makes, and an idle window of minutes cannot catch it. So it is measured on its own: the agent
//! is restarted with a short backstop interval and one pass is counted, then amortised over the default
//! hour. The restart also shows what a restart costs (its re-sync).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use windvane_tests::localkube::LocalKube;

use crate::agent::{AgentLaunch, AgentProcess};
use crate::apiserver::{self, Identity, RequestClass, RequestCounts, scrape};
use crate::prom;

/// What one idle window showed.
#[derive(Debug, Clone)]
pub struct IdleWindow {
    pub length: Duration,
    /// The agent's requests in the window.
    pub agent: RequestCounts,
    /// Writes by every client (Leases and Events left out), by verb and resource.
    pub all_writes: BTreeMap<String, f64>,
    /// The agent's own count of object writes in the window.
    pub agent_applies: f64,
    /// The agent's source polls in the window (to the store, not the apiserver).
    pub agent_polls: f64,
}

impl IdleWindow {
    /// The agent's writes other than Lease renewals and Events.
    pub fn agent_writes(&self) -> f64 {
        self.agent.get(RequestClass::Write)
    }

    /// Every client's writes (Leases and Events left out).
    pub fn all_writes_total(&self) -> f64 {
        self.all_writes.values().sum()
    }

    /// The agent's requests per managed object per hour in the window: every class but Lease traffic and
    /// watches.
    pub fn requests_per_object_hour(&self, objects: usize) -> f64 {
        counted(&self.agent) / objects as f64 / (self.length.as_secs_f64() / 3600.0)
    }
}

/// The agent's default `--backstop-interval`.
pub const DEFAULT_BACKSTOP_INTERVAL: Duration = Duration::from_secs(3600);
/// The backstop interval of the restarted agent, so its first pass comes soon (±20 % jitter).
pub const MEASURED_BACKSTOP_INTERVAL: &str = "20s";

/// One backstop pass, and the restart before it.
#[derive(Debug, Clone)]
pub struct BackstopPass {
    /// The agent's requests from its restart until its sync finished.
    pub restart: RequestCounts,
    /// Objects the restart's sync wrote.
    pub restart_written: f64,
    /// The agent's requests during one backstop pass.
    pub pass: RequestCounts,
    /// Dry runs during the pass (one per object is expected).
    pub dry_runs: f64,
    /// How long the pass took.
    pub took: Duration,
}

impl BackstopPass {
    /// The pass's requests per managed object per hour at the default interval (every class but Lease
    /// traffic and watches).
    pub fn requests_per_object_hour(&self, objects: usize) -> f64 {
        counted(&self.pass) / objects as f64 * (3600.0 / DEFAULT_BACKSTOP_INTERVAL.as_secs_f64())
    }
}

/// Requests that count against the steady-state goal: all but Lease traffic and watches.
fn counted(requests: &RequestCounts) -> f64 {
    requests.get(RequestClass::Write)
        + requests.get(RequestClass::Read)
        + requests.get(RequestClass::Event)
}

/// Restarts the agent (`launch` must set a short `--backstop-interval`), waits for its sync, then counts
/// its requests from then until one backstop pass is done (as many dry runs as objects), and stops it.
pub async fn measure_backstop(
    kube: &LocalKube,
    identity: &Identity,
    launch: &AgentLaunch,
    objects: usize,
) -> anyhow::Result<BackstopPass> {
    let client = kube.client();
    let (mut agent, sync) =
        crate::sync::agent_first_sync(kube, identity, launch, crate::workload::AGENT_PREFIX, None)
            .await?;
    // Let the restart's watches list before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = scrape(&client).await?;
    let dry_runs_before = apiserver::dry_runs(&before);
    let mut started = None;
    let deadline = Instant::now() + Duration::from_secs(120);
    let after = loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = scrape(&client).await?;
        let dry_runs = apiserver::dry_runs(&now) - dry_runs_before;
        if dry_runs > 0.0 {
            started.get_or_insert_with(Instant::now);
        }
        if dry_runs >= objects as f64 {
            break now;
        }
        agent.check_running()?;
        anyhow::ensure!(
            Instant::now() < deadline,
            "no backstop pass within 2 minutes ({dry_runs} dry runs); agent log tail:\n{}",
            agent.log_tail()
        );
    };
    agent.stop();
    Ok(BackstopPass {
        restart: sync.requests,
        restart_written: sync.written,
        pass: identity.requests(&after).since(&identity.requests(&before)),
        dry_runs: apiserver::dry_runs(&after) - dry_runs_before,
        took: started.map_or(Duration::ZERO, |s| s.elapsed()),
    })
}

/// Measures one idle window of `length`.
pub async fn measure(
    kube: &LocalKube,
    agent: &AgentProcess,
    identity: &Identity,
    length: Duration,
) -> anyhow::Result<IdleWindow> {
    let client = kube.client();
    let agent_counter = |metrics: &[prom::Sample], name: &str| prom::sum(metrics, name, |_| true);
    let agent_before = agent.metrics().await?;
    let before = scrape(&client).await?;
    let started = Instant::now();
    tokio::time::sleep(length).await;
    let after = scrape(&client).await?;
    let length = started.elapsed();
    let agent_after = agent.metrics().await?;
    Ok(IdleWindow {
        length,
        agent: identity.requests(&after).since(&identity.requests(&before)),
        all_writes: apiserver::difference(
            &apiserver::writes_by_resource(&after),
            &apiserver::writes_by_resource(&before),
        ),
        agent_applies: prom::sum(&agent_after, "windvane_apply_total", |s| {
            s.label("result") == "written"
        }) - prom::sum(&agent_before, "windvane_apply_total", |s| {
            s.label("result") == "written"
        }),
        agent_polls: agent_counter(&agent_after, "windvane_source_fetch_total")
            - agent_counter(&agent_before, "windvane_source_fetch_total"),
    })
}
