//! The agent's sync engine: a level-based loop over its inputs — a new release from the fetcher task, an
//! event of the gate holding a release, a change seen by a watch, a change of the prevention policy, the
//! healer's timers, and the engine's own (the backstop and the retry of an incomplete sync, [`timers`]). A new
//! release is persisted as last known good before anything of it is applied ([`accept`]); a sync renders this
//! cluster's share, applies it in stages and prunes what left the release ([`reconcile`]); drift goes to the
//! healer ([`crate::heal`]). A refused release never stops enforcement: the last known good keeps being
//! applied and healed, and the refusal is reported.
//!
//! Each stage owns its state, and the loop passes values between them, after kube-runtime's reconcilers
//! (which return what to do next) and linkerd's policy controller (an index that only decides, a loop that
//! writes): [`Gates`] (a held release, the windows), [`ApplyState`] (the inventory, the retry queue),
//! [`Healer`] (drift), [`Prevention`] (the admission policy) and [`Reporting`] (status and metrics). The
//! engine itself keeps only the release it enforces, its timers and the handles of the cluster.

mod accept;
mod reconcile;
mod retry;
mod timers;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tracing::{error, info, warn};
use windvane_shared::crypto::keys::TrustedKeys;
use windvane_shared::decide::render::ClusterIdentity;
use windvane_shared::format::bundle::Bundle;
use windvane_shared::format::release::AcceptedRelease;
use windvane_shared::wire::status::SyncState;

use crate::apply::state::ApplyState;
use crate::gates::pending::{GateSettings, Gates};
use crate::prevent::keeper::{PreventSettings, Prevention, next_prevention_change};
use crate::report::reporting::Reporting;

use crate::apply::ApplyOptions;
use crate::apply::allowlist::Allowlist;
use crate::apply::inventory::ObjectKey;
use crate::backoff::random_unit;
use crate::fetch::fetcher::Fetcher;
use crate::fetch::packed::PackedBundle;
use crate::fetch::source::{SourceClient, SourceLimits};
use crate::heal::Healer;
use crate::heal::drift::ContestTracker;
use crate::kube::cluster::Cluster;
use crate::kube::state::{KnownGood, StateStore};
use crate::live::watch::{Change, LiveCache};
use crate::report::metrics::Metrics;
use crate::report::status::StatusTx;
use crate::{Error, Result};
use timers::Timers;

/// Everything the engine needs to know, resolved from flags, environment and the config file.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub source_url: String,
    pub channel: String,
    pub fleet: String,
    pub trusted: TrustedKeys,
    /// Approver public keys (`--approver-key`): their signatures approve a release that requires approval.
    pub approvers: TrustedKeys,
    /// The operator's floor (`--require-approvals`): every new release waits for this many distinct approver
    /// signatures (never the publisher's), whatever its signed rollout says; 0: only what the rollout says.
    pub require_approvals: u32,
    pub identity: ClusterIdentity,
    pub allowlist: Allowlist,
    pub poll_interval: Duration,
    /// Namespace of the agent's own state (Secrets, Lease).
    pub namespace: String,
    /// Fraction of the inventory one release may prune.
    pub prune_budget: f64,
    pub apply: ApplyOptions,
    pub source_limits: SourceLimits,
    /// This replica's name, in Events it emits.
    pub identity_name: String,
    /// Longest an operator's `windvane.io/hold-until` is honoured.
    pub hold_cap: Duration,
    /// How often the backstop dry-runs every object (±20 % jitter).
    pub backstop_interval: Duration,
    /// Where a `gate: healthy` reads the rollout view (the heartbeat server); without one such a gate
    /// stays closed.
    pub rollout_server: Option<crate::gates::wave::GateServer>,
    /// The Secret (in `namespace`) holding the age identities that open SOPS objects ([`crate::apply::secrets`]).
    pub age_key_secret: Option<String>,
    /// The group whose members may make a two-person break-glass change to a prevented object.
    pub break_glass_group: String,
}

/// The release being enforced.
#[derive(Debug)]
struct Enforced {
    accepted: AcceptedRelease,
    /// The verified bundle as fetched, compressed once rendered. It is parsed again when rendered rather than
    /// kept parsed: a parsed bundle takes several times the memory of its bytes, and is needed only while
    /// rendering.
    bundle: PackedBundle,
}

/// Longest the first sync after a start waits for the watches to list the managed objects.
const INITIAL_LIST_TIMEOUT: Duration = Duration::from_secs(30);

/// The sync engine of one cluster.
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    /// The cluster's handles (cheap clones), through which the engine's own steps talk to the API server.
    cluster: Cluster,
    state: StateStore,
    live: LiveCache,
    /// The store's client, until `run` hands it to the fetcher task.
    source: Option<SourceClient>,
    changes: mpsc::UnboundedReceiver<Change>,
    /// The release being enforced.
    enforced: Option<Enforced>,
    /// The enforced release as last taken in, until the next sync uses it.
    fresh: Option<Fresh>,
    /// The backstop and the retry of an incomplete sync.
    timers: Timers,
    /// What holds a new release back: its wave, approvals, windows.
    gates: Gates,
    /// The inventory and the objects retried alone.
    apply: ApplyState,
    /// Drift, by policy.
    healer: Healer,
    /// The prevention policy kept in the cluster.
    prevention: Prevention,
    /// The status and the metrics.
    report: Reporting,
}

