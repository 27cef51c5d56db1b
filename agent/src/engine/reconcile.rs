//! One sync of the enforced release, as a flow of steps: render this cluster's share (the shared
//! pipeline), apply it in stages, plan and carry out the prunes, compute the next inventory
//! ([`inventory::next`], pure), record the status ([`AgentStatus::record_sync`]) — the sync is finished
//! then — persist the inventory, watch what was applied and hand it to the healer. Returns what the loop
//! should do next ([`Next`]). The steps that decide are pure; the ones here that talk to the cluster are
//! thin.
//!
//! [`AgentStatus::record_sync`]: crate::report::status::AgentStatus::record_sync

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, Instant};

use jiff::Timestamp;

use tracing::{Instrument, debug, error, info, info_span, warn};
use windvane_shared::decide::desired::cluster_share_into;
use windvane_shared::decide::render::ClusterIdentity;
use windvane_shared::format::bundle::{Bundle, BundleLimits};
use windvane_shared::format::release;

use super::timers::Next;
use super::{Enforced, Engine, Fresh};
use crate::apply::desired::Desired;
use crate::apply::inventory::{
    self, Applied, InventoryEntry, ObjectKey, PrunePlan, Pruned, ReleaseOutcome, incomplete_apps,
    plan_prune,
};
use crate::apply::ordered::{AppOrder, apply_ordered};
use crate::apply::{ApplyReport, Hooks, ObjectResult, Outcome, apply_all};
use crate::heal::drift::Baseline;
use crate::kube::cluster::Deletion;
use crate::live::watch::LiveCache;
use crate::report::status::{ObjectStatus, SyncReport, object_state};
use windvane_shared::wire::status::SyncState;

/// Longest a sync waits for the first lists of its Jobs' and Pods' watches before applying them: a Job
/// watch lists only this fleet's Jobs, so this is a bound for an API server in trouble, not a usual wait.
const RUN_ONCE_LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// An app that did not render, with why: its objects are missing from this sync, so its prunes wait.
type RenderError = (String, String);

/// A release rendered for this cluster, ready to apply.
#[derive(Debug)]
pub(super) struct RenderedRelease {
    desired: Vec<Desired>,
    unrendered: Vec<RenderError>,
    /// SOPS objects that did not open, with why: never sent.
    sealed: Vec<(Desired, String)>,
    order: AppOrder,
    /// Apps a deny window holds to reporting drift.
    report_only: BTreeSet<String>,
    /// When a window next starts or ends, changing which apps only report.
    policy_change: Option<Timestamp>,
    /// Apps not all of whose objects are there to apply, with why (their dependants wait).
    unready: BTreeMap<String, String>,
    /// Nothing at all for this cluster.
    empty: bool,
}

/// What the steps after the applies decided.
struct Concluded {
    next: Next,
    prune: PrunePlan,
    complete: bool,
}

/// How a sync went, as far as the next step is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SyncVerdict {
    /// Problems that are not about one object: an app did not render, prunes held back or failed.
    errors: usize,
    /// Some apps wait for the apps they depend on to become healthy.
    waiting: bool,
    /// Something failed that only a whole sync can try again: an app did not render, a prune failed.
    failed: bool,
    /// The prevention policy could not be written and should be tried again.
    prevention_retry: bool,
}

impl SyncVerdict {
    /// Idle when all is done — objects that failed to apply are retried alone ([`crate::apply::retry`]), never by
    /// sending the release again; a recheck (soon, without back-off) when apps only wait for their
    /// dependencies; otherwise a retry of the whole sync with back-off.
    fn next(self) -> Next {
        if self.errors == 0 && !self.failed && !self.prevention_retry && !self.waiting {
            Next::Idle
        } else if self.waiting && !self.failed && !self.prevention_retry {
            Next::Recheck
        } else {
            Next::Retry
        }
    }
}

impl Engine {
    /// Syncs the enforced release (nothing to do before one is known).
    pub(super) async fn reconcile(&mut self) -> Next {
        // Taken for the sync (nothing else reads it meanwhile), so that its bytes can be compressed.
        let Some(mut enforced) = self.enforced.take() else {
            return Next::Idle;
        };
        let span = info_span!("sync", serial = enforced.accepted.pointer.serial, fleet = %self.config.fleet);
        let next = self.sync_release(&mut enforced).instrument(span).await;
        self.enforced = Some(enforced);
        next
    }

