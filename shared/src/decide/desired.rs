//! What Windvane sends for each object: the rendered object with Windvane's labels added and the fields that
//! `ignoreDifferences` leaves to others removed, plus the per-object policy read from its annotations. One
//! function for the agent's apply and for `windvane render`, so that what a release engineer previews is
//! exactly what an agent applies.

use std::time::Duration;

use serde_json::{Map, Value};

use crate::decide::render::{
    ClusterIdentity, RenderedApp, RenderedObject, render_app, render_app_into, selected_apps,
};
use crate::format::bundle::{Bundle, ObjectRef, Policy};
use crate::{Error, Result};

/// The field manager of every server-side apply Windvane makes.
pub const FIELD_MANAGER: &str = "windvane";
/// Label on every applied object; with [`FLEET_LABEL`] it selects what the agent watches.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY_VALUE: &str = "windvane";
/// Label naming the app an object belongs to.
pub const APP_LABEL: &str = "windvane.io/app";
/// Label naming the fleet an object belongs to.
pub const FLEET_LABEL: &str = "windvane.io/fleet";
/// `"false"` turns self-heal off for one object (drift is reported, not reverted).
pub const SELF_HEAL_ANNOTATION: &str = "windvane.io/self-heal";
/// `"disabled"` keeps one object from ever being pruned.
pub const PRUNE_ANNOTATION: &str = "windvane.io/prune";
/// An integer ordering objects within an apply stage (lower first; default 0).
pub const WAVE_ANNOTATION: &str = "windvane.io/wave";
/// Set by an operator on a live object: an RFC 3339 time until which drift on it is not reverted.
pub const HOLD_UNTIL_ANNOTATION: &str = "windvane.io/hold-until";
/// `"true"` (or `"false"`) turns admission-time prevention on (off) for one object, over the app's policy.
pub const PREVENT_ANNOTATION: &str = "windvane.io/prevent";

/// One object as Windvane applies it, with the policy that governs it.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredObject {
    pub app: String,
    pub id: ObjectRef,
    /// The body sent with server-side apply.
    pub body: Value,
    pub wave: i64,
    pub self_heal: bool,
    /// True when the app prunes and the object is not marked `windvane.io/prune: disabled`.
    pub prune: bool,
    pub drift_grace_period: Option<Duration>,
    /// True when changes to the fields Windvane owns are refused at admission (`policy.prevent` or the
    /// object's `windvane.io/prevent` annotation).
    pub prevent: bool,
    /// The pointers of the `ignoreDifferences` rules that match the object: removed from the body (when there),
    /// because another manager owns them.
    pub ignored_pointers: Vec<String>,
    pub file: String,
    pub document: usize,
    /// The app's `namespace:`: where the object goes if it is namespaced and names none (`None`: `default`).
    /// Only the agent knows a kind's scope (from discovery), so the namespace is filled in there.
    pub default_namespace: Option<String>,
}

/// One selected app's share of a release for one cluster: its desired objects (in the form the caller keeps
/// them, for [`cluster_share_into`]), or why it did not render.
#[derive(Debug)]
pub struct AppShare<T = DesiredObject> {
    pub app: String,
    pub objects: Result<Vec<T>>,
}

/// This cluster's share of a release: every app selected for it, in bundle order, rendered and turned into
/// what is applied. The one pipeline behind the agent's sync, `windvane-agent diff` and `windvane render`;
/// each caller states its own rule for an app that fails — the agent skips it and applies the others (its
/// prunes wait), a preview stops at it ([`all_or_first_error`]). Lazy, one app at a time, so that a caller
/// can shrink each app's objects before the next is rendered.
pub fn cluster_share<'b>(
    bundle: &'b Bundle,
    cluster: &'b ClusterIdentity,
) -> impl Iterator<Item = AppShare> + 'b {
    selected_apps(bundle, cluster)
        .into_iter()
        .map(move |app| AppShare {
            app: app.name.clone(),
            objects: render_app(app, cluster)
                .and_then(|rendered| desired_objects(&bundle.fleet, &rendered)),
        })
}

