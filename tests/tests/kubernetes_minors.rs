//! What differs between the Kubernetes minors Windvane supports (1.34 to 1.37), where a user of Windvane can
//! see it. Each check asks the real API server of the localkube under test (`WINDVANE_LOCALKUBE`, its minor
//! in `WINDVANE_LOCALKUBE_MINOR`, else go.mod's) the way the agent asks it: a server-side apply dry run, which
//! is what the agent's apply, `windvane-agent diff` and the periodic backstop (agent/src/heal/compare.rs) compare
//! against, and API discovery. `tests/matrix` runs this suite on every minor, so the table in
//! docs/kubernetes-matrix.md is also the proof that the list below is right for each.
//!
//! The differences (feature gates whose defaults change between the minors; README, "Supported
//! Kubernetes", has the same list for users):
//! - `MutatingAdmissionPolicy` (admissionregistration.k8s.io/v1) is served from 1.36 (GA); on 1.34 and 1.35 a
//!   release holding one fails to apply ("no matches for kind").
//! - `ValidatingAdmissionPolicy` v1, which the agent's prevention writes, is served on all four, so
//!   prevention works on every supported minor (the prevent_* suites show it enforced).
//! - An HPA's `behavior.scaleUp.tolerance` (HPAConfigurableTolerance) is kept from 1.35; 1.34 drops it
//!   silently, so the dry run drops it too and Windvane reports the HPA in sync without it.
//! - An HPA with `minReplicas: 0` (HPAScaleToZero) is accepted from 1.37; before, the apply is refused.
//! - A StatefulSet's `updateStrategy.rollingUpdate.maxUnavailable` (MaxUnavailableStatefulSet) is kept from
//!   1.37; 1.34 to 1.36 drop it silently, as above.
//! - A Service whose name starts with a digit (RelaxedServiceNameValidation) is accepted from 1.36.

use anyhow::{Context, Result, bail};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Value, json};
use windvane_tests::localkube::{LocalKube, MINOR_ENV};

/// What one minor does, per difference (see the module doc).
#[derive(Debug, PartialEq, Eq)]
struct Expected {
    mutating_admission_policy_v1: bool,
    hpa_tolerance_kept: bool,
    hpa_min_replicas_zero: bool,
    statefulset_max_unavailable_kept: bool,
    service_name_leading_digit: bool,
}

/// The table of the module doc, as code: pure, so a reader can check it against the gate defaults.
fn expected(minor: u32) -> Expected {
    Expected {
        mutating_admission_policy_v1: minor >= 36,
        hpa_tolerance_kept: minor >= 35,
        hpa_min_replicas_zero: minor >= 37,
        statefulset_max_unavailable_kept: minor >= 37,
        service_name_leading_digit: minor >= 36,
    }
}

/// The minor under test: `WINDVANE_LOCALKUBE_MINOR`, else the one tests/localkube/go.mod pins.
fn minor_under_test() -> Result<u32> {
    if let Ok(minor) = std::env::var(MINOR_ENV) {
        return minor
            .parse()
            .with_context(|| format!("{MINOR_ENV}={minor}"));
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/localkube/go.mod");
    let go_mod = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    go_mod
        .lines()
        .find_map(|l| l.trim().strip_prefix("k8s.io/kubernetes v1."))
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse().ok())
        .with_context(|| format!("{path} requires no k8s.io/kubernetes v1.X.Y"))
}

/// A server-side apply dry run of `object` in `default`, as the agent's apply and diff do: the object the
/// API server would store, or the API server's refusal.
async fn dry_run(
    kube: &LocalKube,
    gvk: (&str, &str, &str),
    plural: &str,
    object: Value,
) -> Result<std::result::Result<Value, kube::Error>> {
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(gvk.0, gvk.1, gvk.2), plural);
    let api: Api<DynamicObject> = Api::namespaced_with(kube.client(), "default", &resource);
    let name = object["metadata"]["name"]
        .as_str()
        .context("no name")?
        .to_owned();
    let params = PatchParams::apply("windvane").dry_run().force();
    Ok(
        match api.patch(&name, &params, &Patch::Apply(&object)).await {
            Ok(stored) => Ok(serde_json::to_value(stored)?),
            Err(error) => Err(error),
        },
    )
}

