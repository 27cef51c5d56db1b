//! The agent's sync engine against a real control plane (localkube): first sync of a release with a WIDGET_CRD and
//! its custom resources, a Namespace, a Deployment and ConfigMaps; changes, pruning, orphans, relabelling;
//! refused releases (tampered, badly signed, rolled back, another fleet's, expired) that leave the last known
//! good enforced; a source that is down at start; objects that fail without blocking the rest; two agents
//! electing one leader; and a kind discovered with one request when many objects use it first at once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

mod fault_support;

use fault_support::{SYNC, WIDGET_CRD, config_map, data, wait_config_map};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::Value;
use windvane_tests::fleet::{Agent, AgentOptions, FleetTree, Publisher, object_state};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::store_server::StoreServer;

const FLEET_YAML: &str = "\
fleet: acme
apps:
  - name: widgets
    path: apps/widgets
    selector: {matchLabels: {env: prod}}
    values: {greeting: hello, replicas: 2}
    policy: {prune: true}
  - name: keep
    path: apps/keep
    policy: {prune: false}
";

const WORKLOAD: &str = "\
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  replicas: ${values.replicas}
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: registry.example.com/web:1.0}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: greeting, namespace: shop}
data: {message: '${values.greeting} from ${cluster.name}'}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: extra, namespace: shop}
data: {a: b}
---
apiVersion: example.com/v1
kind: Widget
metadata: {name: gizmo, namespace: shop}
spec: {size: 3}
";

const KEEP: &str = "\
apiVersion: v1
kind: ConfigMap
metadata: {name: kept, namespace: default}
data: {k: v}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: kept-2, namespace: default}
data: {k: v}
";

fn fleet_tree() -> anyhow::Result<FleetTree> {
    let tree = FleetTree::new()?;
    tree.write("fleet.yaml", FLEET_YAML)?;
    tree.write("apps/widgets/crd.yaml", WIDGET_CRD)?;
    tree.write("apps/widgets/workload.yaml", WORKLOAD)?;
    tree.write("apps/keep/configmaps.yaml", KEEP)?;
    Ok(tree)
}

