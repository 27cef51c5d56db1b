//! The real `windvane-server` under test, started one way: [`Launch`] spawns `windvane-server serve` (the
//! workspace's binary, optionally exec'd through a wrapper such as `prlimit`), appends its output to a log,
//! waits for the `listening on` line and keeps the bound address for restarts on the same port. Two call
//! styles sit on it:
//!
//! - [`ServerProcess`], for the `server_*` tests: synchronous, panicking, with its own temp dir holding a
//!   store written by [`write_store`], the fixed test tokens and the database; killed with SIGKILL and
//!   restarted as a crash would.
//! - [`SourceServer`], for the fleet end-to-end tests and the demo: async, `anyhow`, serving a publisher's
//!   store, waiting until `/readyz` answers; stopped cleanly (SIGTERM) and restarted as an outage would.
//!
//! The benchmark (`src/bin/bench/server.rs`) starts its servers through [`Launch`] too.

use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Duration;

use anyhow::Context;
use jiff::Timestamp;
use serde_json::Value;
use tempfile::TempDir;
use windvane_shared::crypto::keys::signing_key_from_seed;
use windvane_shared::format::release::{BundleRef, ReleasePointer};

use crate::poll::wait_for;
use crate::process::{ChildProcess, STOP_GRACE, binary, free_port, open_log, tail};

/// The registration token of a [`ServerProcess`].
pub const TOKEN: &str = "test-registration-token-0123456789";
/// The read token of a [`ServerProcess`] started with [`Options::read_token`].
pub const READ_TOKEN: &str = "test-read-token-abcdef";
/// The admin token (`--admin-token-file`), which servers get unless [`Options::no_admin_token`].
pub const ADMIN_TOKEN: &str = "test-admin-token-fedcba9876543210";
/// The fleet of [`write_store`]'s release and of the simulated agents.
pub const FLEET: &str = "acme";
/// The channel of [`write_store`]'s release and of the simulated agents.
pub const CHANNEL: &str = "stable";

/// How long the server may take to say it listens, and to answer `/readyz`.
const SERVER_READY: Duration = Duration::from_secs(60);

/// How to start one `windvane-server` process; [`Launch::start`] may be called again to restart it.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The server binary.
    pub program: PathBuf,
    /// A command the server is started through, which must `exec` it (so the pid stays the server's).
    pub wrapper: Vec<String>,
    /// The arguments (`serve …`); `--listen` is set to the bound address once it is known.
    pub args: Vec<String>,
    pub envs: Vec<(String, String)>,
    /// The log both stdout and stderr are appended to.
    pub log: PathBuf,
    /// Send stderr through a pipe that the test process copies into the log, so that the log is written even
    /// when the server itself cannot write files (a full disk).
    pub stderr_through_pipe: bool,
}

impl Launch {
    /// `program serve --root ROOT --listen LISTEN --data DATA --registration-token-file TOKEN_FILE`, logging
    /// to `log`.
    pub fn serve(
        program: &Path,
        root: &Path,
        listen: &str,
        data: &Path,
        token_file: &Path,
        log: &Path,
    ) -> Self {
        let args = [
            "serve",
            "--root",
            &root.display().to_string(),
            "--listen",
            listen,
            "--data",
            &data.display().to_string(),
            "--registration-token-file",
            &token_file.display().to_string(),
        ]
        .map(str::to_owned)
        .to_vec();
        Self {
            program: program.to_path_buf(),
            wrapper: Vec::new(),
            args,
            envs: Vec::new(),
            log: log.to_path_buf(),
            stderr_through_pipe: false,
        }
    }

    /// Appends arguments.
    pub fn arg(&mut self, arg: impl AsRef<std::ffi::OsStr>) -> &mut Self {
        self.args.push(arg.as_ref().to_string_lossy().into_owned());
        self
    }

    /// Starts the server and blocks until it says where it listens; the process and its `http://ADDR`.
    pub fn start_blocking(&mut self) -> anyhow::Result<(ChildProcess, String)> {
        let (process, listening) = self.spawn()?;
        let line = listening.recv_timeout(SERVER_READY);
        self.listening(process, line)
    }

    /// Starts the server and waits (without blocking the runtime) until it says where it listens.
    pub async fn start(&mut self) -> anyhow::Result<(ChildProcess, String)> {
        let (process, listening) = self.spawn()?;
        let line =
            tokio::task::spawn_blocking(move || listening.recv_timeout(SERVER_READY)).await?;
        self.listening(process, line)
    }

