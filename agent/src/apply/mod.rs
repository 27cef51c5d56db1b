//! Applying a release. The engine hands this stage a release rendered for this cluster ([`desired`] objects,
//! SOPS ones opened by [`secrets`]); [`plan`] puts them in stages and waves, [`allowlist`] refuses what the
//! operator did not allow, [`depends`] decides the order of apps by `dependsOn` and [`ordered`] applies them batch by batch, and the code here applies them with
//! server-side apply. The outcomes go back to the engine as an [`ApplyReport`]; from it the pure
//! [`inventory`] decides what to prune and what the cluster now holds, [`retry`] when each failed object is
//! tried again alone, and [`run_once`] which objects are done. [`state::ApplyState`] is this stage's state in the
//! engine: the inventory (persisted by [`crate::kube::state`]) and the retry queue.
//!
//! The applies: a release's desired objects go to the cluster stage by stage: CRDs (then wait until Established
//! and refresh discovery), Namespaces (then wait until Active), other cluster-scoped objects, namespaced
//! objects; by wave within a stage; with bounded concurrency and per-object retries. One object's failure never
//! blocks unrelated objects. Objects whose body is unchanged since their last successful apply, and whose live
//! state is known to be intact, are not written at all. Each apply's response is handed to an observer and
//! reduced to its drift baseline as it returns, so a sync never holds every response at once.

pub mod allowlist;
pub mod depends;
pub mod desired;
pub mod inventory;
pub mod ordered;
pub mod plan;
pub mod retry;
pub mod run_once;
pub mod secrets;
pub mod state;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;
use tracing::{Instrument, info, info_span, warn};

use crate::apply::allowlist::Allowlist;
use crate::apply::desired::Desired;
use crate::apply::inventory::ObjectKey;
use crate::backoff::{full_jitter, random_unit};
use crate::heal::drift::Baseline;
use crate::kube::cluster::Cluster;
use crate::live::health::{Health, assess};
use plan::{Scope, Stage};

/// Tuning of one apply.
#[derive(Debug, Clone)]
pub struct ApplyOptions {
    /// Objects applied at once within a wave.
    pub concurrency: usize,
    /// Attempts per object for retriable failures (conflicts, throttling, server errors) within one apply.
    pub attempts: u32,
    /// How long to wait for CRDs to be Established and Namespaces to be Active.
    pub settle_timeout: Duration,
}

impl Default for ApplyOptions {
    fn default() -> Self {
        Self {
            concurrency: 16,
            attempts: 4,
            settle_timeout: Duration::from_secs(60),
        }
    }
}

/// What became of one desired object.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Written (or already as desired and left alone: `written` false).
    Applied { written: bool },
    /// The API server refused it, or it kept failing; the message is the API server's.
    Failed(String),
    /// Outside the operator's allowlist; never sent.
    Refused(String),
    /// Not sent in this sync: its app waits for the apps it depends on (`dependsOn`), as the message says.
    Waiting(String),
}

/// One desired object and its outcome.
#[derive(Debug, Clone)]
pub struct ObjectResult {
    pub object: Desired,
    /// SHA-256 of the body sent (after namespace defaulting).
    pub body_hash: String,
    pub outcome: Outcome,
    /// What the API server's response to the apply says Windvane owns, when written.
    pub applied: Option<Baseline>,
}

impl ObjectResult {
    /// The object's version-independent key.
    pub fn key(&self) -> ObjectKey {
        ObjectKey::of(&self.object.id)
    }
}

/// All outcomes of one apply.
#[derive(Debug, Clone, Default)]
pub struct ApplyReport {
    pub results: Vec<ObjectResult>,
}

impl ApplyReport {
    /// True when every object applied.
    pub fn complete(&self) -> bool {
        self.results
            .iter()
            .all(|r| matches!(r.outcome, Outcome::Applied { .. }))
    }

    /// How many objects were actually written.
    pub fn written(&self) -> usize {
        self.results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Applied { written: true }))
            .count()
    }
}

