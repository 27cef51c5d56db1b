//! The source server under test and what the server sections share: the release build of `windvane-server
//! serve` (or any build given with `--server`) started as a child process on a free loopback port with a
//! fresh data directory; nginx (Debian's `/usr/sbin/nginx`) started with a temporary config on the same
//! store, as the static-host baseline; a minimal HTTP/1.1 client connection (hyper, as the agents' reqwest
//! uses underneath) for load generation; and CPU and memory of a process tree from `/proc`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use windvane_tests::poll::wait_for;
use windvane_tests::process::{ChildProcess, free_port, tail};
use windvane_tests::server::Launch;

use crate::agent::{Memory, newest_file, read_memory, workspace};
use crate::cpu;

/// The registration token the benchmark's servers accept.
pub const TOKEN: &str = "bench-registration-token";

/// The workspace's `target/release/windvane-server`.
pub fn default_binary() -> PathBuf {
    workspace().join("target/release/windvane-server")
}

/// Missing is an error; older than the server's or shared's sources is a warning.
pub fn check_binary(binary: &Path) -> anyhow::Result<Option<String>> {
    let built = std::fs::metadata(binary)
        .and_then(|m| m.modified())
        .with_context(|| {
            format!(
                "{} is missing: build it first with `cargo build --release -p windvane-source-server`",
                binary.display()
            )
        })?;
    let root = workspace();
    let newest = ["source-server/src", "shared/src"]
        .iter()
        .filter_map(|dir| newest_file(&root.join(dir)))
        .max_by_key(|(time, _)| *time);
    Ok(newest.filter(|(time, _)| *time > built).map(|(_, path)| {
        format!(
            "{} is older than {} — rebuild it (cargo build --release -p windvane-source-server) to measure \
             the current code",
            binary.display(),
            path.display()
        )
    }))
}

/// A running `windvane-server serve`; killed on drop (SIGKILL: what it answered must already be on disk).
#[derive(Debug)]
pub struct ServerProcess {
    process: ChildProcess,
    pub addr: SocketAddr,
    /// Its `--data` directory (SQLite).
    pub data: PathBuf,
}

impl ServerProcess {
    /// Starts the server on `root` with a fresh data directory `work/<name>-data` and log `work/<name>.log`,
    /// and waits until it answers `/readyz`.
    pub async fn start(
        binary: &Path,
        root: &Path,
        work: &Path,
        name: &str,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let token_file = work.join("registration-token");
        std::fs::write(&token_file, TOKEN)?;
        let data = work.join(format!("{name}-data"));
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let mut launch = Launch::serve(
            binary,
            root,
            &addr.to_string(),
            &data,
            &token_file,
            &work.join(format!("{name}.log")),
        );
        launch.args.extend(extra.iter().map(|a| (*a).to_owned()));
        launch
            .envs
            .push(("WINDVANE_LOG".to_owned(), "warn".to_owned()));
        let (process, _) = launch.start().await?;
        let server = Self {
            process,
            addr,
            data,
        };
        wait_for("windvane-server ready", Duration::from_secs(60), || async {
            let Ok(mut conn) = Conn::open(addr).await else {
                return Ok(None);
            };
            Ok((conn.get("/readyz", &[]).await?.status == 200).then_some(()))
        })
        .await
        .with_context(|| tail(&server.process.log(), 20))?;
        Ok(server)
    }

    pub fn pid(&self) -> anyhow::Result<u32> {
        self.process.pid().context("windvane-server is not running")
    }

    /// Fails, with the log's tail, if the server exited.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.process.is_running(),
            "windvane-server exited; log tail:\n{}",
            tail(&self.process.log(), 20)
        );
        Ok(())
    }

    /// SIGKILL now (as a crash would).
    pub fn kill(&mut self) {
        self.process.kill();
    }
}

/// nginx serving `root` on a free loopback port with two workers (as many as the machine's cores; the
/// server's runtime has as many threads), no access log, and keep-alive without a request limit.
#[derive(Debug)]
pub struct Nginx {
    child: std::process::Child,
    pub addr: SocketAddr,
}

/// Where Debian's package puts nginx.
pub const NGINX: &str = "/usr/sbin/nginx";

