//! `windvane-agent`: parses flags, sets up logging, and runs the agent: leader election, the admin server and
//! the sync engine, until SIGTERM or Ctrl-C.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tokio::sync::watch;
use tracing::{error, info};
use windvane_agent::config::{RunArgs, RunConfig};
use windvane_agent::engine::{Engine, SharedStatus};
use windvane_agent::leader::{Elector, LeaseTiming};
use windvane_agent::metrics::Metrics;

/// Windvane agent: keeps this cluster on the release its fleet's signed channel names.
#[derive(Debug, Parser)]
#[command(name = "windvane-agent", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent: poll, verify, apply, prune, watch and report, as the leader of its replicas.
    Run(Box<RunArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let Command::Run(args) = cli.command;
    let config = match args.resolve() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    init_tracing(config.json_logs);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: starting the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            error!("{error:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WINDVANE_LOG")
        .unwrap_or_else(|_| "info,kube=warn,hyper=warn,rustls=warn".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn run(config: RunConfig) -> anyhow::Result<()> {
    // reqwest and kube share the one crypto provider linked into the agent.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = kube_client(&config).await?;
    let (shutdown_tx, shutdown) = watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        info!("shutting down");
        let _ = shutdown_tx.send(true);
    });

    let status = SharedStatus::default();
    let metrics = Arc::new(Metrics::default());
    let (_, admin) = windvane_agent::admin::serve(
        config.admin_listen,
        status.clone(),
        metrics.clone(),
        shutdown.clone(),
    )
    .await?;
    tokio::spawn(admin);

    let elector = Elector::new(
        client.clone(),
        &config.engine.namespace,
        "windvane-agent",
        &config.identity,
        LeaseTiming::default(),
    );
    let mut waiting = shutdown.clone();
    tokio::select! {
        () = elector.acquire() => {}
        _ = waiting.wait_for(|stop| *stop) => return Ok(()),
    }
    let engine = Engine::start(config.engine.clone(), client, status, metrics).await?;
    tokio::select! {
        result = engine.run(shutdown) => result.context("sync engine")?,
        lost = elector.keep() => return Err(lost).context("stopping: leadership lost"),
    }
    Ok(())
}

async fn kube_client(config: &RunConfig) -> anyhow::Result<kube::Client> {
    let kube_config = match &config.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .with_context(|| format!("kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context(
            "finding Kubernetes credentials (in-cluster, $KUBECONFIG or ~/.kube/config)",
        )?,
    };
    kube::Client::try_from(kube_config).context("creating the Kubernetes client")
}

async fn wait_for_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
