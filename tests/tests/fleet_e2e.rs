//! The fleet end to end: one real `windvane-server` and four localkube clusters, each with the real
//! `windvane-agent` enrolled and heartbeating, running the example fleet `acme` (`deploy/examples/fleet`:
//! monitoring for `env=prod` with an EU customization, api everywhere). The clusters are shared by the
//! scenarios of one test, in order, because each localkube costs seconds and hundreds of MiB:
//!
//! 1. each cluster gets its own rendering of its labels (EU retention, per-region labels, staging values);
//! 2. a new cluster labelled `env=prod` is deployed with no manifest written and no release published;
//! 3. the roll-up counts 3/3 prod clusters Synced (and the page, the API and `windvane status` agree);
//! 4. a cluster whose agent stopped becomes Unknown, counted apart from Synced (the three views still
//!    agree), and Synced again when the agent is back (a real network cut: `fleet_full_size`,
//!    `fleet_network_fault`);
//! 5. with the source server down the agents keep healing drift from their last known good (one restarted
//!    during the outage, so from what it persisted), and once the server is back they report again (with the
//!    drift they repaired meanwhile) and pick up the release published while it was down;
//! 6. a new release reaches every cluster its selector picks and changes nothing on the others.
//!
//! Every fact is read from the real system: the clusters' API servers, the server's JSON API and page,
//! and the `windvane` command line.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use windvane_tests::fleet::{AgentOptions, Cluster, FleetTree, Publisher};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::{scenario, wait_for};
use windvane_tests::server::SourceServer;
use windvane_tests::views::{three_views_agree, windvane};

/// Deadline of every wait: generous, for a loaded 2-core machine.
const WAIT: Duration = Duration::from_secs(120);
/// The agents' heartbeat interval and the server's silence grace period: short, so the test is quick.
const HEARTBEAT: &str = "1s";
const UNKNOWN_AFTER: &str = "5s";

/// The clusters, their labels, and whether the test starts them at once (prod-ap joins later).
const PROD_EU: &str = "prod-eu";
const PROD_US: &str = "prod-us";
const STAGING_EU: &str = "staging-eu";
const PROD_AP: &str = "prod-ap";

fn labels(cluster: &str) -> Vec<String> {
    let (env, region) = match cluster {
        PROD_EU => ("prod", "eu"),
        PROD_US => ("prod", "us"),
        STAGING_EU => ("staging", "eu"),
        _ => ("prod", "ap"),
    };
    vec![format!("env={env}"), format!("region={region}")]
}

/// The running fleet.
struct Fleet {
    publisher: Publisher,
    tree: FleetTree,
    server: SourceServer,
    clusters: BTreeMap<String, Cluster>,
}

impl Fleet {
    fn cluster(&self, name: &str) -> anyhow::Result<&Cluster> {
        self.clusters
            .get(name)
            .with_context(|| format!("no cluster {name}"))
    }

    fn kube(&self, name: &str) -> anyhow::Result<&LocalKube> {
        Ok(&self.cluster(name)?.kube)
    }

    async fn start_cluster(&self, name: &str) -> anyhow::Result<Cluster> {
        let mut options =
            AgentOptions::new(&self.server.url, &self.publisher.public_key_path(), name)
                .reporting_to(&self.server.url, &self.server.token_file, HEARTBEAT);
        options.labels = labels(name);
        Cluster::start(options)
            .await
            .with_context(|| format!("starting cluster {name}"))
    }

    /// Waits until the server shows `name` Synced at `serial`.
    async fn wait_synced(&self, name: &str, serial: u64) -> anyhow::Result<Value> {
        let view = self
            .server
            .wait_cluster(
                name,
                &format!("{name} Synced at serial {serial}"),
                WAIT,
                |v| v["cluster"]["state"] == "Synced" && v["cluster"]["appliedSerial"] == serial,
            )
            .await;
        view.with_context(|| agent_log_tail(self, name))
    }
}

fn agent_log_tail(fleet: &Fleet, name: &str) -> String {
    fleet.clusters.get(name).map_or_else(String::new, |c| {
        format!(
            "agent log of {name}:\n{}",
            windvane_tests::process::tail(&c.agent_log(), 40)
        )
    })
}

