//! Health of live objects, from their status as the API server reports it (fed by the agent's watches).
//! Built in: Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, PersistentVolumeClaim,
//! CustomResourceDefinition, Namespace, APIService (its `Available` condition: an aggregated API whose backend
//! is down is Degraded, not Synced); any other kind is judged by `status.observedGeneration` and a
//! `Ready` condition when it has them, and is healthy when it has neither (a ConfigMap has no rollout).

use serde::Deserialize;
use serde_json::{Map, Value};

/// How a live object is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Healthy,
    /// Rolling out or settling; expected to become healthy.
    Progressing(String),
    /// Failed or stuck.
    Degraded(String),
}

impl Health {
    /// True for [`Health::Healthy`].
    pub fn is_healthy(&self) -> bool {
        matches!(self, Health::Healthy)
    }
}

/// Assesses a live object of the given API group and kind.
pub fn assess(group: &str, kind: &str, live: &Value) -> Health {
    if let Some(health) = generation_lag(live) {
        return health;
    }
    match (group, kind) {
        ("apps", "Deployment") => deployment(live),
        ("apps", "StatefulSet") => stateful_set(live),
        ("apps", "DaemonSet") => daemon_set(live),
        ("apps", "ReplicaSet") => replica_set(live),
        ("batch", "Job") => job(live),
        ("", "PersistentVolumeClaim") => pvc(live),
        ("apiextensions.k8s.io", "CustomResourceDefinition") => crd(live),
        ("", "Namespace") => namespace(live),
        ("apiregistration.k8s.io", "APIService") => api_service(live),
        _ => generic(live),
    }
}

fn int(live: &Value, pointer: &str) -> Option<i64> {
    live.pointer(pointer).and_then(Value::as_i64)
}

fn text<'a>(live: &'a Value, pointer: &str) -> Option<&'a str> {
    live.pointer(pointer).and_then(Value::as_str)
}

/// The condition of the given type: (status, reason, message).
fn condition<'a>(live: &'a Value, kind: &str) -> Option<(&'a str, &'a str, &'a str)> {
    live.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find_map(|c| {
            (c.get("type")?.as_str()? == kind).then(|| {
                let field = |name: &str| c.get(name).and_then(Value::as_str).unwrap_or("");
                (field("status"), field("reason"), field("message"))
            })
        })
}

/// The controller has not yet seen the latest spec: whatever the status says is about an older one.
fn generation_lag(live: &Value) -> Option<Health> {
    let generation = int(live, "/metadata/generation")?;
    let observed = int(live, "/status/observedGeneration")?;
    (observed < generation).then(|| {
        Health::Progressing(format!(
            "waiting for the controller to observe generation {generation}"
        ))
    })
}

fn deployment(live: &Value) -> Health {
    if let Some(("False", "ProgressDeadlineExceeded", message)) = condition(live, "Progressing") {
        return Health::Degraded(format!("rollout stuck: {message}"));
    }
    if int(live, "/status/observedGeneration").is_none() {
        return Health::Progressing("waiting for the deployment controller".to_owned());
    }
    let wanted = int(live, "/spec/replicas").unwrap_or(1);
    let updated = int(live, "/status/updatedReplicas").unwrap_or(0);
    let available = int(live, "/status/availableReplicas").unwrap_or(0);
    let total = int(live, "/status/replicas").unwrap_or(0);
    if updated < wanted {
        Health::Progressing(format!("{updated} of {wanted} replicas updated"))
    } else if total > updated {
        Health::Progressing(format!(
            "{} old replicas pending termination",
            total - updated
        ))
    } else if available < wanted {
        Health::Progressing(format!("{available} of {wanted} replicas available"))
    } else {
        Health::Healthy
    }
}

