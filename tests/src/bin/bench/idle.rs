//! Steady state: with the large release synced and nothing changing, what does the agent ask of the
//! apiserver? Two scrapes of the apiserver's `/metrics`, one idle window apart.
//!
//! - Writes by the agent (its FlowSchemas, see [`crate::apiserver`]), Leases and Events apart: the goal is
//!   none. Lease renewals are the agent's leader election (a GET and a PUT every 5 s, 720 writes an hour
//!   whatever the number of objects) and are reported on their own row.
//! - Requests per managed object per hour, every verb, without the Lease renewals and without watches
//!   (long-lived; they only restart when the apiserver ends them): the goal is ≤ 1.
//! - For context, every client's writes on the same apiserver in the same window (`apiserver_request_total`,
//!   Leases and Events left out): the control plane's own background, the agent included.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use windvane_tests::localkube::LocalKube;

use crate::agent::AgentProcess;
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

    /// The agent's requests per managed object per hour: every class but Lease traffic and watches.
    pub fn requests_per_object_hour(&self, objects: usize) -> f64 {
        let counted = self.agent.get(RequestClass::Write)
            + self.agent.get(RequestClass::Read)
            + self.agent.get(RequestClass::Event);
        counted / objects as f64 / (self.length.as_secs_f64() / 3600.0)
    }
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
