//! The bundle: the unrendered desired state of a whole fleet, as `windvane build` writes it and agents read
//! it (after [`crate::format::release`] has checked its digest against a signed pointer). It is plain JSON so that any
//! static host can serve it; every agent renders its own share ([`crate::decide::render`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::spec::selector::LabelSelector;
use crate::{Error, Result};

/// The `apiVersion` written into every bundle, so that a future format can be told apart.
pub const BUNDLE_API_VERSION: &str = "windvane.io/bundle/v1";

/// Caps on what a bundle may hold, so that a hostile or mistaken bundle cannot exhaust an agent.
#[derive(Debug, Clone, Copy)]
pub struct BundleLimits {
    pub max_apps: usize,
    pub max_objects: usize,
}

impl Default for BundleLimits {
    fn default() -> Self {
        Self {
            max_apps: 1_000,
            max_objects: 20_000,
        }
    }
}

/// A fleet's whole desired state: its apps with their unrendered manifests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Bundle {
    pub api_version: String,
    pub fleet: String,
    pub apps: Vec<App>,
    /// `fleet.yaml`'s `rollout:` section; `windvane publish` copies it into the signed pointer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<crate::spec::rollout::Rollout>,
}

/// One app of a fleet: which clusters get it, with which values, under which policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct App {
    pub name: String,
    /// Clusters whose labels match get this app. An empty selector matches every cluster.
    #[serde(default)]
    pub selector: LabelSelector,
    #[serde(default)]
    pub values: Map<String, Value>,
    /// Applied in order over `values` for clusters that match their selector.
    #[serde(default)]
    pub customizations: Vec<Customization>,
    #[serde(default)]
    pub policy: Policy,
    /// The namespace every namespaced object that names none goes into (instead of `default`); objects
    /// that name one keep it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Whether the app also creates its `namespace` (as a Namespace object of the app, staged first).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub create_namespace: bool,
    /// Whether `${cluster.…}` and `${values.…}` are filled in; `substitute: false` in `fleet.yaml` sends the
    /// app's manifests exactly as written (left out of the bundle when true, so existing digests hold).
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub substitute: bool,
    /// Apps of the fleet this app is applied after, once they are applied and healthy on the cluster
    /// (`dependsOn:`; validated at build time to name existing apps without a cycle).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// Maintenance windows (`windows:`): when a release that changes this app may be applied, and whether
    /// drift is healed inside a deny window ([`crate::spec::window`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<crate::spec::window::Window>,
    /// The manifests of an app read from files; empty for an app that an engine rendered (`rendered`).
    pub manifests: Vec<Manifest>,
    /// For a Helm chart or kustomization: what the engine wrote at build time, once per combination of the
    /// customizations that change its input. Left out for plain apps, so their digests hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rendered: Option<Rendered>,
}

/// An app rendered by an engine (Helm, kustomize) at build time. A cluster gets the [`Variant`] whose
/// combinations hold the set of `customizations` its labels match; every other customization only changes
/// `${values.…}`, as for a plain app.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rendered {
    /// `helm` or `kustomize`.
    pub engine: String,
    /// What was rendered, pinned: chart name, version and digest, or the kustomization's directory.
    pub source: BTreeMap<String, String>,
    /// Indices into the app's customizations of those that change the engine's input (Helm values, another
    /// kustomize directory), ascending.
    pub customizations: Vec<usize>,
    /// Distinct outputs; together their combinations are every subset of `customizations`, each once.
    pub variants: Vec<Variant>,
}

/// One distinct output of an engine, and which clusters get it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Variant {
    /// The sets of render-changing customizations (ascending indices) a cluster may match to get this one.
    pub combinations: Vec<Vec<usize>>,
    pub manifests: Vec<Manifest>,
}

/// Most customizations of one app that may change an engine's input: each doubles what must be rendered.
pub const MAX_RENDER_CUSTOMIZATIONS: usize = 10;

/// Values that override an app's values for the clusters matching `selector`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Customization {
    #[serde(default)]
    pub selector: LabelSelector,
    #[serde(default)]
    pub values: Map<String, Value>,
}

