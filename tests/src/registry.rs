//! A real OCI registry for the chart tests: the CNCF distribution registry (`registry serve`, built from its Go
//! module by `tests/tools/build.sh`, found through `WINDVANE_REGISTRY`) on a free loopback port, plain HTTP,
//! storing in a temp dir, no authentication and tracing off. Charts are pushed to it with the real `helm push`
//! and `windvane build` pulls them as `oci://127.0.0.1:PORT/…`. Killed on drop, or by [`OciRegistry::stop`]
//! for the tests of a registry that is down.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use tempfile::TempDir;

use crate::poll::wait_for;
use crate::process::{ChildProcess, free_port, tail};

/// A running registry on `127.0.0.1:port`.
#[derive(Debug)]
pub struct OciRegistry {
    pub port: u16,
    process: ChildProcess,
    _dir: TempDir,
}

fn registry() -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("WINDVANE_REGISTRY")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tools/registry")
        });
    anyhow::ensure!(
        path.exists(),
        "{} is missing: build it with tests/tools/build.sh (tests/run does), or set WINDVANE_REGISTRY",
        path.display()
    );
    Ok(path)
}

impl OciRegistry {
    /// Starts the registry; returns once `/v2/` answers (the distribution API's version check).
    pub async fn start() -> anyhow::Result<Self> {
        let dir = TempDir::with_prefix("windvane-registry")?;
        let port = free_port()?;
        let config = dir.path().join("config.yml");
        std::fs::write(&config, config_yaml(&dir.path().join("data"), port))?;
        let log = dir.path().join("registry.log");
        let args = vec!["serve".to_owned(), config.display().to_string()];
        // Tracing would export to an OTLP collector; there is none.
        let env = [
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_SDK_DISABLED", "true"),
        ];
        let process = ChildProcess::start("registry", &registry()?, &args, &env, &log)?;
        let registry = OciRegistry {
            port,
            process,
            _dir: dir,
        };
        let http = crate::http::client();
        let url = format!("http://127.0.0.1:{port}/v2/");
        wait_for(
            "the OCI registry to answer /v2/",
            Duration::from_secs(30),
            || {
                let request = http.get(&url).send();
                async move {
                    Ok(match request.await {
                        Ok(response) => response.status().is_success().then_some(()),
                        Err(_) => None,
                    })
                }
            },
        )
        .await
        .with_context(|| registry.log_tail())?;
        Ok(registry)
    }

    /// `127.0.0.1:PORT`, as `helm push` and `oci://` references name the registry.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `oci://127.0.0.1:PORT/PATH`: a repository prefix to push charts under and name in `helm.repo`.
    pub fn oci_url(&self, path: &str) -> String {
        format!("oci://{}/{path}", self.host())
    }

    /// Stops the registry (SIGKILL): the port answers nothing from then on.
    pub fn stop(&mut self) {
        self.process.kill();
    }

    /// The registry's log so far (its last lines).
    pub fn log_tail(&self) -> String {
        tail(&self.process.log(), 30)
    }
}

/// A filesystem-backed registry on loopback, without authentication, with a fixed HTTP secret (one process,
/// so any secret will do; a fixed one keeps the log free of the warning about a generated one).
fn config_yaml(data: &std::path::Path, port: u16) -> String {
    format!(
        "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    \
         rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n  secret: \
         windvane-test-registry\n",
        data.display()
    )
}
