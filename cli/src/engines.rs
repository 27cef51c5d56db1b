//! The real rendering engines behind `windvane build`, `publish` and `render`: the `helm` and `kustomize`
//! binaries, run as child processes with a deadline and a cap on what they print. Which binary: the
//! `--helm`/`--kustomize` flag (or `WINDVANE_HELM`/`WINDVANE_KUSTOMIZE`), else the one on `PATH`. The
//! decisions (what to render, how to read the output) are `windvane_shared::prerender`'s; this only runs
//! programs and hands back what they printed.

use std::cell::Cell;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use windvane_shared::digest::sha256_hex;
use windvane_shared::prerender::{Engines, HelmSpec, PulledChart, ValuesLayer};

/// Most bytes an engine may print: a rendering larger than this could not be published anyway.
const MAX_OUTPUT_BYTES: u64 = 64 << 20;

/// Most bytes of an engine's error output kept for the message.
const MAX_STDERR_BYTES: u64 = 64 << 10;

/// The engines' flags, shared by `build`, `publish` and `render`.
#[derive(Debug, Args)]
pub struct EngineArgs {
    /// The helm binary for apps that are Helm charts (default: helm on PATH).
    #[arg(long, value_name = "PATH", env = "WINDVANE_HELM")]
    helm: Option<PathBuf>,
    /// The kustomize binary for apps whose folder holds a kustomization.yaml (default: kustomize on PATH).
    #[arg(long, value_name = "PATH", env = "WINDVANE_KUSTOMIZE")]
    kustomize: Option<PathBuf>,
    /// How long one run of helm or kustomize may take.
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = crate::release::parse_duration_arg, env = "WINDVANE_ENGINE_TIMEOUT")]
    engine_timeout: Duration,
}

impl EngineArgs {
    /// The engines, with a scratch directory for values files and pulled charts (removed on drop).
    pub fn engines(&self) -> anyhow::Result<ProcessEngines> {
        Ok(ProcessEngines {
            helm: self.helm.clone(),
            kustomize: self.kustomize.clone(),
            timeout: self.engine_timeout,
            scratch: tempfile::tempdir()
                .map_err(|e| anyhow::anyhow!("creating a scratch directory for helm: {e}"))?,
            files: Cell::new(0),
        })
    }
}

/// Runs the real `helm` and `kustomize`.
#[derive(Debug)]
pub struct ProcessEngines {
    helm: Option<PathBuf>,
    kustomize: Option<PathBuf>,
    timeout: Duration,
    scratch: tempfile::TempDir,
    /// Names scratch files uniquely.
    files: Cell<usize>,
}

impl ProcessEngines {
    fn helm(&self) -> Result<PathBuf, String> {
        find_binary("helm", self.helm.as_deref(), "--helm", "WINDVANE_HELM")
    }

    fn kustomize(&self) -> Result<PathBuf, String> {
        find_binary(
            "kustomize",
            self.kustomize.as_deref(),
            "--kustomize",
            "WINDVANE_KUSTOMIZE",
        )
    }

    fn scratch_path(&self, name: &str) -> PathBuf {
        let n = self.files.get();
        self.files.set(n + 1);
        self.scratch.path().join(format!("{n}-{name}"))
    }
}

impl Engines for ProcessEngines {
    fn helm_pull(&self, repo: &str, chart: &str, version: &str) -> Result<PulledChart, String> {
        let helm = self.helm()?;
        let destination = self.scratch_path("chart");
        std::fs::create_dir(&destination).map_err(|e| format!("{}: {e}", destination.display()))?;
        let mut args: Vec<String> = Vec::new();
        if repo.starts_with("oci://") {
            args.extend([
                "pull".into(),
                format!("{}/{chart}", repo.trim_end_matches('/')),
            ]);
        } else {
            args.extend(["pull".into(), chart.into(), "--repo".into(), repo.into()]);
        }
        args.extend(["--version".into(), version.into(), "--destination".into()]);
        args.push(destination.display().to_string());
        run(&helm, &args, self.timeout)?;
        let archive = single_archive(&destination)?;
        let bytes = std::fs::read(&archive).map_err(|e| format!("{}: {e}", archive.display()))?;
        Ok(PulledChart {
            path: archive,
            digest: format!("sha256:{}", sha256_hex(&bytes)),
        })
    }

