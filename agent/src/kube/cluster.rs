//! The agent's hands on the cluster: discovery of kinds (cached, refreshed after CRDs land), server-side apply
//! with field manager `windvane`, deletion, and reads. Thin on purpose: what to apply and what to delete is
//! decided elsewhere ([`crate::apply::plan`], [`crate::apply::inventory`]); this module only talks to the API
//! server, and names the object in every error.
//!
//! Discovery asks the API server about one group version at a time, so a group that cannot be discovered
//! (an aggregated API whose backend is down answers 503, which the client would retry for minutes) holds back
//! only the objects of that group: each request is bounded by [`DISCOVERY_TIMEOUT`], and a group version
//! found unavailable is not asked again for [`UNAVAILABLE_FOR`], so the rest of a release applies at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PropagationPolicy};
use kube::core::{ApiResource, GroupVersionKind};
use kube::discovery::{self, Scope as KubeScope};
use serde_json::Value;
use tracing::{debug, info, instrument, warn};
use windvane_shared::decide::desired::FIELD_MANAGER;
use windvane_shared::format::bundle::ObjectRef;

use crate::apply::plan::Scope;
use crate::{Error, Result};

/// How long one discovery request may take before its group version counts as unavailable.
pub const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a group version found unavailable is taken as such without asking the API server again.
pub const UNAVAILABLE_FOR: Duration = Duration::from_secs(30);

/// A group version whose discovery failed on the server's side, until when that answer stands, and why.
#[derive(Debug, Clone)]
struct Unavailable {
    until: Instant,
    detail: String,
}

/// A kind the API server serves: how to address it and whether it is namespaced.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub resource: ApiResource,
    pub scope: Scope,
}

/// An object as the API server wrote it: parsed, and the JSON text it came as.
#[derive(Debug)]
pub struct Written {
    pub live: Value,
    pub text: Vec<u8>,
}

/// Why an object could not be applied, with the API server's own words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyFailure {
    /// Worth retrying (conflicts, throttling, server errors, timeouts) rather than a refusal of the object.
    pub retriable: bool,
    pub message: String,
}

/// What a delete request achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deletion {
    /// The object is gone (or was gone already).
    Gone,
    /// The API server accepted the deletion, but the object is still there: it waits for its finalizers
    /// (named, when it has any in its metadata) or for its graceful termination.
    Pending { finalizers: Vec<String> },
}

/// A kind as discovery is asked for it: (`apiVersion`, `kind`).
type KindKey = (String, String);

/// A Kubernetes client with a discovery cache.
#[derive(Clone)]
pub struct Cluster {
    client: Client,
    discovered: Arc<Mutex<HashMap<KindKey, Resolved>>>,
    /// One lock per kind being discovered, so that concurrent first uses of a kind (ten Namespaces of one
    /// wave) send one discovery request, not one each.
    discovering: Arc<Mutex<HashMap<KindKey, Arc<tokio::sync::Mutex<()>>>>>,
    /// Group versions (`apiVersion`) found unavailable, by when to ask again.
    unavailable: Arc<Mutex<HashMap<String, Unavailable>>>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").finish_non_exhaustive()
    }
}

