//! Apply-side faults against the real agent binary and a real control plane (localkube): the API server killed
//! and restarted mid-apply (pruning waits for a complete apply); the agent killed with SIGKILL between its
//! apply and its bookkeeping (it recovers from the state Secrets and still prunes what it applied); a 409
//! conflict and an immutable field (clear failures naming the object, the rest applied); a finalizer that
//! blocks a prune (the survivor stays in the inventory until it is gone); a watch that expires with
//! `410 Gone` (relisted without repeating any write or delete); a leader handover (the standby takes over
//! within the lease duration, writes nothing it need not, and the Lease does not flap); and a release the
//! agent cannot persist as last known good (an admission policy refuses the write): nothing of it is applied
//! until the write goes through.
//!
//! Covered elsewhere and not repeated here: objects that fail without blocking the others and a basic
//! standby takeover (`agent_sync.rs`), drift made while the agent was down (`agent_drift.rs`).

mod fault_support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use fault_support::{
    SYNC, WIDGET_CRD, config_map, config_map_names, config_maps_yaml, data, holds_for, inventory,
    plain, pruned_count, wait_config_map,
};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, WatchEvent, WatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::watcher::{self, Event};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use windvane_tests::fleet::{AGENT_NAMESPACE, Agent, AgentOptions, FleetTree, Publisher};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::process::tail;
use windvane_tests::store_server::StoreServer;

/// Deadline for convergence after a crash: the control plane restarts, the agent restarts and re-applies
/// hundreds of objects on a loaded machine.
const RECOVER: Duration = Duration::from_secs(240);

const FLEET: &str = "fleet: acme\napps:\n  - name: app\n    path: app\n    policy: {prune: true}\n";

fn tree(objects: &str) -> anyhow::Result<FleetTree> {
    let tree = FleetTree::new()?;
    tree.write("fleet.yaml", FLEET)?;
    tree.write("app/objects.yaml", objects)?;
    Ok(tree)
}

fn names(prefix: &str, range: std::ops::Range<usize>) -> BTreeSet<String> {
    range.map(|i| format!("{prefix}-{i}")).collect()
}

/// A ConfigMap `default/name` with data `x`, and `extra_metadata` (`, key: value`) in its metadata.
fn config_map_with_x(name: &str, extra_metadata: &str, x: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: default{extra_metadata}}}\ndata: {{x: '{x}'}}\n"
    )
}

/// The agent as a supervisor (kubelet, systemd) runs it: started again whenever it exits. Leader election
/// makes the agent exit when it cannot renew its Lease, e.g. while the API server is down.
struct Supervised {
    agent: Agent,
    options: AgentOptions,
    restarts: u32,
}

impl Supervised {
    async fn start(kube: &LocalKube, options: AgentOptions) -> anyhow::Result<Self> {
        let agent = Agent::start(kube, &options).await?;
        Ok(Self {
            agent,
            options,
            restarts: 0,
        })
    }

    /// Restarts the agent if it exited; a start that fails (the API server still away) is retried on the
    /// next call.
    async fn keep_running(&mut self, kube: &LocalKube) -> anyhow::Result<()> {
        if !self.agent.process.is_running() {
            self.agent = Agent::start(kube, &self.options).await?;
            self.restarts += 1;
        }
        Ok(())
    }

