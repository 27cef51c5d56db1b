//! Handing fields over before Windvane stops sending them. `ignoreDifferences` removes fields from what
//! Windvane applies; server-side apply then drops every field whose only owner stopped sending it, and the API
//! server defaults it (a Deployment's `replicas` falls to 1 in the middle of the day). So before the first
//! apply without such a field, another field manager ([`HANDOVER_MANAGER`]) applies just that field with its
//! live value, as the Kubernetes docs on transferring ownership describe: the field then has a co-owner, and
//! Windvane's apply drops only Windvane's ownership. The scaler that changes it next takes it over.
//!
//! The decision is pure, from the live object's `managedFields` and the ignored pointers ([`plan`]); the
//! apply path reads the object and runs [`hand_over`] before writing.

use std::collections::BTreeSet;

use serde_json::{Map, Value};
use tracing::{info, warn};
use windvane_shared::decide::desired::FIELD_MANAGER;

use crate::apply::desired::Desired;
use crate::heal::drift::{matches_keys, step};
use crate::kube::cluster::{Cluster, Resolved};
use crate::{Error, Result};

/// The field manager that takes over fields Windvane hands over. It never changes a value: it applies the
/// live one, and gives the field up as soon as someone else changes it.
pub const HANDOVER_MANAGER: &str = "windvane-handover";

/// How often a handover is tried when the object changes between reading it and applying.
const ATTEMPTS: u32 = 3;

/// One owned leaf of a FieldsV1 tree: its path tokens (`f:spec`, `k:{"name":"web"}`, …) and where it is in
/// the live object, as an RFC 6901 pointer (`None` when the live object does not have it).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Leaf {
    tokens: Vec<String>,
    pointer: Option<String>,
    /// The node owns the field as a whole (no owned children): its live value is copied when handed over.
    whole: bool,
}

/// What a handover must do for one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handover {
    /// The fields handed over, as readable pointers (`/spec/replicas`).
    pub fields: Vec<String>,
    /// The apply body of [`HANDOVER_MANAGER`]: identity, resourceVersion (a precondition, so a value changed
    /// meanwhile is never written back) and the handed-over fields with their live values.
    pub body: Value,
}

/// The handover `live` needs before Windvane applies it without the `ignored` pointers: every field under an
/// ignored pointer that Windvane's Apply entry owns and no other manager co-owns. `None` when there is none
/// (the field is not Windvane's, or someone else owns it too, so dropping Windvane's ownership keeps it).
/// `Err` names a field it cannot express in an apply (a list addressed by index).
pub fn plan(live: &Value, ignored: &[String]) -> Result<Option<Handover>> {
    if ignored.is_empty() {
        return Ok(None);
    }
    let mut windvane = Vec::new();
    let mut others = BTreeSet::new();
    for entry in live
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let Some(tree) = entry.get("fieldsV1") else {
            continue;
        };
        let mut leaves = Vec::new();
        walk(tree, Some(live), "", &mut Vec::new(), &mut leaves);
        if is_windvane_apply(entry) {
            windvane.extend(leaves);
        } else {
            // Any other entry, a subresource's too (`scale` owns `spec.replicas`), keeps a field alive.
            others.extend(leaves.into_iter().map(|l| l.tokens));
        }
    }
    let handed: Vec<Leaf> = windvane
        .into_iter()
        .filter(|leaf| {
            leaf.pointer
                .as_deref()
                .is_some_and(|p| ignored.iter().any(|i| under(p, i)))
        })
        .filter(|leaf| !others.contains(&leaf.tokens))
        .collect();
    if handed.is_empty() {
        return Ok(None);
    }
    let mut body = identity(live);
    for leaf in &handed {
        insert(&mut body, live, &leaf.tokens, leaf.whole).map_err(|Unaddressable(token)| {
            Error::FieldPath {
                pointer: leaf.pointer.clone().unwrap_or_else(|| "?".to_owned()),
                token,
            }
        })?;
    }
    Ok(Some(Handover {
        fields: handed.into_iter().filter_map(|l| l.pointer).collect(),
        body,
    }))
}

