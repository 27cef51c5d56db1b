//! Drift repair latency: a foreign manager changes a field the agent owns; how long until a watch shows the
//! field restored? Measured from the foreign update's response to the arrival, at the benchmark's own watch
//! on the same apiserver, of the event that shows the release's value again.
//!
//! Each trial changes one entry of a managed ConfigMap with a JSON merge patch. The agent notices that a
//! manager took one of its fields and backs off when the *same* manager takes a field of the *same* object
//! three times in ten minutes (a controller war: it marks the object Contested and stops reverting). So
//! every trial targets another ConfigMap (100 trials, 790 ConfigMaps) under another manager name
//! (`intruder-N`): each (object, manager) pair is seen once and the agent reverts every time, as it would
//! for a person's one-off `kubectl edit`.
//!
//! The baseline is one server-side apply round trip to the same apiserver, as the agent itself makes to
//! revert: a forced apply of a ConfigMap of the same size that changes a value (so it is a real write), by
//! a client with the same kind of identity. Trials and baseline round trips alternate, so both see the same
//! background load.

use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use tokio::sync::mpsc;
use windvane_shared::decide::desired::FLEET_LABEL;
use windvane_tests::localkube::LocalKube;

use crate::workload;

/// How long one trial waits for the repair before it counts as not repaired.
pub const TRIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between trials, so one trial's Events and status updates are done before the next starts.
const PAUSE: Duration = Duration::from_millis(100);
const PROBE_NAMESPACE: &str = "bench-ssa";

/// A ConfigMap as the benchmark's watch saw it.
#[derive(Debug, Clone)]
struct Seen {
    at: Instant,
    namespace: String,
    name: String,
    value: Option<String>,
    resource_version: u64,
}

/// Latencies of the trials and of the baseline round trips.
#[derive(Debug, Clone, Default)]
pub struct DriftTrials {
    /// Repair latency of each repaired trial.
    pub repairs: Vec<Duration>,
    /// Trials not repaired within [`TRIAL_TIMEOUT`].
    pub unrepaired: usize,
    /// Trials whose repair event reached the benchmark's watch before the foreign update's response
    /// reached the benchmark (the apiserver answered the update after its watchers, the agent among them,
    /// had seen it); counted as 0 ms.
    pub before_response: usize,
    /// Server-side apply round trips.
    pub round_trips: Vec<Duration>,
}

impl DriftTrials {
    /// The repair latencies with unrepaired trials counted as [`TRIAL_TIMEOUT`], sorted.
    pub fn repair_samples(&self) -> Vec<Duration> {
        let mut samples = self.repairs.clone();
        samples.extend(std::iter::repeat_n(TRIAL_TIMEOUT, self.unrepaired));
        samples.sort();
        samples
    }
}

