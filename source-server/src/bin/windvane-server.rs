//! `windvane-server`: the source server daemon. Parses the command line (every flag also reads a
//! `WINDVANE_*` environment variable), reads the token and notification files, sets up logging, and runs
//! [`windvane_source_server::Server`] until SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use windvane_shared::text::duration::parse_duration;
use windvane_source_server::http::auth::TokenHash;
use windvane_source_server::http::forwarded::AddressBlock;
use windvane_source_server::{self as server, ServeConfig, Server, notify};

/// Windvane source server: serves the release store, ingests signed heartbeats, and shows the fleet.
#[derive(Debug, Parser)]
#[command(name = "windvane-server", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the store, the heartbeat API, the fleet page, the JSON API and /metrics.
    Serve(ServeArgs),
}

#[derive(Debug, Args)]
#[command(after_help = "\
Endpoints:
  GET|HEAD /channels/<ch>.json, /bundles/<sha256>.json   the static store (ETag, 304, gzip)
  POST /api/v1/clusters/<name>/enroll                    enrolment (registration token in the body)
  POST /api/v1/clusters/<name>/heartbeat                 signed heartbeats (DSSE)
  POST /api/v1/clusters/<name>/rekey|forget              admin (Authorization: Bearer <admin token> only;
                                                         403 when the server has no --admin-token-file)
  GET  /, /clusters/<name>                               fleet page     (read token, if set)
  GET  /api/v1/fleet|clusters|clusters/<name>|drift      JSON API       (read token, if set)
  GET  /metrics                                          Prometheus     (read token, if set)
  GET  /livez, /readyz                                   health (always open)
The store is served to anyone: its integrity comes from the release signatures, not from this server.")]
struct ServeArgs {
    /// The static store's root directory (what `windvane publish --root` writes).
    #[arg(long, env = "WINDVANE_ROOT", value_name = "DIR")]
    root: PathBuf,
    /// Address to listen on, e.g. 0.0.0.0:8080 (port 0 picks a free port; the bound address is printed).
    #[arg(
        long,
        env = "WINDVANE_LISTEN",
        value_name = "ADDR",
        default_value = "127.0.0.1:8080"
    )]
    listen: SocketAddr,
    /// Directory for the embedded SQLite database (windvane.db); not needed with --database-url.
    #[arg(
        long,
        env = "WINDVANE_DATA",
        value_name = "DIR",
        required_unless_present = "database_url"
    )]
    data: Option<PathBuf>,
    /// PostgreSQL URL (postgres://user:pass@host/db or key=value form), for several replicas.
    #[arg(
        long,
        env = "WINDVANE_DATABASE_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    database_url: Option<String>,
    /// File holding the fleet registration token: agents enrol with it, and it authorises nothing else
    /// (a name already bound to another key needs an admin's rekey first). At least 16 bytes; only its
    /// SHA-256 is kept in memory.
    #[arg(long, env = "WINDVANE_REGISTRATION_TOKEN_FILE", value_name = "FILE")]
    registration_token_file: PathBuf,
    /// File holding the admin token, which authorises `windvane cluster rekey|forget` (at least 16 bytes,
    /// neither the registration token nor the read token, and taken only as `Authorization: Bearer`, never
    /// HTTP Basic, which browsers cache). Without it the admin endpoints answer 403.
    #[arg(long, env = "WINDVANE_ADMIN_TOKEN_FILE", value_name = "FILE")]
    admin_token_file: Option<PathBuf>,
    /// File holding a read token (at least 16 bytes); when given, the page, the JSON API and /metrics require
    /// it (Authorization: Bearer TOKEN, or HTTP Basic with TOKEN as the password).
    #[arg(long, env = "WINDVANE_READ_TOKEN_FILE", value_name = "FILE")]
    read_token_file: Option<PathBuf>,
    /// Notifications config (JSON or YAML): sinks (webhook, slack, pagerduty), triggers, severities, selectors.
    #[arg(long, env = "WINDVANE_NOTIFICATIONS", value_name = "FILE")]
    notifications: Option<PathBuf>,
    /// Fixed grace period before a silent cluster is Unknown (default: 3 x the cluster's own interval).
    #[arg(long, env = "WINDVANE_UNKNOWN_AFTER", value_name = "DUR", value_parser = duration)]
    unknown_after: Option<std::time::Duration>,
    /// Largest difference allowed between a heartbeat's sent_at and the server's clock.
    #[arg(long, env = "WINDVANE_MAX_CLOCK_SKEW", value_name = "DUR", default_value = "5m", value_parser = duration)]
    max_clock_skew: std::time::Duration,
    /// Heartbeats that may wait for storage; beyond that, agents get 429 with Retry-After.
    #[arg(long, env = "WINDVANE_INGEST_QUEUE", value_name = "N", default_value_t = server::DEFAULT_INGEST_QUEUE)]
    ingest_queue: usize,
    /// Most heartbeats stored in one transaction.
    #[arg(long, env = "WINDVANE_MAX_BATCH", value_name = "N", default_value_t = server::DEFAULT_MAX_BATCH)]
    max_batch: usize,
    /// A load balancer in front of the server (address or CIDR block; repeat, or comma-separate): its
    /// `X-Forwarded-For` names the client, for the wrong-token limiter and the logs. Nobody else's header is
    /// believed. Give every replica the same list.
    #[arg(
        long = "trusted-proxy",
        env = "WINDVANE_TRUSTED_PROXIES",
        value_name = "CIDR",
        value_delimiter = ','
    )]
    trusted_proxies: Vec<AddressBlock>,
    /// Audit export: every drift record as a JSON line, appended to this file or POSTed to this http(s) URL.
    #[arg(long, env = "WINDVANE_AUDIT_EXPORT", value_name = "FILE|URL")]
    audit_export: Option<String>,
    /// Delete drift log rows detected longer ago than this (default: keep them all).
    #[arg(long, env = "WINDVANE_DRIFT_RETENTION", value_name = "DUR", value_parser = duration)]
    drift_retention: Option<std::time::Duration>,
    /// How long `windvane cluster rekey` lets the cluster enrol with a new key. The permission also ends with
    /// the next heartbeat the bound key signs (the cluster still has its key): a permission nobody uses would
    /// let anyone holding the registration token take the name over.
    #[arg(long, env = "WINDVANE_REKEY_TTL", value_name = "DUR", default_value = "1h", value_parser = positive_duration)]
    rekey_ttl: std::time::Duration,
    /// Most pointer polls held at once for one client address (behind a load balancer, name it with
    /// --trusted-proxy so that clients are told apart): beyond it, the address's oldest held poll is answered
    /// and that agent polls on its interval.
    #[arg(long, env = "WINDVANE_MAX_HELD_POLLS_PER_CLIENT", value_name = "N", default_value_t = server::DEFAULT_MAX_HELD_PER_CLIENT, value_parser = at_least_one)]
    max_held_polls_per_client: usize,
    /// Log format.
    #[arg(long, env = "WINDVANE_LOG_FORMAT", value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
}