    async fn sync_release(&mut self, enforced: &mut Enforced) -> Next {
        let started = Instant::now();
        let Some(release) = self.render_release(enforced).await else {
            return Next::Retry;
        };
        let rendered = started.elapsed();
        // A release that guards nothing needs no prevention policy: a policy left by an earlier release or an
        // earlier agent is deleted while the objects are applied, not after them. The bundle's bytes, read
        // again only to render it once more (a retried sync), are compressed meanwhile too.
        let remove_prevention =
            self.prevention.may_exist() && !release.desired.iter().any(|object| object.prevent);
        self.watch_run_once(&release.desired).await;
        let (mut report, removed_early, ()) = futures::join!(
            apply_ordered(
                release.desired,
                release.order,
                &release.unready,
                &self.live,
                async |objects| self.apply(objects).await
            ),
            async { remove_prevention && self.prevention.delete().await.is_ok() },
            enforced.bundle.pack_aside()
        );
        let enforced = &*enforced;
        if removed_early {
            self.prevention.removed();
        }
        let applied_by = started.elapsed();
        // Objects that did not open are Failed, never sent; their apps' prunes wait like any failure's. They
        // are tried again with the whole sync (which reads the key again), never sent alone.
        let sealed: BTreeSet<ObjectKey> = release
            .sealed
            .iter()
            .map(|(object, _)| ObjectKey::of(&object.id))
            .collect();
        report.results.extend(
            release
                .sealed
                .into_iter()
                .map(|(object, message)| crate::apply::secrets::failed_result(object, message)),
        );
        // Counted before the status says the sync is done, so that whoever reads both sees them agree.
        self.report.count_outcomes(&report);
        let concluded = self
            .conclude(
                enforced,
                &report,
                &release.unrendered,
                release.empty,
                &sealed,
            )
            .await;
        let elapsed = started.elapsed();
        self.report.observe_sync(elapsed);
        let phases = Phases {
            render: rendered,
            apply: applied_by.saturating_sub(rendered),
            prune: elapsed.saturating_sub(applied_by),
            total: elapsed,
        };
        log_sync(&report, &concluded.prune, concluded.complete, phases);
        self.queue_failures(&report.results, &sealed);
        self.persist_inventory().await;
        // After the inventory is safe: the watches' first lists of what was just applied are the heaviest
        // reads of a sync, and would only delay that write. Drift meanwhile is in those lists.
        self.watch_applied(&report).await;
        self.hand_to_healer(report.results).await;
        self.heal_after_window(release.report_only).await;
        concluded.next
    }

    /// This cluster's share of the enforced release: as rendered when it was accepted, or rendered now from
    /// its bundle. `None` when the bundle cannot be read.
    async fn render_release(&mut self, enforced: &mut Enforced) -> Option<RenderedRelease> {
        let release = match self.fresh.take() {
            Some(Fresh::Rendered(release)) => release,
            Some(Fresh::Parsed(bundle)) => self.render_bundle(bundle).await,
            None => {
                let bundle = self.parse_enforced(enforced)?;
                self.render_bundle(bundle).await
            }
        };
        self.timers
            .policy_changes_at(release.policy_change.map(instant_at));
        Some(release)
    }

    /// This cluster's share of `bundle`, rendered (SOPS objects opened with the cluster's key), with the apps
    /// a deny window holds to reporting marked so.
    pub(super) async fn render_bundle(&self, bundle: Bundle) -> RenderedRelease {
        // Read only for a release that has something sealed for this cluster: a request less on every other
        // sync, and no key material in memory that nothing needs.
        let keyring = if crate::apply::secrets::any_sealed(&bundle, &self.config.identity) {
            crate::apply::secrets::load_keyring(
                self.cluster.client(),
                &self.config.namespace,
                self.config.age_key_secret.as_deref(),
            )
            .await
        } else {
            windvane_shared::format::sops::Keyring::default()
        };
        let order = AppOrder::of(&bundle, &self.config.identity);
        let (report_only, policy_change) = crate::gates::windows::report_only_apps(
            &bundle,
            &self.config.identity.labels,
            Timestamp::now(),
        );
        let (mut desired, unrendered, sealed) =
            render_aside(bundle, &self.config.identity, keyring).await;
        for object in desired.iter_mut().filter(|o| report_only.contains(&o.app)) {
            object.self_heal = false;
        }
        let empty = desired.is_empty() && unrendered.is_empty() && sealed.is_empty();
        let mut unready: BTreeMap<String, String> = unrendered
            .iter()
            .map(|(app, _)| (app.clone(), "it did not render".to_owned()))
            .collect();
        for (object, _) in &sealed {
            unready
                .entry(object.app.clone())
                .or_insert_with(|| format!("{} did not open (SOPS)", object.id));
        }
        RenderedRelease {
            desired,
            unrendered,
            sealed,
            order,
            report_only,
            policy_change,
            unready,
            empty,
        }
    }

