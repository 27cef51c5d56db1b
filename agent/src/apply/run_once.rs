//! Objects that run once and then remove themselves. A Job with `ttlSecondsAfterFinished` is deleted by
//! Kubernetes' TTL controller once it finishes; a Pod with `restartPolicy: Never` (or `OnFailure`) ends and
//! is often cleaned up; a Helm hook with `hook-delete-policy: hook-succeeded` is gone after it ran. Healing
//! such a disappearance would run the work again, forever. So an object of that shape that finished for the
//! body the release gives it is *done*: its disappearance is reported, not drift, and it is applied again
//! only when a release changes its body. A release marks any other object run-once with the annotation
//! [`RUN_ONCE_ANNOTATION`]` = "true"`: it is done as soon as it applied.
//!
//! Pure: the shape comes from the desired body ([`shape`], when the object is rendered), the finish from a
//! live object as the watches see it ([`finished`], the last state a deletion event carries included). The
//! engine records the finish in the inventory entry (persisted, so a restarted agent does not run a finished
//! Job again), and the healer leaves a done object that is gone alone.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The annotation that marks an object as run-once: applied once per body, not recreated when it is gone.
pub const RUN_ONCE_ANNOTATION: &str = "windvane.io/run-once";

/// How an object runs once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunOnce {
    /// Marked by the release ([`RUN_ONCE_ANNOTATION`]): done once applied.
    Marked,
    /// A Job, or a Pod that is not restarted: done once Kubernetes says it finished.
    Finishes,
}

/// How a run-once object ended, as the inventory records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Finished {
    /// A Job's `Complete` condition, a Pod's `Succeeded` phase.
    Succeeded,
    /// A Job's `Failed` condition, a Pod's `Failed` phase: it ran, and is not run again for the same body
    /// either (a failing Job removed by its TTL would otherwise fail again in a loop).
    Failed,
    /// A marked object was applied.
    Applied,
}

impl Finished {
    /// What the status says of a done object that is gone from the cluster.
    pub fn gone_message(self) -> String {
        let how = match self {
            Finished::Succeeded => "completed",
            Finished::Failed => "failed",
            Finished::Applied => "was applied (windvane.io/run-once)",
        };
        format!("{how} for this release and was removed; not run again until a release changes it")
    }
}

/// The run-once shape of a desired body (`None`: an ordinary object, healed when it is gone). The annotation
/// decides when present (`"false"` makes even a Job ordinary).
pub fn shape(body: &Value) -> Option<RunOnce> {
    let marked = body
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(RUN_ONCE_ANNOTATION))
        .and_then(Value::as_str);
    match marked.map(str::trim) {
        Some("true") => return Some(RunOnce::Marked),
        Some("false") => return None,
        _ => {}
    }
    let api_version = body.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = body.get("kind").and_then(Value::as_str).unwrap_or("");
    match (api_version, kind) {
        ("batch/v1", "Job") => Some(RunOnce::Finishes),
        ("v1", "Pod") => {
            let restart = body
                .pointer("/spec/restartPolicy")
                .and_then(Value::as_str)
                .unwrap_or("Always");
            (restart != "Always").then_some(RunOnce::Finishes)
        }
        _ => None,
    }
}

/// Whether a live Job or Pod (group, kind) has finished, from its status; `None` while it runs, and for every
/// other kind. `object` is the object or any value with its `status` at the top.
pub fn finished(group: &str, kind: &str, object: &Value) -> Option<Finished> {
    match (group, kind) {
        ("batch", "Job") => {
            let condition = |kind: &str| {
                object
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .is_some_and(|conditions| {
                        conditions.iter().any(|c| {
                            c.get("type").and_then(Value::as_str) == Some(kind)
                                && c.get("status").and_then(Value::as_str) == Some("True")
                        })
                    })
            };
            if condition("Complete") {
                Some(Finished::Succeeded)
            } else if condition("Failed") {
                Some(Finished::Failed)
            } else {
                None
            }
        }
        ("", "Pod") => match object.pointer("/status/phase").and_then(Value::as_str) {
            Some("Succeeded") => Some(Finished::Succeeded),
            Some("Failed") => Some(Finished::Failed),
            _ => None,
        },
        _ => None,
    }
}

