//! The deploy manifests against a real API server (localkube).
//!
//! 1. Everything under `deploy/` is accepted by a server-side dry run, with no Pod Security warning: each
//!    kustomization (the bases, the overlays), each component on its base (alone and all together), every
//!    plain manifest no kustomization uses, and the example fleet rendered by `windvane render`. Every YAML
//!    file there must be one of those, so a new file cannot slip by untested. The agent configs those builds
//!    carry are started by the real agent, and the server's settings by the real server.
//! 2. The agent installed from `deploy/agent` and run as its ServiceAccount — a TokenRequest token in a
//!    kubeconfig without client certificates, the config file from the ConfigMap — syncs a release (a Namespace,
//!    a ConfigMap, a Deployment and a cluster-scoped ClusterRole), takes the Lease, keeps its state Secrets,
//!    enrols and heartbeats, emits Events and heals drift; SubjectAccessReviews show it holds exactly the
//!    rights the docs name.
//! 3. With `components/narrow-rbac`, the agent may write exactly the kinds the component lists; objects of
//!    other kinds are refused by its allowlist, and — should the allowlist be widened — by the API server,
//!    while the rest of the release applies.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tempfile::TempDir;
use windvane_shared::text::yaml::{YamlLimits, documents_to_json};
use windvane_tests::fleet::{
    AGENT_NAMESPACE, Agent, AgentOptions, FleetTree, Publisher, object_state,
};
use windvane_tests::localkube::{LocalKube, binary_path};
use windvane_tests::poll::wait_for;
use windvane_tests::process::{ChildProcess, binary, tail};
use windvane_tests::server::SourceServer;

/// Deadline for a sync, a heal or a pod to appear, on a loaded machine.
const WAIT: Duration = Duration::from_secs(60);
/// The agent's ServiceAccount, as the API server names it.
const AGENT_USER: &str = "system:serviceaccount:windvane-system:windvane-agent";
const FIELD_MANAGER: &str = "deploy-manifests-test";

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// `kubectl` of the localkube, with stdin from `input`; fails with kubectl's output unless it succeeds.
/// Returns (stdout, stderr).
fn kubectl(
    kube: &LocalKube,
    args: &[&str],
    input: Option<&str>,
) -> anyhow::Result<(String, String)> {
    let mut command = kube.kubectl(args);
    command
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().context("starting kubectl")?;
    if let Some(input) = input {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin is piped");
        stdin.write_all(input.as_bytes())?;
    }
    let output = child.wait_with_output()?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    ensure!(
        output.status.success(),
        "kubectl {} failed ({}):\n{stderr}\n{stdout}",
        args.join(" "),
        output.status
    );
    Ok((stdout, stderr))
}

/// `to` as a path relative to the directory `from` (both absolute): kustomize accepts no absolute paths.
fn relative_path(from: &Path, to: &Path) -> PathBuf {
    let common = from
        .components()
        .zip(to.components())
        .take_while(|(a, b)| a == b)
        .count();
    let mut path = PathBuf::new();
    for _ in from.components().skip(common) {
        path.push("..");
    }
    path.extend(to.components().skip(common));
    path
}

/// Writes a kustomization in `dir` that builds `base` with `components`.
fn write_kustomization(dir: &Path, base: &Path, components: &[&Path]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let dir = dir.canonicalize()?;
    let components: Vec<PathBuf> = components.iter().map(|c| relative_path(&dir, c)).collect();
    std::fs::write(
        dir.join("kustomization.yaml"),
        json!({
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [relative_path(&dir, base)],
            "components": components,
        })
        .to_string(),
    )?;
    Ok(())
}

/// `kubectl kustomize DIR`.
fn kustomize(kube: &LocalKube, dir: &Path) -> anyhow::Result<String> {
    let dir = dir.display().to_string();
    Ok(kubectl(kube, &["kustomize", &dir], None)?.0)
}

/// The documents of a YAML stream, as JSON.
fn documents(yaml: &str, name: &str) -> anyhow::Result<Vec<Value>> {
    Ok(documents_to_json(yaml, name, YamlLimits::default())?
        .into_iter()
        .map(|(_, v)| v)
        .collect())
}

fn is_kind(object: &Value, kind: &str) -> bool {
    object["kind"] == kind
}

/// The object of `kind` named `name` in a list of objects.
fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> anyhow::Result<&'a Value> {
    objects
        .iter()
        .find(|o| is_kind(o, kind) && o["metadata"]["name"] == name)
        .with_context(|| format!("no {kind} {name} in the manifests"))
}

