//! Plain tests of the generated policy: its objects, rules, CEL variables and messages. The CEL itself is
//! evaluated by a real API server in `tests/tests/prevent_*.rs`.

use serde_json::{Value, json};

use super::*;

fn settings() -> Settings {
    Settings {
        fleet: "acme".into(),
        serial: 7,
        agent_user: "system:serviceaccount:windvane-system:windvane-agent".into(),
        break_glass_group: "sre:break-glass".into(),
        owner: Some((
            "v1".into(),
            "Namespace".into(),
            "windvane-system".into(),
            "uid-1".into(),
        )),
    }
}

fn deployment(name: &str, owns_replicas: bool) -> Guarded {
    Guarded {
        group: "apps".into(),
        resource: "deployments".into(),
        namespace: Some("shop".into()),
        name: name.into(),
        owns_replicas,
    }
}

fn config_map(name: &str) -> Guarded {
    Guarded {
        group: String::new(),
        resource: "configmaps".into(),
        namespace: Some("shop".into()),
        name: name.into(),
        owns_replicas: false,
    }
}

fn variable<'a>(policy: &'a Value, name: &str) -> &'a str {
    policy["spec"]["variables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .and_then(|v| v["expression"].as_str())
        .unwrap_or_else(|| panic!("no variable {name}"))
}

#[test]
fn nothing_guarded_means_no_policy() {
    assert_eq!(objects(&settings(), &[]), None);
}

#[test]
fn policy_and_binding_are_named_labelled_and_owned() {
    let (policy, binding) = objects(&settings(), &[deployment("web", true)]).unwrap();
    assert_eq!(policy["kind"], "ValidatingAdmissionPolicy");
    assert_eq!(policy["apiVersion"], "admissionregistration.k8s.io/v1");
    assert_eq!(binding["kind"], "ValidatingAdmissionPolicyBinding");
    for object in [&policy, &binding] {
        assert_eq!(object["metadata"]["name"], "windvane-prevent-acme");
        assert_eq!(
            object["metadata"]["labels"],
            json!({"app.kubernetes.io/managed-by": "windvane-agent", "windvane.io/fleet": "acme"})
        );
        assert_eq!(
            object["metadata"]["ownerReferences"],
            json!([{"apiVersion": "v1", "kind": "Namespace", "name": "windvane-system", "uid": "uid-1"}])
        );
    }
    assert_eq!(binding["spec"]["policyName"], "windvane-prevent-acme");
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
}

#[test]
fn rules_cover_update_and_delete_of_each_resource_and_its_scale() {
    let guarded = [
        deployment("web", true),
        config_map("settings"),
        deployment("api", false),
    ];
    let (policy, _) = objects(&settings(), &guarded).unwrap();
    assert_eq!(
        policy["spec"]["matchConstraints"]["resourceRules"],
        json!([
            {"apiGroups": [""], "apiVersions": ["*"], "resources": ["configmaps", "configmaps/scale"],
             "operations": ["UPDATE", "DELETE"]},
            {"apiGroups": ["apps"], "apiVersions": ["*"], "resources": ["deployments", "deployments/scale"],
             "operations": ["UPDATE", "DELETE"]},
        ])
    );
    // Status subresources are never matched: controllers report status freely.
    assert!(!policy.to_string().contains("/status"));
}

#[test]
fn guarded_keys_are_listed_sorted_and_scale_only_where_replicas_are_owned() {
    let guarded = [
        deployment("web", true),
        config_map("settings"),
        deployment("api", false),
    ];
    let (policy, _) = objects(&settings(), &guarded).unwrap();
    assert_eq!(
        variable(&policy, "guarded"),
        "variables.key in ['/configmaps/shop/settings', 'apps/deployments/shop/api', 'apps/deployments/shop/web']"
    );
    let owned = variable(&policy, "ownedChanged");
    assert!(
        owned.contains("variables.key in ['apps/deployments/shop/web'] &&"),
        "{owned}"
    );
    assert!(
        owned.contains("m.manager == 'windvane' && m.operation == 'Apply'"),
        "{owned}"
    );
    assert!(
        owned.starts_with("request.operation == 'DELETE' ||"),
        "{owned}"
    );
}

