//! Real workloads, through the whole path (tree → signed bundle → agent → localkube), with fixtures of our
//! own modelled on what operator and monitoring projects publish:
//!
//! - a CustomResourceDefinition of several hundred KB (two served versions of a structural schema with
//!   hundreds of documented properties, as large operators ship them) next to a custom resource of it and
//!   ordinary objects;
//! - an aggregated `APIService` (`v1beta1.metrics.example.com`) whose backend Service has no endpoints, in
//!   the same release as ConfigMaps, a Deployment and RBAC: discovery of that group fails on the API server,
//!   and everything else still syncs and heals (the APIService itself is Degraded, naming the reason), with the
//!   agent neither hanging nor restarting;
//! - once settled, a measured idle minute with no apply and no drift;
//! - then drift on an ordinary object healed and counted;
//! - then a release that adds an object of the unavailable group, next to new ordinary objects: only that
//!   object fails (naming the group), the rest applies and heals at once, and the group is asked again only
//!   after a pause — not in a tight loop, and not for the minutes the Kubernetes client retries a 503.

mod fault_support;

use std::time::{Duration, Instant};

use fault_support::{SYNC, config_map, data, plain};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersion, GroupVersionKind};
use serde_json::json;
use windvane_tests::fleet::{
    Agent, AgentOptions, FleetTree, Publisher, metric, metric_sum, object_state,
};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::store_server::StoreServer;

const FLEET_YAML: &str = "\
fleet: acme
apps:
  - name: pipelines
    path: apps/pipelines
  - name: metrics
    path: apps/metrics
";

/// The shape of one generated schema property.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Text,
    Choice(&'static [&'static str]),
    Count(i64, i64),
    Flag,
    Names,
    Labels,
    Quantity,
    Retry,
}

/// The properties of every stage section: (name, shape, what it is).
const FIELDS: &[(&str, Shape, &str)] = &[
    (
        "image",
        Shape::Text,
        "the container image that runs this stage, as a registry reference with a tag or a digest",
    ),
    (
        "imagePullPolicy",
        Shape::Choice(&["Always", "IfNotPresent", "Never"]),
        "when the node pulls the image of this stage",
    ),
    (
        "command",
        Shape::Names,
        "the entrypoint of the stage's container; the image's own entrypoint when empty",
    ),
    (
        "args",
        Shape::Names,
        "arguments to the entrypoint, with $(VAR) references expanded from the stage's environment",
    ),
    (
        "workingDir",
        Shape::Text,
        "the directory the stage's commands run in, inside the shared workspace",
    ),
    (
        "timeoutSeconds",
        Shape::Count(1, 86_400),
        "how long the stage may run before it is stopped and marked failed",
    ),
    (
        "parallelism",
        Shape::Count(1, 64),
        "how many shards of the stage run at the same time",
    ),
    (
        "priority",
        Shape::Count(0, 1_000),
        "the scheduling priority of the stage among the stages waiting for a runner",
    ),
    (
        "skip",
        Shape::Flag,
        "whether the stage is skipped in every run; its dependents then run as if it succeeded",
    ),
    (
        "allowFailure",
        Shape::Flag,
        "whether a failure of the stage still lets the pipeline succeed",
    ),
    (
        "privileged",
        Shape::Flag,
        "whether the stage's container runs privileged; refused by clusters that forbid it",
    ),
    (
        "cacheKey",
        Shape::Text,
        "the key the stage's cache is stored under; files named in it are hashed into the key",
    ),
    (
        "cachePaths",
        Shape::Names,
        "paths of the workspace saved after the stage and restored before its next run",
    ),
    (
        "artifacts",
        Shape::Names,
        "paths of the workspace uploaded as the stage's artifacts when it ends",
    ),
    (
        "needs",
        Shape::Names,
        "the stages that must succeed before this one starts",
    ),
    (
        "nodeSelector",
        Shape::Labels,
        "labels a node must carry to run the stage",
    ),
    (
        "labels",
        Shape::Labels,
        "labels added to the pods of the stage",
    ),
    (
        "annotations",
        Shape::Labels,
        "annotations added to the pods of the stage",
    ),
    (
        "env",
        Shape::Labels,
        "environment variables of the stage's container, by name",
    ),
    (
        "cpu",
        Shape::Quantity,
        "the CPU the stage requests, as a Kubernetes quantity",
    ),
    (
        "memory",
        Shape::Quantity,
        "the memory the stage requests, as a Kubernetes quantity",
    ),
    (
        "ephemeralStorage",
        Shape::Quantity,
        "the scratch space the stage requests, as a Kubernetes quantity",
    ),
    (
        "retry",
        Shape::Retry,
        "how the stage is retried after a failure",
    ),
    (
        "serviceAccountName",
        Shape::Text,
        "the ServiceAccount the stage's pods run as; the pipeline's when empty",
    ),
    (
        "when",
        Shape::Choice(&["OnSuccess", "OnFailure", "Always", "Manual"]),
        "when the stage runs relative to the outcome of the stages it needs",
    ),
];