    /// After the applies: prunes what left the release, persists the next inventory (beside the prevention
    /// policy), records the status, and decides what the loop does next.
    async fn conclude(
        &mut self,
        enforced: &Enforced,
        report: &ApplyReport,
        unrendered: &[RenderError],
        release_empty: bool,
        sealed: &BTreeSet<ObjectKey>,
    ) -> Concluded {
        let serial = enforced.accepted.pointer.serial;
        let (prune, waiting) = self.plan_release_prune(enforced, report, unrendered, release_empty);
        let (pruned, prune_errors) = self.prune(&prune).await;
        let complete = report.complete() && unrendered.is_empty();
        let next = inventory::next(
            self.apply.inventory(),
            report
                .results
                .iter()
                .map(|r| inventory_record(r, &self.live)),
            &prune,
            &pruned,
            serial,
            complete,
        );
        // The objects' statuses (their health, read from the live cache) are judged while the prevention
        // policy's write is out. The agent runs on one thread, so the judging first yields: until it does, no
        // request leaves the process.
        let live = self.live.clone();
        let (prevention, objects) =
            futures::join!(self.prevention.keep(&report.results, serial), async {
                tokio::task::yield_now().await;
                object_statuses(&live, &next, report)
            });
        self.apply.set_inventory(next);

        let mut errors: Vec<String> = unrendered
            .iter()
            .map(|(app, error)| format!("app {app}: {error}"))
            .collect();
        // An app's prunes postponed for its failed objects wait for their retries, not for another sync.
        let held_back = usize::from(prune.held_back.is_some());
        errors.extend(prune.reasons().cloned());
        let verdict = SyncVerdict {
            errors: unrendered.len() + held_back + prune_errors.len(),
            waiting: !waiting.is_empty(),
            failed: !unrendered.is_empty() || !prune_errors.is_empty() || !sealed.is_empty(),
            // A prevention policy that could not be written is tried again with the sync's retry; a cluster
            // too old for it is only told so (it still detects and heals).
            prevention_retry: prevention.is_err() && !self.prevention.refused(),
        };
        errors.extend(prune_errors);
        if let Err(why) = prevention {
            errors.push(format!("prevention: {why}"));
        }
        self.record_status(enforced, objects, errors, &prune);
        Concluded {
            next: verdict.next(),
            prune,
            complete,
        }
    }

    /// What to prune, given which apps are complete in this sync; and the apps that wait for the apps they
    /// depend on.
    fn plan_release_prune(
        &self,
        enforced: &Enforced,
        report: &ApplyReport,
        unrendered: &[RenderError],
        release_empty: bool,
    ) -> (PrunePlan, BTreeSet<String>) {
        // Keys as applied: each object carries its final namespace, decided while applying.
        let desired_keys: BTreeSet<ObjectKey> = report.results.iter().map(|r| r.key()).collect();
        let mut incomplete = incomplete_apps(
            report
                .results
                .iter()
                .map(|r| (r.object.app.as_str(), applied(r))),
            unrendered.iter().map(|(app, _)| app.as_str()),
        );
        let waiting = waiting_apps(&report.results);
        for app in &waiting {
            incomplete.insert(
                app.clone(),
                "it waits for the apps it depends on".to_owned(),
            );
        }
        let outcome = ReleaseOutcome {
            incomplete,
            empty: release_empty,
            allow_empty: enforced.accepted.pointer.allow_empty,
        };
        let prune = plan_prune(
            self.apply.inventory(),
            &desired_keys,
            &outcome,
            self.config.prune_budget,
        );
        (prune, waiting)
    }

