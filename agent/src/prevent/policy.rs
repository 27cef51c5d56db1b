//! Prevention, decided purely: from the objects of the enforced release that have `prevent` on (the app's
//! `policy.prevent`, or the object's `windvane.io/prevent` annotation), the ValidatingAdmissionPolicy and its
//! binding that the agent keeps in the cluster (the executor is [`crate::prevent::keeper`]). The policy, in
//! CEL, refuses an UPDATE or DELETE of a guarded object by anyone but the agent's own identity and a few
//! trusted controllers, when the request changes a field Windvane owns; the break-glass group has a two-person
//! way through.
//!
//! Which fields Windvane owns is read the way drift detection reads it: the `managedFields` entry of manager
//! `windvane` (operation Apply). The API server updates managedFields before validating admission, so a
//! request that takes or drops one of Windvane's fields changes that entry, and a request that touches only
//! other fields (a label of someone else's, the objects' own controllers on their annotations) leaves it as
//! it was. Fields under `ignoreDifferences` are never sent, so never owned: they stay writable. `/scale`
//! requests carry a Scale object without managedFields, so for them the policy knows, per object, whether
//! Windvane sends `/spec/replicas`. Status subresources are not matched at all.
//!
//! Break-glass, two people: a member of the break-glass group may change owned fields when the object
//! carries `windvane.io/break-glass-ticket`, `windvane.io/break-glass-by` naming the requester, and
//! `windvane.io/break-glass-approver` naming someone else. The policy lets anyone write the `by` and
//! `approver` annotations only with their own user name (and `approver` only as a group member), so an
//! approver annotation naming bob was written by bob: an approval cannot be self-signed or forged. Changing
//! the ticket or the requester while an approval stands is refused (unless the approval is removed in the
//! same change), so an approval covers the one requester and ticket it was given for; and annotations
//! written while an object was not guarded (before prevention covered it, or while its policy was gone) are
//! removed by the agent as soon as the policy guards it ([`has_break_glass_annotations`]).
//!
//! `metadata.ownerReferences` of a guarded object are guarded too: an owner reference added by a user (to an
//! owner that does not exist, say) would let the garbage collector, a trusted controller, delete it.

use serde_json::{Value, json};
use windvane_shared::decide::desired::{FIELD_MANAGER, FLEET_LABEL, MANAGED_BY_LABEL};

/// Names the break-glass ticket (an incident reference) on a prevented object.
pub const TICKET_ANNOTATION: &str = "windvane.io/break-glass-ticket";
/// Names the user making a break-glass change; only that user can write it.
pub const BY_ANNOTATION: &str = "windvane.io/break-glass-by";
/// Names the second person who approved; only that user, a member of the break-glass group, can write it.
pub const APPROVER_ANNOTATION: &str = "windvane.io/break-glass-approver";
/// Set by the agent once a break-glass change was made under the approval: the approval is spent, a further
/// change of owned fields is refused until the revert clears it. Only the agent may write it.
pub const SPENT_ANNOTATION: &str = "windvane.io/break-glass-spent";
/// The break-glass group when none is configured.
pub const DEFAULT_BREAK_GLASS_GROUP: &str = "windvane:break-glass";
/// [`MANAGED_BY_LABEL`] on the policy and binding: the agent's own objects, not a release's.
pub const AGENT_MANAGED_BY: &str = "windvane-agent";
/// Controllers whose writes to guarded objects are never refused: the garbage collector (dependents whose
/// owner went) and the namespace controller (a namespace being deleted).
pub const TRUSTED_CONTROLLERS: [&str; 2] = [
    "system:serviceaccount:kube-system:generic-garbage-collector",
    "system:serviceaccount:kube-system:namespace-controller",
];
/// The first Kubernetes minor version (1.x) serving admissionregistration.k8s.io/v1 policies.
pub const MIN_MINOR: u32 = 30;

/// One guarded object, as the API server names it in an admission request.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Guarded {
    /// API group; empty for the core group.
    pub group: String,
    /// The resource (plural), e.g. `deployments`.
    pub resource: String,
    pub namespace: Option<String>,
    pub name: String,
    /// True when the release sends `/spec/replicas` (so `/scale` changes an owned field).
    pub owns_replicas: bool,
}

impl Guarded {
    /// `group/resource/namespace/name`, as the policy's `variables.key` builds it from the request.
    fn key(&self) -> String {
        format!(
            "{}/{}/{}/{}",
            self.group,
            self.resource,
            self.namespace.as_deref().unwrap_or(""),
            self.name
        )
    }
}

