//! localkube's API server dials loopback only: an aggregated API (`APIService`) and an admission webhook
//! backed by Services make the API server dial their ClusterIPs (10.0.x.x), which on a machine without
//! kube-proxy would leave through the default route. Every such dial goes through localkube's egress guard
//! (tests/localkube/egress.go), which refuses anything outside 127.0.0.0/8 and ::1 and records each decision
//! in `<data dir>/egress.log`. These tests read that record (the dialer was asked and refused, not a timeout)
//! and the API server's own report: the APIService is unavailable naming the refusal, and a
//! `failurePolicy: Ignore` webhook lets the request through.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;

const WAIT: Duration = Duration::from_secs(60);
const NS: &str = "egress";

async fn create<K>(api: &Api<K>, value: serde_json::Value) -> Result<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value.clone())?;
    api.create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating {value}"))
}

/// A selector-less Service with one ready endpoint, so that the API server counts it as having a backend
/// and dials it; returns its ClusterIP.
async fn service_with_endpoint(client: &Client, name: &str) -> Result<String> {
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    let service = create(
        &services,
        json!({"metadata": {"name": name},
               "spec": {"ports": [{"name": "https", "port": 443, "targetPort": 8443}]}}),
    )
    .await?;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    create(
        &slices,
        json!({"metadata": {"name": format!("{name}-manual"),
                            "labels": {"kubernetes.io/service-name": name}},
               "addressType": "IPv4",
               "endpoints": [{"addresses": ["10.0.250.7"], "conditions": {"ready": true}}],
               "ports": [{"name": "https", "port": 8443, "protocol": "TCP"}]}),
    )
    .await?;
    service
        .spec
        .and_then(|s| s.cluster_ip)
        .context("the Service got no ClusterIP")
}

/// The lines of localkube's egress record that refused `target`.
fn refusals(kube: &LocalKube, target: &str) -> Result<Vec<String>> {
    let record = std::fs::read_to_string(kube.data_dir().join("egress.log"))
        .context("reading localkube's egress.log (does this localkube have the egress guard?)")?;
    Ok(record
        .lines()
        .filter(|l| l.contains(&format!(" refused {target} ")))
        .map(str::to_owned)
        .collect())
}

#[tokio::test]
async fn apiservice_and_webhook_backed_by_services_are_refused_not_dialled() -> Result<()> {
    let kube = LocalKube::start().await?;
    let client = kube.client();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    create(&namespaces, json!({"metadata": {"name": NS}})).await?;
    let aggregated_ip = service_with_endpoint(&client, "aggregated").await?;
    let hook_ip = service_with_endpoint(&client, "hook").await?;

    let apiservices: Api<APIService> = Api::all(client.clone());
    create(
        &apiservices,
        json!({"metadata": {"name": "v1beta1.egress.example.com"},
               "spec": {"group": "egress.example.com", "version": "v1beta1",
                        "service": {"namespace": NS, "name": "aggregated", "port": 443},
                        "insecureSkipTLSVerify": true,
                        "groupPriorityMinimum": 100, "versionPriority": 10}}),
    )
    .await?;
    let webhooks: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    create(
        &webhooks,
        json!({"metadata": {"name": "egress-check"},
               "webhooks": [{
                   "name": "check.egress.example.com",
                   "clientConfig": {"service": {"namespace": NS, "name": "hook", "path": "/validate"}},
                   "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                              "resources": ["configmaps"]}],
                   "objectSelector": {"matchLabels": {"egress-test": "yes"}},
                   "failurePolicy": "Ignore", "sideEffects": "None",
                   "admissionReviewVersions": ["v1"], "timeoutSeconds": 5}]}),
    )
    .await?;

    // The webhook's backend is "down" (refused): with failurePolicy Ignore the request goes through.
    let configs: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    wait_for(
        "a ConfigMap admitted past the refused webhook",
        WAIT,
        || async {
            let name = "admitted";
            if configs.get_opt(name).await?.is_none() {
                create(
                    &configs,
                    json!({"metadata": {"name": name, "labels": {"egress-test": "yes"}}}),
                )
                .await?;
            }
            let refused = refusals(&kube, &format!("{hook_ip}:443"))?;
            Ok((!refused.is_empty()).then_some(()))
        },
    )
    .await?;

    // The API server reports the aggregated API unavailable, in its own words, naming the refusal.
    let message = wait_for(
        "the APIService to be reported unavailable",
        WAIT,
        || async {
            let service = apiservices.get("v1beta1.egress.example.com").await?;
            let condition = service
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "Available");
            Ok(condition
                .filter(|c| {
                    c.status == "False"
                        && c.message
                            .as_deref()
                            .is_some_and(|m| m.contains("loopback only"))
                })
                .and_then(|c| c.message))
        },
    )
    .await?;
    ensure!(
        message.contains(&aggregated_ip),
        "the APIService's message names its ClusterIP {aggregated_ip}: {message}"
    );
    let refused = refusals(&kube, &format!("{aggregated_ip}:443"))?;
    ensure!(
        refused.iter().all(|l| l.contains("not a loopback address")),
        "each refusal says why: {refused:?}"
    );

    // Nothing was let through to anything but loopback.
    let record = std::fs::read_to_string(kube.data_dir().join("egress.log"))?;
    let escaped: Vec<&str> = record
        .lines()
        .filter(|l| {
            l.contains(" allowed ") && !l.contains(" allowed 127.") && !l.contains(" allowed [::1]")
        })
        .collect();
    ensure!(
        escaped.is_empty(),
        "dials allowed off loopback: {escaped:?}"
    );
    Ok(())
}