/// The stage sections of a pipeline's spec: (name, what the stage does).
const SECTIONS: &[(&str, &str)] = &[
    ("checkout", "fetching the sources the pipeline builds"),
    ("lint", "checking the style of the sources"),
    (
        "audit",
        "checking the dependencies of the sources against advisories",
    ),
    ("generate", "generating code from the sources' schemas"),
    ("compile", "compiling the sources"),
    ("unitTest", "running the unit tests"),
    (
        "integrationTest",
        "running the integration tests against throwaway services",
    ),
    ("package", "building the release archives"),
    ("containerize", "building the container images"),
    ("scan", "scanning the images for known vulnerabilities"),
    ("sign", "signing the archives and images"),
    (
        "publish",
        "pushing the images and archives to their registries",
    ),
    ("stage", "deploying the release to the staging environment"),
    ("smokeTest", "probing the staging environment"),
    ("approve", "waiting for a release manager's approval"),
    ("promote", "deploying the release to production"),
    ("notify", "telling the release channels how the run ended"),
];

/// Appends `text` on a line of its own, indented by `depth` levels of two spaces.
fn line(out: &mut String, depth: usize, text: &str) {
    out.extend(std::iter::repeat_n("  ", depth));
    out.push_str(text);
    out.push('\n');
}

/// A YAML double-quoted scalar (JSON's string syntax is YAML's).
fn quoted(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

fn describe(out: &mut String, depth: usize, text: &str) {
    line(out, depth, &format!("description: {}", quoted(text)));
}

/// One property of a stage section, as a schema at `depth`.
fn field(out: &mut String, depth: usize, (name, shape, what): (&str, Shape, &str), section: &str) {
    line(out, depth, &format!("{name}:"));
    let d = depth + 1;
    describe(
        out,
        d,
        &format!(
            "{} of the {section} stage: {what}. A change applies to the runs that start after it; runs \
             already under way keep the value they started with.",
            capitalised(name)
        ),
    );
    match shape {
        Shape::Text => line(out, d, "type: string"),
        Shape::Choice(values) => {
            line(out, d, "type: string");
            line(out, d, &format!("enum: [{}]", values.join(", ")));
        }
        Shape::Count(min, max) => {
            line(out, d, "type: integer");
            line(out, d, "format: int32");
            line(out, d, &format!("minimum: {min}"));
            line(out, d, &format!("maximum: {max}"));
        }
        Shape::Flag => line(out, d, "type: boolean"),
        Shape::Names => {
            line(out, d, "type: array");
            line(out, d, "items: {type: string}");
            line(out, d, "x-kubernetes-list-type: atomic");
        }
        Shape::Labels => {
            line(out, d, "type: object");
            line(out, d, "additionalProperties: {type: string}");
        }
        Shape::Quantity => quantity(out, d),
        Shape::Retry => retry(out, d, section),
    }
}

fn quantity(out: &mut String, depth: usize) {
    line(out, depth, "anyOf: [{type: integer}, {type: string}]");
    line(
        out,
        depth,
        r"pattern: '^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$'",
    );
    line(out, depth, "x-kubernetes-int-or-string: true");
}

fn retry(out: &mut String, depth: usize, section: &str) {
    line(out, depth, "type: object");
    line(out, depth, "properties:");
    for (name, kind, what) in [
        (
            "attempts",
            "integer",
            "how many times a failed run is tried again",
        ),
        (
            "backoff",
            "string",
            "the wait before the first retry, as a duration such as 10s; it doubles after each",
        ),
        (
            "onExitCodes",
            "array",
            "the exit codes that are retried; every non-zero code when empty",
        ),
    ] {
        line(out, depth + 1, &format!("{name}:"));
        describe(
            out,
            depth + 2,
            &format!("Retries of the {section} stage: {what}."),
        );
        line(out, depth + 2, &format!("type: {kind}"));
        if kind == "array" {
            line(out, depth + 2, "items: {type: integer}");
        }
    }
}

fn capitalised(name: &str) -> String {
    let mut chars = name.chars();
    chars
        .next()
        .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

/// The spec of a pipeline: one documented section per stage.
fn spec_schema(out: &mut String, depth: usize) {
    line(out, depth, "spec:");
    describe(
        out,
        depth + 1,
        "The stages of the pipeline and how each runs.",
    );
    line(out, depth + 1, "type: object");
    line(out, depth + 1, "required: [checkout]");
    line(out, depth + 1, "properties:");
    for (section, what) in SECTIONS {
        line(out, depth + 2, &format!("{section}:"));
        describe(out, depth + 3, &format!("The {section} stage, {what}."));
        line(out, depth + 3, "type: object");
        line(out, depth + 3, "properties:");
        for &f in FIELDS {
            field(out, depth + 4, f, section);
        }
    }
}

/// The status the pipeline controller writes.
fn status_schema(out: &mut String, depth: usize) {
    for text in [
        "status:",
        "  description: What the pipeline controller last observed.",
        "  type: object",
        "  properties:",
        "    observedGeneration: {type: integer, format: int64}",
        "    phase: {type: string, enum: [Pending, Running, Succeeded, Failed]}",
        "    conditions:",
        "      type: array",
        "      x-kubernetes-list-type: map",
        "      x-kubernetes-list-map-keys: [type]",
        "      items:",
        "        type: object",
        "        required: [type, status]",
        "        properties:",
        "          type: {type: string}",
        "          status: {type: string, enum: [\"True\", \"False\", Unknown]}",
        "          reason: {type: string}",
        "          message: {type: string}",
        "          lastTransitionTime: {type: string, format: date-time}",
    ] {
        line(out, depth, text);
    }
}

/// One served version of the CRD with the whole schema.
fn version(out: &mut String, name: &str, storage: bool) {
    line(out, 2, &format!("- name: {name}"));
    line(out, 3, "served: true");
    line(out, 3, &format!("storage: {storage}"));
    if !storage {
        line(out, 3, "deprecated: true");
    }
    line(out, 3, "subresources: {status: {}}");
    line(out, 3, "additionalPrinterColumns:");
    line(
        out,
        4,
        "- {name: Phase, type: string, jsonPath: .status.phase}",
    );
    line(
        out,
        4,
        "- {name: Age, type: date, jsonPath: .metadata.creationTimestamp}",
    );
    line(out, 3, "schema:");
    line(out, 4, "openAPIV3Schema:");
    describe(
        out,
        5,
        "Pipeline describes how a project is built, tested and released.",
    );
    line(out, 5, "type: object");
    line(out, 5, "properties:");
    line(out, 6, "apiVersion: {type: string}");
    line(out, 6, "kind: {type: string}");
    line(out, 6, "metadata: {type: object}");
    spec_schema(out, 6);
    status_schema(out, 6);
}

/// `pipelines.ci.example.com`: a CRD of the size large operators ship (two versions of a big schema).
fn pipeline_crd() -> String {
    let mut out = String::from(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: \
         pipelines.ci.example.com\n  annotations: {controller-gen.kubebuilder.io/version: v0.16.0}\nspec:\n  \
         group: ci.example.com\n  names: {kind: Pipeline, listKind: PipelineList, plural: pipelines, \
         singular: pipeline, shortNames: [pl]}\n  scope: Namespaced\n  versions:\n",
    );
    version(&mut out, "v1", true);
    version(&mut out, "v1beta1", false);
    out
}

/// A pipeline of the CRD, with its namespace, a ServiceAccount and a ConfigMap.
const PIPELINES: &str = r#"apiVersion: v1
kind: Namespace
metadata: {name: ci}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: pipeline-runner, namespace: ci}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: runner-defaults, namespace: ci}
data: {concurrency: "4", registry: registry.example.com}
---
apiVersion: ci.example.com/v1
kind: Pipeline
metadata: {name: release-train, namespace: ci}
spec:
  checkout:
    image: registry.example.com/git:2.45
    timeoutSeconds: 300
    retry: {attempts: 3, backoff: 10s, onExitCodes: [128]}
  compile:
    image: registry.example.com/rust:1.85
    needs: [checkout]
    cpu: "2"
    memory: 4Gi
    cachePaths: [target]
  promote:
    when: Manual
    needs: [compile]
    env: {CHANNEL: stable}