/// What the policy needs to know besides the guarded objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub fleet: String,
    /// The release serial enforced, named in the denial message.
    pub serial: u64,
    /// The user name the agent authenticates as (from a SelfSubjectReview).
    pub agent_user: String,
    pub break_glass_group: String,
    /// The object the policy and binding belong to (the agent's Namespace), so that uninstalling the agent
    /// removes them: `(apiVersion, kind, name, uid)`.
    pub owner: Option<(String, String, String, String)>,
}

/// The name of the policy and of its binding for `fleet`.
pub fn policy_name(fleet: &str) -> String {
    format!("windvane-prevent-{fleet}")
}

/// The denial message.
pub fn denial_message(fleet: &str, serial: u64) -> String {
    format!(
        "managed by Windvane release {serial} of fleet {fleet}; change it in the release, or use break-glass"
    )
}

/// Whether a cluster of version `major.minor` can enforce prevention; `Err` says why not.
pub fn supported(major: &str, minor: &str) -> crate::Result<()> {
    let version = || format!("{major}.{minor}");
    let number = |text: &str| {
        text.trim_end_matches('+')
            .parse::<u32>()
            .map_err(|_| crate::Error::KubeVersion { version: version() })
    };
    let (major_n, minor_n) = (number(major)?, number(minor)?);
    if major_n > 1 || (major_n == 1 && minor_n >= MIN_MINOR) {
        Ok(())
    } else {
        Err(crate::Error::PreventUnsupported {
            version: version(),
            min_minor: MIN_MINOR,
        })
    }
}

/// A CEL string literal.
fn cel_string(text: &str) -> String {
    let escaped = text.replace('\\', "\\\\").replace('\'', "\\'");
    format!("'{escaped}'")
}

fn cel_list<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    let items: Vec<String> = items.into_iter().map(cel_string).collect();
    format!("[{}]", items.join(", "))
}

/// `name`'s value in the annotation map `map`, or `''`.
fn annotation(map: &str, name: &str) -> String {
    let key = cel_string(name);
    format!("{key} in variables.{map} ? variables.{map}[{key}] : ''")
}

fn variable(name: &str, expression: String) -> Value {
    json!({"name": name, "expression": expression})
}

/// The policy's variables, in order (each may use the ones before it).
fn variables(settings: &Settings, guarded: &[Guarded]) -> Vec<Value> {
    let keys: Vec<String> = guarded.iter().map(Guarded::key).collect();
    let replicas: Vec<String> = guarded
        .iter()
        .filter(|g| g.owns_replicas)
        .map(Guarded::key)
        .collect();
    let mut trusted = vec![settings.agent_user.as_str()];
    trusted.extend(TRUSTED_CONTROLLERS);
    let owned = |object: &str| {
        format!(
            "{object} != null && has({object}.metadata.managedFields) ? {object}.metadata.managedFields.filter(m, m.manager == {} && m.operation == 'Apply') : []",
            cel_string(FIELD_MANAGER)
        )
    };
    let owners = |object: &str| {
        format!(
            "{object} != null && has({object}.metadata.ownerReferences) ? {object}.metadata.ownerReferences : []"
        )
    };
    let annotations = |object: &str| {
        format!(
            "{object} != null && has({object}.metadata.annotations) ? {object}.metadata.annotations : {{}}"
        )
    };
    vec![
        variable(
            "key",
            "request.resource.group + '/' + request.resource.resource + '/' + request.namespace + '/' + request.name".to_owned(),
        ),
        variable("guarded", format!("variables.key in {}", cel_list(keys.iter().map(String::as_str)))),
        variable("user", "request.userInfo.username".to_owned()),
        variable("trusted", format!("variables.user in {}", cel_list(trusted))),
        variable(
            "breakGlass",
            format!(
                "has(request.userInfo.groups) && {} in request.userInfo.groups",
                cel_string(&settings.break_glass_group)
            ),
        ),
        variable("oldAnnotations", annotations("oldObject")),
        variable(
            "annotations",
            format!("request.operation == 'DELETE' ? variables.oldAnnotations : ({})", annotations("object")),
        ),
        variable("ticket", annotation("annotations", TICKET_ANNOTATION)),
        variable("by", annotation("annotations", BY_ANNOTATION)),
        variable("approver", annotation("annotations", APPROVER_ANNOTATION)),
        variable("oldTicket", annotation("oldAnnotations", TICKET_ANNOTATION)),
        variable("oldBy", annotation("oldAnnotations", BY_ANNOTATION)),
        variable("oldApprover", annotation("oldAnnotations", APPROVER_ANNOTATION)),
        variable("spent", annotation("annotations", SPENT_ANNOTATION)),
        variable("oldSpent", annotation("oldAnnotations", SPENT_ANNOTATION)),
        variable(
            "ownedChanged",
            format!(
                "request.operation == 'DELETE' || (has(request.subResource) && request.subResource == 'scale' ? (variables.key in {} && (has(object.spec.replicas) ? object.spec.replicas : 0) != (has(oldObject.spec.replicas) ? oldObject.spec.replicas : 0)) : (({}) != ({}) || ({}) != ({})))",
                cel_list(replicas.iter().map(String::as_str)),
                owned("oldObject"),
                owned("object"),
                owners("oldObject"),
                owners("object"),
            ),
        ),
    ]
}

