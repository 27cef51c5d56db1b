//! The agent under test: the release build of `windvane-agent run`, started as a child process with the same
//! flags the end-to-end tests use (`windvane_tests::fleet::Agent::start`), but from `target/release` and with
//! a ServiceAccount kubeconfig, its own state namespace and the default (info) log level. Its admin
//! endpoints (`/metrics`, `/status`) and its memory (`/proc/PID/status`) are read from here.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use windvane_tests::localkube::LocalKube;
use windvane_tests::process::{ChildProcess, free_port, tail};

use crate::prom::{self, Sample};

/// How to start one agent.
#[derive(Debug, Clone)]
pub struct AgentLaunch {
    pub binary: PathBuf,
    pub source: String,
    pub trusted_key: PathBuf,
    pub fleet: String,
    pub cluster: String,
    pub kubeconfig: PathBuf,
    /// Namespace of the agent's state Secrets and Lease (created here first, as the deploy manifests do).
    pub namespace: String,
    pub identity: String,
    pub log: PathBuf,
    /// Extra environment variables for the agent (e.g. allocator settings to experiment with).
    pub env: Vec<(String, String)>,
    /// Extra flags for `windvane-agent run`.
    pub args: Vec<String>,
    /// A command the agent runs under (e.g. `heaptrack -o FILE`); empty to run it directly. Memory and CPU
    /// figures are then the wrapper's.
    pub wrapper: Vec<String>,
}

pub use windvane_tests::procfs::{Memory, read_memory};

/// A running agent; killed on drop.
#[derive(Debug)]
pub struct AgentProcess {
    process: ChildProcess,
    admin: SocketAddr,
    http: reqwest::Client,
}

impl AgentProcess {
    /// Creates the agent's state namespace, as the deploy manifests do (before any timing starts).
    pub async fn prepare_namespace(kube: &LocalKube, namespace: &str) -> anyhow::Result<()> {
        Api::<Namespace>::all(kube.client())
            .patch(
                namespace,
                &PatchParams::apply("windvane-bench").force(),
                &Patch::Apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})),
            )
            .await?;
        Ok(())
    }

    /// Starts `windvane-agent run`. It polls the store at once, then every 10 s; polls touch the store only,
    /// never the apiserver.
    pub fn start(launch: &AgentLaunch) -> anyhow::Result<Self> {
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let agent_args = [
            "run",
            "--source",
            &launch.source,
            "--channel",
            "stable",
            "--trusted-key",
            &launch.trusted_key.display().to_string(),
            "--fleet",
            &launch.fleet,
            "--cluster",
            &launch.cluster,
            "--kubeconfig",
            &launch.kubeconfig.display().to_string(),
            "--namespace",
            &launch.namespace,
            "--poll-interval",
            "10s",
            "--admin-listen",
            &admin.to_string(),
            "--identity",
            &launch.identity,
        ]
        .map(str::to_owned)
        .into_iter()
        .chain(launch.args.iter().cloned());
        let (program, args) = match launch.wrapper.split_first() {
            None => (launch.binary.clone(), agent_args.collect()),
            Some((wrapper, wrapper_args)) => {
                let mut args = wrapper_args.to_vec();
                args.push(launch.binary.display().to_string());
                args.extend(agent_args);
                (PathBuf::from(wrapper), args)
            }
        };
        let mut env = vec![("WINDVANE_LOG", "info,kube=warn,hyper=warn,rustls=warn")];
        env.extend(launch.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let process = ChildProcess::start("windvane-agent", &program, &args, &env, &launch.log)?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()?;
        Ok(Self {
            process,
            admin,
            http,
        })
    }

    async fn get(&self, path: &str) -> anyhow::Result<String> {
        let response = self
            .http
            .get(format!("http://{}{path}", self.admin))
            .send()
            .await?
            .error_for_status()?;
        Ok(response.text().await?)
    }

    /// The agent's `/metrics`, parsed.
    pub async fn metrics(&self) -> anyhow::Result<Vec<Sample>> {
        Ok(prom::parse(&self.get("/metrics").await?))
    }

    /// The agent's `/status`.
    pub async fn status(&self) -> anyhow::Result<Value> {
        Ok(serde_json::from_str(&self.get("/status").await?)?)
    }

    /// The agent's memory now.
    pub fn memory(&self) -> anyhow::Result<Memory> {
        read_memory(self.pid()?)
    }

    /// The agent's process id.
    pub fn pid(&self) -> anyhow::Result<u32> {
        self.process.pid().context("the agent is not running")
    }

    /// The agent's log so far.
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// The last lines of the agent's log, for error messages.
    pub fn log_tail(&self) -> String {
        tail(&self.process.log(), 40)
    }

    /// Fails, with the log's tail, if the agent exited.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.process.is_running(),
            "the agent exited; log tail:\n{}",
            self.log_tail()
        );
        Ok(())
    }

    /// Stops the agent (SIGTERM, then waits).
    pub fn stop(&mut self) {
        let _ = self.process.terminate();
    }
}

/// The workspace's `target/release/windvane-agent`.
pub fn default_binary() -> PathBuf {
    workspace().join("target/release/windvane-agent")
}

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives inside the workspace")
        .to_path_buf()
}

/// Warnings about the agent binary: missing is an error; older than the agent's or shared's sources is a
/// warning (the benchmark would measure old code).
pub fn check_binary(binary: &Path) -> anyhow::Result<Option<String>> {
    let built = std::fs::metadata(binary)
        .and_then(|m| m.modified())
        .with_context(|| {
            format!(
                "{} is missing: build it first with `cargo build --release -p windvane-agent`",
                binary.display()
            )
        })?;
    let root = workspace();
    let newest = ["agent/src", "shared/src"]
        .iter()
        .filter_map(|dir| newest_file(&root.join(dir)))
        .max_by_key(|(time, _)| *time);
    Ok(newest.filter(|(time, _)| *time > built).map(|(_, path)| {
        format!(
            "{} is older than {} — rebuild it (cargo build --release -p windvane-agent) to measure the current code",
            binary.display(),
            path.display()
        )
    }))
}

pub fn newest_file(dir: &Path) -> Option<(SystemTime, PathBuf)> {
    let mut newest: Option<(SystemTime, PathBuf)> = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        let candidate = if path.is_dir() {
            newest_file(&path)
        } else {
            entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .map(|t| (t, path))
        };
        if let Some(candidate) = candidate
            && newest.as_ref().is_none_or(|(t, _)| candidate.0 > *t)
        {
            newest = Some(candidate);
        }
    }
    newest
}
