//! Windvane installed as an operator installs it, on a cluster whose node runs real containers (issue 45,
//! item 3): `kubectl apply -k` of an overlay over `deploy/source-server`, then over `deploy/agent`
//! (`tests/fixtures/realnode`, which says what the overlays change and why), with the images
//! `deploy/images/build.sh` built from this workspace's binaries. Then, from the outside only:
//!
//! - the server's pod starts, passes its probes and serves the release store and its API;
//! - the agent's DaemonSet pod starts and is Ready (the kubelet's probe), leads (the Lease), syncs the release
//!   from the server, heals drift on a managed object, and heartbeats (the server sees the cluster Synced);
//! - it stays under its memory limit, which the runtime enforces (the container's cgroup has the limit; its
//!   working set, as the kubelet computes it from that cgroup, is printed);
//! - its pod deleted, the DaemonSet's new pod resumes from the state the agent keeps in Secrets of its
//!   namespace: the same identity key (no enrolment again; the server keeps accepting its heartbeats), the
//!   managed object not rewritten;
//! - removed (`kubectl delete -k`), the agent is installed again from its Helm chart as the README tells
//!   (`helm install --wait` with an existing Secret for the token, narrow RBAC), as a second cluster of the
//!   fleet: helm returns once the pod is Ready, and the server sees that cluster Synced too;
//! - the server installed again from its Helm chart, in a namespace of its own with its tokens from an existing
//!   Secret: helm returns once its pod is Ready, and it serves the same signed pointer.
//!
//! One cluster for all of it: a real node costs about half a minute to start. Needs what
//! `localkube_real_node.rs` needs, plus `deploy/images/build.sh --binaries target/debug agent server`.

use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use windvane_tests::fleet::{FleetTree, Publisher};
use windvane_tests::install::{container_memory, kubectl, overlay, ready_pod, tool, workspace_dir};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;

/// A pod start pulls nothing (the images are loaded), so a minute is plenty; the margin is for a loaded machine.
const WAIT: Duration = Duration::from_secs(180);
const REGISTRATION_TOKEN: &str = "realnode-registration-token-0001";
const READ_TOKEN: &str = "realnode-read-token-000000000001";
const ADMIN_TOKEN: &str = "realnode-admin-token-00000000001";
/// The agent's memory limit in deploy/agent/base/daemonset.yaml.
const AGENT_MEMORY_LIMIT: u64 = 192 * 1024 * 1024;

/// The release: one ConfigMap the agent manages.
fn release() -> Result<FleetTree> {
    let tree = FleetTree::new()?;
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: app\n    path: app\n",
    )?;
    tree.write(
        "app/settings.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: default}\n\
         data: {mode: strict, cluster: '${cluster.name}'}\n",
    )?;
    Ok(tree)
}

/// Makes `dir` and everything in it readable by the server's user (the publisher's directories are 0700).
fn readable(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            readable(&path)?;
        }
        let mode = if path.is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// GET `url` with the read token; the status and the body.
async fn get(url: &str) -> Result<(u16, String)> {
    let response = reqwest::Client::new()
        .get(url)
        .bearer_auth(READ_TOKEN)
        .timeout(Duration::from_secs(5))
        .send()
        .await?;
    Ok((response.status().as_u16(), response.text().await?))
}

/// Installs the server from its overlay; returns its base URL (the pod's address: the node's network
/// reaches the pods' bridge, and no kube-proxy serves the Service's ClusterIP).
async fn install_server(kube: &LocalKube, scratch: &Path, store: &Path) -> Result<String> {
    readable(store)?;
    let data = scratch.join("server-data");
    std::fs::create_dir_all(&data)?;
    chown(&data, Some(65532), Some(65532))?;
    let dir = overlay(
        "source-server",
        scratch,
        &[
            ("DATA_DIR", data.display().to_string()),
            ("STORE_DIR", store.display().to_string()),
        ],
        &[
            ("registration-token", REGISTRATION_TOKEN.as_bytes()),
            ("read-token", READ_TOKEN.as_bytes()),
            ("admin-token", ADMIN_TOKEN.as_bytes()),
        ],
    )?;
    kubectl(kube, &["apply", "-k", &dir.display().to_string()])?;
    let pod = ready_pod(
        kube,
        "windvane-server",
        "app.kubernetes.io/name=windvane-server",
        WAIT,
    )
    .await?;
    let ip = pod
        .status
        .and_then(|s| s.pod_ip)
        .context("the server's pod has no IP")?;
    Ok(format!("http://{ip}:8080"))
}

