//! Live state of every managed object, kept by one watch per applied kind (filtered by Windvane's fleet
//! label), so health and drift are known the moment the API server knows them, without polling. A watch that
//! expires (`410 Gone`) relists and resumes (kube's watcher does this); objects that vanished meanwhile are
//! dropped at the end of the relist. Every change is sent to the engine as the object's key.
//!
//! Objects are kept as compact JSON text, not as parsed values: a parsed object takes several times the
//! memory of its text, and readers (health, drift, the backstop, prune) look at one object at a time, so
//! parsing on read keeps the agent's memory near the size of the objects themselves. The initial list of
//! each kind is read in pages of about [`LIST_PAGE_BYTES`] for the same reason: a page is held whole, as
//! text and then parsed, until its objects are cached ([`list_page_size`]).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::{debug, warn};
use windvane_shared::decide::desired::FLEET_LABEL;
use windvane_shared::format::bundle::ObjectRef;

use crate::apply::inventory::ObjectKey;
use crate::kube::cluster::{Cluster, Resolved};

/// A change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The object was created or modified (its new state is in the cache).
    Updated(ObjectKey),
    /// The object is gone.
    Deleted(ObjectKey),
}

/// Most objects per page of a watch's (re)list.
const LIST_PAGE_SIZE: u32 = 100;
/// About how many bytes of objects one page of a (re)list holds, judged from the largest desired body of the
/// kind: live objects are bigger than what was applied (status, managedFields), so twice that is counted.
pub const LIST_PAGE_BYTES: usize = 1024 * 1024;

/// Objects per page of a kind's (re)list: as many as fit [`LIST_PAGE_BYTES`] when the largest desired body
/// of the kind is known (at least one, at most [`LIST_PAGE_SIZE`]). Unknown (after a restart, before the
/// release renders): CustomResourceDefinitions, whose schemas run to hundreds of KB each, one at a time;
/// other kinds [`LIST_PAGE_SIZE`].
pub fn list_page_size(kind: &str, largest_body: Option<usize>) -> u32 {
    match largest_body {
        Some(largest) => {
            let fit = LIST_PAGE_BYTES / largest.saturating_mul(2).max(1);
            u32::try_from(fit)
                .unwrap_or(u32::MAX)
                .clamp(1, LIST_PAGE_SIZE)
        }
        None if kind == "CustomResourceDefinition" => 1,
        None => LIST_PAGE_SIZE,
    }
}

/// The watched objects, by key.
#[derive(Clone)]
pub struct LiveCache {
    /// Each object as compact JSON.
    objects: Arc<RwLock<HashMap<ObjectKey, Box<[u8]>>>>,
    watched: Arc<Mutex<HashSet<(String, String)>>>,
    /// Kinds (group, kind) whose watch has completed its first list; bumped on every first list.
    listed: Arc<tokio::sync::watch::Sender<HashSet<(String, String)>>>,
    changes: mpsc::UnboundedSender<Change>,
    fleet: String,
    /// Jobs and Pods last seen finished ([`crate::apply::run_once::finished`]), kept past their deletion: a Job
    /// removed by its TTL controller the moment it completes may be gone before the engine looks at it.
    finished: Arc<Mutex<HashMap<ObjectKey, crate::apply::run_once::Finished>>>,
}

impl std::fmt::Debug for LiveCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveCache")
            .field("fleet", &self.fleet)
            .finish_non_exhaustive()
    }
}

impl LiveCache {
    /// A cache for `fleet`'s objects, and the receiver of its changes.
    pub fn new(fleet: &str) -> (Self, mpsc::UnboundedReceiver<Change>) {
        let (changes, receiver) = mpsc::unbounded_channel();
        let cache = Self {
            objects: Arc::default(),
            watched: Arc::default(),
            listed: Arc::new(tokio::sync::watch::Sender::new(HashSet::new())),
            changes,
            fleet: fleet.to_owned(),
            finished: Arc::default(),
        };
        (cache, receiver)
    }

    /// The live object, if the watch has seen it.
    pub fn get(&self, key: &ObjectKey) -> Option<Value> {
        let objects = self.objects.read().expect("live cache lock");
        // The text was written by serde_json from a value, so it always parses.
        serde_json::from_slice(objects.get(key)?).ok()
    }

    /// The live object's health ([`crate::live::health::assess_text`]: cheaper than [`LiveCache::get`] and judging
    /// that), if the watch has seen it.
    pub fn health(&self, key: &ObjectKey) -> Option<crate::live::health::Health> {
        let objects = self.objects.read().expect("live cache lock");
        crate::live::health::assess_text(&key.group, &key.kind, objects.get(key)?)
    }

    /// How the Job or Pod `key` finished, if it was last seen finished (present or deleted since).
    pub fn finished(&self, key: &ObjectKey) -> Option<crate::apply::run_once::Finished> {
        self.finished
            .lock()
            .expect("finished lock")
            .get(key)
            .copied()
    }

