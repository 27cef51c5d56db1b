//! The story's two faults, both on the quiet prod cluster (prod-us): a pod deleted, which Kubernetes repairs
//! and Windvane rightly ignores, and the cluster's network cut, which the server shows as Unknown while the
//! agent, cut off, keeps healing. As in the rest of the story, every outcome printed is read back: from the
//! cluster's API server, the agent's `/metrics`, the server's JSON API and fleet page.

use std::time::Instant;

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::Value;
use windvane_tests::fleet::{metric, metric_sum};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::server::query_escape;

use crate::cast::Demo;
use crate::narrate::seconds;
use crate::roster::Member;
use crate::story::{
    agent_log, counts_line, drift_entries, drift_line, kubectl, replicas, wait_synced,
};

/// api's pods, by the Deployment's selector.
const API_PODS: &str = "app.kubernetes.io/name=api";
/// The agent's counter of objects it wrote (an apply that changed something).
const WRITTEN: &str = "windvane_apply_total{result=\"written\"}";
/// The agent's counter of drifts it detected.
const DRIFT_DETECTED: &str = "windvane_drift_detected_total";

/// What Windvane did on one cluster, so far: the agent's writes and drift detections (its `/metrics`) and
/// the records of the server's drift log for the cluster.
#[derive(Debug, PartialEq)]
struct Deeds {
    written: u64,
    drift_detected: u64,
    drift_records: usize,
}

impl Deeds {
    async fn read(demo: &Demo, name: &str) -> anyhow::Result<Self> {
        let metrics = demo
            .cluster(name)?
            .agent()?
            .metrics()
            .await
            .with_context(|| format!("reading the /metrics of {name}'s agent"))?;
        let log = demo
            .server()?
            .api(&format!("/api/v1/drift?cluster={name}"))
            .await?;
        Ok(Self {
            // Counters are whole numbers; as f64 an empty sum would print as -0.
            written: metric(&metrics, WRITTEN).unwrap_or(0.0) as u64,
            drift_detected: metric_sum(&metrics, DRIFT_DETECTED) as u64,
            drift_records: drift_entries(&log).len(),
        })
    }
}

/// Someone deletes a pod of api on the quiet prod cluster: its ReplicaSet makes a new one, and Windvane — which
/// keeps the Deployment, not its pods — does nothing.
pub async fn pod_deleted(demo: &Demo) -> anyhow::Result<()> {
    let member = demo.settings.roster.quiet();
    let name = member.name();
    demo.say
        .step(&format!("Step 2 of 4 — a pod deleted on {name}"));
    let kube = &demo.cluster(&name)?.kube;
    let before = api_pods(kube).await?;
    let victim = before
        .iter()
        .find(|p| running_on(p, kube.node_name()))
        .and_then(|p| p.metadata.name.clone())
        .with_context(|| format!("no Running api pod on {name}"))?;
    let deeds = Deeds::read(demo, &name).await?;
    demo.say.say(&format!(
        "api runs {} pod(s) on {name}; its agent's /metrics: {WRITTEN} {}, {DRIFT_DETECTED} {}; the server's drift log for {name}: {} records",
        before.len(),
        deeds.written,
        deeds.drift_detected,
        deeds.drift_records
    ));
    demo.say
        .command(&format!("kubectl -n api delete pod {victim}"));
    // kubectl waits for the pod to be gone, by which time the ReplicaSet has usually replaced it: time
    // the replacement from the command's start.
    let deleted = Instant::now();
    let out = kubectl(kube, &["-n", "api", "delete", "pod", &victim])?;
    demo.say.detail(out.trim_end());
    let old: Vec<String> = before
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    let new = wait_for(
        &format!("a new api pod Running on {name}"),
        demo.settings.step_timeout,
        || async {
            let pods = api_pods(kube).await?;
            let gone = !pods
                .iter()
                .any(|p| p.metadata.name.as_ref() == Some(&victim));
            Ok(pods.into_iter().find(|p| {
                gone && running_on(p, kube.node_name())
                    && !old.contains(p.metadata.name.as_ref().unwrap_or(&victim))
            }))
        },
    )
    .await?;
    let owner = new
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "ReplicaSet")
        .map_or("(none)".to_owned(), |o| o.name.clone());
    demo.say.say(&format!(
        "{name}'s API server: {victim} is gone; ReplicaSet {owner} made {}, Running on node {}, {} after kubectl delete started",
        new.metadata.name.as_deref().unwrap_or("?"),
        kube.node_name(),
        seconds(deleted.elapsed())
    ));
    if demo.settings.real_node {
        demo.say.say(&really_runs(&new)?);
    }
    let heartbeats = two_heartbeats_later(demo, member).await?;
    let after = Deeds::read(demo, &name).await?;
    anyhow::ensure!(
        after == deeds,
        "Windvane should not act on a deleted pod of {name}: before {deeds:?}, after {after:?}"
    );
    demo.say.say(&format!(
        "Windvane did nothing (read back {heartbeats}): {WRITTEN} {} → {}, {DRIFT_DETECTED} {} → {}; drift log for {name}: {} → {} records",
        deeds.written,
        after.written,
        deeds.drift_detected,
        after.drift_detected,
        deeds.drift_records,
        after.drift_records
    ));
    demo.say.detail(
        "The ReplicaSet did it: pods are not in the release. Windvane keeps the Deployment it applied; the pods are \
         Kubernetes's to keep.",
    );
    Ok(())
}