/// The API server's port: the agent pod, on the node's network, reaches it at 127.0.0.1 there.
fn api_server_port(kube: &LocalKube) -> Result<String> {
    Ok(kube
        .server_url()
        .rsplit(':')
        .next()
        .context("the API server's URL has a port")?
        .to_owned())
}

/// Installs the agent from its overlay, pointed at `server`; the overlay's directory and the Ready pod.
async fn install_agent(
    kube: &LocalKube,
    scratch: &Path,
    server: &str,
    key: &Path,
) -> Result<(PathBuf, Pod)> {
    let port = api_server_port(kube)?;
    let dir = overlay(
        "agent",
        scratch,
        &[("SERVER_URL", server.to_owned()), ("API_SERVER_PORT", port)],
        &[
            ("registration-token", REGISTRATION_TOKEN.as_bytes()),
            ("release.pub", &std::fs::read(key)?),
        ],
    )?;
    kubectl(kube, &["apply", "-k", &dir.display().to_string()])?;
    let pod = ready_pod(
        kube,
        "windvane-system",
        "app.kubernetes.io/name=windvane-agent",
        WAIT,
    )
    .await?;
    Ok((dir, pod))
}

/// `kubectl create secret generic NAME` in `namespace` with one key per `(key, value)`, as an operator makes
/// one from files (written under `scratch/NAME/`).
fn create_secret(
    kube: &LocalKube,
    scratch: &Path,
    namespace: &str,
    name: &str,
    data: &[(&str, &str)],
) -> Result<()> {
    let dir = scratch.join(name);
    std::fs::create_dir_all(&dir)?;
    for (key, value) in data {
        std::fs::write(dir.join(key), value)?;
    }
    let from_dir = format!("--from-file={}", dir.display());
    kubectl(
        kube,
        &[
            "-n", namespace, "create", "secret", "generic", name, &from_dir,
        ],
    )?;
    Ok(())
}

/// Installs the agent chart as the README tells: the namespace and the registration token's Secret first,
/// then `helm install --wait` with this cluster's values, which returns once every replica is Ready.
fn helm_install(kube: &LocalKube, scratch: &Path, server: &str, key: &Path) -> Result<String> {
    let namespace = "windvane";
    kubectl(kube, &["create", "namespace", namespace])?;
    create_secret(
        kube,
        scratch,
        namespace,
        "windvane-registration",
        &[("token", REGISTRATION_TOKEN)],
    )?;
    let values = json!({
        "cluster": {"name": "realnode-helm", "labels": {"env": "test"}},
        "source": server, "server": server, "channel": "stable", "fleet": "acme",
        "releaseKeys": {"release.pub": std::fs::read_to_string(key)?},
        "registrationToken": {"existingSecret": "windvane-registration"},
        "config": {"pollInterval": "2s", "heartbeatInterval": "2s"},
        "image": {"repository": "windvane-agent", "tag": "local"},
        "rbac": {"narrow": true},
        "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}],
        // The test cluster's network (tests/fixtures/realnode/README.md).
        "hostNetwork": true,
        "extraEnv": [
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": api_server_port(kube)?},
        ],
    });
    helm_install_chart(kube, scratch, "windvane-agent", namespace, &values)?;
    Ok(namespace.to_owned())
}

