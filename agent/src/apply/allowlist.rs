//! The operator's allowlist: which kinds and namespaces a bundle may touch on this cluster. It is set in the
//! cluster (flags or the agent's ConfigMap), so no release can widen it; objects outside it are refused and
//! reported, and the rest of the release still applies.
//!
//! Cluster-scoped objects live in no namespace, so a namespace list alone would not hold them back: a
//! release confined to `team-a` could still bind `cluster-admin` with a ClusterRoleBinding. So once the
//! operator narrows the namespaces, a cluster-scoped object applies only when the kinds list names its kind
//! (`group/Kind`, `Kind`, or its group `group/*`); `*` alone no longer covers them. Refusing is the safe
//! reading of "only these namespaces": an operator who wants cluster-wide objects too says which, and the
//! refusal names the flag to do it with. Namespace objects stay governed by the namespace list.

use crate::{Error, Result};
use windvane_shared::format::bundle::ObjectRef;

/// Kinds and namespaces the agent may apply. `*` allows everything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowlist {
    /// `*`, `Kind` (any group), `group/Kind`, or `group/*`; the core group is written `core/Kind` or `Kind`.
    kinds: Vec<String>,
    /// Namespace names, or `*`.
    namespaces: Vec<String>,
}

impl Default for Allowlist {
    fn default() -> Self {
        Self {
            kinds: vec!["*".into()],
            namespaces: vec!["*".into()],
        }
    }
}

impl Allowlist {
    /// An allowlist from the operator's patterns; empty lists mean "everything".
    pub fn new(kinds: Vec<String>, namespaces: Vec<String>) -> Self {
        let or_all = |list: Vec<String>| {
            if list.is_empty() {
                vec!["*".to_owned()]
            } else {
                list
            }
        };
        Self {
            kinds: or_all(kinds),
            namespaces: or_all(namespaces),
        }
    }

    /// Whether the operator narrowed the namespaces (no `*` among them).
    pub fn namespaces_narrowed(&self) -> bool {
        !self.namespaces.iter().any(|n| n == "*")
    }

    /// What the allowlist lets through that a reader of the flags might not expect, for the start-up log:
    /// with narrowed namespaces, which cluster-scoped kinds still apply. `None` when nothing is narrowed.
    pub fn describe_cluster_scope(&self) -> Option<String> {
        if !self.namespaces_narrowed() {
            return None;
        }
        let named: Vec<&str> = self
            .kinds
            .iter()
            .map(String::as_str)
            .filter(|p| !is_wildcard(p))
            .collect();
        Some(if named.is_empty() {
            format!(
                "only namespaces {} are allowed: cluster-scoped objects (ClusterRoles, ClusterRoleBindings, CRDs, \
                 webhooks, …) are refused; name a kind in --allow-kinds to allow it",
                self.namespaces.join(", ")
            )
        } else {
            format!(
                "only namespaces {} are allowed: cluster-scoped objects are refused unless --allow-kinds names \
                 their kind ({})",
                self.namespaces.join(", "),
                named.join(", ")
            )
        })
    }

    /// `Ok` when the object's kind may be applied, otherwise the reason. Known before discovery, so a refused
    /// kind is never looked up.
    pub fn check_kind(&self, id: &ObjectRef) -> Result<()> {
        let group = group_of(id);
        let kind_allowed = self
            .kinds
            .iter()
            .any(|p| pattern_matches(p, group, &id.kind));
        if kind_allowed {
            Ok(())
        } else {
            Err(not_allowed(
                id,
                format!(
                    "{group}/{} is not in the operator's allowed kinds ({})",
                    id.kind,
                    self.kinds.join(", ")
                ),
            ))
        }
    }

    /// `Ok` when the object may be applied, otherwise the reason, for the object's status. `id` must carry
    /// the object's final namespace (see [`crate::apply::plan::place`]): a namespaced object without one would be
    /// defaulted after this check, outside it.
    pub fn check(&self, id: &ObjectRef) -> Result<()> {
        self.check_kind(id)?;
        // A Namespace object is governed by the namespace list too: creating it is touching that namespace.
        let is_namespace = id.kind == "Namespace" && id.group().is_empty();
        let namespace = if is_namespace {
            Some(&id.name)
        } else {
            id.namespace.as_ref()
        };
        if namespace.is_none() && self.namespaces_narrowed() {
            self.check_cluster_scoped(id)?;
        }
        if let Some(namespace) = namespace
            && !self
                .namespaces
                .iter()
                .any(|allowed| allowed == "*" || allowed == namespace)
        {
            return Err(not_allowed(
                id,
                format!(
                    "namespace {namespace} is not in the operator's allowed namespaces ({})",
                    self.namespaces.join(", ")
                ),
            ));
        }
        Ok(())
    }
}

impl Allowlist {
    /// With narrowed namespaces, a cluster-scoped object needs its kind named in the kinds list.
    fn check_cluster_scoped(&self, id: &ObjectRef) -> Result<()> {
        let group = group_of(id);
        let named = self
            .kinds
            .iter()
            .filter(|p| !is_wildcard(p))
            .any(|p| pattern_matches(p, group, &id.kind));
        if named {
            return Ok(());
        }
        Err(not_allowed(
            id,
            format!(
                "{group}/{kind} is cluster-scoped and the operator allows only namespaces {namespaces}: it applies \
                 only when --allow-kinds (allowKinds) names it, e.g. {group}/{kind}",
                kind = id.kind,
                namespaces = self.namespaces.join(", ")
            ),
        ))
    }
}

