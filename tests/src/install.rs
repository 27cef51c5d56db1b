//! Installing Windvane on a test cluster as an operator does: an overlay of `tests/fixtures/realnode`
//! (over the shipped manifests in `deploy/`) copied into a scratch directory with the run's own values filled
//! in, then `kubectl apply -k` with the kubectl localkube bundles; and what the node says of the pods
//! afterwards (readiness as the kubelet's probes find it, a container's memory in its cgroup).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use crate::localkube::LocalKube;
use crate::poll::wait_for;

/// The repository's root directory.
pub fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives inside the workspace")
        .to_path_buf()
}

/// The real tool `name` (`helm`, `kustomize`): `WINDVANE_HELM`/`WINDVANE_KUSTOMIZE` (set by tests/run), else
/// the one tests/tools/build.sh writes into the workspace's target directory.
pub fn tool(name: &str) -> Result<PathBuf> {
    let env = format!("WINDVANE_{}", name.to_ascii_uppercase());
    let path = match std::env::var_os(&env) {
        Some(path) => PathBuf::from(path),
        None => workspace_dir().join("target/tools").join(name),
    };
    ensure!(
        path.is_file(),
        "{} is missing: run tests/tools/build.sh (or set {env})",
        path.display()
    );
    Ok(path)
}

/// Runs `program` with `args`; its standard output, or an error with both outputs unless it exits 0.
pub fn run(program: &Path, args: &[&str]) -> Result<String> {
    checked(std::process::Command::new(program).args(args))
}

