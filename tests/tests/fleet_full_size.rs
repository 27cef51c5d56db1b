//! The fleet at full size: one real `windvane-server` and twelve localkube clusters — 3 `env=prod`,
//! 4 `env=staging`, 5 `env=dev` — each with the real `windvane-agent`, running the example fleet `acme`
//! (`deploy/examples/fleet`: monitoring for `env=prod`, api for every env). Every agent reaches the server
//! through a loopback TCP proxy of its own — its network link — so that a cluster can be made unreachable
//! for real (traffic blackholed, connections held open) while its agent keeps running. In order:
//!
//! 1. all twelve converge, each with its own share (monitoring only on prod; staging and dev values for api);
//! 2. a thirteenth cluster labelled `env=prod` joins and gets monitoring with the store byte-identical;
//! 3. one prod cluster's link is blackholed: `env=prod` reads 3 Synced · 1 Unknown on the page, the JSON API
//!    and `windvane status`, the other twelve stay Synced, and the cut-off agent still reverts drift;
//! 4. the link comes back: Synced again, and the repair made meanwhile reaches the drift log.
//!
//! It also prints what twelve control planes cost on this machine: time to start, memory, CPU.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::future::try_join_all;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use windvane_tests::fleet::{AgentOptions, Cluster, FleetTree, Publisher, snapshot_files};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::{scenario, wait_for};
use windvane_tests::process::{binary, tail};
use windvane_tests::procfs;
use windvane_tests::proxy::Proxy;
use windvane_tests::server::SourceServer;
use windvane_tests::views::{Shown, three_views_agree, windvane};

/// Deadline of every wait: thirteen control planes share two cores.
const WAIT: Duration = Duration::from_secs(300);
/// The agents' heartbeat interval, and the server's silence grace period: long enough that a busy machine
/// never makes a reachable cluster Unknown, short enough to keep the test quick.
const HEARTBEAT: &str = "2s";
const UNKNOWN_AFTER: &str = "20s";
/// The repair of drift while the cluster is cut off: its normal latency is well under a second.
const REPAIR: Duration = Duration::from_secs(30);

/// One cluster of the fleet: its name and labels.
#[derive(Debug, Clone)]
struct Member {
    name: String,
    env: &'static str,
    region: &'static str,
}

/// 3 prod, 4 staging, 5 dev, regions taken in turn.
fn twelve() -> Vec<Member> {
    const REGIONS: [&str; 3] = ["eu", "us", "ap"];
    [("prod", 3), ("staging", 4), ("dev", 5)]
        .into_iter()
        .flat_map(|(env, count)| {
            (1..=count).map(move |i| Member {
                name: format!("{env}-{i}"),
                env,
                region: REGIONS[(i - 1) % REGIONS.len()],
            })
        })
        .collect()
}

/// A cluster and the link its agent reaches the server through.
struct Node {
    member: Member,
    cluster: Cluster,
    link: Proxy,
}

struct Fleet {
    publisher: Publisher,
    server: SourceServer,
    nodes: BTreeMap<String, Node>,
}

impl Fleet {
    fn node(&self, name: &str) -> anyhow::Result<&Node> {
        self.nodes
            .get(name)
            .with_context(|| format!("no cluster {name}"))
    }

    fn kube(&self, name: &str) -> anyhow::Result<&LocalKube> {
        Ok(&self.node(name)?.cluster.kube)
    }

    /// Starts the agent of `member` on `kube`, reaching the server through a new link of its own.
    async fn start_agent(&self, member: Member, kube: LocalKube) -> anyhow::Result<Node> {
        let target: SocketAddr = self
            .server
            .url
            .trim_start_matches("http://")
            .parse()
            .context("the server's address")?;
        let link = Proxy::start(target).await?;
        let mut options =
            AgentOptions::new(&link.url(), &self.publisher.public_key_path(), &member.name)
                .reporting_to(&link.url(), &self.server.token_file, HEARTBEAT);
        options.labels = vec![
            format!("env={}", member.env),
            format!("region={}", member.region),
        ];
        let log = kube.data_dir().join(format!("agent-{}.log", member.name));
        let cluster = Cluster::start_on(kube, options, binary("windvane-agent")?, log)
            .await
            .with_context(|| format!("starting the agent of {}", member.name))?;
        Ok(Node {
            member,
            cluster,
            link,
        })
    }

