//! Drift, decided from `managedFields` alone — no extra API calls. After Windvane applies an object, the
//! `windvane` Apply entry of its managedFields is the set of fields Windvane owns. When anyone else changes
//! one of those fields the API server moves it to that manager (or drops it, if it was removed); so a watch
//! event whose Windvane-owned set shrank is drift, and the other entries that now hold the lost fields say
//! who took them, how and when. Also here: operators' holds (`windvane.io/hold-until`), the tracker that
//! notices a controller war and stops fighting it, and a field's value read by its FieldsV1 path. All pure;
//! the engine feeds it watch events and acts.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Map, Value};
use windvane_shared::crypto::digest::sha256_hex;
use windvane_shared::decide::desired::{FIELD_MANAGER, HOLD_UNTIL_ANNOTATION};

use crate::apply::inventory::ObjectKey;

/// The leaf fields a manager's Apply entry owns, as `/`-joined FieldsV1 paths (`f:spec/f:replicas`,
/// `f:spec/f:template/f:spec/f:containers/k:{"name":"web"}/f:image`). Subresource entries are not counted:
/// Windvane only applies the main resource.
pub fn owned_fields(live: &Value, manager: &str) -> BTreeSet<String> {
    let mut fields = BTreeSet::new();
    let Some(entries) = live
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return fields;
    };
    for entry in entries {
        let is_manager = entry.get("manager").and_then(Value::as_str) == Some(manager);
        let is_apply = entry.get("operation").and_then(Value::as_str) == Some("Apply");
        let main_resource = entry
            .get("subresource")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty);
        if is_manager
            && is_apply
            && main_resource
            && let Some(tree) = entry.get("fieldsV1")
        {
            flatten(tree, &mut String::new(), &mut fields);
        }
    }
    fields
}

fn flatten(node: &Value, prefix: &mut String, out: &mut BTreeSet<String>) {
    let Some(map) = node.as_object() else { return };
    let children: Vec<(&String, &Value)> = map.iter().filter(|(k, _)| k.as_str() != ".").collect();
    if (children.is_empty() || map.contains_key(".")) && !prefix.is_empty() {
        out.insert(prefix.clone());
    }
    for (key, child) in children {
        let length = prefix.len();
        if !prefix.is_empty() {
            prefix.push('/');
        }
        prefix.push_str(key);
        flatten(child, prefix, out);
        prefix.truncate(length);
    }
}

/// What Windvane's last apply of an object left it owning: the baseline drift is judged against. Taken from
/// the apply's response as it returns, so the response itself need not be kept.
#[derive(Debug, Clone)]
pub struct Baseline {
    /// [`owned_fields`] of the `windvane` manager.
    pub owned: BTreeSet<String>,
    /// The object's resourceVersion then.
    pub resource_version: u64,
    /// [`Baseline::digest`], once asked for: an apply computes it while other applies are in flight, so that
    /// the inventory written after the last one need not.
    digest: std::sync::OnceLock<String>,
}

impl PartialEq for Baseline {
    fn eq(&self, other: &Self) -> bool {
        self.owned == other.owned && self.resource_version == other.resource_version
    }
}

impl Eq for Baseline {}

impl Baseline {
    /// The baseline a live object shows.
    pub fn of(live: &Value) -> Self {
        Self {
            owned: owned_fields(live, FIELD_MANAGER),
            resource_version: resource_version(live),
            digest: std::sync::OnceLock::new(),
        }
    }

    /// A digest of the owned field set, to recognise it after a restart without keeping it.
    pub fn digest(&self) -> &str {
        self.digest.get_or_init(|| {
            let mut text = String::new();
            for field in &self.owned {
                text.push_str(field);
                text.push('\n');
            }
            sha256_hex(text.as_bytes())
        })
    }
}