    /// Spawns the process; the receiver gets the `listening on` line (and disconnects if stdout closes
    /// first, i.e. the server exited).
    fn spawn(&self) -> anyhow::Result<(ChildProcess, Receiver<String>)> {
        let mut command = match self.wrapper.split_first() {
            Some((wrapper, args)) => {
                let mut command = Command::new(wrapper);
                command.args(args).arg(&self.program);
                command
            }
            None => Command::new(&self.program),
        };
        let log = open_log(&self.log)?;
        command
            .args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped());
        if self.stderr_through_pipe {
            command.stderr(Stdio::piped());
        } else {
            command.stderr(log.try_clone()?);
        }
        let mut process = ChildProcess::spawn("windvane-server", &mut command, &self.log)
            .with_context(|| format!("through {:?}", self.wrapper))?;
        let (stdout, stderr) = process.take_output();
        if let Some(mut stderr) = stderr {
            let mut log = log.try_clone()?;
            std::thread::spawn(move || std::io::copy(&mut stderr, &mut log));
        }
        let stdout = stdout.context("the server's stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || copy_lines(stdout, log, &tx));
        Ok((process, rx))
    }

    /// The started process and its URL, or (killing it) why it did not start.
    fn listening(
        &mut self,
        mut process: ChildProcess,
        line: Result<String, RecvTimeoutError>,
    ) -> anyhow::Result<(ChildProcess, String)> {
        let Ok(line) = line else {
            process.kill();
            anyhow::bail!(
                "windvane-server did not start listening ({line:?}):\n{}",
                tail(&process.log(), 40)
            );
        };
        let addr = line.trim().trim_start_matches("http://").to_owned();
        // Restarts reuse the port, so URLs held by tests stay valid.
        if let Some(listen) = self.args.iter().position(|a| a == "--listen") {
            self.args[listen + 1] = addr.clone();
        }
        Ok((process, format!("http://{addr}")))
    }
}

/// Appends the server's stdout to its log line by line, sending what follows `listening on ` on the first
/// such line.
fn copy_lines(
    stdout: std::process::ChildStdout,
    mut log: std::fs::File,
    tx: &mpsc::Sender<String>,
) {
    let mut sent = false;
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        let _ = writeln!(log, "{line}");
        if !sent && let Some(url) = line.strip_prefix("listening on ") {
            sent = tx.send(url.to_owned()).is_ok();
        }
    }
}

/// A store with one channel pointer (serial `serial`) and its bundle.
pub fn write_store(root: &Path, serial: u64) -> (Vec<u8>, String) {
    std::fs::create_dir_all(root.join("channels")).expect("mkdir");
    std::fs::create_dir_all(root.join("bundles")).expect("mkdir");
    let bundle = format!(
        "{{\"fleet\":\"{FLEET}\",\"apps\":[],\"padding\":\"{}\"}}",
        "x".repeat(4000)
    )
    .into_bytes();
    let sha256 = windvane_shared::crypto::digest::sha256_hex(&bundle);
    std::fs::write(root.join(format!("bundles/{sha256}.json")), &bundle).expect("write bundle");
    let now = Timestamp::now();
    let pointer = ReleasePointer {
        fleet: FLEET.into(),
        channel: CHANNEL.into(),
        serial,
        issued_at: now,
        expires_at: now
            .checked_add(jiff::SignedDuration::from_hours(24))
            .expect("time"),
        bundle: BundleRef {
            sha256: sha256.clone(),
            size: bundle.len() as u64,
        },
        allow_empty: true,
        rollout: None,
    };
    let envelope = pointer
        .sign(&signing_key_from_seed([200; 32]))
        .to_json_bytes();
    windvane_store::write_atomic(&root.join(format!("channels/{CHANNEL}.json")), &envelope)
        .expect("write pointer");
    (bundle, sha256)
}

/// Options for a [`ServerProcess`].
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub read_token: bool,
    /// Start without `--admin-token-file` (admin actions disabled).
    pub no_admin_token: bool,
    pub notifications: Option<String>,
    pub unknown_after: Option<String>,
    pub database_url: Option<String>,
    pub extra: Vec<String>,
    /// A command the server is started through, which must `exec` it (so the pid stays the server's): e.g.
    /// `prlimit --nofile=128 --`, or `sh -c 'trap "" XFSZ; exec "$@"' sh`.
    pub wrapper: Vec<String>,
    /// Send the server's stderr through a pipe that the test process copies into `server.log`, so that the
    /// log is written even when the server itself cannot write files (a full disk).
    pub log_through_pipe: bool,
}

/// A `windvane-server` process on a loopback port, with its own temp dir (store, data, secrets, log).
#[derive(Debug)]
pub struct ServerProcess {
    process: Option<ChildProcess>,
    pub url: String,
    pub dir: PathBuf,
    launch: Launch,
    _temp: TempDir,
}