/// How the agent treats an app's objects.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Policy {
    /// Revert drift (true) or only report it (false).
    #[serde(default = "default_true")]
    pub self_heal: bool,
    /// Delete objects that leave the release (opt-in).
    #[serde(default)]
    pub prune: bool,
    /// Wait this long before reverting drift; `None` reverts at once.
    #[serde(
        default,
        with = "crate::text::duration::serde_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub drift_grace_period: Option<Duration>,
    /// Fields that belong to someone else (an HPA's `/spec/replicas`): never sent, so never owned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignore_differences: Vec<IgnoreDifference>,
    /// Refuse changes to the fields Windvane owns at admission (a ValidatingAdmissionPolicy the agent keeps),
    /// except by the agent and the break-glass path.
    #[serde(default, skip_serializing_if = "is_false")]
    pub prevent: bool,
}

fn is_false(value: &bool) -> bool {
    !*value
}

fn is_true(value: &bool) -> bool {
    *value
}

fn default_true() -> bool {
    true
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            self_heal: true,
            prune: false,
            drift_grace_period: None,
            ignore_differences: Vec::new(),
            prevent: false,
        }
    }
}

/// Fields of matching objects that Windvane leaves to others.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IgnoreDifference {
    /// API group; empty for the core group.
    #[serde(default)]
    pub group: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// RFC 6901 pointers into the object, e.g. `/spec/replicas`.
    pub json_pointers: Vec<String>,
}

impl IgnoreDifference {
    /// True when this entry applies to `object`.
    pub fn matches(&self, object: &ObjectRef) -> bool {
        self.group == object.group()
            && self.kind == object.kind
            && self.name.as_ref().is_none_or(|n| *n == object.name)
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| Some(ns) == object.namespace.as_ref())
    }
}

/// One object of an app as written in the source tree, before rendering.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Manifest {
    /// Path of the source file, relative to the fleet root (`apps/api/deployment.yaml`).
    pub file: String,
    /// Index of the document within a multi-document file, from 0.
    pub document: usize,
    pub object: Value,
}

/// The identity of a Kubernetes object: `kind ns/name` in messages.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectRef {
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectRef {
    /// Reads apiVersion, kind, metadata.name and metadata.namespace; `None` when any required one is missing
    /// or not a string.
    pub fn of(object: &Value) -> Option<Self> {
        let text = |v: Option<&Value>| {
            v.and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        let metadata = object.get("metadata");
        Some(Self {
            api_version: text(object.get("apiVersion"))?,
            kind: text(object.get("kind"))?,
            name: text(metadata.and_then(|m| m.get("name")))?,
            namespace: text(metadata.and_then(|m| m.get("namespace"))),
        })
    }

    /// The API group: the part of apiVersion before `/`, empty for the core group.
    pub fn group(&self) -> &str {
        self.api_version
            .rsplit_once('/')
            .map_or("", |(group, _)| group)
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {}/{}", self.kind, ns, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// Checks that a manifest document is a Kubernetes object: a mapping with string `apiVersion`, `kind` and
/// `metadata.name`. Returns its identity.
pub fn check_manifest_object(file: &str, document: usize, object: &Value) -> Result<ObjectRef> {
    let fail = |detail: &str| Error::Manifest {
        file: file.to_owned(),
        document,
        detail: detail.to_owned(),
    };
    let map = object
        .as_object()
        .ok_or_else(|| fail("not a mapping; a manifest must be a Kubernetes object"))?;
    for field in ["apiVersion", "kind"] {
        match map.get(field) {
            Some(Value::String(s)) if !s.is_empty() => {}
            Some(_) => return Err(fail(&format!("{field} must be a non-empty string"))),
            None => return Err(fail(&format!("missing {field}"))),
        }
    }
    let metadata = map
        .get("metadata")
        .ok_or_else(|| fail("missing metadata"))?;
    let metadata = metadata
        .as_object()
        .ok_or_else(|| fail("metadata must be a mapping"))?;
    match metadata.get("name") {
        Some(Value::String(s)) if !s.is_empty() => {}
        Some(_) => return Err(fail("metadata.name must be a non-empty string")),
        None if metadata.contains_key("generateName") => {
            return Err(fail(
                "metadata.generateName is not supported: a declarative object needs metadata.name",
            ));
        }
        None => return Err(fail("missing metadata.name")),
    }
    if let Some(ns) = metadata.get("namespace")
        && !ns.is_string()
    {
        return Err(fail("metadata.namespace must be a string"));
    }
    ObjectRef::of(object)
        .ok_or_else(|| fail("apiVersion, kind and metadata.name must be non-empty strings"))
}

/// Checks that `pointer`, in `app`'s `ignoreDifferences`, is an RFC 6901 JSON pointer: `/`-separated tokens
/// where `~` is only followed by `0` or `1` (and not empty: the whole object cannot be ignored).
pub fn check_json_pointer(app: &str, pointer: &str) -> Result<()> {
    let invalid = |detail: &'static str| Error::InvalidPointer {
        app: app.to_owned(),
        pointer: pointer.to_owned(),
        detail: detail.to_owned(),
    };
    if pointer.is_empty() {
        return Err(invalid(
            "the whole object cannot be ignored; name a field such as /spec/replicas",
        ));
    }
    if !pointer.starts_with('/') {
        return Err(invalid("must start with '/'"));
    }
    let mut chars = pointer.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return Err(invalid(
                "'~' must be followed by 0 or 1 (~0 is '~', ~1 is '/')",
            ));
        }
    }
    Ok(())
}