/// [`cluster_share`] for a caller that owns the bundle and keeps each object in a form of its own (the agent
/// keeps compact JSON): the bundle is consumed app by app and object by object, each desired object handed
/// to `keep` as soon as it is made, so a release's objects never exist twice as parsed values. Apps not
/// selected are dropped unrendered. Same apps, objects, order and errors as [`cluster_share`].
pub fn cluster_share_into<T>(
    bundle: Bundle,
    cluster: &ClusterIdentity,
    mut keep: impl FnMut(DesiredObject) -> T,
) -> impl Iterator<Item = AppShare<T>> {
    let Bundle { fleet, apps, .. } = bundle;
    apps.into_iter()
        .filter(|app| app.selector.matches(&cluster.labels))
        .map(move |app| {
            let name = app.name.clone();
            let policy = app.policy.clone();
            let namespace = app.namespace.clone();
            let objects = render_app_into(app, cluster, |object| {
                let mut desired = desired_object_from(&fleet, &name, &policy, object)?;
                desired.default_namespace = namespace.clone();
                Ok(keep(desired))
            });
            AppShare { app: name, objects }
        })
}

/// Every app's objects in order, or the first failing app's error: the rule of a preview, which must show
/// all of what an agent would apply or say why it cannot.
pub fn all_or_first_error(
    shares: impl IntoIterator<Item = AppShare>,
) -> Result<Vec<DesiredObject>> {
    let mut objects = Vec::new();
    for share in shares {
        objects.extend(share.objects?);
    }
    Ok(objects)
}

/// The desired objects of one rendered app, in source order.
pub fn desired_objects(fleet: &str, app: &RenderedApp) -> Result<Vec<DesiredObject>> {
    app.objects
        .iter()
        .map(|object| {
            let mut desired = desired_object(fleet, &app.name, &app.policy, object)?;
            desired.default_namespace = app.namespace.clone();
            Ok(desired)
        })
        .collect()
}

/// One rendered object as Windvane applies it.
pub fn desired_object(
    fleet: &str,
    app: &str,
    policy: &Policy,
    object: &RenderedObject,
) -> Result<DesiredObject> {
    desired_object_from(fleet, app, policy, object.clone())
}

/// [`desired_object`] from an owned rendered object, whose body becomes the desired body without a copy.
pub fn desired_object_from(
    fleet: &str,
    app: &str,
    policy: &Policy,
    object: RenderedObject,
) -> Result<DesiredObject> {
    let RenderedObject {
        file,
        document,
        object: mut body,
        id,
        ..
    } = object;
    let manifest_error = |detail: String| Error::Manifest {
        file: file.clone(),
        document,
        detail,
    };
    let ignored_pointers = strip_ignored(&mut body, policy, &id);
    let settings =
        object_settings(&body, policy, &id).map_err(|error| manifest_error(error.to_string()))?;
    add_windvane_labels(&mut body, fleet, app, &id)
        .map_err(|error| manifest_error(error.to_string()))?;
    Ok(DesiredObject {
        app: app.to_owned(),
        id,
        body,
        wave: settings.wave,
        self_heal: settings.self_heal,
        prune: settings.prune,
        drift_grace_period: policy.drift_grace_period,
        prevent: settings.prevent,
        ignored_pointers,
        file,
        document,
        default_namespace: None,
    })
}

/// Removes the fields the app's `ignoreDifferences` give to others from `body`; the pointers that apply to
/// the object, each once.
fn strip_ignored(body: &mut Value, policy: &Policy, id: &ObjectRef) -> Vec<String> {
    let mut ignored_pointers = Vec::new();
    for ignore in policy
        .ignore_differences
        .iter()
        .filter(|ignore| ignore.matches(id))
    {
        for pointer in &ignore.json_pointers {
            remove_pointer(body, pointer);
            // Kept even when the manifest does not set it: a field Windvane applied in an earlier release is
            // still Windvane's on the cluster, and must be handed over rather than dropped.
            if !ignored_pointers.contains(pointer) {
                ignored_pointers.push(pointer.clone());
            }
        }
    }
    ignored_pointers
}

/// What an object's annotations set over its app's policy.
struct ObjectSettings {
    wave: i64,
    self_heal: bool,
    prevent: bool,
    prune: bool,
}

