//! Fleet fixtures for end-to-end tests: a fleet source tree written from strings, a publisher that signs
//! releases into a store directory (through the same library `windvane publish` uses, or by running the
//! real command line), and the real
//! `windvane-agent` binary run against a localkube, with its admin endpoints read over HTTP; and a
//! [`Cluster`] — a localkube with its agent — for tests and the demo that run a whole fleet. The server
//! they report to is [`crate::server::SourceServer`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use ed25519_dalek::SigningKey;
use serde_json::Value;
use tempfile::TempDir;
use windvane_shared::crypto::keys::{TrustedKeys, signing_key_from_seed, verifying_key_to_pem};
use windvane_shared::format::bundle::BundleLimits;
use windvane_shared::format::release::ReleasePointer;
use windvane_store::{self as store, PublishRequest};

use crate::localkube::LocalKube;
use crate::poll::wait_for;
use crate::process::{ChildProcess, STOP_GRACE, binary, free_port, tail};

/// A fleet source tree in a temporary directory.
#[derive(Debug)]
pub struct FleetTree {
    dir: TempDir,
}

impl FleetTree {
    /// An empty tree.
    pub fn new() -> anyhow::Result<Self> {
        Ok(Self {
            dir: TempDir::new()?,
        })
    }

    /// A copy of the tree at `dir` (every file, recursively), which the test can change for later releases.
    pub fn copy_of(dir: &Path) -> anyhow::Result<Self> {
        let tree = Self::new()?;
        copy_files(dir, dir, tree.path())?;
        Ok(tree)
    }

    /// A copy of the example fleet `deploy/examples/fleet` of this repository.
    pub fn example() -> anyhow::Result<Self> {
        Self::copy_of(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/fleet"))
    }

    /// Writes (or overwrites) a file of the tree.
    pub fn write(&self, relative: &str, contents: &str) -> anyhow::Result<&Self> {
        let path = self.dir.path().join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
        Ok(self)
    }

    /// Removes a file of the tree.
    pub fn remove(&self, relative: &str) -> anyhow::Result<()> {
        Ok(std::fs::remove_file(self.dir.path().join(relative))?)
    }

    /// The tree's root.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

fn copy_files(root: &Path, dir: &Path, to: &Path) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            copy_files(root, &path, to)?;
        } else {
            let target = to.join(path.strip_prefix(root)?);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::copy(&path, &target)
                .with_context(|| format!("copying {} to {}", path.display(), target.display()))?;
        }
    }
    Ok(())
}

/// Every file under `dir` (recursively) and its bytes, keyed by its path relative to `dir`: compare two
/// snapshots to tell whether a store changed at all.
pub fn snapshot_files(dir: &Path) -> anyhow::Result<BTreeMap<PathBuf, Vec<u8>>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) -> anyhow::Result<()> {
        for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                walk(root, &path, out)?;
            } else {
                let bytes =
                    std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
                out.insert(path.strip_prefix(root)?.to_path_buf(), bytes);
            }
        }
        Ok(())
    }
    let mut files = BTreeMap::new();
    walk(dir, dir, &mut files)?;
    Ok(files)
}

/// Signs and publishes releases into a store directory.
#[derive(Debug)]
pub struct Publisher {
    dir: TempDir,
    key: SigningKey,
}

impl Publisher {
    /// A publisher whose release key derives from `seed` (distinct seeds make distinct keys).
    pub fn new(seed: u8) -> anyhow::Result<Self> {
        let dir = TempDir::new()?;
        let key = signing_key_from_seed([seed; 32]);
        std::fs::write(
            dir.path().join("release.pub"),
            verifying_key_to_pem(&key.verifying_key()),
        )?;
        std::fs::create_dir_all(dir.path().join("store"))?;
        Ok(Self { dir, key })
    }