    fn helm_template(
        &self,
        spec: &HelmSpec,
        chart: &Path,
        values: &[ValuesLayer],
    ) -> Result<String, String> {
        let helm = self.helm()?;
        let mut args: Vec<String> = vec![
            "template".into(),
            spec.release_name.clone(),
            chart.display().to_string(),
            "--namespace".into(),
            spec.namespace.clone(),
            "--kube-version".into(),
            spec.kube_version.clone(),
            "--include-crds".into(),
        ];
        for api_version in &spec.api_versions {
            args.extend(["--api-versions".into(), api_version.clone()]);
        }
        for layer in values {
            let path = match layer {
                ValuesLayer::File(path) => path.clone(),
                // JSON is YAML: helm reads it as a values file, in the same order as the others.
                ValuesLayer::Inline(map) => {
                    let path = self.scratch_path("values.json");
                    let text = serde_json::to_vec(map).expect("values are JSON");
                    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
                    path
                }
            };
            args.extend(["--values".into(), path.display().to_string()]);
        }
        run(&helm, &args, self.timeout)
    }

    fn kustomize_build(&self, directory: &Path) -> Result<String, String> {
        let kustomize = self.kustomize()?;
        run(
            &kustomize,
            &["build".into(), directory.display().to_string()],
            self.timeout,
        )
    }
}

/// The binary to run: the flag's (which must exist), else `name` on PATH; the error says how to get it.
fn find_binary(
    name: &str,
    flag: Option<&Path>,
    flag_name: &str,
    env: &str,
) -> Result<PathBuf, String> {
    if let Some(path) = flag {
        return if path.is_file() {
            Ok(path.to_path_buf())
        } else {
            Err(format!(
                "{flag_name} {}: no such file; name the {name} binary to use",
                path.display()
            ))
        };
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    });
    on_path.ok_or_else(|| {
        format!(
            "{name} is needed and was not found on PATH; install it, pass {flag_name} PATH (or set {env}), \
             or build it from source with tests/tools/build.sh (it writes target/tools/{name})"
        )
    })
}

/// The one `.tgz` that `helm pull` wrote into `directory`.
fn single_archive(directory: &Path) -> Result<PathBuf, String> {
    let entries =
        std::fs::read_dir(directory).map_err(|e| format!("{}: {e}", directory.display()))?;
    let archives: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "tgz"))
        .collect();
    match archives.as_slice() {
        [archive] => Ok(archive.clone()),
        _ => Err(format!(
            "helm pull wrote {} chart archives, expected one",
            archives.len()
        )),
    }
}

/// Runs `program` with `args`; its standard output on success, else what went wrong in its own words.
fn run(program: &Path, args: &[String], timeout: Duration) -> Result<String, String> {
    let shown = format!("{} {}", program.display(), args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running {}: {e}", program.display()))?;
    let stdout = capture(child.stdout.take().expect("piped"), MAX_OUTPUT_BYTES);
    let stderr = capture(child.stderr.take().expect("piped"), MAX_STDERR_BYTES);
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{shown} did not finish within {timeout:?}; raise --engine-timeout if it needs longer"
                ));
            }
            // A child process has no async exit notification in std; check again shortly.
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(format!("waiting for {shown}: {e}")),
        }
    };
    let stdout = stdout
        .join()
        .expect("reader thread")
        .map_err(|e| format!("{shown}: {e}"))?;
    let stderr = stderr.join().expect("reader thread").unwrap_or_default();
    if !status.success() {
        let stderr = String::from_utf8_lossy(&stderr);
        return Err(format!("{shown} failed ({status}): {}", stderr.trim()));
    }
    if stdout.len() as u64 > MAX_OUTPUT_BYTES {
        return Err(format!(
            "{shown} printed more than {} MiB",
            MAX_OUTPUT_BYTES >> 20
        ));
    }
    String::from_utf8(stdout).map_err(|e| format!("{shown} printed what is not UTF-8: {e}"))
}

/// Reads a pipe to its end on a thread (so the child never blocks on a full pipe), keeping one byte more
/// than `cap` so that an over-long output is noticed.
fn capture(
    pipe: impl Read + Send + 'static,
    cap: u64,
) -> std::thread::JoinHandle<std::io::Result<Vec<u8>>> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut pipe = pipe;
        (&mut pipe).take(cap + 1).read_to_end(&mut kept)?;
        // Drain the rest, so the child can finish writing and exit.
        std::io::copy(&mut pipe, &mut std::io::sink())?;
        Ok(kept)
    })
}