fn stateful_set(live: &Value) -> Health {
    if int(live, "/status/observedGeneration").is_none() {
        return Health::Progressing("waiting for the statefulset controller".to_owned());
    }
    let wanted = int(live, "/spec/replicas").unwrap_or(1);
    let ready = int(live, "/status/readyReplicas").unwrap_or(0);
    let updated = int(live, "/status/updatedReplicas").unwrap_or(0);
    let rolling =
        text(live, "/spec/updateStrategy/type").unwrap_or("RollingUpdate") == "RollingUpdate";
    // A partitioned rollout updates only the pods from ordinal `partition` up; the others stay as they are
    // on purpose (a canary), so the rollout is done once those are updated.
    let partition = int(live, "/spec/updateStrategy/rollingUpdate/partition")
        .unwrap_or(0)
        .clamp(0, wanted.max(0));
    let to_update = wanted - partition;
    if ready < wanted {
        Health::Progressing(format!("{ready} of {wanted} replicas ready"))
    } else if rolling && updated < to_update {
        Health::Progressing(format!("{updated} of {to_update} replicas updated"))
    } else {
        Health::Healthy
    }
}

fn daemon_set(live: &Value) -> Health {
    if int(live, "/status/observedGeneration").is_none() {
        return Health::Progressing("waiting for the daemonset controller".to_owned());
    }
    let desired = int(live, "/status/desiredNumberScheduled").unwrap_or(0);
    let updated = int(live, "/status/updatedNumberScheduled").unwrap_or(0);
    let available = int(live, "/status/numberAvailable").unwrap_or(0);
    // OnDelete replaces a pod only when someone deletes it: old pods are not a rollout in progress.
    let rolling =
        text(live, "/spec/updateStrategy/type").unwrap_or("RollingUpdate") == "RollingUpdate";
    if rolling && updated < desired {
        Health::Progressing(format!("{updated} of {desired} pods updated"))
    } else if available < desired {
        Health::Progressing(format!("{available} of {desired} pods available"))
    } else {
        Health::Healthy
    }
}

fn replica_set(live: &Value) -> Health {
    // The controller cannot create pods (a quota, an admission webhook, a missing ServiceAccount): it will
    // not get better by waiting.
    if let Some(("True", reason, message)) = condition(live, "ReplicaFailure") {
        return Health::Degraded(format!("cannot create pods ({reason}): {message}"));
    }
    let wanted = int(live, "/spec/replicas").unwrap_or(1);
    let available = int(live, "/status/availableReplicas").unwrap_or(0);
    if available < wanted {
        Health::Progressing(format!("{available} of {wanted} replicas available"))
    } else {
        Health::Healthy
    }
}

fn job(live: &Value) -> Health {
    if let Some(("True", reason, message)) = condition(live, "Failed") {
        return Health::Degraded(format!("job failed ({reason}): {message}"));
    }
    match condition(live, "Complete") {
        Some(("True", _, _)) => Health::Healthy,
        _ => Health::Progressing("job running".to_owned()),
    }
}

fn pvc(live: &Value) -> Health {
    match text(live, "/status/phase") {
        Some("Bound") => Health::Healthy,
        Some("Lost") => Health::Degraded("claim lost its volume".to_owned()),
        phase => Health::Progressing(format!(
            "claim {}",
            phase.unwrap_or("pending").to_lowercase()
        )),
    }
}

fn crd(live: &Value) -> Health {
    if let Some(("False", reason, message)) = condition(live, "NamesAccepted") {
        return Health::Degraded(format!("names not accepted ({reason}): {message}"));
    }
    match condition(live, "Established") {
        Some(("True", _, _)) => Health::Healthy,
        _ => Health::Progressing("waiting to be established".to_owned()),
    }
}

fn namespace(live: &Value) -> Health {
    match text(live, "/status/phase") {
        Some("Active") | None => Health::Healthy,
        Some(phase) => Health::Progressing(format!("namespace {}", phase.to_lowercase())),
    }
}

fn api_service(live: &Value) -> Health {
    match condition(live, "Available") {
        Some(("True", _, _)) => Health::Healthy,
        Some(("False", reason, message)) => {
            Health::Degraded(format!("unavailable ({reason}): {message}"))
        }
        _ => Health::Progressing("waiting to become available".to_owned()),
    }
}

fn generic(live: &Value) -> Health {
    match condition(live, "Ready") {
        Some(("False", reason, message)) => {
            Health::Degraded(format!("not ready ({reason}): {message}"))
        }
        Some(("Unknown", reason, _)) => {
            Health::Progressing(format!("readiness unknown ({reason})"))
        }
        _ => Health::Healthy,
    }
}