/// Server-side applies `objects` for real (as one JSON List).
fn apply(kube: &LocalKube, objects: &[Value]) -> anyhow::Result<String> {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects}).to_string();
    Ok(kubectl(
        kube,
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager",
            FIELD_MANAGER,
            "-f",
            "-",
        ],
        Some(&list),
    )?
    .0)
}

/// Server-side dry-runs a YAML stream: the API server must accept every object, and Pod Security must not
/// warn about any pod template. Namespaces of the stream are created for real first, since a dry run creates
/// nothing for the objects inside them.
fn dry_run(kube: &LocalKube, name: &str, yaml: &str) -> anyhow::Result<()> {
    let objects = documents(yaml, name)?;
    ensure!(!objects.is_empty(), "{name}: no objects");
    let namespaces: Vec<Value> = objects
        .iter()
        .filter(|o| is_kind(o, "Namespace"))
        .cloned()
        .collect();
    if !namespaces.is_empty() {
        apply(kube, &namespaces).with_context(|| format!("{name}: creating its namespaces"))?;
    }
    let (stdout, stderr) = kubectl(
        kube,
        &[
            "apply",
            "--server-side",
            "--dry-run=server",
            "--field-manager",
            FIELD_MANAGER,
            "-f",
            "-",
        ],
        Some(yaml),
    )
    .with_context(|| format!("{name}: server-side dry run"))?;
    let accepted = stdout
        .lines()
        .filter(|l| l.ends_with("(server dry run)"))
        .count();
    ensure!(
        accepted == objects.len(),
        "{name}: {} objects, {accepted} accepted:\n{stdout}",
        objects.len()
    );
    ensure!(
        !stderr.contains("PodSecurity"),
        "{name}: Pod Security warnings:\n{stderr}"
    );
    Ok(())
}

/// A kustomization file's kind and the files it names (resources that are files, patches, generator files);
/// directories it names are other kustomizations or components.
fn kustomization(dir: &Path) -> anyhow::Result<(String, BTreeSet<PathBuf>)> {
    let path = dir.join("kustomization.yaml");
    let text = std::fs::read_to_string(&path)?;
    let doc = documents(&text, &path.display().to_string())?
        .pop()
        .with_context(|| format!("{} is empty", path.display()))?;
    let kind = doc["kind"].as_str().unwrap_or("Kustomization").to_owned();
    let mut used = BTreeSet::new();
    let strings = |value: &Value| -> Vec<String> {
        value
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut names = strings(&doc["resources"]);
    names.extend(strings(&doc["patchesStrategicMerge"]));
    for patch in doc["patches"].as_array().into_iter().flatten() {
        names.extend(patch["path"].as_str().map(str::to_owned));
    }
    for generator in ["configMapGenerator", "secretGenerator"] {
        for entry in doc[generator].as_array().into_iter().flatten() {
            for file in strings(&entry["files"]) {
                // `key=path` names the key the file's content goes under.
                let file = file.split_once('=').map_or(file.as_str(), |(_, p)| p);
                names.push(file.to_owned());
            }
        }
    }
    for name in names {
        let path = dir.join(&name);
        if path.is_file() {
            used.insert(path.canonicalize()?);
        }
    }
    Ok((kind, used))
}

/// Under `dir` (the example fleet and the Helm charts apart: `deploy_charts.rs` holds the charts to what the
/// kustomizations here install): into `out` every directory that holds a `kustomization.yaml`, into
/// `yaml` every other YAML file.
fn walk(dir: &Path, out: &mut Vec<PathBuf>, yaml: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.path());
    for entry in entries {
        let path = entry.path();
        if path.is_dir() {
            if path.ends_with("examples/fleet") || path.ends_with("charts") {
                continue;
            }
            walk(&path, out, yaml)?;
        } else if path.file_name().is_some_and(|n| n == "kustomization.yaml") {
            out.push(dir.to_path_buf());
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            yaml.push(path.canonicalize()?);
        }
    }
    Ok(())
}

