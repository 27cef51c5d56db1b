//! Install files as real projects publish them, through a real agent on localkube: the patterns that broke
//! when widely used projects' install files were run through an agent (issue 43), each with a fixture of our
//! own.
//!
//! - A Job with `ttlSecondsAfterFinished: 0` (ingress controllers' and operators' admission-certificate
//!   Jobs) is deleted by Kubernetes' TTL controller when it completes: that is not drift. It ran for its
//!   release and is not run again — not by the healer, not after a restart — until a release changes it. The
//!   same for an object the release marks `windvane.io/run-once: "true"`. Also when it finishes and is removed
//!   during a long first sync (found with all eleven projects of the README's trial in one release): the
//!   Jobs' watch starts before they are applied.
//! - One object refused for a long time (its `failurePolicy: Fail` admission webhook has no backend) is retried
//!   alone with its own back-off: the rest of the release is applied, healed and never sent again meanwhile,
//!   the status says what is retried, why and when next, and once the blocker is gone the object lands
//!   without a new release.

mod fault_support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fault_support::{SYNC, config_map, config_maps_yaml, holds_for};
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use serde_json::{Value, json};
use windvane_tests::fleet::{Agent, AgentOptions, Cluster, FleetTree, Publisher, metric};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::store_server::StoreServer;

const FLEET_YAML: &str = "\
fleet: acme
apps:
  - name: ingress
    path: apps/ingress
";

/// An admission-certificate Job as ingress controllers ship it: removed by Kubernetes as soon as it
/// completes.
fn certgen_job(args: &str) -> String {
    format!(
        r#"apiVersion: batch/v1
kind: Job
metadata: {{name: admission-create, namespace: default}}
spec:
  ttlSecondsAfterFinished: 0
  backoffLimit: 1
  template:
    metadata: {{labels: {{app: admission-create}}}}
    spec:
      restartPolicy: Never
      containers:
        - name: create
          image: registry.invalid/certgen:v1
          args: [{args}]
"#
    )
}

const SETTINGS: &str = r#"apiVersion: v1
kind: ConfigMap
metadata: {name: controller-settings, namespace: default}
data: {allow-snippets: "false"}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: bootstrap-seed
  namespace: default
  annotations: {windvane.io/run-once: "true"}
data: {seed: "1"}
"#;

const JOB: &str = "Job default/admission-create";
const SEED: &str = "ConfigMap default/bootstrap-seed";

/// The message the agent's `/status` gives `object`.
fn message<'a>(status: &'a Value, object: &str) -> Option<&'a str> {
    status["objects"]
        .as_array()?
        .iter()
        .find(|o| o["object"] == object)?["message"]
        .as_str()
}