/// A release just taken in, before the next sync renders it again from its bytes.
#[derive(Debug)]
enum Fresh {
    /// Parsed while verifying it (the release the cluster remembered, at start).
    Parsed(Bundle),
    /// Rendered while it was being persisted (a release accepted from the source).
    Rendered(reconcile::RenderedRelease),
}

impl Engine {
    /// The client of the engine's source, as `config` describes it. Building it loads the system's trust roots
    /// (milliseconds of CPU): the agent builds it on another thread while it becomes the leader.
    pub fn source_client(config: &EngineConfig) -> Result<SourceClient> {
        SourceClient::new(
            &config.source_url,
            &config.channel,
            config.source_limits.clone(),
        )
    }

    /// Builds the engine and loads what the cluster remembers: the last known good release (re-verified) and
    /// the inventory. `source` is the client of `config`'s source ([`Engine::source_client`]).
    pub async fn start(
        config: EngineConfig,
        client: kube::Client,
        source: SourceClient,
        status: StatusTx,
        metrics: Arc<Metrics>,
    ) -> Result<Self> {
        let cluster = Cluster::new(client.clone());
        let state = StateStore::new(client, &config.namespace, "windvane");
        let (live, changes) = LiveCache::new(&config.fleet);
        let healer = Healer::new(
            cluster.clone(),
            live.clone(),
            &config.identity_name,
            config.hold_cap,
            ContestTracker::default(),
            metrics.clone(),
        );
        // Both reads at once: they stand between becoming the leader and the first poll.
        let (inventory, known_good) =
            futures::join!(state.load_inventory(), state.load_known_good());
        let inventory = inventory?;
        let timers = Timers::new(config.backstop_interval, Instant::now(), random_unit());
        let gates = Gates::new(gate_settings(&config, &metrics));
        let prevention = Prevention::new(
            cluster.clone(),
            live.clone(),
            PreventSettings {
                fleet: config.fleet.clone(),
                namespace: config.namespace.clone(),
                break_glass_group: config.break_glass_group.clone(),
            },
        );
        let report = Reporting::new(status, metrics, &config.channel);
        let mut engine = Self {
            config,
            cluster,
            state,
            source: Some(source),
            live,
            changes,
            enforced: None,
            fresh: None,
            timers,
            gates,
            apply: ApplyState::new(inventory),
            healer,
            prevention,
            report,
        };
        match known_good {
            Ok(Some(known_good)) => engine.take_known_good(known_good),
            Ok(None) => info!("no last known good release in the cluster yet"),
            Err(error) => error!(%error, "cannot read the last known good release"),
        }
        Ok(engine)
    }

    /// Enforces the release the cluster remembers, once it verifies again.
    fn take_known_good(&mut self, known_good: KnownGood) {
        let (accepted, bundle) = match self.verify_known_good(&known_good) {
            Ok(verified) => verified,
            Err(error) => {
                return error!(%error, "the persisted last known good release does not verify; ignoring it");
            }
        };
        info!(
            serial = accepted.pointer.serial,
            "loaded the last known good release from the cluster"
        );
        self.enforced = Some(Enforced {
            accepted,
            bundle: PackedBundle::new(known_good.bundle),
        });
        self.gates.enforcing(crate::gates::windows::app_digests(
            &bundle,
            &self.config.identity.labels,
        ));
        self.fresh = Some(Fresh::Parsed(bundle));
    }

