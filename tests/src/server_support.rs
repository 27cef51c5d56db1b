//! Shared harness of the `server_*` integration tests: a store fixture, a real `windvane-server` process on
//! a loopback port (started, killed with SIGKILL, restarted), a simulated agent that enrols and signs
//! heartbeats exactly as the wire format says, a throwaway PostgreSQL cluster, and polling with deadlines.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use jiff::Timestamp;
use windvane_shared::dsse;
use windvane_shared::heartbeat::{
    AppReport, EnrollRequest, HEARTBEAT_PAYLOAD_TYPE, Heartbeat, ObjectReport, SourceReport,
};
use windvane_shared::keys::{signing_key_from_seed, verifying_key_to_pem};
use windvane_shared::release::{BundleRef, ReleasePointer};
use windvane_shared::status::SyncState;

pub const TOKEN: &str = "test-registration-token-0123456789";
pub const READ_TOKEN: &str = "test-read-token-abcdef";
/// The admin token (`--admin-token-file`), which servers get unless [`Options::no_admin_token`].
pub const ADMIN_TOKEN: &str = "test-admin-token-fedcba9876543210";
pub const FLEET: &str = "acme";
pub const CHANNEL: &str = "stable";

/// Polls `check` until it returns `Some`, or panics with `what` at the deadline.
pub async fn eventually<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            start.elapsed() < deadline,
            "timed out after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The `windvane` command line (crate `windvane-cli`) from the target directory this test runs from.
/// Cargo builds only a package's own binaries for its tests, so it must be built first: `tests/run` builds
/// every binary of the workspace before it tests.
pub fn windvane_cli() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test>-<hash> -> target/<profile>/windvane
    let path = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable in target/<profile>/deps")
        .join("windvane");
    assert!(
        path.exists(),
        "{} is missing: build it first (cargo build -p windvane-cli, or run the tests with tests/run)",
        path.display()
    );
    path
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
    let sha256 = windvane_shared::digest::sha256_hex(&bundle);
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
    };
    let envelope = pointer
        .sign(&signing_key_from_seed([200; 32]))
        .to_json_bytes();
    windvane_store::write_atomic(&root.join(format!("channels/{CHANNEL}.json")), &envelope)
        .expect("write pointer");
    (bundle, sha256)
}

/// Options for a server process.
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
    child: Option<Child>,
    pub url: String,
    pub dir: PathBuf,
    _temp: Option<tempfile::TempDir>,
    options: Options,
    listen: String,
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
        let mut server = ServerProcess {
            child: None,
            url: String::new(),
            dir,
            _temp: Some(temp),
            options,
            listen: "127.0.0.1:0".into(),
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
        let server = crate::process::binary("windvane-server").expect("windvane-server binary");
        let mut command = match self.options.wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(&server);
                command
            }
            None => Command::new(server),
        };
        command
            .arg("serve")
            .arg("--root")
            .arg(self.dir.join("root"))
            .arg("--listen")
            .arg(&self.listen)
            .arg("--data")
            .arg(self.dir.join("data"))
            .arg("--registration-token-file")
            .arg(self.dir.join("token"));
        if !self.options.no_admin_token {
            command
                .arg("--admin-token-file")
                .arg(self.dir.join("admin-token"));
        }
        if self.options.read_token {
            command
                .arg("--read-token-file")
                .arg(self.dir.join("read-token"));
        }
        if self.options.notifications.is_some() {
            command
                .arg("--notifications")
                .arg(self.dir.join("notifications.json"));
        }
        if let Some(after) = &self.options.unknown_after {
            command.arg("--unknown-after").arg(after);
        }
        if let Some(url) = &self.options.database_url {
            command.arg("--database-url").arg(url);
        }
        command.args(&self.options.extra);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("server.log"))
            .expect("log file");
        command
            .stdout(Stdio::piped())
            .env("WINDVANE_LOG", "info,windvane_source_server=debug");
        if self.options.log_through_pipe {
            command.stderr(Stdio::piped());
        } else {
            command.stderr(log.try_clone().expect("log file"));
        }
        let mut child = command.spawn().unwrap_or_else(|e| {
            panic!(
                "start windvane-server through {:?}: {e}",
                self.options.wrapper
            )
        });
        if let Some(mut stderr) = child.stderr.take() {
            let mut log = log;
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut stderr, &mut log);
            });
        }
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
        let Some(url) = line.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            panic!("windvane-server did not start: {line:?}\n{}", self.logs());
        };
        self.url = url.to_owned();
        // Restarts reuse the port, so URLs held by tests stay valid.
        self.listen = url.trim_start_matches("http://").to_owned();
        self.child = Some(child);
    }

    /// The server's process id (the wrapper's, which exec'd the server).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server running").id()
    }

    /// `host:port` of the listener, for raw TCP clients.
    pub fn addr(&self) -> String {
        self.url.trim_start_matches("http://").to_owned()
    }

    /// SIGKILL: no shutdown code runs.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
            let _ = child.wait();
        }
    }

    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
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

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!("---- windvane-server log ----\n{}", self.logs());
        }
    }
}

