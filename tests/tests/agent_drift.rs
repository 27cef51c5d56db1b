//! Drift detection, attribution and self-heal against a real control plane: a scale by `kubectl-scale`
//! reverted and attributed; a deleted ConfigMap recreated; edits to fields Windvane does not own, and pods
//! replaced by their ReplicaSet, left alone; an HPA-like manager that owns `/spec/replicas` under
//! ignoreDifferences never fought; the same manager without it marked Contested after three rounds;
//! selfHeal false only reports; an operator's hold is honoured until it expires; drift made while the agent
//! was down is healed when it starts.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use windvane_tests::fleet::{Agent, AgentOptions, FleetTree, Publisher, metric, object_state};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::store_server::StoreServer;

const WAIT: Duration = Duration::from_secs(60);

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
metadata: {name: web, namespace: shop, labels: {tier: front}}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: registry.example.com/web:1.0}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: shop}
data: {mode: strict}
";

struct Setup {
    kube: LocalKube,
    publisher: Publisher,
    tree: FleetTree,
    _server: StoreServer,
    options: AgentOptions,
}

async fn setup(policy: &str, seed: u8) -> anyhow::Result<Setup> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(seed)?;
    let tree = FleetTree::new()?;
    tree.write("fleet.yaml", &fleet(policy))?;
    tree.write("web/objects.yaml", WEB)?;
    publisher.publish(&tree, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1");
    Ok(Setup {
        kube,
        publisher,
        tree,
        _server: server,
        options,
    })
}

fn deployments(kube: &LocalKube) -> Api<Deployment> {
    Api::namespaced(kube.client(), "shop")
}

async fn scale(kube: &LocalKube, manager: &str, replicas: i32) -> anyhow::Result<()> {
    let params = PatchParams {
        field_manager: Some(manager.to_owned()),
        ..PatchParams::default()
    };
    deployments(kube)
        .patch_scale(
            "web",
            &params,
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await?;
    Ok(())
}

async fn replicas(kube: &LocalKube) -> anyhow::Result<Option<i32>> {
    Ok(deployments(kube).get("web").await?.spec.replicas)
}

async fn wait_replicas(kube: &LocalKube, want: i32) -> anyhow::Result<()> {
    wait_for(&format!("replicas {want}"), WAIT, || async {
        Ok((replicas(kube).await? == Some(want)).then_some(()))
    })
    .await
}

/// The time of Windvane's own managedFields entry on the Deployment: it changes only when Windvane writes.
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

/// Polls `/metrics` until `sample` has the value `want`.
async fn wait_metric(agent: &Agent, sample: &str, want: f64) -> anyhow::Result<()> {
    wait_metric_in(agent, sample, want, want).await
}

/// Polls `/metrics` until `sample` is in `low..=high`.
async fn wait_metric_in(agent: &Agent, sample: &str, low: f64, high: f64) -> anyhow::Result<()> {
    wait_for(&format!("{sample} in {low}..={high}"), WAIT, || async {
        let text = agent.metrics().await?;
        Ok(metric(&text, sample)
            .is_some_and(|v| (low..=high).contains(&v))
            .then_some(()))
    })
    .await
}

fn drift_records<'a>(status: &'a Value, name: &str) -> Vec<&'a Value> {
    status["drift"]
        .as_array()
        .map(|d| d.iter().filter(|r| r["name"] == name).collect())
        .unwrap_or_default()
}