    /// Records whether a Job or Pod is finished as `object` (the object, or its data with `status` at the
    /// top) shows it. A deleted object's last state only adds a finish: it never forgets one.
    fn note_finished(&self, key: &ObjectKey, object: &Value, deleted: bool) {
        if !matches!(
            (key.group.as_str(), key.kind.as_str()),
            ("batch", "Job") | ("", "Pod")
        ) {
            return;
        }
        let mut finished = self.finished.lock().expect("finished lock");
        match crate::apply::run_once::finished(&key.group, &key.kind, object) {
            Some(how) => {
                finished.insert(key.clone(), how);
            }
            None if !deleted => {
                finished.remove(key);
            }
            None => {}
        }
    }

    /// True when the watch has seen the object (cheaper than [`LiveCache::get`]).
    pub fn contains(&self, key: &ObjectKey) -> bool {
        self.objects
            .read()
            .expect("live cache lock")
            .contains_key(key)
    }

    /// How many objects are watched.
    pub fn len(&self) -> usize {
        self.objects.read().expect("live cache lock").len()
    }

    /// True when nothing is watched yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records an object as returned by an apply, so health is known before the watch event arrives.
    pub fn observe(&self, live: &Value) {
        if let Ok(text) = serde_json::to_vec(live) {
            self.observe_text(live, text);
        }
    }

    /// [`observe`](Self::observe) with the object's JSON text at hand (as the API server sent it), kept as
    /// it is instead of serialising `live` again.
    pub fn observe_text(&self, live: &Value, text: Vec<u8>) {
        if let Some(id) = ObjectRef::of(live) {
            let key = ObjectKey::of(&id);
            self.note_finished(&key, live, false);
            self.objects
                .write()
                .expect("live cache lock")
                .insert(key, text.into_boxed_slice());
        }
    }

    /// Waits until the watches of all `kinds` (group, kind) have completed their first list, or until
    /// `timeout`. True when they all did.
    pub async fn wait_listed(&self, kinds: &HashSet<(String, String)>, timeout: Duration) -> bool {
        let mut listed = self.listed.subscribe();
        tokio::time::timeout(timeout, listed.wait_for(|done| kinds.is_subset(done)))
            .await
            .is_ok_and(|result| result.is_ok())
    }

    /// Starts a watch on this kind unless one runs already, listing it in pages sized for its largest desired
    /// body when known ([`list_page_size`]).
    pub fn ensure_watch(
        &self,
        cluster: &Cluster,
        resolved: &Resolved,
        largest_body: Option<usize>,
    ) {
        let kind_key = (
            resolved.resource.group.clone(),
            resolved.resource.kind.clone(),
        );
        if !self
            .watched
            .lock()
            .expect("watch set lock")
            .insert(kind_key.clone())
        {
            return;
        }
        let api: Api<DynamicObject> = Api::all_with(cluster.client().clone(), &resolved.resource);
        let config = watcher::Config::default()
            .labels(&format!("{FLEET_LABEL}={}", self.fleet))
            .page_size(list_page_size(&resolved.resource.kind, largest_body));
        let cache = self.clone();
        let types = kube::core::TypeMeta {
            api_version: resolved.resource.api_version.clone(),
            kind: resolved.resource.kind.clone(),
        };
        tokio::spawn(async move {
            let (group, kind) = kind_key;
            // Items of a list carry no apiVersion and kind; every object of this watch has this resource's.
            let typed = |mut object: DynamicObject| {
                object.types.get_or_insert_with(|| types.clone());
                object
            };
            let mut stream = watcher::watcher(api, config).default_backoff().boxed();
            let mut relisted: HashSet<ObjectKey> = HashSet::new();
            while let Some(event) = stream.next().await {
                match event {
                    Ok(Event::Apply(object)) => {
                        cache.apply(typed(object));
                    }
                    Ok(Event::Delete(object)) => cache.delete(typed(object)),
                    Ok(Event::Init) => relisted.clear(),
                    Ok(Event::InitApply(object)) => {
                        if let Some(key) = cache.apply(typed(object)) {
                            relisted.insert(key);
                        }
                    }
                    Ok(Event::InitDone) => {
                        cache.drop_missing(&group, &kind, &relisted);
                        relisted = HashSet::new();
                        cache.listed.send_if_modified(|listed| {
                            listed.insert((group.clone(), kind.clone()))
                        });
                    }
                    Err(error) => {
                        warn!(%group, %kind, %error, "watch failed; retrying with backoff")
                    }
                }
            }
        });
    }

