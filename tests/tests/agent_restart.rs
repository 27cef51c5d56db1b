//! The agent starting over a cluster it already manages — a restart, or a standby replica taking over from
//! a leader that died — against a real control plane (localkube): with nothing changed, its first sync
//! writes nothing, because it waits for its watches to list the managed objects and leaves those found
//! intact alone; an object whose Windvane-owned fields someone took while no agent ran is written again.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use windvane_tests::fleet::{Agent, AgentOptions, FleetTree, Publisher};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::store_server::StoreServer;

/// Generous: the machine running the tests may be loaded, and a failover waits out a 15 s Lease.
const SYNC: Duration = Duration::from_secs(120);

/// Objects of the release: a Namespace, four ConfigMaps and a Deployment.
const OBJECTS: usize = 6;

fn fleet_tree() -> anyhow::Result<FleetTree> {
    let tree = FleetTree::new()?;
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: app\n    path: app\n",
    )?;
    let mut manifests = "apiVersion: v1\nkind: Namespace\nmetadata: {name: calm}\n".to_owned();
    for index in 0..4 {
        manifests.push_str(&format!(
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: settings-{index}, namespace: calm}}\n\
             data: {{mode: strict, cluster: '${{cluster.name}}'}}\n"
        ));
    }
    manifests.push_str(
        "---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: calm}\nspec:\n  \
         replicas: 1\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    \
         spec:\n      containers: [{name: web, image: registry.example.com/web:1.0}]\n",
    );
    tree.write("app/objects.yaml", &manifests)?;
    Ok(tree)
}