#[test]
fn cluster_scoped_objects_have_an_empty_namespace_in_their_key() {
    let namespace = Guarded {
        group: String::new(),
        resource: "namespaces".into(),
        namespace: None,
        name: "shop".into(),
        owns_replicas: false,
    };
    let (policy, _) = objects(&settings(), &[namespace]).unwrap();
    assert_eq!(
        variable(&policy, "guarded"),
        "variables.key in ['/namespaces//shop']"
    );
}

#[test]
fn only_the_agent_and_trusted_controllers_are_exempt() {
    let (policy, _) = objects(&settings(), &[deployment("web", true)]).unwrap();
    assert_eq!(
        variable(&policy, "trusted"),
        "variables.user in ['system:serviceaccount:windvane-system:windvane-agent', \
         'system:serviceaccount:kube-system:generic-garbage-collector', \
         'system:serviceaccount:kube-system:namespace-controller']"
    );
    assert_eq!(
        variable(&policy, "breakGlass"),
        "has(request.userInfo.groups) && 'sre:break-glass' in request.userInfo.groups"
    );
}

#[test]
fn the_denial_names_the_release_and_the_way_out() {
    let (policy, _) = objects(&settings(), &[deployment("web", true)]).unwrap();
    let validations = policy["spec"]["validations"].as_array().unwrap();
    let last = validations.last().unwrap();
    assert_eq!(
        last["message"],
        "managed by Windvane release 7 of fleet acme; change it in the release, or use break-glass"
    );
    let expression = last["expression"].as_str().unwrap();
    // Two people: the approver must be someone other than the requester, who names themself.
    assert!(
        expression.contains("variables.approver != variables.user"),
        "{expression}"
    );
    assert!(
        expression.contains("variables.by == variables.user"),
        "{expression}"
    );
    assert!(
        expression.contains("variables.breakGlass && variables.ticket != ''"),
        "{expression}"
    );
    // Every validation lets the agent (and unguarded objects) through first.
    for validation in validations {
        let expression = validation["expression"].as_str().unwrap();
        assert!(
            expression.starts_with("!variables.guarded || variables.trusted || "),
            "{expression}"
        );
    }
}

#[test]
fn approvals_can_only_be_written_by_the_approver() {
    let (policy, _) = objects(&settings(), &[deployment("web", true)]).unwrap();
    let approver = &policy["spec"]["validations"][0];
    let expression = approver["expression"].as_str().unwrap();
    assert!(
        expression.ends_with("(variables.approver == variables.user && variables.breakGlass)"),
        "{expression}"
    );
    assert!(
        approver["message"]
            .as_str()
            .unwrap()
            .contains(APPROVER_ANNOTATION)
    );
    assert_eq!(
        variable(&policy, "approver"),
        "'windvane.io/break-glass-approver' in variables.annotations ? variables.annotations['windvane.io/break-glass-approver'] : ''"
    );
    // A delete is judged on the annotations the object carries.
    assert!(
        variable(&policy, "annotations")
            .starts_with("request.operation == 'DELETE' ? variables.oldAnnotations")
    );
}

#[test]
fn strings_are_quoted_for_cel() {
    assert_eq!(cel_string("it's a \\ test"), "'it\\'s a \\\\ test'");
    let mut odd = settings();
    odd.break_glass_group = "o'brien".into();
    let (policy, _) = objects(&odd, &[deployment("web", false)]).unwrap();
    assert!(variable(&policy, "breakGlass").contains("'o\\'brien' in"));
}

#[test]
fn the_same_set_gives_the_same_objects() {
    let a = objects(
        &settings(),
        &[deployment("web", true), deployment("api", false)],
    );
    let b = objects(
        &settings(),
        &[
            deployment("api", false),
            deployment("web", true),
            deployment("web", true),
        ],
    );
    assert_eq!(a, b);
}