/// How a run-once object stands after what was just seen of it: done (and how) or not yet. A marked object
/// is done once applied; a Job or Pod once it finished.
pub fn done(shape: RunOnce, applied: bool, finished: Option<Finished>) -> Option<Finished> {
    match shape {
        RunOnce::Marked => applied.then_some(Finished::Applied),
        RunOnce::Finishes => finished,
    }
}

/// True when the sync is to leave the object alone rather than apply it: it is done for exactly this body
/// (`done_hash`, the body hash it was done for) and it is not on the cluster. A changed body runs again; an
/// object still there is applied as usual (an unchanged one costs no write).
pub fn skip_apply(done_hash: Option<&str>, body_hash: &str, live: bool) -> bool {
    !live && done_hash == Some(body_hash)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn job(annotations: Value) -> Value {
        json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "certgen", "annotations": annotations},
            "spec": {"ttlSecondsAfterFinished": 0, "template": {"spec": {"restartPolicy": "Never"}}}})
    }

    #[test]
    fn jobs_pods_that_end_and_marked_objects_run_once() {
        assert_eq!(shape(&job(json!({}))), Some(RunOnce::Finishes));
        let pod = |restart: Option<&str>| {
            let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                "spec": {"containers": []}});
            if let Some(restart) = restart {
                pod["spec"]["restartPolicy"] = restart.into();
            }
            pod
        };
        assert_eq!(shape(&pod(Some("Never"))), Some(RunOnce::Finishes));
        assert_eq!(shape(&pod(Some("OnFailure"))), Some(RunOnce::Finishes));
        assert_eq!(shape(&pod(Some("Always"))), None, "a server is healed");
        assert_eq!(shape(&pod(None)), None, "Always is the default");
        let marked = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "seed", "annotations": {RUN_ONCE_ANNOTATION: "true"}}});
        assert_eq!(shape(&marked), Some(RunOnce::Marked));
        assert_eq!(
            shape(&job(json!({RUN_ONCE_ANNOTATION: "false"}))),
            None,
            "the annotation opts a Job out"
        );
        assert_eq!(
            shape(
                &json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}})
            ),
            None
        );
    }

    #[test]
    fn a_job_finishes_on_its_complete_or_failed_condition_and_a_pod_on_its_phase() {
        let with = |kind: &str, status: &str| json!({"status": {"conditions": [{"type": kind, "status": status}]}});
        assert_eq!(
            finished("batch", "Job", &with("Complete", "True")),
            Some(Finished::Succeeded)
        );
        assert_eq!(
            finished("batch", "Job", &with("Failed", "True")),
            Some(Finished::Failed)
        );
        assert_eq!(finished("batch", "Job", &with("Complete", "False")), None);
        assert_eq!(
            finished("batch", "Job", &json!({"status": {"active": 1}})),
            None
        );
        assert_eq!(
            finished("", "Pod", &json!({"status": {"phase": "Succeeded"}})),
            Some(Finished::Succeeded)
        );
        assert_eq!(
            finished("", "Pod", &json!({"status": {"phase": "Running"}})),
            None
        );
        assert_eq!(
            finished("apps", "Deployment", &with("Complete", "True")),
            None,
            "only Jobs and Pods finish"
        );
    }

    #[test]
    fn a_marked_object_is_done_once_applied_a_job_once_finished() {
        assert_eq!(done(RunOnce::Marked, true, None), Some(Finished::Applied));
        assert_eq!(done(RunOnce::Marked, false, None), None);
        assert_eq!(done(RunOnce::Finishes, true, None), None, "still running");
        assert_eq!(
            done(RunOnce::Finishes, true, Some(Finished::Succeeded)),
            Some(Finished::Succeeded)
        );
    }

    #[test]
    fn only_a_done_object_gone_from_the_cluster_with_the_same_body_is_left_alone() {
        assert!(skip_apply(Some("h1"), "h1", false));
        assert!(
            !skip_apply(Some("h1"), "h2", false),
            "a new release changed it: it runs again"
        );
        assert!(
            !skip_apply(Some("h1"), "h1", true),
            "still there: applied as usual"
        );
        assert!(!skip_apply(None, "h1", false), "not done: recreated");
    }
}