fn duration(text: &str) -> Result<std::time::Duration, windvane_shared::Error> {
    parse_duration(text)
}

fn at_least_one(text: &str) -> Result<usize, windvane_source_server::Error> {
    match text.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(windvane_source_server::Error::NotAtLeastOne {
            text: text.to_owned(),
        }),
    }
}

fn positive_duration(text: &str) -> Result<std::time::Duration, windvane_source_server::Error> {
    match duration(text)? {
        std::time::Duration::ZERO => Err(windvane_source_server::Error::ZeroDuration),
        positive => Ok(positive),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let Command::Serve(args) = cli.command;
    let filter = tracing_subscriber::EnvFilter::try_from_env("WINDVANE_LOG")
        .unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if args.log_format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
    // reqwest (notifications) is built without a bundled crypto provider; ring is the workspace's one provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match serve(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let config = ServeConfig {
        root: args.root,
        listen: args.listen,
        data: args.data,
        database_url: args.database_url,
        registration_token: TokenHash::from_file(&args.registration_token_file)?,
        admin_token: args
            .admin_token_file
            .as_deref()
            .map(TokenHash::from_file)
            .transpose()?,
        read_token: args
            .read_token_file
            .as_deref()
            .map(TokenHash::from_file)
            .transpose()?,
        notifications: args
            .notifications
            .as_deref()
            .map(notify::Config::load)
            .transpose()?,
        unknown_after: args.unknown_after,
        max_clock_skew: args.max_clock_skew,
        ingest_queue: args.ingest_queue,
        max_batch: args.max_batch,
        trusted_proxies: args.trusted_proxies,
        audit_export: args
            .audit_export
            .as_deref()
            .map(notify::audit::AuditTarget::parse),
        drift_retention: args.drift_retention,
        rekey_ttl: args.rekey_ttl,
        max_held_polls_per_client: args.max_held_polls_per_client,
    };
    if config.admin_token.is_none() {
        tracing::warn!(
            "no --admin-token-file: the admin endpoints (windvane cluster rekey|forget) answer 403 until the server is started with one"
        );
    }
    if !config.root.is_dir() {
        anyhow::bail!("--root {}: not a directory", config.root.display());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the runtime")?;
    runtime.block_on(async move {
        let server = Server::bind(config).await?;
        let addr = server.local_addr()?;
        // The one line on stdout: scripts and tests read the bound address from it.
        println!("listening on http://{addr}");
        tracing::info!(%addr, "windvane-server listening");
        server.run(shutdown_signal()).await?;
        tracing::info!("stopped");
        anyhow::Ok(())
    })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