/// api's pods on a cluster.
async fn api_pods(kube: &LocalKube) -> anyhow::Result<Vec<Pod>> {
    Ok(Api::<Pod>::namespaced(kube.client(), "api")
        .list(&ListParams::default().labels(API_PODS))
        .await
        .context("listing the pods of api")?
        .items)
}

/// Whether a pod runs on `node` and is not being deleted.
/// On a real node: the new pod's container as the kubelet reports it — containerd's id, when it started —
/// which only a container that really runs has.
fn really_runs(pod: &Pod) -> anyhow::Result<String> {
    let container = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .context("the new pod has no container status")?;
    let id = container.container_id.as_deref().unwrap_or_default();
    anyhow::ensure!(
        id.starts_with("containerd://"),
        "the new pod's container id {id:?} is not containerd's: is the node real?"
    );
    let started = container
        .state
        .as_ref()
        .and_then(|s| s.running.as_ref())
        .and_then(|r| r.started_at.as_ref())
        .map_or("?".to_owned(), |t| t.0.to_string());
    Ok(format!(
        "a real container: {}… started at {started} by the kubelet through containerd, {} restarts",
        &id[..id.len().min(25)],
        container.restart_count
    ))
}

fn running_on(pod: &Pod, node: &str) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Waits until the server has two more heartbeats of `member` than now: the one in flight now may predate this
/// moment, the next one cannot, so whatever the agent did meanwhile has reached the server. Says which.
async fn two_heartbeats_later(demo: &Demo, member: Member) -> anyhow::Result<String> {
    let server = demo.server()?;
    let name = member.name();
    let path = format!("/api/v1/clusters/{name}");
    let now = server.api(&path).await?["cluster"]["sequence"]
        .as_u64()
        .with_context(|| format!("no heartbeat sequence for {name} on the server"))?;
    let view = server
        .wait_cluster(
            &name,
            &format!("two more heartbeats of {name}"),
            demo.settings.step_timeout,
            |v| v["cluster"]["sequence"].as_u64() >= Some(now + 2),
        )
        .await?;
    Ok(format!(
        "once the server had {name}'s heartbeat {}, two after the one it had when the new pod ran",
        view["cluster"]["sequence"]
    ))
}

/// The quiet prod cluster's network is cut: Unknown after the grace period, counted apart; cut off, its
/// agent still reverts a scale; with the network back it is Synced again and the repair is in the drift log.
pub async fn network_cut(demo: &Demo) -> anyhow::Result<()> {
    let member = demo.settings.roster.quiet();
    let name = member.name();
    demo.say
        .step(&format!("Step 4 of 4 — {name} cut off from the network"));
    let cluster = demo.cluster(&name)?;
    let proxy = demo.proxy(&name)?;
    let server = demo.server()?;
    proxy.blackhole();
    let (cut, cut_at) = (Instant::now(), jiff::Timestamp::now());
    demo.say.say(&format!(
        "Cut {name}'s network: its link to the server (proxy :{}) now drops everything both ways, connections \
         held open; the cluster and its agent (pid {}) keep running",
        proxy.addr().port(),
        cluster.agent_pid().unwrap_or_default()
    ));
    let view = server
        .wait_cluster(
            &name,
            &format!("{name} Unknown"),
            demo.settings.step_timeout,
            |v| v["cluster"]["state"] == "Unknown",
        )
        .await?;
    let row = &view["cluster"];
    demo.say.say(&format!(
        "{name} is Unknown, {} after the cut (grace period {}s): last reported {}, last heartbeat {}s ago",
        seconds(cut.elapsed()),
        row["graceSeconds"],
        row["lastReported"].as_str().unwrap_or("nothing"),
        row["heartbeatAgeSeconds"]
    ));
    roll_up_while_cut(demo, &name).await?;
    repair_while_cut(demo, member).await?;

    proxy.forward();
    let back = Instant::now();
    demo.say.say(&format!(
        "{name}'s network is back: its proxy forwards again"
    ));
    let view = wait_synced(demo, member, 1).await?;
    demo.say.say(&format!(
        "{name} is {} again, {} after the network came back",
        view["cluster"]["state"].as_str().unwrap_or("?"),
        seconds(back.elapsed())
    ));
    let drift_path = format!("/api/v1/drift?cluster={name}");
    let entry = wait_for(
        "the repair made during the outage in the server's drift log",
        demo.settings.step_timeout,
        || async {
            let log = server.api(&drift_path).await?;
            Ok(drift_entries(&log).into_iter().find(|e| {
                let detected = e["record"]["detectedAt"]
                    .as_str()
                    .and_then(|t| t.parse().ok());
                e["record"]["name"] == "prometheus"
                    && !e["record"]["revertedAt"].is_null()
                    && detected.is_some_and(|t: jiff::Timestamp| t >= cut_at)
            }))
        },
    )
    .await
    .with_context(|| agent_log(demo, member))?;
    demo.say.say(&format!(
        "The repair made during the outage is in the server's drift log ({}{drift_path}), {} after the network came back:",
        server.url,
        seconds(back.elapsed())
    ));
    demo.say.detail(&drift_line(&entry["record"]));
    let prod = server.fleet(Some("env=prod")).await?;
    demo.say
        .detail(&format!("env=prod now: {}", counts_line(&prod)));
    Ok(())
}