impl Bundle {
    /// Parses and validates bundle JSON (its digest has already been checked by [`crate::format::release`]).
    pub fn from_json_slice(bytes: &[u8], limits: BundleLimits) -> Result<Self> {
        let bundle: Bundle = serde_json::from_slice(bytes).map_err(|e| Error::Malformed {
            what: "bundle",
            detail: e.to_string(),
        })?;
        bundle.validate(limits)?;
        Ok(bundle)
    }

    /// The canonical bytes that are published and whose SHA-256 names the bundle.
    pub fn to_json_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a bundle is always serializable")
    }

    /// Checks the invariants that `windvane build` guarantees, again, on the agent's side.
    pub fn validate(&self, limits: BundleLimits) -> Result<()> {
        if self.api_version != BUNDLE_API_VERSION {
            return Err(Error::Malformed {
                what: "bundle",
                detail: format!(
                    "apiVersion {:?}, expected {BUNDLE_API_VERSION:?}",
                    self.api_version
                ),
            });
        }
        if self.apps.len() > limits.max_apps {
            return Err(Error::TooMany {
                what: "apps",
                found: self.apps.len(),
                limit: limits.max_apps,
            });
        }
        let objects: usize = self.apps.iter().map(App::object_count).sum();
        if objects > limits.max_objects {
            return Err(Error::TooMany {
                what: "objects",
                found: objects,
                limit: limits.max_objects,
            });
        }
        let mut app_names = HashMap::new();
        for app in &self.apps {
            if app.name.is_empty() {
                return Err(Error::Malformed {
                    what: "bundle",
                    detail: "an app has an empty name".to_owned(),
                });
            }
            if app_names.insert(app.name.as_str(), ()).is_some() {
                return Err(Error::Malformed {
                    what: "bundle",
                    detail: format!("app {:?} appears twice", app.name),
                });
            }
            app.validate()?;
        }
        Ok(())
    }
}

impl App {
    /// Every manifest the app carries: its own, plus every variant's for an engine-rendered app.
    pub fn object_count(&self) -> usize {
        let variants = self.rendered.as_ref().map_or(0, |rendered| {
            rendered.variants.iter().map(|v| v.manifests.len()).sum()
        });
        self.manifests.len() + variants
    }

    /// The manifests a cluster with these labels gets: the app's own, or the variant for the render-changing
    /// customizations the labels match.
    pub fn manifests_for(&self, labels: &crate::spec::selector::Labels) -> Result<&[Manifest]> {
        Ok(match (self.variant_for(labels)?, &self.rendered) {
            (Some(index), Some(rendered)) => &rendered.variants[index].manifests,
            _ => &self.manifests,
        })
    }

    /// [`App::manifests_for`], moved out of the app (which keeps none of its manifests or variants after).
    pub fn take_manifests_for(
        &mut self,
        labels: &crate::spec::selector::Labels,
    ) -> Result<Vec<Manifest>> {
        let variant = self.variant_for(labels)?;
        let rendered = self
            .rendered
            .as_mut()
            .map(|r| std::mem::take(&mut r.variants));
        Ok(match (variant, rendered) {
            (Some(index), Some(mut variants)) => variants.swap_remove(index).manifests,
            _ => std::mem::take(&mut self.manifests),
        })
    }

