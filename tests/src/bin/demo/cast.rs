//! The demo's cast and its stage: a work directory (release key, store, the server's database, every log),
//! the real `windvane` command line, one `windvane-server`, and localkube clusters each with the real
//! `windvane-agent` enrolled and heartbeating. Everything started here is stopped by [`Demo::teardown`],
//! which reports the process ids it stopped and the directories it removed, so a caller (the demo's test)
//! can check that nothing is left.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use base64::Engine as _;
use tempfile::TempDir;
use windvane_tests::fleet::{AgentOptions, Cluster};
use windvane_tests::localkube::LocalKube;
use windvane_tests::server::SourceServer;

use crate::narrate::Narrator;

/// What the demo was asked to do (from the command line).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Directory with `windvane`, `windvane-agent` and `windvane-server`.
    pub bin_dir: PathBuf,
    /// The fleet source tree to publish.
    pub fleet_dir: PathBuf,
    /// The server's listen address (port 0: any free port).
    pub listen: String,
    pub heartbeat_interval: String,
    pub poll_interval: String,
    pub unknown_after: String,
    /// The longest the demo waits for any one thing to happen.
    pub step_timeout: Duration,
    /// Keep the work directory at exit.
    pub keep: bool,
}

/// One cluster of the story: its name and labels.
#[derive(Debug, Clone, Copy)]
pub struct Member {
    pub name: &'static str,
    pub env: &'static str,
    pub region: &'static str,
}

impl Member {
    pub fn labels(&self) -> String {
        format!("env={},region={}", self.env, self.region)
    }
}

pub const PROD_EU: Member = Member {
    name: "prod-eu",
    env: "prod",
    region: "eu",
};
pub const PROD_US: Member = Member {
    name: "prod-us",
    env: "prod",
    region: "us",
};
pub const STAGING_EU: Member = Member {
    name: "staging-eu",
    env: "staging",
    region: "eu",
};
pub const PROD_AP: Member = Member {
    name: "prod-ap",
    env: "prod",
    region: "ap",
};

/// The channel and fleet the story uses (the example fleet is `acme`).
pub const CHANNEL: &str = "stable";
pub const FLEET: &str = "acme";

/// Everything the demo started.
#[derive(Debug)]
pub struct Demo {
    pub settings: Settings,
    pub say: Narrator,
    work: Option<TempDir>,
    work_path: PathBuf,
    server: Option<SourceServer>,
    clusters: Vec<Cluster>,
    /// Every process started: what it is and its id.
    started: Vec<(String, u32)>,
    /// Every localkube data directory (removed when its localkube is dropped).
    kube_dirs: Vec<PathBuf>,
}

impl Demo {
    /// Creates the work directory; starts nothing yet.
    pub fn new(settings: Settings, say: Narrator) -> anyhow::Result<Self> {
        for name in ["windvane", "windvane-agent", "windvane-server"] {
            let path = settings.bin_dir.join(name);
            if !path.is_file() {
                bail!(
                    "{} is missing: build the binaries first (cargo build --release --bins, or run ./demo), \
                     or point --bin-dir at them",
                    path.display()
                );
            }
        }
        windvane_tests::localkube::binary_path()?;
        let work = tempfile::Builder::new()
            .prefix("windvane-demo-")
            .tempdir()
            .context("creating the demo's work directory")?;
        let work_path = work.path().to_path_buf();
        std::fs::create_dir_all(work_path.join("logs"))?;
        std::fs::create_dir_all(work_path.join("server"))?;
        Ok(Self {
            settings,
            say,
            work: Some(work),
            work_path,
            server: None,
            clusters: Vec::new(),
            started: Vec::new(),
            kube_dirs: Vec::new(),
        })
    }

    /// The work directory.
    pub fn work(&self) -> &Path {
        &self.work_path
    }

    /// A path in the work directory.
    pub fn path(&self, relative: &str) -> PathBuf {
        self.work_path.join(relative)
    }

