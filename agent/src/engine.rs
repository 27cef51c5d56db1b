//! The agent's loop, level-based: poll the channel pointer; verify a new one and its bundle and persist them
//! as last known good; render this cluster's share; apply it in stages; prune what left the release; keep the
//! status current from the watches. A refused release never stops enforcement: the last known good keeps
//! being applied and healed, and the refusal is reported.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use tokio::sync::{mpsc, watch};
use tracing::{Instrument, error, info, info_span, warn};
use windvane_shared::bundle::{Bundle, BundleLimits};
use windvane_shared::desired::desired_objects;
use windvane_shared::keys::TrustedKeys;
use windvane_shared::release::{self, AcceptedRelease};
use windvane_shared::render::{ClusterIdentity, render_app, selected_apps};
use windvane_shared::status::SyncState;

use crate::allowlist::Allowlist;
use crate::apply::{ApplyOptions, Outcome, apply_all};
use crate::backoff::{full_jitter, jittered, random_unit};
use crate::clamp;
use crate::cluster::{Cluster, Deletion};
use crate::desired::Desired;
use crate::drift::{Baseline, ContestTracker};
use crate::fetcher::{Fetched, Fetcher, FetcherConfig, NewRelease};
use crate::heal::Healer;
use crate::health::assess;
use crate::inventory::{
    Inventory, InventoryEntry, ObjectKey, ReleaseOutcome, incomplete_apps, plan_prune,
};
use crate::metrics::Metrics;
use crate::report::{ObjectStatus, StatusTx, object_state};
use crate::source::{SourceClient, SourceLimits};
use crate::state::{KnownGood, StateStore};
use crate::watch::{Change, LiveCache};
use crate::{Error, Result};

/// Everything the engine needs to know, resolved from flags, environment and the config file.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub source_url: String,
    pub channel: String,
    pub fleet: String,
    pub trusted: TrustedKeys,
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
}

/// The release being enforced.
#[derive(Debug, Clone)]
struct Enforced {
    accepted: AcceptedRelease,
    /// The verified bundle as fetched. It is parsed again when rendered rather than kept parsed: a parsed
    /// bundle takes several times the memory of its bytes, and is needed only while rendering.
    bundle: Arc<[u8]>,
}

/// Longest the first sync after a start waits for the watches to list the managed objects.
const INITIAL_LIST_TIMEOUT: Duration = Duration::from_secs(30);

/// The sync engine of one cluster.
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    cluster: Cluster,
    state: StateStore,
    /// The store's client, until `run` hands it to the fetcher task.
    source: Option<SourceClient>,
    live: LiveCache,
    changes: mpsc::UnboundedReceiver<Change>,
    enforced: Option<Enforced>,
    /// The enforced bundle, parsed while verifying it, until the next sync renders it.
    fresh_bundle: Option<Bundle>,
    inventory: Inventory,
    /// The last apply did not complete: apply again after a backoff even if the release is unchanged.
    retry_attempt: Option<u32>,
    status: StatusTx,
    metrics: Arc<Metrics>,
    healer: Healer,
}

impl Engine {
    /// Builds the engine and loads what the cluster remembers: the last known good release (re-verified) and
    /// the inventory.
    pub async fn start(
        config: EngineConfig,
        client: kube::Client,
        status: StatusTx,
        metrics: Arc<Metrics>,
    ) -> Result<Self> {
        let cluster = Cluster::new(client.clone());
        let state = StateStore::new(client, &config.namespace, "windvane");
        let source = SourceClient::new(
            &config.source_url,
            &config.channel,
            config.source_limits.clone(),
        )?;
        let (live, changes) = LiveCache::new(&config.fleet);
        let healer = Healer::new(
            cluster.clone(),
            live.clone(),
            &config.identity_name,
            config.hold_cap,
            ContestTracker::default(),
        );
        let inventory = state.load_inventory().await?;
        status.send_modify(|status| status.source.channel = config.channel.clone());
        let mut engine = Self {
            config,
            cluster,
            state,
            source: Some(source),
            live,
            changes,
            enforced: None,
            fresh_bundle: None,
            inventory,
            retry_attempt: None,
            status,
            metrics,
            healer,
        };
        match engine.state.load_known_good().await {
            Ok(Some(known_good)) => match engine.verify_known_good(&known_good) {
                Ok(bundle) => {
                    let enforced = Enforced {
                        accepted: bundle.0,
                        bundle: known_good.bundle.into(),
                    };
                    info!(
                        serial = enforced.accepted.pointer.serial,
                        "loaded the last known good release from the cluster"
                    );
                    engine.enforced = Some(enforced);
                    engine.fresh_bundle = Some(bundle.1);
                }
                Err(error) => {
                    error!(%error, "the persisted last known good release does not verify; ignoring it")
                }
            },
            Ok(None) => info!("no last known good release in the cluster yet"),
            Err(error) => error!(%error, "cannot read the last known good release"),
        }
        Ok(engine)
    }