    /// The index of the variant a cluster with these labels gets; `None` for an app no engine rendered.
    fn variant_for(&self, labels: &crate::spec::selector::Labels) -> Result<Option<usize>> {
        let Some(rendered) = &self.rendered else {
            return Ok(None);
        };
        let matched: Vec<usize> = rendered
            .customizations
            .iter()
            .copied()
            .filter(|&i| {
                self.customizations
                    .get(i)
                    .is_some_and(|c| c.selector.matches(labels))
            })
            .collect();
        rendered
            .variants
            .iter()
            .position(|variant| variant.combinations.contains(&matched))
            .map(Some)
            .ok_or_else(|| Error::NoVariant {
                app: self.name.clone(),
                customizations: matched,
            })
    }

    /// Every set of manifests a cluster may get: the app's own, or each variant's.
    pub fn manifest_sets(&self) -> Vec<&[Manifest]> {
        match &self.rendered {
            None => vec![&self.manifests],
            Some(rendered) => rendered
                .variants
                .iter()
                .map(|v| v.manifests.as_slice())
                .collect(),
        }
    }

    /// Checks selectors, pointers and manifests, and that no object is defined twice.
    pub fn validate(&self) -> Result<()> {
        let context = format!("app {}", self.name);
        self.selector.validate(&context)?;
        let invalid_namespace = |detail: String| Error::InvalidNamespace {
            app: self.name.clone(),
            detail,
        };
        match &self.namespace {
            Some(namespace) => {
                check_name(namespace).map_err(|error| invalid_namespace(error.to_string()))?
            }
            None if self.create_namespace => Err(invalid_namespace(
                "createNamespace: true needs a namespace: to create".to_owned(),
            ))?,
            None => {}
        }
        for customization in &self.customizations {
            customization
                .selector
                .validate(&format!("{context} customization"))?;
        }
        for ignore in &self.policy.ignore_differences {
            for pointer in &ignore.json_pointers {
                check_json_pointer(&self.name, pointer)?;
            }
        }
        if let Some(rendered) = &self.rendered {
            self.check_rendered(rendered)?;
        }
        for manifests in self.manifest_sets() {
            self.check_manifests(manifests)?;
        }
        Ok(())
    }

    /// An engine-rendered app: no manifests of its own, and every subset of its render-changing
    /// customizations leads to exactly one variant, so that every cluster finds its rendering.
    fn check_rendered(&self, rendered: &Rendered) -> Result<()> {
        let malformed = |detail: String| Error::Malformed {
            what: "bundle",
            detail: format!("app {}: {detail}", self.name),
        };
        if !self.manifests.is_empty() {
            return Err(malformed(
                "an engine-rendered app carries manifests of its own".to_owned(),
            ));
        }
        let indices = &rendered.customizations;
        if indices.len() > MAX_RENDER_CUSTOMIZATIONS
            || indices.windows(2).any(|w| w[0] >= w[1])
            || indices.iter().any(|&i| i >= self.customizations.len())
        {
            return Err(malformed(format!(
                "render customizations {indices:?} must be ascending indices of its customizations, at most {MAX_RENDER_CUSTOMIZATIONS}"
            )));
        }
        let mut seen = std::collections::BTreeSet::new();
        for combination in rendered.variants.iter().flat_map(|v| &v.combinations) {
            let subset = combination.windows(2).all(|w| w[0] < w[1])
                && combination.iter().all(|i| indices.contains(i));
            if !subset || !seen.insert(combination) {
                return Err(malformed(format!(
                    "combination {combination:?} is not a distinct subset of {indices:?}"
                )));
            }
        }
        if seen.len() != 1 << indices.len() {
            return Err(malformed(format!(
                "{} combinations of {} customizations, expected {}",
                seen.len(),
                indices.len(),
                1usize << indices.len()
            )));
        }
        Ok(())
    }

    /// One cluster's manifests: each a Kubernetes object, none defined twice.
    fn check_manifests(&self, manifests: &[Manifest]) -> Result<()> {
        let mut seen: BTreeMap<(String, String, Option<String>, String), String> = BTreeMap::new();
        for manifest in manifests {
            let object =
                check_manifest_object(&manifest.file, manifest.document, &manifest.object)?;
            let location = format!("{} document {}", manifest.file, manifest.document);
            let key = (
                object.group().to_owned(),
                object.kind.clone(),
                object.namespace.clone(),
                object.name.clone(),
            );
            if let Some(first) = seen.insert(key, location.clone()) {
                return Err(Error::DuplicateObject {
                    app: self.name.clone(),
                    object: object.to_string(),
                    first,
                    second: location,
                });
            }
        }
        Ok(())
    }
}