async fn prometheus_args(kube: &LocalKube) -> anyhow::Result<Vec<String>> {
    let deployment = Api::<Deployment>::namespaced(kube.client(), "monitoring")
        .get("prometheus")
        .await?;
    Ok(deployment
        .spec
        .template
        .spec
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.args)
        .unwrap_or_default())
}

async fn config_map(kube: &LocalKube, namespace: &str, name: &str) -> anyhow::Result<ConfigMap> {
    Api::<ConfigMap>::namespaced(kube.client(), namespace)
        .get(name)
        .await
        .with_context(|| format!("ConfigMap {namespace}/{name}"))
}

async fn config_map_opt(
    kube: &LocalKube,
    namespace: &str,
    name: &str,
) -> anyhow::Result<Option<ConfigMap>> {
    Ok(Api::<ConfigMap>::namespaced(kube.client(), namespace)
        .get_opt(name)
        .await?)
}

fn data(cm: &ConfigMap, key: &str) -> String {
    cm.data
        .as_ref()
        .and_then(|d| d.get(key))
        .cloned()
        .unwrap_or_default()
}

fn resource_version(cm: &ConfigMap) -> String {
    cm.metadata.resource_version.clone().unwrap_or_default()
}

async fn namespace_exists(kube: &LocalKube, name: &str) -> anyhow::Result<bool> {
    Ok(Api::<Namespace>::all(kube.client())
        .get_opt(name)
        .await?
        .is_some())
}