/// What must pass the dry run: (name, YAML stream) for every kustomize build, plain manifest and the
/// rendered example fleet.
fn everything_under_deploy(
    kube: &LocalKube,
    scratch: &Path,
) -> anyhow::Result<Vec<(String, String)>> {
    let deploy = deploy_dir().canonicalize()?;
    let (mut dirs, mut yaml_files) = (Vec::new(), Vec::new());
    walk(&deploy, &mut dirs, &mut yaml_files)?;
    let mut used = BTreeSet::new();
    let mut bases: BTreeMap<PathBuf, Vec<PathBuf>> = BTreeMap::new();
    let mut builds = Vec::new();
    let relative = |p: &Path| p.strip_prefix(&deploy).unwrap_or(p).display().to_string();
    for dir in &dirs {
        let (kind, files) = kustomization(dir)?;
        used.extend(files);
        if kind == "Component" {
            // A component is built on the nearest kustomization above it.
            let base = dir
                .ancestors()
                .skip(1)
                .find(|d| dirs.contains(&d.to_path_buf()))
                .with_context(|| format!("component {} has no base above it", dir.display()))?;
            bases
                .entry(base.to_path_buf())
                .or_default()
                .push(dir.clone());
        } else {
            builds.push((
                format!("kustomize {}", relative(dir)),
                kustomize(kube, dir)?,
            ));
        }
    }
    ensure!(
        builds.len() >= 3 && !bases.is_empty(),
        "expected the agent and server bases, an overlay and components; found {dirs:?}"
    );
    for (n, (base, components)) in bases.iter().enumerate() {
        let mut sets: Vec<Vec<&PathBuf>> = components.iter().map(|c| vec![c]).collect();
        if components.len() > 1 {
            sets.push(components.iter().collect());
        }
        for (m, set) in sets.iter().enumerate() {
            let dir = scratch.join(format!("components-{n}-{m}"));
            let paths: Vec<&Path> = set.iter().map(|c| c.as_path()).collect();
            write_kustomization(&dir, base, &paths)?;
            let names: Vec<String> = set.iter().map(|c| relative(c)).collect();
            builds.push((
                format!("kustomize {} + {}", relative(base), names.join(" + ")),
                kustomize(kube, &dir)?,
            ));
        }
    }
    for file in yaml_files {
        if used.contains(&file) || file.ends_with("kustomization.yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&file)?;
        let objects = documents(&text, &file.display().to_string())?;
        ensure!(
            !objects.is_empty()
                && objects
                    .iter()
                    .all(|o| o["apiVersion"].is_string() && o["kind"].is_string()),
            "{} is neither used by a kustomization nor a Kubernetes manifest",
            file.display()
        );
        builds.push((format!("plain {}", relative(&file)), text));
    }
    // The example fleet is a Windvane source tree: what a production EU cluster would apply.
    let render = Command::new(binary("windvane")?)
        .arg("render")
        .arg(deploy.join("examples/fleet"))
        .args([
            "--cluster",
            "prod-eu",
            "--label",
            "env=prod",
            "--label",
            "region=eu",
        ])
        .output()?;
    ensure!(
        render.status.success(),
        "windvane render: {}",
        String::from_utf8_lossy(&render.stderr)
    );
    builds.push((
        "windvane render examples/fleet (prod-eu)".to_owned(),
        String::from_utf8(render.stdout)?,
    ));
    Ok(builds)
}

/// Starts `windvane-agent run` with an agent config file from the manifests, overriding only what points
/// into the pod (the key and token files) and the admin port, and waits until it resolved every setting and
/// serves its admin endpoints: the file is one the agent accepts.
async fn agent_accepts_config(
    kube: &LocalKube,
    config: &str,
    scratch: &Path,
    n: usize,
) -> anyhow::Result<()> {
    let file = scratch.join(format!("agent-config-{n}.yaml"));
    std::fs::write(&file, config)?;
    let publisher = Publisher::new(60)?;
    let token = scratch.join("token");
    std::fs::write(&token, "token\n")?;
    let args: Vec<String> = [
        "run",
        "--config",
        &file.display().to_string(),
        "--trusted-key",
        &publisher.public_key_path().display().to_string(),
        "--registration-token-file",
        &token.display().to_string(),
        "--admin-listen",
        "127.0.0.1:0",
        "--kubeconfig",
        &kube.kubeconfig_path().display().to_string(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let process = ChildProcess::start(
        "windvane-agent",
        &binary("windvane-agent")?,
        &args,
        &[],
        &scratch.join(format!("agent-config-{n}.log")),
    )?;
    wait_for("the agent to accept its config", WAIT, || async {
        let log = process.log();
        ensure!(
            !log.contains("error:"),
            "the agent refused {config}:\n{log}"
        );
        Ok(log.contains("admin server listening").then_some(()))
    })
    .await
    .with_context(|| tail(&process.log(), 20))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_manifest_under_deploy_passes_a_server_side_dry_run() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let scratch = TempDir::new()?;
    let builds = everything_under_deploy(&kube, scratch.path())?;

    // Pod Security is enforced in the agent's namespace, so "no warning" below means something.
    let agent_base = builds
        .iter()
        .find(|(name, _)| name == "kustomize agent")
        .context("no build of deploy/agent")?;
    let agent_objects = documents(&agent_base.1, &agent_base.0)?;
    apply(
        &kube,
        &[find(&agent_objects, "Namespace", AGENT_NAMESPACE)?.clone()],
    )?;
    let privileged = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "privileged", "namespace": AGENT_NAMESPACE},
        "spec": {"containers": [{"name": "c", "image": "busybox", "securityContext": {"privileged": true}}]},
    })
    .to_string();
    let refused = kubectl(
        &kube,
        &["apply", "--server-side", "--dry-run=server", "-f", "-"],
        Some(&privileged),
    );
    ensure!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("violates PodSecurity")),
        "a privileged pod in {AGENT_NAMESPACE} must be refused by Pod Security: {refused:?}"
    );

    for (name, yaml) in &builds {
        dry_run(&kube, name, yaml)?;
    }

    // Every agent config the builds carry is one the agent starts with.
    let configs: BTreeSet<String> = builds
        .iter()
        .filter_map(|(n, y)| documents(y, n).ok())
        .flatten()
        .filter(|o| is_kind(o, "ConfigMap"))
        .filter_map(|o| o["data"]["agent.yaml"].as_str().map(str::to_owned))
        .collect();
    ensure!(
        configs.len() >= 2,
        "expected the base's and the overlay's agent configs"
    );
    for (n, config) in configs.iter().enumerate() {
        agent_accepts_config(&kube, config, scratch.path(), n).await?;
    }

    // The server starts with the settings and notifications of deploy/source-server.
    let server_objects = documents(
        &builds
            .iter()
            .find(|(name, _)| name == "kustomize source-server")
            .context("no build of deploy/source-server")?
            .1,
        "deploy/source-server",
    )?;
    let notifications = scratch.path().join("notifications.yaml");
    std::fs::write(
        &notifications,
        find(
            &server_objects,
            "ConfigMap",
            "windvane-server-notifications",
        )?["data"]["notifications.yaml"]
            .as_str()
            .context("no notifications.yaml")?,
    )?;
    let mut args = vec![
        "--notifications".to_owned(),
        notifications.display().to_string(),
    ];
    for (key, value) in find(&server_objects, "ConfigMap", "windvane-server-settings")?["data"]
        .as_object()
        .context("no settings")?
    {
        // WINDVANE_MAX_CLOCK_SKEW → --max-clock-skew, as every server flag reads its variable.
        let flag = key
            .strip_prefix("WINDVANE_")
            .with_context(|| format!("setting {key} is not a WINDVANE_ variable"))?
            .to_lowercase()
            .replace('_', "-");
        args.push(format!("--{flag}"));
        args.push(
            value
                .as_str()
                .context("a setting is not a string")?
                .to_owned(),
        );
    }
    let store = TempDir::new()?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    SourceServer::start(store.path(), &args).await?;
    Ok(())
}

