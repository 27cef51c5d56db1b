//! The story the demo tells, step by step. Each step does something real (the `windvane` command line, the
//! bundled kubectl, stopping an agent) and then waits — with a deadline — until it can read the outcome
//! from the real system: the source server's JSON API, the clusters' API servers, the agents' admin
//! endpoints. Nothing is printed as seen that was not read back; a step whose outcome does not show up in
//! time fails the demo with what it last saw.

use std::time::Instant;

use anyhow::Context;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::Api;
use serde_json::Value;
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::process::tail;
use windvane_tests::server::{SourceServer, query_escape};

use crate::cast::{CHANNEL, Demo, Member, PROD_AP, PROD_EU, PROD_US, STAGING_EU};
use crate::narrate::seconds;

/// Runs the whole story.
pub async fn tell(demo: &mut Demo) -> anyhow::Result<()> {
    release(demo)?;
    serve(demo).await?;
    first_clusters(demo).await?;
    drift(demo).await?;
    join(demo).await?;
    silence(demo).await?;
    Ok(())
}

/// A release key and the example fleet, signed and published into the store.
fn release(demo: &Demo) -> anyhow::Result<()> {
    demo.say
        .step("A release: sign the example fleet and publish it");
    demo.say
        .say(&format!("Work directory {}", demo.work().display()));
    demo.say.command("windvane keygen --out release");
    let out = demo.windvane(&["keygen", "--out", "release"])?;
    demo.say.detail(out.trim_end());
    let fleet = demo.settings.fleet_dir.display().to_string();
    demo.say.command(&format!(
        "windvane publish {fleet} --root store --channel {CHANNEL} --key release.key"
    ));
    let out = demo.windvane(&[
        "publish",
        &fleet,
        "--root",
        "store",
        "--channel",
        CHANNEL,
        "--key",
        "release.key",
    ])?;
    demo.say.detail(out.trim_end());
    Ok(())
}

/// The source server: serves the store, takes heartbeats, shows the fleet.
async fn serve(demo: &mut Demo) -> anyhow::Result<()> {
    demo.say.step("The source server");
    demo.say.command(&format!(
        "windvane-server serve --root store --data server/data --registration-token-file server/registration-token --admin-token-file server/admin-token --listen {} --unknown-after {}",
        demo.settings.listen, demo.settings.unknown_after
    ));
    let url = demo.start_server().await?.url.clone();
    demo.say.say(&format!("Listening. Fleet page  {url}/"));
    demo.say.detail(&format!(
        "JSON API    {url}/api/v1/fleet  (also /api/v1/clusters/NAME, /api/v1/drift)"
    ));
    demo.say.command(&format!(
        "windvane verify --root {url} --channel {CHANNEL} --trusted-key release.pub --fleet acme"
    ));
    let out = demo.windvane(&[
        "verify",
        "--root",
        &url,
        "--channel",
        CHANNEL,
        "--trusted-key",
        "release.pub",
        "--fleet",
        "acme",
    ])?;
    let apps: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("apps:"))
        .collect();
    demo.say.detail(&apps.join("\n"));
    Ok(())
}

/// Three clusters with their agents; all enrol and sync; each renders its own share.
async fn first_clusters(demo: &mut Demo) -> anyhow::Result<()> {
    demo.say.step("Three clusters, each with its agent");
    let server = demo.server()?.url.clone();
    demo.say.say(
        "Starting three localkube clusters (etcd, kube-apiserver, controller-manager, a fake node) and on each:",
    );
    demo.say.command(&format!(
        "windvane-agent run --source {server} --channel {CHANNEL} --trusted-key release.pub --fleet acme \\\n              --cluster NAME --label env=…,region=… --server {server} \\\n              --registration-token-file server/registration-token --heartbeat-interval {} --poll-interval {}",
        demo.settings.heartbeat_interval, demo.settings.poll_interval
    ));
    let members = [PROD_EU, PROD_US, STAGING_EU];
    demo.start_clusters(&members).await?;
    for member in members {
        describe_cluster(demo, member)?;
    }
    let started = Instant::now();
    for member in members {
        wait_synced(demo, member.name, 1).await?;
    }
    demo.say.say(&format!(
        "All three enrolled and Synced ({} after their agents started). From {}/api/v1/clusters/NAME:",
        seconds(started.elapsed()),
        demo.server()?.url
    ));
    for member in members {
        let view = demo
            .server()?
            .api(&format!("/api/v1/clusters/{}", member.name))
            .await?;
        demo.say.detail(&cluster_line(&view));
    }

    demo.say
        .say("Each cluster rendered its own share (read from its API server):");
    for member in [PROD_EU, PROD_US] {
        let kube = &demo.cluster(member.name)?.kube;
        let retention = prometheus_retention(kube).await?;
        let region = external_region(kube).await?;
        let why = if member.region == "eu" {
            "  (EU customization: retention 30d)"
        } else {
            ""
        };
        demo.say.detail(&format!(
            "{:<11} prometheus --storage.tsdb.retention.time={retention}, external label region: {region}{why}",
            member.name
        ));
    }
    let staging = &demo.cluster(STAGING_EU.name)?.kube;
    let monitoring = Api::<Namespace>::all(staging.client())
        .get_opt("monitoring")
        .await?
        .is_some();
    let hpa_min = Api::<HorizontalPodAutoscaler>::namespaced(staging.client(), "api")
        .get("api")
        .await?
        .spec
        .min_replicas
        .unwrap_or_default();
    let log_level = config_value(staging, "api", "api-config", "LOG_LEVEL").await?;
    demo.say.detail(&format!(
        "{:<11} {}; api HPA minReplicas {hpa_min}, LOG_LEVEL {log_level}  (staging customization)",
        STAGING_EU.name,
        if monitoring {
            "has a monitoring namespace"
        } else {
            "no monitoring (it is env=staging)"
        },
    ));
    Ok(())
}