    /// Waits until the server shows `name` Synced at `serial`.
    async fn wait_synced(&self, name: &str, serial: u64) -> anyhow::Result<Value> {
        self.server
            .wait_cluster(
                name,
                &format!("{name} Synced at serial {serial}"),
                WAIT,
                |v| v["cluster"]["state"] == "Synced" && v["cluster"]["appliedSerial"] == serial,
            )
            .await
            .with_context(|| {
                let log = self
                    .nodes
                    .get(name)
                    .map(|n| tail(&n.cluster.agent_log(), 40));
                format!("agent log of {name}:\n{}", log.unwrap_or_default())
            })
    }
}

/// What a set of processes holds in memory now and has used in CPU so far.
fn resources(pids: &[u32]) -> anyhow::Result<(f64, Duration)> {
    let mut rss_mib = 0.0;
    let mut cpu = Duration::ZERO;
    for pid in pids {
        rss_mib += procfs::read_memory(*pid)?.rss_mib;
        cpu += procfs::process(*pid)?;
    }
    Ok((rss_mib, cpu))
}

async fn has_namespace(kube: &LocalKube, name: &str) -> anyhow::Result<bool> {
    Ok(Api::<Namespace>::all(kube.client())
        .get_opt(name)
        .await?
        .is_some())
}

async fn prometheus(kube: &LocalKube) -> anyhow::Result<Deployment> {
    Ok(Api::<Deployment>::namespaced(kube.client(), "monitoring")
        .get("prometheus")
        .await?)
}