"#;

/// A metrics adapter's aggregated API whose backend never comes up (its Service selects no pods), shipped
/// with ordinary objects, as monitoring stacks ship it.
const METRICS: &str = r#"apiVersion: v1
kind: Namespace
metadata: {name: monitoring}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: metrics-adapter, namespace: monitoring}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: metrics-adapter-reader}
rules:
  - {apiGroups: [metrics.example.com], resources: ["*"], verbs: [get, list, watch]}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: adapter-config, namespace: monitoring}
data: {rules.yaml: "- seriesQuery: http_requests_total\n", interval: 30s}
---
apiVersion: v1
kind: Service
metadata: {name: metrics-adapter, namespace: monitoring}
spec:
  selector: {app: metrics-adapter}
  ports: [{name: https, port: 443, targetPort: 6443}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1beta1.metrics.example.com}
spec:
  group: metrics.example.com
  version: v1beta1
  groupPriorityMinimum: 100
  versionPriority: 100
  insecureSkipTLSVerify: true
  service: {name: metrics-adapter, namespace: monitoring, port: 443}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: dashboard, namespace: monitoring}
spec:
  replicas: 1
  selector: {matchLabels: {app: dashboard}}
  template:
    metadata: {labels: {app: dashboard}}
    spec:
      containers: [{name: dashboard, image: registry.example.com/dashboard:3.1}]