/// Runs `command`; its standard output, or an error naming it with both outputs unless it exits 0.
fn checked(command: &mut std::process::Command) -> Result<String> {
    let output = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    ensure!(
        output.status.success(),
        "{command:?}: {}\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A path to `target` that kustomize accepts from `from`: relative (kustomize refuses absolute bases).
fn relative(from: &Path, target: &Path) -> String {
    let up = from.components().count().saturating_sub(1);
    let target = target.display().to_string();
    format!("{}{}", "../".repeat(up), target.trim_start_matches('/'))
}

/// Copies the overlay `tests/fixtures/realnode/<name>` into `dest`, replacing `DEPLOY` with the path of
/// `deploy/` and every other `(WORD, value)` of `values` in every file; adds `files` (name, contents).
/// Returns the copy's directory.
pub fn overlay(
    name: &str,
    dest: &Path,
    values: &[(&str, String)],
    files: &[(&str, &[u8])],
) -> Result<PathBuf> {
    let source = workspace_dir().join("tests/fixtures/realnode").join(name);
    let dir = dest.join(name);
    std::fs::create_dir_all(&dir)?;
    let deploy = relative(&dir, &workspace_dir().join("deploy"));
    for entry in std::fs::read_dir(&source).with_context(|| format!("{}", source.display()))? {
        let entry = entry?;
        let mut text = std::fs::read_to_string(entry.path())?;
        text = text.replace("DEPLOY", &deploy);
        for (word, value) in values {
            text = text.replace(word, value);
        }
        std::fs::write(dir.join(entry.file_name()), text)?;
    }
    for (file, contents) in files {
        std::fs::write(dir.join(file), contents)?;
    }
    Ok(dir)
}

/// Runs the bundled kubectl with `args`; fails with its output unless it exits 0. Returns its stdout.
pub fn kubectl(kube: &LocalKube, args: &[&str]) -> Result<String> {
    checked(&mut kube.kubectl(args))
}

/// Waits until a pod matching `selector` in `namespace` is Ready (all containers, as the kubelet's probes
/// say); returns it. On timeout the error lists the pods' phases and container states.
pub async fn ready_pod(
    kube: &LocalKube,
    namespace: &str,
    selector: &str,
    timeout: Duration,
) -> Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(kube.client(), namespace);
    let params = ListParams::default().labels(selector);
    let result = wait_for(
        &format!("a Ready pod {selector} in {namespace}"),
        timeout,
        || async {
            let list = pods.list(&params).await?;
            Ok(list.items.into_iter().find(|pod| {
                pod.metadata.deletion_timestamp.is_none()
                    && pod
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            }))
        },
    )
    .await;
    match result {
        Ok(pod) => Ok(pod),
        Err(error) => {
            let described = kubectl(
                kube,
                &["-n", namespace, "get", "pods", "-l", selector, "-o", "yaml"],
            )
            .unwrap_or_else(|e| e.to_string());
            Err(error.context(described))
        }
    }
}

/// A container's memory as its cgroup (v1) holds it: the working set — usage minus inactive file pages, the
/// figure the kubelet reports and evicts by — and the limit the runtime enforces, both in bytes. (The
/// kubelet's own summary API is not reachable here: the API server dials the node by its host name, which
/// the loopback-only namespace cannot resolve.)
#[derive(Debug, Clone, Copy)]
pub struct Memory {
    pub working_set: u64,
    pub limit: u64,
    /// The cgroup's peak usage (memory.max_usage_in_bytes).
    pub peak: u64,
    /// The container's main process as `/proc` sees it (its resident set counts the binary's pages that
    /// the cgroup does not: they were first read, and charged, when the image was loaded).
    pub process: crate::procfs::Memory,
}

impl Memory {
    /// `working set 4.4 MiB (peak 6.0), limit 192 MiB; process VmRSS …`.
    pub fn describe(&self) -> String {
        let mib = |bytes: u64| bytes as f64 / 1048576.0;
        format!(
            "working set {:.1} MiB (cgroup peak {:.1}), limit {:.0} MiB; process {}",
            mib(self.working_set),
            mib(self.peak),
            mib(self.limit),
            self.process.describe()
        )
    }
}

/// [`Memory`] of `container` in `namespace/pod`, found by its containerd id under the node's cgroups.
pub async fn container_memory(
    kube: &LocalKube,
    namespace: &str,
    pod: &str,
    container: &str,
) -> Result<Memory> {
    let pods: Api<Pod> = Api::namespaced(kube.client(), namespace);
    let status = pods.get(pod).await?.status.unwrap_or_default();
    let id = status
        .container_statuses
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.name == container)
        .and_then(|c| c.container_id)
        .with_context(|| format!("{namespace}/{pod} has no id for container {container}"))?;
    let id = id.rsplit("://").next().unwrap_or(&id).to_owned();
    let dir = find_dir(Path::new("/sys/fs/cgroup/memory"), &id, 8)?
        .with_context(|| format!("no memory cgroup for container {id}"))?;
    let read = |file: &str| -> Result<String> {
        std::fs::read_to_string(dir.join(file)).with_context(|| format!("{}/{file}", dir.display()))
    };
    let usage: u64 = read("memory.usage_in_bytes")?.trim().parse()?;
    let stat = read("memory.stat")?;
    let inactive: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("total_inactive_file "))
        .context("memory.stat has no total_inactive_file")?
        .trim()
        .parse()?;
    let pid: u32 = read("cgroup.procs")?
        .lines()
        .next()
        .context("the container's cgroup holds no process")?
        .trim()
        .parse()?;
    Ok(Memory {
        working_set: usage.saturating_sub(inactive),
        limit: read("memory.limit_in_bytes")?.trim().parse()?,
        peak: read("memory.max_usage_in_bytes")?.trim().parse()?,
        process: crate::procfs::read_memory(pid)?,
    })
}

/// The directory named `name` under `root`, at most `depth` levels down.
fn find_dir(root: &Path, name: &str, depth: usize) -> Result<Option<PathBuf>> {
    if depth == 0 {
        return Ok(None);
    }
    for entry in std::fs::read_dir(root)?.flatten() {
        let path = entry.path();
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if entry.file_name().to_string_lossy() == name {
            return Ok(Some(path));
        }
        if let Some(found) = find_dir(&path, name, depth - 1)? {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_is_named_relative_to_the_overlay() {
        assert_eq!(
            relative(Path::new("/tmp/x/agent"), Path::new("/work/deploy")),
            "../../../work/deploy"
        );
    }
}
