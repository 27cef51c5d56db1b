//! A real S3-protocol server for the object-storage store tests: SeaweedFS's `weed server` (built from its Go
//! module by `tests/tools/build.sh`, found through `WINDVANE_WEED`) on free loopback ports in a temp dir,
//! with one bucket, a publisher identity (access key and secret) that may write, and anonymous read, as a
//! bucket behind a CDN would be set up. Killed on drop.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use tempfile::TempDir;

use crate::poll::wait_for;
use crate::process::{ChildProcess, free_port, tail};

/// The bucket every test publishes into.
pub const BUCKET: &str = "fleet";
const ACCESS_KEY: &str = "windvane-publisher";
/// A test credential of a throwaway server; never a real secret.
const SECRET_KEY: &str = "test-only-secret-of-a-throwaway-server";

/// A running SeaweedFS with S3 on `s3_port`.
#[derive(Debug)]
pub struct S3Server {
    pub s3_port: u16,
    process: ChildProcess,
    _dir: TempDir,
}

fn weed() -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("WINDVANE_WEED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tools/weed"));
    anyhow::ensure!(
        path.exists(),
        "{} is missing: build it with tests/tools/build.sh (tests/run does), or set WINDVANE_WEED",
        path.display()
    );
    Ok(path)
}

impl S3Server {
    /// Starts the server and creates [`BUCKET`]; returns once the S3 API serves the bucket.
    pub async fn start() -> anyhow::Result<Self> {
        let dir = TempDir::with_prefix("windvane-s3")?;
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data)?;
        let config = dir.path().join("s3.json");
        std::fs::write(&config, identities())?;
        let ports: Vec<u16> = (0..8).map(|_| free_port()).collect::<Result<_, _>>()?;
        let s3_port = ports[6];
        let filer_port = ports[4];
        let args = server_args(&data, &config, &ports);
        let log = dir.path().join("weed.log");
        let process = ChildProcess::start("weed", &weed()?, &args, &[], &log)?;
        let server = S3Server {
            s3_port,
            process,
            _dir: dir,
        };
        server.create_bucket(filer_port).await?;
        Ok(server)
    }

    /// The bucket's base URL, as agents poll it: `http://127.0.0.1:PORT/fleet/PREFIX`.
    pub fn http_url(&self, prefix: &str) -> String {
        format!("http://127.0.0.1:{}/{BUCKET}/{prefix}", self.s3_port)
    }

    /// The store location for `windvane publish --root`: `s3://fleet/PREFIX`.
    pub fn store_url(&self, prefix: &str) -> String {
        format!("s3://{BUCKET}/{prefix}")
    }

    /// The environment that points the S3 client at this server with the publisher's credentials.
    pub fn publisher_env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_owned()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_owned()),
            ("AWS_REGION", "us-east-1".to_owned()),
            (
                "AWS_ENDPOINT_URL",
                format!("http://127.0.0.1:{}", self.s3_port),
            ),
            ("AWS_ALLOW_HTTP", "true".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// The same settings as `object_store` configuration keys, for a store opened in the test process.
    pub fn publisher_config(&self) -> Vec<(String, String)> {
        self.publisher_env()
            .into_iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect()
    }

    /// The server's log so far (its last lines).
    pub fn log_tail(&self) -> String {
        tail(&self.process.log(), 30)
    }

    /// A bucket is a directory under the filer's `/buckets`; making it over the filer's HTTP API needs no
    /// S3 signature. Ready when an anonymous read of a missing key says the key, not the bucket, is missing.
    async fn create_bucket(&self, filer_port: u16) -> anyhow::Result<()> {
        let http = crate::http::client();
        let filer = format!("http://127.0.0.1:{filer_port}/buckets/{BUCKET}/");
        wait_for(
            "SeaweedFS's filer to make the bucket",
            Duration::from_secs(60),
            || {
                let request = http.post(&filer).send();
                async move { Ok(request.await?.status().is_success().then_some(())) }
            },
        )
        .await
        .with_context(|| self.log_tail())?;
        let probe = self.http_url("readiness-probe");
        wait_for(
            "SeaweedFS's S3 API to serve the bucket",
            Duration::from_secs(60),
            || {
                let request = http.get(&probe).send();
                async move {
                    let body = request.await?.text().await?;
                    Ok(body.contains("NoSuchKey").then_some(()))
                }
            },
        )
        .await
        .with_context(|| self.log_tail())
    }
}

/// The publisher may do anything; anyone may read, as agents do.
fn identities() -> String {
    serde_json::json!({"identities": [
        {"name": "publisher",
         "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
         "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
        {"name": "anonymous", "actions": ["Read"]}
    ]})
    .to_string()
}

/// `weed server` with master, volume, filer and S3 in one process, every port chosen (gRPC ones too, so
/// that parallel tests never meet), the Iceberg and Lance catalogs off.
fn server_args(data: &std::path::Path, config: &std::path::Path, ports: &[u16]) -> Vec<String> {
    let [
        master,
        master_grpc,
        volume,
        volume_grpc,
        filer,
        filer_grpc,
        s3,
        s3_grpc,
    ] = ports
    else {
        unreachable!("eight ports")
    };
    [
        "server".to_owned(),
        format!("-dir={}", data.display()),
        "-ip=127.0.0.1".to_owned(),
        "-ip.bind=127.0.0.1".to_owned(),
        format!("-master.port={master}"),
        format!("-master.port.grpc={master_grpc}"),
        "-master.volumeSizeLimitMB=64".to_owned(),
        format!("-volume.port={volume}"),
        format!("-volume.port.grpc={volume_grpc}"),
        "-volume.max=8".to_owned(),
        "-filer".to_owned(),
        format!("-filer.port={filer}"),
        format!("-filer.port.grpc={filer_grpc}"),
        "-s3".to_owned(),
        format!("-s3.port={s3}"),
        format!("-s3.port.grpc={s3_grpc}"),
        "-s3.port.iceberg=0".to_owned(),
        "-s3.port.lance=0".to_owned(),
        format!("-s3.config={}", config.display()),
        "-metricsPort=0".to_owned(),
    ]
    .to_vec()
}
