//! The story the demo tells, step by step. Each step does something real (the `windvane` command line, the
//! bundled kubectl, a cluster's network cut) and then waits — with a deadline — until it can read the outcome
//! from the real system: the source server's JSON API, the clusters' API servers, the agents' admin
//! endpoints. Nothing is printed as seen that was not read back; a step whose outcome does not show up in
//! time fails the demo with what it last saw.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use serde_json::Value;
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::process::tail;
use windvane_tests::server::SourceServer;

use crate::cast::{CHANNEL, Demo};
use crate::narrate::seconds;
use crate::roster::{Member, ordinal};

/// Runs the whole story.
pub async fn tell(demo: &mut Demo) -> anyhow::Result<()> {
    release(demo)?;
    serve(demo).await?;
    first_clusters(demo).await?;
    drift(demo).await?;
    crate::faults::pod_deleted(demo).await?;
    join(demo).await?;
    crate::faults::network_cut(demo).await?;
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

/// The initial clusters with their agents; all enrol and sync; each renders its own share.
async fn first_clusters(demo: &mut Demo) -> anyhow::Result<()> {
    let members = demo.settings.roster.initial.clone();
    let n = members.len();
    demo.say.step(&format!("{n} clusters, each with its agent"));
    let envs: Vec<String> = demo
        .settings
        .roster
        .envs()
        .iter()
        .map(|(env, count)| format!("{count} env={env}"))
        .collect();
    demo.say.say(&format!(
        "Starting {n} localkube clusters ({}; each etcd, kube-apiserver, controller-manager and a fake node), \
         {} at a time, and on each:",
        envs.join(", "),
        Demo::starts_at_once().min(n)
    ));
    demo.say.command(&format!(
        "windvane-agent run --source PROXY --channel {CHANNEL} --trusted-key release.pub --fleet acme \\\n              --cluster NAME --label env=…,region=… --server PROXY \\\n              --registration-token-file server/registration-token --heartbeat-interval {} --poll-interval {}",
        demo.settings.heartbeat_interval, demo.settings.poll_interval
    ));
    demo.say.detail(&format!(
        "PROXY: the cluster's own loopback TCP proxy to {} — its network link, which a scene will cut",
        demo.server()?.url
    ));
    let took = demo.start_clusters(&members).await?;
    demo.say.say(&format!(
        "The fleet is up: {n} clusters and their agents started in {}",
        seconds(took)
    ));
    let started = Instant::now();
    for member in &members {
        wait_synced(demo, *member, 1).await?;
    }
    demo.say.say(&format!(
        "All {n} enrolled and Synced ({} after the last agent started). From {}/api/v1/clusters/NAME:",
        seconds(started.elapsed()),
        demo.server()?.url
    ));
    let server = demo.server()?;
    for member in &members {
        let view = server
            .api(&format!("/api/v1/clusters/{}", member.name()))
            .await?;
        demo.say.detail(&cluster_line(&view));
    }
    for (env, count) in demo.settings.roster.envs() {
        let fleet = server.fleet(Some(&format!("env={env}"))).await?;
        anyhow::ensure!(
            fleet["counts"]["Synced"] == count && fleet["total"] == count,
            "expected {count} Synced among env={env}: {fleet}"
        );
        demo.say.detail(&format!(
            "env={env:<8} {}  ({}/api/v1/fleet?selector=env%3D{env})",
            counts_line(&fleet),
            server.url
        ));
    }
    demo.say
        .say("Each cluster rendered its own share (read from its API server):");
    for member in &members {
        let share = rendered_share(demo, *member).await?;
        demo.say.detail(&format!("{:<10} {share}", member.name()));
    }
    Ok(())
}

/// What the example fleet rendered on one cluster, read from its API server: monitoring's retention and
/// region on prod clusters; elsewhere no monitoring, and api's values.
async fn rendered_share(demo: &Demo, member: Member) -> anyhow::Result<String> {
    let kube = &demo.cluster(&member.name())?.kube;
    if member.env == "prod" {
        let retention = prometheus_retention(kube).await?;
        let region = external_region(kube).await?;
        let why = if member.region == "eu" {
            "  (EU customization: retention 30d)"
        } else {
            ""
        };
        return Ok(format!(
            "prometheus --storage.tsdb.retention.time={retention}, external label region: {region}{why}"
        ));
    }
    let monitoring = Api::<Namespace>::all(kube.client())
        .get_opt("monitoring")
        .await
        .with_context(|| format!("reading Namespace monitoring on {}", member.name()))?
        .is_some();
    let hpa_min = Api::<HorizontalPodAutoscaler>::namespaced(kube.client(), "api")
        .get("api")
        .await
        .with_context(|| {
            format!(
                "reading HorizontalPodAutoscaler api/api on {}",
                member.name()
            )
        })?
        .spec
        .min_replicas
        .unwrap_or_default();
    let log_level = kube.config_value("api", "api-config", "LOG_LEVEL").await?;
    Ok(format!(
        "{}; api HPA minReplicas {hpa_min}, LOG_LEVEL {log_level}  ({} customization)",
        if monitoring {
            "has a monitoring namespace".to_owned()
        } else {
            format!("no monitoring (it is env={})", member.env)
        },
        member.env
    ))
}

/// Someone scales Deployments on prod-eu: the one Windvane owns is reverted and logged with who did it; the
/// one whose replicas belong to the HPA is left alone.
async fn drift(demo: &mut Demo) -> anyhow::Result<()> {
    let member = demo.settings.roster.drifting();
    let name = member.name();
    demo.say.step(&format!("Step 1 of 4 — drift on {name}"));
    let kube = &demo.cluster(&name)?.kube;
    let before = replicas(kube, "monitoring", "prometheus").await?;
    demo.say.say(&format!(
        "Someone scales two Deployments on {name} with kubectl (prometheus runs {before} replica(s), as released):"
    ));
    for (namespace, deployment, note) in [
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
            "kubectl -n {namespace} scale deployment {deployment} --replicas=5   {note}"
        ));
        kubectl(
            kube,
            &[
                "-n",
                namespace,
                "scale",
                "deployment",
                deployment,
                "--replicas=5",
            ],
        )?;
    }
    let scaled = Instant::now();
    let server = demo.server()?;
    let drift_path = format!("/api/v1/drift?cluster={name}");
    let entry = wait_for(
        "the drift on prometheus, reverted, in the server's drift log",
        demo.settings.step_timeout,
        || async {
            let log = server.api(&drift_path).await?;
            Ok(drift_entries(&log).into_iter().find(|e| {
                e["record"]["name"] == "prometheus" && !e["record"]["revertedAt"].is_null()
            }))
        },
    )
    .await
    .with_context(|| agent_log(demo, member))?;
    demo.say.say(&format!(
        "The agent reverted it; the server's drift log ({}{drift_path}) says, {} after the scale:",
        server.url,
        seconds(scaled.elapsed())
    ));
    demo.say.detail(&drift_line(&entry["record"]));
    let now_prometheus = replicas(kube, "monitoring", "prometheus").await?;
    let now_api = replicas(kube, "api", "api").await?;
    let log = server.api(&drift_path).await?;
    let api_drift = drift_entries(&log)
        .iter()
        .filter(|e| e["record"]["name"] == "api")
        .count();
    anyhow::ensure!(
        now_prometheus == before,
        "prometheus runs {now_prometheus} replicas on {name}, expected {before} after the repair"
    );
    anyhow::ensure!(
        now_api == 5 && api_drift == 0,
        "the HPA-owned replicas of api should be left alone: {now_api} replicas, {api_drift} drift records"
    );
    demo.say.detail(&format!(
        "{name}'s API server now: prometheus replicas {now_prometheus} (again); api replicas {now_api} — the HPA's field, no drift recorded"
    ));
    demo.say.detail(&format!(
        "The cluster's page shows the same audit log: {}/clusters/{name}",
        server.url
    ));
    Ok(())
}

