//! First full sync of the large release: the agent from process start until its first sync finished (every
//! object applied, none failed), against `kubectl apply --server-side` of the same rendered objects from
//! process start until the command returns, on the same apiserver in the same run.
//!
//! Fairness: both run as a ServiceAccount bound to cluster-admin (RBAC is evaluated for both), both start
//! cold — kubectl with an empty discovery cache, the agent with nothing in the cluster — and both are
//! timed as a user experiences them, process start-up and discovery included. The agent's time also
//! includes what kubectl does not do: leader election, fetching and verifying the signed release,
//! persisting it as last known good and recording the sync's status; the write of its inventory follows
//! the sync (the release persisted before it was applied covers a stop before that write lands, see
//! `Engine::persist_inventory`). kubectl runs first; the agent then
//! syncs into a cluster that already holds kubectl's objects and pods (a slight handicap for the agent).
//! Neither waits for Deployments to become Available: kubectl returns once its objects are applied, and the
//! agent's sync is finished then too.
//!
//! The baseline the agent is judged against applies the same objects from a bare in-process server-side apply
//! client at the agent's concurrency (16): no process start, no discovery, nothing verified or persisted. It
//! is the floor this machine's apiserver allows any client. The comparison runs in rounds (nine by default,
//! `--sync-rounds`), interleaved: a bare run, then per round a fresh agent's first sync (its own fleet,
//! namespaces and state) followed by another bare run, every run into namespaces of its own. Each round
//! compares the agent with the mean of the bare runs just before and just after it (the machine's speed
//! drifts over a run, and the cluster grows), and the row reports the median round: identical runs of the
//! control plane here differ by more than the goal's 5 %, so one round alone cannot judge it. Every timed
//! run starts the same way: once the control plane has been quiet for a second, right after a full garbage
//! collection of it ([`LocalKube::collect_garbage`]). One of its collection cycles costs 0.2–0.6
//! CPU-seconds, and without the collection, how soon the next one came depended on the garbage left by
//! what ran before — for the agent's runs only, the bench's scrape of the API server's metrics. CPU use of
//! the control plane, the contestant and everything else on the machine is recorded for each run
//! ([`crate::cpu`]), so a miss can be traced to the agent, the apiserver or a noisy neighbour.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::Value;
use windvane_tests::localkube::{self, LocalKube};
use windvane_tests::poll::wait_for;

use crate::agent::{AgentLaunch, AgentProcess};
use crate::apiserver::{Identity, RequestCounts, scrape};
use crate::cpu::{self, Contestant, CpuMeter, CpuUse};
use crate::pprof::ControlPlaneProfile;
use crate::prom;
use crate::workload;

/// kubectl's run.
#[derive(Debug, Clone)]
pub struct KubectlApply {
    pub elapsed: Duration,
    pub requests: RequestCounts,
    /// Where the CPU went meanwhile.
    pub cpu: CpuUse,
}