"#;

/// An object of the aggregated group, for the release that adds one.
const SCRAPE_TARGET: &str = "\
apiVersion: metrics.example.com/v1beta1
kind: ScrapeTarget
metadata: {name: api, namespace: monitoring}
spec: {port: 8080, path: /metrics}
";

/// New ordinary objects of the same release, one in each app.
const MORE: &str = "\
apiVersion: v1
kind: ConfigMap
metadata: {name: adapter-extra, namespace: monitoring}
data: {added: 'true'}
";

/// Objects of the release: 4 + the CRD in `pipelines`, 7 in `metrics`.
const OBJECTS: u64 = 12;

const APISERVICE: &str = "APIService v1beta1.metrics.example.com";

fn write_tree(tree: &FleetTree, crd: &str) -> anyhow::Result<()> {
    tree.write("fleet.yaml", FLEET_YAML)?;
    tree.write("apps/pipelines/crd.yaml", crd)?;
    tree.write("apps/pipelines/objects.yaml", PIPELINES)?;
    tree.write("apps/metrics/install.yaml", METRICS)?;
    Ok(())
}

/// The API server itself says the aggregated group is unavailable: the APIService is not Available and
/// discovery of `metrics.example.com/v1beta1` fails. Returns the Available condition's reason.
async fn aggregated_group_is_broken(kube: &LocalKube) -> anyhow::Result<String> {
    let services: Api<APIService> = Api::all(kube.client());
    let reason = wait_for("APIService reported unavailable", SYNC, || async {
        let live = services.get("v1beta1.metrics.example.com").await?;
        let available = live
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Available");
        Ok(available.filter(|c| c.status == "False").map(|c| {
            format!(
                "{}: {}",
                c.reason.unwrap_or_default(),
                c.message.unwrap_or_default()
            )
        }))
    })
    .await?;
    // A client that does not retry 503s (kube's default client retries them for minutes).
    let kubeconfig = kube::config::Kubeconfig::read_from(kube.kubeconfig_path())?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    config.default_retry = false;
    let client = kube::Client::try_from(config)?;
    let group = GroupVersion::gv("metrics.example.com", "v1beta1");
    match kube::discovery::pinned_group(&client, &group).await {
        Ok(_) => anyhow::bail!("discovery of metrics.example.com/v1beta1 unexpectedly works"),
        Err(error) => Ok(format!("{reason}; discovery: {error}")),
    }
}

