//! A real Kubernetes control plane for tests: starts and stops `localkube`.
//!
//! `localkube` (built from `tests/localkube` by `tests/localkube/build.sh`) is
//! one process that runs etcd, kube-apiserver (RBAC on), kube-controller-manager
//! and a fake node that binds pods to itself and reports them Running and
//! Ready. It is the Kubernetes that every integration test of Windvane talks
//! to; no mock API server stands in for it.
//!
//! [`LocalKube::start`] spawns one on free ports with a fresh temporary data
//! directory and waits (with a deadline) for its `LOCALKUBE_READY` line, which
//! it prints only once `/readyz` is ok, its Node exists and the `default`
//! ServiceAccount exists. Several can run side by side. For fault tests,
//! [`LocalKube::kill`] (SIGKILL) and [`LocalKube::restart`] bring it back on
//! the same data directory and the same port, so objects and existing
//! kubeconfigs survive. Dropping a [`LocalKube`] kills its process group and
//! removes the data directory.
//!
//! The binary is found through the `WINDVANE_LOCALKUBE` environment variable,
//! else at `<workspace>/target/localkube/localkube`. If it is missing,
//! starting fails with a message saying to run `tests/localkube/build.sh`:
//! tests fail, they do not skip.
//!
//! The control plane's logs go to `<data dir>/localkube.log`; the tail of it is
//! part of every start error. Set `WINDVANE_LOCALKUBE_KEEP=1` to keep data
//! directories (and logs) after the test for inspection.
//!
//! The bundled, version-matched kubectl is [`LocalKube::kubectl`].
//!
//! [`LocalKube::start_real_node`] starts one whose node is real (`localkube
//! --real-node`): a kubelet runs pods as containers through containerd and
//! runc, with the images of `deploy/images/build.sh` (`windvane-test/busybox:local`)
//! loaded. It needs root, cgroups, and a network namespace with only loopback
//! (`tests/loopback-only`); where the machine cannot run it, starting fails with
//! localkube's list of what is missing. Such a localkube is stopped with
//! SIGTERM even on drop, so that it removes its pods, containerd and cgroups.

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;
use tempfile::TempDir;
use tokio::sync::oneshot;

use crate::process::tail_file;

/// Environment variable naming the `localkube` binary to use.
pub const BINARY_ENV: &str = "WINDVANE_LOCALKUBE";

/// Environment variable with the Kubernetes minor the binary must serve (e.g. `34` when
/// `WINDVANE_LOCALKUBE` is the oldest supported release, built by `build.sh --version 1.34`). When
/// set, every start checks `/version` and fails on another minor, so a run meant for one release
/// cannot pass on another binary.
pub const MINOR_ENV: &str = "WINDVANE_LOCALKUBE_MINOR";

/// Environment variable naming the containerd binary for a real node (`ctr` and
/// `containerd-shim-runc-v2` beside it); default `<workspace>/target/tools/containerd`,
/// where `tests/tools/build-realnode.sh` puts it.
pub const CONTAINERD_ENV: &str = "WINDVANE_CONTAINERD";

/// Environment variable naming the directory of `deploy/images/build.sh`'s image
/// archives; default `<workspace>/target/images`.
pub const IMAGES_ENV: &str = "WINDVANE_IMAGES";

/// The test workload image a real node has loaded: a shell and `sleep`.
pub const BUSYBOX_IMAGE: &str = "windvane-test/busybox:local";

/// Environment variable that, when set to `1`, keeps data directories.
pub const KEEP_ENV: &str = "WINDVANE_LOCALKUBE_KEEP";

/// How long [`LocalKube::start`] and [`LocalKube::restart`] wait for the ready
/// line. Starting takes a few seconds; the margin is for loaded CI machines.
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// How long [`LocalKube::stop`] waits for a clean exit after SIGTERM.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);

const READY_PREFIX: &str = "LOCALKUBE_READY ";
const LOG_FILE: &str = "localkube.log";
/// Where localkube counts the garbage collections SIGUSR1 asked for.
const COLLECTIONS_FILE: &str = "garbage-collections";
/// The longest [`LocalKube::collect_garbage`] waits.
const COLLECT_TIMEOUT: Duration = Duration::from_secs(60);
/// How much of the log start and stop errors carry.
const LOG_TAIL_LINES: usize = 40;

