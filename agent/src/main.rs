//! `windvane-agent`: parses flags, sets up logging, and runs the agent: leader election, the admin server and
//! the sync engine, until SIGTERM or Ctrl-C.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tokio::sync::watch;
use tracing::{error, info, warn};
use windvane_agent::backoff::{full_jitter, random_unit};
use windvane_agent::config::{DiffArgs, RunArgs, RunConfig};
use windvane_agent::engine::Engine;
use windvane_agent::kube::leader::{Elector, LeaseTiming};
use windvane_agent::report::metrics::Metrics;
use windvane_agent::report::status::{AgentStatus, StatusRx};

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
    /// Show what the agent would change on this cluster (server-side dry run), like `terraform plan`.
    /// Exit status: 0 no difference, 1 differences, 2 error.
    Diff(Box<DiffArgs>),
    /// Ask the agent to revert one object's alert-only drift once (writes windvane.io/revert=now on it).
    Heal(HealArgs),
}

#[derive(Debug, clap::Args)]
struct HealArgs {
    /// The object: KIND/NAMESPACE/NAME, or KIND/NAME when cluster-scoped (KIND may be Kind.group).
    #[arg(long, value_name = "KIND/NS/NAME")]
    object: String,
    /// Kubeconfig to use [default: $KUBECONFIG, ~/.kube/config, in-cluster].
    #[arg(long, value_name = "FILE", env = "KUBECONFIG")]
    kubeconfig: Option<std::path::PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let args = match cli.command {
        Command::Run(args) => args,
        Command::Diff(args) => return diff(&args),
        Command::Heal(args) => return heal(&args),
    };
    let config = match args.resolve() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    init_tracing(config.json_logs);
    // One thread: the agent waits on the network nearly all the time, and one thread allocates from one
    // malloc arena — per-thread arenas of a multi-threaded runtime cost about 4 MiB at peak with 1,000
    // objects, where the agent's whole budget is 32 MiB.
    let runtime = match tokio::runtime::Builder::new_current_thread()
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

/// `diff`: exit 0 when nothing would change, 1 when something would, 2 on any error.
fn diff(args: &DiffArgs) -> ExitCode {
    let config = match args.resolve() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    init_tracing(false);
    let outcome = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| {
            runtime.block_on(async {
                let _ = rustls::crypto::ring::default_provider().install_default();
                let client = kube_client(config.kubeconfig.as_ref()).await?;
                Ok(
                    windvane_agent::heal::diff::run(&config, client, &mut std::io::stdout().lock())
                        .await?,
                )
            })
        });
    match outcome {
        Ok(summary) if summary.failed > 0 => {
            eprintln!("error: {} object(s) could not be compared", summary.failed);
            ExitCode::from(2)
        }
        Ok(summary) if summary.changed + summary.created > 0 => ExitCode::from(1),
        Ok(_) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

/// `heal`: writes the revert request; exit 0 once written, 2 on any error.
fn heal(args: &HealArgs) -> ExitCode {
    let object = match windvane_agent::heal::cli::parse_object(&args.object) {
        Ok(object) => object,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    let outcome = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| {
            runtime.block_on(async {
                let _ = rustls::crypto::ring::default_provider().install_default();
                let client = kube_client(args.kubeconfig.as_ref()).await?;
                Ok(windvane_agent::heal::cli::request(client, &object).await?)
            })
        });
    match outcome {
        Ok(manager) => {
            println!(
                "asked the agent to revert {} once (recorded as {manager})",
                args.object
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
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
    let client = kube_client(config.kubeconfig.as_ref()).await?;
    if let Some(scope) = config.engine.allowlist.describe_cluster_scope() {
        // Said at start-up, loudly: narrowing the namespaces also refuses cluster-scoped objects.
        warn!("allowlist: {scope}");
    }
    let (shutdown_tx, shutdown) = watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        info!("shutting down");
        let _ = shutdown_tx.send(true);
    });

    let (status_tx, status) = watch::channel(AgentStatus::default());
    let metrics = Arc::new(Metrics::default());
    let elector = Elector::new(
        client.clone(),
        &config.engine.namespace,
        "windvane-agent",
        &config.identity,
        LeaseTiming::default(),
    );
    let sources = windvane_agent::report::admin::Sources {
        status: status.clone(),
        metrics: metrics.clone(),
        replica: elector.replica(),
    };
    let (_, admin) =
        windvane_agent::report::admin::serve(config.admin_listen, sources, shutdown.clone())
            .await?;
    tokio::spawn(admin);

    // Built on another thread while the lease is acquired: it is CPU work, and the lease requests are not.
    let source_config = config.engine.clone();
    let source = tokio::task::spawn_blocking(move || Engine::source_client(&source_config));
    let mut waiting = shutdown.clone();
    tokio::select! {
        () = elector.acquire() => {}
        _ = waiting.wait_for(|stop| *stop) => return Ok(()),
    }
    if let Some(reporter) = config.reporter.clone() {
        spawn_reporter(
            reporter,
            client.clone(),
            status.clone(),
            metrics.clone(),
            shutdown.clone(),
        );
    }
    let mut engine_config = config.engine.clone();
    // A wave gate reads the rollout view from the heartbeat server, with the registration token.
    engine_config.rollout_server =
        config
            .reporter
            .as_ref()
            .map(|r| windvane_agent::gates::wave::GateServer {
                url: r.server.clone(),
                token: r.token.clone(),
            });
    let source = source
        .await
        .context("building the source's HTTP client")??;
    let engine = Engine::start(engine_config, client, source, status_tx, metrics).await?;
    tokio::select! {
        result = engine.run(shutdown) => result.context("sync engine")?,
        lost = elector.keep() => return Err(lost).context("stopping: leadership lost"),
    }
    Ok(())
}

/// Runs the heartbeat reporter in a task of its own. Enforcement does not depend on it: whether the identity
/// key cannot be loaded, the server misbehaves or the reporter panics, the engine keeps applying and
/// healing; the reporter's end is logged.
fn spawn_reporter(
    config: windvane_agent::report::heartbeat::ReporterConfig,
    client: kube::Client,
    status: StatusRx,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
) {
    let reporter = tokio::spawn(async move {
        let mut attempt = 0;
        let key = loop {
            match windvane_agent::report::heartbeat::identity_key(client.clone(), &config.namespace)
                .await
            {
                Ok(key) => break key,
                Err(error) => {
                    let wait = full_jitter(
                        attempt,
                        Duration::from_secs(1),
                        Duration::from_secs(300),
                        random_unit(),
                    );
                    error!(%error, wait_s = wait.as_secs(), "cannot load the cluster identity key; not reporting yet (enforcement goes on)");
                    attempt += 1;
                    let mut stop = shutdown.clone();
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        _ = stop.wait_for(|stop| *stop) => return,
                    }
                }
            }
        };
        let public = key.verifying_key();
        info!(
            keyid = %windvane_shared::crypto::keys::keyid(&public),
            age_recipient = %windvane_shared::format::sops::cluster_recipient(&public),
            "cluster identity (windvane seal --to-cluster seals to this recipient)"
        );
        windvane_agent::report::heartbeat::run(config, key, status, metrics, shutdown).await;
    });
    tokio::spawn(async move {
        if let Err(error) = reporter.await
            && error.is_panic()
        {
            error!("the heartbeat reporter panicked; not reporting (enforcement goes on)");
        }
    });
}

async fn kube_client(kubeconfig: Option<&std::path::PathBuf>) -> anyhow::Result<kube::Client> {
    let kube_config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .with_context(|| format!("kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context(
            "finding Kubernetes credentials ($KUBECONFIG, ~/.kube/config, or in-cluster)",
        )?,
    };
    windvane_agent::kube::client::client(kube_config).context("creating the Kubernetes client")
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