/// The validations, in the order their messages matter.
fn validations(settings: &Settings) -> Vec<Value> {
    let exempt = "!variables.guarded || variables.trusted";
    let group = &settings.break_glass_group;
    let denial = denial_message(&settings.fleet, settings.serial);
    let break_glass_help = format!(
        "{denial}; a break-glass change needs annotations {TICKET_ANNOTATION}, {BY_ANNOTATION} naming you, and {APPROVER_ANNOTATION} written by another member of {group}; an approval serves one change"
    );
    vec![
        json!({
            "expression": format!("{exempt} || variables.approver == variables.oldApprover || variables.approver == '' || (variables.approver == variables.user && variables.breakGlass)"),
            "message": format!("{APPROVER_ANNOTATION} can only be written by the approver themself, a member of {group}"),
        }),
        json!({
            "expression": format!("{exempt} || variables.by == variables.oldBy || variables.by == '' || variables.by == variables.user"),
            "message": format!("{BY_ANNOTATION} can only name the user who writes it"),
        }),
        json!({
            "expression": format!("{exempt} || (variables.ticket == variables.oldTicket && variables.by == variables.oldBy) || variables.approver == '' || variables.approver != variables.oldApprover"),
            "message": format!("changing {TICKET_ANNOTATION} or {BY_ANNOTATION} needs a new approval: remove {APPROVER_ANNOTATION} in the same change"),
        }),
        json!({
            "expression": format!("{exempt} || variables.spent == variables.oldSpent || request.operation == 'DELETE'"),
            "message": format!("{SPENT_ANNOTATION} is written by the Windvane agent only"),
        }),
        json!({
            "expression": format!("{exempt} || !variables.ownedChanged || (variables.breakGlass && variables.ticket != '' && variables.by == variables.user && variables.approver != '' && variables.approver != variables.user && variables.oldSpent == '')"),
            "message": denial,
            "messageExpression": format!("variables.breakGlass ? {} : {}", cel_string(&break_glass_help), cel_string(&denial)),
        }),
    ]
}

/// The resource rules: UPDATE and DELETE of each guarded resource and its `/scale`, by API group.
fn resource_rules(guarded: &[Guarded]) -> Vec<Value> {
    let mut by_group: std::collections::BTreeMap<&str, std::collections::BTreeSet<String>> =
        std::collections::BTreeMap::new();
    for g in guarded {
        let resources = by_group.entry(&g.group).or_default();
        resources.insert(g.resource.clone());
        resources.insert(format!("{}/scale", g.resource));
    }
    by_group
        .into_iter()
        .map(|(group, resources)| {
            json!({
                "apiGroups": [group],
                "apiVersions": ["*"],
                "resources": resources,
                "operations": ["UPDATE", "DELETE"],
            })
        })
        .collect()
}

fn metadata(settings: &Settings) -> Value {
    let mut metadata = json!({
        "name": policy_name(&settings.fleet),
        "labels": {MANAGED_BY_LABEL: AGENT_MANAGED_BY, FLEET_LABEL: settings.fleet},
    });
    if let Some((api_version, kind, name, uid)) = &settings.owner {
        metadata["ownerReferences"] =
            json!([{"apiVersion": api_version, "kind": kind, "name": name, "uid": uid}]);
    }
    metadata
}

/// The policy and its binding guarding `guarded` (sorted, so the same set gives the same objects); `None`
/// when nothing is guarded (then neither should exist).
pub fn objects(settings: &Settings, guarded: &[Guarded]) -> Option<(Value, Value)> {
    if guarded.is_empty() {
        return None;
    }
    let mut guarded = guarded.to_vec();
    guarded.sort();
    guarded.dedup();
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": metadata(settings),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": resource_rules(&guarded)},
            "variables": variables(settings, &guarded),
            "validations": validations(settings),
        },
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": metadata(settings),
        "spec": {
            "policyName": policy_name(&settings.fleet),
            "validationActions": ["Deny"],
        },
    });
    Some((policy, binding))
}

/// A break-glass change's names, as the policy let them onto the object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakGlass {
    pub by: String,
    pub approver: String,
    pub ticket: String,
}

impl std::fmt::Display for BreakGlass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "break-glass by {}, approved by {}, ticket {}",
            self.by, self.approver, self.ticket
        )
    }
}

