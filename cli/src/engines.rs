//! The real rendering engines behind `windvane build`, `publish` and `render`: the `helm` and `kustomize`
//! binaries, run as child processes with a deadline and a cap on what they print. Which binary: the
//! `--helm`/`--kustomize` flag (or `WINDVANE_HELM`/`WINDVANE_KUSTOMIZE`), else the one on `PATH`. The
//! decisions (what to render, how to read the output) are `windvane_publisher::prerender`'s; this only runs
//! programs and hands back what they printed.
//!
//! The fleet tree is untrusted input (any pull request changes it), so the engines run confined: every
//! value that becomes an argument is checked (`prerender::check_helm_arguments`) and positional arguments
//! come after `--`; each run gets a cleared environment (HOME, PATH and helm's cache, config and data
//! directories in the scratch directory: no credentials or tokens of the CI job); a chart or kustomize
//! directory may hold no symbolic link that leaves the fleet tree; and a kustomization may not name a
//! remote resource (`https://…`, `github.com/…`, `git@…`) unless `--kustomize-remote` allows it and the
//! reference is pinned to a commit (`?ref=<40 hex digits>`). Exec plugins never run: windvane never passes
//! kustomize's `--enable-alpha-plugins`/`--enable-exec` nor helm's `--post-renderer`.

use std::cell::Cell;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use windvane_publisher::prerender::{EngineError, Engines, HelmSpec, PulledChart, ValuesLayer};
use windvane_shared::crypto::digest::sha256_hex;
use windvane_shared::text::duration::parse_duration;

use crate::error::{Error, Result, report};

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
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = parse_duration, env = "WINDVANE_ENGINE_TIMEOUT")]
    engine_timeout: Duration,
    /// Let kustomizations fetch remote resources (git or https), each pinned to a commit with
    /// `?ref=<40 hex digits>`; without it a remote resource is refused.
    #[arg(long, env = "WINDVANE_KUSTOMIZE_REMOTE")]
    kustomize_remote: bool,
}