/// An HTTP client that does not decompress (so tests see the bytes on the wire).
pub fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_gzip()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// Like [`client`], but connecting from `local` (another loopback address is another client address to the
/// server), and opening a fresh connection for every request.
pub fn client_from(local: std::net::IpAddr) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_gzip()
        .local_address(local)
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// A simulated agent: its identity key and heartbeat counter.
#[derive(Debug)]
pub struct Agent {
    pub name: String,
    pub key: SigningKey,
    pub sequence: u64,
    pub labels: BTreeMap<String, String>,
    pub interval_seconds: u64,
}

impl Agent {
    pub fn new(name: &str, seed: u8, labels: &[(&str, &str)]) -> Agent {
        Agent {
            name: name.into(),
            key: signing_key_from_seed([seed; 32]),
            sequence: 0,
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            interval_seconds: 30,
        }
    }

    pub fn enroll_request(&self, token: &str) -> EnrollRequest {
        EnrollRequest {
            token: token.into(),
            fleet: FLEET.into(),
            public_key: verifying_key_to_pem(&self.key.verifying_key()),
            labels: self.labels.clone(),
        }
    }

    pub async fn enroll(&self, http: &reqwest::Client, url: &str) -> reqwest::Response {
        http.post(format!("{url}/api/v1/clusters/{}/enroll", self.name))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&self.enroll_request(TOKEN)).expect("json"))
            .send()
            .await
            .expect("enroll")
    }

    /// The next heartbeat (sequence incremented) in `state`.
    pub fn next(&mut self, state: SyncState) -> Heartbeat {
        self.sequence += 1;
        Heartbeat {
            cluster: self.name.clone(),
            fleet: FLEET.into(),
            sequence: self.sequence,
            sent_at: Timestamp::now(),
            interval_seconds: self.interval_seconds,
            agent_version: "0.1.0-test".into(),
            labels: self.labels.clone(),
            state,
            source: SourceReport {
                channel: CHANNEL.into(),
                applied_serial: Some(3),
                applied_sha256: Some("ab".repeat(32)),
                ..SourceReport::default()
            },
            counts: [(state, 4)].into(),
            apps: vec![AppReport {
                name: "monitoring".into(),
                state,
                objects: 4,
            }],
            problems: if state == SyncState::Synced {
                vec![]
            } else {
                vec![ObjectReport {
                    app: "monitoring".into(),
                    object: "Deployment monitoring/prometheus".into(),
                    group: "apps".into(),
                    kind: "Deployment".into(),
                    state,
                    message: "replicas 1/2 ready".into(),
                }]
            },
            drift: vec![],
            last_error: None,
        }
    }

    pub fn sign(&self, heartbeat: &Heartbeat) -> Vec<u8> {
        self.sign_with(heartbeat, &self.key)
    }

    pub fn sign_with(&self, heartbeat: &Heartbeat, key: &SigningKey) -> Vec<u8> {
        let payload = serde_json::to_vec(heartbeat).expect("json");
        dsse::sign(HEARTBEAT_PAYLOAD_TYPE, &payload, key).to_json_bytes()
    }

    pub async fn post(
        &self,
        http: &reqwest::Client,
        url: &str,
        body: Vec<u8>,
    ) -> reqwest::Response {
        http.post(format!("{url}/api/v1/clusters/{}/heartbeat", self.name))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("post heartbeat")
    }

    /// Signs and sends the next heartbeat in `state`, asserting a 200.
    pub async fn beat(&mut self, http: &reqwest::Client, url: &str, state: SyncState) {
        let hb = self.next(state);
        let response = self.post(http, url, self.sign(&hb)).await;
        let status = response.status();
        assert_eq!(
            status,
            200,
            "heartbeat {} refused: {}",
            hb.sequence,
            response.text().await.unwrap_or_default()
        );
    }
}