fn live_annotation<'a>(live: &'a Value, name: &str) -> Option<&'a str> {
    live.pointer("/metadata/annotations")?
        .get(name)?
        .as_str()
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// The break-glass names a live object carries, when complete (ticket, author, and an approver who is not
/// the author). Only meaningful on a prevented object: there the policy checked who wrote them.
pub fn break_glass(live: &Value) -> Option<BreakGlass> {
    let found = BreakGlass {
        by: live_annotation(live, BY_ANNOTATION)?.to_owned(),
        approver: live_annotation(live, APPROVER_ANNOTATION)?.to_owned(),
        ticket: live_annotation(live, TICKET_ANNOTATION)?.to_owned(),
    };
    (found.by != found.approver).then_some(found)
}

/// True when a live object carries any of the break-glass annotations (complete or not). On an object that
/// just became guarded they were written unchecked, so the agent removes them ([`clear_break_glass`]).
pub fn has_break_glass_annotations(live: &Value) -> bool {
    [
        TICKET_ANNOTATION,
        BY_ANNOTATION,
        APPROVER_ANNOTATION,
        SPENT_ANNOTATION,
    ]
    .iter()
    .any(|name| live_annotation(live, name).is_some())
}

/// Whether `policy` (a live policy, as the agent applied it) guards `guarded`: what a restarted agent finds
/// guarded already, so that break-glass annotations written under it are not taken for unchecked ones.
pub fn policy_guards(policy: &Value, guarded: &Guarded) -> bool {
    let Some(variables) = policy.pointer("/spec/variables").and_then(Value::as_array) else {
        return false;
    };
    let literal = cel_string(&guarded.key());
    variables.iter().any(|v| {
        v["name"] == "guarded"
            && v["expression"]
                .as_str()
                .is_some_and(|e| e.contains(&literal))
    })
}

/// Why the live policy or binding (`None`: gone) is not what the agent applied (`wanted`), or `None` when it
/// is: a field of `wanted` removed or changed, or a field of its `spec` owned by another manager than
/// `agent_manager` (someone added or changed one: defaults the API server fills in are owned by no one).
pub fn tampered(live: Option<&Value>, wanted: &Value, agent_manager: &str) -> Option<String> {
    let Some(live) = live else {
        return Some("deleted".to_owned());
    };
    if !still_as_applied(&live["spec"], &wanted["spec"])
        || !still_as_applied(&live["metadata"], &wanted["metadata"])
    {
        return Some("a field the agent set was changed or removed".to_owned());
    }
    let entries = live
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)?;
    entries
        .iter()
        .find(|entry| {
            entry["manager"].as_str() != Some(agent_manager)
                && entry.pointer("/fieldsV1/f:spec").is_some()
        })
        .map(|entry| {
            format!(
                "manager {} set fields of its spec",
                entry["manager"].as_str().unwrap_or("unknown")
            )
        })
}

/// Whether `live` (an object the API server returns, with defaults filled in) still holds every field of
/// `wanted` (what the agent applied) with its value: `false` once someone removed or changed any of them.
pub fn still_as_applied(live: &Value, wanted: &Value) -> bool {
    match (live, wanted) {
        (Value::Object(live), Value::Object(wanted)) => wanted
            .iter()
            .all(|(k, w)| live.get(k).is_some_and(|l| still_as_applied(l, w))),
        (Value::Array(live), Value::Array(wanted)) => {
            live.len() == wanted.len()
                && live.iter().zip(wanted).all(|(l, w)| still_as_applied(l, w))
        }
        (live, wanted) => live == wanted,
    }
}

/// Until when a break-glass change without its own `windvane.io/hold-until` is held: `cap` after it was
/// detected; `None` once that is past.
pub fn break_glass_until(
    detected: jiff::Timestamp,
    now: jiff::Timestamp,
    cap: std::time::Duration,
) -> Option<jiff::Timestamp> {
    let until = detected.checked_add(cap).ok()?;
    (until > now).then_some(until)
}

/// The merge patch that clears a break-glass change's annotations (and its hold) once it is reverted, so
/// that its approval cannot be used again.
pub fn clear_break_glass() -> Value {
    json!({"metadata": {"annotations": {
        TICKET_ANNOTATION: null,
        BY_ANNOTATION: null,
        APPROVER_ANNOTATION: null,
        SPENT_ANNOTATION: null,
        windvane_shared::decide::desired::HOLD_UNTIL_ANNOTATION: null,
    }}})
}

/// The merge patch that marks the approval of `names` spent: the change it allowed was made.
pub fn spend_approval(names: &BreakGlass) -> Value {
    json!({"metadata": {"annotations": {SPENT_ANNOTATION: names.to_string()}}})
}

#[cfg(test)]
mod tests;