    fn apply(&self, object: DynamicObject) -> Option<ObjectKey> {
        let key = key_of(&object)?;
        self.note_finished(&key, &object.data, false);
        let text = serde_json::to_vec(&object).ok()?;
        drop(object);
        debug!(object = ?key, "watch: updated");
        self.objects
            .write()
            .expect("live cache lock")
            .insert(key.clone(), text.into_boxed_slice());
        let _ = self.changes.send(Change::Updated(key.clone()));
        Some(key)
    }

    fn delete(&self, object: DynamicObject) {
        let Some(key) = key_of(&object) else {
            return;
        };
        debug!(object = ?key, "watch: deleted");
        self.note_finished(&key, &object.data, true);
        self.objects.write().expect("live cache lock").remove(&key);
        let _ = self.changes.send(Change::Deleted(key));
    }

    /// After a relist: objects of this kind that the list no longer has were deleted while unwatched.
    fn drop_missing(&self, group: &str, kind: &str, present: &HashSet<ObjectKey>) {
        let gone: Vec<ObjectKey> = self
            .objects
            .read()
            .expect("live cache lock")
            .keys()
            .filter(|k| k.group == group && k.kind == kind && !present.contains(k))
            .cloned()
            .collect();
        for key in gone {
            self.objects.write().expect("live cache lock").remove(&key);
            let _ = self.changes.send(Change::Deleted(key));
        }
    }
}

/// The key of a watched object, read from its typed metadata (what [`ObjectRef::of`] reads from JSON).
fn key_of(object: &DynamicObject) -> Option<ObjectKey> {
    let text = |v: Option<&String>| v.filter(|s| !s.is_empty()).cloned();
    let types = object.types.as_ref()?;
    let id = ObjectRef {
        api_version: text(Some(&types.api_version))?,
        kind: text(Some(&types.kind))?,
        name: text(object.metadata.name.as_ref())?,
        namespace: text(object.metadata.namespace.as_ref()),
    };
    Some(ObjectKey::of(&id))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_watched_object_has_the_key_its_json_has() {
        let value = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "a", "labels": {"x": "y"}}, "spec": {"replicas": 2}});
        let object: DynamicObject = serde_json::from_value(value.clone()).unwrap();
        assert_eq!(
            key_of(&object),
            ObjectRef::of(&value).map(|id| ObjectKey::of(&id))
        );
        let cluster_scoped: DynamicObject = serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}}),
        )
        .unwrap();
        assert_eq!(
            key_of(&cluster_scoped).map(|k| (k.group, k.kind, k.namespace)),
            Some((String::new(), "Namespace".to_owned(), None))
        );
    }

    #[test]
    fn list_pages_hold_about_a_mebibyte() {
        assert_eq!(list_page_size("ConfigMap", Some(300 * 1024)), 1);
        assert_eq!(list_page_size("ConfigMap", Some(10 * 1024)), 51);
        assert_eq!(list_page_size("ConfigMap", Some(2 * 1024)), LIST_PAGE_SIZE);
        assert_eq!(list_page_size("ConfigMap", Some(0)), LIST_PAGE_SIZE);
        assert_eq!(list_page_size("ConfigMap", Some(usize::MAX)), 1);
        assert_eq!(list_page_size("CustomResourceDefinition", None), 1);
        assert_eq!(list_page_size("ConfigMap", None), LIST_PAGE_SIZE);
    }

    #[tokio::test]
    async fn the_cache_gives_back_what_it_was_given() {
        let (cache, _changes) = LiveCache::new("fleet");
        let live = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "a", "resourceVersion": "7"}, "data": {"b": "1", "a": "2"}});
        cache.observe(&live);
        let key = ObjectKey::of(&ObjectRef::of(&live).unwrap());
        assert!(cache.contains(&key));
        assert_eq!(cache.get(&key), Some(live));
        assert_eq!(cache.len(), 1);
    }

    #[tokio::test]
    async fn a_finish_is_remembered_past_the_deletion_and_forgotten_when_it_runs_again() {
        let (cache, _changes) = LiveCache::new("fleet");
        let job = |conditions: Value| -> DynamicObject {
            serde_json::from_value(json!({"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": "certgen", "namespace": "a"}, "status": {"conditions": conditions}}))
            .unwrap()
        };
        let done = job(json!([{"type": "Complete", "status": "True"}]));
        let key = key_of(&done).unwrap();
        cache.apply(job(json!([])));
        assert_eq!(cache.finished(&key), None, "running");
        cache.apply(done.clone());
        cache.delete(done);
        assert!(!cache.contains(&key));
        assert_eq!(
            cache.finished(&key),
            Some(crate::apply::run_once::Finished::Succeeded)
        );
        cache.delete(job(json!([])));
        assert_eq!(
            cache.finished(&key),
            Some(crate::apply::run_once::Finished::Succeeded)
        );
        cache.apply(job(json!([])));
        assert_eq!(cache.finished(&key), None, "created again: running again");
    }
}