/// The custom resource is stored as published: the fields the schema declares are kept.
async fn pipeline_is_stored(kube: &LocalKube) -> anyhow::Result<()> {
    let gvk = GroupVersionKind::gvk("ci.example.com", "v1", "Pipeline");
    let pipelines: Api<DynamicObject> =
        Api::namespaced_with(kube.client(), "ci", &ApiResource::from_gvk(&gvk));
    let live = pipelines.get("release-train").await?;
    assert_eq!(
        live.data["spec"]["compile"]["memory"],
        json!("4Gi"),
        "a declared field survives the schema's pruning"
    );
    assert_eq!(live.data["spec"]["checkout"]["retry"]["attempts"], json!(3));
    Ok(())
}

/// A minute of idling: every few seconds, no apply and no drift since `before`.
async fn idle_minute(agent: &Agent) -> anyhow::Result<()> {
    let before = agent.metrics().await?;
    let applies = metric_sum(&before, "windvane_apply_total");
    assert!(
        applies >= OBJECTS as f64,
        "every object's apply is counted before the idle minute (windvane_apply_total = {applies})\n{before}"
    );
    assert!(
        before.contains("# TYPE windvane_drift_detected_total counter"),
        "the drift counter is exposed"
    );
    let drifts = metric_sum(&before, "windvane_drift_detected_total");
    let window = Duration::from_secs(60);
    let start = Instant::now();
    let mut samples = 0;
    while start.elapsed() < window {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let now = agent.metrics().await?;
        assert_eq!(
            metric_sum(&now, "windvane_apply_total"),
            applies,
            "an apply while idle, {:?} in",
            start.elapsed()
        );
        assert_eq!(
            metric_sum(&now, "windvane_drift_detected_total"),
            drifts,
            "drift detected while idle, {:?} in",
            start.elapsed()
        );
        samples += 1;
    }
    eprintln!(
        "idle minute: {samples} samples, windvane_apply_total stayed {applies}, drift {drifts}"
    );
    Ok(())
}

/// Another manager takes a field of an ordinary object of the release with the broken group; the agent
/// puts it back and counts the revert.
async fn drift_is_healed(kube: &LocalKube, agent: &Agent) -> anyhow::Result<()> {
    let reverted = |text: &str| metric(text, "windvane_drift_reverted_total").unwrap_or(-1.0);
    let before = reverted(&agent.metrics().await?);
    assert!(before >= 0.0, "windvane_drift_reverted_total is exposed");
    Api::<ConfigMap>::namespaced(kube.client(), "monitoring")
        .patch(
            "adapter-config",
            &PatchParams::apply("someone-else").force(),
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "adapter-config", "namespace": "monitoring"},
                "data": {"interval": "1s"},
            })),
        )
        .await?;
    let started = Instant::now();
    wait_for("adapter-config interval healed", SYNC, || async {
        let cm = config_map(kube, "monitoring", "adapter-config").await?;
        Ok((data(cm.as_ref(), "interval") == Some("30s")).then_some(()))
    })
    .await?;
    eprintln!("drift healed in {:?}", started.elapsed());
    wait_for("the revert counted", SYNC, || async {
        Ok((reverted(&agent.metrics().await?) >= before + 1.0).then_some(()))
    })
    .await
}

/// The agent's warnings that a group is unavailable.
fn unavailable_warnings(agent: &Agent) -> usize {
    plain(&agent.process.log())
        .lines()
        .filter(|l| {
            l.contains("API group unavailable") && l.contains("metrics.example.com/v1beta1")
        })
        .count()
}

