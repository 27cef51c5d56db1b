//! The demo's cast and its stage: a work directory (release key, store, the server's database, every log),
//! the real `windvane` command line, one `windvane-server`, and localkube clusters each with the real
//! `windvane-agent` enrolled and heartbeating. Each agent reaches the server through its own loopback
//! [`Proxy`], so a scene can cut one cluster's network without touching its processes. Everything started
//! here is stopped by [`Demo::teardown`], which reports the process ids it stopped, the proxies it closed and
//! the directories it removed, so a caller (the demo's test) can check that nothing is left.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine as _;
use futures::StreamExt as _;
use tempfile::TempDir;
use windvane_tests::fleet::{AgentOptions, Cluster};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::proxy::Proxy;
use windvane_tests::server::SourceServer;

use crate::narrate::Narrator;
use crate::roster::{Member, Roster};

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
    /// The fleet: the initial clusters and the one that joins.
    pub roster: Roster,
    /// The quiet prod cluster (the pod scene's) runs real containers (`localkube --real-node`).
    pub real_node: bool,
}

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
    /// Each cluster's proxy to the server, by cluster name.
    proxies: Vec<(String, Proxy)>,
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
            proxies: Vec::new(),
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

    /// How many clusters start at once: twice the cores, at least four. Each start keeps a control plane
    /// (etcd, kube-apiserver, controller-manager) busy for seconds. On two cores twelve at once took 29 s
    /// with none up for the first 20 s, four at a time 23 s with the first up after 6 s; and on a loaded
    /// machine all at once risks localkube's own ready deadline for each.
    pub fn starts_at_once() -> usize {
        std::thread::available_parallelism()
            .map_or(2, usize::from)
            .saturating_mul(2)
            .max(4)
    }

    /// Starts a localkube, a proxy to the server and an agent behind it for each member, several at a time
    /// ([`Self::starts_at_once`]), saying each cluster's line as it comes up (`7/12 up …`). Returns how long
    /// they took to come up.
    pub async fn start_clusters(&mut self, members: &[Member]) -> anyhow::Result<Duration> {
        let server = self.server()?;
        let target: SocketAddr = server
            .url
            .trim_start_matches("http://")
            .parse()
            .with_context(|| format!("the server's address in {}", server.url))?;
        let (token, key) = (server.token_file.clone(), self.path("release.pub"));
        let program = self.settings.bin_dir.join("windvane-agent");
        let (heartbeat, poll) = (
            self.settings.heartbeat_interval.clone(),
            self.settings.poll_interval.clone(),
        );
        let logs = self.path("logs");
        // The quiet prod cluster runs on a real node with --real-node.
        let real_node = self
            .settings
            .real_node
            .then(|| self.settings.roster.quiet());
        let starts = members.iter().map(|member| {
            let (name, labels) = (member.name(), member.labels());
            let log = logs.join(format!("agent-{name}.log"));
            let (program, token, key) = (program.clone(), token.clone(), key.clone());
            let (heartbeat, poll) = (heartbeat.clone(), poll.clone());
            let real = real_node == Some(*member);
            let member = *member;
            async move {
                let proxy = Proxy::start(target)
                    .await
                    .with_context(|| format!("starting the proxy of {name}"))?;
                let mut options = AgentOptions::new(&proxy.url(), &key, &name).reporting_to(
                    &proxy.url(),
                    &token,
                    &heartbeat,
                );
                options.channel = CHANNEL.to_owned();
                options.fleet = FLEET.to_owned();
                options.labels = vec![
                    format!("env={}", member.env),
                    format!("region={}", member.region),
                ];
                options.poll_interval = poll;
                let kube = if real {
                    LocalKube::start_real_node().await
                } else {
                    LocalKube::start().await
                }
                .with_context(|| format!("starting localkube for {name} ({labels})"))?;
                let cluster = Cluster::start_on(kube, options, program, log)
                    .await
                    .with_context(|| format!("starting the agent of {name}"))?;
                anyhow::Ok((cluster, proxy))
            }
        });
        let started = Instant::now();
        let mut starting = futures::stream::iter(starts).buffer_unordered(Self::starts_at_once());
        let (total, mut up) = (members.len(), 0);
        while let Some(result) = starting.next().await {
            // An error drops the starts still under way: their localkubes and agents are killed with them.
            let (cluster, proxy) = result?;
            up += 1;
            self.say.say(&format!(
                "{up:>2}/{total} up  {}",
                cluster_started_line(&cluster, &proxy)
            ));
            self.adopt(cluster, proxy);
        }
        Ok(started.elapsed())
    }

    /// Records a started cluster and its proxy so that teardown stops them.
    fn adopt(&mut self, cluster: Cluster, proxy: Proxy) {
        if let Some(pid) = cluster.kube.pid() {
            self.started
                .push((format!("localkube {}", cluster.name()), pid));
        }
        if let Some(pid) = cluster.agent_pid() {
            self.started
                .push((format!("windvane-agent {}", cluster.name()), pid));
        }
        self.kube_dirs.push(cluster.kube.data_dir().to_path_buf());
        self.proxies.push((cluster.name().to_owned(), proxy));
        self.clusters.push(cluster);
    }

    /// The proxy a cluster's agent reaches the server through.
    pub fn proxy(&self, name: &str) -> anyhow::Result<&Proxy> {
        self.proxies
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p)
            .with_context(|| format!("no proxy for cluster {name}"))
    }

    /// A running cluster by name.
    pub fn cluster(&self, name: &str) -> anyhow::Result<&Cluster> {
        self.clusters
            .iter()
            .find(|c| c.name() == name)
            .with_context(|| format!("no cluster {name}"))
    }

    /// Closes every proxy and reads back that none accepts connections any more; says which.
    async fn close_proxies(&mut self) -> anyhow::Result<String> {
        let addrs: Vec<SocketAddr> = self.proxies.iter().map(|(_, p)| p.addr()).collect();
        self.proxies.clear();
        for addr in &addrs {
            wait_for(
                &format!("the proxy on {addr} to stop accepting"),
                Duration::from_secs(10),
                || async {
                    Ok(tokio::net::TcpStream::connect(addr)
                        .await
                        .is_err()
                        .then_some(()))
                },
            )
            .await?;
        }
        let ports: Vec<String> = addrs.iter().map(|a| format!(":{}", a.port())).collect();
        Ok(format!(
            "closed proxies: {} ({} proxies, none accepts connections)",
            ports.join(" "),
            addrs.len()
        ))
    }

    /// Stops everything: the agents, then the clusters, their proxies, then the server; removes the work directory unless
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
        match self.close_proxies().await {
            Ok(closed) => self.say.detail(&closed),
            Err(problem) => problems.push(format!("{problem:#}")),
        }
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

/// `dev-af      env=dev,region=af      https://127.0.0.1:PORT  localkube pid 1, agent pid 2, proxy :PORT`.
fn cluster_started_line(cluster: &Cluster, proxy: &Proxy) -> String {
    format!(
        "{:<10} {:<21} {}  localkube pid {}, agent pid {}, proxy :{}",
        cluster.name(),
        cluster.options.labels.join(","),
        cluster.kube.server_url(),
        cluster.kube.pid().unwrap_or_default(),
        cluster.agent_pid().unwrap_or_default(),
        proxy.addr().port()
    )
}