fn is_windvane_apply(entry: &Value) -> bool {
    entry.get("manager").and_then(Value::as_str) == Some(FIELD_MANAGER)
        && entry.get("operation").and_then(Value::as_str) == Some("Apply")
        && entry
            .get("subresource")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
}

/// True when `pointer` is `ignored` or inside it.
fn under(pointer: &str, ignored: &str) -> bool {
    let ignored = ignored.trim_end_matches('/');
    pointer == ignored
        || pointer
            .strip_prefix(ignored)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The owned leaves of a FieldsV1 tree (a node with no children, or marked `.`), each located in `live`.
fn walk(
    node: &Value,
    live: Option<&Value>,
    pointer: &str,
    tokens: &mut Vec<String>,
    out: &mut Vec<Leaf>,
) {
    let Some(map) = node.as_object() else { return };
    let children: Vec<(&String, &Value)> = map.iter().filter(|(k, _)| k.as_str() != ".").collect();
    if !tokens.is_empty() && (children.is_empty() || map.contains_key(".")) {
        out.push(Leaf {
            tokens: tokens.clone(),
            pointer: live.map(|_| pointer.to_owned()),
            whole: children.is_empty(),
        });
    }
    for (token, child) in children {
        let located = live.and_then(|l| step(l, token));
        let child_pointer = match &located {
            Some((segment, _)) => format!("{pointer}/{segment}"),
            None => String::new(),
        };
        tokens.push(token.clone());
        walk(child, located.map(|(_, v)| v), &child_pointer, tokens, out);
        tokens.pop();
    }
}

/// The object's identity, with its resourceVersion as the apply's precondition.
fn identity(live: &Value) -> Value {
    let mut metadata = Map::new();
    for field in ["name", "namespace", "resourceVersion"] {
        if let Some(value) = live.pointer(&format!("/metadata/{field}")) {
            metadata.insert(field.to_owned(), value.clone());
        }
    }
    let mut body = Map::new();
    for field in ["apiVersion", "kind"] {
        if let Some(value) = live.get(field) {
            body.insert(field.to_owned(), value.clone());
        }
    }
    body.insert("metadata".to_owned(), Value::Object(metadata));
    Value::Object(body)
}

/// Adds the field named by `tokens` to `body` as `live` has it: maps and keyed list items are created
/// (list items with their keys), the leaf copied when `whole`. `Err` is a token no apply can address.
fn insert(
    body: &mut Value,
    live: &Value,
    tokens: &[String],
    whole: bool,
) -> std::result::Result<(), Unaddressable> {
    let Some((token, rest)) = tokens.split_first() else {
        if whole {
            *body = live.clone();
        }
        return Ok(());
    };
    let (_, live_child) = step(live, token).ok_or_else(|| Unaddressable(token.clone()))?;
    let empty = || match live_child {
        Value::Array(_) => Value::Array(Vec::new()),
        _ => Value::Object(Map::new()),
    };
    if let Some(field) = token.strip_prefix("f:") {
        if !body.is_object() {
            *body = Value::Object(Map::new());
        }
        let map = body.as_object_mut().expect("made an object");
        let child = map.entry(field.to_owned()).or_insert_with(empty);
        return insert(child, live_child, rest, whole);
    }
    if !body.is_array() {
        *body = Value::Array(Vec::new());
    }
    let items = body.as_array_mut().expect("made an array");
    if let Some(keys) = token.strip_prefix("k:") {
        let keys: Map<String, Value> =
            serde_json::from_str(keys).map_err(|_| Unaddressable(token.clone()))?;
        let index = match items.iter().position(|item| matches_keys(item, &keys)) {
            Some(index) => index,
            None => {
                items.push(Value::Object(keys));
                items.len() - 1
            }
        };
        return insert(&mut items[index], live_child, rest, whole);
    }
    if token.starts_with("v:") {
        if !items.contains(live_child) {
            items.push(live_child.clone());
        }
        return Ok(());
    }
    Err(Unaddressable(token.clone()))
}

/// A managedFields token (a list position) that no apply can address.
struct Unaddressable(String);

/// Hands over what [`plan`] finds on the live object before `desired` is applied without its ignored fields.
/// Reads the object fresh; when it changed between the read and the handover (a conflict), reads it again.
/// Returns the fields handed over (none when nothing needed it).
pub async fn hand_over(
    cluster: &Cluster,
    desired: &Desired,
    resolved: &Resolved,
) -> Result<Vec<String>> {
    let failed = |detail: String| Error::Apply {
        object: desired.id.to_string(),
        detail: format!(
            "handing the ignored fields over to {HANDOVER_MANAGER} before Windvane stops sending them (not applied, so their live values stay): {detail}"
        ),
    };
    let mut attempt = 0;
    loop {
        let Some(live) = cluster.get(&desired.id, resolved).await? else {
            return Ok(Vec::new());
        };
        let Some(handover) =
            plan(&live, &desired.ignored_pointers).map_err(|e| failed(e.to_string()))?
        else {
            return Ok(Vec::new());
        };
        match cluster
            .apply_as(HANDOVER_MANAGER, &desired.id, resolved, &handover.body)
            .await
        {
            Ok(_) => {
                info!(fields = ?handover.fields, manager = HANDOVER_MANAGER, "handed ignored fields over, keeping their live values");
                return Ok(handover.fields);
            }
            Err(failure) if failure.retriable && attempt + 1 < ATTEMPTS => {
                warn!(error = %failure.message, "handover conflicted; reading the object again");
                attempt += 1;
            }
            Err(failure) => return Err(failed(failure.message)),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn deployment(entries: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "42", "managedFields": entries},
            "spec": {"replicas": 5, "paused": false,
                "template": {"metadata": {"annotations": {"a": "1", "b": "2"}},
                    "spec": {"containers": [{"name": "side", "image": "s:1"}, {"name": "web", "image": "w:1"}]}}}})
    }

    fn entry(manager: &str, operation: &str, subresource: Option<&str>, fields: Value) -> Value {
        let mut entry = json!({"manager": manager, "operation": operation, "apiVersion": "apps/v1",
            "fieldsType": "FieldsV1", "fieldsV1": fields});
        if let Some(subresource) = subresource {
            entry["subresource"] = json!(subresource);
        }
        entry
    }

    fn windvane(fields: Value) -> Value {
        entry("windvane", "Apply", None, fields)
    }

    const REPLICAS: &str = "/spec/replicas";

    #[test]
    fn a_field_only_windvane_owns_is_handed_over_with_its_live_value() {
        let live = deployment(json!([windvane(
            json!({"f:spec": {"f:replicas": {}, "f:paused": {}}})
        )]));
        let handover = plan(&live, &[REPLICAS.to_owned()]).unwrap().unwrap();
        assert_eq!(handover.fields, vec![REPLICAS.to_owned()]);
        assert_eq!(
            handover.body,
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "42"},
                "spec": {"replicas": 5}})
        );
    }

    #[test]
    fn a_field_someone_else_co_owns_needs_no_handover() {
        // A scaler that applies the same value (server-side apply) co-owns it; so does a scale subresource
        // entry, and an earlier handover.
        for other in [
            entry("keda", "Apply", None, json!({"f:spec": {"f:replicas": {}}})),
            entry(
                "hpa",
                "Update",
                Some("scale"),
                json!({"f:spec": {"f:replicas": {}}}),
            ),
            entry(
                HANDOVER_MANAGER,
                "Apply",
                None,
                json!({"f:spec": {"f:replicas": {}}}),
            ),
        ] {
            let live = deployment(json!([
                windvane(json!({"f:spec": {"f:replicas": {}}})),
                other
            ]));
            assert!(
                matches!(plan(&live, &[REPLICAS.to_owned()]), Ok(None)),
                "{other}"
            );
        }
    }

    #[test]
    fn fields_windvane_does_not_own_or_keeps_sending_are_left_alone() {
        // The scaler took the field already (Windvane lost it): dropping it from the apply changes nothing.
        let live = deployment(json!([
            windvane(json!({"f:spec": {"f:paused": {}}})),
            entry(
                "hpa",
                "Update",
                Some("scale"),
                json!({"f:spec": {"f:replicas": {}}})
            ),
        ]));
        assert!(matches!(plan(&live, &[REPLICAS.to_owned()]), Ok(None)));
        // Nothing ignored, or an ignored field absent from the live object.
        let live = deployment(json!([windvane(json!({"f:spec": {"f:replicas": {}}}))]));
        assert!(matches!(plan(&live, &[]), Ok(None)));
        assert!(matches!(
            plan(&live, &["/spec/minReadySeconds".to_owned()]),
            Ok(None)
        ));
        // `/spec/replicasX` is not under `/spec/replicas`.
        assert!(!under("/spec/replicasX", REPLICAS) && under("/spec/replicas", "/spec/replicas/"));
    }

    #[test]
    fn subtrees_and_keyed_list_items_are_handed_over_with_their_keys() {
        let owned = json!({"f:spec": {"f:template": {
            "f:metadata": {"f:annotations": {"f:a": {}, "f:b": {}}},
            "f:spec": {"f:containers": {
                "k:{\"name\":\"side\"}": {".": {}, "f:name": {}, "f:image": {}},
                "k:{\"name\":\"web\"}": {".": {}, "f:name": {}, "f:image": {}}}}}}});
        let live = deployment(json!([
            windvane(owned),
            entry(
                "annotator",
                "Update",
                None,
                json!({"f:spec": {"f:template": {"f:metadata": {"f:annotations": {"f:b": {}}}}}})
            ),
        ]));
        let ignored = [
            "/spec/template/metadata/annotations".to_owned(),
            "/spec/template/spec/containers/1/image".to_owned(),
        ];
        let handover = plan(&live, &ignored).unwrap().unwrap();
        assert_eq!(
            handover.fields,
            vec![
                "/spec/template/metadata/annotations/a".to_owned(),
                "/spec/template/spec/containers/1/image".to_owned()
            ]
        );
        assert_eq!(
            handover.body["spec"],
            json!({"template": {"metadata": {"annotations": {"a": "1"}},
                "spec": {"containers": [{"name": "web", "image": "w:1"}]}}})
        );
    }

    #[test]
    fn keys_with_slashes_and_set_items_resolve() {
        let mut live = deployment(json!([windvane(
            json!({"f:metadata": {"f:labels": {"f:app.kubernetes.io/part-of": {}}},
            "f:spec": {"f:finalizers": {"v:\"x.io/keep\"": {}}}})
        )]));
        live["metadata"]["labels"] = json!({"app.kubernetes.io/part-of": "shop"});
        live["spec"]["finalizers"] = json!(["a", "x.io/keep"]);
        let handover = plan(
            &live,
            &["/metadata/labels".to_owned(), "/spec/finalizers".to_owned()],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            handover.fields,
            vec![
                "/metadata/labels/app.kubernetes.io~1part-of".to_owned(),
                "/spec/finalizers/1".to_owned()
            ]
        );
        assert_eq!(
            handover.body["metadata"]["labels"],
            json!({"app.kubernetes.io/part-of": "shop"})
        );
        assert_eq!(handover.body["spec"]["finalizers"], json!(["x.io/keep"]));
    }

    #[test]
    fn a_list_owned_by_position_cannot_be_handed_over() {
        let mut live = deployment(json!([windvane(
            json!({"f:spec": {"f:ports": {"i:0": {"f:port": {}}}}})
        )]));
        live["spec"]["ports"] = json!([{"port": 80}]);
        let error = plan(&live, &["/spec/ports".to_owned()])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("/spec/ports/0/port") && error.contains("i:0"),
            "{error}"
        );
    }
}
