//! Live state of every managed object, kept by one watch per applied kind (filtered by Windvane's fleet
//! label), so health and drift are known the moment the API server knows them, without polling. A watch that
//! expires (`410 Gone`) relists and resumes (kube's watcher does this); objects that vanished meanwhile are
//! dropped at the end of the relist. Every change is sent to the engine as the object's key.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::{debug, warn};
use windvane_shared::bundle::ObjectRef;
use windvane_shared::desired::FLEET_LABEL;

use crate::cluster::{Cluster, Resolved};
use crate::inventory::ObjectKey;

/// A change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The object was created or modified (its new state is in the cache).
    Updated(ObjectKey),
    /// The object is gone.
    Deleted(ObjectKey),
}

/// The watched objects, by key.
#[derive(Clone)]
pub struct LiveCache {
    objects: Arc<RwLock<HashMap<ObjectKey, Value>>>,
    watched: Arc<Mutex<HashSet<(String, String)>>>,
    changes: mpsc::UnboundedSender<Change>,
    fleet: String,
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
            changes,
            fleet: fleet.to_owned(),
        };
        (cache, receiver)
    }

    /// The live object, if the watch has seen it.
    pub fn get(&self, key: &ObjectKey) -> Option<Value> {
        self.objects
            .read()
            .expect("live cache lock")
            .get(key)
            .cloned()
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
        if let Some(id) = ObjectRef::of(live) {
            self.objects
                .write()
                .expect("live cache lock")
                .insert(ObjectKey::of(&id), live.clone());
        }
    }

    /// Starts a watch on this kind unless one runs already.
    pub fn ensure_watch(&self, cluster: &Cluster, resolved: &Resolved) {
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
        let config = watcher::Config::default().labels(&format!("{FLEET_LABEL}={}", self.fleet));
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
                    Ok(Event::InitDone) => cache.drop_missing(&group, &kind, &relisted),
                    Err(error) => {
                        warn!(%group, %kind, %error, "watch failed; retrying with backoff")
                    }
                }
            }
        });
    }

    fn apply(&self, object: DynamicObject) -> Option<ObjectKey> {
        let value = serde_json::to_value(&object).ok()?;
        let key = ObjectKey::of(&ObjectRef::of(&value)?);
        debug!(object = ?key, "watch: updated");
        self.objects
            .write()
            .expect("live cache lock")
            .insert(key.clone(), value);
        let _ = self.changes.send(Change::Updated(key.clone()));
        Some(key)
    }

    fn delete(&self, object: DynamicObject) {
        let Some(key) = serde_json::to_value(&object)
            .ok()
            .as_ref()
            .and_then(ObjectRef::of)
            .map(|id| ObjectKey::of(&id))
        else {
            return;
        };
        debug!(object = ?key, "watch: deleted");
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