    /// The store directory.
    pub fn store(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    /// The release public key file agents trust.
    pub fn public_key_path(&self) -> PathBuf {
        self.dir.path().join("release.pub")
    }

    /// Publishes the tree on `channel` (expiring in a day).
    pub fn publish(&self, tree: &FleetTree, channel: &str) -> anyhow::Result<ReleasePointer> {
        self.publish_with(tree, channel, Duration::from_secs(86_400), false)
    }

    /// Publishes with an explicit expiry and allow_empty.
    pub fn publish_with(
        &self,
        tree: &FleetTree,
        channel: &str,
        expires_in: Duration,
        allow_empty: bool,
    ) -> anyhow::Result<ReleasePointer> {
        let bundle =
            windvane_publisher::source::load_fleet_dir(tree.path(), BundleLimits::default())?;
        let request = PublishRequest {
            channel,
            bundle: &bundle,
            key: &self.key,
            also_trusted: &TrustedKeys::new(),
            expires_in,
            allow_empty,
            now: jiff::Timestamp::now(),
        };
        Ok(store::publish_dir(&self.store(), &request)?.pointer)
    }

    /// Publishes the tree on `channel` with the real `windvane publish` command line, as an operator would
    /// (signing with the key [`Publisher::key_path`] writes); its output, or an error carrying it.
    pub fn publish_cli(&self, tree: &FleetTree, channel: &str) -> anyhow::Result<String> {
        let output = std::process::Command::new(binary("windvane")?)
            .arg("publish")
            .arg(tree.path())
            .arg("--root")
            .arg(self.store())
            .arg("--channel")
            .arg(channel)
            .arg("--key")
            .arg(self.key_path()?)
            .output()
            .context("running windvane publish")?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        anyhow::ensure!(
            output.status.success(),
            "windvane publish failed ({}):\n{stdout}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(stdout)
    }

    /// Writes the release signing key (PKCS#8 PEM, mode 0600) for the `windvane` command line; its path.
    pub fn key_path(&self) -> anyhow::Result<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        let path = self.dir.path().join("release.key");
        std::fs::write(
            &path,
            windvane_shared::crypto::keys::signing_key_to_pem(&self.key),
        )?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        Ok(path)
    }

    /// The channel pointer file.
    pub fn pointer_path(&self, channel: &str) -> PathBuf {
        self.store().join(store::channel_path(channel))
    }
}

/// The namespace the agent keeps its state and Lease in (the agent's default).
pub const AGENT_NAMESPACE: &str = "windvane-system";

/// How to start an agent.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    pub source: String,
    pub channel: String,
    pub trusted_keys: Vec<PathBuf>,
    pub fleet: String,
    pub cluster: String,
    pub labels: Vec<String>,
    pub poll_interval: String,
    pub identity: String,
    /// The kubeconfig the agent uses; `None`: the localkube's admin kubeconfig.
    pub kubeconfig: Option<PathBuf>,
    pub extra: Vec<String>,
}

impl AgentOptions {
    /// Defaults for tests: channel `stable`, fleet `acme`, 1 s polls.
    pub fn new(source: &str, trusted_key: &Path, cluster: &str) -> Self {
        Self {
            source: source.to_owned(),
            channel: "stable".to_owned(),
            trusted_keys: vec![trusted_key.to_path_buf()],
            fleet: "acme".to_owned(),
            cluster: cluster.to_owned(),
            labels: Vec::new(),
            poll_interval: "1s".to_owned(),
            identity: format!("{cluster}-agent"),
            kubeconfig: None,
            extra: Vec::new(),
        }
    }

    /// Reports to a source server: enrols with the registration token in `token_file`, then heartbeats
    /// every `heartbeat_interval` (e.g. `1s`).
    pub fn reporting_to(
        mut self,
        server: &str,
        token_file: &Path,
        heartbeat_interval: &str,
    ) -> Self {
        self.extra.extend([
            "--server".to_owned(),
            server.to_owned(),
            "--registration-token-file".to_owned(),
            token_file.display().to_string(),
            "--heartbeat-interval".to_owned(),
            heartbeat_interval.to_owned(),
        ]);
        self
    }
}

/// A running `windvane-agent run`.
#[derive(Debug)]
pub struct Agent {
    pub process: ChildProcess,
    pub admin: SocketAddr,
    http: reqwest::Client,
}

impl Agent {
    /// Starts the agent binary against `kube`, logging to the kube's data directory. Creates the agent's
    /// namespace first, as the deploy manifests do.
    pub async fn start(kube: &LocalKube, options: &AgentOptions) -> anyhow::Result<Self> {
        let log = kube
            .data_dir()
            .join(format!("agent-{}.log", options.identity));
        Self::start_with(kube, options, &binary("windvane-agent")?, &log).await
    }