impl Nginx {
    pub async fn start(root: &Path, work: &Path) -> anyhow::Result<Self> {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let dir = work.join("nginx");
        std::fs::create_dir_all(&dir)?;
        // As root, nginx would switch its workers to `nobody`, who may not read the temporary store.
        let user = if std::env::var("USER").is_ok_and(|u| u == "root")
            || std::fs::metadata("/proc/self").is_ok_and(|m| {
                use std::os::unix::fs::MetadataExt as _;
                m.uid() == 0
            }) {
            "user root;\n"
        } else {
            ""
        };
        let d = dir.display();
        let config = format!(
            "{user}worker_processes 2;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
             events {{ worker_connections 4096; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  \
             fastcgi_temp_path {d}/fcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  \
             keepalive_requests 1000000;\n  \
             server {{ listen {addr}; root {root}; location / {{ default_type application/json; }} }}\n}}\n",
            root = root.display(),
        );
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, config)?;
        let child = std::process::Command::new(NGINX)
            .arg("-c")
            .arg(&conf)
            .arg("-p")
            .arg(&dir)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr.log"))?)
            .spawn()
            .with_context(|| format!("starting {NGINX} (Debian package nginx-light)"))?;
        let nginx = Self { child, addr };
        wait_for("nginx listening", Duration::from_secs(30), || async {
            Ok(tokio::net::TcpStream::connect(addr).await.ok().map(|_| ()))
        })
        .await
        .with_context(|| std::fs::read_to_string(dir.join("error.log")).unwrap_or_default())?;
        Ok(nginx)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: the master stops its workers (SIGKILL would leave them running).
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU time of a process and its direct children (nginx's workers), from `/proc`.
pub fn tree_cpu(pid: u32) -> Duration {
    let mut total = cpu::process(pid).unwrap_or_default();
    for child in children(pid) {
        total += cpu::process(child).unwrap_or_default();
    }
    total
}

/// Resident memory of a process and its direct children, summed (VmRSS and VmHWM).
pub fn tree_memory(pid: u32) -> anyhow::Result<Memory> {
    let mut memory = read_memory(pid)?;
    for child in children(pid) {
        if let Ok(m) = read_memory(child) {
            memory.rss_mib += m.rss_mib;
            memory.peak_mib += m.peak_mib;
            memory.anon_mib += m.anon_mib;
            memory.file_mib += m.file_mib;
        }
    }
    Ok(memory)
}

/// Where the machine's CPU went while a server was measured: the server (with its children), this benchmark
/// (with its children: wrk, the trivial server), and everything else — the noise.
#[derive(Debug, Clone, Copy)]
pub struct CpuSplit {
    machine: Duration,
    bench: Duration,
    server: Duration,
}

impl CpuSplit {
    pub fn start(server: u32) -> Self {
        Self::start_all(&[server])
    }

    /// Since the start: (server, bench, others).
    pub fn stop(&self, server: u32) -> (Duration, Duration, Duration) {
        self.stop_all(&[server])
    }

    /// With the server made of several processes (replicas, their database, a balancer), each with its
    /// direct children.
    pub fn start_all(servers: &[u32]) -> Self {
        let (own, children) = cpu::own().unwrap_or_default();
        Self {
            machine: cpu::machine_busy().unwrap_or_default(),
            bench: own + children,
            server: servers.iter().map(|&pid| tree_cpu(pid)).sum(),
        }
    }

    /// Since `start_all` with the same processes: (server, bench, others).
    pub fn stop_all(&self, servers: &[u32]) -> (Duration, Duration, Duration) {
        let later = Self::start_all(servers);
        let server = later.server.saturating_sub(self.server);
        let bench = later.bench.saturating_sub(self.bench);
        let machine = later.machine.saturating_sub(self.machine);
        (server, bench, machine.saturating_sub(server + bench))
    }
}

/// Direct children of `pid`, by scanning `/proc/*/stat` for the parent id.
fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|candidate| {
            std::fs::read_to_string(format!("/proc/{candidate}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')?
                        .1
                        .split_whitespace()
                        .nth(1)?
                        .parse::<u32>()
                        .ok()
                })
                == Some(pid)
        })
        .collect()
}

/// One HTTP/1.1 connection, as an agent keeps one to its server.
#[derive(Debug)]
pub struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    host: String,
}

/// An answer: status, body, ETag.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
    pub etag: Option<String>,
    /// `Retry-After`, in seconds.
    pub retry_after: Option<Duration>,
    /// `Preference-Applied` (a held long poll says `wait=N`).
    pub preference_applied: Option<String>,
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> anyhow::Result<Self> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        Ok(Self {
            sender,
            host: addr.to_string(),
        })
    }

    /// Whether the connection can still carry requests (the server may close idle ones).
    pub fn is_open(&self) -> bool {
        !self.sender.is_closed()
    }

    pub async fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> anyhow::Result<Answer> {
        let mut request = Request::get(path).header("host", &self.host);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        self.send(request.body(Full::default())?).await
    }

    pub async fn post(&mut self, path: &str, body: Bytes) -> anyhow::Result<Answer> {
        let request = Request::post(path)
            .header("host", &self.host)
            .header("content-type", "application/json")
            .body(Full::new(body))?;
        self.send(request).await
    }

    async fn send(&mut self, request: Request<Full<Bytes>>) -> anyhow::Result<Answer> {
        self.sender.ready().await?;
        let response = self.sender.send_request(request).await?;
        let status = response.status().as_u16();
        let etag = response
            .headers()
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .map(Duration::from_secs);
        let preference_applied = response
            .headers()
            .get("preference-applied")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = response.into_body().collect().await?.to_bytes();
        Ok(Answer {
            status,
            body,
            etag,
            retry_after,
            preference_applied,
        })
    }
}
