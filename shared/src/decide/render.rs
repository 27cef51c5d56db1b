//! Pull-mode composition: what one cluster gets from a bundle.
//!
//! Where the data comes from: a verified [`Bundle`] (the agent's last known good one, or one that `windvane
//! render` built from a source tree) and the cluster's identity (its name and labels, set by its operator).
//! Where it goes: the agent applies the [`RenderedApp`]s in order; `windvane render` prints them.
//!
//! Each app whose selector matches the cluster's labels is rendered: its values are the app's `values` with
//! every matching customization merged over them in order ([`effective_values`]), and every string value of
//! every manifest (keys are left alone) is interpolated:
//!
//! - `${cluster.name}`; `${cluster.labels.KEY}`, where KEY is everything after `cluster.labels.`, dots and
//!   slashes included (`${cluster.labels.topology.kubernetes.io/region}`); `${values.a.b}`, a path through
//!   nested mappings of the values.
//! - A string that is exactly one `${...}` takes the value's JSON type, so `replicas: ${values.replicas}` is a
//!   number and `${values.resources}` can be a whole mapping. Inside a longer string, strings, numbers and
//!   booleans are inserted as text; a mapping, list or null there is an error.
//! - Which `${...}` is a variable is [`variables`]' one grammar: only well-formed `${cluster.…}` and
//!   `${values.…}`; any other `${...}` (`${cluster}`, `${1}`, `${datasource}`, `${HOSTNAME:-x}`, an unclosed
//!   `${`) is another tool's syntax and kept verbatim, so real dashboards, alert rules and scripts survive; a
//!   near miss (`${cluster.nmae}`, `${values.replcas}` where `replicas` is defined) is an error with a
//!   suggestion. `$${` is a literal `${`. Inserted values are not interpolated again.
//! - A variable that is not defined is an error, never an empty string: a cluster missing a label must not
//!   get a half-configured object.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;

use serde_json::{Map, Value};

use crate::decide::variables::{self, Piece, Variable};
use crate::format::bundle::{
    App, Bundle, Customization, Manifest, ObjectRef, Policy, check_manifest_object,
};
use crate::spec::selector::Labels;
use crate::{Error, Result};

/// Who a cluster is, as its agent was told by its operator: the names `${cluster.*}` refers to, and the labels
/// that selectors match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterIdentity {
    /// The cluster's name, `${cluster.name}`.
    pub name: String,
    /// The cluster's labels, matched by selectors and read as `${cluster.labels.KEY}`.
    pub labels: Labels,
}

/// One object, rendered for one cluster, with where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderedObject {
    /// The app the object belongs to.
    pub app: String,
    /// Its source file, relative to the fleet root.
    pub file: String,
    /// Its document index within that file.
    pub document: usize,
    /// The rendered object, ready to apply.
    pub object: Value,
    /// The rendered object's identity.
    pub id: ObjectRef,
}

/// One app, rendered for one cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderedApp {
    /// The app's name.
    pub name: String,
    /// The app's policy, unchanged by rendering.
    pub policy: Policy,
    /// Where the app's namespaced objects that name no namespace go (`None`: `default`).
    pub namespace: Option<String>,
    /// In bundle order (sorted by file, then document).
    pub objects: Vec<RenderedObject>,
}

/// The apps of `bundle` whose selector matches the cluster's labels, in bundle order.
pub fn selected_apps<'b>(bundle: &'b Bundle, cluster: &ClusterIdentity) -> Vec<&'b App> {
    bundle
        .apps
        .iter()
        .filter(|app| app.selector.matches(&cluster.labels))
        .collect()
}

/// The app's values for this cluster: `app.values`, then each customization whose selector matches, in order,
/// deep-merged over them (mappings merge key by key, recursively; anything else replaces).
pub fn effective_values(app: &App, cluster: &ClusterIdentity) -> Map<String, Value> {
    values_with(app, |customization| {
        customization.selector.matches(&cluster.labels)
    })
}

/// The app's values with those of the customizations `applies` picks merged over them, in order.
fn values_with(app: &App, applies: impl Fn(&Customization) -> bool) -> Map<String, Value> {
    let mut values = app.values.clone();
    for customization in app.customizations.iter().filter(|c| applies(c)) {
        merge(&mut values, &customization.values);
    }
    values
}

fn merge(base: &mut Map<String, Value>, overlay: &Map<String, Value>) {
    for (key, value) in overlay {
        match (base.get_mut(key), value) {
            (Some(Value::Object(base_map)), Value::Object(overlay_map)) => {
                merge(base_map, overlay_map)
            }
            _ => {
                base.insert(key.clone(), value.clone());
            }
        }
    }
}