    /// Apps whose deny window (`heal: report`) just ended heal again: their drift, only reported so far,
    /// is judged again under the app's own policy.
    async fn heal_after_window(&mut self, report_only: BTreeSet<String>) {
        self.report.report_only_apps(report_only.len());
        let ended = self.gates.report_only_now(report_only);
        if ended.is_empty() {
            return;
        }
        info!(apps = ?ended, "a maintenance window ended: drift is healed again by policy");
        let keys: Vec<ObjectKey> = self
            .healer
            .keys()
            .into_iter()
            .filter(|key| self.healer.is_drifting(key))
            .filter(|key| {
                self.healer
                    .app_of(key)
                    .is_some_and(|app| ended.contains(app))
            })
            .collect();
        for key in keys {
            self.on_change(crate::live::watch::Change::Updated(key))
                .await;
        }
    }

    /// The enforced bundle, parsed again from its bytes.
    fn parse_enforced(&self, enforced: &Enforced) -> Option<Bundle> {
        let Some(bytes) = enforced.bundle.bytes() else {
            error!("the enforced bundle no longer decompresses");
            return None;
        };
        release::verify_bundle(
            &bytes,
            &enforced.accepted.pointer,
            self.config.source_limits.max_bundle_bytes,
            BundleLimits::default(),
        )
        // It verified when it was accepted; its bytes have not changed since.
        .inspect_err(|error| error!(%error, "the enforced bundle no longer parses"))
        .ok()
    }

    pub(super) async fn apply(&self, desired: Vec<Desired>) -> ApplyReport {
        let unchanged = |key: &ObjectKey, hash: &str| self.unchanged(key, hash);
        let observe =
            |object: &serde_json::Value, text: Vec<u8>| self.live.observe_text(object, text);
        let health = |key: &ObjectKey| self.live.health(key);
        let hooks = Hooks {
            unchanged: &unchanged,
            observe: &observe,
            health: &health,
        };
        apply_all(
            &self.cluster,
            desired,
            &self.config.allowlist,
            &hooks,
            &self.config.apply,
        )
        .await
    }

    /// True when an object need not be written: its body is as last applied and the live object still owns
    /// what that apply left it owning; or it runs once, finished for this body and is gone
    /// ([`crate::apply::run_once::skip_apply`]).
    fn unchanged(&self, key: &ObjectKey, hash: &str) -> bool {
        let Some(entry) = self
            .apply
            .inventory()
            .entries
            .get(key)
            .filter(|e| !e.orphaned && e.applied_hash == hash)
        else {
            return false;
        };
        let done_hash = entry.done.map(|_| entry.applied_hash.as_str());
        if crate::apply::run_once::skip_apply(done_hash, hash, self.live.contains(key)) {
            return true;
        }
        if self.healer.has_baseline(key) {
            return self.live.contains(key);
        }
        // After a restart: intact only if it still owns what Windvane's last apply left it owning.
        self.live
            .get(key)
            .is_some_and(|live| entry.owned_digest.as_deref() == Some(Baseline::of(&live).digest()))
    }

    /// Starts the watches of the kinds of the release's Jobs and Pods ([`crate::apply::run_once`]) before they are
    /// applied, and waits (bounded) for their first lists. Other kinds are watched once the sync is done
    /// ([`Self::watch_applied`]), but a Job with `ttlSecondsAfterFinished: 0` in an early wave may finish and be
    /// removed before a long sync ends: unseen, its disappearance would read as drift and the Job run again.
    async fn watch_run_once(&self, desired: &[Desired]) {
        let mut kinds = BTreeSet::new();
        for object in desired {
            if object.run_once == Some(crate::apply::run_once::RunOnce::Finishes) {
                kinds.insert((object.id.api_version.as_str(), object.id.kind.as_str()));
            }
        }
        let mut listing = HashSet::new();
        for (api_version, kind) in kinds {
            if let Ok(resolved) = self.cluster.resolve(api_version, kind).await {
                self.live.ensure_watch(&self.cluster, &resolved, None);
                listing.insert((
                    resolved.resource.group.clone(),
                    resolved.resource.kind.clone(),
                ));
            }
        }
        if !listing.is_empty() && !self.live.wait_listed(&listing, RUN_ONCE_LIST_TIMEOUT).await {
            warn!(
                timeout_s = RUN_ONCE_LIST_TIMEOUT.as_secs(),
                "the watches of Jobs and Pods did not list in time; applying them all the same"
            );
        }
    }