/// The fleet and app names: a DNS label (lower-case letters, digits and '-', at most 63 characters, starting
/// and ending with a letter or digit), since they end up in object names, labels and URLs.
pub fn check_name(name: &str) -> Result<()> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if valid {
        Ok(())
    } else {
        Err(Error::InvalidName {
            name: name.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::selector::Labels;
    use serde_json::json;

    fn config_map(name: &str) -> Manifest {
        Manifest {
            file: "charts/web (helm): web/templates/cm.yaml".to_owned(),
            document: 0,
            object: json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}),
        }
    }

    fn customization(env: &str) -> Customization {
        let mut selector = LabelSelector::default();
        selector
            .match_labels
            .insert("env".to_owned(), env.to_owned());
        Customization {
            selector,
            values: Map::new(),
        }
    }

    /// An app with customizations for prod (0), a values-only one (1) and eu (2); 0 and 2 change the render.
    fn rendered_app(variants: Vec<Variant>) -> App {
        App {
            name: "web".to_owned(),
            selector: LabelSelector::default(),
            values: Map::new(),
            customizations: vec![
                customization("prod"),
                customization("dev"),
                customization("eu"),
            ],
            policy: Policy::default(),
            namespace: None,
            create_namespace: false,
            depends_on: Vec::new(),
            windows: Vec::new(),
            substitute: true,
            manifests: Vec::new(),
            rendered: Some(Rendered {
                engine: "helm".to_owned(),
                source: BTreeMap::new(),
                customizations: vec![0, 2],
                variants,
            }),
        }
    }

    fn variant(combinations: Vec<Vec<usize>>, name: &str) -> Variant {
        Variant {
            combinations,
            manifests: vec![config_map(name)],
        }
    }

    fn labels(env: &str) -> Labels {
        [("env".to_owned(), env.to_owned())].into_iter().collect()
    }

    #[test]
    fn a_cluster_gets_the_variant_of_the_render_customizations_it_matches() {
        let app = rendered_app(vec![
            variant(vec![vec![], vec![2]], "plain"),
            variant(vec![vec![0], vec![0, 2]], "prod"),
        ]);
        app.validate().unwrap();
        let name = |env: &str| {
            app.manifests_for(&labels(env)).unwrap()[0].object["metadata"]["name"].clone()
        };
        assert_eq!(name("prod"), "prod");
        assert_eq!(
            name("dev"),
            "plain",
            "a values-only customization picks no variant"
        );
        assert_eq!(app.object_count(), 2);
    }

    #[test]
    fn a_rendered_app_must_cover_every_combination_once() {
        let missing = rendered_app(vec![variant(vec![vec![], vec![0], vec![2]], "a")]);
        let error = missing.validate().unwrap_err().to_string();
        assert!(
            error.contains("3 combinations of 2 customizations, expected 4"),
            "{error}"
        );
        let twice = rendered_app(vec![
            variant(vec![vec![], vec![0]], "a"),
            variant(vec![vec![0], vec![2], vec![0, 2]], "b"),
        ]);
        let error = twice.validate().unwrap_err().to_string();
        assert!(
            error.contains("combination [0] is not a distinct subset"),
            "{error}"
        );
        let mut stray = rendered_app(vec![variant(
            vec![vec![], vec![0], vec![2], vec![0, 2]],
            "a",
        )]);
        stray.rendered.as_mut().unwrap().customizations = vec![0, 7];
        let error = stray.validate().unwrap_err().to_string();
        assert!(error.contains("ascending indices"), "{error}");
        let mut own = rendered_app(vec![variant(
            vec![vec![], vec![0], vec![2], vec![0, 2]],
            "a",
        )]);
        own.manifests.push(config_map("extra"));
        assert!(own.validate().is_err());
    }

    #[test]
    fn an_object_twice_in_one_variant_is_refused() {
        let mut twice = variant(vec![vec![], vec![0], vec![2], vec![0, 2]], "a");
        twice.manifests.push(config_map("a"));
        let error = rendered_app(vec![twice]).validate().unwrap_err();
        assert!(matches!(error, Error::DuplicateObject { .. }), "{error}");
    }
}