/// The object's wave, self-heal, prevention and prune settings: its annotations, else its app's policy.
fn object_settings(body: &Value, policy: &Policy, id: &ObjectRef) -> Result<ObjectSettings> {
    let annotations = body
        .pointer("/metadata/annotations")
        .and_then(Value::as_object);
    let annotation = |key: &str| annotations.and_then(|a| a.get(key)).and_then(Value::as_str);
    let bad = |annotation: &str, rule: &'static str, found: &str| Error::BadAnnotation {
        object: id.to_string(),
        annotation: annotation.to_owned(),
        rule,
        found: found.to_owned(),
    };
    let wave = match annotation(WAVE_ANNOTATION) {
        Some(text) => text
            .trim()
            .parse::<i64>()
            .map_err(|_| bad(WAVE_ANNOTATION, "must be an integer", text))?,
        None => 0,
    };
    let switch = |key: &str, default: bool| match annotation(key) {
        None => Ok(default),
        Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(bad(key, "must be \"true\" or \"false\"", other)),
    };
    let self_heal = switch(SELF_HEAL_ANNOTATION, policy.self_heal)?;
    let prevent = switch(PREVENT_ANNOTATION, policy.prevent)?;
    let prune = match annotation(PRUNE_ANNOTATION) {
        None => policy.prune,
        Some("disabled") => false,
        Some(other) => {
            return Err(bad(PRUNE_ANNOTATION, "can only be \"disabled\"", other));
        }
    };
    Ok(ObjectSettings {
        wave,
        self_heal,
        prevent,
        prune,
    })
}

/// Puts Windvane's three labels (managed by, app, fleet) on the object.
fn add_windvane_labels(body: &mut Value, fleet: &str, app: &str, id: &ObjectRef) -> Result<()> {
    let not_a_mapping = |field: &'static str| Error::NotAMapping {
        object: id.to_string(),
        field,
    };
    let metadata = body
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| not_a_mapping("metadata"))?;
    let labels = metadata
        .entry("labels")
        .or_insert_with(|| Value::Object(Map::new()));
    let labels = labels
        .as_object_mut()
        .ok_or_else(|| not_a_mapping("metadata.labels"))?;
    labels.insert(
        MANAGED_BY_LABEL.to_owned(),
        Value::String(MANAGED_BY_VALUE.to_owned()),
    );
    labels.insert(APP_LABEL.to_owned(), Value::String(app.to_owned()));
    labels.insert(FLEET_LABEL.to_owned(), Value::String(fleet.to_owned()));
    Ok(())
}