    /// Starts the agent binary `program` against `kube`, appending its output to `log`. Creates the agent's
    /// namespace first, as the deploy manifests do.
    pub async fn start_with(
        kube: &LocalKube,
        options: &AgentOptions,
        program: &Path,
        log: &Path,
    ) -> anyhow::Result<Self> {
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
            kube::Api::all(kube.client());
        let namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": AGENT_NAMESPACE}}))?;
        match namespaces.create(&Default::default(), &namespace).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(error.into()),
        }
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let keys: Vec<String> = options
            .trusted_keys
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let mut args = vec![
            "run".to_owned(),
            "--source".to_owned(),
            options.source.clone(),
            "--channel".to_owned(),
            options.channel.clone(),
            "--trusted-key".to_owned(),
            keys.join(","),
            "--fleet".to_owned(),
            options.fleet.clone(),
            "--cluster".to_owned(),
            options.cluster.clone(),
            "--kubeconfig".to_owned(),
            options
                .kubeconfig
                .as_deref()
                .unwrap_or(kube.kubeconfig_path())
                .display()
                .to_string(),
            "--poll-interval".to_owned(),
            options.poll_interval.clone(),
            "--admin-listen".to_owned(),
            admin.to_string(),
            "--identity".to_owned(),
            options.identity.clone(),
        ];
        for label in &options.labels {
            args.extend(["--label".to_owned(), label.clone()]);
        }
        args.extend(options.extra.iter().cloned());
        let process = ChildProcess::start(
            "windvane-agent",
            program,
            &args,
            &[("WINDVANE_LOG", "info,windvane_agent=debug,kube=warn")],
            log,
        )?;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()?;
        Ok(Self {
            process,
            admin,
            http,
        })
    }

    async fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let response = self
            .http
            .get(format!("http://{}{path}", self.admin))
            .send()
            .await?;
        Ok((response.status().as_u16(), response.text().await?))
    }

    /// `/status` as JSON.
    pub async fn status(&self) -> anyhow::Result<Value> {
        let (_, body) = self.get("/status").await?;
        Ok(serde_json::from_str(&body)?)
    }

    /// `/metrics` text.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        Ok(self.get("/metrics").await?.1)
    }

    /// `/readyz` status code.
    pub async fn readyz(&self) -> anyhow::Result<u16> {
        Ok(self.get("/readyz").await?.0)
    }

    /// Polls `/status` until `check` holds; on timeout the error carries the last status and the agent's log.
    pub async fn wait_status(
        &self,
        what: &str,
        timeout: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Value> {
        let last = std::sync::Mutex::new(Value::Null);
        let result = wait_for(what, timeout, || async {
            let status = self.status().await?;
            *last.lock().expect("lock") = status.clone();
            Ok(check(&status).then_some(status))
        })
        .await;
        result.with_context(|| {
            format!(
                "last status: {}\nagent log:\n{}",
                last.lock().expect("lock"),
                tail(&self.process.log(), 60)
            )
        })
    }
}

/// One member of a test fleet: a localkube and the real agent on it, which can be stopped and started
/// again (its identity key stays in the cluster, so it resumes heartbeating as the same cluster).
#[derive(Debug)]
pub struct Cluster {
    pub kube: LocalKube,
    pub options: AgentOptions,
    agent: Option<Agent>,
    program: PathBuf,
    log: PathBuf,
}

impl Cluster {
    /// Starts a localkube and `windvane-agent` (from the test's target directory) on it; the agent logs
    /// into the localkube's data directory.
    pub async fn start(options: AgentOptions) -> anyhow::Result<Self> {
        let program = binary("windvane-agent")?;
        let kube = LocalKube::start().await?;
        let log = kube
            .data_dir()
            .join(format!("agent-{}.log", options.identity));
        Self::start_on(kube, options, program, log).await
    }

    /// Starts the agent binary `program` on a running `kube`, appending its output to `log`.
    pub async fn start_on(
        kube: LocalKube,
        options: AgentOptions,
        program: PathBuf,
        log: PathBuf,
    ) -> anyhow::Result<Self> {
        let agent = Agent::start_with(&kube, &options, &program, &log).await?;
        Ok(Self {
            kube,
            options,
            agent: Some(agent),
            program,
            log,
        })
    }

    /// The cluster's name.
    pub fn name(&self) -> &str {
        &self.options.cluster
    }

    /// The running agent.
    pub fn agent(&self) -> anyhow::Result<&Agent> {
        self.agent
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("the agent of {} is stopped", self.name()))
    }

    /// The agent's process id, while it runs.
    pub fn agent_pid(&self) -> Option<u32> {
        self.agent.as_ref().and_then(|a| a.process.pid())
    }

    /// The agent's log file.
    pub fn agent_log_path(&self) -> &Path {
        &self.log
    }

    /// The agent's log so far.
    pub fn agent_log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops the agent (SIGTERM; killed after [`STOP_GRACE`]). Returns whether it exited on its own.
    pub async fn stop_agent(&mut self) -> bool {
        match self.agent.take() {
            Some(mut agent) => agent.process.stop(STOP_GRACE).await,
            None => true,
        }
    }

    /// Starts the agent again with the same options (a new admin port).
    pub async fn start_agent(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.agent.is_none(),
            "the agent of {} already runs",
            self.name()
        );
        self.agent =
            Some(Agent::start_with(&self.kube, &self.options, &self.program, &self.log).await?);
        Ok(())
    }

    /// Stops the agent, then localkube, both cleanly. Returns whether the agent exited on its own.
    pub async fn stop(&mut self) -> anyhow::Result<bool> {
        let agent = self.stop_agent().await;
        self.kube.stop().await?;
        Ok(agent)
    }
}

/// The state the agent reports for an object (`kind ns/name`), if it lists it.
pub fn object_state<'a>(status: &'a Value, object: &str) -> Option<&'a str> {
    status["objects"]
        .as_array()?
        .iter()
        .find(|o| o["object"] == object)?["state"]
        .as_str()
}

/// The value of one sample (`name{labels}` exactly as exposed) in a Prometheus text exposition.
/// The sum of every sample of a metric family (over all its labels) in a Prometheus text; 0 when absent.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(sample, _)| *sample == name || sample.starts_with(&format!("{name}{{")))
        .filter_map(|(_, value)| value.parse::<f64>().ok())
        .sum()
}

pub fn metric(text: &str, sample: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == sample).then(|| value.parse().ok()).flatten()
        })
}