/// Runs `kubectl apply --server-side --field-manager=bench -f DIR` as `identity` with a fresh discovery
/// cache, and checks that every object is there afterwards.
pub async fn kubectl_apply(
    kube: &LocalKube,
    identity: &Identity,
    manifests: &Path,
    cache_dir: &Path,
) -> anyhow::Result<KubectlApply> {
    let admin = kube.client();
    let before = identity.requests(&scrape(&admin).await?);
    let mut command = std::process::Command::new(localkube::binary_path()?);
    command
        .arg("kubectl")
        .arg("--kubeconfig")
        .arg(&identity.kubeconfig)
        .arg("--cache-dir")
        .arg(cache_dir)
        .args(["apply", "--server-side", "--field-manager=bench", "-f"])
        .arg(manifests)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    kube.collect_garbage().await?;
    let meter = CpuMeter::start(localkube_pid(kube)?)?;
    let started = Instant::now();
    let output = tokio::process::Command::from(command)
        .output()
        .await
        .context("running kubectl")?;
    let elapsed = started.elapsed();
    let cpu = meter.stop(localkube_pid(kube)?, Contestant::Child)?;
    anyhow::ensure!(
        output.status.success(),
        "kubectl apply failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let applied = String::from_utf8_lossy(&output.stdout).lines().count();
    anyhow::ensure!(
        applied == workload::OBJECTS,
        "kubectl reported {applied} objects, expected {}",
        workload::OBJECTS
    );
    let present = count_objects(kube, workload::KUBECTL_PREFIX).await?;
    anyhow::ensure!(
        present == workload::OBJECTS,
        "{present} of kubectl's objects are present"
    );
    let requests = identity.requests(&scrape(&admin).await?).since(&before);
    Ok(KubectlApply {
        elapsed,
        requests,
        cpu,
    })
}

/// localkube's process id.
pub fn localkube_pid(kube: &LocalKube) -> anyhow::Result<u32> {
    kube.pid().context("localkube is not running")
}

/// Waits until the control plane is quiet (below a fifth of a core over a second), so a timed run does not
/// inherit the work of what came before it (controllers settling the previous contestant's Deployments).
pub async fn wait_control_plane_quiet(kube: &LocalKube) -> anyhow::Result<()> {
    const WINDOW: Duration = Duration::from_secs(1);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let before = cpu::process(localkube_pid(kube)?)?;
        tokio::time::sleep(WINDOW).await;
        let used = cpu::process(localkube_pid(kube)?)?.saturating_sub(before);
        if used <= WINDOW / 5 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the control plane is still busy ({used:?} CPU per second)"
        );
    }
}

/// How the bare client's and the agent's timed runs start: once the control plane has been quiet for a second,
/// right after a full garbage collection of it (see the module's doc).
async fn settle_control_plane(kube: &LocalKube) -> anyhow::Result<()> {
    wait_control_plane_quiet(kube).await?;
    kube.collect_garbage().await
}

/// Objects the bare client applies at once: the agent's default apply concurrency.
const BARE_CONCURRENCY: usize = 16;