/// The JSON document of the ready line.
#[derive(Debug, Clone, Deserialize)]
struct ReadyInfo {
    server: String,
    kubeconfig: PathBuf,
    node: String,
}

/// One running (or, between [`kill`](Self::kill)/[`stop`](Self::stop) and
/// [`restart`](Self::restart), stopped) localkube control plane.
#[derive(Debug)]
pub struct LocalKube {
    binary: PathBuf,
    data_dir: TempDir,
    child: Option<Child>,
    ready: ReadyInfo,
    port: u16,
    keep: bool,
    config: kube::Config,
    /// Extra localkube flags it was started with (kept for restarts).
    args: Vec<String>,
    /// Started with `--real-node`: stopped with SIGTERM even on drop.
    real_node: bool,
}

impl LocalKube {
    /// Starts a localkube on a free port with a fresh data directory and
    /// waits until it is ready (at most [`READY_TIMEOUT`]).
    pub async fn start() -> Result<Self> {
        Self::start_with(&[]).await
    }

    /// Starts a localkube with extra flags of the localkube binary (e.g.
    /// `["--controllers", "*,-garbage-collector-controller"]`), as [`start`](Self::start) does.
    pub async fn start_with(args: &[&str]) -> Result<Self> {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        Self::start_args(args).await
    }

    /// Starts a localkube whose node runs real containers (`--real-node`), with
    /// the images of `deploy/images/build.sh` loaded (among them
    /// [`BUSYBOX_IMAGE`]), and waits until the node is Ready. Fails, naming
    /// what to build or install, where containerd or the images are missing or
    /// the machine cannot run the node.
    pub async fn start_real_node() -> Result<Self> {
        Self::start_real_node_with(&[]).await
    }

    /// [`start_real_node`](Self::start_real_node), with the images `deploy/images/build.sh` built as
    /// `<name>.tar` (e.g. `windvane-agent`, `windvane-server`) loaded too.
    pub async fn start_real_node_with(images: &[&str]) -> Result<Self> {
        let workspace = workspace_dir();
        let containerd = env_path(CONTAINERD_ENV, workspace.join("target/tools/containerd"));
        if !containerd.is_file() {
            bail!(
                "containerd not found at {} (set {CONTAINERD_ENV} or build it: run tests/tools/build-realnode.sh)",
                containerd.display()
            );
        }
        let images_dir = env_path(IMAGES_ENV, workspace.join("target/images"));
        let busybox = images_dir.join("busybox.tar");
        if !busybox.is_file() {
            bail!(
                "image archive {} not found (set {IMAGES_ENV} or build it: run deploy/images/build.sh)",
                busybox.display()
            );
        }
        let mut args = vec![
            "--real-node".to_owned(),
            "--containerd".to_owned(),
            containerd.display().to_string(),
            "--load-image".to_owned(),
            busybox.display().to_string(),
        ];
        for name in images {
            let archive = images_dir.join(format!("{name}.tar"));
            if !archive.is_file() {
                bail!(
                    "image archive {} not found (set {IMAGES_ENV} or build it: run deploy/images/build.sh --binaries target/debug {})",
                    archive.display(),
                    name.trim_start_matches("windvane-")
                );
            }
            args.extend(["--load-image".to_owned(), archive.display().to_string()]);
        }
        Self::start_args(args).await
    }