/// Records the uid of every Job named `name` in `default` that ever exists, from a watch: one uid per run.
fn record_runs(kube: &LocalKube, name: &'static str) -> Arc<Mutex<BTreeMap<String, ()>>> {
    let runs: Arc<Mutex<BTreeMap<String, ()>>> = Arc::default();
    let seen = Arc::clone(&runs);
    let jobs = Api::<Job>::namespaced(kube.client(), "default");
    tokio::spawn(async move {
        let mut stream = watcher(jobs, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = stream.next().await {
            let objects = match event {
                Ok(
                    watcher::Event::Apply(job)
                    | watcher::Event::InitApply(job)
                    | watcher::Event::Delete(job),
                ) => {
                    vec![job]
                }
                _ => Vec::new(),
            };
            for job in objects {
                if job.metadata.name.as_deref() == Some(name)
                    && let Some(uid) = job.metadata.uid
                {
                    seen.lock().expect("lock").insert(uid, ());
                }
            }
        }
    });
    runs
}

fn run_count(runs: &Mutex<BTreeMap<String, ()>>) -> usize {
    runs.lock().expect("lock").len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_removed_by_its_ttl_after_completing_is_not_run_again_until_its_release_changes()
-> anyhow::Result<()> {
    let publisher = Publisher::new(43)?;
    let tree = FleetTree::new()?;
    tree.write("fleet.yaml", FLEET_YAML)?;
    tree.write("apps/ingress/job.yaml", &certgen_job("create"))?;
    tree.write("apps/ingress/settings.yaml", SETTINGS)?;
    publisher.publish(&tree, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "prod-eu");
    let mut cluster = Cluster::start(options).await?;
    let runs = record_runs(&cluster.kube, "admission-create");

    // The Job runs, completes and Kubernetes removes it: the agent reports that, and leaves it so.
    let done = |s: &Value| {
        message(s, JOB).is_some_and(|m| m.starts_with("completed for this release"))
            && s["objects"].as_array().is_some_and(|o| {
                o.iter()
                    .find(|o| o["object"] == JOB)
                    .is_some_and(|o| o["state"] == "Synced")
            })
    };
    cluster
        .agent()?
        .wait_status(
            "the Job completed and removed, reported as done",
            SYNC,
            done,
        )
        .await?;
    let jobs = Api::<Job>::namespaced(cluster.kube.client(), "default");
    assert!(
        jobs.get_opt("admission-create").await?.is_none(),
        "the TTL controller removed it"
    );
    assert_eq!(run_count(&runs), 1);
    holds_for(Duration::from_secs(15), async || {
        Ok(run_count(&runs) == 1 && jobs.get_opt("admission-create").await?.is_none())
    })
    .await
    .map_err(|e| e.context(format!("the Job ran {} times", run_count(&runs))))?;

    // A run-once object is applied once; deleted, it stays deleted (reported), the ordinary one is healed.
    let config_maps = Api::<ConfigMap>::namespaced(cluster.kube.client(), "default");
    config_maps
        .delete("bootstrap-seed", &DeleteParams::default())
        .await?;
    config_maps
        .delete("controller-settings", &DeleteParams::default())
        .await?;
    wait_for("the ordinary ConfigMap healed", SYNC, || async {
        Ok(config_map(&cluster.kube, "default", "controller-settings")
            .await?
            .map(|_| ()))
    })
    .await?;
    cluster
        .agent()?
        .wait_status("the run-once ConfigMap reported as done", SYNC, |s| {
            message(s, SEED).is_some_and(|m| m.contains("windvane.io/run-once"))
        })
        .await?;
    holds_for(Duration::from_secs(5), async || {
        Ok(config_map(&cluster.kube, "default", "bootstrap-seed")
            .await?
            .is_none())
    })
    .await
    .map_err(|e| e.context("the run-once ConfigMap was recreated"))?;

    // A restarted agent remembers: the Job is not run again.
    cluster.stop_agent().await;
    cluster.start_agent().await?;
    cluster
        .agent()?
        .wait_status("the restarted agent reports the Job done", SYNC, |s| {
            s["source"]["appliedSerial"].is_u64() && done(s)
        })
        .await?;
    holds_for(Duration::from_secs(10), async || Ok(run_count(&runs) == 1))
        .await
        .map_err(|e| e.context("the restarted agent ran the Job again"))?;

    // A release that changes the Job runs it again, once.
    tree.write("apps/ingress/job.yaml", &certgen_job("create, --rotate"))?;
    publisher.publish(&tree, "stable")?;
    wait_for("the changed Job ran", SYNC, || async {
        Ok((run_count(&runs) == 2).then_some(()))
    })
    .await?;
    cluster
        .agent()?
        .wait_status("the changed Job completed and removed", SYNC, done)
        .await?;
    holds_for(Duration::from_secs(10), async || Ok(run_count(&runs) == 2))
        .await
        .map_err(|e| e.context(format!("the changed Job ran {} times", run_count(&runs))))?;
    Ok(())
}

/// A validating webhook with `failurePolicy: Fail` for ConfigMaps labelled `blocked`, whose Service has no
/// backend reachable from the API server (localkube refuses to dial it, as a cluster whose webhook Pods are
/// not up): every write of such a ConfigMap is refused.
fn unreachable_webhook() -> (Value, Value) {
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "admission", "namespace": "default"},
        "spec": {"ports": [{"port": 443, "targetPort": 8443}], "selector": {"app": "admission"}},
    });
    let webhook = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "admission"},
        "webhooks": [{
            "name": "validate.admission.example.com",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 2,
            "clientConfig": {"service": {"namespace": "default", "name": "admission", "path": "/validate"}},
            "objectSelector": {"matchLabels": {"blocked": "true"}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                "resources": ["configmaps"]}],
        }],
    });
    (service, webhook)
}

const BLOCKED: &str = r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: ingress-rules
  namespace: default
  labels: {blocked: "true"}
data: {host: example.com}
"#;