/// Renders every manifest of `app` for the cluster (whether or not its selector matches: the caller chooses),
/// and checks the rendered objects: still Kubernetes objects (a name may come from a variable), and none
/// defined twice.
pub fn render_app(app: &App, cluster: &ClusterIdentity) -> Result<RenderedApp> {
    let values = effective_values(app, cluster);
    let context = Variables {
        cluster,
        values: &values,
        any_label: false,
    };
    render_with(app, app.manifests_for(&cluster.labels)?, &context)
}

/// The build-time check behind `windvane build`/`publish`: renders `app` once with its values merged with
/// every customization's and with any `${cluster.labels.KEY}` taken as defined, so that what would fail on
/// every cluster fails here instead — a `${values.x}` that neither the app's values nor any customization
/// defines, a malformed `${…}`, a name that cannot be valid whatever the values. A variable that only some
/// customizations define passes: whether every cluster that gets the app matches one of them is the
/// release engineer's to know, and the agent reports such a cluster's failure by name.
pub fn check_renders_somewhere(app: &App) -> Result<()> {
    let values = values_with(app, |_| true);
    let cluster = ClusterIdentity {
        name: "build-check".to_owned(),
        labels: Labels::new(),
    };
    let context = Variables {
        cluster: &cluster,
        values: &values,
        any_label: true,
    };
    // An engine-rendered app is checked in every variant: each is some cluster's.
    let result = app
        .manifest_sets()
        .into_iter()
        .try_for_each(|manifests| render_with(app, manifests, &context).map(drop));
    match result {
        Err(Error::UndefinedVariable {
            app,
            file,
            document,
            object,
            pointer,
            variable,
        }) => Err(Error::NeverDefined {
            app,
            file,
            document,
            object,
            pointer,
            variable,
        }),
        other => other,
    }
}

/// Whether any manifest of `app` (any variant, for an engine's) that is substituted holds a Windvane variable
/// ([`variables`]): what `windvane build` names, so that a substitution nobody expected is visible.
pub fn uses_variables(app: &App) -> bool {
    fn holds(value: &Value) -> bool {
        match value {
            Value::String(text) => variables::has_variable(text),
            Value::Array(items) => items.iter().any(holds),
            Value::Object(map) => map.values().any(holds),
            Value::Null | Value::Bool(_) | Value::Number(_) => false,
        }
    }
    let disabled = |object: &Value| {
        object
            .pointer("/metadata/annotations/windvane.io~1substitute")
            .and_then(Value::as_str)
            == Some("disabled")
    };
    app.substitute
        && app
            .manifest_sets()
            .into_iter()
            .flatten()
            .any(|manifest| !disabled(&manifest.object) && holds(&manifest.object))
}

fn render_with(app: &App, manifests: &[Manifest], context: &Variables) -> Result<RenderedApp> {
    let objects = render_each(app, manifests.iter().map(Cow::Borrowed), context, Ok)?;
    Ok(RenderedApp {
        name: app.name.clone(),
        policy: app.policy.clone(),
        namespace: app.namespace.clone(),
        objects,
    })
}

/// [`render_app`] for a caller that owns the app and keeps each object in a form of its own: the app's
/// manifests are consumed one at a time and each rendered object goes to `keep` at once, so the app's
/// objects never exist twice as parsed values (a parsed object takes several times the memory of its
/// text). Errors are those of [`render_app`] followed by `keep` over its objects: a render error of any
/// object comes first, then the first object's error from `keep`.
pub fn render_app_into<T>(
    mut app: App,
    cluster: &ClusterIdentity,
    keep: impl FnMut(RenderedObject) -> Result<T>,
) -> Result<Vec<T>> {
    let manifests = app.take_manifests_for(&cluster.labels)?;
    let values = effective_values(&app, cluster);
    let context = Variables {
        cluster,
        values: &values,
        any_label: false,
    };
    render_each(&app, manifests.into_iter().map(Cow::Owned), &context, keep)
}

