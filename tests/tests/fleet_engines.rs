//! Helm charts and kustomize overlays, unmodified, through the whole path: `windvane publish` runs the real
//! `helm` and `kustomize` (built from their Go modules by tests/tools/build.sh), the agents of two clusters
//! with different labels each apply their own rendering, `windvane render` shows exactly what each applied,
//! the release stays idle with no writes and no drift, and drift on a chart-rendered field is healed.
//!
//! The fixtures are our own, modelled on what published charts and kustomize trees do: a chart with a
//! subchart, a `crds/` folder and a custom resource of it, a pre-install hook, a test hook, values per
//! customization and `${cluster.name}` in values; a kustomize base with a generator and two overlays.

mod fault_support;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use fault_support::{SYNC, config_map, data};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use windvane_shared::text::yaml::{YamlLimits, documents_to_json};
use windvane_tests::fleet::{Agent, AgentOptions, FleetTree, metric_sum};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::process::binary;
use windvane_tests::store_server::StoreServer;

const FLEET_YAML: &str = "\
fleet: acme
apps:
  - name: shop
    path: apps/shop/base
    namespace: shop
    createNamespace: true
    customizations:
      - selector: {matchLabels: {env: prod}}
        kustomize: apps/shop/overlays/prod
      - selector: {matchLabels: {env: staging}}
        kustomize: apps/shop/overlays/staging
  - name: web
    path: charts/web
    namespace: web
    createNamespace: true
    helm:
      valuesFiles: [values/web-common.yaml]
      values: {greeting: \"hello from ${cluster.name}\"}
    customizations:
      - selector: {matchLabels: {env: prod}}
        helm: {values: {replicas: 3, tier: gold}}
";

const SHOP_BASE: &[(&str, &str)] = &[
    (
        "apps/shop/base/kustomization.yaml",
        "resources: [service.yaml, account.yaml]
labels:
  - pairs: {app.kubernetes.io/part-of: shop}
configMapGenerator:
  - name: shop-settings
    literals: [mode=base, queue=small]
generatorOptions: {disableNameSuffixHash: true}
",
    ),
    (
        "apps/shop/base/service.yaml",
        "apiVersion: v1
kind: Service
metadata: {name: shop}
spec:
  selector: {app: shop}
  ports: [{name: http, port: 80, targetPort: 8080}]
",
    ),
    (
        "apps/shop/base/account.yaml",
        "apiVersion: v1
kind: ServiceAccount
metadata: {name: shop}
",
    ),
    (
        "apps/shop/overlays/prod/kustomization.yaml",
        "resources: [../../base]
configMapGenerator:
  - name: shop-settings
    behavior: merge
    literals: [mode=prod, queue=large]
generatorOptions: {disableNameSuffixHash: true}
",
    ),
    (
        "apps/shop/overlays/staging/kustomization.yaml",
        "resources: [../../base]
nameSuffix: -staging
patches:
  - target: {kind: Service, name: shop}
    patch: |-
      - op: replace
        path: /spec/ports/0/port
        value: 8081
",
    ),
];

const WEB_CHART: &[(&str, &str)] = &[
    (
        "charts/web/Chart.yaml",
        "apiVersion: v2
name: web
version: 1.4.0
appVersion: \"2.1\"
dependencies:
  - name: cache
    version: 0.2.0
",
    ),
    (
        "charts/web/values.yaml",
        "replicas: 1
tier: bronze
greeting: hi
image: registry.example/web
cache: {memory: 64Mi}
",
    ),
    (
        "charts/web/crds/gadgets.yaml",
        "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gadgets.example.com}
spec:
  group: example.com
  names: {kind: Gadget, plural: gadgets, singular: gadget}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
",
    ),
    (
        "charts/web/templates/_helpers.tpl",
        "{{- define \"web.labels\" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf \"%s-%s\" .Chart.Name .Chart.Version }}
{{- end -}}
",
    ),
    (
        "charts/web/templates/config.yaml",
        "apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-settings
  labels:
    {{- include \"web.labels\" . | nindent 4 }}
data:
  greeting: {{ .Values.greeting | quote }}
  tier: {{ .Values.tier | quote }}
  namespace: {{ .Release.Namespace | quote }}
{{- if semverCompare \">=1.30-0\" .Capabilities.KubeVersion.Version }}
  admission: validating-admission-policy
{{- end }}
",
    ),
    (
        "charts/web/templates/deployment.yaml",
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}
  labels:
    {{- include \"web.labels\" . | nindent 4 }}
spec:
  replicas: {{ .Values.replicas }}
  selector:
    matchLabels: {app.kubernetes.io/instance: {{ .Release.Name }}}
  template:
    metadata:
      labels: {app.kubernetes.io/instance: {{ .Release.Name }}}
    spec:
      containers:
        - name: web
          image: \"{{ .Values.image }}:{{ .Chart.AppVersion }}\"
          ports: [{containerPort: 8080}]
",
    ),
    (
        "charts/web/templates/gadget.yaml",
        "apiVersion: example.com/v1
kind: Gadget
metadata: {name: {{ .Release.Name }}-main}
spec: {tier: {{ .Values.tier }}}
",
    ),
    (
        "charts/web/templates/hooks.yaml",
        "apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ .Release.Name }}-migrator
  annotations:
    helm.sh/hook: pre-install,pre-upgrade
    helm.sh/hook-weight: \"-5\"
---
apiVersion: v1
kind: Pod
metadata:
  name: {{ .Release.Name }}-smoke-test
  annotations:
    helm.sh/hook: test
spec:
  restartPolicy: Never
  containers: [{name: curl, image: registry.example/curl, args: [\"http://{{ .Release.Name }}:8080\"]}]
",
    ),
    (
        "charts/web/charts/cache/Chart.yaml",
        "apiVersion: v2
name: cache
version: 0.2.0
",
    ),
    (
        "charts/web/charts/cache/values.yaml",
        "memory: 32Mi
",
    ),
    (
        "charts/web/charts/cache/templates/service.yaml",
        "apiVersion: v1
kind: Service
metadata:
  name: {{ .Release.Name }}-cache
  annotations: {cache.example.com/memory: {{ .Values.memory | quote }}}
spec:
  ports: [{name: redis, port: 6379}]
",
    ),
    (
        "values/web-common.yaml",
        "image: registry.example/web-frontend
",
    ),
];

/// The real engine `name` (`helm`, `kustomize`): `WINDVANE_HELM`/`WINDVANE_KUSTOMIZE` (set by tests/run),
/// else the one tests/tools/build.sh writes into the workspace's target directory.
fn engine(name: &str) -> anyhow::Result<PathBuf> {
    windvane_tests::install::tool(name)
}

fn tree() -> anyhow::Result<FleetTree> {
    let tree = FleetTree::new()?;
    tree.write("fleet.yaml", FLEET_YAML)?;
    for (path, text) in SHOP_BASE.iter().chain(WEB_CHART) {
        tree.write(path, text)?;
    }
    Ok(tree)
}

/// Runs the `windvane` command line with the real engines; its standard output, or its stderr as the error.
fn windvane(args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(binary("windvane")?)
        .args(args)
        .env("WINDVANE_HELM", engine("helm")?)
        .env("WINDVANE_KUSTOMIZE", engine("kustomize")?)
        .output()?;
    if !output.status.success() {
        bail!(
            "windvane {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8(output.stdout)?)
}

/// A store with the tree published on `stable`, and the key agents trust.
struct Release {
    dir: tempfile::TempDir,
}

impl Release {
    fn publish(tree: &FleetTree) -> anyhow::Result<Self> {
        let dir = tempfile::TempDir::new()?;
        let prefix = dir.path().join("release");
        windvane(&["keygen", "--out", &prefix.display().to_string()])?;
        let store = dir.path().join("store");
        windvane(&[
            "publish",
            &tree.path().display().to_string(),
            "--root",
            &store.display().to_string(),
            "--channel",
            "stable",
            "--key",
            &dir.path().join("release.key").display().to_string(),
        ])?;
        Ok(Self { dir })
    }

    fn store(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    fn public_key(&self) -> PathBuf {
        self.dir.path().join("release.pub")
    }
}

/// One cluster: its localkube and its agent.
struct Cluster {
    kube: LocalKube,
    agent: Agent,
    name: &'static str,
    env: &'static str,
}

async fn cluster(
    release: &Release,
    server: &StoreServer,
    name: &'static str,
    env: &'static str,
) -> anyhow::Result<Cluster> {
    let kube = LocalKube::start().await?;
    let mut options = AgentOptions::new(&server.url(), &release.public_key(), name);
    options.labels = vec![format!("env={env}")];
    let agent = Agent::start(&kube, &options).await?;
    Ok(Cluster {
        kube,
        agent,
        name,
        env,
    })
}

/// What `windvane render` says this cluster gets: (app namespace comment, object) per document.
fn rendered(tree: &FleetTree, cluster: &Cluster) -> anyhow::Result<Vec<(String, Value)>> {
    let text = windvane(&[
        "render",
        &tree.path().display().to_string(),
        "--cluster",
        cluster.name,
        "--label",
        &format!("env={}", cluster.env),
    ])?;
    let mut objects = Vec::new();
    for chunk in text.split("---\n").filter(|c| !c.trim().is_empty()) {
        let namespace = chunk
            .lines()
            .find_map(|line| line.strip_prefix("# namespace: "))
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or("default")
            .to_owned();
        for (_, object) in documents_to_json(chunk, "windvane render", YamlLimits::default())? {
            objects.push((namespace.clone(), object));
        }
    }
    Ok(objects)
}

/// Whether every field of `want` is in `live` with the same value (the server adds defaults and status).
fn contains(live: &Value, want: &Value) -> bool {
    match (live, want) {
        (Value::Object(live), Value::Object(want)) => want
            .iter()
            .all(|(key, value)| live.get(key).is_some_and(|l| contains(l, value))),
        (Value::Array(live), Value::Array(want)) => {
            live.len() == want.len() && live.iter().zip(want).all(|(l, w)| contains(l, w))
        }
        _ => live == want,
    }
}

/// The live object for a rendered one, read with kubectl (which resolves any kind, custom ones included).
fn live_object(kube: &LocalKube, namespace: &str, object: &Value) -> anyhow::Result<Value> {
    let api_version = object["apiVersion"].as_str().context("apiVersion")?;
    let kind = object["kind"].as_str().context("kind")?;
    let resource = match api_version.split_once('/') {
        Some((group, version)) => format!("{kind}.{version}.{group}"),
        None => kind.to_owned(),
    };
    let namespace = object["metadata"]["namespace"]
        .as_str()
        .unwrap_or(namespace);
    let name = object["metadata"]["name"].as_str().context("name")?;
    let output = kube
        .kubectl(["get", &resource, name, "-n", namespace, "-o", "json"])
        .output()?;
    ensure!(
        output.status.success(),
        "kubectl get {resource} {namespace}/{name}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// Every object `windvane render` shows for the cluster is live, exactly as rendered.
fn assert_render_equals_applied(tree: &FleetTree, cluster: &Cluster) -> anyhow::Result<usize> {
    let objects = rendered(tree, cluster)?;
    for (namespace, object) in &objects {
        let live = live_object(&cluster.kube, namespace, object)?;
        ensure!(
            contains(&live, object),
            "cluster {}: {} {} differs from windvane render\nrendered: {object}\nlive: {live}",
            cluster.name,
            object["kind"],
            object["metadata"]["name"]
        );
    }
    Ok(objects.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charts_and_overlays_reach_each_cluster_as_rendered_and_stay_healed() -> anyhow::Result<()>
{
    let tree = tree()?;
    let release = Release::publish(&tree)?;
    let server = StoreServer::start(release.store()).await?;
    let prod = cluster(&release, &server, "prod-eu", "prod").await?;
    let staging = cluster(&release, &server, "staging-us", "staging").await?;

    for cluster in [&prod, &staging] {
        let expected = rendered(&tree, cluster)?.len();
        cluster
            .agent
            .wait_status("every rendered object Synced", SYNC, |s| {
                s["state"] == "Synced" && s["counts"]["Synced"] == expected
            })
            .await?;
        let compared = assert_render_equals_applied(&tree, cluster)?;
        assert_eq!(compared, expected);
    }

    // Each cluster got its own rendering: Helm values of the prod customization, ${cluster.name} from
    // values filled in by the agent, another overlay per env; hooks have their meaning.
    let settings = config_map(&prod.kube, "web", "web-settings").await?;
    assert_eq!(data(settings.as_ref(), "tier"), Some("gold"));
    assert_eq!(
        data(settings.as_ref(), "greeting"),
        Some("hello from prod-eu")
    );
    assert_eq!(
        data(settings.as_ref(), "admission"),
        Some("validating-admission-policy")
    );
    let staging_settings = config_map(&staging.kube, "web", "web-settings").await?;
    assert_eq!(data(staging_settings.as_ref(), "tier"), Some("bronze"));
    assert_eq!(
        data(staging_settings.as_ref(), "greeting"),
        Some("hello from staging-us")
    );
    let shop = config_map(&prod.kube, "shop", "shop-settings").await?;
    assert_eq!(data(shop.as_ref(), "queue"), Some("large"));
    let shop_staging = config_map(&staging.kube, "shop", "shop-settings-staging").await?;
    assert_eq!(data(shop_staging.as_ref(), "mode"), Some("base"));
    let rendered_prod = rendered(&tree, &prod)?;
    let names: Vec<&str> = rendered_prod
        .iter()
        .filter_map(|(_, o)| o["metadata"]["name"].as_str())
        .collect();
    assert!(
        names.contains(&"web-migrator") && names.contains(&"web-cache"),
        "{names:?}"
    );
    assert!(
        !names.contains(&"web-smoke-test"),
        "test hooks are dropped: {names:?}"
    );

    // Idle: a minute with no apply and no drift on either cluster.
    let before: Vec<String> = vec![prod.agent.metrics().await?, staging.agent.metrics().await?];
    for (cluster, before) in [&prod, &staging].into_iter().zip(&before) {
        assert!(
            metric_sum(before, "windvane_apply_total") >= rendered(&tree, cluster)?.len() as f64,
            "cluster {}: every object's apply is counted before the idle minute",
            cluster.name
        );
    }
    let idle = Duration::from_secs(60);
    let start = Instant::now();
    while start.elapsed() < idle {
        tokio::time::sleep(Duration::from_secs(5)).await;
        for (cluster, before) in [&prod, &staging].into_iter().zip(&before) {
            let now = cluster.agent.metrics().await?;
            for name in ["windvane_drift_detected_total", "windvane_apply_total"] {
                assert_eq!(
                    metric_sum(&now, name),
                    metric_sum(before, name),
                    "cluster {}: {name} moved while idle",
                    cluster.name
                );
            }
        }
    }

    // Drift on a chart-rendered field is healed.
    let configs: Api<ConfigMap> = Api::namespaced(prod.kube.client(), "web");
    configs
        .patch(
            "web-settings",
            &PatchParams::apply("someone-else").force(),
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "web-settings"}, "data": {"tier": "free"}
            })),
        )
        .await?;
    wait_for("the chart's tier healed", SYNC, || async {
        let cm = config_map(&prod.kube, "web", "web-settings").await?;
        Ok((data(cm.as_ref(), "tier") == Some("gold")).then_some(()))
    })
    .await?;
    let metrics = prod.agent.metrics().await?;
    assert!(
        metric_sum(&metrics, "windvane_drift_reverted_total") >= 1.0,
        "the revert is counted"
    );
    Ok(())
}

/// Same inputs, same bundle: two builds of the tree are byte for byte the same, and the variants fold
/// identical renderings (two overlays and the base give three shop variants; the chart gives two).
#[test]
fn same_inputs_give_the_same_bundle() -> anyhow::Result<()> {
    let tree = tree()?;
    let out = tempfile::TempDir::new()?;
    let first = out.path().join("first.json");
    let second = out.path().join("second.json");
    let source = tree.path().display().to_string();
    windvane(&["build", &source, "-o", &first.display().to_string()])?;
    windvane(&["build", &source, "-o", &second.display().to_string()])?;
    let bytes = std::fs::read(&first)?;
    assert_eq!(bytes, std::fs::read(&second)?);
    let bundle: Value = serde_json::from_slice(&bytes)?;
    let variants = |app: usize| {
        bundle["apps"][app]["rendered"]["variants"]
            .as_array()
            .map(Vec::len)
    };
    assert_eq!(variants(0), Some(3));
    assert_eq!(variants(1), Some(2));
    assert_eq!(
        bundle["apps"][1]["rendered"]["source"]["chart"],
        "charts/web"
    );
    Ok(())
}

/// Without helm the error says which app needs it and how to get it, and nothing is written.
#[test]
fn a_missing_engine_is_a_clear_error() -> anyhow::Result<()> {
    let tree = tree()?;
    let source = tree.path().display().to_string();
    let output = Command::new(binary("windvane")?)
        .args(["build", &source, "-o", "-"])
        .env("PATH", "/nonexistent")
        .env("WINDVANE_KUSTOMIZE", engine("kustomize")?)
        .env_remove("WINDVANE_HELM")
        .output()?;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("app web")
            && stderr.contains("helm is needed")
            && stderr.contains("--helm"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty(), "nothing written on failure");
    Ok(())
}

/// A chart from a chart repository (served over real HTTP) is pulled at build time and pinned by the
/// archive's digest in the bundle; a pin that the pulled chart does not match is refused, nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chart_from_a_repository_is_pinned_by_digest() -> anyhow::Result<()> {
    let tree = tree()?;
    let repo = tempfile::TempDir::new()?;
    let helm = engine("helm")?;
    let run = |args: Vec<String>| -> anyhow::Result<()> {
        let output = Command::new(&helm).args(&args).output()?;
        ensure!(
            output.status.success(),
            "helm {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(())
    };
    // The test's static server serves one level below bundles/ and channels/: the repository lives there.
    let repo_dir = repo.path().join("bundles");
    std::fs::create_dir(&repo_dir)?;
    let chart_dir = tree.path().join("charts/web").display().to_string();
    let shown_dir = repo_dir.display().to_string();
    run(vec![
        "package".into(),
        chart_dir,
        "-d".into(),
        shown_dir.clone(),
    ])?;
    let server = StoreServer::start(repo.path().to_path_buf()).await?;
    let url = format!("{}/bundles", server.url());
    run(vec![
        "repo".into(),
        "index".into(),
        shown_dir,
        "--url".into(),
        url.clone(),
    ])?;
    let archive = std::fs::read(repo_dir.join("web-1.4.0.tgz"))?;
    let digest = format!(
        "sha256:{}",
        windvane_shared::crypto::digest::sha256_hex(&archive)
    );

    let fleet = |pin: &str| {
        format!(
            "fleet: acme\napps:\n  - name: web\n    namespace: web\n    helm:\n      repo: {}\n      \
             chart: web\n      version: 1.4.0\n{pin}",
            url
        )
    };
    tree.write("fleet.yaml", &fleet(&format!("      digest: {digest}\n")))?;
    let source = tree.path().display().to_string();
    let build = {
        let source = source.clone();
        move || windvane(&["build", &source, "-o", "-"])
    };
    let bundle: Value = serde_json::from_str(&tokio::task::spawn_blocking(build.clone()).await??)?;
    let rendered = &bundle["apps"][0]["rendered"];
    assert_eq!(rendered["source"]["digest"], digest.as_str());
    assert_eq!(rendered["source"]["repo"], url.as_str());
    assert_eq!(rendered["source"]["version"], "1.4.0");
    let files: Vec<&str> = rendered["variants"][0]["manifests"]
        .as_array()
        .context("manifests")?
        .iter()
        .filter_map(|m| m["file"].as_str())
        .collect();
    assert!(
        files.contains(&"web (helm): web/templates/config.yaml"),
        "{files:?}"
    );

    let wrong = format!("sha256:{}", "0".repeat(64));
    tree.write("fleet.yaml", &fleet(&format!("      digest: {wrong}\n")))?;
    let error = tokio::task::spawn_blocking(build)
        .await?
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("app web")
            && error.contains(&digest)
            && error.contains("update helm.digest"),
        "{error}"
    );
    Ok(())
}