/// A release adds an object of the unavailable group and ordinary objects: the ordinary ones apply well
/// before the Kubernetes client would have given up retrying the group's 503s, the other object fails
/// naming its group, drift is still healed, and the group is not asked in a loop.
async fn an_object_of_the_broken_group_holds_back_only_itself(
    kube: &LocalKube,
    agent: &Agent,
    publisher: &Publisher,
    tree: &FleetTree,
) -> anyhow::Result<()> {
    let started = Instant::now();
    tree.write("apps/metrics/targets.yaml", SCRAPE_TARGET)?;
    tree.write("apps/metrics/extra.yaml", MORE)?;
    tree.write(
        "apps/pipelines/extra.yaml",
        &MORE
            .replace("adapter-extra", "runner-extra")
            .replace("monitoring", "ci"),
    )?;
    publisher.publish(tree, "stable")?;
    let fast = Duration::from_secs(45);
    let target = "ScrapeTarget monitoring/api";
    let status = agent
        .wait_status(
            "the new objects Synced, the ScrapeTarget Failed",
            fast,
            |s| {
                s["counts"]["Synced"] == OBJECTS + 1
                    && s["counts"]["Failed"] == 1
                    && object_state(s, target) == Some("Failed")
            },
        )
        .await?;
    let message = status["objects"]
        .as_array()
        .and_then(|o| o.iter().find(|x| x["object"] == target))
        .map(|x| x["message"].to_string())
        .unwrap_or_default();
    eprintln!(
        "{:?}: release 2 applied; {target}: {message}",
        started.elapsed()
    );
    assert!(message.contains("metrics.example.com/v1beta1"), "{message}");
    for (namespace, name) in [("monitoring", "adapter-extra"), ("ci", "runner-extra")] {
        let cm = config_map(kube, namespace, name).await?;
        assert_eq!(
            data(cm.as_ref(), "added"),
            Some("true"),
            "{namespace}/{name}"
        );
    }
    drift_is_healed(kube, agent).await?;
    let warnings = unavailable_warnings(agent);
    let bound =
        started.elapsed().as_secs() / windvane_agent::kube::cluster::UNAVAILABLE_FOR.as_secs() + 2;
    eprintln!(
        "{:?}: {warnings} unavailable-group warnings",
        started.elapsed()
    );
    assert!(
        (1..=bound as usize).contains(&warnings),
        "{warnings} warnings about the group in {:?}",
        started.elapsed()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_crd_and_a_broken_aggregated_api_sync_idle_and_heal() -> anyhow::Result<()> {
    let crd = pipeline_crd();
    assert!(
        (300_000..=400_000).contains(&crd.len()),
        "the CRD is {} bytes",
        crd.len()
    );
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(47)?;
    let tree = FleetTree::new()?;
    write_tree(&tree, &crd)?;
    publisher.publish(&tree, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "prod-eu");
    let started = Instant::now();
    let mut agent = Agent::start(&kube, &options).await?;
    let pid = agent.process.pid();

    // Everything syncs; the APIService itself is Degraded (its backend never comes up), and says why.
    let status = agent
        .wait_status(
            "every other object Synced, the APIService Degraded",
            SYNC,
            |s| {
                s["state"] == "Degraded"
                    && s["counts"]["Synced"] == OBJECTS - 1
                    && object_state(s, APISERVICE) == Some("Degraded")
            },
        )
        .await?;
    let apiservice_message = status["objects"]
        .as_array()
        .and_then(|o| o.iter().find(|x| x["object"] == APISERVICE))
        .map(|x| x["message"].to_string())
        .unwrap_or_default();
    assert!(
        apiservice_message.contains("MissingEndpoints"),
        "{apiservice_message}"
    );
    eprintln!(
        "Synced {OBJECTS} objects (CRD of {} bytes) in {:?}; {APISERVICE}: {:?}",
        crd.len(),
        started.elapsed(),
        object_state(&status, APISERVICE)
    );
    pipeline_is_stored(&kube).await?;
    let reason = aggregated_group_is_broken(&kube).await?;
    eprintln!(
        "{:?}: the API server reports the group unavailable: {reason}",
        started.elapsed()
    );
    let status = agent.status().await?;
    eprintln!(
        "{APISERVICE} once unavailable: {}",
        status["objects"]
            .as_array()
            .and_then(|o| o.iter().find(|x| x["object"] == APISERVICE))
            .cloned()
            .unwrap_or_default()
    );

    idle_minute(&agent).await?;
    eprintln!("{:?}: idle minute over", started.elapsed());
    drift_is_healed(&kube, &agent).await?;
    an_object_of_the_broken_group_holds_back_only_itself(&kube, &agent, &publisher, &tree).await?;

    assert!(agent.process.is_running(), "the agent is still running");
    assert_eq!(agent.process.pid(), pid, "the agent never restarted");
    let log = plain(&agent.process.log());
    assert!(
        !log.contains("panicked"),
        "the agent panicked:\n{}",
        log.lines().rev().take(40).collect::<Vec<_>>().join("\n")
    );
    eprintln!(
        "agent log lines naming metrics.example.com: {}",
        log.lines()
            .filter(|l| l.contains("metrics.example.com"))
            .count()
    );
    Ok(())
}
