//! The operator's allowlist: which kinds and namespaces a bundle may touch on this cluster. It is set in the
//! cluster (flags or the agent's ConfigMap), so no release can widen it; objects outside it are refused and
//! reported, and the rest of the release still applies.

use windvane_shared::bundle::ObjectRef;

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

    /// `Ok` when the object's kind may be applied, otherwise the reason. Known before discovery, so a refused
    /// kind is never looked up.
    pub fn check_kind(&self, id: &ObjectRef) -> Result<(), String> {
        let group = if id.group().is_empty() {
            "core"
        } else {
            id.group()
        };
        let kind_allowed = self
            .kinds
            .iter()
            .any(|pattern| match pattern.split_once('/') {
                None => pattern == "*" || *pattern == id.kind,
                Some((g, k)) => (g == "*" || g == group) && (k == "*" || k == id.kind),
            });
        if kind_allowed {
            Ok(())
        } else {
            Err(format!(
                "{group}/{} is not in the operator's allowed kinds ({})",
                id.kind,
                self.kinds.join(", ")
            ))
        }
    }

    /// `Ok` when the object may be applied, otherwise the reason, for the object's status. `id` must carry
    /// the object's final namespace (see [`crate::plan::place`]): a namespaced object without one would be
    /// defaulted after this check, outside it.
    pub fn check(&self, id: &ObjectRef) -> Result<(), String> {
        self.check_kind(id)?;
        // A Namespace object is governed by the namespace list too: creating it is touching that namespace.
        let namespace = if id.kind == "Namespace" && id.group().is_empty() {
            Some(&id.name)
        } else {
            id.namespace.as_ref()
        };
        if let Some(namespace) = namespace
            && !self
                .namespaces
                .iter()
                .any(|allowed| allowed == "*" || allowed == namespace)
        {
            return Err(format!(
                "namespace {namespace} is not in the operator's allowed namespaces ({})",
                self.namespaces.join(", ")
            ));
        }
        Ok(())
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
            .unwrap_err();
        assert!(err.contains("kube-system"), "{err}");
        let err = allow
            .check(&id("v1", "ConfigMap", Some("team-b"), "c"))
            .unwrap_err();
        assert!(err.contains("team-b"), "{err}");
        let err = allow
            .check(&id(
                "rbac.authorization.k8s.io/v1",
                "ClusterRole",
                None,
                "r",
            ))
            .unwrap_err();
        assert!(
            err.contains("rbac.authorization.k8s.io/ClusterRole"),
            "{err}"
        );
    }
}
