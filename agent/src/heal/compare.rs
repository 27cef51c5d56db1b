//! Comparing a live object with what a server-side-apply dry run says it would become: the basis of both
//! `windvane-agent diff` (show it) and the periodic backstop (heal it). Fields the API server maintains on
//! every write (resourceVersion, managedFields, generation, timestamps) and status are left out, so a
//! difference means Windvane's apply would really change the object. Secret values are masked before
//! anything is shown.

use std::sync::OnceLock;

use serde_json::Value;
use windvane_shared::crypto::digest::sha256_hex;

/// The object without the fields that change on every write and without status.
pub fn comparable(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(map) = object.as_object_mut() {
        map.remove("status");
        if let Some(metadata) = map.get_mut("metadata").and_then(Value::as_object_mut) {
            for noisy in [
                "managedFields",
                "resourceVersion",
                "generation",
                "creationTimestamp",
                "uid",
                "selfLink",
            ] {
                metadata.remove(noisy);
            }
        }
    }
    object
}

/// True when applying would change the live object.
pub fn would_change(live: Option<&Value>, dry_run: &Value) -> bool {
    live.is_none_or(|live| comparable(live) != comparable(dry_run))
}

/// The key of this process's masks: random, never shown, so a mask reveals whether two values of one output
/// are equal but cannot be checked against guessed passwords offline (an unkeyed digest of a weak password
/// can). `None` when the system has no randomness: values are then masked without any digest.
fn mask_key() -> Option<&'static [u8; 32]> {
    static KEY: OnceLock<Option<[u8; 32]>> = OnceLock::new();
    KEY.get_or_init(|| {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).ok().map(|()| key)
    })
    .as_ref()
}

/// How a Secret value is shown: a keyed digest, the same for the same value within this process.
fn masked(text: &str) -> String {
    match mask_key() {
        Some(key) => {
            let mut keyed = Vec::with_capacity(key.len() + text.len());
            keyed.extend_from_slice(key);
            keyed.extend_from_slice(text.as_bytes());
            format!("<masked {}>", &sha256_hex(&keyed)[..12])
        }
        None => "<masked>".to_owned(),
    }
}

/// A Secret with every value under `data` and `stringData` replaced by a short keyed digest ([`masked`]), so
/// a diff shows that a value changed without showing the value. Other kinds are returned as they are.
pub fn mask_secret(object: &Value) -> Value {
    let mut object = object.clone();
    let is_secret = object.get("kind").and_then(Value::as_str) == Some("Secret")
        && object.get("apiVersion").and_then(Value::as_str) == Some("v1");
    if is_secret && let Some(map) = object.as_object_mut() {
        for field in ["data", "stringData"] {
            if let Some(values) = map.get_mut(field).and_then(Value::as_object_mut) {
                for value in values.values_mut() {
                    *value = Value::String(masked(value.as_str().unwrap_or_default()));
                }
            }
        }
        // The last-applied annotation of older tools would carry the values in clear text.
        if let Some(annotations) = map
            .get_mut("metadata")
            .and_then(|m| m.get_mut("annotations"))
            .and_then(Value::as_object_mut)
        {
            annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
        }
    }
    object
}

/// `object` with the value at each of `pointers` (JSON pointers) replaced by its keyed digest ([`masked`]):
/// the values a SOPS file held encrypted, of any kind of object, once opened.
pub fn mask_at(object: &Value, pointers: &std::collections::BTreeSet<String>) -> Value {
    let mut object = object.clone();
    for pointer in pointers {
        if let Some(value) = object.pointer_mut(pointer) {
            let text = match &*value {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            *value = Value::String(masked(&text));
        }
    }
    object
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn values_at_the_given_pointers_are_masked_whatever_the_kind() {
        let object = json!({"kind": "ConfigMap", "data": {"password": "hunter2", "plain": "x"}, "spec": {"port": 5432}});
        let pointers = ["/data/password", "/spec/port", "/not/there"]
            .map(str::to_owned)
            .into_iter()
            .collect();
        let shown = mask_at(&object, &pointers);
        let text = shown.to_string();
        assert!(
            !text.contains("hunter2") && !text.contains("5432"),
            "{text}"
        );
        assert!(
            shown["data"]["password"]
                .as_str()
                .unwrap()
                .starts_with("<masked")
        );
        assert_eq!(shown["data"]["plain"], "x");
    }

    #[test]
    fn bookkeeping_fields_are_not_differences() {
        let live = json!({"kind": "ConfigMap", "metadata": {"name": "a", "resourceVersion": "5", "managedFields": [1]}, "data": {"k": "v"}});
        let dry = json!({"kind": "ConfigMap", "metadata": {"name": "a", "resourceVersion": "6", "managedFields": [2]}, "data": {"k": "v"}});
        assert!(!would_change(Some(&live), &dry));
        let changed = json!({"kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "w"}});
        assert!(would_change(Some(&live), &changed));
        assert!(would_change(None, &dry));
    }

    #[test]
    fn secret_values_never_show() {
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"password": "aHVudGVyMg=="}, "stringData": {"token": "abc"}});
        let masked = mask_secret(&secret).to_string();
        assert!(
            !masked.contains("aHVudGVyMg==") && !masked.contains("\"abc\""),
            "{masked}"
        );
        assert!(masked.contains("<masked "));
        // The mask is keyed: not the plain digest of the value, which a weak password could be found from.
        assert!(
            !masked.contains(&sha256_hex(b"aHVudGVyMg==")[..12]),
            "{masked}"
        );
        let again = mask_secret(&secret);
        assert_eq!(again.to_string(), masked, "equal values show equal masks");
        let changed = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"password": "aHVudGVyMw=="}});
        assert_ne!(
            mask_secret(&changed)["data"]["password"],
            again["data"]["password"]
        );
        let other = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"password": "x"}});
        assert_eq!(mask_secret(&other), other);
    }
}
