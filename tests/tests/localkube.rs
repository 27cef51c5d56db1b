//! Tests of localkube itself: the control plane every integration test runs
//! against must behave like Kubernetes in the ways Windvane relies on
//! (controllers, server-side apply field ownership, CRDs, namespace deletion,
//! isolation between instances, surviving a crash).
//!
//! Every wait polls its condition with a deadline.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;

/// Deadline for one condition (a rollout, a deletion, ...).
const WAIT: Duration = Duration::from_secs(90);

async fn create_namespace(client: &Client, name: &str) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}}))?,
        )
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    // Pods are only admitted once the namespace has its default ServiceAccount.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), name);
    wait_for(&format!("ServiceAccount {name}/default"), WAIT, || async {
        Ok(accounts.get_opt("default").await?.map(|_| ()))
    })
    .await
}

fn deployment(name: &str, replicas: i32) -> Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "registry.invalid/app:1"}]}
            }
        }
    }))?)
}

async fn wait_available(deployments: &Api<Deployment>, name: &str, replicas: i32) -> Result<()> {
    wait_for(
        &format!("Deployment {name} to have {replicas} available replicas"),
        WAIT,
        || async {
            let d = deployments.get(name).await?;
            let status = d.status.unwrap_or_default();
            let available = status.available_replicas == Some(replicas)
                && status.updated_replicas == Some(replicas)
                && status.conditions.unwrap_or_default().iter().any(|c| {
                    c.type_.as_deref() == Some("Available") && c.status.as_deref() == Some("True")
                });
            Ok(available.then_some(()))
        },
    )
    .await
}

fn pod_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.status.as_ref().is_some_and(|s| {
            s.phase.as_deref() == Some("Running")
                && s.pod_ip.is_some()
                && s.conditions
                    .as_deref()
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

#[tokio::test]
async fn deployment_becomes_available_and_a_deleted_pod_is_replaced() -> Result<()> {
    let kube = LocalKube::start().await?;
    let client = kube.client();
    create_namespace(&client, "rollout").await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "rollout");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "rollout");
    let selector = ListParams::default().labels("app=web");

    deployments
        .create(&PostParams::default(), &deployment("web", 3)?)
        .await?;
    wait_available(&deployments, "web", 3).await?;

    let before = pods.list(&selector).await?.items;
    ensure!(before.len() == 3, "expected 3 pods, got {}", before.len());
    for pod in &before {
        ensure!(
            pod_ready(pod),
            "pod {} is not Running and Ready",
            pod.name_any()
        );
        ensure!(
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(kube.node_name()),
            "pod {} is not bound to the fake node",
            pod.name_any()
        );
    }
    let before: BTreeSet<String> = before.iter().map(ResourceExt::name_any).collect();
    let victim = before.first().cloned().expect("three pods");

    pods.delete(&victim, &DeleteParams::default()).await?;
    let after = wait_for("the deleted pod to be replaced", WAIT, || async {
        let list = pods.list(&selector).await?.items;
        let names: BTreeSet<String> = list.iter().map(ResourceExt::name_any).collect();
        let replaced = !names.contains(&victim)
            && names.len() == 3
            && list.iter().all(pod_ready)
            && names.difference(&before).count() == 1;
        Ok(replaced.then_some(names))
    })
    .await?;
    ensure!(after.is_superset(&before.iter().filter(|n| **n != victim).cloned().collect()));
    wait_available(&deployments, "web", 3).await
}

/// The fields (as `fieldsV1` keys under `f:data`) a manager owns on an object.
fn owned_data_keys(entries: &[ManagedFieldsEntry], manager: &str) -> BTreeSet<String> {
    entries
        .iter()
        .filter(|e| e.manager.as_deref() == Some(manager))
        .filter_map(|e| e.fields_v1.as_ref())
        .filter_map(|f| f.0.get("f:data").and_then(Value::as_object))
        .flat_map(|data| {
            data.keys()
                .filter_map(|k| k.strip_prefix("f:"))
                .map(str::to_owned)
        })
        .collect()
}

