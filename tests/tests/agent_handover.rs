//! Handing a field over to a real scaler when `ignoreDifferences` starts leaving it to others, against the
//! real horizontal-pod-autoscaler controller (localkube runs it). Release 1 sets `replicas: 5` (Windvane owns
//! it); an HPA (minReplicas 4, no metrics API, so it leaves 5 alone) watches the Deployment; release 2 adds
//! `ignoreDifferences` for `/spec/replicas`. Server-side apply would drop the field Windvane stops sending
//! and the API server would default it to 1; the agent hands it over first (manager `windvane-handover`),
//! so the Deployment keeps 5 replicas throughout. Afterwards the HPA scales it (minReplicas raised to 7) and
//! Windvane never writes or reports drift. And without `ignoreDifferences`, the real HPA controller raising
//! replicas to its `minReplicas` is reverted, then marked Contested after three takes, naming the manager the
//! API server recorded for the controller's scale, and Windvane backs off: no write loop through the
//! controller's next sync period.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use windvane_tests::fleet::{Agent, AgentOptions, FleetTree, Publisher, metric, object_state};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::store_server::StoreServer;

const WAIT: Duration = Duration::from_secs(90);

fn fleet(policy: &str) -> String {
    format!("fleet: acme\napps:\n  - name: web\n    path: web\n    policy: {policy}\n")
}

const WEB: &str = "\
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  replicas: 5
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: registry.example.com/web:1.0, resources: {requests: {cpu: 100m}}}]
";

fn deployments(kube: &LocalKube) -> Api<Deployment> {
    Api::namespaced(kube.client(), "shop")
}

async fn replicas(kube: &LocalKube) -> anyhow::Result<Option<i32>> {
    Ok(deployments(kube).get("web").await?.spec.replicas)
}

/// The managers whose entries on the Deployment own `spec.replicas`.
async fn replica_owners(kube: &LocalKube) -> anyhow::Result<Vec<String>> {
    let deployment = deployments(kube).get("web").await?;
    Ok(deployment
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter(|f| {
            f.fields_v1
                .as_ref()
                .is_some_and(|v| v.0.pointer("/f:spec/f:replicas").is_some())
        })
        .filter_map(|f| f.manager)
        .collect())
}

/// The manager whose update of the `scale` subresource owns `spec.replicas` (a scaler's take).
async fn scale_owner(kube: &LocalKube) -> anyhow::Result<String> {
    let deployment = deployments(kube).get("web").await?;
    deployment
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .find(|f| {
            f.subresource.as_deref() == Some("scale")
                && f.fields_v1
                    .as_ref()
                    .is_some_and(|v| v.0.pointer("/f:spec/f:replicas").is_some())
        })
        .and_then(|f| f.manager)
        .ok_or_else(|| anyhow::anyhow!("no update of the scale subresource owns spec.replicas"))
}

/// The time of Windvane's own managedFields entry: it changes only when Windvane writes.
async fn windvane_write_time(kube: &LocalKube) -> anyhow::Result<Option<String>> {
    let deployment = deployments(kube).get("web").await?;
    Ok(deployment
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .find(|f| f.manager.as_deref() == Some("windvane"))
        .and_then(|f| f.time)
        .map(|t| t.0.to_string()))
}

/// Records every `spec.replicas` the Deployment shows from now on (each write is one watch event), until
/// the returned guard drops.
fn record_replicas(kube: &LocalKube) -> (Arc<Mutex<Vec<Option<i32>>>>, AbortOnDrop) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    let config = watcher::Config::default().fields("metadata.name=web");
    let mut events = watcher(deployments(kube), config).default_backoff().boxed();
    let task = tokio::spawn(async move {
        while let Some(event) = events.next().await {
            if let Ok(watcher::Event::Apply(d) | watcher::Event::InitApply(d)) = event {
                sink.lock().expect("lock").push(d.spec.replicas);
            }
        }
    });
    (seen, AbortOnDrop(task))
}

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn hpa(min: i32) -> anyhow::Result<HorizontalPodAutoscaler> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                 "minReplicas": min, "maxReplicas": 10,
                 "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                     "target": {"type": "Utilization", "averageUtilization": 50}}}]}
    }))?)
}

