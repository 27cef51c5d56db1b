//! Manual heal: for alert-only drift (selfHeal false) an operator decides when to revert, with
//! `kubectl annotate … windvane.io/revert=now`. Pure: whether a live object asks for it and who asked (the
//! field manager whose managedFields entry holds the annotation), and the patch that consumes the request
//! once the revert is written. The healer's machine turns a request into one revert.

use serde_json::{Value, json};

/// `now` on a live object: revert its drift once, even though self-heal is off.
pub const REVERT_ANNOTATION: &str = "windvane.io/revert";

/// Who asks for a revert of `live`: the manager that wrote `windvane.io/revert: now` (`unknown` when no
/// entry names it); `None` when the object does not ask.
pub fn requested_by(live: &Value) -> Option<String> {
    let value = live
        .pointer("/metadata/annotations")?
        .get(REVERT_ANNOTATION)?
        .as_str()?;
    if !value.trim().eq_ignore_ascii_case("now") {
        return None;
    }
    let field = format!("f:{REVERT_ANNOTATION}");
    let writer = live
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .and_then(|entries| {
            entries.iter().find(|entry| {
                entry
                    .pointer("/fieldsV1/f:metadata/f:annotations")
                    .and_then(|a| a.get(&field))
                    .is_some()
            })
        })
        .and_then(|entry| entry.get("manager").and_then(Value::as_str));
    Some(writer.unwrap_or("unknown").to_owned())
}

/// The merge patch that consumes a revert request.
pub fn clear() -> Value {
    json!({"metadata": {"annotations": {REVERT_ANNOTATION: null}}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_names_the_manager_that_wrote_it() {
        let live = json!({"metadata": {
        "annotations": {REVERT_ANNOTATION: "now"},
        "managedFields": [
            {"manager": "windvane", "operation": "Apply", "fieldsV1": {"f:data": {}}},
            {"manager": "kubectl-annotate", "operation": "Update",
             "fieldsV1": {"f:metadata": {"f:annotations": {"f:windvane.io/revert": {}}}}},
        ]}});
        assert_eq!(requested_by(&live).as_deref(), Some("kubectl-annotate"));
        let unnamed = json!({"metadata": {"annotations": {REVERT_ANNOTATION: " Now "}}});
        assert_eq!(requested_by(&unnamed).as_deref(), Some("unknown"));
    }

    #[test]
    fn anything_but_now_asks_nothing() {
        for value in ["later", "", "true"] {
            let live = json!({"metadata": {"annotations": {REVERT_ANNOTATION: value}}});
            assert_eq!(requested_by(&live), None, "{value}");
        }
        assert_eq!(requested_by(&json!({"metadata": {}})), None);
        assert_eq!(
            clear()["metadata"]["annotations"][REVERT_ANNOTATION],
            Value::Null
        );
    }
}
