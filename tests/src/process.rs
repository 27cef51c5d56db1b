//! Windvane's own binaries as child processes of a test: found next to the test executable (cargo builds
//! them for `cargo test --workspace`), started with arguments, logs captured to a file, killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Path of a workspace binary (`windvane`, `windvane-agent`, `windvane-server`) in the same target directory
/// as the running test.
pub fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/<test>-<hash> → target/<profile>/<name>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| anyhow::anyhow!("unexpected test path {}", exe.display()))?;
    let path = profile_dir.join(name);
    anyhow::ensure!(
        path.exists(),
        "{} is missing: build it first (cargo build --workspace, or run the tests with tests/run)",
        path.display()
    );
    Ok(path)
}

/// A running child process whose output goes to a log file; killed (and reaped) on drop.
#[derive(Debug)]
pub struct ChildProcess {
    child: Option<Child>,
    log: PathBuf,
    name: String,
}

impl ChildProcess {
    /// Starts `program` with `args`, stdout and stderr appended to `log`.
    pub fn start(
        name: &str,
        program: &Path,
        args: &[String],
        envs: &[(&str, &str)],
        log: &Path,
    ) -> anyhow::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let child = Command::new(program)
            .args(args)
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting {}: {e}", program.display()))?;
        Ok(Self {
            child: Some(child),
            log: log.to_path_buf(),
            name: name.to_owned(),
        })
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log file's path.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then wait for the exit; returns the exit status.
    pub fn terminate(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        let mut child = self
            .child
            .take()
            .ok_or_else(|| anyhow::anyhow!("{} is not running", self.name))?;
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()?;
        Ok(child.wait()?)
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