/// Renders `manifests` in order, checks each rendered object, and hands it to `keep` (an owned manifest's
/// object is moved, not copied). A render error stops at once; an error from `keep` is returned after every
/// object rendered, so that render errors come first, as when all render before any is kept. An app's
/// `createNamespace` Namespace comes first in the result.
fn render_each<'m, T>(
    app: &App,
    manifests: impl IntoIterator<Item = Cow<'m, Manifest>>,
    context: &Variables,
    mut keep: impl FnMut(RenderedObject) -> Result<T>,
) -> Result<Vec<T>> {
    let mut kept: Result<Vec<T>> = Ok(Vec::new());
    let mut seen: HashMap<(String, String, Option<String>, String), String> = HashMap::new();
    for manifest in manifests {
        let (object, file, document) = render_manifest(app, manifest, context)?;
        let id = check_manifest_object(&file, document, &object)?;
        let location = format!("{file} document {document}");
        if let Some(first) = seen.insert(identity_key(&id), location.clone()) {
            return Err(Error::DuplicateObject {
                app: app.name.clone(),
                object: id.to_string(),
                first,
                second: location,
            });
        }
        if let Ok(objects) = &mut kept {
            let rendered = RenderedObject {
                app: app.name.clone(),
                file,
                document,
                object,
                id,
            };
            match keep(rendered) {
                Ok(item) => objects.push(item),
                Err(error) => kept = Err(error),
            }
        }
    }
    let mut objects = kept?;
    if let Some(namespace) = created_namespace(app, &seen)? {
        objects.insert(0, keep(namespace)?);
    }
    Ok(objects)
}

/// One manifest's object rendered, with its file and document: substituted when the app and the object say
/// so, else as written (moved out of an owned manifest, or copied).
fn render_manifest(
    app: &App,
    manifest: Cow<'_, Manifest>,
    context: &Variables,
) -> Result<(Value, String, usize)> {
    let Manifest {
        file,
        document,
        object: mut body,
    } = manifest.into_owned();
    let site = Site::new(app, &file, document, &body);
    if substitutes(app, &body, &site)? {
        render_in_place(&mut body, context, &site, &mut String::new())?;
    }
    drop(site);
    Ok((body, file, document))
}

/// The Namespace of an app's `createNamespace: true`, unless the app writes that Namespace out itself (it
/// then keeps its own, labels and all).
fn created_namespace(
    app: &App,
    seen: &HashMap<(String, String, Option<String>, String), String>,
) -> Result<Option<RenderedObject>> {
    let Some(namespace) = app.namespace.as_ref().filter(|_| app.create_namespace) else {
        return Ok(None);
    };
    let object = serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}
    });
    let id = check_manifest_object(CREATED_NAMESPACE_FILE, 0, &object)?;
    if seen.contains_key(&identity_key(&id)) {
        return Ok(None);
    }
    Ok(Some(RenderedObject {
        app: app.name.clone(),
        file: CREATED_NAMESPACE_FILE.to_owned(),
        document: 0,
        object,
        id,
    }))
}

/// Where an app's `createNamespace: true` Namespace comes from, in errors and status.
pub const CREATED_NAMESPACE_FILE: &str = "fleet.yaml (createNamespace)";

/// The annotation that turns substitution off for one object: `windvane.io/substitute: "disabled"`.
pub const SUBSTITUTE_ANNOTATION: &str = "windvane.io/substitute";

/// Whether a manifest's `${…}` variables are filled in: not when its app says `substitute: false` or the
/// object carries `windvane.io/substitute: "disabled"` (files whose own `${…}` syntax collides with ours).
/// Any other value than `disabled`/`enabled` is an error, so that a typo does not silently substitute.
fn substitutes(app: &App, object: &Value, site: &Site) -> Result<bool> {
    let pointer = "/metadata/annotations/windvane.io~1substitute";
    match object.pointer(pointer) {
        None => Ok(app.substitute),
        Some(Value::String(value)) if value == "disabled" => Ok(false),
        Some(Value::String(value)) if value == "enabled" => Ok(app.substitute),
        Some(other) => Err(site.template_error(
            pointer,
            format!(
                "{SUBSTITUTE_ANNOTATION} is {other}; set it to \"disabled\" (or \"enabled\", the default)"
            ),
        )),
    }
}

/// What makes two objects the same object in a cluster (the version does not).
fn identity_key(id: &ObjectRef) -> (String, String, Option<String>, String) {
    (
        id.group().to_owned(),
        id.kind.clone(),
        id.namespace.clone(),
        id.name.clone(),
    )
}

struct Variables<'a> {
    cluster: &'a ClusterIdentity,
    values: &'a Map<String, Value>,
    /// At build time: every `${cluster.labels.KEY}` is defined (as a valid name made from KEY), since some
    /// cluster may carry the label.
    any_label: bool,
}

