//! The agent's hands on the cluster: discovery of kinds (cached, refreshed after CRDs land), server-side
//! apply with field manager `windvane`, deletion, and reads. Thin on purpose: what to apply and what to
//! delete is decided elsewhere (`plan`, `inventory`); this module only talks to the API server, and names the
//! object in every error.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PropagationPolicy};
use kube::core::{ApiResource, GroupVersionKind};
use kube::discovery::{self, Scope as KubeScope};
use serde_json::Value;
use tracing::{debug, instrument};
use windvane_shared::bundle::ObjectRef;
use windvane_shared::desired::FIELD_MANAGER;

use crate::plan::Scope;
use crate::{Error, Result};

/// A kind the API server serves: how to address it and whether it is namespaced.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub resource: ApiResource,
    pub scope: Scope,
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

/// A Kubernetes client with a discovery cache.
#[derive(Clone)]
pub struct Cluster {
    client: Client,
    discovered: Arc<Mutex<HashMap<(String, String), Resolved>>>,
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
        }
    }

    /// The underlying client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Resolves a kind through discovery, caching hits (misses are not cached: a CRD may land any moment).
    pub async fn resolve(&self, api_version: &str, kind: &str) -> Result<Resolved> {
        let key = (api_version.to_owned(), kind.to_owned());
        if let Some(hit) = self
            .discovered
            .lock()
            .expect("discovery cache lock")
            .get(&key)
        {
            return Ok(hit.clone());
        }
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, capabilities) =
            discovery::pinned_kind(&self.client, &gvk)
                .await
                .map_err(|e| Error::Discovery {
                    api_version: api_version.to_owned(),
                    kind: kind.to_owned(),
                    detail: api_message(&e),
                })?;
        let scope = match capabilities.scope {
            KubeScope::Cluster => Scope::Cluster,
            KubeScope::Namespaced => Scope::Namespaced,
        };
        let resolved = Resolved { resource, scope };
        self.discovered
            .lock()
            .expect("discovery cache lock")
            .insert(key, resolved.clone());
        Ok(resolved)
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
        body: &Value,
        dry_run: bool,
    ) -> std::result::Result<Value, ApplyFailure> {
        let mut params = PatchParams::apply(FIELD_MANAGER).force();
        params.dry_run = dry_run;
        self.patch_apply(id, resolved, body, &params).await
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
        body: &Value,
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

fn is_retriable(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => matches!(status.code, 409 | 429 | 500..=599),
        // Transport errors and timeouts: the object may be fine; the connection was not.
        _ => true,
    }
}
