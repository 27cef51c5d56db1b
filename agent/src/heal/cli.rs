//! `windvane-agent heal --object KIND/NS/NAME`: asks the running agent to revert one object's alert-only
//! drift once, by writing `windvane.io/revert=now` on it (the agent does the revert and records who asked).
//! The field manager of that write is `windvane-heal:<user>`, the caller's authenticated user name from a
//! SelfSubjectReview, so the drift record names the person. The object reference is parsed purely here;
//! the writes are thin.

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::{Discovery, Scope};

use crate::heal::revert_request::REVERT_ANNOTATION;
use crate::{Error, Result};

/// An object as `KIND/NAMESPACE/NAME` (namespaced) or `KIND/NAME` (cluster-scoped) names it; `KIND` may be
/// `group/Kind`-qualified as `Kind.group` (`Deployment.apps`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectArg {
    pub kind: String,
    pub group: Option<String>,
    pub namespace: Option<String>,
    pub name: String,
}

/// Parses `--object`.
pub fn parse_object(text: &str) -> Result<ObjectArg> {
    let parts: Vec<&str> = text.split('/').collect();
    let bad = || {
        Error::Config(format!(
            "--object {text:?}: use KIND/NAMESPACE/NAME, or KIND/NAME for a cluster-scoped object (KIND may be Kind.group)"
        ))
    };
    if parts.iter().any(|p| p.is_empty()) {
        return Err(bad());
    }
    let (kind, namespace, name) = match parts.as_slice() {
        [kind, namespace, name] => (*kind, Some((*namespace).to_owned()), *name),
        [kind, name] => (*kind, None, *name),
        _ => return Err(bad()),
    };
    let (kind, group) = match kind.split_once('.') {
        Some((kind, group)) => (kind, Some(group.to_owned())),
        None => (kind, None),
    };
    Ok(ObjectArg {
        kind: kind.to_owned(),
        group,
        namespace,
        name: name.to_owned(),
    })
}

/// The field manager that records who asked.
pub fn field_manager(user: &str) -> String {
    let manager = format!("windvane-heal:{user}");
    manager.chars().take(128).collect()
}

/// Writes the revert request on the object; returns the field manager it was written as.
pub async fn request(client: kube::Client, object: &ObjectArg) -> Result<String> {
    let kube_error = |action: String| move |source| Error::Kube { action, source };
    let review: SelfSubjectReview = serde_json::from_value(serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"
    }))
    .map_err(|e| Error::Config(e.to_string()))?;
    let user = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(kube_error(
            "asking who you are (SelfSubjectReview)".to_owned(),
        ))?
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .unwrap_or_else(|| "unknown".to_owned());
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .map_err(kube_error("discovering the API's kinds".to_owned()))?;
    let (resource, capabilities) = discovery
        .groups()
        .filter(|g| object.group.as_deref().is_none_or(|want| g.name() == want))
        .find_map(|g| {
            g.recommended_resources()
                .into_iter()
                .find(|(r, _)| r.kind == object.kind)
        })
        .ok_or_else(|| {
            Error::Config(format!(
                "--object: the API server serves no kind {}",
                object.kind
            ))
        })?;
    let api: Api<DynamicObject> = match (&capabilities.scope, &object.namespace) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client, ns, &resource),
        (Scope::Cluster, None) => Api::all_with(client, &resource),
        (Scope::Namespaced, None) => {
            return Err(Error::Config(format!(
                "--object: {} is namespaced: use KIND/NAMESPACE/NAME",
                object.kind
            )));
        }
        (Scope::Cluster, Some(_)) => {
            return Err(Error::Config(format!(
                "--object: {} is cluster-scoped: use KIND/NAME",
                object.kind
            )));
        }
    };
    let manager = field_manager(&user);
    let params = PatchParams {
        field_manager: Some(manager.clone()),
        ..PatchParams::default()
    };
    let patch = serde_json::json!({"metadata": {"annotations": {REVERT_ANNOTATION: "now"}}});
    api.patch(&object.name, &params, &Patch::Merge(&patch))
        .await
        .map_err(kube_error(format!(
            "annotating {} {}",
            object.kind, object.name
        )))?;
    Ok(manager)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_kind_namespace_name_or_kind_name() {
        assert_eq!(
            parse_object("Deployment.apps/shop/web").unwrap(),
            ObjectArg {
                kind: "Deployment".into(),
                group: Some("apps".into()),
                namespace: Some("shop".into()),
                name: "web".into()
            }
        );
        let cluster_scoped = parse_object("ClusterRole/viewers").unwrap();
        assert_eq!(
            (cluster_scoped.namespace, cluster_scoped.group),
            (None, None)
        );
        for bad in ["web", "a/b/c/d", "Deployment//web", ""] {
            let error = parse_object(bad).unwrap_err().to_string();
            assert!(error.contains("KIND/NAMESPACE/NAME"), "{bad}: {error}");
        }
    }

    #[test]
    fn the_field_manager_names_the_user_within_the_limit() {
        assert_eq!(field_manager("alice"), "windvane-heal:alice");
        assert_eq!(field_manager(&"x".repeat(300)).chars().count(), 128);
    }
}
