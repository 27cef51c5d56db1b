//! `demo`: Windvane in one command. Starts a source server and a fleet of localkube clusters (`--clusters N`,
//! default 3) with real agents, each reaching the server through its own loopback proxy, publishes the
//! example fleet, and narrates what happens — drift healed and logged with who made it, a deleted pod
//! recreated by Kubernetes with Windvane doing nothing, a new cluster deployed by its labels alone, a
//! cluster cut off from the network shown Unknown yet still healing, then Synced again — reading every
//! outcome back from the running system. Then it waits for Ctrl-C (or exits, with `--no-wait`) and stops
//! everything it started, leaving no process and no temporary directory behind.
//!
//! ```text
//! ./demo                                   # builds what it needs, then runs this
//! target/release/demo [--clusters 12] [--no-wait] [--keep] [--listen 127.0.0.1:8080] [--real-node]
//! ```
//!
//! The binaries (`windvane`, `windvane-agent`, `windvane-server`) are taken from the demo's own directory
//! (`--bin-dir`), localkube from `WINDVANE_LOCALKUBE` or `target/localkube/localkube`.

// This file is a crate root, so its modules' files are named explicitly: they live in `demo/`.
#[path = "demo/cast.rs"]
mod cast;
#[path = "demo/faults.rs"]
mod faults;
#[path = "demo/narrate.rs"]
mod narrate;
#[path = "demo/roster.rs"]
mod roster;
#[path = "demo/story.rs"]
mod story;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

use crate::cast::{Demo, Settings};
use crate::narrate::{Narrator, seconds};
use crate::roster::Roster;

/// Windvane in one command: a source server, a fleet of real Kubernetes control planes (localkube) each
/// with its agent, the example fleet published — and a narrated story of drift, a deleted pod, a new
/// cluster and one cut off from the network, read back from the running system.
#[derive(Debug, Parser)]
#[command(name = "demo", long_about = None)]
struct Args {
    /// Clusters in the fleet at the start, 3 to 24: max(2, N/4) env=prod, max(1, N/3) env=staging, the
    /// rest env=dev (3: prod-eu, prod-us, staging-eu; 12: 3 prod, 4 staging, 5 dev). One more env=prod
    /// cluster joins later.
    #[arg(long, env = "WINDVANE_DEMO_CLUSTERS", default_value = "3", value_parser = roster::parse_clusters)]
    clusters: usize,
    /// Exit after the story instead of waiting for Ctrl-C (for tests and CI).
    #[arg(long, env = "WINDVANE_DEMO_NO_WAIT")]
    no_wait: bool,
    /// Keep the work directory (release key, store, server database, logs) after exit.
    #[arg(long, env = "WINDVANE_DEMO_KEEP")]
    keep: bool,
    /// Address the source server listens on; port 0 picks a free port (the URL is printed).
    #[arg(long, env = "WINDVANE_DEMO_LISTEN", default_value = "127.0.0.1:0")]
    listen: String,
    /// The fleet source tree to publish. [default: deploy/examples/fleet of this repository]
    #[arg(long, env = "WINDVANE_DEMO_FLEET", value_name = "DIR")]
    fleet: Option<PathBuf>,
    /// Directory holding windvane, windvane-agent and windvane-server. [default: the demo's own directory]
    #[arg(long, env = "WINDVANE_BIN_DIR", value_name = "DIR")]
    bin_dir: Option<PathBuf>,
    /// How often each agent sends a heartbeat.
    #[arg(long, env = "WINDVANE_DEMO_HEARTBEAT_INTERVAL", default_value = "2s")]
    heartbeat_interval: String,
    /// How often each agent polls the release channel.
    #[arg(long, env = "WINDVANE_DEMO_POLL_INTERVAL", default_value = "2s")]
    poll_interval: String,
    /// How long a cluster may stay silent (or cut off) before the server shows it Unknown.
    #[arg(long, env = "WINDVANE_DEMO_UNKNOWN_AFTER", default_value = "10s")]
    unknown_after: String,
    /// Run the quiet prod cluster (prod-us, the pod scene's) on a real node: its pods are real containers
    /// (containerd, runc, a kubelet), so the deleted pod is really recreated and really runs. Needs root and
    /// runs the whole demo in a network namespace of its own that holds only loopback (tests/loopback-only),
    /// because a real node's pods get a network of their own; the fleet page is then served inside it.
    #[arg(long, env = "WINDVANE_DEMO_REAL_NODE")]
    real_node: bool,
    /// The longest the demo waits for any one outcome before it gives up.
    #[arg(long, env = "WINDVANE_DEMO_STEP_TIMEOUT", default_value = "3m", value_parser = duration)]
    step_timeout: Duration,
}