/// Whether `kind` is served in `group_version` (API discovery).
async fn served(kube: &LocalKube, group_version: &str, kind: &str) -> Result<bool> {
    let resources = kube
        .client()
        .list_api_group_resources(group_version)
        .await
        .with_context(|| format!("discovering {group_version}"))?;
    Ok(resources.resources.iter().any(|r| r.kind == kind))
}

/// An HPA scaling on CPU, or with `min_replicas` 0 on an External metric (scaling to zero needs an Object or
/// External metric on every minor that allows it).
fn hpa(name: &str, min_replicas: u32, tolerance: Option<&str>) -> Value {
    let metric = if min_replicas == 0 {
        json!({"type": "External", "external": {"metric": {"name": "queue-length"},
               "target": {"type": "AverageValue", "averageValue": "5"}}})
    } else {
        json!({"type": "Resource", "resource": {"name": "cpu",
               "target": {"type": "Utilization", "averageUtilization": 80}}})
    };
    let mut spec = json!({
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
        "minReplicas": min_replicas, "maxReplicas": 3, "metrics": [metric]
    });
    if let Some(tolerance) = tolerance {
        spec["behavior"] = json!({"scaleUp": {"tolerance": tolerance}});
    }
    json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
           "metadata": {"name": name}, "spec": spec})
}

fn stateful_set(name: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name},
           "spec": {"serviceName": name, "replicas": 2,
                    "selector": {"matchLabels": {"app": name}},
                    "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}},
                    "template": {"metadata": {"labels": {"app": name}},
                                 "spec": {"containers": [{"name": "c", "image": "example.invalid/c:1"}]}}}})
}

/// What the API server of `kube` does, per difference.
async fn observe(kube: &LocalKube) -> Result<Expected> {
    let hpa_gvk = ("autoscaling", "v2", "HorizontalPodAutoscaler");
    let tolerant = dry_run(
        kube,
        hpa_gvk,
        "horizontalpodautoscalers",
        hpa("tolerant", 1, Some("0.05")),
    )
    .await?
    .context("the HPA with a tolerance was refused")?;
    let zero = dry_run(
        kube,
        hpa_gvk,
        "horizontalpodautoscalers",
        hpa("to-zero", 0, None),
    )
    .await?;
    let sts = dry_run(
        kube,
        ("apps", "v1", "StatefulSet"),
        "statefulsets",
        stateful_set("db"),
    )
    .await?
    .context("the StatefulSet was refused")?;
    let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "1web"},
                         "spec": {"ports": [{"port": 80}]}});
    let digit = dry_run(kube, ("", "v1", "Service"), "services", service).await?;
    Ok(Expected {
        mutating_admission_policy_v1: served(
            kube,
            "admissionregistration.k8s.io/v1",
            "MutatingAdmissionPolicy",
        )
        .await?,
        hpa_tolerance_kept: !tolerant["spec"]["behavior"]["scaleUp"]["tolerance"].is_null(),
        hpa_min_replicas_zero: zero.is_ok(),
        statefulset_max_unavailable_kept:
            !sts["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"].is_null(),
        service_name_leading_digit: digit.is_ok(),
    })
}

#[tokio::test]
async fn the_api_server_differs_from_the_other_minors_as_documented() -> Result<()> {
    let minor = minor_under_test()?;
    let kube = LocalKube::start().await?;
    // Prevention's policy kind is served on every supported minor.
    if !served(
        &kube,
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicy",
    )
    .await?
    {
        bail!(
            "Kubernetes 1.{minor} serves no ValidatingAdmissionPolicy v1: prevention cannot work there"
        );
    }
    let seen = observe(&kube).await?;
    let want = expected(minor);
    if seen != want {
        bail!(
            "Kubernetes 1.{minor} behaves as {seen:#?}, but the documented differences say {want:#?}"
        );
    }
    Ok(())
}