fn keys(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test]
async fn changing_a_field_moves_its_ownership_in_managed_fields() -> Result<()> {
    let kube = LocalKube::start().await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(kube.client(), "default");

    // Manager "alpha" applies a ConfigMap with two keys.
    configmaps
        .patch(
            "owned",
            &PatchParams::apply("alpha"),
            &Patch::Apply(json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "owned"},
                "data": {"a": "1", "b": "2"}
            })),
        )
        .await?;
    let cm = configmaps.get("owned").await?;
    let fields = cm.metadata.managed_fields.clone().unwrap_or_default();
    assert_eq!(owned_data_keys(&fields, "alpha"), keys(&["a", "b"]));

    // Manager "beta" changes "a" with a merge patch (an Update, like kubectl
    // edit or a controller): "a" moves from alpha to beta.
    configmaps
        .patch(
            "owned",
            &PatchParams {
                field_manager: Some("beta".into()),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({"data": {"a": "changed"}})),
        )
        .await?;
    let cm = configmaps.get("owned").await?;
    let fields = cm.metadata.managed_fields.clone().unwrap_or_default();
    assert_eq!(
        owned_data_keys(&fields, "alpha"),
        keys(&["b"]),
        "alpha must lose a: {fields:#?}"
    );
    assert_eq!(
        owned_data_keys(&fields, "beta"),
        keys(&["a"]),
        "{fields:#?}"
    );
    let beta = fields
        .iter()
        .find(|e| e.manager.as_deref() == Some("beta"))
        .expect("beta has an entry");
    assert_eq!(beta.operation.as_deref(), Some("Update"));

    // Manager "gamma" takes "b" with a forced server-side apply.
    configmaps
        .patch(
            "owned",
            &PatchParams::apply("gamma").force(),
            &Patch::Apply(json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "owned"},
                "data": {"b": "taken"}
            })),
        )
        .await?;
    let cm = configmaps.get("owned").await?;
    let fields = cm.metadata.managed_fields.clone().unwrap_or_default();
    assert_eq!(owned_data_keys(&fields, "alpha"), keys(&[]), "{fields:#?}");
    assert_eq!(
        owned_data_keys(&fields, "beta"),
        keys(&["a"]),
        "{fields:#?}"
    );
    assert_eq!(
        owned_data_keys(&fields, "gamma"),
        keys(&["b"]),
        "{fields:#?}"
    );
    let data = cm.data.unwrap_or_default();
    assert_eq!(data.get("a").map(String::as_str), Some("changed"));
    assert_eq!(data.get("b").map(String::as_str), Some("taken"));

    // Without force, alpha re-applying "b" is a conflict naming the owner.
    let err = configmaps
        .patch(
            "owned",
            &PatchParams::apply("alpha"),
            &Patch::Apply(json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "owned"},
                "data": {"a": "1", "b": "2"}
            })),
        )
        .await
        .expect_err("applying a field owned by others without force conflicts");
    match err {
        kube::Error::Api(status) if status.is_conflict() => {
            assert!(status.message.contains("gamma"), "{}", status.message);
        }
        other => bail!("expected a conflict, got {other}"),
    }
    Ok(())
}

#[tokio::test]
async fn a_crd_becomes_established_and_serves_custom_resources() -> Result<()> {
    let kube = LocalKube::start().await?;
    let client = kube.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "widgets.test.windvane.dev"},
            "spec": {
                "group": "test.windvane.dev",
                "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                "versions": [{
                    "name": "v1",
                    "served": true,
                    "storage": true,
                    "schema": {"openAPIV3Schema": {
                        "type": "object",
                        "properties": {"spec": {
                            "type": "object",
                            "properties": {"size": {"type": "integer"}, "colour": {"type": "string"}}
                        }}
                    }}
                }]
            }
        }))?,
    )
    .await?;
    wait_for("the CRD to be Established", WAIT, || async {
        let crd = crds.get("widgets.test.windvane.dev").await?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        Ok(established.then_some(()))
    })
    .await?;

    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("test.windvane.dev", "v1", "Widget"),
        "widgets",
    );
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &resource);
    let mut widget = DynamicObject::new("blue-one", &resource);
    widget.data = json!({"spec": {"size": 3, "colour": "blue"}});
    // Established means served, but the handler may lag by a moment.
    wait_for("creating a Widget", WAIT, || async {
        Ok(Some(widgets.create(&PostParams::default(), &widget).await?))
    })
    .await?;

    let read = widgets.get("blue-one").await?;
    assert_eq!(read.data["spec"], json!({"size": 3, "colour": "blue"}));

    // The bundled kubectl sees it too.
    let out = kube
        .kubectl([
            "get",
            "widgets.test.windvane.dev",
            "blue-one",
            "-n",
            "default",
            "-o",
            "jsonpath={.spec.colour}",
        ])
        .output()?;
    ensure!(
        out.status.success(),
        "kubectl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "blue");
    Ok(())
}

#[tokio::test]
async fn deleting_a_namespace_with_objects_completes() -> Result<()> {
    let kube = LocalKube::start().await?;
    let client = kube.client();
    create_namespace(&client, "doomed").await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "doomed");
    configmaps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "inside"}, "data": {"k": "v"}}))?,
        )
        .await?;
    // A running pod too: its deletion needs the fake node to finish it.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "doomed");
    deployments
        .create(&PostParams::default(), &deployment("app", 1)?)
        .await?;
    wait_available(&deployments, "app", 1).await?;

    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .delete("doomed", &DeleteParams::default())
        .await?;
    wait_for("namespace doomed to be gone", WAIT, || async {
        Ok(namespaces.get_opt("doomed").await?.is_none().then_some(()))
    })
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "doomed");
    ensure!(pods.list(&ListParams::default()).await?.items.is_empty());
    ensure!(configmaps.get_opt("inside").await?.is_none());
    Ok(())
}