/// An object's resourceVersion as a number (0 when absent), to order events against Windvane's writes.
pub fn resource_version(live: &Value) -> u64 {
    live.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Fields in `baseline` that `current` no longer has.
pub fn lost_fields(baseline: &BTreeSet<String>, current: &BTreeSet<String>) -> Vec<String> {
    baseline.difference(current).cloned().collect()
}

/// A FieldsV1 path as people read it: `f:spec/f:replicas` → `/spec/replicas`, list items by key
/// (`/spec/template/spec/containers/[name=web]/image`), set values as `[=value]`, indexes as numbers.
pub fn readable(path: &str) -> String {
    let mut out = String::new();
    for token in path.split('/') {
        out.push('/');
        if let Some(field) = token.strip_prefix("f:") {
            out.push_str(&field.replace('~', "~0").replace('/', "~1"));
        } else if let Some(keys) = token.strip_prefix("k:") {
            let pairs = serde_json::from_str::<Map<String, Value>>(keys)
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| {
                            format!(
                                "{k}={}",
                                v.as_str().map_or_else(|| v.to_string(), str::to_owned)
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_else(|_| keys.to_owned());
            out.push_str(&format!("[{pairs}]"));
        } else if let Some(value) = token.strip_prefix("v:") {
            out.push_str(&format!("[={value}]"));
        } else if let Some(index) = token.strip_prefix("i:") {
            out.push_str(index);
        } else {
            out.push_str(token);
        }
    }
    out
}

/// The value a `/`-joined FieldsV1 path (as [`owned_fields`] writes it) names in `live`; `None` when `live`
/// does not have it. A `/` inside a token (an annotation's key, a list key's value) stays in its token: a
/// new token starts only at a segment beginning `f:`, `k:`, `v:` or `i:`.
pub fn value_at<'a>(live: &'a Value, path: &str) -> Option<&'a Value> {
    let mut tokens: Vec<String> = Vec::new();
    for segment in path.split('/') {
        let starts_token = ["f:", "k:", "v:", "i:"]
            .iter()
            .any(|prefix| segment.starts_with(prefix));
        match tokens.last_mut() {
            Some(last) if !starts_token => {
                last.push('/');
                last.push_str(segment);
            }
            _ => tokens.push(segment.to_owned()),
        }
    }
    tokens.iter().try_fold(live, |node, token| {
        step(node, token).map(|(_, value)| value)
    })
}

/// One FieldsV1 token applied to a live value: the pointer segment and the value it names.
pub fn step<'a>(live: &'a Value, token: &str) -> Option<(String, &'a Value)> {
    if let Some(field) = token.strip_prefix("f:") {
        return live.get(field).map(|v| (escape(field), v));
    }
    let items = live.as_array()?;
    let index = if let Some(keys) = token.strip_prefix("k:") {
        let keys: Map<String, Value> = serde_json::from_str(keys).ok()?;
        items.iter().position(|item| matches_keys(item, &keys))?
    } else if let Some(value) = token.strip_prefix("v:") {
        let value: Value = serde_json::from_str(value).ok()?;
        items.iter().position(|item| *item == value)?
    } else {
        token.strip_prefix("i:")?.parse::<usize>().ok()?
    };
    items.get(index).map(|v| (index.to_string(), v))
}

/// True when a list item has every key of a FieldsV1 `k:` token.
pub fn matches_keys(item: &Value, keys: &Map<String, Value>) -> bool {
    keys.iter().all(|(k, v)| item.get(k) == Some(v))
}

fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// Who took fields from Windvane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribution {
    pub manager: String,
    pub operation: String,
    pub time: Option<Timestamp>,
}

/// The other manager whose entry holds the most of the `lost` fields (the latest, on a tie). `None` when no
/// one holds them: the fields were removed, not taken.
pub fn attribute(live: &Value, lost: &[String]) -> Option<Attribution> {
    let entries = live.pointer("/metadata/managedFields")?.as_array()?;
    let mut best: Option<(usize, Option<Timestamp>, Attribution)> = None;
    for entry in entries {
        let manager = entry
            .get("manager")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let operation = entry
            .get("operation")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if manager == FIELD_MANAGER && operation == "Apply" {
            continue;
        }
        let mut fields = BTreeSet::new();
        if let Some(tree) = entry.get("fieldsV1") {
            flatten(tree, &mut String::new(), &mut fields);
        }
        // A subresource entry (scale, status) names fields relative to the same object.
        let held = lost.iter().filter(|f| fields.contains(*f)).count();
        if held == 0 {
            continue;
        }
        let time = entry
            .get("time")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<Timestamp>().ok());
        let candidate = Attribution {
            manager: manager.to_owned(),
            operation: operation.to_owned(),
            time,
        };
        if best
            .as_ref()
            .is_none_or(|(count, when, _)| held > *count || (held == *count && time > *when))
        {
            best = Some((held, time, candidate));
        }
    }
    best.map(|(_, _, attribution)| attribution)
}

/// The time an operator's `windvane.io/hold-until` annotation on a live object names, expired or not;
/// `None` without one. `Err` names a malformed annotation (which holds nothing).
pub fn hold_annotation(live: &Value) -> crate::Result<Option<Timestamp>> {
    let key = HOLD_UNTIL_ANNOTATION.replace('/', "~1");
    let Some(text) = live
        .pointer(&format!("/metadata/annotations/{key}"))
        .and_then(Value::as_str)
    else {
        return Ok(None);
    };
    let until: Timestamp = text
        .trim()
        .parse()
        .map_err(|source| crate::Error::HoldAnnotation {
            annotation: HOLD_UNTIL_ANNOTATION,
            value: text.to_owned(),
            source,
        })?;
    Ok(Some(until))
}