impl Cluster {
    /// Wraps a client.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            discovered: Arc::default(),
            discovering: Arc::default(),
            unavailable: Arc::default(),
        }
    }

    /// The underlying client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Resolves a kind through discovery, caching hits (misses are not cached: a CRD may land any moment). A
    /// group version that does not answer, or answers with a server error, is unavailable for
    /// [`UNAVAILABLE_FOR`]: its kinds fail at once with [`Error::GroupUnavailable`] meanwhile.
    pub async fn resolve(&self, api_version: &str, kind: &str) -> Result<Resolved> {
        let key = (api_version.to_owned(), kind.to_owned());
        if let Some(hit) = self.cached(&key) {
            return Ok(hit);
        }
        let lock = Arc::clone(
            self.discovering
                .lock()
                .expect("discovery lock map")
                .entry(key.clone())
                .or_default(),
        );
        let _discovering = lock.lock().await;
        // Whoever held the lock before may have found it.
        if let Some(hit) = self.cached(&key) {
            return Ok(hit);
        }
        if let Some(detail) = self.known_unavailable(api_version, Instant::now()) {
            return Err(group_unavailable(api_version, kind, detail));
        }
        let resolved = self.discover(api_version, kind).await?;
        self.discovered
            .lock()
            .expect("discovery cache lock")
            .insert(key, resolved.clone());
        Ok(resolved)
    }

    fn cached(&self, key: &KindKey) -> Option<Resolved> {
        self.discovered
            .lock()
            .expect("discovery cache lock")
            .get(key)
            .cloned()
    }

    /// One bounded discovery request for the kind's group version.
    async fn discover(&self, api_version: &str, kind: &str) -> Result<Resolved> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let answer = tokio::time::timeout(
            DISCOVERY_TIMEOUT,
            discovery::pinned_kind(&self.client, &gvk),
        )
        .await;
        let (resource, capabilities) = match answer {
            Ok(Ok(found)) => found,
            Ok(Err(error)) if !marks_unavailable(&error) => {
                return Err(Error::Discovery {
                    api_version: api_version.to_owned(),
                    kind: kind.to_owned(),
                    detail: api_message(&error),
                });
            }
            Ok(Err(error)) => {
                return Err(self.mark_unavailable(api_version, kind, api_message(&error)));
            }
            Err(_) => {
                let detail = format!("no answer within {}s", DISCOVERY_TIMEOUT.as_secs());
                return Err(self.mark_unavailable(api_version, kind, detail));
            }
        };
        self.mark_available(api_version);
        let scope = match capabilities.scope {
            KubeScope::Cluster => Scope::Cluster,
            KubeScope::Namespaced => Scope::Namespaced,
        };
        Ok(Resolved { resource, scope })
    }

    /// Why `api_version` is unavailable, if it was found so recently enough.
    fn known_unavailable(&self, api_version: &str, now: Instant) -> Option<String> {
        let unavailable = self.unavailable.lock().expect("unavailable groups lock");
        still_unavailable(unavailable.get(api_version), now).map(str::to_owned)
    }

    /// Records `api_version` as unavailable (logged once per [`UNAVAILABLE_FOR`]), and the error for `kind`.
    fn mark_unavailable(&self, api_version: &str, kind: &str, detail: String) -> Error {
        warn!(
            group = api_version,
            %detail,
            retry_in_s = UNAVAILABLE_FOR.as_secs(),
            "API group unavailable: discovery failed; only objects of this group are held back"
        );
        let entry = Unavailable {
            until: Instant::now() + UNAVAILABLE_FOR,
            detail: detail.clone(),
        };
        self.unavailable
            .lock()
            .expect("unavailable groups lock")
            .insert(api_version.to_owned(), entry);
        group_unavailable(api_version, kind, detail)
    }

    fn mark_available(&self, api_version: &str) {
        let mut unavailable = self.unavailable.lock().expect("unavailable groups lock");
        if unavailable.remove(api_version).is_some() {
            info!(group = api_version, "API group available again");
        }
    }

    /// Forgets every cached kind, after CRDs changed.
    pub fn refresh_discovery(&self) {
        self.discovered
            .lock()
            .expect("discovery cache lock")
            .clear();
    }

    fn api(&self, resolved: &Resolved, namespace: Option<&str>) -> Api<DynamicObject> {
        match (resolved.scope, namespace) {
            (Scope::Namespaced, Some(ns)) => {
                Api::namespaced_with(self.client.clone(), ns, &resolved.resource)
            }
            _ => Api::all_with(self.client.clone(), &resolved.resource),
        }
    }

    /// Server-side apply of `body` as manager `windvane`, taking fields over from other managers (force):
    /// the release is the source of truth for the fields it names.
    #[instrument(skip(self, resolved, body), fields(object = %id))]
    pub async fn apply(
        &self,
        id: &ObjectRef,
        resolved: &Resolved,
        body: &(impl serde::Serialize + std::fmt::Debug + Sync + ?Sized),
        dry_run: bool,
    ) -> std::result::Result<Value, ApplyFailure> {
        Ok(self.apply_written(id, resolved, body, dry_run).await?.live)
    }

    /// [`apply`](Self::apply), also returning the object as the API server's JSON text: a sync keeps that
    /// text for its live cache instead of serialising the parsed object again (on a first sync of a large
    /// release, the agent's CPU is CPU the API server does not get).
    pub async fn apply_written(
        &self,
        id: &ObjectRef,
        resolved: &Resolved,
        body: &(impl serde::Serialize + std::fmt::Debug + Sync + ?Sized),
        dry_run: bool,
    ) -> std::result::Result<Written, ApplyFailure> {
        let mut params = PatchParams::apply(FIELD_MANAGER).force();
        params.dry_run = dry_run;
        self.patch_apply_text(id, resolved, body, &params).await
    }

    /// A server-side apply sent as one request whose answer is parsed once, straight into a `Value`.
    async fn patch_apply_text(
        &self,
        id: &ObjectRef,
        resolved: &Resolved,
        body: &(impl serde::Serialize + std::fmt::Debug + Sync + ?Sized),
        params: &PatchParams,
    ) -> std::result::Result<Written, ApplyFailure> {
        let namespace = match resolved.scope {
            Scope::Namespaced => id.namespace.as_deref(),
            Scope::Cluster => None,
        };
        let url = <DynamicObject as kube::Resource>::url_path(&resolved.resource, namespace);
        let request = kube::core::Request::new(url)
            .patch(&id.name, params, &Patch::Apply(body))
            .map_err(|error| ApplyFailure {
                retriable: false,
                message: format!("building the apply request: {error}"),
            })?;
        let text = self
            .client
            .request_text(request)
            .await
            .map_err(|error| ApplyFailure {
                retriable: is_retriable(&error),
                message: api_message(&error),
            })?;
        let live = serde_json::from_str(&text).map_err(|error| ApplyFailure {
            retriable: true,
            message: format!("the API server's answer is not JSON: {error}"),
        })?;
        debug!(dry_run = params.dry_run, "applied");
        Ok(Written {
            live,
            text: text.into_bytes(),
        })
    }

    /// Server-side apply of `body` as field manager `manager`, without force: it co-owns fields at the values
    /// they have and never takes one from another manager (a conflict is an error, retriable).
    #[instrument(skip(self, resolved, body), fields(object = %id))]
    pub async fn apply_as(
        &self,
        manager: &str,
        id: &ObjectRef,
        resolved: &Resolved,
        body: &Value,
    ) -> std::result::Result<Value, ApplyFailure> {
        self.patch_apply(id, resolved, body, &PatchParams::apply(manager))
            .await
    }

    async fn patch_apply(
        &self,
        id: &ObjectRef,
        resolved: &Resolved,
        body: &(impl serde::Serialize + std::fmt::Debug + Sync + ?Sized),
        params: &PatchParams,
    ) -> std::result::Result<Value, ApplyFailure> {
        let dry_run = params.dry_run;
        let api = self.api(resolved, id.namespace.as_deref());
        match api.patch(&id.name, params, &Patch::Apply(body)).await {
            Ok(object) => {
                debug!(dry_run, "applied");
                Ok(serde_json::to_value(object).unwrap_or(Value::Null))
            }
            Err(error) => Err(ApplyFailure {
                retriable: is_retriable(&error),
                message: api_message(&error),
            }),
        }
    }

    /// A JSON merge patch of `body` as manager `windvane` (removing annotations that other managers own);
    /// returns the object as written.
    #[instrument(skip(self, resolved, body), fields(object = %id))]
    pub async fn merge_patch(
        &self,
        id: &ObjectRef,
        resolved: &Resolved,
        body: &Value,
    ) -> std::result::Result<Value, ApplyFailure> {
        let api = self.api(resolved, id.namespace.as_deref());
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        match api.patch(&id.name, &params, &Patch::Merge(body)).await {
            Ok(object) => Ok(serde_json::to_value(object).unwrap_or(Value::Null)),
            Err(error) => Err(ApplyFailure {
                retriable: is_retriable(&error),
                message: api_message(&error),
            }),
        }
    }

    /// Reads the live object; `None` when it does not exist.
    pub async fn get(&self, id: &ObjectRef, resolved: &Resolved) -> Result<Option<Value>> {
        let api = self.api(resolved, id.namespace.as_deref());
        match api.get_opt(&id.name).await {
            Ok(object) => Ok(object.map(|o| serde_json::to_value(o).unwrap_or(Value::Null))),
            Err(source) => Err(Error::Kube {
                action: format!("reading {id}"),
                source,
            }),
        }
    }

    /// Deletes an object with background propagation; already gone counts as deleted. An object that is still
    /// there after the request (finalizers, graceful termination) is [`Deletion::Pending`].
    #[instrument(skip(self, resolved), fields(object = %id))]
    pub async fn delete(&self, id: &ObjectRef, resolved: &Resolved) -> Result<Deletion> {
        let api = self.api(resolved, id.namespace.as_deref());
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..DeleteParams::default()
        };
        match api.delete(&id.name, &params).await {
            // The API server answers with the object, not a Status, while the deletion has not completed.
            Ok(answer) => Ok(match answer.left() {
                Some(object) if object.metadata.deletion_timestamp.is_some() => Deletion::Pending {
                    finalizers: object.metadata.finalizers.unwrap_or_default(),
                },
                _ => Deletion::Gone,
            }),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(Deletion::Gone),
            Err(error) => Err(Error::Prune {
                object: id.to_string(),
                detail: api_message(&error),
            }),
        }
    }
}

