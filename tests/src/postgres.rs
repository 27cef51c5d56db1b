//! A throwaway PostgreSQL cluster for the tests of the server's PostgreSQL database: Debian's server
//! binaries (`initdb`, `pg_ctl`) run on a free loopback port in a temp dir, one fresh database per test.

use std::path::PathBuf;
use std::process::Command;

use crate::process::free_port;

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

/// The directory of PostgreSQL's server binaries (`initdb`, `pg_ctl`): `$WINDVANE_PG_BIN`, or the newest
/// Debian installs under `/usr/lib/postgresql`; `None` when there is none.
pub fn find_bin() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("WINDVANE_PG_BIN") {
        return Some(PathBuf::from(dir));
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
    versions.pop()
}

fn pg_bin() -> PathBuf {
    find_bin().unwrap_or_else(|| {
        panic!(
            "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin (install Debian's `postgresql` \
             package, or set WINDVANE_PG_BIN)"
        )
    })
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
        let port = free_port().expect("a free port");
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

    /// The postmaster's process id (its backends are its children), from its pid file; `None` when it is
    /// not running.
    pub fn postmaster_pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.dir.path().join("data/postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
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