// ---- the agent as its ServiceAccount ----

/// Mints a token for the agent's ServiceAccount (TokenRequest API) and writes a kubeconfig that uses it and
/// nothing else: the localkube's server and CA, no client certificate.
async fn agent_kubeconfig(kube: &LocalKube, dir: &Path) -> anyhow::Result<PathBuf> {
    let accounts: Api<ServiceAccount> = Api::namespaced(kube.client(), AGENT_NAMESPACE);
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}}))?;
    let token = accounts
        .create_token_request("windvane-agent", &PostParams::default(), &request)
        .await?
        .status
        .context("the TokenRequest has no status")?
        .token;
    let admin = kube::config::Kubeconfig::read_from(kube.kubeconfig_path())?;
    let cluster = admin
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .context("the localkube kubeconfig names no cluster")?;
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "localkube", "cluster": cluster}],
        "users": [{"name": "windvane-agent", "user": {"token": token}}],
        "contexts": [{"name": "windvane-agent", "context": {"cluster": "localkube", "user": "windvane-agent"}}],
        "current-context": "windvane-agent",
    });
    let path = dir.join("agent.kubeconfig");
    std::fs::write(&path, serde_json::to_vec_pretty(&config)?)?;
    // The kubeconfig authenticates as the ServiceAccount, not as an administrator.
    let whoami = Command::new(binary_path()?)
        .args([
            "kubectl",
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ])
        .arg("--kubeconfig")
        .arg(&path)
        .output()?;
    ensure!(
        String::from_utf8_lossy(&whoami.stdout) == AGENT_USER,
        "the token authenticates as {:?} ({})",
        String::from_utf8_lossy(&whoami.stdout),
        String::from_utf8_lossy(&whoami.stderr)
    );
    Ok(path)
}

/// One access check: `verb` on `group/resource` (cluster-wide when `namespace` is None), or on a non-resource
/// URL when `resource` starts with `/`.
#[derive(Debug, Clone, Copy)]
struct Access<'a> {
    verb: &'a str,
    group: &'a str,
    resource: &'a str,
    namespace: Option<&'a str>,
    name: Option<&'a str>,
}