/// The floor on this machine: the same objects applied by a bare in-process server-side apply client,
/// Namespaces first, then 16 at a time — no process start, no discovery, no release to verify, nothing
/// persisted. What the apiserver allows, against which the agent's time is judged. With `profiles`, the
/// control plane is profiled meanwhile ([`crate::pprof`]).
pub async fn bare_client_apply(
    kube: &LocalKube,
    client: &kube::Client,
    prefix: &str,
    profiles: Option<&Path>,
) -> anyhow::Result<(Duration, CpuUse)> {
    let objects = workload::rendered_objects(prefix)?;
    let apply = PatchParams::apply("bench-bare").force();
    let apply_one = |object: Value| {
        let client = client.clone();
        let apply = apply.clone();
        async move {
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let namespace = object["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let patch = Patch::Apply(&object);
            match object["kind"].as_str() {
                Some("Namespace") => Api::<Namespace>::all(client)
                    .patch(&name, &apply, &patch)
                    .await
                    .map(drop),
                Some("ConfigMap") => Api::<ConfigMap>::namespaced(client, &namespace)
                    .patch(&name, &apply, &patch)
                    .await
                    .map(drop),
                _ => Api::<Deployment>::namespaced(client, &namespace)
                    .patch(&name, &apply, &patch)
                    .await
                    .map(drop),
            }
        }
    };
    let namespaces = objects.iter().filter(|o| o["kind"] == "Namespace").count();
    settle_control_plane(kube).await?;
    let profile = ControlPlaneProfile::start(kube, profiles, prefix)?;
    let meter = CpuMeter::start(localkube_pid(kube)?)?;
    let started = Instant::now();
    let mut objects = objects.into_iter();
    for object in objects.by_ref().take(namespaces) {
        apply_one(object).await?;
    }
    futures::stream::iter(objects.map(apply_one))
        .buffer_unordered(BARE_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    let elapsed = started.elapsed();
    let cpu = meter.stop(localkube_pid(kube)?, Contestant::Benchmark)?;
    if let Some(profile) = profile {
        profile.finish().await?;
    }
    let present = count_objects(kube, prefix).await?;
    anyhow::ensure!(
        present == workload::OBJECTS,
        "{present} of the bare client's objects are present"
    );
    Ok((elapsed, cpu))
}

/// The agent's first sync.
#[derive(Debug, Clone)]
pub struct AgentSync {
    /// From starting the process until the first sync was seen finished.
    pub elapsed: Duration,
    /// The sync's own duration as the agent measured it (render, apply, prune, persist).
    pub reported: Duration,
    /// The agent's requests until then.
    pub requests: RequestCounts,
    /// Objects written (`windvane_apply_total{result="written"}`).
    pub written: f64,
    /// Where the CPU went meanwhile.
    pub cpu: CpuUse,
}

/// How often the agent's `/metrics` is read while waiting for the first sync. The time itself is the agent's
/// own log timestamp, so this only bounds how soon the bench notices: reading every 10 ms took about 0.1
/// CPU-seconds of the bench's and as much of the agent's during a timed run, from the control plane.
const SYNC_POLL: Duration = Duration::from_millis(100);
/// The longest a first sync may take.
const SYNC_TIMEOUT: Duration = Duration::from_secs(300);

/// Starts the agent and waits until its first sync finished: `windvane_sync_duration_seconds_count ≥ 1`,
/// then checks that `/status` counts every object with none Failed and that they are all in the cluster,
/// in the namespaces `prefix-*`. The CPU figures run until the bench noticed (up to [`SYNC_POLL`] later).
/// With `profiles`, the control plane is profiled meanwhile ([`crate::pprof`]).
pub async fn agent_first_sync(
    kube: &LocalKube,
    identity: &Identity,
    launch: &AgentLaunch,
    prefix: &str,
    profiles: Option<&Path>,
) -> anyhow::Result<(AgentProcess, AgentSync)> {
    let admin = kube.client();
    AgentProcess::prepare_namespace(kube, &launch.namespace).await?;
    let before = identity.requests(&scrape(&admin).await?);
    // Rendering its own /metrics costs the API server a good part of a CPU-second, and its garbage is
    // collected after: the timed run must not inherit that, nor the new namespace's controllers.
    settle_control_plane(kube).await?;
    let profile = ControlPlaneProfile::start(kube, profiles, prefix)?;
    let meter = CpuMeter::start(localkube_pid(kube)?)?;
    let spawned = Timestamp::now();
    let mut agent = AgentProcess::start(launch)?;
    let elapsed = wait_first_sync(&mut agent, spawned).await?;
    let metrics = agent.metrics().await?;
    let cpu = meter.stop(localkube_pid(kube)?, Contestant::Process(agent.pid()?))?;
    if let Some(profile) = profile {
        profile.finish().await?;
    }
    let requests = identity.requests(&scrape(&admin).await?).since(&before);

    let status = agent.status().await?;
    let counts = &status["counts"];
    let total: u64 = counts
        .as_object()
        .map(|c| c.values().filter_map(Value::as_u64).sum())
        .unwrap_or(0);
    let failed = counts["Failed"].as_u64().unwrap_or(0);
    anyhow::ensure!(
        total == workload::OBJECTS as u64 && failed == 0,
        "after the first sync the agent counts {counts} (expected {} objects, none Failed); problems: {}",
        workload::OBJECTS,
        problems(&status)
    );
    let present = count_objects(kube, prefix).await?;
    anyhow::ensure!(
        present == workload::OBJECTS,
        "{present} of the agent's objects are present"
    );
    let sync = AgentSync {
        elapsed,
        reported: Duration::from_secs_f64(prom::sum(
            &metrics,
            "windvane_sync_duration_seconds_sum",
            |_| true,
        )),
        requests,
        written: prom::sum(&metrics, "windvane_apply_total", |s| {
            s.label("result") == "written"
        }),
        cpu,
    };
    Ok((agent, sync))
}

/// Waits until the agent's first sync finished (`windvane_sync_duration_seconds_count ≥ 1`) and returns the
/// time from `spawned` (taken just before the process started) to the agent's `sync finished` log line.
pub async fn wait_first_sync(
    agent: &mut AgentProcess,
    spawned: Timestamp,
) -> anyhow::Result<Duration> {
    let deadline = Instant::now() + SYNC_TIMEOUT;
    loop {
        if let Ok(metrics) = agent.metrics().await
            && prom::sum(&metrics, "windvane_sync_duration_seconds_count", |_| true) >= 1.0
        {
            let finished = sync_finished_at(&agent.log()).with_context(|| {
                format!(
                    "the agent's log has no `sync finished` line; tail:\n{}",
                    agent.log_tail()
                )
            })?;
            return Ok(Duration::try_from(finished.duration_since(spawned))?);
        }
        agent.check_running()?;
        anyhow::ensure!(
            Instant::now() < deadline,
            "no sync finished within {SYNC_TIMEOUT:?}; agent log tail:\n{}",
            agent.log_tail()
        );
        tokio::time::sleep(SYNC_POLL).await;
    }
}

/// When the agent logged its first `sync finished` (its text log lines start with their timestamp, in
/// colour when the agent chose so).
pub fn sync_finished_at(log: &str) -> Option<Timestamp> {
    let line = log.lines().find(|line| line.contains("sync finished"))?;
    let stamp = without_colour(line);
    stamp.split_whitespace().next()?.parse().ok()
}

/// `text` without ANSI colour sequences (`ESC [ … m`).
fn without_colour(text: &str) -> String {
    let mut plain = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|&c| c == 'm');
        } else {
            plain.push(c);
        }
    }
    plain
}