    /// Re-verifies a persisted release: signature, fleet, channel and digest. Expiry is not checked — an
    /// expired release stays enforced until a newer one is accepted; self-healing never stops.
    fn verify_known_good(&self, known_good: &KnownGood) -> Result<(AcceptedRelease, Bundle)> {
        let accepted = release::verify_known_good(
            &known_good.pointer,
            &self.config.trusted,
            &self.config.fleet,
            &self.config.channel,
        )?;
        let bundle = release::verify_bundle(
            &known_good.bundle,
            &accepted.pointer,
            self.config.source_limits.max_bundle_bytes,
            BundleLimits::default(),
        )?;
        Ok((accepted, bundle))
    }

    /// Runs until `shutdown` turns true.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> Result<()> {
        if self.enforced.is_some() {
            // Enforce what the cluster remembers before the first poll: the source may be down. Watch what
            // the inventory holds first, so that objects found intact are not written again (a restart or
            // a failover then costs no writes).
            self.watch_inventory().await;
            self.reconcile().await;
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
        let mut next_retry: Option<Instant> = None;
        let backstop_interval = self.config.backstop_interval;
        let backstop_every = || jittered(backstop_interval, 0.2, random_unit());
        let mut next_backstop = clamp::after(Instant::now(), backstop_every());
        loop {
            let now = Instant::now();
            if now >= next_backstop {
                self.healer.backstop(&self.status).await;
                self.publish_drift();
                next_backstop = clamp::after(Instant::now(), backstop_every());
            }
            if let Some(attempt) = self.retry_attempt {
                let due = *next_retry.get_or_insert_with(|| {
                    clamp::after(
                        Instant::now(),
                        full_jitter(
                            attempt,
                            Duration::from_secs(1),
                            Duration::from_secs(300),
                            random_unit(),
                        ),
                    )
                });
                if Instant::now() >= due {
                    next_retry = None;
                    self.reconcile().await;
                }
            } else {
                next_retry = None;
            }
            let mut wake = next_retry.map_or(next_backstop, |retry| retry.min(next_backstop));
            if let Some(timer) = self.healer.next_timer() {
                wake = wake.min(timer);
            }
            tokio::select! {
                _ = tokio::time::sleep_until(wake.into()) => self.on_timers().await,
                Some(change) = self.changes.recv() => self.on_change(change).await,
                Some(found) = fetched.recv() => {
                    if self.on_fetched(found).await {
                        self.retry_attempt = None;
                        self.reconcile().await;
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

    /// Starts the watches of every kind the inventory holds and waits, bounded, for their first lists.
    async fn watch_inventory(&self) {
        let started = Instant::now();
        let mut resolved_kinds = HashSet::new();
        let mut listing = HashSet::new();
        for entry in self.inventory.managed() {
            if !resolved_kinds.insert((entry.api_version.as_str(), entry.kind.as_str())) {
                continue;
            }
            if let Ok(resolved) = self.cluster.resolve(&entry.api_version, &entry.kind).await {
                self.live.ensure_watch(&self.cluster, &resolved);
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

    /// What the fetcher found. True when a new release was accepted and persisted, to be applied now.
    async fn on_fetched(&mut self, fetched: Fetched) -> bool {
        match fetched {
            Fetched::NotModified => {
                self.metrics.source_fetch("not_modified");
                self.mark_source_fresh();
                false
            }
            Fetched::Current => {
                self.metrics.source_fetch("ok");
                self.clear_refusal();
                self.mark_source_fresh();
                false
            }
            Fetched::Release(release) => self.accept(*release).await,
            Fetched::Unavailable(error) => {
                self.metrics.source_fetch(error.reason());
                warn!(%error, "source unavailable; enforcing the last known good release");
                self.mark_source_stale(&error);
                false
            }
            Fetched::Refused(error) => {
                self.metrics.source_fetch(error.reason());
                warn!(reason = error.reason(), %error, "refusing the release; enforcing the last known good one");
                self.status.send_modify(|status| {
                    status.refuse(error.reason(), error.to_string(), Timestamp::now());
                });
                false
            }
        }
    }

    /// Takes a release the fetcher verified: persists it as last known good before anything is applied, and
    /// tells the fetcher whether it did. True when it was taken.
    async fn accept(&mut self, release: NewRelease) -> bool {
        let NewRelease {
            pointer_bytes,
            bundle_bytes,
            accepted,
            bundle,
            taken,
        } = release;
        let known_good = KnownGood {
            pointer: pointer_bytes,
            bundle: bundle_bytes,
        };
        if let Err(error) = self.state.save_known_good(&known_good).await {
            self.metrics.source_fetch(error.reason());
            warn!(%error, "cannot persist the new release; enforcing the last known good one");
            self.mark_source_stale(&error);
            let _ = taken.send(false);
            return false;
        }
        info!(serial = accepted.pointer.serial, sha256 = %accepted.pointer.bundle.sha256, keyid = %accepted.keyid, "accepted a new release");
        self.metrics.source_fetch("ok");
        self.metrics.set_release_serial(accepted.pointer.serial);
        self.enforced = Some(Enforced {
            accepted,
            bundle: known_good.bundle.into(),
        });
        self.fresh_bundle = Some(bundle);
        self.clear_refusal();
        self.mark_source_fresh();
        let _ = taken.send(true);
        true
    }

    /// A release verified: any earlier refusal is over, the source is good again.
    fn clear_refusal(&self) {
        self.status
            .send_modify(|status| status.source.last_refusal = None);
    }

    fn fetcher_config(&self) -> FetcherConfig {
        FetcherConfig {
            trusted: self.config.trusted.clone(),
            fleet: self.config.fleet.clone(),
            channel: self.config.channel.clone(),
            poll_interval: self.config.poll_interval,
            max_pointer_bytes: self.config.source_limits.max_pointer_bytes,
            max_bundle_bytes: self.config.source_limits.max_bundle_bytes,
        }
    }

    fn mark_source_fresh(&self) {
        self.status
            .send_modify(|status| status.source.stale_since = None);
        self.metrics.set_source_stale(false);
    }

    fn mark_source_stale(&self, error: &Error) {
        self.metrics.set_source_stale(true);
        self.status.send_modify(|status| {
            status.source.stale_since.get_or_insert_with(Timestamp::now);
            status.last_error = Some(error.to_string());
        });
    }

    /// Renders and applies the enforced release, prunes, persists the inventory and refreshes the status.
    async fn reconcile(&mut self) {
        let Some(enforced) = self.enforced.clone() else {
            return;
        };
        let serial = enforced.accepted.pointer.serial;
        let span = info_span!("sync", serial, fleet = %self.config.fleet);
        async {
            let started = Instant::now();
            let bundle = match self.fresh_bundle.take() {
                Some(bundle) => bundle,
                None => match release::verify_bundle(
                    &enforced.bundle,
                    &enforced.accepted.pointer,
                    self.config.source_limits.max_bundle_bytes,
                    BundleLimits::default(),
                ) {
                    Ok(bundle) => bundle,
                    Err(error) => {
                        // It verified when it was accepted; its bytes have not changed since.
                        error!(%error, "the enforced bundle no longer parses");
                        return;
                    }
                },
            };
            let (desired, unrendered) = render(&bundle, &self.config.identity);
            drop(bundle);
            let render_errors: Vec<String> = unrendered
                .iter()
                .map(|(app, error)| format!("app {app}: {error}"))
                .collect();
            let release_empty = desired.is_empty() && render_errors.is_empty();

            let inventory = &self.inventory;
            let live = &self.live;
            let healer = &self.healer;
            let unchanged = |key: &ObjectKey, hash: &str| {
                let Some(entry) = inventory
                    .entries
                    .get(key)
                    .filter(|e| !e.orphaned && e.applied_hash == hash)
                else {
                    return false;
                };
                if healer.has_baseline(key) {
                    return live.contains(key);
                }
                // After a restart: intact only if it still owns what Windvane's last apply left it owning.
                live.get(key).is_some_and(|live| {
                    entry.owned_digest.as_deref() == Some(Baseline::of(&live).digest().as_str())
                })
            };
            let observe = |object: &serde_json::Value| live.observe(object);
            let report = apply_all(
                &self.cluster,
                desired,
                &self.config.allowlist,
                &unchanged,
                &observe,
                &self.config.apply,
            )
            .await;

            let mut next = Inventory {
                complete_serial: self.inventory.complete_serial,
                entries: Default::default(),
            };
            for result in &report.results {
                if let Outcome::Applied { written } = result.outcome {
                    self.metrics
                        .apply(if written { "written" } else { "unchanged" });
                    if let Ok(resolved) = self
                        .cluster
                        .resolve(&result.object.id.api_version, &result.object.id.kind)
                        .await
                    {
                        self.live.ensure_watch(&self.cluster, &resolved);
                    }
                    next.entries.insert(
                        result.key(),
                        InventoryEntry {
                            app: result.object.app.clone(),
                            api_version: result.object.id.api_version.clone(),
                            kind: result.object.id.kind.clone(),
                            namespace: result.object.id.namespace.clone(),
                            name: result.object.id.name.clone(),
                            prune: result.object.prune,
                            applied_hash: result.body_hash.clone(),
                            owned_digest: match &result.applied {
                                Some(applied) => Some(applied.digest()),
                                None => self
                                    .inventory
                                    .entries
                                    .get(&result.key())
                                    .and_then(|e| e.owned_digest.clone()),
                            },
                            orphaned: false,
                        },
                    );
                } else {
                    self.metrics
                        .apply(if matches!(result.outcome, Outcome::Refused(_)) {
                            "refused"
                        } else {
                            "failed"
                        });
                    // Keep what we applied before: a failing object is still ours.
                    if let Some(previous) = self.inventory.entries.get(&result.key()) {
                        next.entries.insert(result.key(), previous.clone());
                    }
                }
            }
            let complete = report.complete() && render_errors.is_empty();
            // Keys as applied: each object carries its final namespace, decided while applying.
            let desired_keys: BTreeSet<ObjectKey> =
                report.results.iter().map(|r| r.key()).collect();

            let outcome = ReleaseOutcome {
                incomplete: incomplete_apps(
                    report.results.iter().map(|r| {
                        let applied = matches!(r.outcome, Outcome::Applied { .. });
                        (r.object.app.as_str(), applied)
                    }),
                    unrendered.iter().map(|(app, _)| app.as_str()),
                ),
                empty: release_empty,
                allow_empty: enforced.accepted.pointer.allow_empty,
            };
            let prune = plan_prune(
                &self.inventory,
                &desired_keys,
                &outcome,
                self.config.prune_budget,
            );
            let mut prune_errors = Vec::new();
            for entry in &prune.delete {
                let id = entry.object_ref();
                let disabled = self.live.get(&entry.key()).is_some_and(|live| {
                    live.pointer("/metadata/annotations/windvane.io~1prune")
                        .and_then(|v| v.as_str())
                        == Some("disabled")
                });
                if disabled {
                    next.entries.insert(
                        entry.key(),
                        InventoryEntry {
                            orphaned: true,
                            ..entry.clone()
                        },
                    );
                    continue;
                }
                let deleted = match self.cluster.resolve(&id.api_version, &id.kind).await {
                    Ok(resolved) => self.cluster.delete(&id, &resolved).await,
                    Err(error) => Err(error),
                };
                match deleted {
                    Ok(Deletion::Gone) => info!(object = %id, app = %entry.app, "pruned"),
                    // Still there (finalizers, graceful termination): it stays in the inventory and the prune
                    // is checked again with the retries, until it is gone.
                    Ok(Deletion::Pending { finalizers }) => {
                        let waiting = if finalizers.is_empty() {
                            "its termination".to_owned()
                        } else {
                            format!("finalizers {}", finalizers.join(", "))
                        };
                        info!(object = %id, app = %entry.app, %waiting, "prune pending; will check again");
                        prune_errors.push(format!("pruning {id}: deletion pending on {waiting}"));
                        next.entries.insert(entry.key(), entry.clone());
                    }
                    Err(error) => {
                        warn!(object = %id, %error, "prune failed; will retry");
                        prune_errors.push(error.to_string());
                        next.entries.insert(entry.key(), entry.clone());
                    }
                }
            }
            for entry in prune.orphan.iter().cloned() {
                next.entries.insert(
                    entry.key(),
                    InventoryEntry {
                        orphaned: true,
                        ..entry
                    },
                );
            }
            // Objects that stay out of the release only because pruning waits remain managed.
            for entry in &prune.postponed {
                next.entries
                    .entry(entry.key())
                    .or_insert_with(|| entry.clone());
            }
            // Orphans stay reported until their object is gone.
            for entry in self
                .inventory
                .entries
                .values()
                .filter(|e| e.orphaned && !desired_keys.contains(&e.key()))
            {
                next.entries
                    .entry(entry.key())
                    .or_insert_with(|| entry.clone());
            }
            if complete && prune_errors.is_empty() && prune.postponed.is_empty() {
                next.complete_serial = Some(serial);
            }
            if let Err(error) = self.state.save_inventory(&next).await {
                error!(%error, "cannot persist the inventory");
            }
            self.inventory = next;

            let mut errors: Vec<String> = render_errors;
            errors.extend(prune.reasons().cloned());
            errors.extend(prune_errors);
            self.status.send_modify(|status| {
                status.source.applied_serial = Some(serial);
                status.source.applied_sha256 =
                    Some(enforced.accepted.pointer.bundle.sha256.clone());
                status.enforced = true;
                status.last_error = errors.first().cloned();
                status.prune_postponed = prune.postponed_apps.clone();
                status.objects.clear();
                for result in &report.results {
                    let failure = match &result.outcome {
                        Outcome::Applied { .. } => None,
                        Outcome::Failed(message) | Outcome::Refused(message) => {
                            Some(message.as_str())
                        }
                    };
                    let health = self.live.get(&result.key()).map(|live| {
                        assess(result.object.id.group(), &result.object.id.kind, &live)
                    });
                    let (state, message) = object_state(failure, health.as_ref());
                    status.objects.insert(
                        result.key(),
                        ObjectStatus {
                            app: result.object.app.clone(),
                            display: result.object.id.to_string(),
                            state,
                            message,
                        },
                    );
                }
                status.orphans = self
                    .inventory
                    .entries
                    .values()
                    .filter(|e| e.orphaned)
                    .map(|e| e.object_ref().to_string())
                    .collect();
                self.metrics.set_objects(&status.counts());
            });
            let elapsed = started.elapsed();
            self.metrics.observe_sync(elapsed);
            self.retry_attempt = if complete && errors.is_empty() {
                None
            } else {
                Some(self.retry_attempt.map_or(0, |a| a + 1))
            };
            info!(
                objects = report.results.len(),
                written = report.written(),
                failed = report
                    .results
                    .iter()
                    .filter(|r| !matches!(r.outcome, Outcome::Applied { .. }))
                    .count(),
                pruned = prune.delete.len(),
                complete,
                elapsed_ms = elapsed.as_millis() as u64,
                "sync finished"
            );
            // Drift is judged from now on against the objects as applied; they move to the healer.
            let mut baselines = Vec::new();
            let mut unwritten = Vec::new();
            self.healer
                .set_desired(report.results.into_iter().filter_map(|result| {
                    let Outcome::Applied { .. } = result.outcome else {
                        return None;
                    };
                    let key = ObjectKey::of(&result.object.id);
                    match result.applied {
                        Some(baseline) => baselines.push((key, baseline)),
                        None => unwritten.push(key),
                    }
                    Some(result.object)
                }));
            for (key, baseline) in baselines {
                self.healer.applied(&key, baseline);
            }
            // Objects found intact after a restart are judged from what they own now.
            for key in unwritten {
                if !self.healer.has_baseline(&key)
                    && let Some(live) = self.live.get(&key)
                {
                    self.healer.adopt(&key, Baseline::of(&live));
                }
            }
        }
        .instrument(span)
        .await;
    }

    /// A watch saw a change: judge drift and health (the healer reverts what policy says to).
    async fn on_change(&mut self, change: Change) {
        let key = match &change {
            Change::Updated(key) | Change::Deleted(key) => key.clone(),
        };
        let failed = self
            .status
            .borrow()
            .objects
            .get(&key)
            .is_none_or(|o| o.state == SyncState::Failed && !self.healer.is_drifting(&key));
        if failed {
            return;
        }
        self.healer.on_change(&key, &self.status).await;
        self.publish_drift();
    }

    /// Grace periods, holds and back-offs that end now.
    async fn on_timers(&mut self) {
        if self
            .healer
            .next_timer()
            .is_some_and(|t| t <= Instant::now())
        {
            self.healer.on_timers(&self.status).await;
            self.publish_drift();
        }
    }

    fn publish_drift(&self) {
        self.status
            .send_modify(|status| status.drift = self.healer.records());
        self.metrics.set_objects(&self.status.borrow().counts());
    }
}

/// Stops the fetcher task when the engine stops.
#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// This cluster's desired objects: every selected app rendered, with Windvane's labels, each kept compact as
/// soon as its app rendered. An app that fails to render is reported and skipped; the others still apply.
/// Render errors come back with their app's name: that app's prunes wait until it renders again.
fn render(bundle: &Bundle, identity: &ClusterIdentity) -> (Vec<Desired>, Vec<(String, String)>) {
    let mut desired = Vec::new();
    let mut errors = Vec::new();
    for app in selected_apps(bundle, identity) {
        match render_app(app, identity)
            .and_then(|rendered| desired_objects(&bundle.fleet, &rendered))
        {
            Ok(objects) => desired.extend(objects.into_iter().map(Desired::of)),
            Err(error) => {
                error!(app = %app.name, %error, "cannot render app");
                errors.push((app.name.clone(), error.to_string()));
            }
        }
    }
    (desired, errors)
}