    /// Makes sure every applied kind is watched, its lists paged for the largest object of the kind.
    pub(super) async fn watch_applied(&self, report: &ApplyReport) {
        // By (group, kind): the version first applied, and the largest body of any version.
        let mut largest: BTreeMap<(&str, &str), (&str, usize)> = BTreeMap::new();
        for result in &report.results {
            if applied(result) {
                let id = &result.object.id;
                let (_, size) = largest
                    .entry((id.group(), &id.kind))
                    .or_insert((&id.api_version, 0));
                *size = (*size).max(result.object.body_len());
            }
        }
        for ((_, kind), (api_version, size)) in largest {
            if let Ok(resolved) = self.cluster.resolve(api_version, kind).await {
                self.live.ensure_watch(&self.cluster, &resolved, Some(size));
            }
        }
    }

    /// Persists the inventory as the sync left it, once the sync is finished: the release is on the cluster and
    /// its status recorded before this write, not after it. Nothing is lost should the agent stop before it
    /// lands: every object the sync applied is in the release persisted as last known good before any of it
    /// was applied, and a restarted agent syncs that release first — recording what it applied and pruning
    /// what left — before it takes a newer one.
    pub(super) async fn persist_inventory(&self) {
        let started = Instant::now();
        match self.state.save_inventory(self.apply.inventory()).await {
            Ok(()) => debug!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                "inventory persisted"
            ),
            Err(error) => error!(%error, "cannot persist the inventory"),
        }
    }

    /// Deletes what the plan says to, except objects whose live annotation disables pruning. Returns what
    /// became of each, and why the ones still there are.
    async fn prune(&self, plan: &PrunePlan) -> (BTreeMap<ObjectKey, Pruned>, Vec<String>) {
        let mut pruned = BTreeMap::new();
        let mut errors = Vec::new();
        for entry in &plan.delete {
            let disabled = self.live.get(&entry.key()).is_some_and(|live| {
                live.pointer("/metadata/annotations/windvane.io~1prune")
                    .and_then(|v| v.as_str())
                    == Some("disabled")
            });
            let outcome = if disabled {
                Pruned::Disabled
            } else {
                match self.delete(entry).await {
                    Ok(()) => Pruned::Gone,
                    Err(why) => {
                        errors.push(why.to_string());
                        Pruned::Pending
                    }
                }
            };
            pruned.insert(entry.key(), outcome);
        }
        (pruned, errors)
    }

    /// Deletes one object; `Err` says why it is still there.
    async fn delete(&self, entry: &InventoryEntry) -> crate::Result<()> {
        let id = entry.object_ref();
        let deleted = match self.cluster.resolve(&id.api_version, &id.kind).await {
            Ok(resolved) => self.cluster.delete(&id, &resolved).await,
            Err(error) => Err(error),
        };
        match deleted {
            Ok(Deletion::Gone) => {
                info!(object = %id, app = %entry.app, "pruned");
                Ok(())
            }
            // Still there (finalizers, graceful termination): it stays in the inventory and the prune is
            // checked again with the retries, until it is gone.
            Ok(Deletion::Pending { finalizers }) => {
                let waiting = if finalizers.is_empty() {
                    "its termination".to_owned()
                } else {
                    format!("finalizers {}", finalizers.join(", "))
                };
                info!(object = %id, app = %entry.app, %waiting, "prune pending; will check again");
                Err(crate::Error::PrunePending {
                    object: id.to_string(),
                    waiting,
                })
            }
            Err(error) => {
                warn!(object = %id, %error, "prune failed; will retry");
                Err(error)
            }
        }
    }

    fn record_status(
        &self,
        enforced: &Enforced,
        objects: BTreeMap<ObjectKey, ObjectStatus>,
        errors: Vec<String>,
        prune: &PrunePlan,
    ) {
        let sync = SyncReport {
            serial: enforced.accepted.pointer.serial,
            sha256: enforced.accepted.pointer.bundle.sha256.clone(),
            errors,
            prune_postponed: prune.postponed_apps.clone(),
            objects,
            orphans: self
                .apply
                .inventory()
                .entries
                .values()
                .filter(|e| e.orphaned)
                .map(|e| e.object_ref().to_string())
                .collect(),
        };
        self.report.record_sync(sync);
    }

    /// Drift is judged from now on against the objects as applied; they move to the healer.
    async fn hand_to_healer(&mut self, results: Vec<ObjectResult>) {
        let mut baselines = Vec::new();
        let mut unwritten = Vec::new();
        self.healer
            .set_desired(results.into_iter().filter_map(|result| {
                if !applied(&result) {
                    return None;
                }
                let key = ObjectKey::of(&result.object.id);
                match result.applied {
                    Some(baseline) => baselines.push((key, baseline)),
                    None => unwritten.push(key),
                }
                Some(result.object)
            }));
        for (key, baseline) in baselines {
            self.healer.applied(&key, baseline).await;
        }
        // Objects found intact after a restart are judged from what they own now.
        for key in unwritten {
            if !self.healer.has_baseline(&key)
                && let Some(live) = self.live.get(&key)
            {
                self.healer.adopt(&key, Baseline::of(&live));
            }
        }
        self.healer.set_done(
            self.apply
                .inventory()
                .entries
                .iter()
                .filter_map(|(key, entry)| Some((key.clone(), entry.done?))),
        );
    }
}