/// Objects whose state is not Synced, briefly.
pub fn problems(status: &Value) -> String {
    let listed: Vec<String> = status["objects"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|o| o["state"] != "Synced")
        .take(5)
        .map(|o| format!("{} {}: {}", o["object"], o["state"], o["message"]))
        .collect();
    if listed.is_empty() {
        "none".to_owned()
    } else {
        listed.join("; ")
    }
}

/// Waits until the agent reports every object Synced (Deployments Available), so later measurements start
/// from a quiet cluster.
pub async fn wait_synced(
    agent: &AgentProcess,
    expected: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    let last = std::sync::Mutex::new(Value::Null);
    let result = wait_for("every object Synced", timeout, || async {
        let status = agent.status().await?;
        let synced = status["counts"]["Synced"].as_u64().unwrap_or(0);
        let done = status["state"] == "Synced" && synced == expected as u64;
        *last.lock().expect("lock") = status;
        Ok(done.then_some(()))
    })
    .await;
    result.with_context(|| {
        let last = last.lock().expect("lock");
        format!("counts {}; problems: {}", last["counts"], problems(&last))
    })
}

/// Waits until every Deployment in the namespaces `prefix-*` has its replica available.
pub async fn wait_deployments_available(
    kube: &LocalKube,
    prefix: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deployments = Api::<Deployment>::all(kube.client());
    let expected = workload::NAMESPACES * workload::DEPLOYMENTS;
    wait_for(
        &format!("{prefix}-* Deployments available"),
        timeout,
        || async {
            let available = deployments
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|d| in_prefix(d.metadata.namespace.as_deref(), prefix))
                .filter(|d| {
                    d.status
                        .as_ref()
                        .and_then(|s| s.available_replicas)
                        .is_some_and(|n| n >= 1)
                })
                .count();
            Ok((available == expected).then_some(()))
        },
    )
    .await
}

fn in_prefix(namespace: Option<&str>, prefix: &str) -> bool {
    namespace.is_some_and(|ns| ns.starts_with(&format!("{prefix}-")))
}

/// How many of the large release's objects exist in the namespaces `prefix-*`.
async fn count_objects(kube: &LocalKube, prefix: &str) -> anyhow::Result<usize> {
    let client = kube.client();
    let all = ListParams::default();
    let namespaces = Api::<Namespace>::all(client.clone())
        .list(&all)
        .await?
        .items
        .iter()
        .filter(|n| {
            n.metadata
                .name
                .as_deref()
                .is_some_and(|name| name.starts_with(&format!("{prefix}-")))
        })
        .count();
    let config_maps = Api::<ConfigMap>::all(client.clone())
        .list(&ListParams::default().labels("tier=backend"))
        .await?
        .items
        .iter()
        .filter(|c| in_prefix(c.metadata.namespace.as_deref(), prefix))
        .count();
    let deployments = Api::<Deployment>::all(client)
        .list(&all)
        .await?
        .items
        .iter()
        .filter(|d| in_prefix(d.metadata.namespace.as_deref(), prefix))
        .count();
    Ok(namespaces + config_maps + deployments)
}