/// Annotation in which the agent writes when it first saw a hold on an object, so that the hold cap is
/// measured from that moment across agent restarts (the in-memory record dies with the process, and a cap
/// that restarts with the agent lets a forgotten far-future hold live forever). Its value is
/// `<RFC 3339 time> <digest of the hold>`: a different hold (a new `hold-until`, another break-glass
/// request) does not match and is timed afresh, exactly as it would be in memory.
pub const HOLD_SEEN_ANNOTATION: &str = "windvane.io/hold-seen";

/// The short digest that binds a [`HOLD_SEEN_ANNOTATION`] to the hold it times.
fn hold_digest(what: &str) -> String {
    sha256_hex(what.as_bytes())[..16].to_owned()
}

/// The value of [`HOLD_SEEN_ANNOTATION`] for the hold `what` first seen at `at`.
pub fn hold_seen_value(what: &str, at: Timestamp) -> String {
    format!("{at} {}", hold_digest(what))
}

/// When the hold `what` was first seen, as the object's [`HOLD_SEEN_ANNOTATION`] remembers it; `None` when
/// the annotation is missing, malformed or about another hold. A time after `now` is read as `now`: whoever
/// can edit the object could set the hold afresh anyway, but never push its start into the future.
pub fn hold_seen(live: &Value, what: &str, now: Timestamp) -> Option<Timestamp> {
    let key = HOLD_SEEN_ANNOTATION.replace('/', "~1");
    let text = live
        .pointer(&format!("/metadata/annotations/{key}"))
        .and_then(Value::as_str)?;
    let (at, digest) = text.trim().split_once(' ')?;
    let at: Timestamp = at.parse().ok()?;
    (digest == hold_digest(what)).then_some(at.min(now))
}

/// Until when a hold to `until`, first seen at `since`, holds at `now`: at most `cap` after `since` — the
/// cap is measured from the hold's first detection, not from each look, so a far-future hold ends — and
/// `None` once that is past.
pub fn capped_hold(
    until: Timestamp,
    since: Timestamp,
    now: Timestamp,
    cap: Duration,
) -> Option<Timestamp> {
    let latest = since.checked_add(cap).unwrap_or(until);
    let until = until.min(latest);
    (until > now).then_some(until)
}

/// Who last touched an object's metadata annotations, for a Held status: the manager whose entry holds the
/// hold annotation.
pub fn hold_setter(live: &Value) -> Option<String> {
    let path = format!("f:metadata/f:annotations/f:{HOLD_UNTIL_ANNOTATION}");
    let entries = live.pointer("/metadata/managedFields")?.as_array()?;
    entries.iter().find_map(|entry| {
        let mut fields = BTreeSet::new();
        flatten(entry.get("fieldsV1")?, &mut String::new(), &mut fields);
        fields.contains(&path).then(|| {
            entry
                .get("manager")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_owned()
        })
    })
}

/// Notices a controller war: the same other manager taking fields of the same object again and again.
#[derive(Debug, Clone)]
pub struct ContestTracker {
    /// How many takes within `window` make a war.
    pub threshold: usize,
    pub window: Duration,
    /// First back-off; doubles with each further war on the same object, up to `max_backoff`.
    pub base_backoff: Duration,
    pub max_backoff: Duration,
    takes: HashMap<(ObjectKey, String), VecDeque<Timestamp>>,
    wars: HashMap<ObjectKey, u32>,
}

impl Default for ContestTracker {
    fn default() -> Self {
        Self::new(
            3,
            Duration::from_secs(600),
            Duration::from_secs(60),
            Duration::from_secs(3600),
        )
    }
}

impl ContestTracker {
    /// A tracker: `threshold` takes in `window` → back off from `base_backoff`, doubling up to `max_backoff`.
    pub fn new(
        threshold: usize,
        window: Duration,
        base_backoff: Duration,
        max_backoff: Duration,
    ) -> Self {
        Self {
            threshold,
            window,
            base_backoff,
            max_backoff,
            takes: HashMap::new(),
            wars: HashMap::new(),
        }
    }