/// The refusal of `id`, with why.
fn not_allowed(id: &ObjectRef, reason: String) -> Error {
    Error::NotAllowed {
        object: id.to_string(),
        reason,
    }
}

/// The object's API group, `core` for the core group.
fn group_of(id: &ObjectRef) -> &str {
    if id.group().is_empty() {
        "core"
    } else {
        id.group()
    }
}

/// A kinds pattern that names no group and no kind: `*` or `*/*`.
fn is_wildcard(pattern: &str) -> bool {
    matches!(pattern, "*" | "*/*")
}

/// Whether a kinds pattern (`*`, `Kind`, `group/Kind`, `group/*`, `*/Kind`) matches `group`/`kind`.
fn pattern_matches(pattern: &str, group: &str, kind: &str) -> bool {
    match pattern.split_once('/') {
        None => pattern == "*" || pattern == kind,
        Some((g, k)) => (g == "*" || g == group) && (k == "*" || k == kind),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> ObjectRef {
        ObjectRef {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: namespace.map(Into::into),
            name: name.into(),
        }
    }

    #[test]
    fn default_allows_everything() {
        assert!(
            Allowlist::default()
                .check(&id(
                    "rbac.authorization.k8s.io/v1",
                    "ClusterRole",
                    None,
                    "x"
                ))
                .is_ok()
        );
    }

    #[test]
    fn kinds_and_namespaces_narrow_what_applies() {
        let allow = Allowlist::new(
            vec!["ConfigMap".into(), "apps/*".into(), "core/Namespace".into()],
            vec!["team-a".into()],
        );
        assert!(
            allow
                .check(&id("v1", "ConfigMap", Some("team-a"), "c"))
                .is_ok()
        );
        assert!(
            allow
                .check(&id("apps/v1", "Deployment", Some("team-a"), "d"))
                .is_ok()
        );
        assert!(allow.check(&id("v1", "Namespace", None, "team-a")).is_ok());
        let err = allow
            .check(&id("v1", "Namespace", None, "kube-system"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("kube-system"), "{err}");
        let err = allow
            .check(&id("v1", "ConfigMap", Some("team-b"), "c"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("team-b"), "{err}");
        let err = allow
            .check(&id(
                "rbac.authorization.k8s.io/v1",
                "ClusterRole",
                None,
                "r",
            ))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("rbac.authorization.k8s.io/ClusterRole"),
            "{err}"
        );
    }

    #[test]
    fn narrowed_namespaces_refuse_cluster_scoped_kinds_not_named_in_the_kinds() {
        let binding = id(
            "rbac.authorization.k8s.io/v1",
            "ClusterRoleBinding",
            None,
            "admin",
        );
        let crd = id(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            None,
            "x",
        );
        let only_team_a = Allowlist::new(Vec::new(), vec!["team-a".into()]);
        let err = only_team_a.check(&binding).unwrap_err().to_string();
        assert_eq!(
            err,
            "rbac.authorization.k8s.io/ClusterRoleBinding is cluster-scoped and the operator allows only \
             namespaces team-a: it applies only when --allow-kinds (allowKinds) names it, e.g. \
             rbac.authorization.k8s.io/ClusterRoleBinding"
        );
        assert!(
            only_team_a
                .check(&id("v1", "Namespace", None, "team-a"))
                .is_ok()
        );
        assert!(
            only_team_a
                .check(&id("v1", "ConfigMap", Some("team-a"), "c"))
                .is_ok()
        );

        // `*` and `*/*` name nothing; a kind, a group, or `*/Kind` does.
        for kinds in [vec!["*"], vec!["*/*"]] {
            let allow = Allowlist::new(
                kinds.into_iter().map(str::to_owned).collect(),
                vec!["team-a".into()],
            );
            assert!(allow.check(&binding).is_err());
        }
        for named in [
            "rbac.authorization.k8s.io/ClusterRoleBinding",
            "ClusterRoleBinding",
            "rbac.authorization.k8s.io/*",
            "*/ClusterRoleBinding",
        ] {
            let allow = Allowlist::new(vec!["*".into(), named.into()], vec!["team-a".into()]);
            assert!(allow.check(&binding).is_ok(), "{named}");
            assert!(allow.check(&crd).is_err(), "{named} names only bindings");
        }

        // Without narrowed namespaces nothing changes.
        assert!(Allowlist::default().check(&binding).is_ok());
        assert!(
            Allowlist::new(Vec::new(), vec!["team-a".into(), "*".into()])
                .check(&binding)
                .is_ok()
        );
    }

    #[test]
    fn the_start_up_line_says_which_cluster_scoped_kinds_still_apply() {
        assert_eq!(Allowlist::default().describe_cluster_scope(), None);
        let none = Allowlist::new(Vec::new(), vec!["team-a".into()])
            .describe_cluster_scope()
            .expect("narrowed");
        assert!(
            none.contains("cluster-scoped objects (ClusterRoles"),
            "{none}"
        );
        let some = Allowlist::new(
            vec!["*".into(), "rbac.authorization.k8s.io/ClusterRole".into()],
            vec!["team-a".into(), "team-b".into()],
        )
        .describe_cluster_scope()
        .expect("narrowed");
        assert!(
            some.contains("team-a, team-b")
                && some.contains(
                    "unless --allow-kinds names their kind (rbac.authorization.k8s.io/ClusterRole)"
                ),
            "{some}"
        );
    }
}