#[test]
fn clusters_older_than_1_30_are_refused_clearly() {
    assert!(supported("1", "30").is_ok());
    assert!(supported("1", "37+").is_ok());
    assert!(supported("2", "0").is_ok());
    let old = supported("1", "29").unwrap_err().to_string();
    assert!(
        old.contains("1.29") && old.contains("1.30") && old.contains("not prevented"),
        "{old}"
    );
    assert!(
        supported("1", "x")
            .unwrap_err()
            .to_string()
            .contains("cannot read")
    );
}

fn annotated(annotations: Value) -> Value {
    json!({"metadata": {"name": "web", "annotations": annotations}})
}

#[test]
fn a_complete_break_glass_names_two_people_and_a_ticket() {
    let live = annotated(json!({
        TICKET_ANNOTATION: "INC-7", BY_ANNOTATION: "alice", APPROVER_ANNOTATION: "bob"}));
    let found = break_glass(&live).unwrap();
    assert_eq!(
        found.to_string(),
        "break-glass by alice, approved by bob, ticket INC-7"
    );
    let self_approved = annotated(json!({
        TICKET_ANNOTATION: "INC-7", BY_ANNOTATION: "alice", APPROVER_ANNOTATION: "alice"}));
    assert_eq!(break_glass(&self_approved), None);
    let no_ticket = annotated(json!({BY_ANNOTATION: "alice", APPROVER_ANNOTATION: "bob"}));
    assert_eq!(break_glass(&no_ticket), None);
    let blank = annotated(json!({
        TICKET_ANNOTATION: " ", BY_ANNOTATION: "alice", APPROVER_ANNOTATION: "bob"}));
    assert_eq!(break_glass(&blank), None);
    assert_eq!(break_glass(&json!({"metadata": {}})), None);
}

#[test]
fn a_break_glass_without_its_own_hold_lasts_the_cap_from_detection() {
    let detected: jiff::Timestamp = "2026-12-04T10:00:00Z".parse().unwrap();
    let cap = std::time::Duration::from_secs(24 * 3600);
    let soon: jiff::Timestamp = "2026-12-04T11:00:00Z".parse().unwrap();
    assert_eq!(
        break_glass_until(detected, soon, cap),
        Some("2026-12-05T10:00:00Z".parse().unwrap())
    );
    let late: jiff::Timestamp = "2026-12-05T10:00:00Z".parse().unwrap();
    assert_eq!(break_glass_until(detected, late, cap), None);
}

#[test]
fn clearing_removes_every_break_glass_annotation_and_the_hold() {
    let patch = clear_break_glass();
    let annotations = patch["metadata"]["annotations"].as_object().unwrap();
    for name in [
        TICKET_ANNOTATION,
        BY_ANNOTATION,
        APPROVER_ANNOTATION,
        "windvane.io/hold-until",
    ] {
        assert_eq!(annotations.get(name), Some(&Value::Null), "{name}");
    }
}

#[test]
fn owner_references_are_owned_fields_and_the_requester_is_bound_to_the_approval() {
    let (policy, _) = objects(&settings(), &[deployment("web", false)]).unwrap();
    let owned = variable(&policy, "ownedChanged");
    assert!(
        owned.contains(
            "has(object.metadata.ownerReferences) ? object.metadata.ownerReferences : []"
        ),
        "{owned}"
    );
    let rebind = &policy["spec"]["validations"][2];
    let expression = rebind["expression"].as_str().unwrap();
    assert!(
        expression.contains(
            "(variables.ticket == variables.oldTicket && variables.by == variables.oldBy)"
        ),
        "{expression}"
    );
    assert!(
        rebind["message"].as_str().unwrap().contains(BY_ANNOTATION),
        "{rebind}"
    );
}

#[test]
fn a_restarted_agent_knows_what_its_live_policy_guards() {
    let (policy, _) = objects(&settings(), &[deployment("web", false)]).unwrap();
    assert!(policy_guards(&policy, &deployment("web", true)));
    assert!(!policy_guards(&policy, &deployment("api", false)));
    assert!(!policy_guards(&json!({}), &deployment("web", false)));
}