/// One more cluster labelled env=prod joins and gets monitoring with no manifest written and the store
/// untouched, byte for byte.
async fn join(demo: &mut Demo) -> anyhow::Result<()> {
    let joiner = demo.settings.roster.joiner;
    let name = joiner.name();
    let nth = demo.settings.roster.initial.len() + 1;
    demo.say
        .step(&format!("Step 3 of 4 — a {} cluster joins", ordinal(nth)));
    let store_before = store_files(&demo.path("store"))?;
    demo.say.say(&format!(
        "Starting {name} ({}) with its agent — no manifest written, no release published",
        joiner.labels()
    ));
    let took = demo.start_clusters(&[joiner]).await?;
    let started = Instant::now();
    let view = wait_synced(demo, joiner, 1).await?;
    let kube = &demo.cluster(&name)?.kube;
    let retention = prometheus_retention(kube).await?;
    let region = external_region(kube).await?;
    let store_after = store_files(&demo.path("store"))?;
    anyhow::ensure!(
        store_after == store_before,
        "the store changed while {name} joined: {} files before, {} after",
        store_before.len(),
        store_after.len()
    );
    demo.say.say(&format!(
        "{name} Synced at release 1, {} after it started; the store is unchanged: its {} files byte for byte",
        seconds(took + started.elapsed()),
        store_after.len()
    ));
    demo.say.detail(&cluster_line(&view));
    demo.say.detail(&format!(
        "its selector env=prod picked monitoring: prometheus --storage.tsdb.retention.time={retention}, external label region: {region}"
    ));
    Ok(())
}