    /// Records that `manager` took fields of `key` at `now`. Returns the back-off to observe when this makes a
    /// war (the object is then Contested), `None` when Windvane should simply revert.
    pub fn record(&mut self, key: &ObjectKey, manager: &str, now: Timestamp) -> Option<Duration> {
        let takes = self
            .takes
            .entry((key.clone(), manager.to_owned()))
            .or_default();
        takes.push_back(now);
        while takes
            .front()
            .is_some_and(|t| now.duration_since(*t).unsigned_abs() > self.window)
        {
            takes.pop_front();
        }
        if takes.len() < self.threshold {
            return None;
        }
        takes.clear();
        let wars = self.wars.entry(key.clone()).or_insert(0);
        let backoff = self
            .base_backoff
            .saturating_mul(2u32.saturating_pow((*wars).min(16)))
            .min(self.max_backoff);
        *wars += 1;
        Some(backoff)
    }

    /// Keeps only the objects for which `keep` holds (the others left the release).
    pub fn retain(&mut self, mut keep: impl FnMut(&ObjectKey) -> bool) {
        self.takes.retain(|(key, _), _| keep(key));
        self.wars.retain(|key, _| keep(key));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn deployment(entries: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "managedFields": entries}})
    }

    fn windvane_entry(fields: Value) -> Value {
        json!({"manager": "windvane", "operation": "Apply", "apiVersion": "apps/v1", "fieldsType": "FieldsV1", "fieldsV1": fields})
    }

    #[test]
    fn owned_fields_are_the_leaves_of_windvanes_apply_entry() {
        let live = deployment(json!([
            windvane_entry(json!({"f:metadata": {"f:labels": {"f:app": {}}}, "f:spec": {"f:replicas": {},
                "f:template": {"f:spec": {"f:containers": {"k:{\"name\":\"web\"}": {".": {}, "f:image": {}, "f:name": {}}}}}}})),
            {"manager": "kube-controller-manager", "operation": "Update", "subresource": "status", "fieldsV1": {"f:status": {"f:replicas": {}}}},
        ]));
        let owned = owned_fields(&live, "windvane");
        assert!(owned.contains("f:spec/f:replicas"));
        assert!(owned.contains("f:metadata/f:labels/f:app"));
        assert!(owned.contains("f:spec/f:template/f:spec/f:containers/k:{\"name\":\"web\"}"));
        assert!(
            owned.contains("f:spec/f:template/f:spec/f:containers/k:{\"name\":\"web\"}/f:image")
        );
        assert!(!owned.iter().any(|f| f.starts_with("f:status")));
        assert_eq!(
            readable("f:spec/f:template/f:spec/f:containers/k:{\"name\":\"web\"}/f:image"),
            "/spec/template/spec/containers/[name=web]/image"
        );
    }

    #[test]
    fn a_baselines_digest_follows_its_owned_fields_and_asking_for_it_changes_nothing_else() {
        let one = deployment(json!([windvane_entry(
            json!({"f:spec": {"f:replicas": {}}})
        )]));
        let two = deployment(json!([windvane_entry(
            json!({"f:spec": {"f:replicas": {}, "f:paused": {}}})
        )]));
        let asked = Baseline::of(&one);
        let digest = asked.digest().to_owned();
        assert_eq!(asked.digest(), digest, "computed once, the same after");
        assert_eq!(
            asked,
            Baseline::of(&one),
            "equal whether the digest was asked for or not"
        );
        assert_eq!(Baseline::of(&one).digest(), digest);
        assert_ne!(Baseline::of(&two).digest(), digest);
        assert_ne!(Baseline::of(&two), asked);
    }

    #[test]
    fn a_field_path_names_its_value_in_the_live_object() {
        let live = json!({"metadata": {"annotations": {"example.com/ticket": "INC-7"}},
            "spec": {"replicas": 3, "template": {"spec": {"containers": [
                {"name": "side", "image": "side:1"},
                {"name": "a/b", "image": "web:2", "args": ["--fast"]}]}}}});
        let at = |path: &str| value_at(&live, path).cloned();
        assert_eq!(at("f:spec/f:replicas"), Some(json!(3)));
        assert_eq!(
            at("f:spec/f:template/f:spec/f:containers/k:{\"name\":\"a/b\"}/f:image"),
            Some(json!("web:2"))
        );
        assert_eq!(
            at("f:spec/f:template/f:spec/f:containers/i:0/f:image"),
            Some(json!("side:1"))
        );
        assert_eq!(
            at("f:spec/f:template/f:spec/f:containers/k:{\"name\":\"a/b\"}/f:args/v:\"--fast\""),
            Some(json!("--fast"))
        );
        assert_eq!(
            at("f:metadata/f:annotations/f:example.com/ticket"),
            Some(json!("INC-7"))
        );
        assert_eq!(at("f:spec/f:paused"), None);
        assert_eq!(
            at("f:spec/f:template/f:spec/f:containers/k:{\"name\":\"gone\"}/f:image"),
            None
        );
    }

    #[test]
    fn a_taken_field_is_lost_and_attributed_to_whoever_holds_it() {
        let before = deployment(json!([windvane_entry(
            json!({"f:spec": {"f:replicas": {}, "f:paused": {}}})
        )]));
        let after = deployment(json!([
            windvane_entry(json!({"f:spec": {"f:paused": {}}})),
            {"manager": "kubectl-scale", "operation": "Update", "subresource": "scale", "time": "2026-12-02T10:00:00Z",
             "fieldsV1": {"f:spec": {"f:replicas": {}}}},
        ]));
        let lost = lost_fields(
            &owned_fields(&before, "windvane"),
            &owned_fields(&after, "windvane"),
        );
        assert_eq!(lost, vec!["f:spec/f:replicas".to_owned()]);
        let who = attribute(&after, &lost).unwrap();
        assert_eq!(
            (who.manager.as_str(), who.operation.as_str()),
            ("kubectl-scale", "Update")
        );
        assert_eq!(who.time, Some("2026-12-02T10:00:00Z".parse().unwrap()));
        // A field that someone else also sets to the same value is shared, not lost.
        assert!(
            lost_fields(
                &owned_fields(&before, "windvane"),
                &owned_fields(&before, "windvane")
            )
            .is_empty()
        );
    }

    #[test]
    fn removed_fields_have_no_one_to_blame() {
        let after = deployment(json!([windvane_entry(json!({}))]));
        assert_eq!(
            attribute(&after, &["f:metadata/f:labels/f:x".to_owned()]),
            None
        );
    }

    #[test]
    fn holds_are_capped_from_their_first_detection_and_expire() {
        let now: Timestamp = "2026-12-02T10:00:00Z".parse().unwrap();
        let at = |text: &str| -> Timestamp { text.parse().unwrap() };
        let held =
            |value: &str| json!({"metadata": {"annotations": {"windvane.io/hold-until": value}}});
        let day = Duration::from_secs(86_400);
        let until = |value: &str| hold_annotation(&held(value)).unwrap().unwrap();
        let short = until("2026-12-02T11:00:00Z");
        assert_eq!(capped_hold(short, now, now, day), Some(short));
        let far = until("2099-01-01T00:00:00Z");
        assert_eq!(
            capped_hold(far, now, now, day),
            Some(at("2026-12-03T10:00:00Z"))
        );
        // Looked at again 23 h later, the same hold still ends a day after it was first seen…
        let later = at("2026-12-03T09:00:00Z");
        assert_eq!(
            capped_hold(far, now, later, day),
            Some(at("2026-12-03T10:00:00Z"))
        );
        // …and holds nothing once that is past, however far its own time.
        assert_eq!(capped_hold(far, now, at("2026-12-03T10:00:00Z"), day), None);
        let past = until("2026-12-02T09:00:00Z");
        assert_eq!(capped_hold(past, now, now, day), None);
        assert!(
            hold_annotation(&held("tomorrow"))
                .unwrap_err()
                .to_string()
                .contains("RFC 3339")
        );
        assert_eq!(hold_annotation(&json!({})).unwrap(), None);
    }

    #[test]
    fn the_same_manager_taking_a_field_three_times_is_a_war_with_growing_backoff() {
        let mut tracker = ContestTracker::default();
        let key = ObjectKey {
            group: "apps".into(),
            kind: "Deployment".into(),
            namespace: Some("a".into()),
            name: "web".into(),
        };
        let t0: Timestamp = "2026-12-02T10:00:00Z".parse().unwrap();
        let at = |s: i64| t0.checked_add(jiff::SignedDuration::from_secs(s)).unwrap();
        assert_eq!(tracker.record(&key, "hpa", at(0)), None);
        assert_eq!(
            tracker.record(&key, "other", at(1)),
            None,
            "another manager counts apart"
        );
        assert_eq!(tracker.record(&key, "hpa", at(2)), None);
        assert_eq!(
            tracker.record(&key, "hpa", at(3)),
            Some(Duration::from_secs(60))
        );
        for s in 4..6 {
            assert_eq!(tracker.record(&key, "hpa", at(s)), None);
        }
        assert_eq!(
            tracker.record(&key, "hpa", at(6)),
            Some(Duration::from_secs(120)),
            "backs off longer"
        );
        // Takes spread wider than the window are not a war.
        let mut tracker = ContestTracker::default();
        for i in 0..5 {
            assert_eq!(tracker.record(&key, "hpa", at(i * 601)), None);
        }
    }
}
