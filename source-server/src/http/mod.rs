//! Stage 1, HTTP: the server's setup and its front door. [`Server::bind`] opens the database
//! ([`crate::db`]), binds the listener and starts the background tasks: the ingest writer
//! ([`crate::ingest::run_writer`], group commit), the notifier ([`crate::notify::run`], when configured) and the
//! heartbeat-log pruner. [`Server::run`] accepts HTTP/1.1 connections (hyper; at most `conns`' limit, the
//! oldest idle one, or held poll, making room) until the shutdown future completes, then lets open requests
//! finish and drains the ingest queue.
//!
//! Data comes in as requests from agents, browsers and scrapers; the client address is taken from the peer
//! or a trusted proxy's `X-Forwarded-For` ([`forwarded`]), tokens are checked and wrong ones limited
//! ([`auth`]), the path is routed by the pure [`route::route`], and `handlers` hands each request to its
//! stage: [`crate::serve`] (the static store), [`crate::ingest`] (enrolments, heartbeats, admin actions) or
//! [`crate::fleet`] (page, API, metrics). Responses go back from here.

pub mod auth;
pub(crate) mod conns;
pub mod forwarded;
pub(crate) mod handlers;
pub mod route;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::db::{Database, Db};
use crate::fleet::metrics::Metrics;
use crate::http::auth::{FailurePolicy, TokenHash};
use crate::http::forwarded::AddressBlock;
use crate::ingest::verify;
use crate::ingest::{ClusterKey, IngestJob};
use crate::notify::audit;
use crate::serve::files::FileCache;
use crate::serve::{files, long_poll, rollout_cache};
use crate::{Error, Result, db, ingest, notify};

pub use crate::serve::long_poll::DEFAULT_MAX_HELD_PER_CLIENT;

/// Default allowance between an agent's clock and the server's.
pub const DEFAULT_MAX_CLOCK_SKEW: Duration = Duration::from_secs(5 * 60);
/// Default capacity of the ingest queue (beyond it, 429).
pub const DEFAULT_INGEST_QUEUE: usize = 4096;
/// Most heartbeats in one transaction.
pub const DEFAULT_MAX_BATCH: usize = 2048;
/// Default time to live of an admin's rekey.
pub const DEFAULT_REKEY_TTL: Duration = Duration::from_secs(3600);
/// Most heartbeats whose signature is checked at once; beyond that, 429. At 10,000 heartbeats/s a check
/// takes a few milliseconds (a batch), so some tens are in progress; hundreds mean the CPU is behind.
pub const MAX_CHECKING: usize = 256;

/// Everything `windvane-server serve` needs, already read and checked.
#[derive(Debug)]
pub struct ServeConfig {
    /// The static store's root directory.
    pub root: PathBuf,
    /// The address to listen on (port 0 picks a free port).
    pub listen: SocketAddr,
    /// The SQLite database's directory; `None` only with `database_url`.
    pub data: Option<PathBuf>,
    /// PostgreSQL URL; SQLite under `data` when absent.
    pub database_url: Option<String>,
    /// Hash of the fleet registration token (enrolment only).
    pub registration_token: TokenHash,
    /// Hash of the admin token (rekey, forget); the admin endpoints answer 403 when absent. Must differ from
    /// the registration token and the read token ([`Server::bind`] refuses it otherwise).
    pub admin_token: Option<TokenHash>,
    /// Hash of the read token; the page, API and metrics are open when absent.
    pub read_token: Option<TokenHash>,
    pub notifications: Option<notify::Config>,
    /// Fixed grace period before Unknown, instead of 3 × each cluster's interval.
    pub unknown_after: Option<Duration>,
    pub max_clock_skew: Duration,
    pub ingest_queue: usize,
    pub max_batch: usize,
    /// Load balancers in front of the server: their `X-Forwarded-For` names the client (for the token
    /// limiter and the logs); nobody else's is believed.
    pub trusted_proxies: Vec<AddressBlock>,
    /// Every stored drift record also goes out as a JSON line here.
    pub audit_export: Option<audit::AuditTarget>,
    /// Drift log rows detected longer ago than this are deleted (hourly); `None` keeps them.
    pub drift_retention: Option<Duration>,
    /// How long an admin's rekey lets the cluster enrol with a new key.
    pub rekey_ttl: Duration,
    /// Most polls held at once for one client address; its oldest is answered to make room for another.
    pub max_held_polls_per_client: usize,
}

