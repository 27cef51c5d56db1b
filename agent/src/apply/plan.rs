//! The apply plan: which desired objects go in which stage and wave, decided from the rendered release and
//! what discovery says about each kind's scope. Stages follow the dependency order of Kubernetes objects —
//! CRDs (then wait until Established), Namespaces (then wait until Active), other cluster-scoped objects,
//! namespaced objects — and `windvane.io/wave` orders objects within a stage. Pure: the caller resolves
//! scopes (discovery) and applies.

use std::collections::BTreeMap;

use windvane_shared::format::bundle::ObjectRef;

use crate::apply::allowlist::Allowlist;
use crate::apply::desired::Desired;

/// The namespace given to a namespaced object that names none, as `kubectl apply` would with no context.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Apply stages, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    CustomResourceDefinitions,
    Namespaces,
    ClusterScoped,
    Namespaced,
}

impl Stage {
    /// The name used in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::CustomResourceDefinitions => "crds",
            Stage::Namespaces => "namespaces",
            Stage::ClusterScoped => "cluster-scoped",
            Stage::Namespaced => "namespaced",
        }
    }
}

/// Whether a kind's objects live in a namespace, as discovery reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Cluster,
    Namespaced,
}

/// True for the kinds whose stage is known before discovery (they are needed to discover the rest).
pub fn is_crd(id: &ObjectRef) -> bool {
    id.kind == "CustomResourceDefinition" && id.group() == "apiextensions.k8s.io"
}

/// True for `v1 Namespace`.
pub fn is_namespace(id: &ObjectRef) -> bool {
    id.kind == "Namespace" && id.group().is_empty()
}

/// The stage of an object of the given scope.
pub fn stage_of(id: &ObjectRef, scope: Scope) -> Stage {
    if is_crd(id) {
        Stage::CustomResourceDefinitions
    } else if is_namespace(id) {
        Stage::Namespaces
    } else if scope == Scope::Cluster {
        Stage::ClusterScoped
    } else {
        Stage::Namespaced
    }
}

/// Makes an object's namespace agree with its kind's scope: namespaced objects without one get their app's
/// `namespace:`, or else [`DEFAULT_NAMESPACE`]; a namespace on a cluster-scoped object is an error (the API server would ignore it,
/// and the object's identity would be ambiguous).
pub fn normalize_namespace(object: &mut Desired, scope: Scope) -> crate::Result<()> {
    match (scope, object.id.namespace.is_some()) {
        (Scope::Namespaced, false) => {
            let namespace = object
                .default_namespace
                .clone()
                .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());
            object.set_namespace(&namespace);
            Ok(())
        }
        (Scope::Cluster, true) => Err(crate::Error::NamespaceOnClusterScoped {
            object: object.id.to_string(),
            kind: object.id.kind.clone(),
            namespace: object.id.namespace.clone().unwrap_or_default(),
        }),
        _ => Ok(()),
    }
}

/// Why an object has no place on this cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unplaced {
    /// Outside the operator's allowlist (under its final namespace); never sent.
    Refused(String),
    /// Its namespace contradicts its kind's scope.
    Invalid(String),
}

/// Decides where an object goes: its final namespace from its kind's scope ([`normalize_namespace`]), then
/// the operator's allowlist checked on that final identity, and its stage. The one place both happen, so no
/// object is checked under one namespace and applied in another (a namespaced object naming none is checked
/// as the `default` it lands in). Every path that sends objects (apply, `diff`) places them here.
pub fn place(object: &mut Desired, scope: Scope, allowlist: &Allowlist) -> Result<Stage, Unplaced> {
    let defaulted = scope == Scope::Namespaced && object.id.namespace.is_none();
    normalize_namespace(object, scope).map_err(|e| Unplaced::Invalid(e.to_string()))?;
    allowlist.check(&object.id).map_err(|reason| {
        let why = if defaulted {
            let landed = object.id.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE);
            format!(" (it names no namespace, so it would land in {landed})")
        } else {
            String::new()
        };
        Unplaced::Refused(format!("{reason}{why}"))
    })?;
    Ok(stage_of(&object.id, scope))
}