const fn access<'a>(verb: &'a str, group: &'a str, resource: &'a str) -> Access<'a> {
    Access {
        verb,
        group,
        resource,
        namespace: None,
        name: None,
    }
}

impl<'a> Access<'a> {
    const fn in_ns(mut self, namespace: &'a str) -> Self {
        self.namespace = Some(namespace);
        self
    }

    const fn named(mut self, name: &'a str) -> Self {
        self.name = Some(name);
        self
    }
}

/// Whether the agent's ServiceAccount may do `access`, by a SubjectAccessReview.
async fn agent_may(kube: &LocalKube, access: Access<'_>) -> anyhow::Result<bool> {
    let attributes = if access.resource.starts_with('/') {
        json!({"nonResourceAttributes": {"verb": access.verb, "path": access.resource}})
    } else {
        json!({"resourceAttributes": {
            "verb": access.verb, "group": access.group, "resource": access.resource,
            "namespace": access.namespace, "name": access.name,
        }})
    };
    let mut spec = json!({
        "user": AGENT_USER,
        "groups": ["system:serviceaccounts", "system:serviceaccounts:windvane-system", "system:authenticated"],
    });
    spec.as_object_mut()
        .expect("an object")
        .extend(attributes.as_object().expect("an object").clone());
    let review: SubjectAccessReview = serde_json::from_value(json!({"spec": spec}))?;
    let answer = Api::<SubjectAccessReview>::all(kube.client())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Checks that the agent may do everything in `allowed` and nothing in `denied`; the error lists every
/// mismatch.
async fn expect_rights(
    kube: &LocalKube,
    allowed: &[Access<'_>],
    denied: &[Access<'_>],
) -> anyhow::Result<()> {
    let mut wrong = Vec::new();
    for (expected, list) in [(true, allowed), (false, denied)] {
        for &access in list {
            if agent_may(kube, access).await? != expected {
                wrong.push(format!(
                    "{} {access:?}",
                    if expected { "cannot" } else { "can" }
                ));
            }
        }
    }
    ensure!(
        wrong.is_empty(),
        "the agent's rights differ from the docs:\n{}",
        wrong.join("\n")
    );
    Ok(())
}

/// Rights the agent needs in every variant: its Lease and state Secrets in its namespace, Events anywhere,
/// discovery.
const OWN_RIGHTS: &[Access<'static>] = &[
    access("create", "coordination.k8s.io", "leases").in_ns(AGENT_NAMESPACE),
    access("get", "coordination.k8s.io", "leases")
        .in_ns(AGENT_NAMESPACE)
        .named("windvane-agent"),
    access("update", "coordination.k8s.io", "leases")
        .in_ns(AGENT_NAMESPACE)
        .named("windvane-agent"),
    access("get", "", "secrets").in_ns(AGENT_NAMESPACE),
    access("list", "", "secrets").in_ns(AGENT_NAMESPACE),
    access("create", "", "secrets").in_ns(AGENT_NAMESPACE),
    access("update", "", "secrets").in_ns(AGENT_NAMESPACE),
    access("delete", "", "secrets").in_ns(AGENT_NAMESPACE),
    access("create", "events.k8s.io", "events").in_ns("default"),
    access("patch", "events.k8s.io", "events").in_ns("shop"),
    access("get", "", "/apis"),
    access("get", "", "/api/v1"),
];

/// Rights the agent never holds: it writes a release's objects only with server-side apply (its own state Secrets
/// it creates and replaces), and its Lease only under its name.
const NEVER: &[Access<'static>] = &[
    access("update", "", "configmaps").in_ns("default"),
    access("update", "apps", "deployments"),
    access("deletecollection", "", "configmaps").in_ns("default"),
    access("impersonate", "", "users"),
    access("impersonate", "", "serviceaccounts"),
    access("update", "coordination.k8s.io", "leases")
        .in_ns(AGENT_NAMESPACE)
        .named("another-lease"),
    access("update", "events.k8s.io", "events").in_ns("default"),
    access("get", "", "/logs"),
];

const FLEET_YAML: &str = "\
fleet: acme
apps:
  - name: shop
    path: apps/shop
    policy: {prune: true}
";

/// A Namespace, a ConfigMap, a Deployment and a cluster-scoped ClusterRole that grants more than the agent
/// holds itself (so writing it needs `escalate`).
const SHOP: &str = "\
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: shop}
data:
  greeting: 'hello from ${cluster.name}'
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: registry.example.com/web:1.0}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: shop-operator}
rules:
  - apiGroups: ['']
    resources: [configmaps]
    verbs: ['*']
";

const NAMESPACE: &str = "Namespace shop";
const CONFIG_MAP: &str = "ConfigMap shop/settings";
const DEPLOYMENT: &str = "Deployment shop/web";
const CLUSTER_ROLE: &str = "ClusterRole shop-operator";

/// Installs `manifests` for real, waits for the agent DaemonSet's pod (admitted by the namespace's
/// "restricted" Pod Security and bound to the node), and publishes the shop release on a real source server.
async fn install_and_publish(
    kube: &LocalKube,
    manifests: &[Value],
    seed: u8,
) -> anyhow::Result<(Publisher, SourceServer)> {
    apply(kube, manifests)?;
    let pods: Api<Pod> = Api::namespaced(kube.client(), AGENT_NAMESPACE);
    wait_for("the agent DaemonSet's pod", WAIT, || async {
        let list = pods
            .list(&ListParams::default().labels("app.kubernetes.io/name=windvane-agent"))
            .await?;
        Ok((!list.items.is_empty()).then_some(()))
    })
    .await?;
    let publisher = Publisher::new(seed)?;
    publisher.publish(&shop_tree(SHOP)?, "stable")?;
    let server = SourceServer::start(&publisher.store(), &[]).await?;
    Ok((publisher, server))
}

/// The fleet tree of the shop app with `objects` as its manifests.
fn shop_tree(objects: &str) -> anyhow::Result<FleetTree> {
    let tree = FleetTree::new()?;
    tree.write("fleet.yaml", FLEET_YAML)?;
    tree.write("apps/shop/objects.yaml", objects)?;
    Ok(tree)
}

/// Agent options as the DaemonSet runs it: the ConfigMap's config file, whose source, trust and identity the
/// test overrides to point at its own release and server; the given kubeconfig.
fn daemonset_options(
    manifests: &[Value],
    publisher: &Publisher,
    server: &SourceServer,
    kubeconfig: &Path,
    dir: &Path,
) -> anyhow::Result<AgentOptions> {
    let config = find(manifests, "ConfigMap", "windvane-agent-config")?["data"]["agent.yaml"]
        .as_str()
        .context("the agent ConfigMap has no agent.yaml")?;
    let file = dir.join("agent.yaml");
    std::fs::write(&file, config)?;
    let mut options = AgentOptions::new(&server.url, &publisher.public_key_path(), "prod-eu");
    options.kubeconfig = Some(kubeconfig.to_path_buf());
    options.extra = vec![
        "--config".into(),
        file.display().to_string(),
        "--server".into(),
        server.url.clone(),
        "--registration-token-file".into(),
        server.token_file.display().to_string(),
        "--heartbeat-interval".into(),
        "1s".into(),
    ];
    Ok(options)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_runs_as_its_service_account_with_the_documented_rights() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let scratch = TempDir::new()?;
    let manifests = documents(
        &kustomize(&kube, &deploy_dir().join("agent"))?,
        "deploy/agent",
    )?;
    let (publisher, server) = install_and_publish(&kube, &manifests, 71).await?;
    let kubeconfig = agent_kubeconfig(&kube, scratch.path()).await?;

    // The rights the operator guide names for the default (wide) install, and no others.
    let mut allowed = OWN_RIGHTS.to_vec();
    allowed.extend([
        access("get", "apps", "deployments"),
        access("list", "", "configmaps"),
        access("watch", "", "configmaps"),
        access("create", "", "namespaces"),
        access("patch", "apps", "deployments"),
        access("delete", "apps", "deployments"),
        access("patch", "", "secrets").in_ns("default"),
        access(
            "create",
            "apiextensions.k8s.io",
            "customresourcedefinitions",
        ),
        access("patch", "example.com", "widgets"),
        access("create", "rbac.authorization.k8s.io", "clusterroles"),
        access("escalate", "rbac.authorization.k8s.io", "clusterroles"),
        access("bind", "rbac.authorization.k8s.io", "clusterroles"),
        access("escalate", "rbac.authorization.k8s.io", "roles").in_ns("shop"),
    ]);
    let mut denied = NEVER.to_vec();
    denied.push(access("escalate", "", "configmaps"));
    expect_rights(&kube, &allowed, &denied).await?;

    let options = daemonset_options(&manifests, &publisher, &server, &kubeconfig, scratch.path())?;
    let agent = Agent::start(&kube, &options).await?;
    let status = agent
        .wait_status("the release Synced", WAIT, |s| {
            s["state"] == "Synced" && s["counts"]["Synced"] == 4
        })
        .await?;
    for object in [NAMESPACE, CONFIG_MAP, DEPLOYMENT, CLUSTER_ROLE] {
        assert_eq!(
            object_state(&status, object),
            Some("Synced"),
            "{object}: {status}"
        );
    }
    let cluster_role = Api::<ClusterRole>::all(kube.client())
        .get("shop-operator")
        .await?;
    assert_eq!(
        cluster_role.rules.unwrap_or_default()[0].verbs,
        vec!["*".to_owned()],
        "the bundle's ClusterRole grants more than the agent holds: written thanks to `escalate`"
    );

    // It leads, under its identity, on the Lease in its namespace.
    let lease = Api::<Lease>::namespaced(kube.client(), AGENT_NAMESPACE)
        .get("windvane-agent")
        .await?;
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some(options.identity.as_str())
    );
    // Its state: the last known good release, the inventory, and the identity key it enrolled with.
    let secrets: Api<Secret> = Api::namespaced(kube.client(), AGENT_NAMESPACE);
    for name in [
        "windvane-release",
        "windvane-inventory",
        "windvane-identity",
    ] {
        assert!(
            secrets.get_opt(name).await?.is_some(),
            "Secret {name} missing"
        );
    }
    wait_for("the server to show the cluster Synced", WAIT, || async {
        let view = server.api("/api/v1/clusters/prod-eu").await?;
        Ok((view["cluster"]["state"] == "Synced").then_some(()))
    })
    .await?;

    // Drift: someone edits the ConfigMap; the agent puts it back and says so with Events on it.
    let config_maps: Api<ConfigMap> = Api::namespaced(kube.client(), "shop");
    config_maps
        .patch(
            "settings",
            &PatchParams {
                field_manager: Some("kubectl-edit".into()),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({"data": {"greeting": "edited by hand"}})),
        )
        .await?;
    wait_greeting(
        &config_maps,
        "hello from prod-eu",
        "the drift to be reverted",
    )
    .await
    .with_context(|| tail(&agent.process.log(), 40))?;
    let events: Api<Event> = Api::namespaced(kube.client(), "shop");
    let reasons = wait_for("DriftDetected and DriftReverted Events", WAIT, || async {
        let reasons: BTreeSet<String> = events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| {
                e.reporting_controller.as_deref() == Some("windvane-agent")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("settings")
            })
            .filter_map(|e| e.reason)
            .collect();
        Ok(
            (reasons.contains("DriftDetected") && reasons.contains("DriftReverted"))
                .then_some(reasons),
        )
    })
    .await
    .with_context(|| tail(&agent.process.log(), 40))?;
    assert!(reasons.contains("DriftReverted"));

    // A second release: its last-known-good and inventory writes replace the state Secrets, which the Role
    // allows (`update`), and it applies.
    let release = secrets
        .get("windvane-release")
        .await?
        .metadata
        .resource_version;
    publisher.publish(
        &shop_tree(&SHOP.replace("hello from", "welcome to"))?,
        "stable",
    )?;
    wait_greeting(
        &config_maps,
        "welcome to prod-eu",
        "the second release applied",
    )
    .await
    .with_context(|| tail(&agent.process.log(), 40))?;
    assert_ne!(
        secrets
            .get("windvane-release")
            .await?
            .metadata
            .resource_version,
        release,
        "the second release was not persisted as last known good"
    );
    agent
        .wait_status("the second release Synced", WAIT, |s| {
            s["state"] == "Synced" && s["counts"]["Synced"] == 4
        })
        .await?;
    let log = agent.process.log();
    assert!(
        !log.contains("forbidden"),
        "the agent met a refusal of the API server:\n{}",
        tail(&log, 40)
    );
    Ok(())
}