/// Shared state of all requests.
#[derive(Debug)]
pub(crate) struct App {
    pub(crate) files: FileCache,
    /// Held polls of channel pointers (`Prefer: wait=N`).
    pub(crate) pointer_watch: long_poll::PointerWatch,
    /// Rollout views, built at most once a second per channel.
    pub(crate) rollouts: rollout_cache::RolloutCache,
    pub(crate) db: Arc<Db>,
    pub(crate) metrics: Arc<Metrics>,
    /// Bound cluster keys by cluster name (a cache of the database; the writer re-checks the key id).
    pub(crate) keys: RwLock<HashMap<String, Arc<ClusterKey>>>,
    pub(crate) ingest: mpsc::Sender<IngestJob>,
    pub(crate) ingest_capacity: usize,
    /// Heartbeat signatures are checked in batches.
    pub(crate) verifier: verify::BatchVerifier,
    /// Heartbeats whose signature is being checked; when none is left, 429.
    pub(crate) checking: tokio::sync::Semaphore,
    pub(crate) registration_token: TokenHash,
    pub(crate) admin_token: Option<TokenHash>,
    pub(crate) read_token: Option<TokenHash>,
    pub(crate) limiter: FailurePolicy,
    /// Load balancers whose `X-Forwarded-For` names the client.
    pub(crate) trusted_proxies: Vec<AddressBlock>,
    pub(crate) unknown_after: Option<Duration>,
    pub(crate) max_clock_skew: Duration,
    pub(crate) rekey_ttl: Duration,
}

/// A bound server, ready to run.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    app: Arc<App>,
    writer: tokio::task::JoinHandle<()>,
    background: Vec<tokio::task::JoinHandle<()>>,
}

impl Server {
    /// Opens the database, binds the address and starts the background tasks.
    pub async fn bind(config: ServeConfig) -> Result<Server> {
        check_tokens(&config)?;
        let db = Arc::new(match &config.database_url {
            Some(url) => Db::Postgres(Box::new(db::postgres::PostgresDb::open(url).await?)),
            None => Db::Sqlite(db::sqlite::SqliteDb::open(
                config.data.as_deref().ok_or(Error::DatabaseOpen {
                    location: "(none)".to_owned(),
                    detail: "give --data DIR for the embedded SQLite database, or --database-url"
                        .to_owned(),
                })?,
            )?),
        });
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| Error::Listen {
                addr: config.listen.to_string(),
                source,
            })?;
        let metrics = Arc::new(Metrics::default());
        let (ingest_tx, ingest_rx) = mpsc::channel(config.ingest_queue.max(1));

        let mut background = Vec::new();
        let notifier_tx = config.notifications.map(|notify_config| {
            let (tx, rx) = mpsc::channel(8192);
            let scan_every = config.unknown_after.map_or(Duration::from_secs(2), |u| {
                (u / 2).clamp(Duration::from_millis(100), Duration::from_secs(2))
            });
            let settings = notify::NotifierSettings {
                config: Arc::new(notify_config),
                scan_every,
                unknown_after: config.unknown_after,
            };
            background.push(tokio::spawn(notify::run(
                settings,
                Arc::clone(&db),
                Arc::clone(&metrics),
                rx,
            )));
            tx
        });
        let audit_tx = config.audit_export.map(|target| {
            let (tx, rx) = mpsc::channel(8192);
            background.push(tokio::spawn(audit::run(target, rx)));
            tx
        });
        let writer = tokio::spawn(ingest::run_writer(
            Arc::clone(&db),
            ingest_rx,
            config.max_batch.max(1),
            Arc::clone(&metrics),
            notifier_tx,
            audit_tx,
        ));
        background.push(tokio::spawn(prune_loop(
            Arc::clone(&db),
            config.drift_retention,
        )));