#[tokio::test]
async fn three_localkubes_run_side_by_side() -> Result<()> {
    let (a, b, c) = tokio::try_join!(LocalKube::start(), LocalKube::start(), LocalKube::start())?;
    let all = [&a, &b, &c];

    let servers: BTreeSet<&str> = all.iter().map(|k| k.server_url()).collect();
    ensure!(servers.len() == 3, "servers are not distinct: {servers:?}");
    let dirs: BTreeSet<_> = all.iter().map(|k| k.data_dir().to_owned()).collect();
    ensure!(dirs.len() == 3, "data dirs are not distinct: {dirs:?}");

    for (i, kube) in all.iter().enumerate() {
        let client = kube.client();
        let nodes: Api<Node> = Api::all(client.clone());
        let nodes = nodes.list(&ListParams::default()).await?.items;
        ensure!(nodes.len() == 1, "{}: expected one node", kube.server_url());
        let ready = nodes[0]
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        ensure!(ready, "{}: node is not Ready", kube.server_url());

        // Each has its own etcd: what one stores, the others do not see.
        let configmaps: Api<ConfigMap> = Api::namespaced(client, "default");
        configmaps
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": format!("only-in-{i}")}}))?,
            )
            .await?;
    }
    for (i, kube) in all.iter().enumerate() {
        let configmaps: Api<ConfigMap> = Api::namespaced(kube.client(), "default");
        for j in 0..all.len() {
            let found = configmaps.get_opt(&format!("only-in-{j}")).await?.is_some();
            ensure!(found == (i == j), "instance {i} sees only-in-{j}: {found}");
        }
    }
    Ok(())
}

#[tokio::test]
async fn objects_survive_kill_and_restart_on_the_same_data_dir() -> Result<()> {
    let mut kube = LocalKube::start().await?;
    let server = kube.server_url().to_owned();
    let client = kube.client();
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    configmaps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "survivor"}, "data": {"k": "v"}}))?,
        )
        .await?;

    kube.kill();
    ensure!(kube.pid().is_none());
    ensure!(
        configmaps.get("survivor").await.is_err(),
        "the apiserver still answers after kill"
    );

    kube.restart().await?;
    assert_eq!(kube.server_url(), server, "restart keeps the server URL");

    // A client made before the crash reconnects.
    let survivor = configmaps.get("survivor").await?;
    assert_eq!(
        survivor
            .data
            .unwrap_or_default()
            .get("k")
            .map(String::as_str),
        Some("v")
    );

    // The restarted control plane still runs workloads.
    let deployments: Api<Deployment> = Api::namespaced(kube.client(), "default");
    deployments
        .create(&PostParams::default(), &deployment("after-restart", 1)?)
        .await?;
    wait_available(&deployments, "after-restart", 1).await?;

    // And a clean stop works.
    kube.stop().await?;
    Ok(())
}

/// The Kubernetes minor localkube must serve: `WINDVANE_LOCALKUBE_MINOR` when a run targets another
/// release (`34` for the oldest, built by `build.sh --version 1.34`), else the one pinned in
/// tests/localkube/go.mod (the default build).
fn expected_minor() -> Result<String> {
    if let Ok(minor) = std::env::var(windvane_tests::localkube::MINOR_ENV) {
        return Ok(minor);
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/localkube/go.mod");
    let go_mod = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    go_mod
        .lines()
        .find_map(|l| l.trim().strip_prefix("k8s.io/kubernetes v1."))
        .and_then(|v| v.split('.').next())
        .map(str::to_owned)
        .with_context(|| format!("{path} requires no k8s.io/kubernetes v1.X.Y"))
}

#[tokio::test]
async fn the_api_server_reports_the_release_it_was_built_from() -> Result<()> {
    let minor = expected_minor()?;
    let kube = LocalKube::start().await?;
    let info = kube.client().apiserver_version().await?;
    ensure!(
        info.major == "1"
            && info.minor == minor
            && info.git_version.starts_with(&format!("v1.{minor}.")),
        "{} serves {} (major {:?}, minor {:?}), expected 1.{minor}",
        kube.server_url(),
        info.git_version,
        info.major,
        info.minor
    );
    // The fake node reports the same release, as a kubelet of that version would.
    let nodes: Api<Node> = Api::all(kube.client());
    let node = nodes.get(kube.node_name()).await?;
    let kubelet = node
        .status
        .and_then(|s| s.node_info)
        .map(|i| i.kubelet_version);
    ensure!(
        kubelet.as_deref() == Some(info.git_version.as_str()),
        "node {} reports kubelet {kubelet:?}, the API server {}",
        kube.node_name(),
        info.git_version
    );
    Ok(())
}

#[tokio::test]
async fn a_garbage_collection_asked_for_completes_and_is_counted() -> Result<()> {
    let kube = LocalKube::start().await?;
    let counter = kube.data_dir().join("garbage-collections");
    ensure!(
        !counter.exists(),
        "{} exists before any collection was asked for",
        counter.display()
    );
    for expected in ["1", "2"] {
        kube.collect_garbage().await?;
        let counted = std::fs::read_to_string(&counter)?;
        ensure!(
            counted.trim() == expected,
            "{} holds {counted:?} after collection {expected}",
            counter.display()
        );
    }
    // The control plane serves on as before.
    let namespaces: Api<Namespace> = Api::all(kube.client());
    namespaces.get("default").await?;
    Ok(())
}
