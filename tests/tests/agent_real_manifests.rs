//! Manifests as real projects publish them, through the whole path (tree → signed bundle → agent → localkube):
//! `kind: List` and `*List` documents expanded into their items, other tools' `${…}` syntax (Grafana,
//! Prometheus, shell) kept verbatim next to Windvane's own variables, and substitution turned off for an app
//! (`substitute: false`) and for one object (`windvane.io/substitute: "disabled"`), and an install file meant
//! for `kubectl apply -n NS` (no namespaces) put into its app's `namespace:`, created by `createNamespace`.
//! The fixtures are our own, modelled on monitoring-stack and ingress-controller install files.

mod fault_support;

use fault_support::{SYNC, config_map, data};
use k8s_openapi::api::core::v1::{Namespace, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
use kube::ResourceExt;
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
  - name: ingress
    path: apps/ingress
    namespace: ingress-system
    createNamespace: true
";

/// An install file without namespaces: namespaced objects go to the app's namespace, cluster-scoped ones
/// stay cluster-scoped, and an object that names a namespace keeps it.
const INGRESS: &str = r#"apiVersion: v1
kind: ServiceAccount
metadata: {name: ingress-controller}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: ingress-controller}
rules:
  - {apiGroups: [""], resources: [configmaps], verbs: [get, list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: ingress-controller}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: ingress-controller}
subjects:
  - {kind: ServiceAccount, name: ingress-controller, namespace: ingress-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: ingress-controller}
rules:
  - {apiGroups: [networking.k8s.io], resources: [ingresses], verbs: [get, list, watch]}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: ingress-controller}
data: {allow-snippets: "false"}
---
apiVersion: v1
kind: Service
metadata: {name: ingress-controller}
spec:
  selector: {app: ingress-controller}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: ingress-defaults, namespace: default}
data: {class: windvane}
"#;

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
    tree.write("apps/ingress/install.yaml", INGRESS)?;
    publisher.publish(&tree, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "prod-eu");
    let agent = Agent::start(&kube, &options).await?;

    // Namespace + 2 from the ConfigMapList + 2 from the List, the script, and the created Namespace with the
    // 7 objects of the install file.
    agent
        .wait_status("every object of the three apps Synced", SYNC, |s| {
            s["state"] == "Synced" && s["counts"]["Synced"] == 14
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

    let namespace = Api::<Namespace>::all(kube.client())
        .get("ingress-system")
        .await?;
    assert_eq!(
        namespace
            .labels()
            .get("windvane.io/app")
            .map(String::as_str),
        Some("ingress"),
        "createNamespace makes the Namespace an object of the app"
    );
    let in_app_namespace = config_map(&kube, "ingress-system", "ingress-controller").await?;
    assert_eq!(
        data(in_app_namespace.as_ref(), "allow-snippets"),
        Some("false")
    );
    assert!(
        config_map(&kube, "default", "ingress-controller")
            .await?
            .is_none(),
        "nothing of the install file lands in default"
    );
    Api::<ServiceAccount>::namespaced(kube.client(), "ingress-system")
        .get("ingress-controller")
        .await?;
    Api::<RoleBinding>::namespaced(kube.client(), "ingress-system")
        .get("ingress-controller")
        .await?;
    Api::<Service>::namespaced(kube.client(), "ingress-system")
        .get("ingress-controller")
        .await?;
    Api::<ClusterRole>::all(kube.client())
        .get("ingress-controller")
        .await?;
    let named = config_map(&kube, "default", "ingress-defaults").await?;
    assert_eq!(
        data(named.as_ref(), "class"),
        Some("windvane"),
        "an object that names its namespace keeps it"
    );
    Ok(())
}
