//! Keeps the prevention policy in the cluster: after each sync, the objects of the release with `prevent`
//! on become the guarded set, [`crate::prevent::policy::objects`] builds the ValidatingAdmissionPolicy and its
//! binding from it, and this executor applies them (server-side apply, manager `windvane`) — or deletes
//! them when nothing is guarded any more. It learns once what it needs from the API server: the version
//! (older than 1.30: a clear refusal, detection only), the agent's own user name (a SelfSubjectReview) and
//! the agent's Namespace (the owner of both objects, so uninstalling the agent removes them).
//!
//! Every object the release declares with prevent on is guarded, whatever its last outcome (a failed or
//! waiting object is still the release's; only one outside the operator's allowlist is not). Once applied,
//! the policy and binding are watched ([`next_prevention_change`]): deleted or changed, they are restored within
//! seconds, not at the hourly backstop. Break-glass annotations on an object that was not guarded before
//! (newly guarded, or guarded again after its policy was gone) were written unchecked: they are removed.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::{info, warn};
use windvane_shared::decide::desired::FIELD_MANAGER;
use windvane_shared::format::bundle::ObjectRef;

use crate::apply::inventory::ObjectKey;
use crate::apply::{ObjectResult, Outcome};
use crate::engine::AbortOnDrop;
use crate::kube::cluster::{Cluster, Deletion};
use crate::live::watch::LiveCache;
use crate::prevent::policy::{self, Guarded, Settings};
use crate::{Error, Result};

const API_VERSION: &str = "admissionregistration.k8s.io/v1";
const POLICY_KIND: &str = "ValidatingAdmissionPolicy";
const BINDING_KIND: &str = "ValidatingAdmissionPolicyBinding";

/// The prevention stage's state: what the executor remembers between syncs, and the handles it writes and
/// reads through (its own: no other stage's state is reached into).
#[derive(Debug)]
pub struct Prevention {
    cluster: Cluster,
    live: LiveCache,
    settings: PreventSettings,
    /// The agent's user name, once known.
    agent_user: Option<String>,
    /// The agent Namespace's uid, once known.
    owner_uid: Option<String>,
    /// `Err`: why this cluster cannot enforce prevention (its version), once asked.
    supported: Option<std::result::Result<(), Arc<Error>>>,
    /// The objects last applied (the policy, then the binding); `None` once removed.
    applied: Option<(Value, Value)>,
    /// False until the first sync made sure of the policy's presence or absence.
    settled: bool,
    /// The objects the policy in the cluster guards (known after the first apply): an object not among them
    /// becomes guarded with the next apply.
    guarded: Option<BTreeSet<Guarded>>,
    /// The watch of the policy and binding, once they were applied: it says when either changed.
    watch: Option<(AbortOnDrop, mpsc::Receiver<()>)>,
    /// The objects the last sync guarded, for a restore.
    objects: Vec<GuardedObject>,
}

/// What the executor needs of the agent's configuration.
#[derive(Debug, Clone)]
pub struct PreventSettings {
    /// The fleet: the policy and binding are named after it.
    pub fleet: String,
    /// The agent's namespace, the owner of both objects.
    pub namespace: String,
    /// The group whose members may make a two-person break-glass change to a prevented object.
    pub break_glass_group: String,
}

/// One object of the release with prevent on.
#[derive(Debug, Clone)]
struct GuardedObject {
    key: ObjectKey,
    id: ObjectRef,
    guarded: Guarded,
}

impl Prevention {
    /// Nothing known yet: the first sync makes sure of the policy's presence or absence.
    pub fn new(cluster: Cluster, live: LiveCache, settings: PreventSettings) -> Self {
        Self {
            cluster,
            live,
            settings,
            agent_user: None,
            owner_uid: None,
            supported: None,
            applied: None,
            settled: false,
            guarded: None,
            watch: None,
            objects: Vec::new(),
        }
    }

    /// Brings the policy in line with the objects just applied; `Err` says why prevention is not in force.
    pub async fn keep(&mut self, results: &[ObjectResult], serial: u64) -> Result<()> {
        self.clear_spent_approvals(results).await;
        let guarded = self.guarded(results).await;
        if guarded.is_empty() {
            return self.remove().await;
        }
        if self.supported.is_none() {
            self.supported = Some(self.cluster_supports().await.map_err(Arc::new));
        }
        if let Some(Err(why)) = &self.supported {
            warn!(%why, "prevention refused");
            return Err(Error::PreventionRefused(why.clone()));
        }
        let settings = self.prevent_settings(serial).await?;
        let list: Vec<Guarded> = guarded.iter().map(|g| g.guarded.clone()).collect();
        let Some(objects) = policy::objects(&settings, &list) else {
            return Ok(());
        };
        if self.applied.as_ref() == Some(&objects) {
            return Ok(());
        }
        let before = self.guarded_before(&guarded).await;
        self.apply_prevention(&objects).await?;
        info!(
            guarded = guarded.len(),
            policy = %policy::policy_name(&self.settings.fleet),
            "prevention policy applied"
        );
        self.applied = Some(objects);
        self.settled = true;
        self.guarded = Some(list.into_iter().collect());
        self.watch();
        let newly = guarded.iter().filter(|g| !before.contains(&g.guarded));
        self.void_unchecked_break_glass(newly).await;
        self.objects = guarded;
        Ok(())
    }