/// The `q`-quantile (0–1) of sorted samples, nearest rank; zero when there are none.
pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn resource_version(cm: &ConfigMap) -> u64 {
    cm.metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The benchmark's watch on the agent's ConfigMaps. It runs on its own thread with its own runtime and
/// client, so that stamping an event's arrival never waits for the trials' work; it stops on drop.
struct ConfigMapWatch {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ConfigMapWatch {
    /// Starts watching; returns once the watch has listed the ConfigMaps, with the receiver of what it sees.
    async fn start(kube: &LocalKube) -> anyhow::Result<(Self, mpsc::UnboundedReceiver<Seen>)> {
        let config = kube.kube_config().clone();
        let (sender, receiver) = mpsc::unbounded_channel();
        let (listed_tx, listed) = tokio::sync::oneshot::channel();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("drift-watch".into())
            .spawn(move || {
                runtime.block_on(async move {
                    tokio::select! {
                        result = watch_loop(config, sender, listed_tx) => {
                            if let Err(error) = result {
                                eprintln!("bench: the drift watch failed: {error:#}");
                            }
                        }
                        _ = &mut stopped => {}
                    }
                });
            })?;
        let watch = Self {
            stop: Some(stop),
            thread: Some(thread),
        };
        tokio::time::timeout(Duration::from_secs(60), listed)
            .await
            .context("the drift watch did not list the ConfigMaps in time")??;
        Ok((watch, receiver))
    }
}

impl Drop for ConfigMapWatch {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Watches the agent's ConfigMaps, stamping each event with its arrival time.
async fn watch_loop(
    config: kube::Config,
    sender: mpsc::UnboundedSender<Seen>,
    listed: tokio::sync::oneshot::Sender<()>,
) -> anyhow::Result<()> {
    let api: Api<ConfigMap> = Api::all(kube::Client::try_from(config)?);
    let config = watcher::Config::default().labels(&format!("{FLEET_LABEL}={}", workload::FLEET));
    let mut listed = Some(listed);
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    while let Some(event) = stream.next().await {
        let at = Instant::now();
        match event {
            Ok(Event::Apply(cm)) => {
                let seen = Seen {
                    at,
                    namespace: cm.metadata.namespace.clone().unwrap_or_default(),
                    name: cm.metadata.name.clone().unwrap_or_default(),
                    value: cm
                        .data
                        .as_ref()
                        .and_then(|d| d.get(workload::DRIFT_KEY))
                        .cloned(),
                    resource_version: resource_version(&cm),
                };
                if sender.send(seen).is_err() {
                    return Ok(());
                }
            }
            Ok(Event::InitDone) => {
                if let Some(listed) = listed.take() {
                    let _ = listed.send(());
                }
            }
            Ok(_) => {}
            Err(error) => eprintln!("bench: drift watch error (the watcher retries): {error}"),
        }
    }
    Ok(())
}

/// Runs `trials` drift trials against the agent's ConfigMaps, alternating with as many server-side apply
/// round trips made by `probe` (a client with the agent's kind of identity).
pub async fn run(
    kube: &LocalKube,
    probe: &kube::Client,
    trials: usize,
) -> anyhow::Result<DriftTrials> {
    anyhow::ensure!(
        trials <= workload::NAMESPACES * workload::CONFIG_MAPS,
        "at most {} drift trials (one per ConfigMap)",
        workload::NAMESPACES * workload::CONFIG_MAPS
    );
    let admin = kube.client();
    Api::<Namespace>::all(admin.clone())
        .patch(
            PROBE_NAMESPACE,
            &PatchParams::apply("windvane-bench").force(),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PROBE_NAMESPACE}})),
        )
        .await?;
    let probes = Api::<ConfigMap>::namespaced(probe.clone(), PROBE_NAMESPACE);
    let probe_body = |round: usize| {
        let data: serde_json::Map<String, serde_json::Value> = (0..8)
            .map(|key| {
                (
                    format!("key-{key}"),
                    json!(workload::config_value(round % 2, 0, key)),
                )
            })
            .collect();
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "ssa-probe", "namespace": PROBE_NAMESPACE,
                            "labels": {"app.kubernetes.io/name": "probe", "tier": "probe"}},
               "data": data})
    };
    let apply = PatchParams::apply("bench-ssa").force();
    // Create it outside the measurement: every measured round trip is an update.
    probes
        .patch("ssa-probe", &apply, &Patch::Apply(probe_body(1)))
        .await?;

    let (_watch, mut seen) = ConfigMapWatch::start(kube).await?;
    let mut results = DriftTrials::default();
    for trial in 0..trials {
        // Baseline: one server-side apply round trip that changes a value.
        let started = Instant::now();
        probes
            .patch("ssa-probe", &apply, &Patch::Apply(probe_body(trial)))
            .await?;
        results.round_trips.push(started.elapsed());

        // Trial: spread over namespaces and ConfigMaps; a new manager each time.
        let namespace_index = trial % workload::NAMESPACES;
        let config_map = trial / workload::NAMESPACES;
        let namespace = workload::namespace(workload::AGENT_PREFIX, namespace_index);
        let name = workload::config_map_name(config_map);
        let original = workload::config_value(namespace_index, config_map, 0);
        let api = Api::<ConfigMap>::namespaced(admin.clone(), &namespace);
        let params = PatchParams {
            field_manager: Some(format!("intruder-{trial}")),
            ..PatchParams::default()
        };
        let patched = api
            .patch(
                &name,
                &params,
                &Patch::Merge(json!({"data": {workload::DRIFT_KEY: format!("intruded-{trial}")}})),
            )
            .await
            .with_context(|| format!("changing ConfigMap {namespace}/{name}"))?;
        let changed_at = Instant::now();
        let changed_version = resource_version(&patched);
        let deadline = tokio::time::Instant::from_std(changed_at + TRIAL_TIMEOUT);
        let repaired = loop {
            match tokio::time::timeout_at(deadline, seen.recv()).await {
                Ok(Some(event))
                    if event.namespace == namespace
                        && event.name == name
                        && event.resource_version > changed_version
                        && event.value.as_deref() == Some(original.as_str()) =>
                {
                    break Some(event.at.checked_duration_since(changed_at));
                }
                Ok(Some(_)) => {}
                Ok(None) => anyhow::bail!("the drift watch stopped"),
                Err(_) => break None,
            }
        };
        match repaired {
            Some(Some(latency)) => results.repairs.push(latency),
            Some(None) => {
                results.before_response += 1;
                results.repairs.push(Duration::ZERO);
            }
            None => {
                eprintln!(
                    "bench: drift trial {trial} ({namespace}/{name}) not repaired within {TRIAL_TIMEOUT:?}"
                );
                results.unrepaired += 1;
            }
        }
        tokio::time::sleep(PAUSE).await;
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(quantile(&samples, 0.5), Duration::from_millis(50));
        assert_eq!(quantile(&samples, 0.99), Duration::from_millis(99));
        assert_eq!(quantile(&samples[..1], 0.99), Duration::from_millis(1));
        assert_eq!(quantile(&[], 0.5), Duration::ZERO);
    }
}