/// Applies `desired` in stages, asking the caller what it knows through `hooks`.
pub async fn apply_all(
    cluster: &Cluster,
    desired: Vec<Desired>,
    allowlist: &Allowlist,
    hooks: &Hooks<'_>,
    options: &ApplyOptions,
) -> ApplyReport {
    let mut report = ApplyReport::default();
    let mut by_stage: BTreeMap<Stage, Vec<Desired>> = BTreeMap::new();
    let mut later = Vec::new();
    for mut object in desired {
        if let Err(reason) = allowlist.check_kind(&object.id) {
            let reason = format!("{}: {reason}", object.id);
            report
                .results
                .push(result(object, Outcome::Refused(reason), None));
        } else if plan::is_crd(&object.id) || plan::is_namespace(&object.id) {
            // Their scope is known without discovery: they are what makes the rest discoverable.
            match plan::place(&mut object, Scope::Cluster, allowlist) {
                Ok(stage) => by_stage.entry(stage).or_default().push(object),
                Err(unplaced) => report.results.push(unplaced_result(object, unplaced)),
            }
        } else {
            later.push(object);
        }
    }

    let crds = by_stage
        .remove(&Stage::CustomResourceDefinitions)
        .unwrap_or_default();
    if !crds.is_empty() {
        let results = apply_stage(
            cluster,
            Stage::CustomResourceDefinitions,
            crds,
            hooks,
            options,
        )
        .await;
        settle(cluster, &results, hooks, options.settle_timeout).await;
        cluster.refresh_discovery();
        report.results.extend(results);
    }
    let namespaces = by_stage.remove(&Stage::Namespaces).unwrap_or_default();
    if !namespaces.is_empty() {
        let results = apply_stage(cluster, Stage::Namespaces, namespaces, hooks, options).await;
        settle(cluster, &results, hooks, options.settle_timeout).await;
        report.results.extend(results);
    }

    // Scopes are known only now: the kinds may come from the CRDs just applied.
    let mut cluster_scoped = Vec::new();
    let mut namespaced = Vec::new();
    for mut object in later {
        match cluster
            .resolve(&object.id.api_version, &object.id.kind)
            .await
        {
            Ok(resolved) => match plan::place(&mut object, resolved.scope, allowlist) {
                Ok(Stage::ClusterScoped) => cluster_scoped.push(object),
                Ok(_) => namespaced.push(object),
                Err(unplaced) => report.results.push(unplaced_result(object, unplaced)),
            },
            Err(error) => {
                report
                    .results
                    .push(result(object, Outcome::Failed(error.to_string()), None))
            }
        }
    }
    report.results.extend(
        apply_stage(
            cluster,
            Stage::ClusterScoped,
            cluster_scoped,
            hooks,
            options,
        )
        .await,
    );
    report
        .results
        .extend(apply_stage(cluster, Stage::Namespaced, namespaced, hooks, options).await);
    report
}

/// What [`apply_all`] asks of its caller.
pub struct Hooks<'a> {
    /// Whether an object with this body hash was applied before and is known to be intact on the cluster, in
    /// which case it is not written again.
    pub unchanged: &'a (dyn Fn(&ObjectKey, &str) -> bool + Sync),
    /// Sees every object as the API server returned it after a write, parsed and as its JSON text.
    pub observe: &'a (dyn Fn(&Value, Vec<u8>) + Sync),
    /// The object's health as last seen (after a write, as the API server returned it): a CRD or Namespace
    /// already healthy is not polled before the next stage.
    pub health: &'a (dyn Fn(&ObjectKey) -> Option<Health> + Sync),
}

impl std::fmt::Debug for Hooks<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks").finish_non_exhaustive()
    }
}

/// The result of an object [`plan::place`] found no place for; a refusal names the object, as it will be
/// read in the heartbeat and in logs.
fn unplaced_result(object: Desired, unplaced: plan::Unplaced) -> ObjectResult {
    let outcome = match unplaced {
        plan::Unplaced::Refused(reason) => Outcome::Refused(format!("{}: {reason}", object.id)),
        plan::Unplaced::Invalid(message) => Outcome::Failed(message),
    };
    result(object, outcome, None)
}

pub(crate) fn result(object: Desired, outcome: Outcome, applied: Option<Baseline>) -> ObjectResult {
    let body_hash = object.body_hash();
    ObjectResult {
        object,
        body_hash,
        outcome,
        applied,
    }
}