/// Asserts that `check` holds for the whole window (absence of an action can only be observed over time).
async fn holds_for(
    window: Duration,
    mut check: impl AsyncFnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let end = Instant::now() + window;
    while Instant::now() < end {
        anyhow::ensure!(check().await?, "condition stopped holding");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_is_reverted_attributed_and_only_on_owned_fields() -> anyhow::Result<()> {
    let s = setup("{}", 11).await?;
    let agent = Agent::start(&s.kube, &s.options).await?;
    agent
        .wait_status("synced", WAIT, |st| st["state"] == "Synced")
        .await?;

    // kubectl scale takes /spec/replicas: reverted, attributed, with detection and repair times.
    scale(&s.kube, "kubectl-scale", 5).await?;
    wait_replicas(&s.kube, 3).await?;
    let status = agent
        .wait_status("drift record", WAIT, |st| {
            drift_records(st, "web")
                .iter()
                .any(|r| r["revertedAt"].is_string())
        })
        .await?;
    let record = drift_records(&status, "web")[0];
    assert_eq!(record["manager"], "kubectl-scale");
    assert_eq!(record["fields"], json!(["/spec/replicas"]));
    assert_eq!(record["action"], "Reverted");
    // The scale subresource records no time in managedFields, so changedAt may be absent; detection and
    // repair times are always there.
    assert!(
        record["detectedAt"].is_string() && record["revertedAt"].is_string(),
        "{record}"
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(s.kube.client(), "shop");
    wait_for("DriftReverted event", WAIT, || async {
        let list = events.list(&ListParams::default()).await?;
        let found = list.items.iter().any(|e| {
            e.reason.as_deref() == Some("DriftReverted")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web")
        });
        let detected = list.items.iter().any(|e| {
            e.reason.as_deref() == Some("DriftDetected")
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.contains("kubectl-scale"))
        });
        Ok((found && detected).then_some(()))
    })
    .await?;

    // A deleted ConfigMap is recreated.
    let config_maps: Api<ConfigMap> = Api::namespaced(s.kube.client(), "shop");
    let old_uid = config_maps.get("settings").await?.metadata.uid;
    config_maps
        .delete("settings", &DeleteParams::default())
        .await?;
    wait_for("ConfigMap recreated", WAIT, || async {
        Ok(config_maps
            .get_opt("settings")
            .await?
            .filter(|cm| cm.metadata.uid != old_uid)
            .map(|_| ()))
    })
    .await?;
    // Both drifts are counted (the deletion names no manager) and both reverts timed.
    wait_metric(&agent, "windvane_drift_reverted_total", 2.0).await?;
    let text = agent.metrics().await?;
    let deployment = "windvane_drift_detected_total{kind=\"Deployment\",manager=\"kubectl-scale\"}";
    assert_eq!(metric(&text, deployment), Some(1.0), "{text}");
    let config_map = "windvane_drift_detected_total{kind=\"ConfigMap\",manager=\"unknown\"}";
    assert_eq!(metric(&text, config_map), Some(1.0), "{text}");
    assert_eq!(
        metric(&text, "windvane_drift_repair_seconds_count"),
        Some(2.0)
    );
    let repair = metric(&text, "windvane_drift_repair_seconds_sum").unwrap_or(-1.0);
    assert!((0.0..WAIT.as_secs_f64()).contains(&repair), "{text}");

    // Fields Windvane does not own (an annotation added by someone else) are not drift; pods deleted and
    // replaced by their ReplicaSet are not Windvane's business. Windvane writes nothing.
    let before = windvane_write_time(&s.kube).await?;
    let records_before = drift_records(&agent.status().await?, "web").len();
    let params = PatchParams {
        field_manager: Some("team-tooling".into()),
        ..PatchParams::default()
    };
    deployments(&s.kube)
        .patch(
            "web",
            &params,
            &Patch::Merge(json!({"metadata": {"annotations": {"team": "checkout"}}})),
        )
        .await?;
    let pods: Api<Pod> = Api::namespaced(s.kube.client(), "shop");
    let web_pods = || async {
        let names: Vec<String> = pods
            .list(&ListParams::default().labels("app=web"))
            .await?
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.name)
            .collect();
        anyhow::Ok(names)
    };
    let running = wait_for("the Deployment's pods", WAIT, || async {
        let names = web_pods().await?;
        Ok((!names.is_empty()).then_some(names))
    })
    .await?;
    let deleted = running[0].clone();
    pods.delete(&deleted, &DeleteParams::default()).await?;
    // The ReplicaSet replaces the pod; Windvane, which does not manage pods, does nothing.
    wait_for(
        "the ReplicaSet to recreate the deleted pod",
        WAIT,
        || async {
            let names = web_pods().await?;
            Ok((names.len() == running.len() && !names.contains(&deleted)).then_some(()))
        },
    )
    .await?;
    holds_for(Duration::from_secs(3), async || {
        Ok(windvane_write_time(&s.kube).await? == before
            && drift_records(&agent.status().await?, "web").len() == records_before)
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_fight_with_an_hpa_and_contested_without_ignore_differences() -> anyhow::Result<()> {
    // With ignoreDifferences, the HPA-like manager owns replicas; ten changes, zero writes by Windvane.
    let ignore =
        "{ignoreDifferences: [{group: apps, kind: Deployment, jsonPointers: [/spec/replicas]}]}";
    let s = setup(ignore, 12).await?;
    let agent = Agent::start(&s.kube, &s.options).await?;
    agent
        .wait_status("synced", WAIT, |st| st["state"] == "Synced")
        .await?;
    let before = windvane_write_time(&s.kube).await?;
    for replicas in 4..14 {
        scale(&s.kube, "hpa-like", replicas).await?;
    }
    holds_for(Duration::from_secs(3), async || {
        Ok(windvane_write_time(&s.kube).await? == before
            && drift_records(&agent.status().await?, "web").is_empty())
    })
    .await?;
    assert_eq!(replicas(&s.kube).await?, Some(13));
    drop(agent);

    // Without it: reverted twice, then Contested naming the manager, and Windvane stops writing.
    s.tree.write("fleet.yaml", &fleet("{}"))?;
    s.publisher.publish(&s.tree, "stable")?;
    let agent = Agent::start(&s.kube, &s.options).await?;
    wait_replicas(&s.kube, 3).await?;
    agent
        .wait_status("synced", WAIT, |st| st["state"] == "Synced")
        .await?;
    for round in 1..=2 {
        scale(&s.kube, "hpa-like", 7).await?;
        wait_replicas(&s.kube, 3).await?;
        agent
            .wait_status(&format!("round {round} reverted"), WAIT, |st| {
                drift_records(st, "web")
                    .iter()
                    .filter(|r| r["action"] == "Reverted")
                    .count()
                    == round
            })
            .await?;
    }
    scale(&s.kube, "hpa-like", 7).await?;
    let status = agent
        .wait_status("contested", WAIT, |st| {
            object_state(st, "Deployment shop/web") == Some("Contested")
        })
        .await?;
    assert_eq!(status["state"], "Contested");
    let message = status["objects"]
        .as_array()
        .and_then(|o| o.iter().find(|x| x["object"] == "Deployment shop/web"))
        .map(|x| x["message"].to_string())
        .unwrap_or_default();
    assert!(message.contains("hpa-like"), "{message}");
    wait_metric(&agent, "windvane_drift_contested_objects", 1.0).await?;
    let text = agent.metrics().await?;
    let hpa = "windvane_drift_detected_total{kind=\"Deployment\",manager=\"hpa-like\"}";
    // At least three (the agent may also have found the replicas left while it was down).
    assert!(metric(&text, hpa).is_some_and(|n| n >= 3.0), "{text}");
    let before = windvane_write_time(&s.kube).await?;
    holds_for(Duration::from_secs(3), async || {
        Ok(replicas(&s.kube).await? == Some(7) && windvane_write_time(&s.kube).await? == before)
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_only_and_operator_holds() -> anyhow::Result<()> {
    let s = setup("{selfHeal: false}", 13).await?;
    let agent = Agent::start(&s.kube, &s.options).await?;
    agent
        .wait_status("synced", WAIT, |st| st["state"] == "Synced")
        .await?;
    // selfHeal false: reported, left alone.
    scale(&s.kube, "kubectl-scale", 6).await?;
    let status = agent
        .wait_status("out of sync", WAIT, |st| {
            object_state(st, "Deployment shop/web") == Some("OutOfSync")
        })
        .await?;
    assert_eq!(drift_records(&status, "web")[0]["action"], "Reported");
    holds_for(Duration::from_secs(2), async || {
        Ok(replicas(&s.kube).await? == Some(6))
    })
    .await?;
    // New releases still roll out.
    s.tree.write(
        "web/objects.yaml",
        &WEB.replace("mode: strict", "mode: relaxed"),
    )?;
    s.publisher.publish(&s.tree, "stable")?;
    let config_maps: Api<ConfigMap> = Api::namespaced(s.kube.client(), "shop");
    wait_for("new release applied", WAIT, || async {
        let cm = config_maps.get("settings").await?;
        Ok(
            (cm.data.unwrap_or_default().get("mode").map(String::as_str) == Some("relaxed"))
                .then_some(()),
        )
    })
    .await?;
    drop(agent);

    // selfHeal on, and an operator holds the Deployment for a few seconds: not reverted until then.
    s.tree.write("fleet.yaml", &fleet("{}"))?;
    s.publisher.publish(&s.tree, "stable")?;
    let agent = Agent::start(&s.kube, &s.options).await?;
    wait_replicas(&s.kube, 3).await?;
    agent
        .wait_status("synced", WAIT, |st| st["state"] == "Synced")
        .await?;
    let until = jiff::Timestamp::now().checked_add(jiff::SignedDuration::from_secs(6))?;
    let params = PatchParams {
        field_manager: Some("oncall-alice".into()),
        ..PatchParams::default()
    };
    deployments(&s.kube)
        .patch("web", &params, &Patch::Merge(json!({"metadata": {"annotations": {"windvane.io/hold-until": until.to_string()}}, "spec": {"replicas": 8}})))
        .await?;
    let status = agent
        .wait_status("held", WAIT, |st| {
            object_state(st, "Deployment shop/web") == Some("Held")
        })
        .await?;
    let message = status["objects"]
        .as_array()
        .and_then(|o| o.iter().find(|x| x["object"] == "Deployment shop/web"))
        .map(|x| x["message"].to_string())
        .unwrap_or_default();
    assert!(message.contains("oncall-alice"), "{message}");
    assert_eq!(replicas(&s.kube).await?, Some(8), "not reverted while held");
    wait_metric(&agent, "windvane_drift_held_objects", 1.0).await?;
    wait_replicas(&s.kube, 3).await?;
    wait_metric(&agent, "windvane_drift_held_objects", 0.0).await?;
    wait_metric_in(&agent, "windvane_drift_reverted_total", 1.0, f64::MAX).await?;
    assert!(
        jiff::Timestamp::now() >= until,
        "reverted only after the hold expired"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_made_while_the_agent_was_down_is_healed_at_start() -> anyhow::Result<()> {
    let s = setup("{}", 14).await?;
    let agent = Agent::start(&s.kube, &s.options).await?;
    agent
        .wait_status("synced", WAIT, |st| st["state"] == "Synced")
        .await?;
    drop(agent);
    scale(&s.kube, "kubectl-scale", 9).await?;
    let params = PatchParams {
        field_manager: Some("kubectl-edit".into()),
        ..PatchParams::default()
    };
    Api::<ConfigMap>::namespaced(s.kube.client(), "shop")
        .patch(
            "settings",
            &params,
            &Patch::Merge(json!({"data": {"mode": "lax"}})),
        )
        .await?;
    let _agent = Agent::start(&s.kube, &s.options).await?;
    wait_replicas(&s.kube, 3).await?;
    wait_for("ConfigMap healed", WAIT, || async {
        let cm = Api::<ConfigMap>::namespaced(s.kube.client(), "shop")
            .get("settings")
            .await?;
        Ok(
            (cm.data.unwrap_or_default().get("mode").map(String::as_str) == Some("strict"))
                .then_some(()),
        )
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backstop_catches_what_the_watches_cannot_see() -> anyhow::Result<()> {
    let mut s = setup("{}", 15).await?;
    s.options.extra = vec!["--backstop-interval".into(), "2s".into()];
    let agent = Agent::start(&s.kube, &s.options).await?;
    agent
        .wait_status("synced", WAIT, |st| st["state"] == "Synced")
        .await?;
    // A write under Windvane's own field manager leaves its owned-field set intact, so no watch event looks
    // like drift; only comparing with a dry run shows it.
    let impostor = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": "shop"}, "data": {"mode": "impostor"}});
    Api::<ConfigMap>::namespaced(s.kube.client(), "shop")
        .patch(
            "settings",
            &PatchParams::apply("windvane").force(),
            &Patch::Apply(&impostor),
        )
        .await?;
    wait_for("backstop restores the value", WAIT, || async {
        let cm = Api::<ConfigMap>::namespaced(s.kube.client(), "shop")
            .get("settings")
            .await?;
        Ok(
            (cm.data.unwrap_or_default().get("mode").map(String::as_str) == Some("strict"))
                .then_some(()),
        )
    })
    .await?;
    let status = agent
        .wait_status("backstop drift recorded", WAIT, |st| {
            drift_records(st, "settings")
                .iter()
                .any(|r| r["action"] == "Reverted")
        })
        .await?;
    assert_eq!(drift_records(&status, "settings")[0]["fields"], json!([]));
    Ok(())
}