fn drift_count(status: &Value) -> usize {
    status["drift"].as_array().map_or(0, Vec::len)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignoring_a_field_windvane_owns_hands_it_to_the_scaler_without_a_reset()
-> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(81)?;
    let tree = FleetTree::new()?;
    tree.write("fleet.yaml", &fleet("{}"))?;
    tree.write("web/objects.yaml", WEB)?;
    publisher.publish(&tree, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1");
    let agent = Agent::start(&kube, &options).await?;
    agent
        .wait_status("release 1 synced", WAIT, |st| {
            st["state"] == "Synced" && st["source"]["appliedSerial"] == 1
        })
        .await?;
    assert_eq!(replicas(&kube).await?, Some(5));
    assert_eq!(replica_owners(&kube).await?, ["windvane"]);

    // A team's HPA: 5 is within 4..10 and there is no metrics API, so it changes nothing yet.
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(kube.client(), "shop");
    hpas.create(&PostParams::default(), &hpa(4)?).await?;
    let (seen, _recording) = record_replicas(&kube);

    tree.write(
        "fleet.yaml",
        &fleet("{ignoreDifferences: [{group: apps, kind: Deployment, jsonPointers: [/spec/replicas]}]}"),
    )?;
    publisher.publish(&tree, "stable")?;
    agent
        .wait_status("release 2 synced", WAIT, |st| {
            st["state"] == "Synced" && st["source"]["appliedSerial"] == 2
        })
        .await?;
    let owners = replica_owners(&kube).await?;
    assert_eq!(
        replicas(&kube).await?,
        Some(5),
        "replicas kept when Windvane stopped sending them (owners {owners:?})"
    );
    assert_eq!(
        owners,
        ["windvane-handover"],
        "handed over, no longer Windvane's"
    );
    let values = seen.lock().expect("lock").clone();
    assert!(
        !values.is_empty() && values.iter().all(|r| *r == Some(5)),
        "every write since release 2 kept 5 replicas: {values:?}"
    );

    // The HPA now scales (minReplicas 7): it takes replicas over; Windvane neither writes nor reports drift.
    let before = windvane_write_time(&kube).await?;
    let params = PatchParams {
        field_manager: Some("team-autoscaling".into()),
        ..PatchParams::default()
    };
    hpas.patch(
        "web",
        &params,
        &Patch::Merge(json!({"spec": {"minReplicas": 7}})),
    )
    .await?;
    wait_for("the HPA scaled to 7", WAIT, || async {
        Ok((replicas(&kube).await? == Some(7)).then_some(()))
    })
    .await?;
    let owners = replica_owners(&kube).await?;
    assert!(
        !owners.iter().any(|o| o.starts_with("windvane")),
        "the HPA owns replicas now: {owners:?}"
    );
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        let status = agent.status().await?;
        assert_eq!(
            replicas(&kube).await?,
            Some(7),
            "Windvane does not fight the HPA"
        );
        assert_eq!(
            windvane_write_time(&kube).await?,
            before,
            "Windvane wrote nothing"
        );
        assert_eq!(drift_count(&status), 0, "no drift: {status}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_ignore_differences_the_real_hpa_is_contested_and_not_fought() -> anyhow::Result<()>
{
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(82)?;
    let tree = FleetTree::new()?;
    tree.write("fleet.yaml", &fleet("{}"))?;
    tree.write("web/objects.yaml", WEB)?;
    publisher.publish(&tree, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1");
    let agent = Agent::start(&kube, &options).await?;
    agent
        .wait_status("synced", WAIT, |st| st["state"] == "Synced")
        .await?;

    // The release says 5; a team's HPA says at least 7. Its controller scales on creation and then once per
    // sync period (15 s); Windvane reverts each take until the third makes it a war.
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(kube.client(), "shop");
    hpas.create(&PostParams::default(), &hpa(7)?).await?;
    let status = agent
        .wait_status("Contested", Duration::from_secs(120), |st| {
            object_state(st, "Deployment shop/web") == Some("Contested")
        })
        .await?;
    let message = status["objects"]
        .as_array()
        .and_then(|o| o.iter().find(|x| x["object"] == "Deployment shop/web"))
        .map(|x| x["message"].to_string())
        .unwrap_or_default();
    let reverted = status["drift"].as_array().map_or(0, |d| {
        d.iter().filter(|r| r["action"] == "Reverted").count()
    });
    assert!(reverted >= 2, "reverted before it was a war: {status}");

    // Backed off: the HPA's 7 stands through more than one of its sync periods, and Windvane writes nothing.
    wait_for("the HPA's replicas to stand", WAIT, || async {
        Ok((replicas(&kube).await? == Some(7)).then_some(()))
    })
    .await?;
    // The controller's take is an update of the scale subresource; Contested names the manager the API
    // server recorded for it (the controller manager runs inside localkube's process, so its requests carry
    // localkube's user agent; on a cluster of kubeadm's it is kube-controller-manager).
    let controller = scale_owner(&kube).await?;
    assert!(
        !controller.starts_with("windvane"),
        "the HPA controller owns replicas now: {controller}"
    );
    assert!(
        message.contains(&controller),
        "Contested names the real controller ({controller}): {message}"
    );
    let text = agent.metrics().await?;
    let sample =
        format!("windvane_drift_detected_total{{kind=\"Deployment\",manager=\"{controller}\"}}");
    assert!(metric(&text, &sample).is_some_and(|n| n >= 3.0), "{text}");
    let before = windvane_write_time(&kube).await?;
    let end = Instant::now() + Duration::from_secs(16);
    while Instant::now() < end {
        assert_eq!(replicas(&kube).await?, Some(7), "no write loop");
        assert_eq!(
            windvane_write_time(&kube).await?,
            before,
            "Windvane backed off"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}