impl ServerProcess {
    pub fn start(options: Options) -> ServerProcess {
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().to_path_buf();
        write_store(&dir.join("root"), 4);
        std::fs::write(dir.join("token"), format!("{TOKEN}\n")).expect("token");
        std::fs::write(dir.join("read-token"), READ_TOKEN).expect("read token");
        std::fs::write(dir.join("admin-token"), format!("{ADMIN_TOKEN}\n")).expect("admin token");
        if let Some(config) = &options.notifications {
            std::fs::write(dir.join("notifications.json"), config).expect("notifications");
        }
        let program = binary("windvane-server").expect("the windvane-server binary");
        let mut launch = Launch::serve(
            &program,
            &dir.join("root"),
            "127.0.0.1:0",
            &dir.join("data"),
            &dir.join("token"),
            &dir.join("server.log"),
        );
        server_options(&mut launch, &options, &dir);
        let mut server = ServerProcess {
            process: None,
            url: String::new(),
            dir,
            launch,
            _temp: temp,
        };
        server.spawn();
        server
    }

    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }

    pub fn db_path(&self) -> PathBuf {
        self.dir.join("data").join("windvane.db")
    }

    fn spawn(&mut self) {
        let (process, url) = self
            .launch
            .start_blocking()
            .unwrap_or_else(|error| panic!("windvane-server did not start: {error:#}"));
        self.url = url;
        self.process = Some(process);
    }

    /// The server's process id (the wrapper's, which exec'd the server).
    pub fn pid(&self) -> u32 {
        self.process
            .as_ref()
            .and_then(ChildProcess::pid)
            .expect("server running")
    }

    /// `host:port` of the listener, for raw TCP clients.
    pub fn addr(&self) -> String {
        self.url.trim_start_matches("http://").to_owned()
    }

    /// SIGKILL: no shutdown code runs.
    pub fn kill9(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// SIGTERM, waiting at most [`STOP_GRACE`] for the exit (then killed). Returns whether it exited on its own.
    pub async fn stop(&mut self) -> bool {
        match self.process.take() {
            Some(mut process) => process.stop(STOP_GRACE).await,
            None => true,
        }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.launch.log).unwrap_or_default()
    }

    /// Rows in the SQLite heartbeat log (optionally for one cluster), read straight from the file.
    pub fn stored_heartbeats(&self, cluster: Option<&str>) -> u64 {
        let conn = rusqlite::Connection::open(self.db_path()).expect("open db");
        conn.query_row(
            "SELECT COUNT(*) FROM heartbeat_log WHERE (?1 IS NULL OR cluster = ?1)",
            [cluster],
            |r| r.get::<_, i64>(0),
        )
        .expect("count") as u64
    }
}

/// The arguments, environment and wrapper `options` ask for, with the secrets and config under `dir`.
fn server_options(launch: &mut Launch, options: &Options, dir: &Path) {
    if !options.no_admin_token {
        launch
            .arg("--admin-token-file")
            .arg(dir.join("admin-token"));
    }
    if options.read_token {
        launch.arg("--read-token-file").arg(dir.join("read-token"));
    }
    if options.notifications.is_some() {
        launch
            .arg("--notifications")
            .arg(dir.join("notifications.json"));
    }
    if let Some(after) = &options.unknown_after {
        launch.arg("--unknown-after").arg(after);
    }
    if let Some(url) = &options.database_url {
        // With PostgreSQL the server needs no data directory: leave `--data` out, as an operator would.
        if let Some(at) = launch.args.iter().position(|a| a == "--data") {
            launch.args.drain(at..at + 2);
        }
        launch.arg("--database-url").arg(url);
    }
    launch.args.extend(options.extra.iter().cloned());
    launch.envs.push((
        "WINDVANE_LOG".to_owned(),
        "info,windvane_source_server=debug".to_owned(),
    ));
    launch.wrapper.clone_from(&options.wrapper);
    launch.stderr_through_pipe = options.log_through_pipe;
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!("---- windvane-server log ----\n{}", self.logs());
        }
    }
}

/// A running `windvane-server serve`, serving `root` and ingesting heartbeats; it can be stopped and started
/// again on the same address and database, as an outage would.
#[derive(Debug)]
pub struct SourceServer {
    pub process: ChildProcess,
    /// `http://ADDR`, the address it bound.
    pub url: String,
    pub token_file: PathBuf,
    /// The admin token (`--admin-token-file`), for `windvane cluster rekey|forget`.
    pub admin_token_file: PathBuf,
    launch: Launch,
    dir: PathBuf,
    _temp: Option<TempDir>,
}

impl SourceServer {
    /// Starts the server (from the test's target directory) on a free port, with a registration token file
    /// and a fresh data directory.
    pub async fn start(root: &Path, extra: &[&str]) -> anyhow::Result<Self> {
        let temp = TempDir::new()?;
        let listen = format!("127.0.0.1:{}", free_port()?);
        let mut server = Self::start_in(
            &binary("windvane-server")?,
            root,
            temp.path(),
            &listen,
            extra,
        )
        .await?;
        server._temp = Some(temp);
        Ok(server)
    }