/// Someone scales Deployments on prod-eu: the one Windvane owns is reverted and logged with who did it; the
/// one whose replicas belong to the HPA is left alone.
async fn drift(demo: &mut Demo) -> anyhow::Result<()> {
    demo.say.step("Step 1 of 3 — drift on prod-eu");
    let kube = &demo.cluster(PROD_EU.name)?.kube;
    let before = replicas(kube, "monitoring", "prometheus").await?;
    demo.say.say(&format!(
        "Someone scales two Deployments on prod-eu with kubectl (prometheus runs {before} replica(s), as released):"
    ));
    for (namespace, name, note) in [
        (
            "api",
            "api",
            "(its replicas belong to the HPA: ignoreDifferences)",
        ),
        (
            "monitoring",
            "prometheus",
            "(a field Windvane applied and owns)",
        ),
    ] {
        demo.say.command(&format!(
            "kubectl -n {namespace} scale deployment {name} --replicas=5   {note}"
        ));
        let output = kube
            .kubectl(["-n", namespace, "scale", "deployment", name, "--replicas=5"])
            .output()
            .context("running the bundled kubectl")?;
        anyhow::ensure!(
            output.status.success(),
            "kubectl scale {name}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let scaled = Instant::now();
    let server = demo.server()?;
    let entry = wait_for(
        "the drift on prometheus, reverted, in the server's drift log",
        demo.settings.step_timeout,
        || async {
            let log = server.api("/api/v1/drift?cluster=prod-eu").await?;
            Ok(drift_entries(&log).into_iter().find(|e| {
                e["record"]["name"] == "prometheus" && !e["record"]["revertedAt"].is_null()
            }))
        },
    )
    .await
    .with_context(|| agent_log(demo, PROD_EU))?;
    let record = &entry["record"];
    let repair = millis_between(&record["detectedAt"], &record["revertedAt"]);
    demo.say.say(&format!(
        "The agent reverted it; the server's drift log ({}/api/v1/drift?cluster=prod-eu) says, {} after the scale:",
        server.url,
        seconds(scaled.elapsed())
    ));
    demo.say.detail(&format!(
        "Deployment {}/{}  {}  changed by {} ({}) at {}; reverted {} after detection",
        record["namespace"].as_str().unwrap_or(""),
        record["name"].as_str().unwrap_or(""),
        record["fields"]
            .as_array()
            .map(|f| f
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default(),
        record["manager"].as_str().unwrap_or("an unknown manager"),
        record["operation"].as_str().unwrap_or("?"),
        record["changedAt"]
            .as_str()
            .or(record["detectedAt"].as_str())
            .unwrap_or("?"),
        repair.map_or("?".to_owned(), |ms| format!("{ms} ms")),
    ));
    let now_prometheus = replicas(kube, "monitoring", "prometheus").await?;
    let now_api = replicas(kube, "api", "api").await?;
    let log = server.api("/api/v1/drift?cluster=prod-eu").await?;
    let api_drift = drift_entries(&log)
        .iter()
        .filter(|e| e["record"]["name"] == "api")
        .count();
    anyhow::ensure!(
        now_prometheus == before,
        "prometheus runs {now_prometheus} replicas on prod-eu, expected {before} after the repair"
    );
    anyhow::ensure!(
        now_api == 5 && api_drift == 0,
        "the HPA-owned replicas of api should be left alone: {now_api} replicas, {api_drift} drift records"
    );
    demo.say.detail(&format!(
        "prod-eu's API server now: prometheus replicas {now_prometheus} (again); api replicas {now_api} — the HPA's field, no drift recorded"
    ));
    demo.say.detail(&format!(
        "The cluster's page shows the same audit log: {}/clusters/prod-eu",
        server.url
    ));
    Ok(())
}

/// A fourth cluster labelled env=prod joins and gets monitoring with no manifest written.
async fn join(demo: &mut Demo) -> anyhow::Result<()> {
    demo.say.step("Step 2 of 3 — a fourth cluster joins");
    let pointer = std::fs::read(demo.path(&format!("store/channels/{CHANNEL}.json")))?;
    demo.say.say(&format!(
        "Starting prod-ap ({}) with its agent — no manifest written, no release published",
        PROD_AP.labels()
    ));
    let started = Instant::now();
    demo.start_clusters(&[PROD_AP]).await?;
    describe_cluster(demo, PROD_AP)?;
    let view = wait_synced(demo, PROD_AP.name, 1).await?;
    let kube = &demo.cluster(PROD_AP.name)?.kube;
    let retention = prometheus_retention(kube).await?;
    let region = external_region(kube).await?;
    anyhow::ensure!(
        std::fs::read(demo.path(&format!("store/channels/{CHANNEL}.json")))? == pointer,
        "the store changed while prod-ap joined"
    );
    demo.say.say(&format!(
        "prod-ap Synced at release 1, {} after it started; the store is unchanged",
        seconds(started.elapsed())
    ));
    demo.say.detail(&cluster_line(&view));
    demo.say.detail(&format!(
        "its selector env=prod picked monitoring: prometheus --storage.tsdb.retention.time={retention}, external label region: {region}"
    ));
    Ok(())
}

/// prod-us's agent stops: after the grace period the server shows it Unknown, counted apart from Synced.
async fn silence(demo: &mut Demo) -> anyhow::Result<()> {
    demo.say.step("Step 3 of 3 — prod-us goes silent");
    let cluster = demo.cluster_mut(PROD_US.name)?;
    let pid = cluster.agent_pid().unwrap_or_default();
    let exited = cluster.stop_agent().await;
    let stopped = Instant::now();
    demo.say.say(&format!(
        "Stopped prod-us's agent (pid {pid}{}); the cluster keeps running, but nothing reports for it",
        if exited { ", SIGTERM" } else { ", killed" }
    ));
    let server = demo.server()?;
    let view = server
        .wait_cluster(
            PROD_US.name,
            "prod-us Unknown",
            demo.settings.step_timeout,
            |v| v["cluster"]["state"] == "Unknown",
        )
        .await?;
    let row = &view["cluster"];
    demo.say.say(&format!(
        "prod-us is Unknown, {} after its agent stopped (grace period {}s): last reported {}, last heartbeat {}s ago",
        seconds(stopped.elapsed()),
        row["graceSeconds"],
        row["lastReported"].as_str().unwrap_or("nothing"),
        row["heartbeatAgeSeconds"]
    ));
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
        prod["counts"]["Unknown"] == 1 && prod["counts"]["Synced"] == 2,
        "expected 2 Synced and 1 Unknown among env=prod: {prod}"
    );
    let (code, page) = server.get("/").await?;
    anyhow::ensure!(
        code == 200
            && page.contains("<tr class=\"s-Unknown\"><td><a href=\"/clusters/prod-us\">")
            && page.contains("last reported Synced"),
        "the fleet page does not show prod-us Unknown (HTTP {code})"
    );
    demo.say.detail(&format!(
        "the fleet page ({}/) shows the same: prod-us Unknown, last reported Synced, in its own counter",
        server.url
    ));
    demo.say
        .detail("Unknown is counted apart: a silent cluster is never shown as Synced.");
    Ok(())
}

/// Prints a started cluster's line: name, labels, API server, process ids.
fn describe_cluster(demo: &Demo, member: Member) -> anyhow::Result<()> {
    let cluster = demo.cluster(member.name)?;
    demo.say.detail(&format!(
        "{:<11} {:<22} {}  localkube pid {}, agent pid {}",
        member.name,
        member.labels(),
        cluster.kube.server_url(),
        cluster.kube.pid().unwrap_or_default(),
        cluster.agent_pid().unwrap_or_default()
    ));
    Ok(())
}

/// Waits until the server shows `name` Synced at `serial`.
async fn wait_synced(demo: &Demo, name: &str, serial: u64) -> anyhow::Result<Value> {
    let server: &SourceServer = demo.server()?;
    let member = [PROD_EU, PROD_US, STAGING_EU, PROD_AP]
        .into_iter()
        .find(|m| m.name == name);
    server
        .wait_cluster(
            name,
            &format!("{name} Synced at release {serial} on the server"),
            demo.settings.step_timeout,
            |v| v["cluster"]["state"] == "Synced" && v["cluster"]["appliedSerial"] == serial,
        )
        .await
        .with_context(|| member.map(|m| agent_log(demo, m)).unwrap_or_default())
}

/// The tail of an agent's log, for errors.
fn agent_log(demo: &Demo, member: Member) -> String {
    let path = demo.path(&format!("logs/agent-{}.log", member.name));
    format!(
        "agent log {}:\n{}",
        path.display(),
        tail(&std::fs::read_to_string(&path).unwrap_or_default(), 30)
    )
}

/// `prod-eu     Synced  release 1/1  apps: api (Synced, 6 objects), monitoring (…)`.
fn cluster_line(view: &Value) -> String {
    let row = &view["cluster"];
    let apps: Vec<String> = view["report"]["apps"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|a| {
            format!(
                "{} ({}, {} objects)",
                a["name"].as_str().unwrap_or("?"),
                a["state"].as_str().unwrap_or("?"),
                a["objects"]
            )
        })
        .collect();
    format!(
        "{:<11} {:<8} release {}/{}  apps: {}",
        row["name"].as_str().unwrap_or("?"),
        row["state"].as_str().unwrap_or("?"),
        row["appliedSerial"],
        row["latestSerial"],
        apps.join(", ")
    )
}

/// `Synced 2 · Unknown 1 (total 3)` from a fleet view's counts.
fn counts_line(fleet: &Value) -> String {
    let parts: Vec<String> = fleet["counts"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(_, n)| n.as_u64().unwrap_or(0) > 0)
                .map(|(s, n)| format!("{s} {n}"))
                .collect()
        })
        .unwrap_or_default();
    format!("{} (total {})", parts.join(" · "), fleet["total"])
}