fn refusal(status: &Value) -> Option<&str> {
    status["source"]["lastRefusal"]["reason"].as_str()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_sync_changes_prune_orphans_and_relabelling() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(1)?;
    let tree = fleet_tree()?;
    publisher.publish(&tree, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;

    let mut options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "prod-eu");
    options.labels = vec!["env=prod".into()];
    let agent = Agent::start(&kube, &options).await?;

    // First sync: everything present, the Deployment available, the cluster Synced.
    let status = agent
        .wait_status("first sync Synced", SYNC, |s| {
            s["state"] == "Synced" && s["counts"]["Synced"] == 8
        })
        .await?;
    assert_eq!(status["source"]["appliedSerial"], 1);
    let deployment = Api::<Deployment>::namespaced(kube.client(), "shop")
        .get("web")
        .await?;
    assert_eq!(
        deployment.status.and_then(|s| s.available_replicas),
        Some(2)
    );
    assert_eq!(
        data(
            config_map(&kube, "shop", "greeting").await?.as_ref(),
            "message"
        ),
        Some("hello from prod-eu")
    );
    let widgets = ApiResource::from_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget"));
    let gizmo = Api::<DynamicObject>::namespaced_with(kube.client(), "shop", &widgets)
        .get("gizmo")
        .await?;
    assert_eq!(gizmo.data["spec"]["size"], 3);
    let labels = gizmo.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels.get("windvane.io/app").map(String::as_str),
        Some("widgets")
    );
    assert_eq!(
        labels
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("windvane")
    );
    assert_eq!(agent.readyz().await?, 200);
    let metrics = agent.metrics().await?;
    assert!(metrics.contains("windvane_release_serial 1"), "{metrics}");
    assert!(
        metrics.contains("windvane_objects{state=\"Synced\"} 8"),
        "{metrics}"
    );

    // A new serial changes a value and removes one object from each app.
    tree.write(
        "fleet.yaml",
        &FLEET_YAML.replace("greeting: hello", "greeting: bonjour"),
    )?;
    tree.write("apps/widgets/workload.yaml", &WORKLOAD.replace("---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: extra, namespace: shop}\ndata: {a: b}\n", ""))?;
    tree.write(
        "apps/keep/configmaps.yaml",
        KEEP.split("---").next().unwrap_or_default(),
    )?;
    publisher.publish(&tree, "stable")?;
    wait_config_map(&kube, "shop", "greeting", |cm| {
        data(cm, "message") == Some("bonjour from prod-eu")
    })
    .await?;
    // prune on: deleted; prune off: kept and reported as an orphan.
    wait_config_map(&kube, "shop", "extra", |cm| cm.is_none()).await?;
    let status = agent
        .wait_status("orphan reported", SYNC, |s| {
            s["orphans"]
                .as_array()
                .is_some_and(|o| o.iter().any(|x| x == "ConfigMap default/kept-2"))
        })
        .await?;
    assert_eq!(status["source"]["appliedSerial"], 2);
    assert!(
        config_map(&kube, "default", "kept-2").await?.is_some(),
        "prune off keeps the object"
    );

    // The cluster's labels change so the widgets app no longer selects it: pruned like a removed app. The
    // budget must allow removing most of the inventory at once.
    drop(agent);
    options.labels = vec!["env=staging".into()];
    options.extra = vec!["--prune-budget".into(), "1".into()];
    let agent = Agent::start(&kube, &options).await?;
    wait_config_map(&kube, "shop", "greeting", |cm| cm.is_none()).await?;
    wait_for("Namespace shop deleted", SYNC, || async {
        let ns = Api::<Namespace>::all(kube.client()).get_opt("shop").await?;
        Ok(ns
            .is_none_or(|ns| ns.metadata.deletion_timestamp.is_some())
            .then_some(()))
    })
    .await?;
    assert!(
        config_map(&kube, "default", "kept").await?.is_some(),
        "the keep app still applies"
    );
    agent
        .wait_status("only keep left", SYNC, |s| {
            s["apps"]
                .as_array()
                .is_some_and(|a| a.len() == 1 && a[0]["name"] == "keep")
        })
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_releases_leave_the_last_known_good_enforced() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(2)?;
    let tree = FleetTree::new()?;
    let fleet = "fleet: acme\napps:\n  - name: app\n    path: app\n    values: {v: one}\n";
    tree.write("fleet.yaml", fleet)?;
    tree.write("app/cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: value, namespace: default}\ndata: {v: '${values.v}'}\n")?;
    publisher.publish(&tree, "stable")?;
    let good_pointer = std::fs::read(publisher.pointer_path("stable"))?;
    let mut server = StoreServer::start(publisher.store()).await?;
    let options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1");
    let agent = Agent::start(&kube, &options).await?;
    wait_config_map(&kube, "default", "value", |cm| data(cm, "v") == Some("one")).await?;
    agent
        .wait_status("synced", SYNC, |s| s["state"] == "Synced")
        .await?;

    tree.write("fleet.yaml", &fleet.replace("v: one", "v: two"))?;
    let expect_refusal = |reason: &'static str| {
        let agent = &agent;
        let kube = &kube;
        async move {
            let status = agent
                .wait_status(&format!("refusal {reason}"), SYNC, |s| {
                    refusal(s) == Some(reason)
                })
                .await?;
            assert_eq!(status["state"], "Failed", "a refusal is reported as Failed");
            assert_eq!(
                status["source"]["appliedSerial"], 1,
                "the last known good stays enforced"
            );
            assert_eq!(
                data(config_map(kube, "default", "value").await?.as_ref(), "v"),
                Some("one"),
                "nothing applied"
            );
            anyhow::Ok(())
        }
    };

    // Tampered bundle: a valid new pointer, but the bundle's bytes differ from its digest.
    let pointer = publisher.publish(&tree, "stable")?;
    let bundle_path = publisher
        .store()
        .join(format!("bundles/{}.json", pointer.bundle.sha256));
    let original_bundle = std::fs::read(&bundle_path)?;
    std::fs::write(
        &bundle_path,
        String::from_utf8(original_bundle.clone())?.replace("two", "tw0"),
    )?;
    expect_refusal("digest_mismatch").await?;
    std::fs::write(&bundle_path, &original_bundle)?;

    // Bad signature: the payload changed under a trusted key's signature.
    let signed = std::fs::read(publisher.pointer_path("stable"))?;
    let mut envelope: Value = serde_json::from_slice(&signed)?;
    use base64::Engine;
    let engine = base64::engine::general_purpose::STANDARD;
    let payload = engine.decode(envelope["payload"].as_str().unwrap_or_default())?;
    let forged = String::from_utf8(payload)?.replace("\"serial\":2", "\"serial\":9");
    envelope["payload"] = Value::String(engine.encode(forged));
    std::fs::write(
        publisher.pointer_path("stable"),
        serde_json::to_vec(&envelope)?,
    )?;
    expect_refusal("bad_signature").await?;

    // Rollback: serial 1 again after... serial 2 was never accepted, so accept it first, then roll back.
    std::fs::write(publisher.pointer_path("stable"), &signed)?;
    wait_config_map(&kube, "default", "value", |cm| data(cm, "v") == Some("two")).await?;
    tree.write("fleet.yaml", &fleet.replace("v: one", "v: three"))?;
    std::fs::write(publisher.pointer_path("stable"), &good_pointer)?;
    let status = agent
        .wait_status("refusal rollback", SYNC, |s| refusal(s) == Some("rollback"))
        .await?;
    assert_eq!(status["source"]["appliedSerial"], 2);
    assert_eq!(
        data(config_map(&kube, "default", "value").await?.as_ref(), "v"),
        Some("two")
    );

    // Another fleet's valid release, signed by the same key.
    let other = Publisher::new(2)?;
    let other_tree = FleetTree::new()?;
    other_tree.write(
        "fleet.yaml",
        &fleet
            .replace("fleet: acme", "fleet: other")
            .replace("v: one", "v: other"),
    )?;
    other_tree.write("app/cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: value, namespace: default}\ndata: {v: '${values.v}'}\n")?;
    for _ in 0..3 {
        other.publish(&other_tree, "stable")?;
    }
    std::fs::write(
        publisher.pointer_path("stable"),
        std::fs::read(other.pointer_path("stable"))?,
    )?;
    let status = agent
        .wait_status("refusal other_fleet", SYNC, |s| {
            refusal(s) == Some("other_fleet")
        })
        .await?;
    assert_eq!(status["source"]["appliedSerial"], 2);

    // Expired: a fresh, validly signed serial whose expiry has passed.
    std::fs::write(publisher.pointer_path("stable"), &signed)?;
    publisher.publish_with(&tree, "stable", Duration::from_millis(1), false)?;
    let status = agent
        .wait_status("refusal expired", SYNC, |s| refusal(s) == Some("expired"))
        .await?;
    assert_eq!(status["source"]["appliedSerial"], 2);
    assert_eq!(
        data(config_map(&kube, "default", "value").await?.as_ref(), "v"),
        Some("two")
    );

    // Source down when the agent starts: the last known good is read from the cluster, verified, enforced.
    drop(agent);
    server.stop();
    Api::<ConfigMap>::namespaced(kube.client(), "default")
        .delete("value", &DeleteParams::default())
        .await?;
    let agent = Agent::start(&kube, &options).await?;
    wait_config_map(&kube, "default", "value", |cm| data(cm, "v") == Some("two")).await?;
    let status = agent
        .wait_status("source reported stale", SYNC, |s| {
            s["source"]["staleSince"].is_string()
        })
        .await?;
    assert_eq!(status["source"]["appliedSerial"], 2);
    assert_eq!(
        agent.readyz().await?,
        200,
        "ready: the last known good is enforced"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_object_does_not_block_the_others() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(3)?;
    let tree = FleetTree::new()?;
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: app\n    path: app\n",
    )?;
    tree.write(
        "app/objects.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: fine, namespace: default}\ndata: {a: b}\n---\n\
         apiVersion: example.com/v1\nkind: Unheard\nmetadata: {name: ghost, namespace: default}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {name: broken, namespace: default}\nspec: {ports: [{port: 99999}]}\n---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata: {name: also-fine, namespace: default}\ndata: {c: d}\n",
    )?;
    publisher.publish(&tree, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let agent = Agent::start(
        &kube,
        &AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1"),
    )
    .await?;
    let status = agent
        .wait_status("two failed, two synced", SYNC, |s| {
            s["counts"]["Failed"] == 2 && s["counts"]["Synced"] == 2
        })
        .await?;
    assert_eq!(status["state"], "Failed");
    let message = |object: &str| {
        status["objects"]
            .as_array()
            .and_then(|o| o.iter().find(|x| x["object"] == object))
            .map(|x| x["message"].to_string())
            .unwrap_or_default()
    };
    assert!(
        message("Unheard default/ghost").contains("Unheard"),
        "{status}"
    );
    assert!(
        message("Service default/broken").contains("99999")
            || message("Service default/broken").contains("port"),
        "the API server's message: {status}"
    );
    assert_eq!(
        object_state(&status, "ConfigMap default/fine"),
        Some("Synced")
    );
    assert!(config_map(&kube, "default", "also-fine").await?.is_some());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_elect_one_leader_and_the_standby_takes_over() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(4)?;
    let tree = FleetTree::new()?;
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: app\n    path: app\n    values: {v: one}\n",
    )?;
    tree.write("app/cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: value, namespace: default}\ndata: {v: '${values.v}'}\n")?;
    publisher.publish(&tree, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let mut first_options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1");
    first_options.identity = "replica-a".into();
    let mut second_options = first_options.clone();
    second_options.identity = "replica-b".into();
    let mut first = Agent::start(&kube, &first_options).await?;
    first
        .wait_status("leader synced", SYNC, |s| s["state"] == "Synced")
        .await?;
    let second = Agent::start(&kube, &second_options).await?;
    // The standby writes nothing while the leader lives, and is Ready: readiness says the replica works
    // (its election loop reaches the API server), not that it leads (issue 45: rollouts of the DaemonSet end).
    let standby_log = || second.process.log();
    wait_for("standby announced", SYNC, || async {
        Ok(standby_log().contains("standing by").then_some(()))
    })
    .await?;
    assert_eq!(second.readyz().await?, 200);
    let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        kube.client(),
        "windvane-system",
    )
    .get("windvane-agent")
    .await;
    // The lease lives in the agent namespace; it must exist for the election to work.
    let holder = lease?.spec.and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some("replica-a"));

    first.process.kill();
    // The standby takes over within the lease duration (15 s) and enforces the release.
    second
        .wait_status("standby took over", Duration::from_secs(60), |s| {
            s["enforced"] == true
        })
        .await?;
    // The new leader writes: a new release reaches the cluster through it.
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: app\n    path: app\n    values: {v: two}\n",
    )?;
    publisher.publish(&tree, "stable")?;
    wait_config_map(&kube, "default", "value", |cm| data(cm, "v") == Some("two")).await?;
    let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        kube.client(),
        "windvane-system",
    )
    .get("windvane-agent")
    .await?;
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("replica-b")
    );
    Ok(())
}