/// JSON of a GET, asserting 200.
pub async fn get_json(http: &reqwest::Client, url: &str) -> serde_json::Value {
    let response = http.get(url).send().await.expect("GET");
    assert_eq!(response.status(), 200, "GET {url}");
    json_of(response).await
}

/// The body of a response as JSON.
pub async fn json_of(response: reqwest::Response) -> serde_json::Value {
    let bytes = response.bytes().await.expect("body");
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
}

/// Asserts that `response` is a refusal with `status` and the JSON `reason`, and a non-empty `error` message;
/// returns the message.
pub async fn assert_refused(response: reqwest::Response, status: u16, reason: &str) -> String {
    assert_eq!(response.status(), status);
    let body = json_of(response).await;
    assert_eq!(body["reason"], reason, "{body}");
    let message = body["error"].as_str().unwrap_or_default().to_owned();
    assert!(!message.is_empty(), "{body}");
    message
}

/// A JSON POST body.
pub fn json_body<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("json")
}

/// A throwaway PostgreSQL cluster (Debian's packages: initdb, pg_ctl) on a free loopback port, owned by the
/// `postgres` user when the tests run as root. Stopped and deleted on drop. Panics — never skips — when it
/// cannot start: the PostgreSQL tests are part of the suite.
#[derive(Debug)]
pub struct Postgres {
    pub url: String,
    dir: tempfile::TempDir,
    bin: PathBuf,
    as_postgres: bool,
}

fn pg_bin() -> PathBuf {
    if let Ok(dir) = std::env::var("WINDVANE_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .filter(|p| p.join("initdb").exists())
                .collect()
        })
        .unwrap_or_default();
    versions.sort();
    versions.pop().unwrap_or_else(|| {
        panic!(
            "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin (install Debian's `postgresql` \
             package, or set WINDVANE_PG_BIN)"
        )
    })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

impl Postgres {
    pub fn start() -> Postgres {
        let bin = pg_bin();
        let dir = tempfile::Builder::new()
            .prefix("windvane-pg")
            .tempdir()
            .expect("tempdir");
        let as_postgres = is_root();
        let data = dir.path().join("data");
        if as_postgres {
            let status = Command::new("chown")
                .arg("-R")
                .arg("postgres:postgres")
                .arg(dir.path())
                .status()
                .expect("chown");
            assert!(
                status.success(),
                "chown the PostgreSQL temp dir to postgres"
            );
        }
        let mut pg = Postgres {
            url: String::new(),
            dir,
            bin,
            as_postgres,
        };
        pg.run(
            "initdb",
            &[
                "-D",
                data.to_str().expect("utf-8"),
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        );
        let port = free_port();
        let options = format!(
            "-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={} -c fsync=on -c max_connections=50",
            pg.dir.path().display()
        );
        let log = pg.dir.path().join("postgres.log");
        pg.run(
            "pg_ctl",
            &[
                "-D",
                data.to_str().expect("utf-8"),
                "-o",
                &options,
                "-l",
                log.to_str().expect("utf-8"),
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
        pg.url = format!("host=127.0.0.1 port={port} user=postgres dbname=postgres");
        pg
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let program = self.bin.join(tool);
        let output = if self.as_postgres {
            Command::new("runuser")
                .arg("-u")
                .arg("postgres")
                .arg("--")
                .arg(&program)
                .args(args)
                .output()
        } else {
            Command::new(&program).args(args).output()
        }
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
        assert!(
            output.status.success(),
            "{tool} failed: {}\n{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// A fresh database in this cluster, for one test.
    pub async fn database(&self, name: &str) -> String {
        let (client, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        client
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
            .await
            .expect("drop db");
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create db");
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={name}",
            self.url
                .split("port=")
                .nth(1)
                .and_then(|s| s.split(' ').next())
                .expect("port")
        )
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let data = self.dir.path().join("data");
        let program = self.bin.join("pg_ctl");
        let args = [
            "-D",
            data.to_str().unwrap_or_default(),
            "-m",
            "immediate",
            "-w",
            "stop",
        ];
        let _ = if self.as_postgres {
            Command::new("runuser")
                .arg("-u")
                .arg("postgres")
                .arg("--")
                .arg(&program)
                .args(args)
                .output()
        } else {
            Command::new(&program).args(args).output()
        };
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}