async fn apply_stage(
    cluster: &Cluster,
    stage: Stage,
    objects: Vec<Desired>,
    hooks: &Hooks<'_>,
    options: &ApplyOptions,
) -> Vec<ObjectResult> {
    let mut results = Vec::with_capacity(objects.len());
    for (wave, objects) in plan::waves(objects) {
        let started = Instant::now();
        let count = objects.len();
        let wave_results: Vec<ObjectResult> = futures::stream::iter(objects)
            .map(|object| apply_one(cluster, object, hooks, options))
            .buffer_unordered(options.concurrency.max(1))
            .collect()
            .await;
        let written = wave_results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Applied { written: true }))
            .count();
        let failed = wave_results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Failed(_)))
            .count();
        info!(
            stage = stage.as_str(),
            wave,
            objects = count,
            written,
            failed,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "applied wave"
        );
        results.extend(wave_results);
    }
    results
}

async fn apply_one(
    cluster: &Cluster,
    object: Desired,
    hooks: &Hooks<'_>,
    options: &ApplyOptions,
) -> ObjectResult {
    let span = info_span!("apply", object = %object.id, app = %object.app);
    async move {
        let resolved = match cluster.resolve(&object.id.api_version, &object.id.kind).await {
            Ok(resolved) => resolved,
            Err(error) => return result(object, Outcome::Failed(error.to_string()), None),
        };
        let hash = object.body_hash();
        if (hooks.unchanged)(&ObjectKey::of(&object.id), &hash) {
            return ObjectResult { object, body_hash: hash, outcome: Outcome::Applied { written: false }, applied: None };
        }
        // Fields left to others must have another owner before the apply that stops sending them, or the
        // API server resets them.
        if !object.ignored_pointers.is_empty()
            && let Err(error) = crate::heal::handover::hand_over(cluster, &object, &resolved).await
        {
            warn!(%error, "not applied");
            return ObjectResult { object, body_hash: hash, outcome: Outcome::Failed(error.to_string()), applied: None };
        }
        let mut attempt = 0;
        loop {
            match cluster.apply_written(&object.id, &resolved, object.raw_body(), false).await {
                Ok(written) => {
                    let applied = Baseline::of(&written.live);
                    // The inventory needs it after the last apply; computed now, it is off that path.
                    applied.digest();
                    let applied = Some(applied);
                    (hooks.observe)(&written.live, written.text);
                    return ObjectResult { object, body_hash: hash, outcome: Outcome::Applied { written: true }, applied };
                }
                Err(failure) if failure.retriable && attempt + 1 < options.attempts => {
                    let wait = full_jitter(attempt, Duration::from_millis(200), Duration::from_secs(5), random_unit());
                    warn!(attempt, error = %failure.message, wait_ms = wait.as_millis() as u64, "apply failed, retrying");
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                Err(failure) => {
                    warn!(error = %failure.message, "apply failed");
                    return ObjectResult { object, body_hash: hash, outcome: Outcome::Failed(failure.message), applied: None };
                }
            }
        }
    }
    .instrument(span)
    .await
}

/// Waits (polling the objects, with a deadline) until applied CRDs are Established and Namespaces Active, so
/// the next stage can use them; those the API server already answered healthy (a new Namespace is Active at
/// once) are not asked again. Objects that do not settle in time are left to report their health.
async fn settle(cluster: &Cluster, results: &[ObjectResult], hooks: &Hooks<'_>, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    for applied in results
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Applied { .. }))
        .filter(|r| (hooks.health)(&r.key()) != Some(Health::Healthy))
    {
        let id = &applied.object.id;
        let Ok(resolved) = cluster.resolve(&id.api_version, &id.kind).await else {
            continue;
        };
        let mut pause = Duration::from_millis(20);
        loop {
            match cluster.get(id, &resolved).await {
                Ok(Some(live)) if assess(id.group(), &id.kind, &live) == Health::Healthy => break,
                _ if Instant::now() >= deadline => {
                    warn!(object = %id, "not settled before the deadline; continuing");
                    break;
                }
                _ => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
        }
    }
}