/// While `name` is cut off: env=prod reads one Unknown and the rest Synced, every other cluster of the fleet is
/// Synced, and the fleet page shows the same.
async fn roll_up_while_cut(demo: &Demo, name: &str) -> anyhow::Result<()> {
    let server = demo.server()?;
    let prod_total = demo.settings.roster.of_env("prod").len() + 1;
    let fleet_total = demo.settings.roster.initial.len() + 1;
    let prod = server.fleet(Some("env=prod")).await?;
    let all = server.fleet(None).await?;
    demo.say.detail(&format!(
        "env=prod ({}/api/v1/fleet?selector={}): {}",
        server.url,
        query_escape("env=prod"),
        counts_line(&prod)
    ));
    demo.say.detail(&format!(
        "whole fleet ({}/api/v1/fleet): {}",
        server.url,
        counts_line(&all)
    ));
    anyhow::ensure!(
        prod["counts"]["Unknown"] == 1 && prod["counts"]["Synced"] == prod_total - 1,
        "expected {} Synced and 1 Unknown among env=prod: {prod}",
        prod_total - 1
    );
    let others: Vec<&Value> = all["clusters"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|c| c["name"] != name)
        .collect();
    anyhow::ensure!(
        others.len() == fleet_total - 1 && others.iter().all(|c| c["state"] == "Synced"),
        "every cluster but {name} should be Synced: {all}"
    );
    let (code, page) = server.get("/").await?;
    anyhow::ensure!(
        code == 200
            && page.contains(&format!(
                "<tr class=\"s-Unknown\"><td><a href=\"/clusters/{name}\">"
            ))
            && page.contains("last reported Synced"),
        "the fleet page does not show {name} Unknown (HTTP {code})"
    );
    demo.say.detail(&format!(
        "the other {} clusters all Synced; the fleet page ({}/) shows the same: {name} Unknown, last reported Synced, in its own counter",
        others.len(),
        server.url
    ));
    demo.say
        .detail("Unknown is counted apart: an unreachable cluster is never shown as Synced.");
    Ok(())
}

/// Someone scales prometheus on the cut-off cluster: the agent reverts it all the same, read back from the
/// cluster's API server, while the server still shows the cluster Unknown.
async fn repair_while_cut(demo: &Demo, member: Member) -> anyhow::Result<()> {
    let name = member.name();
    let kube = &demo.cluster(&name)?.kube;
    let before = replicas(kube, "monitoring", "prometheus").await?;
    demo.say.say(&format!(
        "Meanwhile someone scales prometheus on {name} (it runs {before} replica(s), as released):"
    ));
    demo.say
        .command("kubectl -n monitoring scale deployment prometheus --replicas=4");
    kubectl(
        kube,
        &[
            "-n",
            "monitoring",
            "scale",
            "deployment",
            "prometheus",
            "--replicas=4",
        ],
    )?;
    let scaled = Instant::now();
    wait_for(
        &format!("prometheus reverted on {name} while it is cut off"),
        demo.settings.step_timeout,
        || async {
            Ok((replicas(kube, "monitoring", "prometheus").await? == before).then_some(()))
        },
    )
    .await
    .with_context(|| agent_log(demo, member))?;
    let repair = scaled.elapsed();
    let view = demo
        .server()?
        .api(&format!("/api/v1/clusters/{name}"))
        .await?;
    let state = view["cluster"]["state"].as_str().unwrap_or("?");
    anyhow::ensure!(
        state == "Unknown",
        "{name} should still be Unknown while cut off, the server shows {state}"
    );
    demo.say.say(&format!(
        "Cut off, the agent reverted it anyway: {name}'s API server reads prometheus replicas {before} again, \
         {} after the scale; the server, which cannot hear it, still shows {name} {state}",
        seconds(repair)
    ));
    Ok(())
}