/// [`assess`] of an object kept as JSON text. Only the fields health reads are built (generation, replicas,
/// update strategy, status): the rest, a Deployment's template and managed fields above all, is skipped
/// while parsing, which makes judging a thousand objects after a sync several times cheaper.
pub fn assess_text(group: &str, kind: &str, text: &[u8]) -> Option<Health> {
    let view = match serde_json::from_slice::<HealthFields>(text) {
        Ok(fields) => fields.into_value(),
        // A shape the view does not expect (a `spec` that is not an object): judged from the whole object.
        Err(_) => serde_json::from_slice(text).ok()?,
    };
    Some(assess(group, kind, &view))
}

/// What [`assess`] reads of an object.
#[derive(Deserialize, Default)]
#[serde(default)]
struct HealthFields {
    metadata: GenerationField,
    spec: SpecFields,
    status: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct GenerationField {
    generation: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct SpecFields {
    replicas: Option<Value>,
    update_strategy: Option<Value>,
}

impl HealthFields {
    fn into_value(self) -> Value {
        let mut metadata = Map::new();
        if let Some(generation) = self.metadata.generation {
            metadata.insert("generation".to_owned(), generation);
        }
        let mut spec = Map::new();
        if let Some(replicas) = self.spec.replicas {
            spec.insert("replicas".to_owned(), replicas);
        }
        if let Some(strategy) = self.spec.update_strategy {
            spec.insert("updateStrategy".to_owned(), strategy);
        }
        let mut object = Map::new();
        object.insert("metadata".to_owned(), Value::Object(metadata));
        object.insert("spec".to_owned(), Value::Object(spec));
        if let Some(status) = self.status {
            object.insert("status".to_owned(), status);
        }
        Value::Object(object)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn deployments_progress_until_every_replica_is_updated_and_available() {
        let mut d = json!({"metadata": {"generation": 2}, "spec": {"replicas": 3},
            "status": {"observedGeneration": 1}});
        assert!(
            matches!(assess("apps", "Deployment", &d), Health::Progressing(m) if m.contains("generation 2"))
        );
        d["status"] = json!({"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 2});
        assert!(
            matches!(assess("apps", "Deployment", &d), Health::Progressing(m) if m.contains("2 of 3"))
        );
        d["status"]["availableReplicas"] = json!(3);
        assert_eq!(assess("apps", "Deployment", &d), Health::Healthy);
        d["status"]["conditions"] = json!([{"type": "Progressing", "status": "False",
            "reason": "ProgressDeadlineExceeded", "message": "ReplicaSet \"x\" has timed out progressing."}]);
        assert!(matches!(
            assess("apps", "Deployment", &d),
            Health::Degraded(_)
        ));
    }

    #[test]
    fn an_api_service_is_healthy_only_when_available() {
        let with = |status: &str| {
            json!({"status": {"conditions": [{"type": "Available", "status": status,
                "reason": "MissingEndpoints", "message": "no addresses"}]}})
        };
        let group = "apiregistration.k8s.io";
        assert!(assess(group, "APIService", &with("True")).is_healthy());
        assert_eq!(
            assess(group, "APIService", &with("False")),
            Health::Degraded("unavailable (MissingEndpoints): no addresses".to_owned())
        );
        assert!(matches!(
            assess(group, "APIService", &json!({})),
            Health::Progressing(_)
        ));
    }

    #[test]
    fn jobs_crds_pvcs_namespaces() {
        let failed = json!({"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}});
        assert!(matches!(
            assess("batch", "Job", &failed),
            Health::Degraded(_)
        ));
        let done = json!({"status": {"conditions": [{"type": "Complete", "status": "True"}]}});
        assert!(assess("batch", "Job", &done).is_healthy());
        let crd = json!({"status": {"conditions": [{"type": "Established", "status": "True"}]}});
        assert!(assess("apiextensions.k8s.io", "CustomResourceDefinition", &crd).is_healthy());
        assert!(
            !assess(
                "apiextensions.k8s.io",
                "CustomResourceDefinition",
                &json!({})
            )
            .is_healthy()
        );
        assert!(matches!(
            assess(
                "",
                "PersistentVolumeClaim",
                &json!({"status": {"phase": "Lost"}})
            ),
            Health::Degraded(_)
        ));
        assert!(matches!(
            assess(
                "",
                "Namespace",
                &json!({"status": {"phase": "Terminating"}})
            ),
            Health::Progressing(_)
        ));
    }

    #[test]
    fn other_kinds_use_ready_and_observed_generation() {
        assert!(assess("", "ConfigMap", &json!({"data": {}})).is_healthy());
        let not_ready = json!({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Broken", "message": "no"}]}});
        assert!(
            matches!(assess("example.com", "Widget", &not_ready), Health::Degraded(m) if m.contains("Broken"))
        );
        let lagging = json!({"metadata": {"generation": 5}, "status": {"observedGeneration": 4}});
        assert!(matches!(
            assess("example.com", "Widget", &lagging),
            Health::Progressing(_)
        ));
    }

    #[test]
    fn stateful_sets_progress_until_every_replica_is_ready_and_updated() {
        let mut s = json!({"metadata": {"generation": 1}, "spec": {"replicas": 3}, "status": {}});
        assert!(
            matches!(assess("apps", "StatefulSet", &s), Health::Progressing(m) if m.contains("controller"))
        );
        s["status"] = json!({"observedGeneration": 1, "replicas": 3, "readyReplicas": 1, "updatedReplicas": 3});
        assert!(
            matches!(assess("apps", "StatefulSet", &s), Health::Progressing(m) if m.contains("1 of 3 replicas ready"))
        );
        s["status"]["readyReplicas"] = json!(3);
        assert_eq!(assess("apps", "StatefulSet", &s), Health::Healthy);
        // A new spec the controller has not seen yet, then a rollout under way.
        s["metadata"]["generation"] = json!(2);
        assert!(
            matches!(assess("apps", "StatefulSet", &s), Health::Progressing(m) if m.contains("generation 2"))
        );
        s["status"]["observedGeneration"] = json!(2);
        s["status"]["updatedReplicas"] = json!(1);
        assert!(
            matches!(assess("apps", "StatefulSet", &s), Health::Progressing(m) if m.contains("1 of 3 replicas updated"))
        );
        // OnDelete: old pods stay until someone deletes them; that is not a rollout in progress.
        s["spec"]["updateStrategy"] = json!({"type": "OnDelete"});
        assert_eq!(assess("apps", "StatefulSet", &s), Health::Healthy);
        // Scaled to zero: nothing to wait for.
        let zero = json!({"spec": {"replicas": 0}, "status": {"observedGeneration": 1}});
        assert_eq!(assess("apps", "StatefulSet", &zero), Health::Healthy);
    }

    #[test]
    fn a_partitioned_stateful_set_is_healthy_once_the_pods_above_the_partition_are_updated() {
        let s = json!({"metadata": {"generation": 2},
            "spec": {"replicas": 4, "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 3}}},
            "status": {"observedGeneration": 2, "replicas": 4, "readyReplicas": 4, "updatedReplicas": 1}});
        assert_eq!(assess("apps", "StatefulSet", &s), Health::Healthy);
        let mut behind = s.clone();
        behind["status"]["updatedReplicas"] = json!(0);
        assert!(
            matches!(assess("apps", "StatefulSet", &behind), Health::Progressing(m) if m.contains("0 of 1"))
        );
        // A partition above the replica count updates nothing, and a negative one everything.
        let mut wide = s.clone();
        wide["spec"]["updateStrategy"]["rollingUpdate"]["partition"] = json!(99);
        wide["status"]["updatedReplicas"] = json!(0);
        assert_eq!(assess("apps", "StatefulSet", &wide), Health::Healthy);
        wide["spec"]["updateStrategy"]["rollingUpdate"]["partition"] = json!(-5);
        assert!(matches!(
            assess("apps", "StatefulSet", &wide),
            Health::Progressing(_)
        ));
    }

    #[test]
    fn daemon_sets_progress_until_every_scheduled_pod_is_updated_and_available() {
        let mut d = json!({"metadata": {"generation": 1}, "status": {}});
        assert!(
            matches!(assess("apps", "DaemonSet", &d), Health::Progressing(m) if m.contains("controller"))
        );
        d["status"] = json!({"observedGeneration": 1, "desiredNumberScheduled": 2,
            "updatedNumberScheduled": 2, "numberAvailable": 1});
        assert!(
            matches!(assess("apps", "DaemonSet", &d), Health::Progressing(m) if m.contains("1 of 2 pods available"))
        );
        d["status"]["numberAvailable"] = json!(2);
        assert_eq!(assess("apps", "DaemonSet", &d), Health::Healthy);
        d["metadata"]["generation"] = json!(2);
        assert!(
            matches!(assess("apps", "DaemonSet", &d), Health::Progressing(m) if m.contains("generation 2"))
        );
        d["status"]["observedGeneration"] = json!(2);
        d["status"]["updatedNumberScheduled"] = json!(0);
        assert!(
            matches!(assess("apps", "DaemonSet", &d), Health::Progressing(m) if m.contains("0 of 2 pods updated"))
        );
        d["spec"] = json!({"updateStrategy": {"type": "OnDelete"}});
        assert_eq!(assess("apps", "DaemonSet", &d), Health::Healthy);
        // No node matches its selector: nothing to run, nothing to wait for.
        let nowhere = json!({"status": {"observedGeneration": 1, "desiredNumberScheduled": 0}});
        assert_eq!(assess("apps", "DaemonSet", &nowhere), Health::Healthy);
    }

    #[test]
    fn replica_sets_progress_until_available_and_degrade_when_pods_cannot_be_created() {
        let mut r = json!({"metadata": {"generation": 1}, "spec": {"replicas": 2},
            "status": {"observedGeneration": 1, "replicas": 2, "availableReplicas": 0}});
        assert!(
            matches!(assess("apps", "ReplicaSet", &r), Health::Progressing(m) if m.contains("0 of 2"))
        );
        r["status"]["availableReplicas"] = json!(2);
        assert_eq!(assess("apps", "ReplicaSet", &r), Health::Healthy);
        r["metadata"]["generation"] = json!(2);
        assert!(matches!(
            assess("apps", "ReplicaSet", &r),
            Health::Progressing(_)
        ));
        let failing = json!({"metadata": {"generation": 1}, "spec": {"replicas": 2},
            "status": {"observedGeneration": 1, "replicas": 0, "conditions": [{"type": "ReplicaFailure",
                "status": "True", "reason": "FailedCreate", "message": "pods \"web-x\" is forbidden: exceeded quota"}]}});
        assert!(
            matches!(assess("apps", "ReplicaSet", &failing), Health::Degraded(m) if m.contains("FailedCreate") && m.contains("quota"))
        );
    }

    #[test]
    fn judging_the_text_agrees_with_judging_the_whole_object() {
        let template = json!({"metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "registry.example.com/web:1"}]}});
        let managed =
            json!([{"manager": "windvane", "operation": "Apply", "fieldsV1": {"f:spec": {}}}]);
        let objects = [
            (
                "apps",
                "Deployment",
                json!({"metadata": {"generation": 2, "managedFields": managed},
                "spec": {"replicas": 3, "template": template},
                "status": {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 2}}),
            ),
            (
                "apps",
                "Deployment",
                json!({"metadata": {"generation": 3}, "spec": {"replicas": 1},
                "status": {"observedGeneration": 2}}),
            ),
            (
                "apps",
                "StatefulSet",
                json!({"metadata": {"generation": 1},
                "spec": {"replicas": 3, "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}},
                "status": {"observedGeneration": 1, "replicas": 3, "readyReplicas": 3, "updatedReplicas": 1}}),
            ),
            (
                "apps",
                "DaemonSet",
                json!({"metadata": {"generation": 1}, "spec": {"updateStrategy": {"type": "OnDelete"}},
                "status": {"observedGeneration": 1, "desiredNumberScheduled": 2, "numberAvailable": 1}}),
            ),
            (
                "",
                "Namespace",
                json!({"metadata": {"name": "team"}, "status": {"phase": "Terminating"}}),
            ),
            (
                "",
                "ConfigMap",
                json!({"metadata": {"name": "settings"}, "data": {"a": "b"}}),
            ),
            (
                "example.com",
                "Widget",
                json!({"metadata": {"generation": 1}, "spec": "not an object",
                "status": {"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "False",
                "reason": "Waiting", "message": "backend down"}]}}),
            ),
        ];
        for (group, kind, object) in objects {
            let text = serde_json::to_vec(&object).expect("serialises");
            assert_eq!(
                assess_text(group, kind, &text),
                Some(assess(group, kind, &object)),
                "{kind} {object}"
            );
        }
        assert_eq!(assess_text("", "ConfigMap", b"not json"), None);
    }
}