/// The agent's `windvane_apply_total` for `result`, 0 when it has none.
fn applies(metrics: &str, result: &str) -> u64 {
    let prefix = format!("windvane_apply_total{{result=\"{result}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits until `agent`'s first sync finished and every object is Synced; returns its metrics then.
async fn first_sync(agent: &Agent, what: &str) -> anyhow::Result<String> {
    agent
        .wait_status(what, SYNC, |s| {
            s["state"] == "Synced" && s["counts"]["Synced"] == OBJECTS
        })
        .await?;
    wait_for(&format!("{what}: the first sync counted"), SYNC, || async {
        let metrics = agent.metrics().await?;
        Ok(metrics
            .contains("windvane_sync_duration_seconds_count 1\n")
            .then_some(metrics))
    })
    .await
}

async fn mode(kube: &LocalKube) -> anyhow::Result<Option<String>> {
    let cm = Api::<ConfigMap>::namespaced(kube.client(), "calm")
        .get("settings-1")
        .await?;
    Ok(cm.data.and_then(|d| d.get("mode").cloned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_and_failovers_write_only_what_changed() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(21)?;
    publisher.publish(&fleet_tree()?, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1");

    let agent = Agent::start(&kube, &options).await?;
    let metrics = first_sync(&agent, "first start").await?;
    assert_eq!(applies(&metrics, "written"), OBJECTS as u64, "{metrics}");

    // A restart with nothing changed: every object is found intact.
    drop(agent);
    let agent = Agent::start(&kube, &options).await?;
    let metrics = first_sync(&agent, "restart").await?;
    assert_eq!(
        (applies(&metrics, "written"), applies(&metrics, "unchanged")),
        (0, OBJECTS as u64),
        "a restart with nothing changed writes nothing: {metrics}"
    );

    // While no agent runs, someone takes a field Windvane owns: that object alone is written again.
    drop(agent);
    Api::<ConfigMap>::namespaced(kube.client(), "calm")
        .patch(
            "settings-1",
            &PatchParams {
                field_manager: Some("someone".to_owned()),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({"data": {"mode": "lenient"}})),
        )
        .await?;
    let agent = Agent::start(&kube, &options).await?;
    let metrics = first_sync(&agent, "restart after a change").await?;
    assert_eq!(
        (applies(&metrics, "written"), applies(&metrics, "unchanged")),
        (1, OBJECTS as u64 - 1),
        "only the changed object is written: {metrics}"
    );
    assert_eq!(mode(&kube).await?.as_deref(), Some("strict"));

    // A failover: a standby replica takes over once the leader is gone, and writes nothing.
    let mut standby_options = options.clone();
    standby_options.identity = "c1-standby".to_owned();
    let standby = Agent::start(&kube, &standby_options).await?;
    drop(agent);
    let metrics = first_sync(&standby, "failover").await?;
    assert_eq!(
        (applies(&metrics, "written"), applies(&metrics, "unchanged")),
        (0, OBJECTS as u64),
        "a failover with nothing changed writes nothing: {metrics}"
    );
    // Drift is still healed by the new leader: its baseline is what it found.
    Api::<ConfigMap>::namespaced(kube.client(), "calm")
        .patch(
            "settings-1",
            &PatchParams {
                field_manager: Some("someone".to_owned()),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({"data": {"mode": "lenient"}})),
        )
        .await?;
    wait_for("drift reverted by the new leader", SYNC, || async {
        Ok((mode(&kube).await?.as_deref() == Some("strict")).then_some(()))
    })
    .await?;
    Ok(())
}

/// The Secrets of the agent's state blob `release` in `namespace`, by name.
/// Creates the namespace the state tests keep their Secrets in, and names it.
async fn state_namespace(kube: &LocalKube) -> anyhow::Result<&'static str> {
    let namespace = "windvane-state";
    Api::<k8s_openapi::api::core::v1::Namespace>::all(kube.client())
        .patch(
            namespace,
            &PatchParams::apply("test"),
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
            ),
        )
        .await?;
    Ok(namespace)
}

async fn release_secrets(kube: &LocalKube, namespace: &str) -> anyhow::Result<Vec<String>> {
    let secrets = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(kube.client(), namespace);
    let listed = secrets
        .list_metadata(
            &kube::api::ListParams::default().labels("windvane.io/state=windvane-release"),
        )
        .await?;
    let mut names: Vec<String> = listed
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect();
    names.sort();
    Ok(names)
}

/// Bytes that do not compress: a release this size needs several chunk Secrets.
fn incompressible(seed: u8, len: usize) -> Vec<u8> {
    let mut state = u64::from(seed) + 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()[0]
        })
        .collect()
}

/// The state store keeps a release too big for one Secret in chunks, and the garbage collection after a
/// later save removes the chunks of the one before (it lists them from the API server's cache, so a chunk
/// that list misses goes with the next save's): the Secrets end up exactly the index and the chunks it
/// names, and the release reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_saves_leave_only_the_chunks_in_use() -> anyhow::Result<()> {
    use windvane_agent::kube::state::{KnownGood, StateStore};
    let kube = LocalKube::start().await?;
    let namespace = state_namespace(&kube).await?;
    let store = StateStore::new(kube.client(), namespace, "windvane");
    let release = |seed: u8, len: usize| KnownGood {
        pointer: vec![seed; 16],
        bundle: incompressible(seed, len),
    };

    let first = release(1, 2_000_000);
    store.save_known_good(&first).await?;
    store.collect_garbage().await?;
    let first_secrets = release_secrets(&kube, namespace).await?;
    assert!(
        first_secrets.len() >= 3,
        "a 2 MB release is kept in an index and chunks: {first_secrets:?}"
    );
    assert_eq!(store.load_known_good().await?, Some(first));

    let second = release(2, 1_500_000);
    let only_second = wait_for("only the second release's Secrets", SYNC, || async {
        store.save_known_good(&second).await?;
        store.collect_garbage().await?;
        let names = release_secrets(&kube, namespace).await?;
        let stale = names
            .iter()
            .any(|n| first_secrets.contains(n) && n != "windvane-release");
        Ok((!stale).then_some(names))
    })
    .await?;
    assert!(only_second.len() >= 3, "{only_second:?}");
    assert_eq!(store.load_known_good().await?, Some(second));

    let small = release(3, 1_000);
    wait_for("only the index, the release inline", SYNC, || async {
        store.save_known_good(&small).await?;
        store.collect_garbage().await?;
        let names = release_secrets(&kube, namespace).await?;
        Ok((names == ["windvane-release"]).then_some(()))
    })
    .await?;
    assert_eq!(store.load_known_good().await?, Some(small));
    Ok(())
}

/// The state store replaces a Secret it knows and creates one it does not; when the cluster disagrees — the
/// Secret was deleted behind the store's back, or a store that never read it (a new leader) writes over it —
/// the other request follows and the save lands all the same.
#[tokio::test]
async fn state_saves_land_whatever_the_store_believes_exists() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Secret;
    use windvane_agent::kube::state::{KnownGood, StateStore};
    let kube = LocalKube::start().await?;
    let namespace = state_namespace(&kube).await?;
    let release = |seed: u8| KnownGood {
        pointer: vec![seed; 16],
        bundle: incompressible(seed, 1_000),
    };
    let store = StateStore::new(kube.client(), namespace, "windvane");
    store.save_known_good(&release(1)).await?;
    assert_eq!(store.load_known_good().await?, Some(release(1)));

    let newcomer = StateStore::new(kube.client(), namespace, "windvane");
    newcomer.save_known_good(&release(2)).await?;
    assert_eq!(store.load_known_good().await?, Some(release(2)));

    Api::<Secret>::namespaced(kube.client(), namespace)
        .delete("windvane-release", &Default::default())
        .await?;
    store.save_known_good(&release(3)).await?;
    assert_eq!(newcomer.load_known_good().await?, Some(release(3)));
    assert_eq!(
        release_secrets(&kube, namespace).await?,
        ["windvane-release"]
    );
    Ok(())
}