/// Applies counted by the agent, by result.
async fn applies(agent: &Agent) -> anyhow::Result<BTreeMap<&'static str, f64>> {
    let text = agent.metrics().await?;
    Ok(["written", "unchanged", "failed"]
        .into_iter()
        .map(|result| {
            let sample = format!("windvane_apply_total{{result=\"{result}\"}}");
            (result, metric(&text, &sample).unwrap_or(0.0))
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_object_refused_by_a_webhook_without_backend_is_retried_alone_and_lands_when_it_returns()
-> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let (service, webhook) = unreachable_webhook();
    let apply = PatchParams::apply("test").force();
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(kube.client(), "default")
        .patch("admission", &apply, &Patch::Apply(&service))
        .await?;
    kube.admission_api("ValidatingWebhookConfiguration")
        .patch("admission", &apply, &Patch::Apply(&webhook))
        .await?;
    let probe: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "ingress-rules", "labels": {"blocked": "true"}},
    }))?;
    let probes = Api::<ConfigMap>::namespaced(kube.client(), "default");
    wait_for("the webhook in force", SYNC, || async {
        Ok(probes
            .patch(
                "ingress-rules",
                &PatchParams::apply("probe").dry_run(),
                &Patch::Apply(&probe),
            )
            .await
            .is_err()
            .then_some(()))
    })
    .await?;

    let publisher = Publisher::new(44)?;
    let tree = FleetTree::new()?;
    tree.write("fleet.yaml", FLEET_YAML)?;
    tree.write(
        "apps/ingress/many.yaml",
        &config_maps_yaml("default", "rule", 40),
    )?;
    tree.write("apps/ingress/blocked.yaml", BLOCKED)?;
    publisher.publish(&tree, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "prod-eu");
    let agent = Agent::start(&kube, &options).await?;

    // Everything else lands; the refused object says why, that it is retried alone, and when next.
    const TARGET: &str = "ConfigMap default/ingress-rules";
    agent
        .wait_status("40 Synced, the refused one retried alone", SYNC, |s| {
            s["counts"]["Synced"] == 40
                && message(s, TARGET).is_some_and(|m| {
                    m.contains("admission") && m.contains("retried alone") && m.contains("next at")
                })
        })
        .await?;
    let text = agent.metrics().await?;
    assert_eq!(
        metric(&text, "windvane_apply_retrying"),
        Some(1.0),
        "{text}"
    );

    // Over a window, only the refused object is sent again: nothing of the rest, written or not.
    let before = applies(&agent).await?;
    holds_for(Duration::from_secs(12), async || {
        let now = applies(&agent).await?;
        Ok(now["unchanged"] == before["unchanged"] && now["written"] == before["written"])
    })
    .await
    .map_err(|e| e.context("the rest of the release was applied again while one object failed"))?;
    let after = applies(&agent).await?;
    assert!(
        after["failed"] > before["failed"],
        "the refused object is retried: {before:?} → {after:?}"
    );

    // The rest is healed as usual meanwhile.
    probes.delete("rule-7", &DeleteParams::default()).await?;
    wait_for("rule-7 healed", SYNC, || async {
        Ok(config_map(&kube, "default", "rule-7").await?.map(|_| ()))
    })
    .await?;

    // The blocker goes: the object lands on its own retry, without a new release.
    kube.admission_api("ValidatingWebhookConfiguration")
        .delete("admission", &DeleteParams::default())
        .await?;
    wait_for("the refused object landed", SYNC, || async {
        Ok(config_map(&kube, "default", "ingress-rules")
            .await?
            .map(|_| ()))
    })
    .await?;
    agent
        .wait_status("everything Synced", SYNC, |s| {
            s["counts"]["Synced"] == 41 && s["state"] == "Synced"
        })
        .await?;
    let text = agent.metrics().await?;
    assert_eq!(metric(&text, "windvane_apply_retrying"), Some(0.0));
    assert_eq!(
        metric(&text, "windvane_release_serial"),
        Some(1.0),
        "no new release"
    );
    Ok(())
}

/// A Deployment as charts render it with no annotations set: `annotations: {}`.
const CHART_DEPLOYMENT: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: controller
  namespace: default
  annotations: {}
spec:
  replicas: 1
  selector: {matchLabels: {app: controller}}
  template:
    metadata:
      annotations: {}
      labels: {app: controller}
    spec:
      containers:
        - name: controller
          image: registry.invalid/controller:v1
          volumeMounts: [{name: tmp, mountPath: /tmp}]
      volumes: [{name: tmp, emptyDir: {}}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_annotations_map_is_no_drift_when_a_controller_annotates_the_object()
-> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(45)?;
    let tree = FleetTree::new()?;
    tree.write("fleet.yaml", FLEET_YAML)?;
    tree.write("apps/ingress/deployment.yaml", CHART_DEPLOYMENT)?;
    publisher.publish(&tree, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "prod-eu");
    let agent = Agent::start(&kube, &options).await?;
    agent
        .wait_status("the Deployment Synced", SYNC, |s| s["state"] == "Synced")
        .await?;
    let deployments =
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(kube.client(), "default");
    wait_for(
        "the Deployment controller's revision annotation",
        SYNC,
        || async {
            let live = deployments.get("controller").await?;
            Ok(live
                .metadata
                .annotations
                .is_some_and(|a| a.contains_key("deployment.kubernetes.io/revision"))
                .then_some(()))
        },
    )
    .await?;
    holds_for(Duration::from_secs(5), async || {
        let status = agent.status().await?;
        let drift = status["drift"].as_array().map_or(0, Vec::len);
        anyhow::ensure!(drift == 0, "false drift: {}", status["drift"]);
        Ok(true)
    })
    .await?;
    let text = agent.metrics().await?;
    assert_eq!(
        metric(&text, "windvane_apply_total{result=\"written\"}"),
        Some(1.0),
        "written once: {text}"
    );
    Ok(())
}