/// One round of the comparison as the report judges it: the agent's time against the mean of the bare
/// runs just before and just after it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundRatio {
    pub agent: Duration,
    pub bare: Duration,
}

impl RoundRatio {
    /// The rounds of a comparison: `agent[i]` against the mean of `bare[i]` and `bare[i + 1]`
    /// (`bare` holds one run more than `agent`).
    pub fn of_rounds(agent: &[Duration], bare: &[Duration]) -> Vec<Self> {
        agent
            .iter()
            .zip(bare.windows(2))
            .map(|(&agent, pair)| Self {
                agent,
                bare: (pair[0] + pair[1]) / 2,
            })
            .collect()
    }

    pub fn ratio(self) -> f64 {
        self.agent.as_secs_f64() / self.bare.as_secs_f64().max(f64::MIN_POSITIVE)
    }
}

/// The index of the median round by ratio; of an even number, the higher of the two middle ones (the
/// report judges the agent by it, so a tie goes against the agent).
pub fn median_round(rounds: &[RoundRatio]) -> Option<usize> {
    let mut order: Vec<usize> = (0..rounds.len()).collect();
    order.sort_by(|&a, &b| rounds[a].ratio().total_cmp(&rounds[b].ratio()));
    order.get(rounds.len() / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(values: &[f64]) -> Vec<Duration> {
        values.iter().map(|&s| Duration::from_secs_f64(s)).collect()
    }

    #[test]
    fn each_round_is_judged_against_the_bare_runs_around_it() {
        let rounds = RoundRatio::of_rounds(&secs(&[3.0, 2.2]), &secs(&[2.0, 4.0, 2.0]));
        assert_eq!(rounds.len(), 2);
        assert_eq!(rounds[0].bare, Duration::from_secs(3));
        assert!((rounds[0].ratio() - 1.0).abs() < 1e-9);
        assert!((rounds[1].ratio() - 2.2 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn the_first_sync_is_timed_by_the_agents_own_log_line() {
        let log = "\u{1b}[2m2026-12-06T05:30:32.825192Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m admin server listening\n\
                   \u{1b}[2m2026-12-06T05:30:35.186057Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m sync{serial=1}: sync finished objects=1000\n\
                   2026-12-06T05:31:00.000000Z  INFO sync finished objects=1000\n";
        let finished = sync_finished_at(log).expect("a sync finished line");
        assert_eq!(
            finished,
            "2026-12-06T05:30:35.186057Z"
                .parse::<Timestamp>()
                .expect("parses")
        );
        assert_eq!(
            sync_finished_at("2026-12-06T05:31:00Z  INFO sync finished\n"),
            Some("2026-12-06T05:31:00Z".parse().expect("parses"))
        );
        assert_eq!(
            sync_finished_at("2026-12-06T05:31:00Z  INFO still applying\n"),
            None
        );
    }

    #[test]
    fn the_median_round_is_reported_and_a_tie_goes_against_the_agent() {
        let bare = secs(&[2.0, 2.0, 2.0, 2.0, 2.0]);
        let odd = RoundRatio::of_rounds(&secs(&[2.6, 2.0, 2.2]), &bare);
        assert_eq!(median_round(&odd), Some(2));
        let even = RoundRatio::of_rounds(&secs(&[2.6, 2.0, 2.2, 1.8]), &bare);
        assert_eq!(median_round(&even), Some(2));
        let one = RoundRatio::of_rounds(&secs(&[2.6]), &bare[..2]);
        assert_eq!(median_round(&one), Some(0));
        assert_eq!(median_round(&[]), None);
    }
}