    async fn start_args(args: Vec<String>) -> Result<Self> {
        let real_node = args.iter().any(|a| a == "--real-node");
        let binary = binary_path()?;
        let keep = std::env::var(KEEP_ENV).is_ok_and(|v| v == "1");
        let mut data_dir = tempfile::Builder::new()
            .prefix("localkube-")
            .tempdir()
            .context("creating a data directory for localkube")?;
        data_dir.disable_cleanup(keep);
        let (child, ready) = spawn_and_wait(&binary, data_dir.path(), 0, keep, &args).await?;
        let port = port_of(&ready.server)?;
        let config = match kube_config(&ready.kubeconfig).await {
            Ok(config) => config,
            Err(e) => {
                let mut child = child;
                kill_group(&mut child);
                return Err(e);
            }
        };
        let kube = Self {
            binary,
            data_dir,
            child: Some(child),
            ready,
            port,
            keep,
            config,
            args,
            real_node,
        };
        // Fail here, not in the first test step, if the kubeconfig is unusable.
        let client = kube::Client::try_from(kube.config.clone())
            .context("building a client for localkube")?;
        if let Ok(minor) = std::env::var(MINOR_ENV) {
            check_minor(&client, &kube.binary, &minor).await?;
        }
        Ok(kube)
    }

    /// A new client for this control plane, authenticated as cluster admin
    /// (`system:masters`). Call it inside a Tokio runtime; each call makes a
    /// fresh client, so one `LocalKube` can serve tests on different runtimes.
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.config.clone())
            .expect("the localkube kubeconfig was checked when it started")
    }

    /// The client configuration for this control plane (cluster admin), to build a client of one's own.
    pub fn config(&self) -> &kube::Config {
        &self.config
    }

    /// The cluster-wide API of an `admissionregistration.k8s.io/v1` kind (`ValidatingAdmissionPolicy`,
    /// `ValidatingAdmissionPolicyBinding`), as cluster admin.
    pub fn admission_api(&self, kind: &str) -> kube::Api<kube::api::DynamicObject> {
        let gvk = kube::core::GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
        kube::Api::all_with(self.client(), &kube::core::ApiResource::from_gvk(&gvk))
    }

    /// One key of a ConfigMap's `data` ("" when the key is absent); an error names the ConfigMap.
    pub async fn config_value(&self, namespace: &str, name: &str, key: &str) -> Result<String> {
        let config = kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(
            self.client(),
            namespace,
        )
        .get(name)
        .await
        .with_context(|| format!("reading ConfigMap {namespace}/{name}"))?;
        Ok(config
            .data
            .and_then(|d| d.get(key).cloned())
            .unwrap_or_default())
    }

    /// The client configuration behind [`client`](Self::client).
    pub fn kube_config(&self) -> &kube::Config {
        &self.config
    }

    /// Path of the admin kubeconfig (certificates embedded).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.ready.kubeconfig
    }

    /// The apiserver URL, `https://127.0.0.1:PORT`. It stays the same across
    /// [`restart`](Self::restart).
    pub fn server_url(&self) -> &str {
        &self.ready.server
    }

    /// The data directory (certificates, etcd data, kubeconfig, log).
    pub fn data_dir(&self) -> &Path {
        self.data_dir.path()
    }

    /// The control plane's log file (stderr of localkube, appended across
    /// restarts).
    pub fn log_path(&self) -> PathBuf {
        self.data_dir.path().join(LOG_FILE)
    }

    /// Name of the fake Node that runs every pod.
    pub fn node_name(&self) -> &str {
        &self.ready.node
    }

    /// Process id of the running localkube, if it is running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Runs a full garbage collection of the control plane (SIGUSR1) and waits until it is complete:
    /// localkube then counts it in `<data dir>/garbage-collections`. A timed run that starts after one does
    /// not pay for the garbage of what ran before it.
    pub async fn collect_garbage(&self) -> Result<()> {
        let pid = self.pid().context("localkube is not running")?;
        let counter = self.data_dir.path().join(COLLECTIONS_FILE);
        let before = collections(&counter)?;
        signal(pid, "USR1", false)?;
        let deadline = Instant::now() + COLLECT_TIMEOUT;
        while collections(&counter)? <= before {
            if Instant::now() >= deadline {
                bail!(
                    "localkube did not finish a garbage collection within {COLLECT_TIMEOUT:?} of SIGUSR1; log tail:\n{}",
                    tail_file(&self.log_path(), LOG_TAIL_LINES)
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// The bundled kubectl (same Kubernetes release) with `--kubeconfig` set
    /// to this control plane, followed by `args`.
    pub fn kubectl<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("kubectl")
            .arg("--kubeconfig")
            .arg(self.kubeconfig_path())
            .args(args);
        cmd
    }

    /// Stops localkube cleanly: SIGTERM, then waits (at most
    /// [`STOP_TIMEOUT`]) for it to exit. Fails if it does not exit with
    /// status 0. A no-op when it is not running.
    pub async fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if let Err(e) = signal(child.id(), "TERM", false) {
            kill_group(&mut child);
            return Err(e);
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait().context("waiting for localkube")? {
                if status.success() {
                    return Ok(());
                }
                bail!(
                    "localkube exited with {status} after SIGTERM; log tail:\n{}",
                    tail_file(&self.log_path(), LOG_TAIL_LINES)
                );
            }
            if Instant::now() >= deadline {
                kill_group(&mut child);
                bail!(
                    "localkube did not exit within {STOP_TIMEOUT:?} of SIGTERM (killed it); log tail:\n{}",
                    tail_file(&self.log_path(), LOG_TAIL_LINES)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills localkube with SIGKILL (its whole process group), as a crash
    /// would, and reaps it. The data directory stays for
    /// [`restart`](Self::restart). A no-op when it is not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_group(&mut child);
        }
    }

    /// Starts localkube again on the same data directory and port (stopping it
    /// cleanly first if it still runs) and waits until it is ready. Objects,
    /// certificates and the kubeconfig survive; clients made before keep
    /// working once it is back.
    pub async fn restart(&mut self) -> Result<()> {
        self.stop().await?;
        let (child, ready) = spawn_and_wait(
            &self.binary,
            self.data_dir.path(),
            self.port,
            self.keep,
            &self.args,
        )
        .await?;
        self.child = Some(child);
        self.ready = ready;
        self.config = kube_config(&self.ready.kubeconfig).await?;
        Ok(())
    }
}

impl Drop for LocalKube {
    fn drop(&mut self) {
        // A real node's pods, containerd and shims outlive a SIGKILL of
        // localkube (they are not in its process group): let it stop them.
        if self.real_node
            && let Some(mut child) = self.child.take()
        {
            stop_blocking(&mut child);
        }
        self.kill();
    }
}

/// SIGTERM, then waits up to [`STOP_TIMEOUT`] without an async runtime (for
/// Drop), then SIGKILLs the group if it is still there.
fn stop_blocking(child: &mut Child) {
    if signal(child.id(), "TERM", false).is_ok() {
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    kill_group(child);
}

/// The workspace's root directory (the tests crate's parent).
fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives inside the workspace")
        .to_path_buf()
}

/// `$var` as a path, else `default`.
fn env_path(var: &str, default: PathBuf) -> PathBuf {
    std::env::var_os(var).map_or(default, PathBuf::from)
}

/// Where the localkube binary is: `$WINDVANE_LOCALKUBE`, else
/// `<workspace>/target/localkube/localkube`.
pub fn binary_path() -> Result<PathBuf> {
    let path = env_path(
        BINARY_ENV,
        workspace_dir().join("target/localkube/localkube"),
    );
    if !path.is_file() {
        bail!(
            "localkube binary not found at {} (set {BINARY_ENV} or build it: run tests/localkube/build.sh)",
            path.display()
        );
    }
    Ok(path)
}

/// Fails unless the API server's `/version` reports Kubernetes 1.`expected`.
async fn check_minor(client: &kube::Client, binary: &Path, expected: &str) -> Result<()> {
    let info = client
        .apiserver_version()
        .await
        .context("reading /version of localkube")?;
    if info.major != "1" || info.minor != expected {
        bail!(
            "{} serves Kubernetes {} but {MINOR_ENV}={expected}: point {BINARY_ENV} at a localkube \
             built by tests/localkube/build.sh --version 1.{expected}",
            binary.display(),
            info.git_version
        );
    }
    Ok(())
}

/// Spawns localkube on `data_dir` (port 0 = any free port) and waits for its
/// ready line. On failure the child is killed and the error carries the log
/// tail. Unless `keep`, localkube deletes `data_dir` itself if this process
/// dies without dropping the [`LocalKube`].
async fn spawn_and_wait(
    binary: &Path,
    data_dir: &Path,
    port: u16,
    keep: bool,
    args: &[String],
) -> Result<(Child, ReadyInfo)> {
    let log_path = data_dir.join(LOG_FILE);
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let mut child = Command::new(binary)
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--port")
        .arg(port.to_string())
        // stdin is a pipe held by `Child`: if this test process dies without
        // running Drop, localkube sees EOF and shuts down by itself (and
        // removes the data directory nobody will clean up).
        .arg(if keep {
            "--exit-with-stdin"
        } else {
            "--remove-data-dir-on-stdin-eof"
        })
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        // Its own process group, so Drop can kill everything it started.
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;

    let stdout = child.stdout.take().expect("stdout is piped");
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("localkube-stdout".into())
        .spawn(move || read_ready_line(stdout, tx))
        .context("starting the localkube stdout reader")?;

    let outcome = tokio::time::timeout(READY_TIMEOUT, rx).await;
    let failure = match outcome {
        Ok(Ok(Ok(ready))) => return Ok((child, ready)),
        Ok(Ok(Err(e))) => e,
        Ok(Err(_)) => anyhow!("the localkube stdout reader stopped"),
        Err(_) => anyhow!("localkube was not ready within {READY_TIMEOUT:?}"),
    };
    let status = child.try_wait().ok().flatten();
    kill_group(&mut child);
    Err(failure.context(format!(
        "starting localkube on {} ({}); log tail:\n{}",
        data_dir.display(),
        describe_exit(status),
        tail_file(&log_path, LOG_TAIL_LINES)
    )))
}

/// Reads localkube's stdout: sends the ready line (or an error at EOF), then
/// drains the rest so localkube never blocks on a full pipe.
fn read_ready_line(stdout: impl Read, tx: oneshot::Sender<Result<ReadyInfo>>) {
    let mut tx = Some(tx);
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        if let Some(json) = line.strip_prefix(READY_PREFIX)
            && let Some(tx) = tx.take()
        {
            let parsed = serde_json::from_str::<ReadyInfo>(json)
                .with_context(|| format!("parsing the localkube ready line {line:?}"));
            let _ = tx.send(parsed);
        }
    }
    if let Some(tx) = tx {
        let _ = tx.send(Err(anyhow!("localkube exited before it was ready")));
    }
}

fn describe_exit(status: Option<ExitStatus>) -> String {
    match status {
        Some(s) => format!("it exited with {s}"),
        None => "it was still running".to_owned(),
    }
}

async fn kube_config(kubeconfig: &Path) -> Result<kube::Config> {
    let file = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
        .await
        .with_context(|| format!("loading {}", kubeconfig.display()))
}

fn port_of(server: &str) -> Result<u16> {
    server
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .ok_or_else(|| anyhow!("no port in localkube server URL {server:?}"))
}

/// Sends `kill -SIG` to a pid, or to its process group when `group`.
fn signal(pid: u32, sig: &str, group: bool) -> Result<()> {
    let target = if group {
        format!("-{pid}")
    } else {
        pid.to_string()
    };
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg("--")
        .arg(&target)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("running kill")?;
    if !status.success() {
        bail!("kill -{sig} -- {target} failed: {status}");
    }
    Ok(())
}

/// How many collections localkube counted in `path` (none before the first).
fn collections(path: &Path) -> Result<u64> {
    match std::fs::read_to_string(path) {
        Ok(text) => text
            .trim()
            .parse()
            .with_context(|| format!("{} holds {text:?}, not a count", path.display())),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(error) => Err(error).with_context(|| format!("reading {}", path.display())),
    }
}

/// SIGKILLs the child's process group (the child leads it) and reaps the
/// child. Errors are ignored: the process may be gone already.
fn kill_group(child: &mut Child) {
    if matches!(child.try_wait(), Ok(Some(_))) {
        return;
    }
    let _ = signal(child.id(), "KILL", true);
    let _ = child.kill();
    let _ = child.wait();
}