/// The `Instant` of a wall-clock time (now, when it has passed).
fn instant_at(at: Timestamp) -> Instant {
    let left = at.duration_since(Timestamp::now());
    Instant::now() + Duration::try_from(left).unwrap_or_default()
}

/// The apps with objects held back for their dependencies.
fn waiting_apps(results: &[ObjectResult]) -> BTreeSet<String> {
    results
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Waiting(_)))
        .map(|r| r.object.app.clone())
        .collect()
}

pub(super) fn applied(result: &ObjectResult) -> bool {
    matches!(result.outcome, Outcome::Applied { .. })
}

/// Each applied object's state, by key (`inventory` as the sync leaves it: which run-once objects are done).
fn object_statuses(
    live: &LiveCache,
    inventory: &inventory::Inventory,
    report: &ApplyReport,
) -> BTreeMap<ObjectKey, ObjectStatus> {
    report
        .results
        .iter()
        .map(|result| {
            let key = result.key();
            let status = match inventory.entries.get(&key).and_then(|e| e.done) {
                Some(done) if !live.contains(&key) && applied(result) => ObjectStatus {
                    app: result.object.app.clone(),
                    display: result.object.id.to_string(),
                    state: SyncState::Synced,
                    message: done.gone_message(),
                },
                _ => object_status(live, result),
            };
            (key, status)
        })
        .collect()
}

/// An object's state from its apply outcome and its live health.
pub(super) fn object_status(live: &LiveCache, result: &ObjectResult) -> ObjectStatus {
    let failure = match &result.outcome {
        Outcome::Applied { .. } => None,
        Outcome::Failed(message) | Outcome::Refused(message) => Some(message.as_str()),
        Outcome::Waiting(message) => {
            return ObjectStatus {
                app: result.object.app.clone(),
                display: result.object.id.to_string(),
                state: SyncState::Progressing,
                message: message.clone(),
            };
        }
    };
    let id = &result.object.id;
    let health = live.health(&result.key());
    let (state, message) = object_state(failure, health.as_ref());
    ObjectStatus {
        app: result.object.app.clone(),
        display: id.to_string(),
        state,
        message,
    }
}

/// What one object's apply means for the inventory: a run-once object is done once applied if marked so,
/// or once the watches saw it finish.
pub(super) fn inventory_record(result: &ObjectResult, live: &LiveCache) -> Applied {
    if !applied(result) {
        return Applied::No(result.key());
    }
    let id = &result.object.id;
    let done = result
        .object
        .run_once
        .and_then(|shape| crate::apply::run_once::done(shape, true, live.finished(&result.key())));
    Applied::Yes(InventoryEntry {
        done,
        app: result.object.app.clone(),
        api_version: id.api_version.clone(),
        kind: id.kind.clone(),
        namespace: id.namespace.clone(),
        name: id.name.clone(),
        prune: result.object.prune,
        applied_hash: result.body_hash.clone(),
        owned_digest: result.applied.as_ref().map(|b| b.digest().to_owned()),
        orphaned: false,
    })
}