    /// Waits for `check` on the agent's `/status`, restarting the agent whenever it exits.
    async fn wait_status(
        &mut self,
        kube: &LocalKube,
        what: &str,
        timeout: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Value> {
        let deadline = Instant::now() + timeout;
        let mut last = Value::Null;
        loop {
            if let Err(error) = self.keep_running(kube).await {
                last = Value::String(format!("restarting the agent: {error:#}"));
            } else if let Ok(status) = self.agent.status().await {
                if check(&status) {
                    return Ok(status);
                }
                last = status;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what}; last status: {last}\nagent log:\n{}",
                tail(&self.agent.process.log(), 60)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Watches the release's ConfigMaps from the test's side and records every moment at which some of the
/// `old` objects were gone while not all of the `new` ones existed yet: a prune before a complete apply.
struct PruneOrderWatch {
    violations: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl PruneOrderWatch {
    fn start(kube: &LocalKube, old: BTreeSet<String>, new: BTreeSet<String>) -> Self {
        let violations = Arc::new(Mutex::new(Vec::new()));
        let api = Api::<ConfigMap>::namespaced(kube.client(), "default");
        let config = watcher::Config::default().labels("windvane.io/fleet=acme");
        let recorded = violations.clone();
        let task = tokio::spawn(async move {
            let mut present = BTreeSet::new();
            let mut relisted = BTreeSet::new();
            let mut listed = false;
            let mut stream = watcher::watcher(api, config).boxed();
            while let Some(event) = stream.next().await {
                let check = match event {
                    Ok(Event::Apply(cm)) => {
                        present.extend(cm.metadata.name);
                        listed
                    }
                    Ok(Event::Delete(cm)) => {
                        if let Some(name) = cm.metadata.name {
                            present.remove(&name);
                        }
                        listed
                    }
                    Ok(Event::Init) => {
                        relisted.clear();
                        false
                    }
                    Ok(Event::InitApply(cm)) => {
                        relisted.extend(cm.metadata.name);
                        false
                    }
                    Ok(Event::InitDone) => {
                        present = std::mem::take(&mut relisted);
                        listed = true;
                        true
                    }
                    // The API server is away (killed on purpose); the watcher relists when it is back.
                    Err(_) => false,
                };
                let old_count = present.intersection(&old).count();
                let new_count = present.intersection(&new).count();
                if check && old_count < old.len() && new_count < new.len() {
                    recorded.lock().expect("lock").push(format!(
                        "{old_count} of {} old objects left while only {new_count} of {} new ones exist",
                        old.len(),
                        new.len()
                    ));
                }
            }
        });
        Self { violations, task }
    }

    fn violations(&self) -> Vec<String> {
        self.violations.lock().expect("lock").clone()
    }
}

impl Drop for PruneOrderWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Polls until ConfigMap `default/<name>` exists, as fast as the API server answers.
async fn wait_exists(kube: &LocalKube, name: &str) -> anyhow::Result<()> {
    let api = Api::<ConfigMap>::namespaced(kube.client(), "default");
    let deadline = Instant::now() + SYNC;
    while api.get_opt(name).await?.is_none() {
        anyhow::ensure!(Instant::now() < deadline, "{name} never appeared");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_killed_mid_apply_converges_and_prunes_only_after_a_complete_apply()
-> anyhow::Result<()> {
    let mut kube = LocalKube::start().await?;
    let publisher = Publisher::new(31)?;
    let (old, new) = (names("old", 0..60), names("new", 0..200));
    let fleet = tree(&config_maps_yaml("default", "old", 60))?;
    publisher.publish(&fleet, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let mut options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1");
    // The new release replaces every object: the budget must allow pruning all of them.
    options.extra = vec!["--prune-budget".into(), "1".into()];
    let mut agent = Supervised::start(&kube, options).await?;
    agent
        .wait_status(&kube, "first sync", SYNC, |s| {
            s["state"] == "Synced" && s["counts"]["Synced"] == 60
        })
        .await?;
    let order = PruneOrderWatch::start(&kube, old.clone(), new.clone());

    // A release that replaces all 60 objects with 200 others; the control plane dies while it applies.
    fleet.write("app/objects.yaml", &config_maps_yaml("default", "new", 200))?;
    publisher.publish(&fleet, "stable")?;
    wait_exists(&kube, "new-0").await?;
    kube.kill();
    let killed_at = Instant::now();
    wait_for("the agent to notice", SYNC, || async {
        let log = agent.agent.process.log();
        Ok((log.contains("apply failed") || log.contains("leadership lost")).then_some(()))
    })
    .await?;
    kube.restart().await?;
    let down_for = killed_at.elapsed();

    agent
        .wait_status(&kube, "converged on serial 2", RECOVER, |s| {
            s["state"] == "Synced"
                && s["source"]["appliedSerial"] == 2
                && s["counts"]["Synced"] == 200
                && s["lastError"].is_null()
        })
        .await?;
    wait_for("old objects pruned", SYNC, || async {
        Ok(config_map_names(&kube, "default", "old-")
            .await?
            .is_empty()
            .then_some(()))
    })
    .await?;
    assert_eq!(config_map_names(&kube, "default", "new-").await?, new);
    assert_eq!(inventory(&kube).await?.len(), 200);
    // The crash cut the apply short: objects failed to apply, or the agent died before the sync finished
    // (it exits when it cannot renew its Lease in time) and was restarted.
    let log = plain(&agent.agent.process.log());
    assert!(
        log.contains("apply failed") || (agent.restarts > 0 && log.contains("leadership lost")),
        "the apply was cut short by the crash: {}",
        tail(&log, 80)
    );
    let violations = order.violations();
    assert!(
        violations.is_empty(),
        "pruned before the apply completed: {violations:?}"
    );
    println!(
        "API server down for {:.1} s mid-apply; agent restarted {} time(s) by its supervisor",
        down_for.as_secs_f64(),
        agent.restarts
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_between_apply_and_bookkeeping_recovers_and_prunes_what_it_applied()
-> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(32)?;
    let fleet = tree(&config_maps_yaml("default", "a", 20))?;
    publisher.publish(&fleet, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let mut options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1");
    options.extra = vec!["--prune-budget".into(), "1".into()];
    let mut agent = Agent::start(&kube, &options).await?;
    agent
        .wait_status("first sync", SYNC, |s| s["counts"]["Synced"] == 20)
        .await?;

    // Release 2 adds 200 objects; the agent is killed (SIGKILL) while it applies them, before it records
    // them in its inventory.
    fleet.write(
        "app/objects.yaml",
        &format!(
            "{}---\n{}",
            config_maps_yaml("default", "a", 20),
            config_maps_yaml("default", "b", 200)
        ),
    )?;
    publisher.publish(&fleet, "stable")?;
    wait_exists(&kube, "b-0").await?;
    agent.process.kill();
    let applied = config_map_names(&kube, "default", "b-").await?;
    let recorded = inventory(&kube).await?;
    println!(
        "killed with {} of 200 new objects applied and {} objects in the persisted inventory",
        applied.len(),
        recorded.len()
    );
    assert_eq!(
        recorded.len(),
        20,
        "the kill landed before the inventory was saved: {recorded:?}"
    );

    // While it is down, release 3 drops every object of release 2 and half of release 1.
    let mut objects = (10..20)
        .map(|i| format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: a-{i}, namespace: default}}\ndata: {{i: '{i}'}}\n"))
        .collect::<Vec<_>>();
    objects.push(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c-0, namespace: default}\ndata: {c: d}\n"
            .to_owned(),
    );
    fleet.write("app/objects.yaml", &objects.join("---\n"))?;
    publisher.publish(&fleet, "stable")?;

    // Restarted, it finds its last known good (release 2) and its inventory in the state Secrets, finishes
    // release 2, then takes release 3 and prunes everything that left, including what it applied before the
    // kill without recording it.
    agent = Agent::start(&kube, &options).await?;
    agent
        .wait_status("serial 3 synced", RECOVER, |s| {
            s["state"] == "Synced"
                && s["source"]["appliedSerial"] == 3
                && s["counts"]["Synced"] == 11
                && s["lastError"].is_null()
        })
        .await?;
    wait_for("release 2's objects pruned", SYNC, || async {
        Ok((config_map_names(&kube, "default", "b-").await?.is_empty()
            && config_map_names(&kube, "default", "a-").await? == names("a", 10..20))
        .then_some(()))
    })
    .await?;
    assert!(config_map(&kube, "default", "c-0").await?.is_some());
    let mut expected: BTreeSet<String> = names("a", 10..20)
        .into_iter()
        .map(|n| format!("ConfigMap default/{n}"))
        .collect();
    expected.insert("ConfigMap default/c-0".to_owned());
    assert_eq!(inventory(&kube).await?, expected);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_and_an_immutable_field_fail_clearly_and_the_rest_applies() -> anyhow::Result<()>
{
    const DEPLOYMENT: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: default}\nspec:\n  replicas: 1\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec: {containers: [{name: web, image: registry.example.com/web:1.0}]}\n";
    let cm = config_map_with_x;
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(33)?;
    let fleet = tree(&[DEPLOYMENT.to_owned(), cm("a", "", "1"), cm("b", "", "1")].join("---\n"))?;
    publisher.publish(&fleet, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let agent = Agent::start(
        &kube,
        &AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1"),
    )
    .await?;
    agent
        .wait_status("synced", SYNC, |s| {
            s["state"] == "Synced" && s["counts"]["Synced"] == 3
        })
        .await?;
    let deployments = Api::<Deployment>::namespaced(kube.client(), "default");
    let uid = deployments.get("web").await?.metadata.uid;

    // Release 2: the Deployment's selector changes (immutable); `b` carries a stale resourceVersion, as a
    // manifest exported with `kubectl get -o yaml` does (the API server answers 409 Conflict every time);
    // `a` changes and `c` is new.
    fleet.write(
        "app/objects.yaml",
        &[
            DEPLOYMENT.replace("app: web", "app: web2"),
            cm("a", "", "2"),
            cm("b", ", resourceVersion: '1'", "2"),
            cm("c", "", "1"),
        ]
        .join("---\n"),
    )?;
    publisher.publish(&fleet, "stable")?;
    let status = agent
        .wait_status("two failures, two applied", SYNC, |s| {
            s["source"]["appliedSerial"] == 2
                && s["counts"]["Failed"] == 2
                && s["counts"]["Synced"] == 2
        })
        .await?;
    let message = |object: &str| {
        status["objects"]
            .as_array()
            .and_then(|o| o.iter().find(|x| x["object"] == object))
            .map(|x| (x["state"].clone(), x["message"].to_string()))
            .unwrap_or_default()
    };
    let (state, text) = message("Deployment default/web");
    assert_eq!(state, "Failed", "{status}");
    assert!(text.contains("immutable"), "{text}");
    let (state, text) = message("ConfigMap default/b");
    assert_eq!(state, "Failed", "{status}");
    assert!(
        text.contains("409") && text.contains("modified"),
        "the API server's conflict: {text}"
    );
    assert_eq!(message("ConfigMap default/a").0, "Synced");
    assert_eq!(message("ConfigMap default/c").0, "Synced");
    assert_eq!(status["state"], "Failed");
    // The log names the failing object with the API server's words.
    let log = plain(&agent.process.log());
    assert!(
        log.lines().any(|l| l.contains("apply failed")
            && l.contains("ConfigMap default/b")
            && l.contains("409")),
        "{}",
        tail(&log, 40)
    );
    // What failed is left as it was (not deleted, not recreated); the rest is applied; nothing is pruned.
    let web = deployments.get("web").await?;
    assert_eq!(web.metadata.uid, uid);
    assert_eq!(
        web.spec
            .selector
            .match_labels
            .and_then(|l| l.get("app").cloned())
            .as_deref(),
        Some("web")
    );
    assert_eq!(
        data(config_map(&kube, "default", "b").await?.as_ref(), "x"),
        Some("1")
    );
    wait_config_map(&kube, "default", "a", |cm| data(cm, "x") == Some("2")).await?;
    assert!(config_map(&kube, "default", "c").await?.is_some());
    assert_eq!(inventory(&kube).await?.len(), 4);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finalizer_blocks_a_prune_and_the_survivor_stays_in_the_inventory_until_it_goes()
-> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(34)?;
    let fleet = tree(&config_maps_yaml("default", "f", 3))?;
    publisher.publish(&fleet, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let mut options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1");
    options.extra = vec!["--prune-budget".into(), "1".into()];
    let agent = Agent::start(&kube, &options).await?;
    agent
        .wait_status("synced", SYNC, |s| s["counts"]["Synced"] == 3)
        .await?;
    // Another controller puts a finalizer on f-1.
    let config_maps = Api::<ConfigMap>::namespaced(kube.client(), "default");
    let finalizer = |finalizers: Value| {
        let config_maps = &config_maps;
        async move {
            config_maps
                .patch(
                    "f-1",
                    &PatchParams {
                        field_manager: Some("example-controller".into()),
                        ..PatchParams::default()
                    },
                    &Patch::Merge(json!({"metadata": {"finalizers": finalizers}})),
                )
                .await
        }
    };
    finalizer(json!(["example.com/block"])).await?;

    // Release 2 keeps only f-0: f-2 goes; f-1 is marked for deletion but stays, blocked by the finalizer.
    fleet.write("app/objects.yaml", &config_maps_yaml("default", "f", 1))?;
    publisher.publish(&fleet, "stable")?;
    wait_config_map(&kube, "default", "f-2", |cm| cm.is_none()).await?;
    let status = agent
        .wait_status("the blocked prune reported", SYNC, |s| {
            s["source"]["appliedSerial"] == 2
                && s["lastError"].as_str().is_some_and(|e| {
                    e.contains("ConfigMap default/f-1") && e.contains("example.com/block")
                })
        })
        .await?;
    println!("blocked prune: {}", status["lastError"]);
    let survivor = config_map(&kube, "default", "f-1")
        .await?
        .expect("the finalizer keeps f-1");
    assert!(survivor.metadata.deletion_timestamp.is_some());
    let expected: BTreeSet<String> = ["ConfigMap default/f-0", "ConfigMap default/f-1"]
        .map(String::from)
        .into();
    // It stays in the inventory while it exists, and the agent keeps checking it.
    holds_for(Duration::from_secs(5), async || {
        Ok(inventory(&kube).await? == expected)
    })
    .await?;
    wait_for("the prune retried", SYNC, || async {
        let log = agent.process.log();
        Ok((plain(&log).matches("prune pending").count() >= 2).then_some(()))
    })
    .await?;

    // The finalizer is removed: the object goes, and leaves the inventory and the report.
    finalizer(Value::Null).await?;
    wait_config_map(&kube, "default", "f-1", |cm| cm.is_none()).await?;
    agent
        .wait_status("report cleared", SYNC, |s| {
            s["lastError"].is_null() && s["state"] == "Synced"
        })
        .await?;
    wait_for("inventory without f-1", SYNC, || async {
        Ok((inventory(&kube).await?.len() == 1).then_some(()))
    })
    .await?;
    Ok(())
}

fn widgets_yaml(range: std::ops::Range<usize>) -> String {
    range
        .map(|i| format!("apiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: w-{i}, namespace: default}}\nspec: {{size: 3}}\n"))
        .collect::<Vec<_>>()
        .join("---\n")
}

fn widgets(kube: &LocalKube) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget"));
    Api::namespaced_with(kube.client(), "default", &resource)
}

/// Each Widget's resourceVersion.
async fn widget_versions(kube: &LocalKube) -> anyhow::Result<BTreeMap<String, String>> {
    Ok(widgets(kube)
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter_map(|w| Some((w.metadata.name?, w.metadata.resource_version?)))
        .collect())
}

fn drift_count(status: &Value, name: &str) -> usize {
    status["drift"]
        .as_array()
        .map_or(0, |d| d.iter().filter(|r| r["name"] == name).count())
}

/// A TCP proxy in front of the API server through which the agent talks to it. `cut` closes every open
/// connection and refuses new ones until `resume`: the agent is blind (its watches drop and cannot resume)
/// while the cluster goes on. TLS passes through untouched (the serving certificate names 127.0.0.1, whatever
/// the port).
struct CutProxy {
    addr: SocketAddr,
    cut: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl CutProxy {
    async fn start(upstream: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (cut, _) = tokio::sync::watch::channel(false);
        let state = cut.clone();
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let mut client = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((client, _)) => client,
                        Err(_) => continue,
                    },
                    Some(_) = connections.join_next(), if !connections.is_empty() => continue,
                };
                if *state.borrow() {
                    continue;
                }
                let mut cut = state.subscribe();
                connections.spawn(async move {
                    let Ok(mut server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Ok(Self { addr, cut, task })
    }

    fn cut(&self) {
        self.cut.send_replace(true);
    }

    fn resume(&self) {
        self.cut.send_replace(false);
    }

    /// A copy of `kube`'s admin kubeconfig that points at this proxy.
    fn kubeconfig(&self, kube: &LocalKube) -> anyhow::Result<PathBuf> {
        let text = std::fs::read_to_string(kube.kubeconfig_path())?;
        anyhow::ensure!(
            text.contains(kube.server_url()),
            "no server URL in the kubeconfig"
        );
        let path = kube.data_dir().join("through-proxy.kubeconfig");
        std::fs::write(
            &path,
            text.replace(kube.server_url(), &format!("https://{}", self.addr)),
        )?;
        Ok(path)
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// True once a watch of Widgets from `resource_version` is answered `410 Gone`.
async fn expired(kube: &LocalKube, resource_version: &str) -> anyhow::Result<bool> {
    let stream = widgets(kube)
        .watch(&WatchParams::default().timeout(2), resource_version)
        .await?;
    let mut stream = std::pin::pin!(stream);
    Ok(matches!(
        stream.next().await,
        Some(Ok(WatchEvent::Error(status))) if status.code == 410
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_watch_relists_without_repeating_writes_or_deletes() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let proxy = CutProxy::start(kube.server_url().trim_start_matches("https://").parse()?).await?;
    let publisher = Publisher::new(36)?;
    let fleet = tree(&format!("{WIDGET_CRD}---\n{}", widgets_yaml(0..4)))?;
    publisher.publish(&fleet, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let mut options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1");
    options.kubeconfig = Some(proxy.kubeconfig(&kube)?);
    let mut agent = Agent::start(&kube, &options).await?;
    agent
        .wait_status("synced", SYNC, |s| {
            s["state"] == "Synced" && s["counts"]["Synced"] == 5
        })
        .await?;
    // One prune before the fault, so that a relist that repeated destructive actions would show.
    fleet.write(
        "app/objects.yaml",
        &format!("{WIDGET_CRD}---\n{}", widgets_yaml(0..3)),
    )?;
    publisher.publish(&fleet, "stable")?;
    wait_for("w-3 pruned", SYNC, || async {
        Ok((!widget_versions(&kube).await?.contains_key("w-3")).then_some(()))
    })
    .await?;
    agent
        .wait_status("synced on serial 2", SYNC, |s| {
            s["source"]["appliedSerial"] == 2 && s["state"] == "Synced"
        })
        .await?;
    let before = widget_versions(&kube).await?;
    let pruned = pruned_count(&agent.process.log());
    assert_eq!(pruned, 1);
    let seen = widgets(&kube)
        .list_metadata(&Default::default())
        .await?
        .metadata
        .resource_version
        .context("a list has a resourceVersion")?;

    // The agent goes blind. Meanwhile another manager changes the WIDGET_CRD's spec (a short name, a field Windvane
    // does not own), so the API server rebuilds the Widgets' storage and watch cache; w-0 is deleted and w-1
    // edited.
    proxy.cut();
    let cut_at = Instant::now();
    Api::<CustomResourceDefinition>::all(kube.client())
        .patch(
            "widgets.example.com",
            &PatchParams {
                field_manager: Some("example-operator".into()),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({"spec": {"names": {"shortNames": ["wd"]}}})),
        )
        .await?;
    widgets(&kube)
        .delete("w-0", &DeleteParams::default())
        .await?;
    widgets(&kube)
        .patch(
            "w-1",
            &PatchParams {
                field_manager: Some("kubectl-edit".into()),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({"spec": {"size": 99}})),
        )
        .await?;
    // A watch resumed from what the agent last saw is now answered 410 Gone (too old resource version).
    wait_for(
        "the new watch cache to expire old watches",
        SYNC,
        || async { Ok(expired(&kube, &seen).await?.then_some(())) },
    )
    .await?;
    proxy.resume();
    let blind_for = cut_at.elapsed();

    // The agent's watch resumes, gets 410, relists, and repairs what changed while it was blind, once each.
    wait_for("the agent's watch to expire (410)", SYNC, || async {
        Ok(plain(&agent.process.log())
            .contains("too old resource version")
            .then_some(()))
    })
    .await
    .with_context(|| tail(&agent.process.log(), 40))?;
    wait_for("w-0 recreated and w-1 reverted", SYNC, || async {
        let w0 = widgets(&kube).get_opt("w-0").await?;
        let w1 = widgets(&kube).get("w-1").await?;
        Ok((w0.is_some() && w1.data["spec"]["size"] == 3).then_some(()))
    })
    .await?;
    let status = agent
        .wait_status("repairs recorded", SYNC, |s| {
            drift_count(s, "w-0") == 1 && drift_count(s, "w-1") == 1
        })
        .await?;
    assert!(
        agent.process.is_running(),
        "the agent relisted in place, it did not restart"
    );

    // Nothing is written or deleted again: the repaired objects stay as they are, the untouched one was never
    // rewritten, the pruned one stays gone, nothing else is pruned.
    let repaired = widget_versions(&kube).await?;
    assert_eq!(repaired.get("w-2"), before.get("w-2"), "w-2 rewritten");
    assert!(!repaired.contains_key("w-3"));
    holds_for(Duration::from_secs(10), async || {
        Ok(widget_versions(&kube).await? == repaired)
    })
    .await?;
    let after = agent.status().await?;
    assert_eq!(drift_count(&after, "w-0"), 1, "{after}");
    assert_eq!(drift_count(&after, "w-1"), 1, "{after}");
    assert_eq!(drift_count(&after, "w-2"), 0, "{status}");
    assert_eq!(pruned_count(&agent.process.log()), pruned);
    println!(
        "agent blind for {} ms; its watch expired (410), relisted, and repaired w-0 and w-1 once each",
        blind_for.as_millis()
    );
    Ok(())
}

/// The Lease's holder and transition count.
async fn lease(kube: &LocalKube) -> anyhow::Result<(Option<String>, i32)> {
    let spec = lease_spec(kube).await?;
    Ok((spec.holder_identity, spec.lease_transitions.unwrap_or(0)))
}

async fn lease_spec(kube: &LocalKube) -> anyhow::Result<LeaseSpec> {
    Ok(Api::<Lease>::namespaced(kube.client(), AGENT_NAMESPACE)
        .get("windvane-agent")
        .await?
        .spec
        .unwrap_or_default())
}

/// Every ConfigMap's resourceVersion: it changes whenever anyone writes the object.
async fn versions(kube: &LocalKube, prefix: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let list = Api::<ConfigMap>::namespaced(kube.client(), "default")
        .list_metadata(&Default::default())
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|cm| Some((cm.metadata.name?, cm.metadata.resource_version?)))
        .filter(|(name, _)| name.starts_with(prefix))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_takes_over_within_the_lease_duration_without_rewrites_or_flapping()
-> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(35)?;
    publisher.publish(&tree(&config_maps_yaml("default", "l", 5))?, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let mut first_options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1");
    first_options.identity = "replica-a".into();
    let mut second_options = first_options.clone();
    second_options.identity = "replica-b".into();
    let mut first = Agent::start(&kube, &first_options).await?;
    first
        .wait_status("leader synced", SYNC, |s| {
            s["state"] == "Synced" && s["counts"]["Synced"] == 5
        })
        .await?;
    let second = Agent::start(&kube, &second_options).await?;
    wait_for("standby announced", SYNC, || async {
        Ok(second.process.log().contains("standing by").then_some(()))
    })
    .await?;
    let (holder, transitions) = lease(&kube).await?;
    assert_eq!(holder.as_deref(), Some("replica-a"));
    let before = versions(&kube, "l-").await?;
    assert_eq!(before.len(), 5);

    first.process.kill();
    let killed_at = Instant::now();
    // replica-a renews no more: its last renewal is what the Lease says now.
    let last_renewal = lease_spec(&kube)
        .await?
        .renew_time
        .context("a held Lease has a renewTime")?
        .0;
    wait_for(
        "replica-b holds the Lease",
        Duration::from_secs(60),
        || async { Ok((lease(&kube).await?.0.as_deref() == Some("replica-b")).then_some(())) },
    )
    .await?;
    let took = killed_at.elapsed();
    let acquired = lease_spec(&kube)
        .await?
        .acquire_time
        .context("a held Lease has an acquireTime")?
        .0;
    let expired_for = acquired.duration_since(last_renewal);
    second
        .wait_status("the new leader enforces", SYNC, |s| {
            s["enforced"] == true && s["state"] == "Synced" && s["counts"]["Synced"] == 5
        })
        .await?;
    println!(
        "takeover {:.1} s after the leader was killed, {:.1} s after its last renewal (lease 15 s, renewed every \
         5 s, candidates retry every 2 s)",
        took.as_secs_f64(),
        expired_for.as_secs_f64()
    );
    // Never before the lease duration has passed since the holder's last renewal, and soon after it: a
    // candidate looks every 2 s; the margin is for a loaded machine.
    assert!(
        expired_for > jiff::SignedDuration::from_secs(15),
        "took a Lease still valid: {expired_for:?}"
    );
    assert!(
        expired_for <= jiff::SignedDuration::from_secs(15 + 2 + 5),
        "takeover {expired_for:?} after the last renewal"
    );

    // No flapping: the Lease stays with replica-b (one transition) and nothing is written again by the new
    // leader: every object it found intact keeps its resourceVersion.
    holds_for(Duration::from_secs(20), async || {
        let (holder, now) = lease(&kube).await?;
        Ok(holder.as_deref() == Some("replica-b") && now == transitions + 1)
    })
    .await?;
    let renewed = lease_spec(&kube).await?.renew_time.map(|t| t.0);
    assert!(
        renewed.is_some_and(|r| r > acquired),
        "the new leader renews its Lease"
    );
    assert_eq!(
        versions(&kube, "l-").await?,
        before,
        "objects rewritten by the handover"
    );
    Ok(())
}

/// A ValidatingAdmissionPolicy (and its binding) that refuses every write of a Secret named
/// `windvane-release`: the agent's last-known-good release state.
fn release_state_refusal() -> (Value, Value) {
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "refuse-release-state"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"], "resources": ["secrets"],
            }]},
            "validations": [{
                "expression": "object.metadata.name != 'windvane-release'",
                "message": "release state writes refused by the test",
            }],
        },
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "refuse-release-state"},
        "spec": {"policyName": "refuse-release-state", "validationActions": ["Deny"]},
    });
    (policy, binding)
}

/// How many times the agent has logged that it could not persist a new release.
fn persist_refusals(agent: &Agent) -> usize {
    plain(&agent.process.log())
        .lines()
        .filter(|l| l.contains("cannot persist the new release"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_cannot_be_persisted_as_last_known_good_is_not_applied() -> anyhow::Result<()>
{
    let cm = |name: &str, x: &str| config_map_with_x(name, "", x);
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(34)?;
    let fleet = tree(&cm("a", "1"))?;
    publisher.publish(&fleet, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let agent = Agent::start(
        &kube,
        &AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1"),
    )
    .await?;
    agent
        .wait_status("release 1 synced", SYNC, |s| {
            s["state"] == "Synced" && s["source"]["appliedSerial"] == 1
        })
        .await?;

    // The API server now refuses every write of the release state; a probe Secret of that name elsewhere
    // shows when the policy is in force (admission policies take effect asynchronously).
    let (policy, binding) = release_state_refusal();
    let apply = PatchParams::apply("test").force();
    kube.admission_api("ValidatingAdmissionPolicy")
        .patch("refuse-release-state", &apply, &Patch::Apply(&policy))
        .await?;
    kube.admission_api("ValidatingAdmissionPolicyBinding")
        .patch("refuse-release-state", &apply, &Patch::Apply(&binding))
        .await?;
    let probes = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(kube.client(), "default");
    let probe: k8s_openapi::api::core::v1::Secret =
        serde_json::from_value(json!({"metadata": {"name": "windvane-release"}}))?;
    wait_for("the refusal in force", SYNC, || async {
        Ok(probes
            .patch("windvane-release", &apply, &Patch::Apply(&probe))
            .await
            .is_err()
            .then_some(()))
    })
    .await?;

    // Release 2 changes `a` and adds `b`. The agent fetches and verifies it, but cannot persist it: nothing
    // of it may be applied. Two refusals logged means the first attempt, and anything it could have done
    // after, is over.
    fleet.write(
        "app/objects.yaml",
        &[cm("a", "2"), cm("b", "1")].join("---\n"),
    )?;
    publisher.publish(&fleet, "stable")?;
    wait_for("two refused persists", SYNC, || async {
        Ok((persist_refusals(&agent) >= 2).then_some(()))
    })
    .await?;
    assert_eq!(
        data(config_map(&kube, "default", "a").await?.as_ref(), "x"),
        Some("1")
    );
    assert!(config_map(&kube, "default", "b").await?.is_none());
    let status = agent.status().await?;
    assert_eq!(status["source"]["appliedSerial"], 1, "{status}");
    assert!(status["source"]["staleSince"].is_string(), "{status}");
    assert!(
        status["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("windvane-release") && e.contains("refused by the test")),
        "the error names the state object and the API server's reason: {status}"
    );

    // Writable again: the next poll persists release 2 and applies it.
    kube.admission_api("ValidatingAdmissionPolicyBinding")
        .delete("refuse-release-state", &DeleteParams::default())
        .await?;
    agent
        .wait_status("release 2 synced", SYNC, |s| {
            s["state"] == "Synced" && s["source"]["appliedSerial"] == 2
        })
        .await?;
    wait_config_map(&kube, "default", "a", |cm| data(cm, "x") == Some("2")).await?;
    assert!(config_map(&kube, "default", "b").await?.is_some());
    Ok(())
}
