//! CPU profiles of the control plane during the first-sync comparison's timed runs
//! (`--profile-control-plane DIR`): localkube is one process (etcd, kube-apiserver, the controllers, the fake
//! node), so one Go CPU profile shows where all of the control plane's time went while a contestant applied
//! its objects. Each profile covers the first [`WINDOW`] of a run — the same stretch of every run, whether
//! it took 2 s or 3 — and lands in `DIR/<run's namespace prefix>.pb.gz` (`bare0`, `wv`, `wv1`, …), to be
//! compared with `go tool pprof -top -diff_base=BARE.pb.gz AGENT.pb.gz`.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::Context;
use windvane_tests::localkube::{self, LocalKube};

/// The stretch of each timed run that is profiled.
pub const WINDOW_SECONDS: u32 = 2;

/// A profile being taken: `localkube kubectl get --raw /debug/pprof/profile` writing into its file.
pub struct ControlPlaneProfile {
    child: tokio::process::Child,
    path: PathBuf,
}

impl ControlPlaneProfile {
    /// Starts profiling the control plane into `dir/name.pb.gz` when `dir` is set (localkube must serve
    /// profiles: started with `--profiling`).
    pub fn start(kube: &LocalKube, dir: Option<&Path>, name: &str) -> anyhow::Result<Option<Self>> {
        let Some(dir) = dir else {
            return Ok(None);
        };
        let path = dir.join(format!("{name}.pb.gz"));
        let out =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let child = tokio::process::Command::new(localkube::binary_path()?)
            .arg("kubectl")
            .arg("--kubeconfig")
            .arg(kube.kubeconfig_path())
            .args([
                "get",
                "--raw",
                &format!("/debug/pprof/profile?seconds={WINDOW_SECONDS}"),
            ])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(Stdio::piped())
            .spawn()
            .context("starting `localkube kubectl get --raw /debug/pprof/profile`")?;
        Ok(Some(Self { child, path }))
    }

    /// Waits until the profile is written.
    pub async fn finish(self) -> anyhow::Result<()> {
        let output = self.child.wait_with_output().await?;
        anyhow::ensure!(
            output.status.success(),
            "profiling the control plane into {} failed ({}): {}",
            self.path.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
        Ok(())
    }
}
