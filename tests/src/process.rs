//! Windvane's own binaries as child processes of a test: found next to the test executable (`cargo build
//! --workspace --bins` puts them there; `tests/run` builds them first), started with arguments, logs
//! captured to a file, stopped (SIGTERM, with a grace period) or killed, and killed on drop; with the small
//! things every harness of this crate shares: a free loopback port and the tail of a log.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a stopped process may take to exit after SIGTERM before it is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(20);

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
        let file = open_log(log)?;
        let mut command = Command::new(program);
        command
            .args(args)
            .envs(envs.iter().copied())
            .stdout(file.try_clone()?)
            .stderr(file);
        Self::spawn(name, &mut command, log)
    }

    /// Starts `command` as configured (stdout and stderr as its caller set them up, stdin closed); `log` is
    /// the file [`ChildProcess::log`] reads.
    pub fn spawn(name: &str, command: &mut Command, log: &Path) -> anyhow::Result<Self> {
        let child = command
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting {name} ({:?}): {e}", command.get_program()))?;
        Ok(Self {
            child: Some(child),
            log: log.to_path_buf(),
            name: name.to_owned(),
        })
    }

    /// The child's piped stdout or stderr, for a caller that reads it itself.
    pub fn take_output(
        &mut self,
    ) -> (
        Option<std::process::ChildStdout>,
        Option<std::process::ChildStderr>,
    ) {
        match self.child.as_mut() {
            Some(child) => (child.stdout.take(), child.stderr.take()),
            None => (None, None),
        }
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

    /// SIGTERM, then wait for the exit however long it takes; returns the exit status.
    pub fn terminate(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        let mut child = self
            .child
            .take()
            .ok_or_else(|| anyhow::anyhow!("{} is not running", self.name))?;
        sigterm(child.id());
        Ok(child.wait()?)
    }

    /// Asks the process to stop (SIGTERM) and waits for it to exit, at most `grace`; then kills it. Returns
    /// whether it exited on its own (true also when it was not running).
    pub async fn stop(&mut self, grace: Duration) -> bool {
        let Some(pid) = self.pid() else {
            return true;
        };
        if self.is_running() {
            sigterm(pid);
        }
        let deadline = Instant::now() + grace;
        let exited = loop {
            if !self.is_running() {
                break true;
            }
            if Instant::now() >= deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        // Reaps it (and kills it when it did not exit in time).
        self.kill();
        exited
    }
}

/// `kill -TERM pid`; errors are ignored (the process may be gone already).
fn sigterm(pid: u32) {
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Opens `log` for appending, creating it.
pub fn open_log(log: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| anyhow::anyhow!("opening {}: {e}", log.display()))
}

/// A free loopback port (bound and released; good enough for tests on one machine).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The last `lines` lines of a log.
pub fn tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The last `lines` lines of the log file at `path`, or a note that there is none.
pub fn tail_file(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => tail(&String::from_utf8_lossy(&bytes), lines),
        Err(_) => format!("(no log at {})", path.display()),
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Set by `tests/loopback-only` inside the namespace it makes.
pub const LOOPBACK_ONLY_ENV: &str = "WINDVANE_LOOPBACK_ONLY";

/// Whether this process runs inside `tests/loopback-only`'s namespace.
pub fn in_loopback_namespace() -> bool {
    std::env::var_os(LOOPBACK_ONLY_ENV).is_some_and(|v| v == "1")
}

/// Runs this same command again inside a network namespace that holds only loopback (`tests/loopback-only`),
/// so that nothing it starts (servers, agents, control planes, a real node) can send traffic off the
/// machine. Returns only if that could not be started; `what` names the program in the error.
pub fn reexec_in_loopback_namespace(what: &str) -> std::process::ExitCode {
    use std::os::unix::process::CommandExt;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("loopback-only");
    let error = Command::new(&script)
        .arg(std::env::current_exe().unwrap_or_else(|_| what.into()))
        .args(std::env::args_os().skip(1))
        .exec();
    eprintln!(
        "error: running the {what} in a loopback-only network namespace through {}: {error}",
        script.display()
    );
    std::process::ExitCode::from(2)
}