/// Every file under the store directory (relative path → contents), to compare before and after.
fn store_files(root: &Path) -> anyhow::Result<BTreeMap<PathBuf, Vec<u8>>> {
    let mut files = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))?
        {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let contents =
                    std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
                files.insert(path.strip_prefix(root)?.to_path_buf(), contents);
            }
        }
    }
    Ok(files)
}

/// Runs the bundled kubectl on `kube`; its standard output, or an error with its stderr.
pub fn kubectl(kube: &LocalKube, args: &[&str]) -> anyhow::Result<String> {
    let output = kube
        .kubectl(args)
        .output()
        .context("running the bundled kubectl")?;
    anyhow::ensure!(
        output.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `Deployment ns/name  /spec/replicas  changed by kubectl (Update) at …; reverted N ms after detection`.
pub fn drift_line(record: &Value) -> String {
    let repair = millis_between(&record["detectedAt"], &record["revertedAt"]);
    format!(
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
    )
}

/// Waits until the server shows `member` Synced at `serial`.
pub async fn wait_synced(demo: &Demo, member: Member, serial: u64) -> anyhow::Result<Value> {
    let server: &SourceServer = demo.server()?;
    let name = member.name();
    server
        .wait_cluster(
            &name,
            &format!("{name} Synced at release {serial} on the server"),
            demo.settings.step_timeout,
            |v| v["cluster"]["state"] == "Synced" && v["cluster"]["appliedSerial"] == serial,
        )
        .await
        .with_context(|| agent_log(demo, member))
}

/// The tail of an agent's log, for errors.
pub fn agent_log(demo: &Demo, member: Member) -> String {
    let path = demo.path(&format!("logs/agent-{}.log", member.name()));
    format!(
        "agent log {}:\n{}",
        path.display(),
        tail(&std::fs::read_to_string(&path).unwrap_or_default(), 30)
    )
}

/// `prod-eu     Synced  release 1/1  apps: api (Synced, 6 objects), monitoring (…)`.
pub fn cluster_line(view: &Value) -> String {
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
        "{:<10} {:<8} release {}/{}  apps: {}",
        row["name"].as_str().unwrap_or("?"),
        row["state"].as_str().unwrap_or("?"),
        row["appliedSerial"],
        row["latestSerial"],
        apps.join(", ")
    )
}

/// `Synced 2 · Unknown 1 (total 3)` from a fleet view's counts.
pub fn counts_line(fleet: &Value) -> String {
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

pub fn drift_entries(log: &Value) -> Vec<Value> {
    log["drift"].as_array().cloned().unwrap_or_default()
}

pub fn millis_between(from: &Value, to: &Value) -> Option<i64> {
    let from: jiff::Timestamp = from.as_str()?.parse().ok()?;
    let to: jiff::Timestamp = to.as_str()?.parse().ok()?;
    Some(to.as_millisecond() - from.as_millisecond())
}

pub async fn replicas(kube: &LocalKube, namespace: &str, name: &str) -> anyhow::Result<i32> {
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
    let config = kube
        .config_value("monitoring", "prometheus-config", "prometheus.yml")
        .await?;
    Ok(config
        .lines()
        .find_map(|l| l.trim().strip_prefix("region:"))
        .unwrap_or("(none)")
        .trim()
        .to_owned())
}