/// Removes the value at an RFC 6901 `pointer`; true when something was there.
pub fn remove_pointer(value: &mut Value, pointer: &str) -> bool {
    let tokens: Vec<String> = pointer
        .split('/')
        .skip(1)
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect();
    let Some((last, parents)) = tokens.split_last() else {
        return false;
    };
    let mut current = value;
    for token in parents {
        current = match current {
            Value::Object(map) => match map.get_mut(token) {
                Some(next) => next,
                None => return false,
            },
            Value::Array(items) => match token.parse::<usize>().ok().and_then(|i| items.get_mut(i))
            {
                Some(next) => next,
                None => return false,
            },
            _ => return false,
        };
    }
    match current {
        Value::Object(map) => map.remove(last).is_some(),
        Value::Array(items) => match last.parse::<usize>() {
            Ok(i) if i < items.len() => {
                items.remove(i);
                true
            }
            _ => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::format::bundle::IgnoreDifference;

    fn rendered(object: Value) -> RenderedObject {
        RenderedObject {
            app: "api".into(),
            file: "apps/api/d.yaml".into(),
            document: 0,
            id: ObjectRef::of(&object).unwrap(),
            object,
        }
    }

    fn deployment(annotations: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "api", "namespace": "api", "annotations": annotations},
               "spec": {"replicas": 3, "template": {"spec": {"containers": [{"name": "a"}]}}}})
    }

    #[test]
    fn labels_are_added_and_ignored_fields_removed() {
        let policy = Policy {
            ignore_differences: vec![IgnoreDifference {
                group: "apps".into(),
                kind: "Deployment".into(),
                name: None,
                namespace: None,
                json_pointers: vec!["/spec/replicas".into(), "/spec/absent".into()],
            }],
            ..Policy::default()
        };
        let desired =
            desired_object("acme", "api", &policy, &rendered(deployment(json!({})))).unwrap();
        assert_eq!(desired.body.pointer("/spec/replicas"), None);
        assert_eq!(
            desired.ignored_pointers,
            vec!["/spec/replicas".to_owned(), "/spec/absent".to_owned()]
        );
        assert_eq!(
            desired.body.pointer("/metadata/labels/windvane.io~1app"),
            Some(&json!("api"))
        );
        assert_eq!(
            desired.body.pointer("/metadata/labels/windvane.io~1fleet"),
            Some(&json!("acme"))
        );
        assert_eq!(
            desired
                .body
                .pointer("/metadata/labels/app.kubernetes.io~1managed-by"),
            Some(&json!("windvane"))
        );
        assert!(desired.self_heal && !desired.prune && desired.wave == 0);
    }

    #[test]
    fn annotations_refine_policy() {
        let policy = Policy {
            prune: true,
            ..Policy::default()
        };
        let object = deployment(
            json!({SELF_HEAL_ANNOTATION: "false", PRUNE_ANNOTATION: "disabled", WAVE_ANNOTATION: "-2"}),
        );
        let desired = desired_object("acme", "api", &policy, &rendered(object)).unwrap();
        assert!(!desired.self_heal && !desired.prune);
        assert_eq!(desired.wave, -2);
        let bad = deployment(json!({WAVE_ANNOTATION: "first"}));
        let err = desired_object("acme", "api", &policy, &rendered(bad)).unwrap_err();
        assert!(err.to_string().contains("windvane.io/wave"), "{err}");
    }

    #[test]
    fn bad_switch_annotations_and_labels_name_the_object_and_the_field() {
        let policy = Policy::default();
        let refused = |object: Value| {
            desired_object("acme", "api", &policy, &rendered(object))
                .unwrap_err()
                .to_string()
        };
        let heal = refused(deployment(json!({SELF_HEAL_ANNOTATION: "sometimes"})));
        assert!(
            heal.contains(SELF_HEAL_ANNOTATION) && heal.contains("\"true\" or \"false\""),
            "{heal}"
        );
        let prune = refused(deployment(json!({PRUNE_ANNOTATION: "false"})));
        assert!(
            prune.contains(PRUNE_ANNOTATION) && prune.contains("can only be \"disabled\""),
            "{prune}"
        );
        // The first bad setting is the one reported, in a fixed order.
        let both = refused(deployment(
            json!({PRUNE_ANNOTATION: "no", SELF_HEAL_ANNOTATION: "no"}),
        ));
        assert!(both.contains(SELF_HEAL_ANNOTATION), "{both}");
        let mut listed = deployment(json!({}));
        listed["metadata"]["labels"] = json!(["a"]);
        let labels = refused(listed);
        assert!(
            labels.contains("metadata.labels must be a mapping"),
            "{labels}"
        );
    }

    #[test]
    fn prevent_comes_from_the_policy_or_the_annotation() {
        let on = Policy {
            prevent: true,
            ..Policy::default()
        };
        let plain = rendered(deployment(json!({})));
        assert!(desired_object("acme", "api", &on, &plain).unwrap().prevent);
        assert!(
            !desired_object("acme", "api", &Policy::default(), &plain)
                .unwrap()
                .prevent
        );
        let opted_in = rendered(deployment(json!({PREVENT_ANNOTATION: "true"})));
        assert!(
            desired_object("acme", "api", &Policy::default(), &opted_in)
                .unwrap()
                .prevent
        );
        let opted_out = rendered(deployment(json!({PREVENT_ANNOTATION: "false"})));
        assert!(
            !desired_object("acme", "api", &on, &opted_out)
                .unwrap()
                .prevent
        );
        let bad = rendered(deployment(json!({PREVENT_ANNOTATION: "yes"})));
        let err = desired_object("acme", "api", &on, &bad).unwrap_err();
        assert!(err.to_string().contains("windvane.io/prevent"), "{err}");
    }

    #[test]
    fn pointers_unescape_and_index_arrays() {
        let mut value = json!({"a/b": {"~c": 1}, "list": [1, 2, 3]});
        assert!(remove_pointer(&mut value, "/a~1b/~0c"));
        assert!(remove_pointer(&mut value, "/list/1"));
        assert!(!remove_pointer(&mut value, "/list/9"));
        assert_eq!(value, json!({"a/b": {}, "list": [1, 3]}));
    }
}
