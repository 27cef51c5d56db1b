//! A desired object as the agent holds it from rendering until the release changes: its identity and
//! policy, and its body as compact JSON, parsed only to apply it. A parsed body takes several times the
//! memory of its text, and the agent holds every object of the release (for the sync, then for the healer),
//! while it applies only a few at a time. Built from the renderer's [`DesiredObject`]s as each app renders.

use std::time::Duration;

use serde_json::Value;
use windvane_shared::crypto::digest::sha256_hex;
use windvane_shared::decide::desired::DesiredObject;
use windvane_shared::format::bundle::ObjectRef;

/// One desired object with its body kept as compact JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    pub app: String,
    pub id: ObjectRef,
    pub wave: i64,
    pub self_heal: bool,
    /// True when the app prunes and the object is not marked `windvane.io/prune: disabled`.
    pub prune: bool,
    pub drift_grace_period: Option<Duration>,
    /// Changes to the fields Windvane owns are refused at admission ([`crate::prevent::policy`]).
    pub prevent: bool,
    /// The pointers `ignoreDifferences` leaves to other managers: never sent, handed over before Windvane's
    /// ownership of them is dropped ([`crate::heal::handover`]).
    pub ignored_pointers: Vec<String>,
    /// The app's `namespace:`, for a namespaced object that names none (`None`: `default`).
    pub default_namespace: Option<String>,
    /// How the object runs once, if it does ([`crate::apply::run_once`]): its disappearance may not be drift.
    pub run_once: Option<crate::apply::run_once::RunOnce>,
    /// The body sent with server-side apply, as `serde_json::to_vec` writes it.
    body: Box<[u8]>,
}

impl Desired {
    /// Keeps a rendered object, its body serialized.
    pub fn of(mut object: DesiredObject) -> Self {
        drop_empty_annotations(&mut object.body);
        Self {
            run_once: crate::apply::run_once::shape(&object.body),
            body: compact(&object.body),
            app: object.app,
            id: object.id,
            wave: object.wave,
            self_heal: object.self_heal,
            prune: object.prune,
            drift_grace_period: object.drift_grace_period,
            prevent: object.prevent,
            ignored_pointers: object.ignored_pointers,
            default_namespace: object.default_namespace,
        }
    }

    /// The body to apply. The text was written by serde_json from a value, so it always parses.
    pub fn body(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// The body to apply as the JSON text it is kept as, sent without parsing it into a value first.
    pub fn raw_body(&self) -> &serde_json::value::RawValue {
        // The text was written by serde_json, so it always parses; should it not, the API server says why.
        serde_json::from_slice(&self.body).unwrap_or(serde_json::value::RawValue::NULL)
    }

    /// Length of the body as sent, in bytes.
    pub fn body_len(&self) -> usize {
        self.body.len()
    }

    /// SHA-256 of the body as sent: what the inventory records to recognise an unchanged body.
    pub fn body_hash(&self) -> String {
        sha256_hex(&self.body)
    }

    /// Sets `metadata.namespace` of the body (and the identity's namespace).
    pub fn set_namespace(&mut self, namespace: &str) {
        self.id.namespace = Some(namespace.to_owned());
        let mut body = self.body();
        if let Some(metadata) = body.get_mut("metadata").and_then(Value::as_object_mut) {
            metadata.insert("namespace".to_owned(), namespace.into());
        }
        self.body = compact(&body);
    }
}

fn compact(body: &Value) -> Box<[u8]> {
    serde_json::to_vec(body)
        .unwrap_or_default()
        .into_boxed_slice()
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use windvane_shared::decide::render::RenderedObject;
    use windvane_shared::format::bundle::Policy;

    use super::*;

    #[test]
    fn the_body_comes_back_as_rendered_and_hashes_as_sent() {
        let object = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "annotations": {"z": "1", "a": "2"}}, "data": {"k": "v", "n": 1.5}});
        let rendered = RenderedObject {
            app: "app".into(),
            file: "f.yaml".into(),
            document: 0,
            id: ObjectRef::of(&object).unwrap(),
            object,
        };
        let desired_object = windvane_shared::decide::desired::desired_object(
            "fleet",
            "app",
            &Policy::default(),
            &rendered,
        )
        .unwrap();
        let body = desired_object.body.clone();
        let mut desired = Desired::of(desired_object);
        assert_eq!(desired.body(), body);
        assert_eq!(
            desired.body_hash(),
            sha256_hex(&serde_json::to_vec(&body).unwrap())
        );
        desired.set_namespace("default");
        assert_eq!(desired.id.namespace.as_deref(), Some("default"));
        assert_eq!(
            desired.body().pointer("/metadata/namespace"),
            Some(&json!("default"))
        );
    }
}

/// Removes an empty `metadata.annotations: {}` (charts print one for every empty `annotations` value). Sent,
/// it would make Windvane own the empty map; the first controller to annotate the object (a Deployment's
/// revision) then takes that ownership, which reads as drift and is reverted for nothing. Sending no map
/// asks for the same thing: no annotations of Windvane's.
fn drop_empty_annotations(body: &mut Value) {
    if let Some(metadata) = body.get_mut("metadata").and_then(Value::as_object_mut)
        && metadata
            .get("annotations")
            .is_some_and(|a| a.as_object().is_some_and(serde_json::Map::is_empty) || a.is_null())
    {
        metadata.remove("annotations");
    }
}

#[cfg(test)]
mod empty_annotations_tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_empty_annotations_map_is_not_sent_and_anything_else_is() {
        let mut empty = json!({"metadata": {"name": "web", "annotations": {}},
            "spec": {"template": {"spec": {"volumes": [{"name": "tmp", "emptyDir": {}}]}}}});
        drop_empty_annotations(&mut empty);
        assert_eq!(
            empty,
            json!({"metadata": {"name": "web"},
                "spec": {"template": {"spec": {"volumes": [{"name": "tmp", "emptyDir": {}}]}}}}),
            "only metadata.annotations goes; other empty maps mean something"
        );
        let mut kept = json!({"metadata": {"name": "web", "annotations": {"a": "1"}}});
        let before = kept.clone();
        drop_empty_annotations(&mut kept);
        assert_eq!(kept, before);
    }
}