/// `helm install --wait` of the chart `deploy/charts/NAME` into `namespace` with `values`, as the README tells.
fn helm_install_chart(
    kube: &LocalKube,
    scratch: &Path,
    name: &str,
    namespace: &str,
    values: &Value,
) -> Result<()> {
    let values_file = scratch.join(format!("{name}-values.yaml"));
    std::fs::write(&values_file, serde_json::to_string_pretty(values)?)?;
    let chart = workspace_dir().join("deploy/charts").join(name);
    let helm_home = scratch.join("helm");
    let mut helm = std::process::Command::new(tool("helm")?);
    helm.env("HELM_CACHE_HOME", helm_home.join("cache"))
        .env("HELM_CONFIG_HOME", helm_home.join("config"))
        .env("HELM_DATA_HOME", helm_home.join("data"))
        .args(["install", name])
        .arg(&chart)
        .args([
            "--namespace",
            namespace,
            "--wait",
            "--timeout",
            "3m",
            "--kubeconfig",
        ])
        .arg(kube.kubeconfig_path())
        .arg("-f")
        .arg(&values_file);
    let started = Instant::now();
    let output = helm.output().context("running helm")?;
    if !output.status.success() {
        // What an operator would look at next: the pods, claims and their events.
        let pods = kubectl(kube, &["-n", namespace, "get", "pods,pvc", "-o", "wide"]);
        let described = kubectl(kube, &["-n", namespace, "describe", "pods"]);
        anyhow::bail!(
            "helm install --wait {name}: {}\n{}{}\n{pods:?}\n{described:?}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    println!(
        "helm install --wait {name} returned in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Installs the server chart as the README tells, beside the kustomize-installed server (the chart puts
/// everything in the release's namespace): the namespace and the tokens' Secret first, volumes for its two
/// claims (the test cluster has no storage provisioner, as for the overlay), then `helm install --wait`;
/// returns the new server's base URL (its pod's address).
async fn helm_install_server(kube: &LocalKube, scratch: &Path, store: &Path) -> Result<String> {
    let namespace = "windvane-server-helm";
    kubectl(kube, &["create", "namespace", namespace])?;
    create_secret(
        kube,
        scratch,
        namespace,
        "server-tokens",
        &[
            ("registration-token", REGISTRATION_TOKEN),
            ("read-token", READ_TOKEN),
        ],
    )?;
    // The admin token too: the chart's default Secret holds the example's placeholder, which the server
    // refuses at start (as it should).
    create_secret(
        kube,
        scratch,
        namespace,
        "server-admin",
        &[("admin-token", ADMIN_TOKEN)],
    )?;
    let data = scratch.join("helm-server-data");
    std::fs::create_dir_all(&data)?;
    chown(&data, Some(65532), Some(65532))?;
    let volumes: Vec<Value> = [("data", &data, "2Gi"), ("store", &store.to_path_buf(), "1Gi")]
        .into_iter()
        .map(|(claim, path, size)| {
            json!({"apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": format!("helm-windvane-server-{claim}")},
                "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                    "claimRef": {"namespace": namespace, "name": format!("windvane-server-{claim}")},
                    "hostPath": {"path": path.display().to_string(), "type": "Directory"}}})
        })
        .collect();
    let volumes_file = scratch.join("helm-volumes.json");
    std::fs::write(
        &volumes_file,
        serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": volumes}))?,
    )?;
    kubectl(kube, &["apply", "-f", &volumes_file.display().to_string()])?;
    let values = json!({
        "tokens": {"existingSecret": "server-tokens", "adminExistingSecret": "server-admin"},
        "image": {"repository": "windvane-server", "tag": "local"},
        "resources": {"limits": {"memory": "256Mi"}, "requests": {"memory": "64Mi"}},
    });
    helm_install_chart(kube, scratch, "windvane-server", namespace, &values)?;
    let pod = ready_pod(
        kube,
        namespace,
        "app.kubernetes.io/name=windvane-server",
        WAIT,
    )
    .await?;
    let ip = pod
        .status
        .and_then(|s| s.pod_ip)
        .context("the Helm-installed server's pod has no IP")?;
    Ok(format!("http://{ip}:8080"))
}

/// The server's view of the cluster once `check` holds.
async fn cluster_view(
    server: &str,
    cluster: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Result<Value> {
    let url = format!("{server}/api/v1/clusters/{cluster}");
    wait_for(what, WAIT, || async {
        let (status, body) = get(&url).await?;
        if status != 200 {
            return Ok(None);
        }
        let view: Value = serde_json::from_str(&body)?;
        Ok(check(&view).then_some(view))
    })
    .await
}

fn data(map: &ConfigMap, key: &str) -> Option<String> {
    map.data.as_ref().and_then(|d| d.get(key).cloned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_install_runs_syncs_heals_reports_and_survives_its_pod_being_deleted_then_helm_installs_it()
-> Result<()> {
    let kube = LocalKube::start_real_node_with(&["windvane-agent", "windvane-server"]).await?;
    let scratch = tempfile::tempdir()?;
    let publisher = Publisher::new(45)?;
    let pointer = publisher.publish(&release()?, "stable")?;

    // The server: its pod passes its probes and serves the store and the API.
    let server = install_server(&kube, scratch.path(), &publisher.store()).await?;
    let (status, body) = get(&format!("{server}/channels/stable.json")).await?;
    ensure!(
        status == 200,
        "the server serves the store: {status} {body}"
    );
    let (status, _) = get(&format!("{server}/api/v1/fleet")).await?;
    ensure!(status == 200, "the server serves its API: {status}");

    // The agent: Ready, leads, syncs, heartbeats.
    let (agent_overlay, pod) =
        install_agent(&kube, scratch.path(), &server, &publisher.public_key_path()).await?;
    let pod_name = pod.metadata.name.clone().context("a pod has a name")?;
    // As an operator checks an install: the rollout ends (every replica Ready), one node at a time.
    kubectl(
        &kube,
        &[
            "-n",
            "windvane-system",
            "rollout",
            "status",
            "ds/windvane-agent",
            "--timeout=120s",
        ],
    )?;
    let strategy = kubectl(
        &kube,
        &[
            "-n",
            "windvane-system",
            "get",
            "ds",
            "windvane-agent",
            "-o",
            "jsonpath={.spec.updateStrategy.rollingUpdate.maxUnavailable}",
        ],
    )?;
    assert_eq!(strategy, "1", "updates roll one node at a time");
    let view = cluster_view(
        &server,
        "realnode",
        "the server sees the cluster Synced",
        |v| v["cluster"]["state"] == "Synced" && v["cluster"]["appliedSerial"] == pointer.serial,
    )
    .await?;
    println!("server's view after the install: {}", view["cluster"]);
    let leases: Api<Lease> = Api::namespaced(kube.client(), "windvane-system");
    let holder = leases
        .get("windvane-agent")
        .await?
        .spec
        .and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some(pod_name.as_str()), "the pod leads");
    let maps: Api<ConfigMap> = Api::namespaced(kube.client(), "default");
    let settings = maps.get("settings").await?;
    assert_eq!(data(&settings, "cluster").as_deref(), Some("realnode"));

    // Drift on the managed object is healed.
    maps.patch(
        "settings",
        &PatchParams::apply("someone-else").force(),
        &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "settings", "namespace": "default"}, "data": {"mode": "lax"}})),
    )
    .await?;
    let healed = wait_for("the drift healed", WAIT, || async {
        let map = maps.get("settings").await?;
        Ok((data(&map, "mode").as_deref() == Some("strict")).then_some(map))
    })
    .await?;

    // Memory: the runtime enforces the manifest's limit (the container's cgroup), and the agent is under it.
    let memory = container_memory(&kube, "windvane-system", &pod_name, "agent").await?;
    println!("agent after sync and heal: {}", memory.describe());
    assert_eq!(
        memory.limit, AGENT_MEMORY_LIMIT,
        "the runtime enforces the manifest's limit"
    );
    assert!(
        memory.working_set > 0 && memory.working_set < AGENT_MEMORY_LIMIT,
        "working set {} bytes",
        memory.working_set
    );

    // The pod deleted: the new one resumes with the state kept in its namespace's Secrets.
    let secrets: Api<Secret> = Api::namespaced(kube.client(), "windvane-system");
    let identity = secrets.get("windvane-identity").await?;
    let settings_version = healed.metadata.resource_version.clone();
    let pods: Api<Pod> = Api::namespaced(kube.client(), "windvane-system");
    pods.delete(&pod_name, &DeleteParams::default()).await?;
    let replacement = wait_for("a new agent pod Ready", WAIT, || async {
        let pod = ready_pod(
            &kube,
            "windvane-system",
            "app.kubernetes.io/name=windvane-agent",
            WAIT,
        )
        .await?;
        Ok((pod.metadata.name.as_deref() != Some(pod_name.as_str())).then_some(pod))
    })
    .await?;
    let new_name = replacement.metadata.name.clone().unwrap_or_default();
    wait_for("the new pod leads", WAIT, || async {
        let holder = leases
            .get("windvane-agent")
            .await?
            .spec
            .and_then(|s| s.holder_identity);
        Ok((holder.as_deref() == Some(new_name.as_str())).then_some(()))
    })
    .await?;
    let seen_before = view["cluster"]["lastSeen"].clone();
    let after = cluster_view(&server, "realnode", "heartbeats from the new pod", |v| {
        v["cluster"]["state"] == "Synced" && v["cluster"]["lastSeen"] != seen_before
    })
    .await?;
    for field in ["keyid", "enrolledAt"] {
        assert_eq!(
            after["cluster"][field], view["cluster"][field],
            "the server still knows the cluster by the key it enrolled first ({field})"
        );
    }
    let kept = secrets.get("windvane-identity").await?;
    assert_eq!(
        kept.metadata.resource_version, identity.metadata.resource_version,
        "the identity key is kept"
    );
    assert_eq!(
        maps.get("settings").await?.metadata.resource_version,
        settings_version,
        "the new pod did not rewrite the managed object"
    );
    let restarted = container_memory(&kube, "windvane-system", &new_name, "agent").await?;
    println!("new pod {new_name} leads: {}", restarted.describe());

    // The same agent from its Helm chart, on the same node, as another cluster of the fleet: the kustomize
    // install removed first (the charts' cluster-wide objects have the same names).
    kubectl(
        &kube,
        &[
            "delete",
            "-k",
            &agent_overlay.display().to_string(),
            "--wait=true",
        ],
    )?;
    let all_pods: Api<Pod> = Api::all(kube.client());
    wait_for("the kustomize-installed agent gone", WAIT, || async {
        let list = all_pods
            .list(&kube::api::ListParams::default().labels("app.kubernetes.io/name=windvane-agent"))
            .await?;
        Ok(list.items.is_empty().then_some(()))
    })
    .await?;
    let namespace = helm_install(&kube, scratch.path(), &server, &publisher.public_key_path())?;
    let pod = ready_pod(
        &kube,
        &namespace,
        "app.kubernetes.io/name=windvane-agent",
        WAIT,
    )
    .await?;
    cluster_view(
        &server,
        "realnode-helm",
        "the Helm-installed agent Synced",
        |v| v["cluster"]["state"] == "Synced" && v["cluster"]["appliedSerial"] == pointer.serial,
    )
    .await?;
    let memory = container_memory(
        &kube,
        &namespace,
        pod.metadata.name.as_deref().unwrap_or_default(),
        "agent",
    )
    .await?;
    println!("Helm-installed agent Synced: {}", memory.describe());

    // The server from its Helm chart, in a namespace of its own, with the tokens from an existing Secret: helm
    // returns once its pod is Ready, and it serves the same store and its API (the read token required).
    let helm_server = helm_install_server(&kube, scratch.path(), &publisher.store()).await?;
    let (status, body) = get(&format!("{helm_server}/channels/stable.json")).await?;
    ensure!(
        status == 200,
        "the Helm-installed server serves the store: {status} {body}"
    );
    let served: Value = serde_json::from_str(&body)?;
    let published: Value = serde_json::from_slice(&std::fs::read(
        publisher.store().join("channels/stable.json"),
    )?)?;
    assert_eq!(served, published, "the same signed pointer");
    let (status, _) = get(&format!("{helm_server}/readyz")).await?;
    ensure!(
        status == 200,
        "the Helm-installed server is ready: {status}"
    );
    Ok(())
}