    /// Runs until `shutdown` turns true.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> Result<()> {
        if self.enforced.is_some() {
            // Enforce what the cluster remembers before the first poll: the source may be down. Watch what
            // the inventory holds first, so that objects found intact are not written again (a restart or
            // a failover then costs no writes).
            self.watch_inventory().await;
            self.sync().await;
        }
        // Polls and fetches run in their own task: the loop below never waits on the store.
        let Some(source) = self.source.take() else {
            return Err(Error::Config("the sync engine was already run".to_owned()));
        };
        let highest = self.enforced.as_ref().map(|e| {
            (
                e.accepted.pointer.serial,
                e.accepted.pointer.bundle.sha256.clone(),
            )
        });
        let (mut fetched, fetcher) = Fetcher::new(self.fetcher_config(), source, highest).spawn();
        let _fetcher = AbortOnDrop(fetcher);
        loop {
            self.run_due_timers().await;
            let heal = [self.healer.next_timer(), self.apply.next_retry()];
            let wake = self.timers.next_wake(heal.into_iter().flatten().min());
            tokio::select! {
                _ = tokio::time::sleep_until(wake.into()) => self.on_heal_timers().await,
                Some(change) = self.changes.recv() => self.on_change(change).await,
                Some(found) = fetched.recv() => {
                    if self.on_fetched(found).await {
                        self.timers.new_release();
                        self.sync().await;
                    }
                }
                Some(()) = next_prevention_change(&mut self.prevention) => {
                    self.prevention.restore().await;
                }
                event = self.gates.next_event() => {
                    let opened = match event {
                        Some(event) => self.on_gate(event).await,
                        None => {
                            error!("the rollout wave gate stopped; dropping the held release");
                            self.gates.drop_held();
                            false
                        }
                    };
                    if opened {
                        self.timers.new_release();
                        self.sync().await;
                    }
                }
                _ = shutdown.changed() => {
                    if *shutdown.borrow() {
                        info!("stopping the sync engine");
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Syncs the enforced release and schedules what it asks for next.
    async fn sync(&mut self) {
        let next = self.reconcile().await;
        // A release's write may have closed held drift (taken in, or replaced): its records changed.
        self.publish_drift();
        self.timers.synced(next, Instant::now(), random_unit());
        // The state chunks the sync's saves left unused, once the sync is done: not on its path.
        if let Err(error) = self.state.collect_garbage().await {
            warn!(%error, "cannot remove unused state chunks; trying again after the next sync");
        }
    }

    /// The backstop and the retry of an incomplete sync, when they are due.
    async fn run_due_timers(&mut self) {
        if self.timers.backstop_due(Instant::now()) {
            self.healer.backstop(self.report.status()).await;
            self.prevention.reassert().await;
            self.publish_drift();
            self.timers.backstop_ran(Instant::now(), random_unit());
        }
        if self.timers.retry_due(Instant::now()) || self.timers.take_policy_due(Instant::now()) {
            self.sync().await;
        }
        self.retry_failed().await;
    }

    /// Starts the watches of every kind the inventory holds and waits, bounded, for their first lists.
    async fn watch_inventory(&self) {
        let started = Instant::now();
        let mut resolved_kinds = HashSet::new();
        let mut listing = HashSet::new();
        for entry in self.apply.inventory().managed() {
            if !resolved_kinds.insert((entry.api_version.as_str(), entry.kind.as_str())) {
                continue;
            }
            if let Ok(resolved) = self.cluster.resolve(&entry.api_version, &entry.kind).await {
                self.live.ensure_watch(&self.cluster, &resolved, None);
                listing.insert((
                    resolved.resource.group.clone(),
                    resolved.resource.kind.clone(),
                ));
            }
        }
        if listing.is_empty() {
            return;
        }
        if self.live.wait_listed(&listing, INITIAL_LIST_TIMEOUT).await {
            info!(
                kinds = listing.len(),
                objects = self.live.len(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "listed the managed objects"
            );
        } else {
            warn!(
                timeout_s = INITIAL_LIST_TIMEOUT.as_secs(),
                "the watches did not list the managed objects in time; applying them all"
            );
        }
    }

    /// A watch saw a change: judge drift and health (the healer reverts what policy says to).
    async fn on_change(&mut self, change: Change) {
        let key = match &change {
            Change::Updated(key) | Change::Deleted(key) => key.clone(),
        };
        self.note_finished(&key).await;
        let failed = self
            .report
            .status()
            .borrow()
            .objects
            .get(&key)
            .is_none_or(|o| o.state == SyncState::Failed && !self.healer.is_drifting(&key));
        if failed {
            return;
        }
        self.healer.on_change(&key, self.report.status()).await;
        self.publish_drift();
    }

    /// A run-once object ([`crate::apply::run_once`]) the watches saw finish is done for the body it was applied
    /// with: recorded in the inventory (persisted, so that a restart does not run it again) and told to the
    /// healer, for which its disappearance is no longer drift.
    async fn note_finished(&mut self, key: &ObjectKey) {
        let Some(shape) = self.healer.run_once(key) else {
            return;
        };
        let Some(done) = crate::apply::run_once::done(shape, true, self.live.finished(key)) else {
            return;
        };
        if !self.apply.mark_done(key, done) {
            return;
        }
        info!(object = ?key, finished = ?done, "run-once object finished; it is not run again for this release");
        self.healer.mark_done(key, done);
        self.persist_inventory().await;
    }

    /// The healer's grace periods, holds and back-offs that end now.
    async fn on_heal_timers(&mut self) {
        if self
            .healer
            .next_timer()
            .is_some_and(|t| t <= Instant::now())
        {
            self.healer.on_timers(self.report.status()).await;
            self.publish_drift();
        }
    }

    /// The healer's drift records and the object counts, into the status and the metrics when they changed.
    fn publish_drift(&mut self) {
        self.report.publish_drift(&self.healer);
    }
}

/// What the gates need of the configuration.
fn gate_settings(config: &EngineConfig, metrics: &Arc<Metrics>) -> GateSettings {
    GateSettings {
        identity: config.identity.clone(),
        require_approvals: config.require_approvals,
        source_url: config.source_url.clone(),
        channel: config.channel.clone(),
        approvers: config.approvers.clone(),
        poll_interval: config.poll_interval,
        rollout_server: config.rollout_server.clone(),
        metrics: metrics.clone(),
    }
}

/// Stops a task (the fetcher, a gate's watchers, the prevention policy's watch) when its owner is dropped.
#[derive(Debug)]
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