/// Where a sync's time went: reading the keyring and rendering (a release accepted from the source was
/// rendered while it was persisted, so only what is left of that shows); applying; pruning, keeping the
/// prevention policy and recording the status; and in all. The inventory's write follows.
struct Phases {
    render: Duration,
    apply: Duration,
    prune: Duration,
    total: Duration,
}

fn log_sync(report: &ApplyReport, prune: &PrunePlan, complete: bool, phases: Phases) {
    let ms = |d: Duration| d.as_millis() as u64;
    info!(
        objects = report.results.len(),
        written = report.written(),
        failed = report.results.iter().filter(|r| !applied(r)).count(),
        pruned = prune.delete.len(),
        complete,
        elapsed_ms = ms(phases.total),
        render_ms = ms(phases.render),
        apply_ms = ms(phases.apply),
        prune_ms = ms(phases.prune),
        "sync finished"
    );
}

/// [`render`] on a blocking thread: it is the longest CPU work before a release is applied, and a new release
/// renders while the agent's own thread compresses and sends the write that persists it.
async fn render_aside(
    bundle: Bundle,
    identity: &ClusterIdentity,
    keyring: windvane_shared::format::sops::Keyring,
) -> (Vec<Desired>, Vec<RenderError>, Vec<(Desired, String)>) {
    let identity = identity.clone();
    match tokio::task::spawn_blocking(move || render(bundle, &identity, &keyring)).await {
        Ok(rendered) => rendered,
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        // Cancelled: only when the runtime shuts down, which drops this future too. Never an empty release,
        // which would prune.
        Err(_) => std::future::pending().await,
    }
}

/// This cluster's desired objects: every selected app rendered, with Windvane's labels, each object made
/// compact as soon as it renders, while the bundle is consumed: the release exists once as parsed values,
/// never twice. An app that fails to render is reported and skipped; the others still apply. Render errors
/// come back with their app's name: that app's prunes wait until it renders again. SOPS objects are opened
/// with `keyring` first; those that do not open come back apart, with why ([`crate::apply::secrets`]).
fn render(
    mut bundle: Bundle,
    identity: &ClusterIdentity,
    keyring: &windvane_shared::format::sops::Keyring,
) -> (Vec<Desired>, Vec<RenderError>, Vec<(Desired, String)>) {
    let sealed = crate::apply::secrets::open_selected(&mut bundle, identity, keyring);
    for (object, message) in &sealed {
        error!(app = %object.app, object = %object.id, %message, "cannot open SOPS object");
    }
    let mut desired = Vec::new();
    let mut errors = Vec::new();
    for share in cluster_share_into(bundle, identity, Desired::of) {
        match share.objects {
            Ok(objects) => desired.extend(objects),
            Err(error) => {
                error!(app = %share.app, %error, "cannot render app");
                errors.push((share.app, error.to_string()));
            }
        }
    }
    (desired, errors, sealed)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DONE: SyncVerdict = SyncVerdict {
        errors: 0,
        waiting: false,
        failed: false,
        prevention_retry: false,
    };

    #[test]
    fn a_sync_idles_when_done_rechecks_when_apps_only_wait_and_retries_otherwise() {
        assert_eq!(
            DONE.next(),
            Next::Idle,
            "done, or only objects failed: they are retried alone"
        );
        let waiting = SyncVerdict {
            waiting: true,
            ..DONE
        };
        assert_eq!(waiting.next(), Next::Recheck);
        let failed = SyncVerdict {
            failed: true,
            ..waiting
        };
        assert_eq!(
            failed.next(),
            Next::Retry,
            "a failure backs off even when apps wait"
        );
        let prune_reason = SyncVerdict { errors: 1, ..DONE };
        assert_eq!(prune_reason.next(), Next::Retry);
        let prevention = SyncVerdict {
            prevention_retry: true,
            ..DONE
        };
        assert_eq!(prevention.next(), Next::Retry, "the policy is tried again");
        assert_eq!(
            SyncVerdict {
                prevention_retry: true,
                ..waiting
            }
            .next(),
            Next::Retry
        );
    }
}