    /// What the policy in the cluster guarded before this apply: as remembered, or — the first time after a
    /// start — as the live policy lists it.
    async fn guarded_before(&self, guarded: &[GuardedObject]) -> BTreeSet<Guarded> {
        if let Some(known) = &self.guarded {
            return known.clone();
        }
        let Ok(resolved) = self.cluster.resolve(API_VERSION, POLICY_KIND).await else {
            return BTreeSet::new();
        };
        let api: Api<DynamicObject> =
            Api::all_with(self.cluster.client().clone(), &resolved.resource);
        let Ok(Some(live)) = api
            .get_opt(&policy::policy_name(&self.settings.fleet))
            .await
        else {
            return BTreeSet::new();
        };
        let live = serde_json::to_value(live).unwrap_or_default();
        guarded
            .iter()
            .map(|g| g.guarded.clone())
            .filter(|g| policy::policy_guards(&live, g))
            .collect()
    }

    /// Removes the break-glass annotations of `objects`, which were not guarded when they were written: an
    /// approval that no policy checked is no approval.
    async fn void_unchecked_break_glass<'a>(
        &self,
        objects: impl Iterator<Item = &'a GuardedObject>,
    ) {
        for object in objects {
            let Some(live) = self.live.get(&object.key) else {
                continue;
            };
            if !policy::has_break_glass_annotations(&live) {
                continue;
            }
            let id = &object.id;
            let Ok(resolved) = self.cluster.resolve(&id.api_version, &id.kind).await else {
                continue;
            };
            match self
                .cluster
                .merge_patch(id, &resolved, &policy::clear_break_glass())
                .await
            {
                Ok(_) => warn!(
                    object = %id,
                    "break-glass annotations written while the object was not guarded removed: they were never checked"
                ),
                Err(failure) => {
                    warn!(object = %id, error = %failure.message, "cannot remove unchecked break-glass annotations")
                }
            }
        }
    }

    /// Starts watching the policy and binding (once): every change of either reaches the engine's loop,
    /// which calls [`Prevention::restore`].
    fn watch(&mut self) {
        if self.watch.is_some() {
            return;
        }
        let (tx, rx) = mpsc::channel(1);
        let task = tokio::spawn(watch_prevention(
            self.cluster.clone(),
            policy::policy_name(&self.settings.fleet),
            tx,
        ));
        self.watch = Some((AbortOnDrop(task), rx));
    }

    /// The policy or binding changed in the cluster: one that is gone is created again, one that someone
    /// changed is replaced whole by what the agent applied (a server-side apply would keep fields another
    /// manager added, such as a `matchConditions` that matches nothing, or an `Audit` beside `Deny`); then
    /// the break-glass annotations written meanwhile, unchecked, are removed.
    pub async fn restore(&mut self) {
        let Some((policy, binding)) = self.applied.clone() else {
            return;
        };
        let mut restored = false;
        for (kind, wanted) in [(POLICY_KIND, &policy), (BINDING_KIND, &binding)] {
            match self.restore_one(kind, wanted).await {
                Ok(again) => restored |= again,
                Err(why) => warn!(%kind, %why, "cannot restore the prevention policy"),
            }
        }
        if restored {
            let guarded = self.objects.clone();
            self.void_unchecked_break_glass(guarded.iter()).await;
        }
    }

    /// Restores one of the two objects when it is gone or not as applied; true when it had to.
    async fn restore_one(&self, kind: &str, wanted: &Value) -> Result<bool> {
        let resolved = self.cluster.resolve(API_VERSION, kind).await?;
        let api: Api<DynamicObject> =
            Api::all_with(self.cluster.client().clone(), &resolved.resource);
        let name = policy::policy_name(&self.settings.fleet);
        let live = api
            .get_opt(&name)
            .await
            .map_err(|source| Error::Api {
                action: format!("reading {kind} {name}"),
                source,
            })?
            .map(|live| serde_json::to_value(live).unwrap_or_default());
        match policy::tampered(live.as_ref(), wanted, FIELD_MANAGER) {
            None => Ok(false),
            Some(why) => {
                warn!(%kind, %name, %why, "the prevention policy was tampered with; restoring it");
                match live.and_then(|l| l.pointer("/metadata/resourceVersion").cloned()) {
                    // Gone: created again.
                    None => {
                        let id = self.object_ref(kind);
                        self.cluster
                            .apply(&id, &resolved, wanted, false)
                            .await
                            .map_err(|failure| Error::Apply {
                                object: id.to_string(),
                                detail: failure.message,
                            })?;
                    }
                    Some(version) => {
                        let mut body = wanted.clone();
                        body["metadata"]["resourceVersion"] = version;
                        let object: DynamicObject =
                            serde_json::from_value(body).map_err(|source| Error::Json {
                                object: format!("{kind} {name}"),
                                expected: "an object",
                                source,
                            })?;
                        let params = PostParams {
                            field_manager: Some(FIELD_MANAGER.to_owned()),
                            ..PostParams::default()
                        };
                        api.replace(&name, &params, &object)
                            .await
                            .map_err(|source| Error::Api {
                                action: format!("replacing {kind} {name}"),
                                source,
                            })?;
                    }
                }
                Ok(true)
            }
        }
    }

    /// True when this cluster cannot enforce prevention at all (its version): nothing to retry.
    pub fn refused(&self) -> bool {
        matches!(self.supported, Some(Err(_)))
    }

    /// The backstop: applies the policy again (someone may have removed it).
    pub async fn reassert(&mut self) {
        if let Some(objects) = self.applied.clone()
            && let Err(why) = self.apply_prevention(&objects).await
        {
            warn!(%why, "cannot re-apply the prevention policy");
        }
    }

    /// A break-glass approval serves one change: on an object this sync wrote as the release says (a release
    /// took the change in, or it was reverted), whatever break-glass annotations are left are removed.
    async fn clear_spent_approvals(&self, results: &[ObjectResult]) {
        for result in results {
            let key = result.key();
            // Written now: any break-glass change on it is over (the healer's episode ends with this write).
            let written = matches!(result.outcome, Outcome::Applied { written: true });
            if !written || !result.object.prevent {
                continue;
            }
            let Some(live) = self.live.get(&key) else {
                continue;
            };
            if policy::break_glass(&live).is_none() {
                continue;
            }
            let id = &result.object.id;
            let Ok(resolved) = self.cluster.resolve(&id.api_version, &id.kind).await else {
                continue;
            };
            let clear = policy::clear_break_glass();
            match self.cluster.merge_patch(id, &resolved, &clear).await {
                Ok(_) => info!(object = %id, "break-glass approval spent: annotations removed"),
                Err(failure) => {
                    warn!(object = %id, error = %failure.message, "cannot remove spent break-glass annotations")
                }
            }
        }
    }

    /// The objects of the release that have prevent on, as admission requests name them: whatever their
    /// outcome in this sync (one that failed, or waits for its dependencies, is still the release's and may
    /// exist from before), but for those outside the operator's allowlist.
    async fn guarded(&self, results: &[ObjectResult]) -> Vec<GuardedObject> {
        let mut guarded = Vec::new();
        for result in results {
            if !result.object.prevent || matches!(result.outcome, Outcome::Refused(_)) {
                continue;
            }
            let id = &result.object.id;
            let Ok(resolved) = self.cluster.resolve(&id.api_version, &id.kind).await else {
                continue;
            };
            guarded.push(GuardedObject {
                key: result.key(),
                id: id.clone(),
                guarded: Guarded {
                    group: id.group().to_owned(),
                    resource: resolved.resource.plural.clone(),
                    namespace: id.namespace.clone(),
                    name: id.name.clone(),
                    owns_replicas: result.object.body().pointer("/spec/replicas").is_some(),
                },
            });
        }
        guarded
    }

    async fn cluster_supports(&self) -> Result<()> {
        match self.cluster.client().apiserver_version().await {
            Ok(info) => policy::supported(&info.major, &info.minor),
            Err(source) => Err(Error::Api {
                action: "cannot read the Kubernetes version".to_owned(),
                source,
            }),
        }
    }

    async fn prevent_settings(&mut self, serial: u64) -> Result<Settings> {
        const WHO: &str = "asking who the agent is (SelfSubjectReview)";
        let client = self.cluster.client().clone();
        if self.agent_user.is_none() {
            let review = SelfSubjectReview::default();
            let answer = Api::<SelfSubjectReview>::all(client.clone())
                .create(&PostParams::default(), &review)
                .await
                .map_err(|source| Error::Api {
                    action: WHO.to_owned(),
                    source,
                })?;
            let user = answer
                .status
                .and_then(|s| s.user_info)
                .and_then(|u| u.username)
                .ok_or_else(|| Error::Answer {
                    action: WHO.to_owned(),
                    detail: "the SelfSubjectReview named no user".to_owned(),
                })?;
            info!(%user, "the agent's identity, exempt from its prevention policy");
            self.agent_user = Some(user);
        }
        if self.owner_uid.is_none() {
            let namespace = Api::<Namespace>::all(client)
                .get_opt(&self.settings.namespace)
                .await
                .map_err(|source| Error::Api {
                    action: "reading the agent's namespace".to_owned(),
                    source,
                })?;
            self.owner_uid = namespace.and_then(|n| n.metadata.uid);
        }
        Ok(Settings {
            fleet: self.settings.fleet.clone(),
            serial,
            agent_user: self.agent_user.clone().unwrap_or_default(),
            break_glass_group: self.settings.break_glass_group.clone(),
            owner: self.owner_uid.clone().map(|uid| {
                (
                    "v1".into(),
                    "Namespace".into(),
                    self.settings.namespace.clone(),
                    uid,
                )
            }),
        })
    }

    async fn apply_prevention(&self, (policy, binding): &(Value, Value)) -> Result<()> {
        for (kind, body) in [(POLICY_KIND, policy), (BINDING_KIND, binding)] {
            let id = self.object_ref(kind);
            let resolved = self.cluster.resolve(API_VERSION, kind).await?;
            self.cluster
                .apply(&id, &resolved, body, false)
                .await
                .map_err(|failure| Error::Apply {
                    object: id.to_string(),
                    detail: failure.message,
                })?;
        }
        Ok(())
    }

    /// Deletes the policy and its binding unless they are known absent (once per agent start, and whenever
    /// they were applied).
    async fn remove(&mut self) -> Result<()> {
        if !self.may_exist() {
            return Ok(());
        }
        self.delete().await?;
        self.removed();
        Ok(())
    }

    /// False once the policy is known absent (removed, or found missing by the first sync).
    pub fn may_exist(&self) -> bool {
        !self.settled || self.applied.is_some()
    }

    /// Deletes the policy and its binding, both at once; objects already gone count as removed. After a start
    /// this runs in the first sync, whether or not they ever existed.
    pub async fn delete(&self) -> Result<()> {
        let removals = [BINDING_KIND, POLICY_KIND].map(|kind| async move {
            let id = self.object_ref(kind);
            // A cluster without the API has nothing to remove.
            let Ok(resolved) = self.cluster.resolve(API_VERSION, kind).await else {
                return Ok(());
            };
            match self.cluster.delete(&id, &resolved).await {
                Ok(Deletion::Gone | Deletion::Pending { .. }) => Ok(()),
                Err(error) => Err(error),
            }
        });
        futures::future::join_all(removals)
            .await
            .into_iter()
            .collect()
    }

    /// Records that the policy and its binding are gone.
    pub fn removed(&mut self) {
        if self.applied.take().is_some() {
            info!("prevention turned off: policy removed");
        }
        self.guarded = Some(BTreeSet::new());
        self.settled = true;
    }

    fn object_ref(&self, kind: &str) -> ObjectRef {
        ObjectRef {
            api_version: API_VERSION.to_owned(),
            kind: kind.to_owned(),
            namespace: None,
            name: policy::policy_name(&self.settings.fleet),
        }
    }
}