    /// Starts `program serve` with its database (`data/`), registration and admin tokens (`registration-token`,
    /// `admin-token`, each written with a fixed test token unless the file exists) and log (`server.log`)
    /// under `dir`, listening on `listen` (port 0: any free port, read back from the line the server prints).
    pub async fn start_in(
        program: &Path,
        root: &Path,
        dir: &Path,
        listen: &str,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let token_file = dir.join("registration-token");
        if !token_file.exists() {
            std::fs::write(&token_file, "fleet-registration-token-for-tests\n")?;
        }
        let admin_token_file = dir.join("admin-token");
        if !admin_token_file.exists() {
            std::fs::write(&admin_token_file, "fleet-admin-token-for-tests\n")?;
        }
        let mut launch = Launch::serve(
            program,
            root,
            listen,
            &dir.join("data"),
            &token_file,
            &dir.join("server.log"),
        );
        launch.arg("--admin-token-file").arg(&admin_token_file);
        launch.args.extend(extra.iter().map(|a| (*a).to_owned()));
        let (process, url) = start_ready(&mut launch).await?;
        Ok(Self {
            process,
            url,
            token_file,
            admin_token_file,
            launch,
            dir: dir.to_path_buf(),
            _temp: None,
        })
    }

    /// The directory holding its database, token and log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stops the server with SIGTERM (a clean shutdown), killing it if it takes longer than [`STOP_GRACE`].
    /// Returns whether it exited on its own.
    pub async fn stop(&mut self) -> bool {
        self.process.stop(STOP_GRACE).await
    }

    /// Starts the server again on the same address, store and database (stopping it first if it runs).
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.stop().await;
        self.process = start_ready(&mut self.launch).await?.0;
        Ok(())
    }

    /// GETs a path; the status code and body.
    pub async fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let response = reqwest::get(format!("{}{path}", self.url))
            .await
            .with_context(|| format!("GET {}{path}", self.url))?;
        Ok((response.status().as_u16(), response.text().await?))
    }

    /// GETs a JSON API path.
    pub async fn api(&self, path: &str) -> anyhow::Result<Value> {
        let (status, body) = self.get(path).await?;
        anyhow::ensure!((200..300).contains(&status), "GET {path}: {status}: {body}");
        Ok(serde_json::from_str(&body)?)
    }

    /// `/api/v1/fleet`, optionally filtered by a label selector.
    pub async fn fleet(&self, selector: Option<&str>) -> anyhow::Result<Value> {
        match selector {
            Some(selector) => {
                self.api(&format!(
                    "/api/v1/fleet?selector={}",
                    query_escape(selector)
                ))
                .await
            }
            None => self.api("/api/v1/fleet").await,
        }
    }

    /// Polls `/api/v1/clusters/<name>` until `check` holds; on timeout the error carries the last answer and
    /// the server's log tail.
    pub async fn wait_cluster(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Value> {
        let last = std::sync::Mutex::new(Value::Null);
        let path = format!("/api/v1/clusters/{name}");
        let result = wait_for(what, timeout, || async {
            let view = self.api(&path).await?;
            *last.lock().expect("lock") = view.clone();
            Ok(check(&view).then_some(view))
        })
        .await;
        result.with_context(|| {
            format!(
                "last answer for {name}: {}\nserver log:\n{}",
                last.lock().expect("lock"),
                tail(&self.process.log(), 30)
            )
        })
    }

    /// Polls the drift log of `cluster` (`/api/v1/drift?cluster=NAME`) until an entry matches `wanted`;
    /// returns that entry.
    pub async fn wait_drift(
        &self,
        cluster: &str,
        what: &str,
        timeout: Duration,
        wanted: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Value> {
        let path = format!("/api/v1/drift?cluster={}", query_escape(cluster));
        wait_for(what, timeout, || async {
            let log = self.api(&path).await?;
            Ok(log["drift"]
                .as_array()
                .and_then(|entries| entries.iter().find(|e| wanted(e)).cloned()))
        })
        .await
    }
}

/// Starts the server and waits until it answers `/readyz`.
async fn start_ready(launch: &mut Launch) -> anyhow::Result<(ChildProcess, String)> {
    let (mut process, url) = launch.start().await?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    let ready = wait_for("windvane-server ready", SERVER_READY, || async {
        Ok(http
            .get(format!("{url}/readyz"))
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success())
            .map(|_| ()))
    })
    .await;
    if let Err(error) = ready {
        process.kill();
        return Err(error.context(tail(&process.log(), 40)));
    }
    Ok((process, url))
}

/// Percent-encodes a query parameter value (everything but RFC 3986 unreserved characters).
pub fn query_escape(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