fn retention(deployment: &Deployment) -> Option<String> {
    deployment
        .spec
        .template
        .spec
        .as_ref()?
        .containers
        .first()?
        .args
        .as_ref()?
        .iter()
        .find_map(|a| a.strip_prefix("--storage.tsdb.retention.time="))
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_clusters_a_thirteenth_joins_one_is_cut_off() -> anyhow::Result<()> {
    let publisher = Publisher::new(73)?;
    publisher.publish(&FleetTree::example()?, "stable")?;
    let server =
        SourceServer::start(&publisher.store(), &["--unknown-after", UNKNOWN_AFTER]).await?;
    let mut fleet = Fleet {
        publisher,
        server,
        nodes: BTreeMap::new(),
    };

    let started = Instant::now();
    let kubes = try_join_all(twelve().into_iter().map(|_| LocalKube::start())).await?;
    let control_planes_up = started.elapsed();
    let pids: Vec<u32> = kubes.iter().filter_map(LocalKube::pid).collect();
    let (rss_idle, cpu_start) = resources(&pids)?;
    let agents_started = Instant::now();
    let nodes = try_join_all(
        twelve()
            .into_iter()
            .zip(kubes)
            .map(|(member, kube)| fleet.start_agent(member, kube)),
    )
    .await?;
    for node in nodes {
        fleet.nodes.insert(node.member.name.clone(), node);
    }
    eprintln!(
        "twelve control planes ready {:.1}s after they were started together: {rss_idle:.0} MiB resident \
         ({:.0} MiB each), {:.1} CPU-seconds to start ({:.1} each)",
        control_planes_up.as_secs_f64(),
        rss_idle / 12.0,
        cpu_start.as_secs_f64(),
        cpu_start.as_secs_f64() / 12.0
    );

    scenario("all_twelve_converge", converge(&fleet, agents_started)).await?;
    let (rss_synced, cpu_synced) = resources(&pids)?;
    let steady = Instant::now();
    let machine_before = procfs::machine_busy()?;
    scenario(
        "a_thirteenth_prod_cluster_joins_the_store_untouched",
        join(&mut fleet),
    )
    .await?;
    scenario(
        "one_prod_cluster_cut_off_is_unknown_and_keeps_healing",
        cut_off(&fleet),
    )
    .await?;
    scenario("the_link_back_synced_again", link_back(&fleet)).await?;

    let (_, cpu_end) = resources(&pids)?;
    let window = steady.elapsed().as_secs_f64();
    let cores = (cpu_end - cpu_synced).as_secs_f64() / window;
    let machine = (procfs::machine_busy()? - machine_before).as_secs_f64() / window;
    eprintln!(
        "twelve control planes while the fleet ran ({window:.0}s: a join, a cut, a repair): {rss_synced:.0} MiB \
         resident ({:.0} MiB each), {cores:.2} cores ({:.3} each); the whole machine was {machine:.2} of 2 cores busy",
        rss_synced / 12.0,
        cores / 12.0
    );

    let agents: Vec<u32> = fleet
        .nodes
        .values()
        .filter_map(|n| n.cluster.agent_pid())
        .collect();
    let (agents_rss, _) = resources(&agents)?;
    eprintln!(
        "{} agents: {agents_rss:.0} MiB resident ({:.0} MiB each)",
        agents.len(),
        agents_rss / agents.len().max(1) as f64
    );

    for node in fleet.nodes.values_mut() {
        node.cluster.stop().await?;
    }
    fleet.server.stop().await;
    Ok(())
}

/// Scenario 1: the twelve are Synced at release 1, each with its own share, and the three views agree.
async fn converge(fleet: &Fleet, agents_started: Instant) -> anyhow::Result<()> {
    for name in fleet.nodes.keys() {
        fleet.wait_synced(name, 1).await?;
    }
    eprintln!(
        "all twelve Synced {:.1}s after their agents started",
        agents_started.elapsed().as_secs_f64()
    );
    for node in fleet.nodes.values() {
        let (name, kube) = (&node.member.name, &node.cluster.kube);
        let prod = node.member.env == "prod";
        assert_eq!(
            has_namespace(kube, "monitoring").await?,
            prod,
            "{name}: monitoring only on env=prod"
        );
        let log_level = kube.config_value("api", "api-config", "LOG_LEVEL").await?;
        assert_eq!(
            log_level,
            if prod { "info" } else { "debug" },
            "{name}'s api values"
        );
        assert_eq!(
            kube.config_value("api", "api-config", "CLUSTER").await?,
            *name
        );
    }
    let shown = three_views_agree(&fleet.server, None).await?;
    assert_eq!(
        shown.counts,
        BTreeMap::from([("Synced".to_owned(), 12)]),
        "{shown:?}"
    );
    Ok(())
}

/// Scenario 2: prod-4 (region eu) enrols and gets monitoring with the EU retention, at the release already
/// published: not one byte of the store changes.
async fn join(fleet: &mut Fleet) -> anyhow::Result<()> {
    let store = snapshot_files(&fleet.publisher.store())?;
    let member = Member {
        name: "prod-4".to_owned(),
        env: "prod",
        region: "eu",
    };
    let node = fleet.start_agent(member, LocalKube::start().await?).await?;
    fleet.nodes.insert("prod-4".to_owned(), node);
    fleet.wait_synced("prod-4", 1).await?;
    let deployment = prometheus(fleet.kube("prod-4")?).await?;
    assert_eq!(
        retention(&deployment).as_deref(),
        Some("30d"),
        "the EU customization"
    );
    assert!(
        snapshot_files(&fleet.publisher.store())? == store,
        "the store is byte-identical after prod-4 joined"
    );
    let prod = fleet.server.fleet(Some("env=prod")).await?;
    assert_eq!(prod["counts"]["Synced"], 4, "{prod}");
    Ok(())
}

/// Scenario 3: prod-2's link blackholed. Unknown once the grace period passes, counted apart from Synced in
/// all three views; the other twelve stay Synced; drift on prod-2 is reverted by its agent, cut off.
async fn cut_off(fleet: &Fleet) -> anyhow::Result<()> {
    let cut = fleet.node("prod-2")?;
    cut.link.blackhole();
    let since = Instant::now();
    let view = fleet
        .server
        .wait_cluster("prod-2", "prod-2 Unknown", WAIT, |v| {
            v["cluster"]["state"] == "Unknown"
        })
        .await?;
    eprintln!(
        "prod-2 Unknown {:.1}s after its link was cut",
        since.elapsed().as_secs_f64()
    );
    assert_eq!(view["cluster"]["lastReported"], "Synced", "{view}");
    assert!(
        cut.cluster.agent_pid().is_some(),
        "prod-2's agent still runs"
    );
    assert_unknown_apart(fleet).await?;

    let params = PatchParams {
        field_manager: Some("kubectl-scale".into()),
        ..PatchParams::default()
    };
    Api::<Deployment>::namespaced(cut.cluster.kube.client(), "monitoring")
        .patch_scale(
            "prometheus",
            &params,
            &Patch::Merge(json!({"spec": {"replicas": 4}})),
        )
        .await?;
    let scaled = Instant::now();
    wait_for(
        "prometheus back to 1 replica on prod-2, cut off",
        REPAIR,
        || async {
            let replicas = prometheus(&cut.cluster.kube).await?.spec.replicas;
            Ok((replicas == Some(1)).then_some(()))
        },
    )
    .await
    .with_context(|| tail(&cut.cluster.agent_log(), 40))?;
    eprintln!(
        "drift on prod-2 reverted {:.1}s after the scale, while cut off",
        scaled.elapsed().as_secs_f64()
    );
    // Still cut off, still Unknown, the others still Synced.
    assert_unknown_apart(fleet).await
}

/// `env=prod: 3 Synced · 1 Unknown` on the page, the API and `windvane status`, which fails; the whole fleet
/// shows twelve Synced and prod-2 Unknown.
async fn assert_unknown_apart(fleet: &Fleet) -> anyhow::Result<()> {
    let prod = three_views_agree(&fleet.server, Some("env=prod")).await?;
    let expected = BTreeMap::from([("Synced".to_owned(), 3), ("Unknown".to_owned(), 1)]);
    assert_eq!(prod.counts, expected, "env=prod: {prod:?}");
    assert_eq!(
        prod.states.get("prod-2").map(String::as_str),
        Some("Unknown")
    );
    let (ok, table, stderr) = windvane(&[
        "status",
        "--server",
        &fleet.server.url,
        "--selector",
        "env=prod",
    ])?;
    let summary = table.lines().next().unwrap_or_default();
    assert!(
        summary.starts_with("4 clusters: ")
            && summary.contains("Synced 3")
            && summary.contains("Unknown 1"),
        "{table}{stderr}"
    );
    assert!(
        !ok && stderr.contains("prod-2 is Unknown"),
        "`windvane status` fails: {stderr}"
    );
    let all: Shown = three_views_agree(&fleet.server, None).await?;
    let not_synced: Vec<_> = all
        .states
        .iter()
        .filter(|(name, state)| *name != "prod-2" && *state != "Synced")
        .collect();
    assert!(
        not_synced.is_empty(),
        "the other twelve stay Synced: {not_synced:?}"
    );
    assert_eq!(all.states.len(), 13, "{all:?}");
    Ok(())
}

/// Scenario 4: the link forwards again: prod-2 is Synced, and the drift it repaired while cut off is in the
/// server's drift log.
async fn link_back(fleet: &Fleet) -> anyhow::Result<()> {
    fleet.node("prod-2")?.link.forward();
    fleet.wait_synced("prod-2", 1).await?;
    fleet
        .server
        .wait_drift(
            "prod-2",
            "the outage's repair in the drift log",
            WAIT,
            |e| {
                e["record"]["name"] == "prometheus"
                    && e["record"]["manager"] == "kubectl-scale"
                    && !e["record"]["revertedAt"].is_null()
            },
        )
        .await?;
    let all = three_views_agree(&fleet.server, None).await?;
    assert_eq!(
        all.counts,
        BTreeMap::from([("Synced".to_owned(), 13)]),
        "{all:?}"
    );
    Ok(())
}
