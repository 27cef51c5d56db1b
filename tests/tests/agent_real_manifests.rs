//! Manifests as real projects publish them, through the whole path (tree → signed bundle → agent → localkube):
//! `kind: List` and `*List` documents expanded into their items, other tools' `${…}` syntax (Grafana,
//! Prometheus, shell) kept verbatim next to Windvane's own variables, and substitution turned off for an app
//! (`substitute: false`) and for one object (`windvane.io/substitute: "disabled"`). The fixtures are our own,
//! modelled on monitoring-stack install files.

mod fault_support;

use fault_support::{SYNC, config_map, data};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::Api;
use windvane_tests::fleet::{Agent, AgentOptions, FleetTree, Publisher};
use windvane_tests::localkube::LocalKube;
use windvane_tests::store_server::StoreServer;

const FLEET_YAML: &str = "\
fleet: acme
apps:
  - name: monitoring
    path: apps/monitoring
    values: {retention: 15d}
  - name: scripts
    path: apps/scripts
    substitute: false
";

/// A Namespace, a `ConfigMapList` of a dashboard and alert rules, and a `v1 List` of a ServiceAccount and a
/// ConfigMap that opts out of substitution — the shapes `kubectl get -o yaml` and install bundles produce.
const MONITORING: &str = r#"apiVersion: v1
kind: Namespace
metadata: {name: observability}
---
apiVersion: v1
kind: ConfigMapList
items:
  - apiVersion: v1
    kind: ConfigMap
    metadata: {name: dashboards, namespace: observability}
    data:
      cluster: ${cluster.name}
      overview.json: '{"title": "Overview ${cluster.name}", "datasource": "${datasource}", "targets": [{"expr": "up{job=\"${job}\"}"}]}'
  - apiVersion: v1
    kind: ConfigMap
    metadata: {name: rules, namespace: observability}
    data:
      retention: ${values.retention}
      alerts.yaml: |
        - alert: PodDown
          annotations:
            summary: "{{ $labels.pod }} is down; see ${1}"
---
apiVersion: v1
kind: List
items:
  - apiVersion: v1
    kind: ServiceAccount
    metadata: {name: exporter, namespace: observability}
  - apiVersion: v1
    kind: ConfigMap
    metadata:
      name: exporter-config
      namespace: observability
      annotations: {windvane.io/substitute: disabled}
    data:
      probe: 'http://${cluster.name}:9115/probe?target=${TARGET}'
"#;

const SCRIPTS: &str = r#"apiVersion: v1
kind: ConfigMap
metadata: {name: entrypoint, namespace: default}
data:
  run.sh: |
    #!/bin/sh
    exec /bin/agent --name "${cluster.name}" --home "${HOME:-/tmp}"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_and_foreign_dollar_braces_reach_the_cluster_as_written() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(31)?;
    let tree = FleetTree::new()?;
    tree.write("fleet.yaml", FLEET_YAML)?;
    tree.write("apps/monitoring/install.yaml", MONITORING)?;
    tree.write("apps/scripts/entrypoint.yaml", SCRIPTS)?;
    publisher.publish(&tree, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "prod-eu");
    let agent = Agent::start(&kube, &options).await?;

    // Namespace + 2 from the ConfigMapList + 2 from the List, and the script.
    agent
        .wait_status("every object of both apps Synced", SYNC, |s| {
            s["state"] == "Synced" && s["counts"]["Synced"] == 6
        })
        .await?;

    let dashboards = config_map(&kube, "observability", "dashboards").await?;
    assert_eq!(data(dashboards.as_ref(), "cluster"), Some("prod-eu"));
    assert_eq!(
        data(dashboards.as_ref(), "overview.json"),
        Some(
            r#"{"title": "Overview prod-eu", "datasource": "${datasource}", "targets": [{"expr": "up{job=\"${job}\"}"}]}"#
        )
    );
    let rules = config_map(&kube, "observability", "rules").await?;
    assert_eq!(data(rules.as_ref(), "retention"), Some("15d"));
    assert_eq!(
        data(rules.as_ref(), "alerts.yaml"),
        Some(
            "- alert: PodDown\n  annotations:\n    summary: \"{{ $labels.pod }} is down; see ${1}\"\n"
        )
    );
    Api::<ServiceAccount>::namespaced(kube.client(), "observability")
        .get("exporter")
        .await?;
    let exporter = config_map(&kube, "observability", "exporter-config").await?;
    assert_eq!(
        data(exporter.as_ref(), "probe"),
        Some("http://${cluster.name}:9115/probe?target=${TARGET}"),
        "an object with windvane.io/substitute: disabled is applied as written"
    );
    let entrypoint = config_map(&kube, "default", "entrypoint").await?;
    assert_eq!(
        data(entrypoint.as_ref(), "run.sh"),
        Some("#!/bin/sh\nexec /bin/agent --name \"${cluster.name}\" --home \"${HOME:-/tmp}\"\n"),
        "an app with substitute: false is applied as written"
    );
    Ok(())
}