/// Ctrl-C before the story ended.
#[derive(Debug)]
struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted")
    }
}

impl std::error::Error for Interrupted {}

fn duration(text: &str) -> Result<Duration, String> {
    windvane_shared::text::duration::parse_duration(text).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.real_node && !windvane_tests::process::in_loopback_namespace() {
        return windvane_tests::process::reexec_in_loopback_namespace("demo");
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WINDVANE_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: starting the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if error.is::<Interrupted>() => {
            eprintln!("demo interrupted; everything it had started is stopped");
            ExitCode::from(130)
        }
        Err(error) => {
            eprintln!("demo failed: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn settings(args: &Args) -> anyhow::Result<Settings> {
    let bin_dir = match &args.bin_dir {
        Some(dir) => dir.clone(),
        None => std::env::current_exe()
            .context("finding the demo's own path")?
            .parent()
            .context("the demo's path has no directory")?
            .to_path_buf(),
    };
    // The binaries run in the work directory, so a relative --bin-dir must be made absolute here.
    let bin_dir = bin_dir
        .canonicalize()
        .with_context(|| format!("--bin-dir {}: no such directory", bin_dir.display()))?;
    let fleet_dir = match &args.fleet {
        Some(dir) => dir.clone(),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/fleet"),
    };
    let fleet_dir = fleet_dir
        .canonicalize()
        .with_context(|| format!("--fleet {}: no such directory", fleet_dir.display()))?;
    for (flag, value) in [
        ("--heartbeat-interval", &args.heartbeat_interval),
        ("--poll-interval", &args.poll_interval),
        ("--unknown-after", &args.unknown_after),
    ] {
        duration(value).map_err(|e| anyhow::anyhow!("{flag} {value}: {e}"))?;
    }
    Ok(Settings {
        bin_dir,
        fleet_dir,
        listen: args.listen.clone(),
        heartbeat_interval: args.heartbeat_interval.clone(),
        poll_interval: args.poll_interval.clone(),
        unknown_after: args.unknown_after.clone(),
        step_timeout: args.step_timeout,
        keep: args.keep,
        roster: Roster::new(args.clusters),
        real_node: args.real_node,
    })
}

async fn run(args: Args) -> anyhow::Result<()> {
    // kube and reqwest share one crypto provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let say = Narrator::new();
    let mut demo = Demo::new(settings(&args)?, say)?;
    println!(
        "Windvane demo: a source server, a fleet of real Kubernetes control planes with their agents, and the \
         example fleet `acme`.\nCtrl-C stops everything at any time."
    );
    // One listener for Ctrl-C from the start to the end: it records a SIGINT from the moment it exists. A
    // fresh `ctrl_c()` after the story would miss one sent between the story's end and its first poll — the
    // signal would be swallowed (the handler is installed) and the demo would wait forever; a loaded machine
    // showed it after "Press Ctrl-C".
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("listening for Ctrl-C")?;
    // The story runs until it ends or Ctrl-C; either way everything is stopped below.
    let told = tokio::select! {
        told = story::tell(&mut demo) => told,
        _ = interrupt.recv() => Err(Interrupted.into()),
    };
    let waited: anyhow::Result<()> = match &told {
        Ok(()) => {
            let url = demo.server().map(|s| s.url.clone()).unwrap_or_default();
            demo.say.step("The story is told");
            demo.say.say(&format!(
                "Done in {}. The fleet page: {url}/  (it refreshes itself)",
                seconds(demo.say.elapsed())
            ));
            if args.real_node {
                demo.say.detail(&format!(
                    "(--real-node: the page is served inside the demo's own network namespace; e.g. \
                     nsenter --net=/proc/{}/ns/net curl -s {url}/api/v1/fleet)",
                    std::process::id()
                ));
            }
            demo.say.detail(&format!(
                "JSON: {url}/api/v1/fleet · drift log: {url}/api/v1/drift · a cluster: {url}/clusters/prod-eu"
            ));
            demo.say.detail(&format!(
                "From a terminal: {} status --server {url}",
                demo.settings.bin_dir.join("windvane").display()
            ));
            if args.no_wait {
                Ok(())
            } else {
                demo.say.say(
                    "Press Ctrl-C to stop everything (the clusters, their agents, the server).",
                );
                interrupt.recv().await;
                Ok(())
            }
        }
        Err(_) => Ok(()),
    };
    let stopped = demo.teardown().await;
    told?;
    waited?;
    stopped?;
    demo.say.say("Everything stopped.");
    Ok(())
}
