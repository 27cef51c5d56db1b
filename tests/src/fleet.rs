//! Fleet fixtures for end-to-end tests: a fleet source tree written from strings, a publisher that signs
//! releases into a store directory (through the same library `windvane publish` uses), and the real
//! `windvane-agent` binary run against a localkube, with its admin endpoints read over HTTP.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use ed25519_dalek::SigningKey;
use serde_json::Value;
use tempfile::TempDir;
use windvane_shared::bundle::BundleLimits;
use windvane_shared::keys::{TrustedKeys, signing_key_from_seed, verifying_key_to_pem};
use windvane_shared::release::ReleasePointer;
use windvane_source_server::store::{self, PublishRequest};

use crate::localkube::{LocalKube, wait_for};
use crate::process::{ChildProcess, binary};

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
        let bundle = windvane_shared::source::load_fleet_dir(tree.path(), BundleLimits::default())?;
        let request = PublishRequest {
            channel,
            bundle: &bundle,
            key: &self.key,
            also_trusted: &TrustedKeys::new(),
            expires_in,
            allow_empty,
            now: jiff::Timestamp::now(),
        };
        Ok(store::publish(&self.store(), &request)?.pointer)
    }

    /// The channel pointer file.
    pub fn pointer_path(&self, channel: &str) -> PathBuf {
        self.store().join(store::channel_path(channel))
    }
}

/// The namespace the agent keeps its state and Lease in (the agent's default).
pub const AGENT_NAMESPACE: &str = "windvane-system";

/// A free loopback port (bound and released; good enough for tests on one machine).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

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
            extra: Vec::new(),
        }
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
            kube.kubeconfig_path().display().to_string(),
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
        let log = kube
            .data_dir()
            .join(format!("agent-{}.log", options.identity));
        let process = ChildProcess::start(
            "windvane-agent",
            &binary("windvane-agent")?,
            &args,
            &[("WINDVANE_LOG", "info,windvane_agent=debug,kube=warn")],
            &log,
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

/// The last `lines` lines of a log.
pub fn tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A running `windvane-server serve` on a loopback port, serving `root` and ingesting heartbeats.
#[derive(Debug)]
pub struct SourceServer {
    pub process: ChildProcess,
    pub url: String,
    _dir: TempDir,
    pub token_file: PathBuf,
}

impl SourceServer {
    /// Starts the server on a free port, with a registration token file and a fresh data directory.
    pub async fn start(root: &Path, extra: &[&str]) -> anyhow::Result<Self> {
        let dir = TempDir::new()?;
        let token_file = dir.path().join("registration-token");
        std::fs::write(&token_file, "fleet-registration-token-for-tests\n")?;
        let listen = format!("127.0.0.1:{}", free_port()?);
        let mut args = vec![
            "serve".to_owned(),
            "--root".to_owned(),
            root.display().to_string(),
            "--listen".to_owned(),
            listen.clone(),
            "--data".to_owned(),
            dir.path().join("data").display().to_string(),
            "--registration-token-file".to_owned(),
            token_file.display().to_string(),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let process = ChildProcess::start(
            "windvane-server",
            &binary("windvane-server")?,
            &args,
            &[],
            &dir.path().join("server.log"),
        )?;
        let url = format!("http://{listen}");
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::new();
        wait_for("windvane-server ready", Duration::from_secs(30), || async {
            Ok(http
                .get(format!("{url}/readyz"))
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success())
                .map(|_| ()))
        })
        .await
        .with_context(|| tail(&process.log(), 40))?;
        Ok(Self {
            process,
            url,
            _dir: dir,
            token_file,
        })
    }

    /// GETs a JSON API path.
    pub async fn api(&self, path: &str) -> anyhow::Result<Value> {
        let response = reqwest::get(format!("{}{path}", self.url)).await?;
        anyhow::ensure!(
            response.status().is_success(),
            "GET {path}: {}",
            response.status()
        );
        Ok(serde_json::from_str(&response.text().await?)?)
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