impl Variables<'_> {
    /// `Ok(None)` for an undefined variable; an error for a near miss of a defined one (`${values.replcas}`
    /// where `replicas` is defined).
    fn lookup(&self, variable: Variable<'_>) -> Result<Option<Value>> {
        match variable {
            Variable::ClusterName => Ok(Some(Value::String(self.cluster.name.clone()))),
            Variable::ClusterLabel(key) if self.any_label => {
                Ok(Some(Value::String(label_placeholder(key))))
            }
            Variable::ClusterLabel(key) => Ok(self
                .cluster
                .labels
                .get(key)
                .map(|v| Value::String(v.clone()))),
            Variable::Values(path) => self.value_at(path),
        }
    }

    /// The value at a dotted path of the values; a missing name with a defined one close to it is a near miss.
    fn value_at(&self, path: &str) -> Result<Option<Value>> {
        let mut current = self.values;
        let mut walked = String::from("values");
        let mut names = path.split('.').peekable();
        while let Some(name) = names.next() {
            let Some(value) = current.get(name) else {
                let Some(near) = variables::closest(name, current.keys().map(String::as_str))
                else {
                    return Ok(None);
                };
                let rest: Vec<&str> = names.collect();
                let suggestion = [walked.as_str(), near]
                    .into_iter()
                    .chain(rest)
                    .collect::<Vec<_>>()
                    .join(".");
                return Err(Error::UndefinedValue {
                    path: path.to_owned(),
                    meant: suggestion,
                });
            };
            if names.peek().is_none() {
                return Ok(Some(value.clone()));
            }
            let Some(map) = value.as_object() else {
                return Ok(None);
            };
            walked.push('.');
            walked.push_str(name);
            current = map;
        }
        Ok(None)
    }
}

/// A stand-in for a label's value at build time: a valid name, distinct per key, so that names made from
/// labels neither fail nor collide in the check.
fn label_placeholder(key: &str) -> String {
    let name: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    format!("l-{}", name.trim_matches('-'))
}

/// Where a string being rendered sits, for errors.
struct Site<'a> {
    app: &'a str,
    file: &'a str,
    document: usize,
    /// The object as written (`Deployment ns/${values.name}`), since the rendered one may not exist yet.
    object: String,
}

impl<'a> Site<'a> {
    fn new(app: &'a App, file: &'a str, document: usize, object: &Value) -> Self {
        let object = ObjectRef::of(object)
            .map_or_else(|| "unidentified object".to_owned(), |id| id.to_string());
        Self {
            app: &app.name,
            file,
            document,
            object,
        }
    }

    fn template_error(&self, pointer: &str, detail: String) -> Error {
        Error::Template {
            app: self.app.to_owned(),
            file: self.file.to_owned(),
            document: self.document,
            object: self.object.clone(),
            pointer: pointer.to_owned(),
            detail,
        }
    }

    fn undefined(&self, pointer: &str, variable: &str) -> Error {
        Error::UndefinedVariable {
            app: self.app.to_owned(),
            file: self.file.to_owned(),
            document: self.document,
            object: self.object.clone(),
            pointer: pointer.to_owned(),
            variable: variable.to_owned(),
        }
    }
}