#[test]
fn any_break_glass_annotation_is_noticed() {
    assert!(has_break_glass_annotations(&annotated(
        json!({APPROVER_ANNOTATION: "bob"})
    )));
    assert!(has_break_glass_annotations(&annotated(
        json!({TICKET_ANNOTATION: "INC-1"})
    )));
    assert!(!has_break_glass_annotations(&annotated(json!({"x": "y"}))));
    assert!(!has_break_glass_annotations(&json!({})));
}

#[test]
fn a_live_object_with_defaults_is_as_applied_until_a_field_is_changed_or_removed() {
    let wanted = json!({"spec": {"rules": [{"a": 1}], "actions": ["Deny"]}});
    let defaulted =
        json!({"spec": {"rules": [{"a": 1, "scope": "*"}], "actions": ["Deny"], "x": true}});
    assert!(still_as_applied(&defaulted, &wanted));
    let edited = json!({"spec": {"rules": [{"a": 1}], "actions": ["Audit"]}});
    assert!(!still_as_applied(&edited, &wanted));
    let added = json!({"spec": {"rules": [{"a": 1}, {"a": 2}], "actions": ["Deny"]}});
    assert!(!still_as_applied(&added, &wanted));
    assert!(!still_as_applied(&json!({}), &wanted));
}

#[test]
fn a_policy_is_tampered_with_when_gone_changed_or_added_to_by_someone_else() {
    let wanted = json!({"metadata": {"name": "p"}, "spec": {"validationActions": ["Deny"]}});
    assert_eq!(
        tampered(None, &wanted, "windvane").as_deref(),
        Some("deleted")
    );
    let ours = json!({"metadata": {"name": "p", "managedFields": [
        {"manager": "windvane", "operation": "Apply", "fieldsV1": {"f:spec": {"f:validationActions": {}}}}
    ]}, "spec": {"validationActions": ["Deny"], "matchResources": {"matchPolicy": "Equivalent"}}});
    assert_eq!(tampered(Some(&ours), &wanted, "windvane"), None);
    let mut audit = ours.clone();
    audit["spec"]["validationActions"] = json!(["Deny", "Audit"]);
    assert!(tampered(Some(&audit), &wanted, "windvane").is_some());
    let mut added = ours.clone();
    added["metadata"]["managedFields"]
        .as_array_mut()
        .unwrap()
        .push(json!({"manager": "kubectl-patch", "operation": "Update", "fieldsV1": {"f:spec": {"f:matchConditions": {}}}}));
    let why = tampered(Some(&added), &wanted, "windvane").unwrap();
    assert!(why.contains("kubectl-patch"), "{why}");
    // Someone else's labels on it are not the policy's business.
    let mut labelled = ours;
    labelled["metadata"]["managedFields"]
        .as_array_mut()
        .unwrap()
        .push(json!({"manager": "kubectl-label", "operation": "Update", "fieldsV1": {"f:metadata": {"f:labels": {}}}}));
    assert_eq!(tampered(Some(&labelled), &wanted, "windvane"), None);
}

#[test]
fn an_approval_serves_one_change_and_only_the_agent_marks_it_spent() {
    let (policy, _) = objects(&settings(), &[deployment("web", false)]).unwrap();
    let validations = policy["spec"]["validations"].as_array().unwrap();
    let last = validations.last().unwrap()["expression"].as_str().unwrap();
    assert!(last.ends_with("&& variables.oldSpent == '')"), "{last}");
    assert!(validations.iter().any(|v| {
        v["message"]
            .as_str()
            .unwrap()
            .contains("written by the Windvane agent only")
    }));
    let names = BreakGlass {
        by: "alice".into(),
        approver: "bob".into(),
        ticket: "INC-1".into(),
    };
    assert_eq!(
        spend_approval(&names)["metadata"]["annotations"][SPENT_ANNOTATION],
        "break-glass by alice, approved by bob, ticket INC-1"
    );
    assert!(
        clear_break_glass()["metadata"]["annotations"]
            .as_object()
            .unwrap()
            .contains_key(SPENT_ANNOTATION)
    );
}