/// A validating webhook at a loopback address that accepts connections and never answers (`failurePolicy:
/// Ignore`, `timeoutSeconds` each): every ConfigMap labelled `slow: "true"` takes that long to create, as on
/// a cluster whose webhook backend hangs.
fn hanging_webhook(port: u16, timeout_seconds: u32) -> String {
    format!(
        r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {{name: hanging}}
webhooks:
  - name: hanging.example.com
    clientConfig: {{url: "https://127.0.0.1:{port}/validate"}}
    rules: [{{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}}]
    objectSelector: {{matchLabels: {{slow: "true"}}}}
    failurePolicy: Ignore
    timeoutSeconds: {timeout_seconds}
    sideEffects: None
    admissionReviewVersions: [v1]
"#
    )
}

/// A ConfigMap in `wave` whose creation waits for the hanging webhook.
fn slow_config_map(wave: i64) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: slow-{wave}\n  namespace: default\n  labels: {{slow: \
         \"true\"}}\n  annotations: {{windvane.io/wave: \"{wave}\"}}\ndata: {{wave: \"{wave}\"}}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_finishes_and_is_removed_during_a_long_first_sync_is_not_run_again()
-> anyhow::Result<()> {
    // Holds every connection open without a word: the API server waits out each webhook call.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let held: Arc<Mutex<Vec<tokio::net::TcpStream>>> = Arc::default();
    let holder = Arc::clone(&held);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            holder.lock().expect("lock").push(stream);
        }
    });
    let publisher = Publisher::new(44)?;
    let tree = FleetTree::new()?;
    tree.write("fleet.yaml", FLEET_YAML)?;
    // The Job first (wave -1, as a pre-install hook), then three waves that take 8 s each to create: the
    // Job completes and Kubernetes removes it long before the first sync ends.
    let job = certgen_job("create").replace(
        "metadata: {name: admission-create, namespace: default}",
        "metadata: {name: admission-create, namespace: default, annotations: {windvane.io/wave: \"-1\"}}",
    );
    tree.write("apps/ingress/job.yaml", &job)?;
    tree.write("apps/ingress/webhook.yaml", &hanging_webhook(port, 8))?;
    for wave in 0..3 {
        tree.write(
            &format!("apps/ingress/slow-{wave}.yaml"),
            &slow_config_map(wave),
        )?;
    }
    publisher.publish(&tree, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "prod-eu");
    let cluster = Cluster::start(options).await?;
    let runs = record_runs(&cluster.kube, "admission-create");

    cluster
        .agent()?
        .wait_status(
            "the first sync done, the Job reported completed and removed",
            Duration::from_secs(180),
            |s| {
                s["enforced"] == true
                    && message(s, JOB).is_some_and(|m| m.starts_with("completed for this release"))
            },
        )
        .await?;
    let jobs = Api::<Job>::namespaced(cluster.kube.client(), "default");
    holds_for(Duration::from_secs(10), async || {
        Ok(run_count(&runs) == 1 && jobs.get_opt("admission-create").await?.is_none())
    })
    .await
    .map_err(|e| {
        e.context(format!(
            "the Job ran {} times (once is right: it finished for this release)",
            run_count(&runs)
        ))
    })?;
    ensure_slow_waves_took_long(&cluster.agent_log())?;
    drop(held);
    Ok(())
}

/// The sync took as long as the webhook made it (else the test proved nothing about a long sync).
fn ensure_slow_waves_took_long(log: &str) -> anyhow::Result<()> {
    // Without the terminal's colour codes, which the log may carry around `=`.
    let mut plain = String::with_capacity(log.len());
    let mut in_escape = false;
    for c in log.chars() {
        match (in_escape, c) {
            (false, '\u{1b}') => in_escape = true,
            (false, c) => plain.push(c),
            (true, 'm') => in_escape = false,
            (true, _) => {}
        }
    }
    let finished = plain
        .lines()
        .find(|line| line.contains("sync finished"))
        .ok_or_else(|| anyhow::anyhow!("no finished sync in the agent's log"))?;
    let elapsed: u64 = finished
        .split("elapsed_ms=")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|ms| ms.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no elapsed_ms in {finished:?}"))?;
    anyhow::ensure!(
        elapsed >= 16_000,
        "the first sync took {elapsed} ms; the hanging webhook should have made it at least 16 s"
    );
    Ok(())
}
