//! A real HAProxy (Debian's `haproxy` package) in front of several `windvane-server` replicas, as an operator
//! would run it: HTTP mode, round robin, `X-Forwarded-For` added, replicas health-checked on `/readyz` and
//! taken out of rotation when they fail it. It connects to the replicas from `127.0.0.2`, so that a test can
//! trust that address alone as the proxy (`--trusted-proxy 127.0.0.2`) while clients come from `127.0.0.1`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use crate::poll::wait_for;
use crate::process::{ChildProcess, free_port};

/// The address HAProxy connects to the replicas from.
pub const PROXY_SOURCE: &str = "127.0.0.2";

/// A running HAProxy; stopped on drop.
#[derive(Debug)]
pub struct LoadBalancer {
    pub url: String,
    process: ChildProcess,
    _dir: tempfile::TempDir,
}

/// HAProxy's binary: `$WINDVANE_HAPROXY`, or Debian's.
pub fn haproxy_binary() -> PathBuf {
    std::env::var_os("WINDVANE_HAPROXY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/haproxy"))
}

/// The configuration for `replicas` (`host:port` each) behind a frontend on `port`. A dead replica refuses
/// connections, so two failed checks 200 ms apart take it out at once; `timeout check` is set apart from the
/// interval (which it defaults to) so that a live replica answering `/readyz` (a database ping) slowly under
/// load is not taken out too — with both out, HAProxy answers every request 503 and the agents back off
/// for half a minute.
pub fn config(port: u16, replicas: &[String]) -> String {
    let servers: String = replicas
        .iter()
        .enumerate()
        .map(|(i, addr)| {
            format!("    server replica{i} {addr} source {PROXY_SOURCE} check inter 200ms fall 2 rise 1\n")
        })
        .collect();
    format!(
        "global\n    maxconn 2000\n\
         defaults\n    mode http\n    timeout connect 2s\n    timeout client 60s\n    timeout server 60s\n\
         \x20   option forwardfor\n    retries 2\n    option redispatch\n    timeout check 2s\n\
         frontend windvane\n    bind 127.0.0.1:{port}\n    default_backend replicas\n\
         backend replicas\n    balance roundrobin\n    option httpchk GET /readyz\n\
         \x20   http-check expect status 200\n{servers}"
    )
}

impl LoadBalancer {
    /// HAProxy's process id; `None` when it has exited.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Starts HAProxy in the foreground and waits until it answers.
    pub async fn start(replicas: &[String]) -> anyhow::Result<LoadBalancer> {
        let dir = tempfile::tempdir()?;
        let port = free_port()?;
        let config_path = dir.path().join("haproxy.cfg");
        std::fs::write(&config_path, config(port, replicas))?;
        let program = haproxy_binary();
        anyhow::ensure!(
            program.exists(),
            "{} not found: install Debian's haproxy package (tests/prereqs.sh does), or set WINDVANE_HAPROXY",
            program.display()
        );
        let args = vec![
            "-db".to_owned(),
            "-f".to_owned(),
            config_path.display().to_string(),
        ];
        let log = dir.path().join("haproxy.log");
        let process = ChildProcess::start("haproxy", &program, &args, &[], &log)?;
        let url = format!("http://127.0.0.1:{port}");
        let http = crate::http::client();
        let livez = format!("{url}/livez");
        wait_for("haproxy answering", Duration::from_secs(20), || async {
            Ok(http
                .get(&livez)
                .send()
                .await
                .ok()
                .filter(|r| r.status() == 200)
                .map(drop))
        })
        .await
        .with_context(|| {
            format!(
                "haproxy log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        })?;
        Ok(LoadBalancer {
            url,
            process,
            _dir: dir,
        })
    }
}