/// The next change of the policy or binding (`None` forever until they are watched).
pub async fn next_prevention_change(prevention: &mut Prevention) -> Option<()> {
    match &mut prevention.watch {
        Some((_, changes)) => changes.recv().await,
        None => std::future::pending().await,
    }
}

/// Watches the policy and the binding named `name` and says (coalesced) whenever either is changed,
/// deleted or listed again, until the receiver is gone.
async fn watch_prevention(cluster: Cluster, name: String, tx: mpsc::Sender<()>) {
    use kube::runtime::watcher::watcher;
    let mut streams = Vec::new();
    for kind in [POLICY_KIND, BINDING_KIND] {
        let resolved = match cluster.resolve(API_VERSION, kind).await {
            Ok(resolved) => resolved,
            Err(error) => {
                warn!(%kind, %error, "cannot watch the prevention policy");
                return;
            }
        };
        let api: Api<DynamicObject> = Api::all_with(cluster.client().clone(), &resolved.resource);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        streams.push(watcher(api, config).default_backoff().boxed());
    }
    let mut events = futures::stream::select_all(streams);
    while let Some(event) = events.next().await {
        let changed = matches!(
            event,
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone)
        );
        if changed && tx.try_send(()).is_err() && tx.is_closed() {
            return;
        }
    }
}