/// Waits until the shop's ConfigMap `settings` greets with `greeting`.
async fn wait_greeting(
    config_maps: &Api<ConfigMap>,
    greeting: &str,
    what: &str,
) -> anyhow::Result<()> {
    wait_for(what, WAIT, || async {
        let cm = config_maps.get("settings").await?;
        let found = cm.data.unwrap_or_default().remove("greeting");
        Ok((found.as_deref() == Some(greeting)).then_some(()))
    })
    .await
}

/// The kinds `WINDVANE_ALLOW_KINDS` of the agent's container names, as (group, Kind); `core` is "".
fn allowed_kinds(manifests: &[Value]) -> anyhow::Result<(String, Vec<(String, String)>)> {
    let daemonset = find(manifests, "DaemonSet", "windvane-agent")?;
    let env = daemonset["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .context("the agent container has no env")?;
    let value = env
        .iter()
        .find(|e| e["name"] == "WINDVANE_ALLOW_KINDS")
        .and_then(|e| e["value"].as_str())
        .context("narrow-rbac sets no WINDVANE_ALLOW_KINDS")?
        .to_owned();
    let mut kinds = Vec::new();
    for pattern in value.split(',') {
        let (group, kind) = pattern
            .trim()
            .split_once('/')
            .with_context(|| format!("{pattern}: use group/Kind so the RBAC can be checked"))?;
        kinds.push((
            if group == "core" { "" } else { group }.to_owned(),
            kind.to_owned(),
        ));
    }
    Ok((value, kinds))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narrowed_rbac_refuses_other_kinds_and_applies_the_rest() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let scratch = TempDir::new()?;
    let overlay = scratch.path().join("narrow");
    let agent_dir = deploy_dir().join("agent").canonicalize()?;
    write_kustomization(
        &overlay,
        &agent_dir,
        &[&agent_dir.join("components/narrow-rbac")],
    )?;
    let manifests = documents(&kustomize(&kube, &overlay)?, "deploy/agent + narrow-rbac")?;
    let (publisher, server) = install_and_publish(&kube, &manifests, 72).await?;
    let kubeconfig = agent_kubeconfig(&kube, scratch.path()).await?;

    // Each kind of the allowlist is writable — read, apply, prune — and its RBAC rule says so; nothing else.
    let (allow_kinds, kinds) = allowed_kinds(&manifests)?;
    let discovery = kube::discovery::Discovery::new(kube.client()).run().await?;
    let mut plurals = Vec::new();
    for (group, kind) in &kinds {
        let resource = discovery
            .groups()
            .filter(|g| g.name() == group)
            .flat_map(|g| g.recommended_resources())
            .find(|(r, _)| &r.kind == kind)
            .map(|(r, _)| r.plural)
            .with_context(|| format!("{group}/{kind} is not served"))?;
        plurals.push((group.as_str(), resource));
    }
    let mut allowed = OWN_RIGHTS.to_vec();
    for (group, plural) in &plurals {
        for verb in ["get", "list", "watch", "create", "patch", "delete"] {
            allowed.push(access(verb, group, plural));
        }
    }
    let mut denied = NEVER.to_vec();
    denied.extend([
        access("create", "rbac.authorization.k8s.io", "clusterroles"),
        access("escalate", "rbac.authorization.k8s.io", "clusterroles"),
        access("bind", "rbac.authorization.k8s.io", "roles").in_ns("shop"),
        access("get", "", "secrets").in_ns("default"),
        access("list", "", "secrets"),
        access("patch", "apiextensions.k8s.io", "customresourcedefinitions"),
        access(
            "patch",
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
        ),
        access("create", "", "pods").in_ns("shop"),
    ]);
    expect_rights(&kube, &allowed, &denied).await?;

    // The agent as the DaemonSet runs it, with the component's allowlist: the ClusterRole is refused by the
    // agent, never sent; the rest applies.
    let mut options =
        daemonset_options(&manifests, &publisher, &server, &kubeconfig, scratch.path())?;
    options.extra.extend(["--allow-kinds".into(), allow_kinds]);
    let agent = Agent::start(&kube, &options).await?;
    let synced = |s: &Value| {
        [NAMESPACE, CONFIG_MAP, DEPLOYMENT]
            .iter()
            .all(|o| object_state(s, o) == Some("Synced"))
    };
    let status = agent
        .wait_status("the allowed objects Synced", WAIT, |s| {
            synced(s) && object_state(s, CLUSTER_ROLE) == Some("Failed")
        })
        .await?;
    let message = |s: &Value| {
        s["objects"]
            .as_array()
            .and_then(|a| a.iter().find(|o| o["object"] == CLUSTER_ROLE))
            .and_then(|o| o["message"].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    assert!(
        message(&status).contains("not in the operator's allowed kinds"),
        "{status}"
    );
    let cluster_roles = Api::<ClusterRole>::all(kube.client());
    assert!(cluster_roles.get_opt("shop-operator").await?.is_none());
    drop(agent);

    // Should the allowlist be widened while the RBAC stays narrow, the API server refuses the ClusterRole and
    // the agent reports it; the rest stays Synced. (Same identity: it takes its own Lease back at once.)
    let widened = options.extra.len() - 1;
    options.extra[widened] = "*".into();
    let agent = Agent::start(&kube, &options).await?;
    let status = agent
        .wait_status("the ClusterRole refused by the API server", WAIT, |s| {
            synced(s)
                && object_state(s, CLUSTER_ROLE) == Some("Failed")
                && message(s).contains("forbidden")
        })
        .await?;
    assert!(message(&status).contains(AGENT_USER), "{status}");
    assert!(cluster_roles.get_opt("shop-operator").await?.is_none());
    Ok(())
}