/// Groups the objects of one stage by wave, lowest wave first, keeping release order within a wave.
pub fn waves(objects: Vec<Desired>) -> Vec<(i64, Vec<Desired>)> {
    let mut by_wave: BTreeMap<i64, Vec<Desired>> = BTreeMap::new();
    for object in objects {
        by_wave.entry(object.wave).or_default().push(object);
    }
    by_wave.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use windvane_shared::decide::render::RenderedObject;
    use windvane_shared::format::bundle::Policy;

    use super::*;

    pub(crate) fn desired(
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        wave: i64,
    ) -> Desired {
        let mut metadata =
            json!({"name": name, "annotations": {"windvane.io/wave": wave.to_string()}});
        if let Some(ns) = namespace {
            metadata["namespace"] = json!(ns);
        }
        let object = json!({"apiVersion": api_version, "kind": kind, "metadata": metadata});
        let rendered = RenderedObject {
            app: "app".into(),
            file: "f.yaml".into(),
            document: 0,
            id: ObjectRef::of(&object).unwrap(),
            object,
        };
        Desired::of(
            windvane_shared::decide::desired::desired_object(
                "fleet",
                "app",
                &Policy::default(),
                &rendered,
            )
            .unwrap(),
        )
    }

    #[test]
    fn stages_follow_dependency_order() {
        let crd = desired(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            None,
            "widgets.example.com",
            0,
        );
        let ns = desired("v1", "Namespace", None, "team", 0);
        let role = desired(
            "rbac.authorization.k8s.io/v1",
            "ClusterRole",
            None,
            "reader",
            0,
        );
        let cm = desired("v1", "ConfigMap", Some("team"), "cfg", 0);
        assert_eq!(
            stage_of(&crd.id, Scope::Cluster),
            Stage::CustomResourceDefinitions
        );
        assert_eq!(stage_of(&ns.id, Scope::Cluster), Stage::Namespaces);
        assert_eq!(stage_of(&role.id, Scope::Cluster), Stage::ClusterScoped);
        assert_eq!(stage_of(&cm.id, Scope::Namespaced), Stage::Namespaced);
        assert!(
            Stage::CustomResourceDefinitions < Stage::Namespaces
                && Stage::ClusterScoped < Stage::Namespaced
        );
    }

    #[test]
    fn waves_order_within_a_stage_and_keep_release_order() {
        let objects = vec![
            desired("v1", "ConfigMap", Some("a"), "late", 5),
            desired("v1", "ConfigMap", Some("a"), "first", -1),
            desired("v1", "ConfigMap", Some("a"), "default-1", 0),
            desired("v1", "ConfigMap", Some("a"), "default-2", 0),
        ];
        let names: Vec<(i64, Vec<String>)> = waves(objects)
            .into_iter()
            .map(|(wave, objects)| (wave, objects.into_iter().map(|o| o.id.name).collect()))
            .collect();
        assert_eq!(
            names,
            vec![
                (-1, vec!["first".to_owned()]),
                (0, vec!["default-1".to_owned(), "default-2".to_owned()]),
                (5, vec!["late".to_owned()])
            ]
        );
    }

    /// With narrowed namespaces, a cluster-scoped kind needs naming ([`Allowlist`]).
    const CLUSTER_ROLE_REFUSED: &str = "rbac.authorization.k8s.io/ClusterRole is cluster-scoped and the operator \
        allows only namespaces team-a: it applies only when --allow-kinds (allowKinds) names it, e.g. \
        rbac.authorization.k8s.io/ClusterRole";

    #[test]
    fn the_allowlist_judges_the_final_namespace() {
        let team_a = Allowlist::new(Vec::new(), vec!["team-a".into()]);
        // (object, scope) → outcome: the namespace each object really lands in decides.
        // Placed: the stage and final namespace; refused: the reason.
        type Expected = Result<(Stage, Option<&'static str>), &'static str>;
        let in_app_namespace = |kind: &str, namespace: &str, api: &str| {
            let mut object = desired(api, kind, None, "from-app", 0);
            object.default_namespace = Some(namespace.to_owned());
            object
        };
        let cases: [(Desired, Scope, Expected); 9] = [
            (
                in_app_namespace("ConfigMap", "team-a", "v1"),
                Scope::Namespaced,
                Ok((Stage::Namespaced, Some("team-a"))),
            ),
            (
                in_app_namespace("ConfigMap", "team-b", "v1"),
                Scope::Namespaced,
                Err(
                    "namespace team-b is not in the operator's allowed namespaces (team-a) (it names no namespace, so it would land in team-b)",
                ),
            ),
            (
                in_app_namespace("ClusterRole", "team-a", "rbac.authorization.k8s.io/v1"),
                Scope::Cluster,
                Err(CLUSTER_ROLE_REFUSED),
            ),
            (
                desired("v1", "ConfigMap", Some("team-a"), "in", 0),
                Scope::Namespaced,
                Ok((Stage::Namespaced, Some("team-a"))),
            ),
            (
                desired("v1", "ConfigMap", None, "unnamed", 0),
                Scope::Namespaced,
                Err(
                    "namespace default is not in the operator's allowed namespaces (team-a) (it names no namespace, so it would land in default)",
                ),
            ),
            (
                desired("v1", "ConfigMap", Some("team-b"), "out", 0),
                Scope::Namespaced,
                Err("namespace team-b is not in the operator's allowed namespaces (team-a)"),
            ),
            (
                desired("rbac.authorization.k8s.io/v1", "ClusterRole", None, "r", 0),
                Scope::Cluster,
                Err(CLUSTER_ROLE_REFUSED),
            ),
            (
                desired("v1", "Namespace", None, "team-a", 0),
                Scope::Cluster,
                Ok((Stage::Namespaces, None)),
            ),
            (
                desired("v1", "Namespace", None, "kube-system", 0),
                Scope::Cluster,
                Err("namespace kube-system is not in the operator's allowed namespaces (team-a)"),
            ),
        ];
        for (mut object, scope, expected) in cases {
            let name = object.id.to_string();
            let placed = place(&mut object, scope, &team_a);
            match expected {
                Ok((stage, namespace)) => {
                    assert_eq!(placed, Ok(stage), "{name}");
                    assert_eq!(object.id.namespace.as_deref(), namespace, "{name}");
                }
                Err(message) => {
                    assert_eq!(placed, Err(Unplaced::Refused(message.into())), "{name}")
                }
            }
        }
        // Everything allowed: the unnamed object is placed in default, body and identity alike.
        let mut unnamed = desired("v1", "ConfigMap", None, "unnamed", 0);
        assert_eq!(
            place(&mut unnamed, Scope::Namespaced, &Allowlist::default()),
            Ok(Stage::Namespaced)
        );
        assert_eq!(
            unnamed.body().pointer("/metadata/namespace"),
            Some(&json!("default"))
        );
        let mut role = desired(
            "rbac.authorization.k8s.io/v1",
            "ClusterRole",
            Some("x"),
            "r",
            0,
        );
        assert!(matches!(
            place(&mut role, Scope::Cluster, &team_a),
            Err(Unplaced::Invalid(message)) if message.contains("cluster-scoped")
        ));
    }

    #[test]
    fn namespaces_follow_scope() {
        let mut cm = desired("v1", "ConfigMap", None, "cfg", 0);
        normalize_namespace(&mut cm, Scope::Namespaced).unwrap();
        assert_eq!(cm.id.namespace.as_deref(), Some("default"));
        assert_eq!(
            cm.body().pointer("/metadata/namespace"),
            Some(&json!("default"))
        );
        let mut role = desired(
            "rbac.authorization.k8s.io/v1",
            "ClusterRole",
            Some("x"),
            "r",
            0,
        );
        assert!(
            normalize_namespace(&mut role, Scope::Cluster)
                .unwrap_err()
                .to_string()
                .contains("cluster-scoped")
        );
    }
}