    /// Runs `windvane ARGS` in the work directory; its standard output, or an error with its stderr.
    pub fn windvane(&self, args: &[&str]) -> anyhow::Result<String> {
        let output = Command::new(self.settings.bin_dir.join("windvane"))
            .args(args)
            .current_dir(&self.work_path)
            .output()
            .context("running windvane")?;
        if !output.status.success() {
            bail!(
                "windvane {} failed ({}): {}{}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Starts `windvane-server serve` on the store with fresh random registration and admin tokens.
    pub async fn start_server(&mut self) -> anyhow::Result<&SourceServer> {
        let dir = self.path("server");
        for file in ["registration-token", "admin-token"] {
            let mut token = [0u8; 32];
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut token))
                .with_context(|| format!("reading /dev/urandom for the {file}"))?;
            std::fs::write(
                dir.join(file),
                base64::engine::general_purpose::STANDARD.encode(token) + "\n",
            )?;
        }
        let server = SourceServer::start_in(
            &self.settings.bin_dir.join("windvane-server"),
            &self.path("store"),
            &dir,
            &self.settings.listen,
            &["--unknown-after", &self.settings.unknown_after],
        )
        .await?;
        if let Some(pid) = server.process.pid() {
            self.started.push(("windvane-server".to_owned(), pid));
        }
        Ok(self.server.insert(server))
    }

    /// The running server.
    pub fn server(&self) -> anyhow::Result<&SourceServer> {
        self.server
            .as_ref()
            .context("the source server is not running")
    }

    /// Starts a localkube and an agent for each member, side by side.
    pub async fn start_clusters(&mut self, members: &[Member]) -> anyhow::Result<()> {
        let server = self.server()?;
        let starts = members.iter().map(|member| {
            let mut options =
                AgentOptions::new(&server.url, &self.path("release.pub"), member.name)
                    .reporting_to(
                        &server.url,
                        &server.token_file,
                        &self.settings.heartbeat_interval,
                    );
            options.channel = CHANNEL.to_owned();
            options.fleet = FLEET.to_owned();
            options.labels = vec![
                format!("env={}", member.env),
                format!("region={}", member.region),
            ];
            options.poll_interval = self.settings.poll_interval.clone();
            let program = self.settings.bin_dir.join("windvane-agent");
            let log = self.path(&format!("logs/agent-{}.log", member.name));
            async move {
                let kube = LocalKube::start()
                    .await
                    .with_context(|| format!("starting localkube for {}", member.name))?;
                Cluster::start_on(kube, options, program, log)
                    .await
                    .with_context(|| format!("starting the agent of {}", member.name))
            }
        });
        let started = futures::future::try_join_all(starts).await?;
        for cluster in started {
            if let Some(pid) = cluster.kube.pid() {
                self.started
                    .push((format!("localkube {}", cluster.name()), pid));
            }
            if let Some(pid) = cluster.agent_pid() {
                self.started
                    .push((format!("windvane-agent {}", cluster.name()), pid));
            }
            self.kube_dirs.push(cluster.kube.data_dir().to_path_buf());
            self.clusters.push(cluster);
        }
        Ok(())
    }

    /// A running cluster by name.
    pub fn cluster(&self, name: &str) -> anyhow::Result<&Cluster> {
        self.clusters
            .iter()
            .find(|c| c.name() == name)
            .with_context(|| format!("no cluster {name}"))
    }

    /// A running cluster by name, to stop or start its agent.
    pub fn cluster_mut(&mut self, name: &str) -> anyhow::Result<&mut Cluster> {
        self.clusters
            .iter_mut()
            .find(|c| c.name() == name)
            .with_context(|| format!("no cluster {name}"))
    }

    /// Stops everything: the agents, then the clusters, then the server; removes the work directory unless
    /// kept, and the localkube data directories. Says what it stopped and removed.
    pub async fn teardown(&mut self) -> anyhow::Result<()> {
        self.say.say("Stopping everything");
        let mut problems = Vec::new();
        for cluster in &mut self.clusters {
            if !cluster.stop_agent().await {
                problems.push(format!("the agent of {} had to be killed", cluster.name()));
            }
        }
        let stops = self.clusters.iter_mut().map(|c| async move {
            let name = c.name().to_owned();
            c.kube
                .stop()
                .await
                .map_err(|e| format!("localkube {name}: {e:#}"))
        });
        for result in futures::future::join_all(stops).await {
            if let Err(problem) = result {
                problems.push(problem);
            }
        }
        // Dropping a cluster kills whatever is left of it and removes its data directory.
        self.clusters.clear();
        if let Some(server) = &mut self.server
            && !server.stop().await
        {
            problems.push("the source server had to be killed".to_owned());
        }
        self.server = None;

        let pids: Vec<String> = self
            .started
            .iter()
            .map(|(_, pid)| pid.to_string())
            .collect();
        let alive: Vec<&(String, u32)> = self
            .started
            .iter()
            .filter(|(_, pid)| Path::new(&format!("/proc/{pid}")).exists())
            .collect();
        self.say.detail(&format!(
            "stopped pids: {} ({} processes: server, localkubes, agents)",
            pids.join(" "),
            pids.len()
        ));
        for (what, pid) in &alive {
            problems.push(format!("{what} (pid {pid}) is still running"));
        }

        let mut removed: Vec<String> = self
            .kube_dirs
            .iter()
            .filter(|d| !d.exists())
            .map(|d| d.display().to_string())
            .collect();
        if let Some(work) = self.work.take() {
            if self.settings.keep {
                self.say.detail(&format!(
                    "kept: {} (release key, store, server database, logs)",
                    work.keep().display()
                ));
            } else {
                let path = work.path().display().to_string();
                work.close().with_context(|| format!("removing {path}"))?;
                removed.insert(0, path);
            }
        }
        self.say.detail(&format!("removed: {}", removed.join(" ")));
        if !problems.is_empty() {
            bail!("teardown: {}", problems.join("; "));
        }
        Ok(())
    }
}