        let verifier = verify::BatchVerifier::start(Some(Arc::clone(&metrics)));
        let app = Arc::new(App {
            files: FileCache::new(config.root, files::REVALIDATE_AFTER),
            pointer_watch: long_poll::PointerWatch::new(config.max_held_polls_per_client),
            rollouts: rollout_cache::RolloutCache::default(),
            db,
            metrics,
            keys: RwLock::new(HashMap::new()),
            ingest: ingest_tx,
            ingest_capacity: config.ingest_queue.max(1),
            verifier,
            checking: tokio::sync::Semaphore::new(MAX_CHECKING),
            registration_token: config.registration_token,
            admin_token: config.admin_token,
            read_token: config.read_token,
            limiter: FailurePolicy::default(),
            trusted_proxies: config.trusted_proxies,
            unknown_after: config.unknown_after,
            max_clock_skew: config.max_clock_skew,
            rekey_ttl: config.rekey_ttl,
        });
        Ok(Server {
            listener,
            app,
            writer,
            background,
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener.local_addr().map_err(|source| Error::Listen {
            addr: "bound socket".into(),
            source,
        })
    }

    /// Serves until `shutdown` completes; then stops accepting, lets open requests finish (up to 10 s) and
    /// stores what is still queued.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let Server {
            listener,
            app,
            writer,
            background,
        } = self;
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let connections = conns::Connections::new(conns::default_limit());
        tracing::info!(
            limit = connections.limit(),
            "open connections are limited (an eighth of the open-file limit is kept in reserve)"
        );
        tokio::pin!(shutdown);
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(pair) => pair,
                    Err(error) => {
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            let (admitted, evicted) = match connections.admit() {
                conns::Admission::Admitted {
                    connection,
                    evicted,
                } => {
                    match evicted {
                        Some(conns::Evicted::Idle) => {
                            tracing::debug!(%peer, "connection limit reached: closing the oldest idle connection")
                        }
                        Some(conns::Evicted::HeldPoll) => {
                            app.metrics.held_poll_evicted("connections");
                            tracing::debug!(%peer, "connection limit reached: answering the oldest held poll to make room");
                        }
                        None => {}
                    }
                    (connection, evicted.is_some())
                }
                conns::Admission::Full => {
                    tracing::warn!(%peer, limit = connections.limit(), "connection limit reached and every connection is busy: refusing a connection");
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let app = Arc::clone(&app);
            let busy = admitted.busy();
            let service = service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
                let app = Arc::clone(&app);
                let request_guard = busy.request();
                // A held poll marks its connection as evictable through it (long_poll::hold).
                request.extensions_mut().insert(busy.clone());
                async move {
                    let response = handlers::handle(&app, request, peer).await;
                    drop(request_guard);
                    Ok::<_, Infallible>(response)
                }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(30))
                .serve_connection(TokioIo::new(stream), service);
            let connection = graceful.watch(connection);
            tokio::spawn(async move {
                let mut admitted = admitted;
                tokio::select! {
                    result = connection => if let Err(error) = result {
                        tracing::debug!(%error, %peer, "connection ended with an error");
                    },
                    Ok(()) = &mut admitted.closed => {
                        tracing::debug!(%peer, "closed an idle connection to make room");
                    }
                }
            });
            if evicted {
                connections.wait_for_room(Duration::from_secs(1)).await;
            }
        }
        drop(listener);
        app.pointer_watch.close();
        tracing::info!("shutting down: held polls answered, finishing open requests");
        if tokio::time::timeout(Duration::from_secs(10), graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!("open connections did not finish within 10 s");
        }
        drop(app);
        for task in background {
            task.abort();
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), writer).await;
        Ok(())
    }
}

/// Refuses an admin token that is also the registration token (every cluster holds it) or the read token
/// (whoever may look at the fleet, and every browser given it, would hold it), and a read token that is the
/// registration token.
fn check_tokens(config: &ServeConfig) -> Result<()> {
    if config
        .read_token
        .as_ref()
        .is_some_and(|read| read.same_as(&config.registration_token))
    {
        return Err(Error::ReadTokenIsRegistrationToken);
    }
    let Some(admin) = &config.admin_token else {
        return Ok(());
    };
    if admin.same_as(&config.registration_token) {
        return Err(Error::AdminTokenIsRegistrationToken);
    }
    if config
        .read_token
        .as_ref()
        .is_some_and(|read| admin.same_as(read))
    {
        return Err(Error::AdminTokenIsReadToken);
    }
    Ok(())
}

/// Deletes heartbeat-log rows older than the retention, and drift rows older than `drift_retention`, hourly.
async fn prune_loop(db: Arc<Db>, drift_retention: Option<Duration>) {
    let mut tick = tokio::time::interval(Duration::from_secs(3600));
    loop {
        tick.tick().await;
        if let Some(retention) = drift_retention {
            let before = jiff::Timestamp::now()
                .checked_sub(jiff::SignedDuration::try_from(retention).unwrap_or_default())
                .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
            match db.prune_drift(before).await {
                Ok(n) if n > 0 => tracing::info!(rows = n, "pruned the drift log"),
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "pruning the drift log failed"),
            }
        }
        let before = jiff::Timestamp::now()
            .checked_sub(
                jiff::SignedDuration::try_from(db::HEARTBEAT_LOG_RETENTION).unwrap_or_default(),
            )
            .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
        match db.prune(before).await {
            Ok(n) if n > 0 => tracing::info!(rows = n, "pruned the heartbeat log"),
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "pruning the heartbeat log failed"),
        }
        let counted_since = FailurePolicy::default().window_start(jiff::Timestamp::now());
        if let Err(error) = db.prune_token_failures(counted_since).await {
            tracing::warn!(%error, "pruning the record of wrong tokens failed");
        }
    }
}