async fn replicas(kube: &LocalKube, namespace: &str, name: &str) -> anyhow::Result<i32> {
    let deployment = Api::<Deployment>::namespaced(kube.client(), namespace)
        .get(name)
        .await?;
    Ok(deployment.spec.replicas.unwrap_or(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_scenarios_across_four_clusters() -> anyhow::Result<()> {
    let started = Instant::now();
    let publisher = Publisher::new(71)?;
    let tree = FleetTree::example()?;
    publisher.publish(&tree, "stable")?;
    let server =
        SourceServer::start(&publisher.store(), &["--unknown-after", UNKNOWN_AFTER]).await?;
    let mut fleet = Fleet {
        publisher,
        tree,
        server,
        clusters: BTreeMap::new(),
    };
    let (eu, us, staging) = tokio::try_join!(
        fleet.start_cluster(PROD_EU),
        fleet.start_cluster(PROD_US),
        fleet.start_cluster(STAGING_EU),
    )?;
    for cluster in [eu, us, staging] {
        fleet.clusters.insert(cluster.name().to_owned(), cluster);
    }
    eprintln!(
        "three clusters up after {:.1}s",
        started.elapsed().as_secs_f64()
    );

    scenario("each_cluster_gets_its_own_rendering", own_rendering(&fleet)).await?;
    let joined = scenario(
        "a_new_prod_cluster_is_deployed_with_no_new_manifest",
        new_prod_cluster(&fleet),
    )
    .await?;
    fleet.clusters.insert(PROD_AP.to_owned(), joined);
    scenario("rollup_three_of_three_prod_synced", rollup(&fleet)).await?;
    scenario(
        "a_silent_agent_is_unknown_apart_from_synced_then_synced_again",
        unknown_then_back(&mut fleet),
    )
    .await?;
    scenario(
        "source_down_agents_heal_from_last_known_good_then_resume",
        source_down(&mut fleet),
    )
    .await?;
    scenario(
        "a_new_release_reaches_every_selected_cluster_and_no_other",
        selected_only(&fleet),
    )
    .await?;

    for cluster in fleet.clusters.values_mut() {
        cluster.stop().await?;
    }
    fleet.server.stop().await;
    eprintln!("whole test: {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Scenario 1: prod-eu gets the EU retention, prod-us the default; each its own region label; staging-eu
/// no monitoring at all and the staging values of api.
async fn own_rendering(fleet: &Fleet) -> anyhow::Result<()> {
    for name in [PROD_EU, PROD_US, STAGING_EU] {
        fleet.wait_synced(name, 1).await?;
    }
    let eu = prometheus_args(fleet.kube(PROD_EU)?).await?;
    let us = prometheus_args(fleet.kube(PROD_US)?).await?;
    assert!(
        eu.contains(&"--storage.tsdb.retention.time=30d".to_owned()),
        "prod-eu gets the EU retention: {eu:?}"
    );
    assert!(
        us.contains(&"--storage.tsdb.retention.time=15d".to_owned()),
        "prod-us keeps the default retention: {us:?}"
    );
    for (name, region) in [(PROD_EU, "eu"), (PROD_US, "us")] {
        let config = data(
            &config_map(fleet.kube(name)?, "monitoring", "prometheus-config").await?,
            "prometheus.yml",
        );
        assert!(
            config.contains(&format!("region: {region}"))
                && config.contains(&format!("cluster: {name}")),
            "{name} renders its own labels into prometheus.yml:\n{config}"
        );
    }
    assert!(
        !namespace_exists(fleet.kube(STAGING_EU)?, "monitoring").await?,
        "staging-eu is not env=prod: no monitoring"
    );
    let hpa_min = |kube: &LocalKube| {
        let api = Api::<HorizontalPodAutoscaler>::namespaced(kube.client(), "api");
        async move { anyhow::Ok(api.get("api").await?.spec.min_replicas.unwrap_or(0)) }
    };
    assert_eq!(hpa_min(fleet.kube(STAGING_EU)?).await?, 1, "staging values");
    assert_eq!(hpa_min(fleet.kube(PROD_EU)?).await?, 3, "prod values");
    let staging_config = config_map(fleet.kube(STAGING_EU)?, "api", "api-config").await?;
    assert_eq!(data(&staging_config, "LOG_LEVEL"), "debug");
    assert_eq!(data(&staging_config, "CLUSTER"), STAGING_EU);
    Ok(())
}

/// Scenario 2: prod-ap enrols and gets monitoring and api at the release already published — the store is
/// not touched.
async fn new_prod_cluster(fleet: &Fleet) -> anyhow::Result<Cluster> {
    let pointer = std::fs::read(fleet.publisher.pointer_path("stable"))?;
    let joined = fleet.start_cluster(PROD_AP).await?;
    let view = fleet
        .server
        .wait_cluster(PROD_AP, "prod-ap Synced at serial 1", WAIT, |v| {
            v["cluster"]["state"] == "Synced" && v["cluster"]["appliedSerial"] == 1
        })
        .await
        .with_context(|| windvane_tests::process::tail(&joined.agent_log(), 40))?;
    let apps: Vec<&str> = view["report"]["apps"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|a| a["name"].as_str())
        .collect();
    assert!(
        apps.contains(&"monitoring") && apps.contains(&"api"),
        "prod-ap reports both apps: {view}"
    );
    let args = prometheus_args(&joined.kube).await?;
    assert!(
        args.contains(&"--storage.tsdb.retention.time=15d".to_owned()),
        "{args:?}"
    );
    let config = data(
        &config_map(&joined.kube, "monitoring", "prometheus-config").await?,
        "prometheus.yml",
    );
    assert!(config.contains("region: ap"), "{config}");
    assert_eq!(
        std::fs::read(fleet.publisher.pointer_path("stable"))?,
        pointer,
        "no release was published for the new cluster"
    );
    Ok(joined)
}

/// Scenario 3: three prod clusters, all Synced; staging counted only without the selector; the page, the
/// API and `windvane status` agree.
async fn rollup(fleet: &Fleet) -> anyhow::Result<()> {
    let prod = wait_for("3/3 prod clusters Synced", WAIT, || async {
        let prod = fleet.server.fleet(Some("env=prod")).await?;
        Ok((prod["counts"]["Synced"] == 3).then_some(prod))
    })
    .await?;
    assert_eq!(prod["total"], 3, "{prod}");
    let names: Vec<&str> = prod["clusters"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, [PROD_AP, PROD_EU, PROD_US], "{prod}");
    let (ok, table, stderr) = windvane(&[
        "status",
        "--server",
        &fleet.server.url,
        "--selector",
        "env=prod",
    ])?;
    assert!(
        ok,
        "`windvane status --selector env=prod` passes: {table}{stderr}"
    );
    assert!(table.starts_with("3 clusters: Synced 3\n"), "{table}");
    let shown = three_views_agree(&fleet.server, None).await?;
    assert_eq!(shown.states.len(), 4, "{shown:?}");
    Ok(())
}

/// Scenario 4: prod-us's agent stops; after the grace period it is Unknown with its last reported state,
/// counted apart from Synced (and `windvane status` fails); back to Synced once the agent runs again.
async fn unknown_then_back(fleet: &mut Fleet) -> anyhow::Result<()> {
    let stopped_at = Instant::now();
    let cluster = fleet.clusters.get_mut(PROD_US).context("no prod-us")?;
    assert!(cluster.stop_agent().await, "the agent exits on SIGTERM");
    let view = fleet
        .server
        .wait_cluster(PROD_US, "prod-us Unknown", WAIT, |v| {
            v["cluster"]["state"] == "Unknown"
        })
        .await?;
    eprintln!(
        "prod-us Unknown {:.1}s after its agent stopped",
        stopped_at.elapsed().as_secs_f64()
    );
    let age = view["cluster"]["heartbeatAgeSeconds"].as_u64().unwrap_or(0);
    assert!(
        age >= 5 && view["cluster"]["graceSeconds"] == 5,
        "Unknown only once the last heartbeat is older than the grace period ({UNKNOWN_AFTER}): {view}"
    );
    assert_eq!(view["cluster"]["lastReported"], "Synced", "{view}");
    let prod = fleet.server.fleet(Some("env=prod")).await?;
    assert_eq!(prod["counts"]["Unknown"], 1, "{prod}");
    assert_eq!(
        prod["counts"]["Synced"], 2,
        "Unknown is not counted as Synced: {prod}"
    );
    assert_eq!(prod["total"], 3, "{prod}");
    let (ok, _, stderr) = windvane(&[
        "status",
        "--server",
        &fleet.server.url,
        "--selector",
        "env=prod",
    ])?;
    assert!(!ok, "`windvane status` fails while a cluster is Unknown");
    assert!(stderr.contains("prod-us is Unknown"), "{stderr}");
    let shown = three_views_agree(&fleet.server, None).await?;
    assert_eq!(
        shown.states.get(PROD_US).map(String::as_str),
        Some("Unknown")
    );
    assert_eq!(shown.counts.get("Unknown"), Some(&1), "{shown:?}");
    assert_eq!(shown.counts.get("Synced"), Some(&3), "{shown:?}");

    let cluster = fleet.clusters.get_mut(PROD_US).context("no prod-us")?;
    cluster.start_agent().await?;
    fleet.wait_synced(PROD_US, 1).await?;
    let prod = fleet.server.fleet(Some("env=prod")).await?;
    assert_eq!(prod["counts"]["Synced"], 3, "{prod}");
    assert_eq!(prod["counts"]["Unknown"], 0, "{prod}");
    Ok(())
}

/// Scenario 5: the source server stops, and prod-eu's agent is restarted during the outage. It enforces its
/// persisted last known good, notices the source is down (stale), and still reverts drift made meanwhile; a release published meanwhile (monitoring scrapes every 15 s) arrives once the server
/// is back, and the drift repaired during the outage reaches the drift log.
async fn source_down(fleet: &mut Fleet) -> anyhow::Result<()> {
    assert!(fleet.server.stop().await, "the server exits on SIGTERM");
    // A fresh agent process has nothing in memory: what it enforces comes from the last known good it
    // persisted in the cluster.
    let eu = fleet.clusters.get_mut(PROD_EU).context("no prod-eu")?;
    assert!(eu.stop_agent().await, "the agent exits on SIGTERM");
    eu.start_agent().await?;
    let eu = fleet.cluster(PROD_EU)?;
    wait_for("prod-eu's restarted agent ready", WAIT, || async {
        Ok((eu.agent()?.readyz().await? == 200).then_some(()))
    })
    .await
    .with_context(|| windvane_tests::process::tail(&eu.agent_log(), 40))?;
    eu.agent()?
        .wait_status("prod-eu sees the source down", WAIT, |s| {
            !s["source"]["staleSince"].is_null() && s["source"]["appliedSerial"] == 1
        })
        .await?;

    let params = PatchParams {
        field_manager: Some("kubectl-scale".into()),
        ..PatchParams::default()
    };
    Api::<Deployment>::namespaced(eu.kube.client(), "monitoring")
        .patch_scale(
            "prometheus",
            &params,
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await?;
    wait_for("prometheus back to 1 replica on prod-eu", WAIT, || async {
        Ok((replicas(&eu.kube, "monitoring", "prometheus").await? == 1).then_some(()))
    })
    .await
    .with_context(|| windvane_tests::process::tail(&eu.agent_log(), 40))?;
    let status = eu.agent()?.status().await?;
    assert!(
        !status["source"]["staleSince"].is_null(),
        "healed while the source was still down: {status}"
    );
    let staging_api_config =
        resource_version(&config_map(fleet.kube(STAGING_EU)?, "api", "api-config").await?);

    let fleet_yaml = std::fs::read_to_string(fleet.tree.path().join("fleet.yaml"))?;
    anyhow::ensure!(fleet_yaml.contains("scrapeInterval: 30s"), "{fleet_yaml}");
    fleet.tree.write(
        "fleet.yaml",
        &fleet_yaml.replace("scrapeInterval: 30s", "scrapeInterval: 15s"),
    )?;
    let pointer = fleet.publisher.publish(&fleet.tree, "stable")?;
    assert_eq!(pointer.serial, 2);

    fleet.server.restart().await?;
    for name in [PROD_EU, PROD_US, STAGING_EU, PROD_AP] {
        fleet.wait_synced(name, 2).await?;
    }
    for name in [PROD_EU, PROD_US, PROD_AP] {
        let config = data(
            &config_map(fleet.kube(name)?, "monitoring", "prometheus-config").await?,
            "prometheus.yml",
        );
        assert!(config.contains("scrape_interval: 15s"), "{name}: {config}");
    }
    assert!(!namespace_exists(fleet.kube(STAGING_EU)?, "monitoring").await?);
    assert_eq!(
        resource_version(&config_map(fleet.kube(STAGING_EU)?, "api", "api-config").await?),
        staging_api_config,
        "release 2 changes nothing on staging-eu"
    );
    let drift = fleet
        .server
        .wait_drift(
            "prod-eu",
            "the outage's drift in the audit log",
            WAIT,
            |e| {
                e["record"]["name"] == "prometheus"
                    && e["record"]["manager"] == "kubectl-scale"
                    && !e["record"]["revertedAt"].is_null()
            },
        )
        .await?;
    assert!(
        drift["record"]["fields"]
            .to_string()
            .contains("/spec/replicas"),
        "{drift}"
    );
    Ok(())
}

/// Scenario 6: release 3 adds an app for `region=eu`: prod-eu and staging-eu get it; prod-us and prod-ap
/// accept release 3 and nothing of theirs is written.
async fn selected_only(fleet: &Fleet) -> anyhow::Result<()> {
    let mut untouched = BTreeMap::new();
    for name in [PROD_US, PROD_AP] {
        let cm = config_map(fleet.kube(name)?, "monitoring", "prometheus-config").await?;
        untouched.insert(name, resource_version(&cm));
    }
    let mut fleet_yaml = std::fs::read_to_string(fleet.tree.path().join("fleet.yaml"))?;
    if !fleet_yaml.ends_with('\n') {
        fleet_yaml.push('\n');
    }
    fleet_yaml.push_str(
        "\n  - name: eu-audit\n    path: apps/eu-audit\n    selector:\n      matchLabels:\n        region: eu\n",
    );
    fleet.tree.write("fleet.yaml", &fleet_yaml)?;
    fleet.tree.write(
        "apps/eu-audit/configmap.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: audit-policy\n  namespace: default\ndata:\n  cluster: ${cluster.name}\n  region: ${cluster.labels.region}\n",
    )?;
    assert_eq!(fleet.publisher.publish(&fleet.tree, "stable")?.serial, 3);
    for name in [PROD_EU, PROD_US, STAGING_EU, PROD_AP] {
        fleet.wait_synced(name, 3).await?;
    }
    for name in [PROD_EU, STAGING_EU] {
        let cm = config_map_opt(fleet.kube(name)?, "default", "audit-policy")
            .await?
            .with_context(|| format!("{name} is region=eu and gets eu-audit"))?;
        assert_eq!(data(&cm, "cluster"), name);
        assert_eq!(data(&cm, "region"), "eu");
    }
    for name in [PROD_US, PROD_AP] {
        assert!(
            config_map_opt(fleet.kube(name)?, "default", "audit-policy")
                .await?
                .is_none(),
            "{name} is not region=eu"
        );
        let cm = config_map(fleet.kube(name)?, "monitoring", "prometheus-config").await?;
        assert_eq!(
            resource_version(&cm),
            untouched[name],
            "release 3 rewrites nothing on {name}"
        );
    }
    Ok(())
}