/// Substitutes the variables in `value` where it is, its RFC 6901 pointer being `pointer` (extended and cut
/// back while walking, for the messages of errors: no string is built per node).
fn render_in_place(
    value: &mut Value,
    context: &Variables<'_>,
    site: &Site<'_>,
    pointer: &mut String,
) -> Result<()> {
    match value {
        // Most strings hold no `$`: they are left where they are, not copied.
        Value::String(text) if text.contains('$') => {
            *value = render_string(text, context, site, pointer)?;
        }
        Value::Array(items) => {
            for (index, item) in items.iter_mut().enumerate() {
                let len = pointer.len();
                let _ = write!(pointer, "/{index}");
                render_in_place(item, context, site, pointer)?;
                pointer.truncate(len);
            }
        }
        Value::Object(map) => {
            for (key, item) in map.iter_mut() {
                let len = pointer.len();
                pointer.push('/');
                if key.contains(['~', '/']) {
                    pointer.push_str(&key.replace('~', "~0").replace('/', "~1"));
                } else {
                    pointer.push_str(key);
                }
                render_in_place(item, context, site, pointer)?;
                pointer.truncate(len);
            }
        }
        Value::String(_) | Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
    Ok(())
}

fn render_string(
    text: &str,
    context: &Variables<'_>,
    site: &Site<'_>,
    pointer: &str,
) -> Result<Value> {
    if !text.contains('$') {
        return Ok(Value::String(text.to_owned()));
    }
    let pieces =
        variables::split(text).map_err(|error| site.template_error(pointer, error.to_string()))?;
    let resolve = |variable: Variable<'_>| -> Result<Value> {
        match context.lookup(variable) {
            Ok(Some(value)) => Ok(value),
            Ok(None) => Err(site.undefined(pointer, &variable.to_string())),
            Err(error) => Err(site.template_error(pointer, error.to_string())),
        }
    };
    // Exactly one `${...}` and nothing else: the value keeps its type.
    if let [Piece::Variable(variable)] = pieces.as_slice() {
        return resolve(*variable);
    }
    let mut out = String::with_capacity(text.len());
    for piece in &pieces {
        match piece {
            Piece::Text(literal) => out.push_str(literal),
            Piece::Variable(variable) => match resolve(*variable)? {
                Value::String(s) => out.push_str(&s),
                Value::Number(n) => out.push_str(&n.to_string()),
                Value::Bool(b) => out.push_str(if b { "true" } else { "false" }),
                other => {
                    let what = match other {
                        Value::Null => "null",
                        Value::Array(_) => "a list",
                        _ => "a mapping",
                    };
                    return Err(site.template_error(
                        pointer,
                        format!(
                            "${{{variable}}} is {what}, which cannot be part of a longer string; use it as the \
                             whole value"
                        ),
                    ));
                }
            },
        }
    }
    Ok(Value::String(out))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::format::bundle::{BUNDLE_API_VERSION, Customization};
    use crate::spec::selector::LabelSelector;

    fn cluster() -> ClusterIdentity {
        ClusterIdentity {
            name: "eu-1".to_owned(),
            labels: [
                ("env", "prod"),
                ("topology.kubernetes.io/region", "eu-west-1"),
                ("tier", "gold"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        }
    }

    fn app(values: Value, objects: Vec<Value>) -> App {
        App {
            name: "web".to_owned(),
            selector: LabelSelector::default(),
            values: values.as_object().cloned().unwrap_or_default(),
            customizations: Vec::new(),
            policy: Policy::default(),
            namespace: None,
            create_namespace: false,
            depends_on: Vec::new(),
            windows: Vec::new(),
            substitute: true,
            rendered: None,
            manifests: objects
                .into_iter()
                .enumerate()
                .map(|(document, object)| Manifest {
                    file: "apps/web/all.yaml".to_owned(),
                    document,
                    object,
                })
                .collect(),
        }
    }

    fn deployment(spec: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "api", "namespace": "web"}, "spec": spec})
    }

    fn render_one(values: Value, spec: Value) -> Result<Value> {
        let rendered = render_app(&app(values, vec![deployment(spec)]), &cluster())?;
        Ok(rendered.objects[0].object["spec"].clone())
    }

    #[test]
    fn whole_scalar_keeps_the_type() {
        let spec = render_one(
            json!({"replicas": 3, "debug": true, "resources": {"cpu": "1"}, "tags": ["a"], "none": null, "ratio": 0.5}),
            json!({"replicas": "${values.replicas}", "debug": "${values.debug}", "resources": "${values.resources}",
                   "tags": "${values.tags}", "none": "${ values.none }", "ratio": "${values.ratio}"}),
        )
        .unwrap();
        assert_eq!(
            spec,
            json!({"replicas": 3, "debug": true, "resources": {"cpu": "1"}, "tags": ["a"], "none": null, "ratio": 0.5})
        );
    }

    #[test]
    fn inside_a_longer_string_scalars_become_text() {
        let spec = render_one(
            json!({"image": {"tag": "1.2"}, "port": 8080, "tls": false}),
            json!({"a": "nginx:${values.image.tag}", "b": "${cluster.name}-${values.port}-${values.tls}",
                   "c": "  ${values.port}", "d": "no variables $ here $", "e": "${values.port}x"}),
        )
        .unwrap();
        assert_eq!(
            spec,
            json!({"a": "nginx:1.2", "b": "eu-1-8080-false", "c": "  8080", "d": "no variables $ here $", "e": "8080x"})
        );
    }

    #[test]
    fn labels_with_dots_and_slashes() {
        let spec =
            render_one(json!({}), json!({"region": "${cluster.labels.topology.kubernetes.io/region}", "env": "${cluster.labels.env}"}))
                .unwrap();
        assert_eq!(spec, json!({"region": "eu-west-1", "env": "prod"}));
    }

    #[test]
    fn escape_is_a_literal() {
        let spec = render_one(
            json!({"x": 1}),
            json!({"a": "$${values.x}", "b": "$${HOME} and ${values.x}", "c": "$$ $"}),
        )
        .unwrap();
        assert_eq!(
            spec,
            json!({"a": "${values.x}", "b": "${HOME} and 1", "c": "$$ $"})
        );
    }

    #[test]
    fn keys_are_not_interpolated_and_results_not_rescanned() {
        let spec = render_one(
            json!({"x": "${values.y}", "y": 1}),
            json!({"${values.x}": "${values.x}"}),
        )
        .unwrap();
        assert_eq!(spec, json!({"${values.x}": "${values.y}"}));
    }

    #[test]
    fn customizations_apply_in_order_and_merge_deeply() {
        let mut web = app(
            json!({"retention": "15d", "limits": {"cpu": "1", "memory": "1Gi"}, "zones": ["a", "b"]}),
            vec![],
        );
        let custom = |selector: &str, values: Value| Customization {
            selector: LabelSelector::parse(selector).unwrap(),
            values: values.as_object().cloned().unwrap_or_default(),
        };
        web.customizations = vec![
            custom(
                "env=prod",
                json!({"retention": "30d", "limits": {"cpu": "2"}, "zones": ["c"]}),
            ),
            custom("env=dev", json!({"retention": "1d"})),
            custom(
                "tier=gold",
                json!({"retention": "90d", "limits": {"memory": "4Gi"}}),
            ),
        ];
        assert_eq!(
            json!(effective_values(&web, &cluster())),
            json!({"retention": "90d", "limits": {"cpu": "2", "memory": "4Gi"}, "zones": ["c"]})
        );
        let bare = ClusterIdentity {
            name: "x".to_owned(),
            labels: Labels::new(),
        };
        assert_eq!(
            json!(effective_values(&web, &bare))["retention"],
            json!("15d")
        );
    }

    #[test]
    fn undefined_variables_name_everything() {
        let err = render_one(
            json!({"a": {}}),
            json!({"template": {"spec": {"containers": [{"image": "x:${values.a.tag}"}]}}}),
        )
        .unwrap_err();
        match err {
            Error::UndefinedVariable {
                app,
                file,
                document,
                object,
                pointer,
                variable,
            } => {
                assert_eq!(app, "web");
                assert_eq!(file, "apps/web/all.yaml");
                assert_eq!(document, 0);
                assert_eq!(object, "Deployment web/api");
                assert_eq!(pointer, "/spec/template/spec/containers/0/image");
                assert_eq!(variable, "values.a.tag");
            }
            other => panic!("{other}"),
        }
        assert!(matches!(
            render_one(json!({}), json!({"r": "${cluster.labels.missing}"})),
            Err(Error::UndefinedVariable { .. })
        ));
        assert!(matches!(
            render_one(json!({"a": 1}), json!({"r": "${values.a.b}"})),
            Err(Error::UndefinedVariable { .. })
        ));
        // The object in the message is the one as written, with the unrendered name.
        let object = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "${values.name}"}, "data": {"a/b~c": "${values.x}"}});
        let err = render_app(&app(json!({"name": "cm"}), vec![object]), &cluster()).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("ConfigMap ${values.name}") && message.contains("/data/a~1b~0c"),
            "{message}"
        );
    }

    #[test]
    fn template_errors() {
        let detail =
            |spec: Value| match render_one(json!({"m": {"a": 1}, "l": [1], "n": null}), spec) {
                Err(Error::Template {
                    detail, pointer, ..
                }) => {
                    assert_eq!(pointer, "/spec/x");
                    detail
                }
                other => panic!("{other:?}"),
            };
        assert!(detail(json!({"x": "a ${values.m}"})).contains("a mapping"));
        assert!(detail(json!({"x": "a ${values.l}"})).contains("a list"));
        assert!(detail(json!({"x": "a ${values.n}"})).contains("null"));
        assert!(detail(json!({"x": "${values.m"})).contains("unterminated"));
        assert!(detail(json!({"x": "${cluster.labels}"})).contains("names no label"));
        assert!(detail(json!({"x": "${cluster.labels.}"})).contains("names no label"));
        assert!(detail(json!({"x": "${values..a}"})).contains("empty name"));
        // Near misses are errors with a suggestion, at build time and on the agent alike.
        let error = detail(json!({"x": "${cluster.nmae}"}));
        assert!(error.contains("did you mean ${cluster.name}?"), "{error}");
        let Err(Error::Template { detail: error, .. }) = render_one(
            json!({"image": {"tag": "1"}}),
            json!({"x": "n=${values.image.tga}"}),
        ) else {
            panic!()
        };
        assert!(
            error.contains("did you mean ${values.image.tag}?"),
            "{error}"
        );
        let error = detail(json!({"x": "${values.M}"}));
        assert!(error.contains("did you mean ${values.m}?"), "{error}");
    }

    #[test]
    fn near_misses_of_values_are_caught_at_build_time() {
        let object = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
                            "data": {"r": "${values.replcas}"}});
        let error = check_renders_somewhere(&app(json!({"replicas": 2}), vec![object.clone()]))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("did you mean ${values.replicas}?"),
            "{error}"
        );
        // With nothing close, it is an undefined variable, as before.
        let error = check_renders_somewhere(&app(json!({"image": "x"}), vec![object])).unwrap_err();
        assert!(matches!(error, Error::NeverDefined { .. }), "{error}");
    }

    /// Grafana dashboards and shell scripts in an app that declares no values at all: nothing is a variable,
    /// nothing fails, nothing changes (issue 43).
    #[test]
    fn dashboards_keep_their_own_variables_on_an_app_without_values() {
        let dashboard = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "dash"},
            "data": {"d.json": "{\"expr\": \"up{cluster=\\\"${cluster}\\\", namespace=\\\"${namespace}\\\"}\", \
                     \"link\": \"${__data.fields.Pod}\", \"ds\": \"${datasource}\", \"all\": \"${values}\"}",
                     "run.sh": "echo ${HOME} ${1}"}});
        let app = app(json!({}), vec![dashboard.clone()]);
        check_renders_somewhere(&app).unwrap();
        assert!(!uses_variables(&app));
        let rendered = render_app(&app, &cluster()).unwrap();
        assert_eq!(rendered.objects[0].object, dashboard);
        let mut with_one = app.clone();
        with_one.manifests[0].object["data"]["name"] = json!("${cluster.name}");
        assert!(uses_variables(&with_one));
        with_one.substitute = false;
        assert!(!uses_variables(&with_one));
    }

    #[test]
    fn other_tools_syntax_is_kept_verbatim() {
        let foreign = json!({
            "grafana": "${datasource}", "prom": "{{ $labels.pod }} ${1}", "shell": "echo ${HOSTNAME:-x} $${HOME}",
            "empty": "${}", "env": "${env.HOME}", "open": "tail ${", "clusterish": "${clusters.x} ${valuesx}",
            "mixed": "${cluster.name}/${PATH}"
        });
        assert_eq!(
            render_one(json!({}), foreign).unwrap(),
            json!({
                "grafana": "${datasource}", "prom": "{{ $labels.pod }} ${1}", "shell": "echo ${HOSTNAME:-x} ${HOME}",
                "empty": "${}", "env": "${env.HOME}", "open": "tail ${", "clusterish": "${clusters.x} ${valuesx}",
                "mixed": "eu-1/${PATH}"
            })
        );
    }

    #[test]
    fn create_namespace_adds_the_app_namespace_first_unless_the_app_writes_it() {
        let config_map =
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}});
        let mut app = app(json!({}), vec![config_map.clone()]);
        app.namespace = Some("observability".to_owned());
        let rendered = render_app(&app, &cluster()).unwrap();
        assert_eq!(rendered.namespace.as_deref(), Some("observability"));
        assert_eq!(
            rendered.objects.len(),
            1,
            "no Namespace without createNamespace"
        );
        app.create_namespace = true;
        let rendered = render_app(&app, &cluster()).unwrap();
        let ids: Vec<String> = rendered.objects.iter().map(|o| o.id.to_string()).collect();
        assert_eq!(ids, ["Namespace observability", "ConfigMap c"]);
        assert_eq!(rendered.objects[0].file, CREATED_NAMESPACE_FILE);
        let own = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "observability", "labels": {"team": "sre"}}});
        app.manifests.push(Manifest {
            file: "apps/web/ns.yaml".to_owned(),
            document: 0,
            object: own.clone(),
        });
        let rendered = render_app(&app, &cluster()).unwrap();
        assert_eq!(rendered.objects.len(), 2);
        assert_eq!(
            rendered.objects[1].object, own,
            "the app's own Namespace is kept"
        );
    }

    #[test]
    fn substitution_is_turned_off_per_app_and_per_object() {
        let config_map = |annotation: Option<&str>| {
            let mut object = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "dash"}, "data": {"q": "${cluster.name} ${values.v}"}});
            if let Some(value) = annotation {
                object["metadata"]["annotations"] = json!({SUBSTITUTE_ANNOTATION: value});
            }
            object
        };
        let data = |app: &App| -> Result<Value> {
            Ok(render_app(app, &cluster())?.objects[0].object["data"]["q"].clone())
        };
        let values = json!({"v": "x"});
        let on = app(values.clone(), vec![config_map(None)]);
        assert_eq!(data(&on).unwrap(), json!("eu-1 x"));
        let enabled = app(values.clone(), vec![config_map(Some("enabled"))]);
        assert_eq!(data(&enabled).unwrap(), json!("eu-1 x"));
        let object_off = app(values.clone(), vec![config_map(Some("disabled"))]);
        assert_eq!(
            data(&object_off).unwrap(),
            json!("${cluster.name} ${values.v}")
        );
        let mut app_off = app(json!({}), vec![config_map(None)]);
        app_off.substitute = false;
        assert_eq!(
            data(&app_off).unwrap(),
            json!("${cluster.name} ${values.v}")
        );
        let typo = app(values, vec![config_map(Some("disable"))]);
        match render_app(&typo, &cluster()) {
            Err(Error::Template {
                pointer, detail, ..
            }) => {
                assert_eq!(pointer, "/metadata/annotations/windvane.io~1substitute");
                assert!(detail.contains("\"disable\""), "{detail}");
            }
            other => panic!("expected a template error, got {other:?}"),
        }
    }

    #[test]
    fn names_from_variables_are_checked_after_rendering() {
        let object = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "${values.name}"}});
        let rendered = render_app(
            &app(json!({"name": "cm-${x}"}), vec![object.clone()]),
            &cluster(),
        )
        .unwrap();
        assert_eq!(rendered.objects[0].id.name, "cm-${x}");
        let rendered = render_app(
            &app(json!({"name": "cm"}), vec![object.clone()]),
            &cluster(),
        )
        .unwrap();
        assert_eq!(rendered.objects[0].id.to_string(), "ConfigMap cm");
        assert!(matches!(
            render_app(&app(json!({"name": 5}), vec![object.clone()]), &cluster()),
            Err(Error::Manifest { .. })
        ));
        let twice = render_app(
            &app(
                json!({"name": "cm"}),
                vec![
                    object,
                    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}}),
                ],
            ),
            &cluster(),
        );
        assert!(matches!(twice, Err(Error::DuplicateObject { .. })));
    }

    #[test]
    fn selection_and_order() {
        let mut a = app(
            json!({}),
            vec![json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}})],
        );
        a.name = "a".to_owned();
        let mut b = a.clone();
        b.name = "b".to_owned();
        b.selector = LabelSelector::parse("env=dev").unwrap();
        let mut c = app(
            json!({}),
            vec![json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}})],
        );
        c.name = "c".to_owned();
        c.selector = LabelSelector::parse("tier in (gold)").unwrap();
        let bundle = Bundle {
            api_version: BUNDLE_API_VERSION.to_owned(),
            fleet: "f".to_owned(),
            apps: vec![c, b, a],
            rollout: None,
        };
        let names: Vec<&str> = selected_apps(&bundle, &cluster())
            .iter()
            .map(|app| app.name.as_str())
            .collect();
        assert_eq!(names, vec!["c", "a"]);
        let cluster = cluster();
        let shares: Vec<_> = crate::decide::desired::cluster_share(&bundle, &cluster).collect();
        let names: Vec<&str> = shares.iter().map(|share| share.app.as_str()).collect();
        assert_eq!(names, vec!["c", "a"]);
        let objects = crate::decide::desired::all_or_first_error(shares).unwrap();
        assert_eq!(objects.last().map(|o| o.app.as_str()), Some("a"));
    }

    #[test]
    fn consuming_the_bundle_renders_the_same_share() {
        let cm = |name: &str, data: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data});
        let mut plain = app(
            json!({"x": "1"}),
            vec![cm("a", json!({"x": "${values.x}"}))],
        );
        plain.namespace = Some("team".to_owned());
        plain.create_namespace = true;
        plain.substitute = false;
        let mut bad_wave = cm("w", json!({}));
        bad_wave["metadata"]["annotations"] = json!({"windvane.io/wave": "soon"});
        let mut waves = app(json!({}), vec![bad_wave.clone(), cm("ok", json!({}))]);
        waves.name = "waves".to_owned();
        // A render error later in the app wins over an earlier object's error once rendered.
        let mut both = app(
            json!({}),
            vec![bad_wave, cm("u", json!({"u": "${values.missing}"}))],
        );
        both.name = "both".to_owned();
        let mut elsewhere = app(json!({}), vec![cm("e", json!({}))]);
        elsewhere.name = "elsewhere".to_owned();
        elsewhere.selector = LabelSelector::parse("env=dev").unwrap();
        let bundle = Bundle {
            api_version: BUNDLE_API_VERSION.to_owned(),
            fleet: "f".to_owned(),
            apps: vec![plain, waves, both, elsewhere],
            rollout: None,
        };
        let cluster = cluster();
        let describe = |share: crate::decide::desired::AppShare| {
            (share.app, share.objects.map_err(|e| e.to_string()))
        };
        let borrowed: Vec<_> = crate::decide::desired::cluster_share(&bundle, &cluster)
            .map(describe)
            .collect();
        let consumed: Vec<_> = crate::decide::desired::cluster_share_into(bundle, &cluster, |o| o)
            .map(describe)
            .collect();
        assert_eq!(borrowed, consumed);
        assert_eq!(consumed.len(), 3);
        let first = consumed[0].1.as_ref().unwrap();
        assert_eq!(first[0].id.kind, "Namespace");
        assert_eq!(first[1].body["data"]["x"], json!("${values.x}"));
        assert!(consumed[1].1.as_ref().unwrap_err().contains("wave"));
        assert!(consumed[2].1.as_ref().unwrap_err().contains("missing"));
    }
}