impl EngineArgs {
    /// The engines for the fleet tree at `root`, with a scratch directory for values files, pulled charts and
    /// the engines' own home (removed on drop).
    pub fn engines(&self, root: &Path) -> Result<ProcessEngines> {
        let root = root.canonicalize().map_err(|source| Error::FleetTreePath {
            path: root.to_path_buf(),
            source,
        })?;
        Ok(ProcessEngines {
            helm: self.helm.clone(),
            kustomize: self.kustomize.clone(),
            timeout: self.engine_timeout,
            scratch: tempfile::tempdir().map_err(|source| Error::Scratch { source })?,
            files: Cell::new(0),
            root,
            kustomize_remote: self.kustomize_remote,
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
    /// The fleet tree (canonical): no chart or kustomization may reach outside it through a link.
    root: PathBuf,
    kustomize_remote: bool,
}

impl ProcessEngines {
    fn helm(&self) -> Result<PathBuf> {
        find_binary("helm", self.helm.as_deref(), "--helm", "WINDVANE_HELM")
    }

    fn kustomize(&self) -> Result<PathBuf> {
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

    fn run(&self, program: &Path, args: &[String]) -> Result<String> {
        run(program, args, self.timeout, self.scratch.path())
    }

    fn pull(
        &self,
        repo: &str,
        chart: &str,
        version: &str,
        plain_http: bool,
    ) -> Result<PulledChart> {
        let helm = self.helm()?;
        let destination = self.scratch_path("chart");
        std::fs::create_dir(&destination).map_err(|source| Error::CreateDir {
            path: destination.clone(),
            source,
        })?;
        let mut args: Vec<String> = vec![
            "pull".into(),
            "--version".into(),
            version.into(),
            "--destination".into(),
            destination.display().to_string(),
        ];
        let oci = repo.starts_with("oci://");
        let reference = if oci {
            format!("{}/{chart}", repo.trim_end_matches('/'))
        } else {
            args.extend(["--repo".into(), repo.into()]);
            chart.into()
        };
        if plain_http {
            args.push("--plain-http".into());
        }
        args.extend(["--".into(), reference]);
        let printed = self.run(&helm, &args)?;
        let archive = single_archive(&destination)?;
        let bytes = std::fs::read(&archive).map_err(|source| Error::ReadFile {
            path: archive.clone(),
            source,
        })?;
        let manifest_digest = if oci {
            Some(
                manifest_digest(&printed).ok_or_else(|| Error::NoManifestDigest {
                    reference: format!("{}/{chart}", repo.trim_end_matches('/')),
                })?,
            )
        } else {
            None
        };
        Ok(PulledChart {
            path: archive,
            digest: format!("sha256:{}", sha256_hex(&bytes)),
            manifest_digest,
        })
    }

    fn template(&self, spec: &HelmSpec, chart: &Path, values: &[ValuesLayer]) -> Result<String> {
        let helm = self.helm()?;
        if chart.is_dir() {
            check_confined(chart, &self.root)?;
        }
        let mut args: Vec<String> = vec![
            "template".into(),
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
                // A values file is the tree's: through a link it could be any file helm can read.
                ValuesLayer::File(path) => crate::kustomize_check::inside(path, &self.root)?,
                // JSON is YAML: helm reads it as a values file, in the same order as the others.
                ValuesLayer::Inline(map) => {
                    let path = self.scratch_path("values.json");
                    let text = serde_json::to_vec(map).expect("values are JSON");
                    std::fs::write(&path, text).map_err(|source| Error::WriteFile {
                        path: path.clone(),
                        source,
                    })?;
                    path
                }
            };
            args.extend(["--values".into(), path.display().to_string()]);
        }
        args.extend([
            "--".into(),
            spec.release_name.clone(),
            chart.display().to_string(),
        ]);
        self.run(&helm, &args)
    }

    fn build_overlay(&self, directory: &Path) -> Result<String> {
        let kustomize = self.kustomize()?;
        crate::kustomize_check::check_tree(directory, &self.root, self.kustomize_remote)?;
        self.run(
            &kustomize,
            &["build".into(), "--".into(), directory.display().to_string()],
        )
    }
}

/// The publisher's interface to the engines takes a boxed error, which it shows by its message: the typed
/// errors above go through it with their whole chain of causes (`report`), so none is lost.
impl Engines for ProcessEngines {
    fn helm_pull(
        &self,
        repo: &str,
        chart: &str,
        version: &str,
        plain_http: bool,
    ) -> std::result::Result<PulledChart, EngineError> {
        self.pull(repo, chart, version, plain_http)
            .map_err(|e| report(&e).into())
    }

    fn helm_template(
        &self,
        spec: &HelmSpec,
        chart: &Path,
        values: &[ValuesLayer],
    ) -> std::result::Result<String, EngineError> {
        self.template(spec, chart, values)
            .map_err(|e| report(&e).into())
    }

    fn kustomize_build(&self, directory: &Path) -> std::result::Result<String, EngineError> {
        self.build_overlay(directory).map_err(|e| report(&e).into())
    }
}

/// The binary to run: the flag's (which must exist), else `name` on PATH; the error says how to get it.
fn find_binary(
    name: &'static str,
    flag: Option<&Path>,
    flag_name: &'static str,
    env: &'static str,
) -> Result<PathBuf> {
    if let Some(path) = flag {
        return if path.is_file() {
            Ok(path.to_path_buf())
        } else {
            Err(Error::EngineMissing {
                name,
                flag: flag_name,
                path: path.to_path_buf(),
            })
        };
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    });
    on_path.ok_or(Error::EngineNotOnPath {
        name,
        flag: flag_name,
        env,
    })
}

/// The OCI manifest digest that `helm pull` prints for a chart from a registry (`Digest: sha256:<64 hex>`):
/// helm resolved the version's tag to this manifest and checked the chart layer against it.
fn manifest_digest(printed: &str) -> Option<String> {
    printed.lines().find_map(|line| {
        let digest = line.trim().strip_prefix("Digest: ")?;
        let hex = digest.strip_prefix("sha256:")?;
        let ok = hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        ok.then(|| digest.to_owned())
    })
}

/// The one `.tgz` that `helm pull` wrote into `directory`.
fn single_archive(directory: &Path) -> Result<PathBuf> {
    let entries = std::fs::read_dir(directory).map_err(|source| Error::ReadFile {
        path: directory.to_path_buf(),
        source,
    })?;
    let archives: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "tgz"))
        .collect();
    match archives.as_slice() {
        [archive] => Ok(archive.clone()),
        _ => Err(Error::ChartArchives {
            count: archives.len(),
        }),
    }
}