/// The API server's message for an error, or the error itself.
pub fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string(),
    }
}

/// The error of a kind whose group version is unavailable.
fn group_unavailable(api_version: &str, kind: &str, detail: String) -> Error {
    Error::GroupUnavailable {
        api_version: api_version.to_owned(),
        kind: kind.to_owned(),
        detail,
    }
}

/// Whether a discovery error is the group's server failing (an aggregated API whose backend is down answers
/// 503), as opposed to an answer about the kind (404: not served, perhaps not yet) or the connection to the
/// API server itself.
fn marks_unavailable(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if (500..=599).contains(&status.code))
}

/// The reason an unavailable group version stays unavailable at `now`, while its entry stands.
fn still_unavailable(entry: Option<&Unavailable>, now: Instant) -> Option<&str> {
    entry
        .filter(|entry| now < entry.until)
        .map(|entry| entry.detail.as_str())
}

fn is_retriable(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => matches!(status.code, 409 | 429 | 500..=599),
        // Transport errors and timeouts: the object may be fine; the connection was not.
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use kube::core::Status;

    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            Status::failure("service unavailable", "ServiceUnavailable").with_code(code),
        ))
    }

    #[test]
    fn server_errors_make_a_group_unavailable_but_a_missing_kind_does_not() {
        assert!(marks_unavailable(&api_error(503)));
        assert!(marks_unavailable(&api_error(500)));
        assert!(!marks_unavailable(&api_error(404)));
        assert!(!marks_unavailable(&api_error(403)));
        let missing =
            kube::Error::Discovery(kube::error::DiscoveryError::MissingKind("Widget".into()));
        assert!(!marks_unavailable(&missing));
    }

    #[test]
    fn an_unavailable_group_is_asked_again_once_its_entry_expires() {
        let now = Instant::now();
        let entry = Unavailable {
            until: now + UNAVAILABLE_FOR,
            detail: "service unavailable (503)".to_owned(),
        };
        assert_eq!(
            still_unavailable(Some(&entry), now),
            Some("service unavailable (503)")
        );
        assert_eq!(still_unavailable(Some(&entry), now + UNAVAILABLE_FOR), None);
        assert_eq!(still_unavailable(None, now), None);
    }
}