fn drift_entries(log: &Value) -> Vec<Value> {
    log["drift"].as_array().cloned().unwrap_or_default()
}

fn millis_between(from: &Value, to: &Value) -> Option<i64> {
    let from: jiff::Timestamp = from.as_str()?.parse().ok()?;
    let to: jiff::Timestamp = to.as_str()?.parse().ok()?;
    Some(to.as_millisecond() - from.as_millisecond())
}

async fn replicas(kube: &LocalKube, namespace: &str, name: &str) -> anyhow::Result<i32> {
    let deployment = Api::<Deployment>::namespaced(kube.client(), namespace)
        .get(name)
        .await
        .with_context(|| format!("reading Deployment {namespace}/{name}"))?;
    Ok(deployment.spec.replicas.unwrap_or(1))
}

async fn prometheus_retention(kube: &LocalKube) -> anyhow::Result<String> {
    let deployment = Api::<Deployment>::namespaced(kube.client(), "monitoring")
        .get("prometheus")
        .await
        .context("reading Deployment monitoring/prometheus")?;
    let args = deployment
        .spec
        .template
        .spec
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.args)
        .unwrap_or_default();
    Ok(args
        .iter()
        .find_map(|a| a.strip_prefix("--storage.tsdb.retention.time="))
        .unwrap_or("(not set)")
        .to_owned())
}

async fn external_region(kube: &LocalKube) -> anyhow::Result<String> {
    let config = config_value(kube, "monitoring", "prometheus-config", "prometheus.yml").await?;
    Ok(config
        .lines()
        .find_map(|l| l.trim().strip_prefix("region:"))
        .unwrap_or("(none)")
        .trim()
        .to_owned())
}

async fn config_value(
    kube: &LocalKube,
    namespace: &str,
    name: &str,
    key: &str,
) -> anyhow::Result<String> {
    let config = Api::<ConfigMap>::namespaced(kube.client(), namespace)
        .get(name)
        .await
        .with_context(|| format!("reading ConfigMap {namespace}/{name}"))?;
    Ok(config
        .data
        .and_then(|d| d.get(key).cloned())
        .unwrap_or_default())
}