/// Refuses a symbolic link under `dir` that resolves outside `root` (or does not resolve).
fn check_confined(dir: &Path, root: &Path) -> Result<()> {
    crate::kustomize_check::check_links(dir, root)
}

/// Runs `program` with `args` and a cleared environment (HOME, PATH and helm's directories under
/// `scratch`); its standard output on success, else what went wrong in its own words.
fn run(program: &Path, args: &[String], timeout: Duration, scratch: &Path) -> Result<String> {
    let shown = format!("{} {}", program.display(), args.join(" "));
    let mut child = confined(program, scratch)?
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| Error::EngineSpawn {
            program: program.to_path_buf(),
            source,
        })?;
    let stdout = capture(child.stdout.take().expect("piped"), MAX_OUTPUT_BYTES);
    let stderr = capture(child.stderr.take().expect("piped"), MAX_STDERR_BYTES);
    let status = wait(&mut child, timeout, &shown)?;
    let stdout = stdout
        .join()
        .expect("reader thread")
        .map_err(|source| Error::EngineOutput {
            command: shown.clone(),
            source,
        })?;
    let stderr = stderr.join().expect("reader thread").unwrap_or_default();
    if !status.success() {
        return Err(Error::EngineFailed {
            command: shown,
            status,
            stderr: String::from_utf8_lossy(&stderr).trim().to_owned(),
        });
    }
    if stdout.len() as u64 > MAX_OUTPUT_BYTES {
        return Err(Error::EngineOutputTooLarge {
            command: shown,
            cap: MAX_OUTPUT_BYTES,
        });
    }
    String::from_utf8(stdout).map_err(|source| Error::EngineNotUtf8 {
        command: shown,
        source,
    })
}

/// `program` with a cleared environment: HOME, PATH and helm's directories under `scratch`.
fn confined(program: &Path, scratch: &Path) -> Result<Command> {
    let home = scratch.join("home");
    std::fs::create_dir_all(&home).map_err(|source| Error::CreateDir {
        path: home.clone(),
        source,
    })?;
    let mut command = Command::new(program);
    command.env_clear().env("HOME", &home);
    if let Some(path) = std::env::var_os("PATH") {
        command.env("PATH", path);
    }
    for (name, dir) in [
        ("HELM_CACHE_HOME", "cache"),
        ("HELM_CONFIG_HOME", "config"),
        ("HELM_DATA_HOME", "data"),
        ("XDG_CACHE_HOME", "cache"),
        ("XDG_CONFIG_HOME", "config"),
        ("XDG_DATA_HOME", "data"),
    ] {
        command.env(name, home.join(dir));
    }
    Ok(command)
}

/// Waits for `child` until `timeout`, killing it then.
fn wait(child: &mut Child, timeout: Duration, shown: &str) -> Result<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::EngineTimeout {
                    command: shown.to_owned(),
                    timeout,
                });
            }
            // A child process has no async exit notification in std; check again shortly.
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(source) => {
                return Err(Error::EngineWait {
                    command: shown.to_owned(),
                    source,
                });
            }
        }
    }
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