/// Kinds used for the first time by many objects at once — ten Namespaces of one wave — are discovered with one
/// request each, not one per object: the agent's cluster client asks the real API server once per kind while
/// the others wait for its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_uses_of_a_kind_send_one_discovery_request() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let asked = Arc::new(Mutex::new(Vec::<String>::new()));
    let record = Arc::clone(&asked);
    let client = windvane_agent::kube::client::observed(kube.config().clone(), move |request| {
        record
            .lock()
            .expect("lock")
            .push(request.uri().path().to_owned());
    })?;
    let cluster = windvane_agent::kube::cluster::Cluster::new(client);
    let kinds = [
        ("v1", "Namespace"),
        ("apps/v1", "Deployment"),
        ("v1", "ConfigMap"),
    ];
    let lookups = (0..10).flat_map(|_| kinds).map(|(api_version, kind)| {
        let cluster = cluster.clone();
        async move { cluster.resolve(api_version, kind).await }
    });
    let resolved = futures::future::join_all(lookups).await;
    for (result, (_, kind)) in resolved.iter().zip((0..10).flat_map(|_| kinds)) {
        let resolved = result
            .as_ref()
            .map_err(|e| anyhow::anyhow!("{kind}: {e}"))?;
        assert_eq!(resolved.resource.kind, kind);
    }
    let asked = asked.lock().expect("lock").clone();
    let count = |path: &str| asked.iter().filter(|p| *p == path).count();
    // One per kind: Namespace and ConfigMap are both in /api/v1, Deployment in /apis/apps/v1.
    assert_eq!(count("/api/v1"), 2, "discovery requests: {asked:?}");
    assert_eq!(count("/apis/apps/v1"), 1, "discovery requests: {asked:?}");
    assert_eq!(asked.len(), 3, "requests: {asked:?}");
    Ok(())
}
