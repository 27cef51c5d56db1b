//! The apiserver side of the measurements: who made which requests.
//!
//! `apiserver_request_total` counts requests by verb and resource but not by client, and a localkube's
//! controller manager, fake node and the benchmark itself all talk to the same apiserver. So every client
//! whose requests are counted (the agent, kubectl) gets its own identity — a ServiceAccount bound to
//! `cluster-admin`, as a real deployment would run the agent, with a token kubeconfig — and its own
//! API Priority and Fairness FlowSchemas, one per class of request (lease writes, lease reads, events, other
//! writes, watches, other reads). All of them map to the `exempt` priority level, so nothing is queued or
//! throttled; they only make the apiserver count each identity's requests by class in
//! `apiserver_flowcontrol_dispatched_requests_total{flow_schema}`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::flowcontrol::v1::FlowSchema;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;

use crate::prom::{self, Sample};

/// The namespace of the benchmark's ServiceAccounts (and the agent's own state and Lease).
pub const IDENTITY_NAMESPACE: &str = "windvane-system";

const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];
const WRITE_HTTP_VERBS: [&str; 6] = [
    "POST",
    "PUT",
    "PATCH",
    "DELETE",
    "DELETECOLLECTION",
    "APPLY",
];

/// A class of request, counted apart for each identity. Classes are matched in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RequestClass {
    /// Creating or renewing a coordination.k8s.io Lease (leader election).
    LeaseWrite,
    /// Reading a Lease.
    LeaseRead,
    /// Kubernetes Events, read or written.
    Event,
    /// Every other create, update, patch or delete (dry runs included: API Priority and Fairness cannot
    /// tell them apart).
    Write,
    /// Watches: long-lived, one per watched kind, counted when they (re)start.
    Watch,
    /// Every other read (get, list, discovery).
    Read,
}

impl RequestClass {
    /// Every class, in matching order.
    pub const ALL: [Self; 6] = [
        Self::LeaseWrite,
        Self::LeaseRead,
        Self::Event,
        Self::Write,
        Self::Watch,
        Self::Read,
    ];

    /// The class's name in FlowSchema names and reports.
    pub fn slug(self) -> &'static str {
        match self {
            Self::LeaseWrite => "lease-write",
            Self::LeaseRead => "lease-read",
            Self::Event => "event",
            Self::Write => "write",
            Self::Watch => "watch",
            Self::Read => "read",
        }
    }

    fn resource_rule(self) -> Value {
        let all = json!(["*"]);
        let (verbs, groups, resources) = match self {
            Self::LeaseWrite => (
                json!(WRITE_VERBS),
                json!(["coordination.k8s.io"]),
                json!(["leases"]),
            ),
            Self::LeaseRead => (
                all.clone(),
                json!(["coordination.k8s.io"]),
                json!(["leases"]),
            ),
            Self::Event => (all.clone(), json!(["", "events.k8s.io"]), json!(["events"])),
            Self::Write => (json!(WRITE_VERBS), all.clone(), all.clone()),
            Self::Watch => (json!(["watch"]), all.clone(), all.clone()),
            Self::Read => (all.clone(), all.clone(), all.clone()),
        };
        json!({"verbs": verbs, "apiGroups": groups, "resources": resources, "clusterScope": true, "namespaces": ["*"]})
    }
}

/// One counted client of the apiserver.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The ServiceAccount's name (and the prefix of its FlowSchemas).
    pub name: String,
    /// A kubeconfig that authenticates as it.
    pub kubeconfig: PathBuf,
}

impl Identity {
    /// Creates the ServiceAccount, binds it to `cluster-admin`, writes a token kubeconfig into `dir` and
    /// installs its FlowSchemas at `precedence`…`precedence + 5` (below the built-in ones, above `exempt`'s
    /// system:masters, which a ServiceAccount is not). Waits until the apiserver classifies its requests.
    pub async fn create(
        kube: &LocalKube,
        dir: &Path,
        name: &str,
        precedence: u32,
    ) -> anyhow::Result<Self> {
        let client = kube.client();
        let apply = PatchParams::apply("windvane-bench").force();
        Api::<Namespace>::all(client.clone())
            .patch(
                IDENTITY_NAMESPACE,
                &apply,
                &Patch::Apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": IDENTITY_NAMESPACE}})),
            )
            .await?;
        let accounts = Api::<ServiceAccount>::namespaced(client.clone(), IDENTITY_NAMESPACE);
        accounts
            .patch(
                name,
                &apply,
                &Patch::Apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": name, "namespace": IDENTITY_NAMESPACE}})),
            )
            .await?;
        Api::<ClusterRoleBinding>::all(client.clone())
            .patch(
                &format!("bench-{name}"),
                &apply,
                &Patch::Apply(json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": format!("bench-{name}")},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                    "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": IDENTITY_NAMESPACE}],
                })),
            )
            .await?;
        let request: TokenRequest =
            serde_json::from_value(json!({"spec": {"expirationSeconds": 86_400}}))?;
        let token = accounts
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .with_context(|| format!("requesting a token for ServiceAccount {name}"))?
            .status
            .and_then(|s| s.token)
            .context("the TokenRequest returned no token")?;

        let flow_schemas = Api::<FlowSchema>::all(client.clone());
        let subject = json!({"kind": "ServiceAccount", "serviceAccount": {"name": name, "namespace": IDENTITY_NAMESPACE}});
        for (offset, class) in (0u32..).zip(RequestClass::ALL) {
            let mut rule = json!({"subjects": [subject], "resourceRules": [class.resource_rule()]});
            if class == RequestClass::Read {
                rule["nonResourceRules"] = json!([{"verbs": ["*"], "nonResourceURLs": ["*"]}]);
            }
            let schema = flow_schema_name(name, class);
            flow_schemas
                .patch(
                    &schema,
                    &apply,
                    &Patch::Apply(json!({
                        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
                        "metadata": {"name": schema},
                        "spec": {"priorityLevelConfiguration": {"name": "exempt"},
                                 "matchingPrecedence": precedence + offset, "rules": [rule]},
                    })),
                )
                .await?;
        }

        let kubeconfig = dir.join(format!("{name}.kubeconfig"));
        write_token_kubeconfig(kube.kubeconfig_path(), &token, &kubeconfig)?;
        let identity = Self {
            name: name.to_owned(),
            kubeconfig,
        };
        // The apiserver picks FlowSchemas up asynchronously: wait until a read of ours is counted as ours.
        let own = identity.client().await?;
        wait_for(
            &format!("FlowSchemas of {name}"),
            Duration::from_secs(30),
            || async {
                Api::<Namespace>::all(own.clone())
                    .get(IDENTITY_NAMESPACE)
                    .await?;
                let scrape = scrape(&client).await?;
                Ok((identity.requests(&scrape).get(RequestClass::Read) > 0.0).then_some(()))
            },
        )
        .await?;
        Ok(identity)
    }

    /// A client authenticated as this identity, built as the agent builds its own (Nagle's algorithm off), so
    /// that the bare client measured against the agent is not slowed by what the agent avoids.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        let file = kube::config::Kubeconfig::read_from(&self.kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(file, &Default::default()).await?;
        Ok(windvane_agent::kube::client::client(config)?)
    }

    /// This identity's requests so far, by class.
    pub fn requests(&self, scrape: &[Sample]) -> RequestCounts {
        let mut counts = RequestCounts::default();
        for class in RequestClass::ALL {
            let schema = flow_schema_name(&self.name, class);
            let count = prom::sum(
                scrape,
                "apiserver_flowcontrol_dispatched_requests_total",
                |s| s.label("flow_schema") == schema,
            );
            counts.0.insert(class, count);
        }
        counts
    }
}

fn flow_schema_name(identity: &str, class: RequestClass) -> String {
    format!("bench-{identity}-{}", class.slug())
}

/// Writes a kubeconfig for the same apiserver as `admin`, authenticating with `token`. (JSON is YAML.)
fn write_token_kubeconfig(admin: &Path, token: &str, out: &Path) -> anyhow::Result<()> {
    let admin = kube::config::Kubeconfig::read_from(admin)?;
    let cluster = admin
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .context("the admin kubeconfig names no cluster")?;
    let config = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "localkube", "cluster": {
            "server": cluster.server,
            "certificate-authority-data": cluster.certificate_authority_data,
        }}],
        "users": [{"name": "bench", "user": {"token": token}}],
        "contexts": [{"name": "bench", "context": {"cluster": "localkube", "user": "bench"}}],
        "current-context": "bench",
    });
    std::fs::write(out, serde_json::to_vec_pretty(&config)?)?;
    Ok(())
}

/// Requests of one identity by class (a counter snapshot, or the difference of two).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestCounts(BTreeMap<RequestClass, f64>);

impl RequestCounts {
    /// The count of one class.
    pub fn get(&self, class: RequestClass) -> f64 {
        self.0.get(&class).copied().unwrap_or(0.0)
    }

    /// Requests made between `earlier` and this snapshot.
    pub fn since(&self, earlier: &Self) -> Self {
        Self(
            RequestClass::ALL
                .iter()
                .map(|c| (*c, self.get(*c) - earlier.get(*c)))
                .collect(),
        )
    }

    /// As JSON: `{"lease-write": n, …}`.
    pub fn to_json(&self) -> Value {
        Value::Object(
            RequestClass::ALL
                .iter()
                .map(|c| (c.slug().to_owned(), json!(self.get(*c))))
                .collect(),
        )
    }

    /// As text: `write 1000, read 45, …` (classes with no requests left out).
    pub fn describe(&self) -> String {
        let parts: Vec<String> = RequestClass::ALL
            .iter()
            .filter(|c| self.get(**c) > 0.0)
            .map(|c| format!("{} {}", c.slug(), self.get(*c)))
            .collect();
        if parts.is_empty() {
            "none".to_owned()
        } else {
            parts.join(", ")
        }
    }
}

/// The apiserver's `/metrics`, parsed.
pub async fn scrape(client: &kube::Client) -> anyhow::Result<Vec<Sample>> {
    let request = hyper::Request::get("/metrics").body(Vec::new())?;
    let text = client
        .request_text(request)
        .await
        .context("reading the apiserver's /metrics")?;
    Ok(prom::parse(&text))
}

/// Writes by every client of the apiserver (`apiserver_request_total`, verbs POST, PUT, PATCH, DELETE,
/// DELETECOLLECTION and APPLY), keyed `VERB group/resource[/subresource]`. Leases and Events are left out:
/// leader election and node heartbeats renew Leases all the time, and Events are reports, not state. Dry
/// runs are left out too: they change nothing (the agent's backstop is one per object).
pub fn writes_by_resource(scrape: &[Sample]) -> BTreeMap<String, f64> {
    let mut writes = BTreeMap::new();
    for sample in scrape
        .iter()
        .filter(|s| s.name == "apiserver_request_total")
        .filter(|s| WRITE_HTTP_VERBS.contains(&s.label("verb")))
        .filter(|s| s.label("dry_run").is_empty())
        .filter(|s| !matches!(s.label("resource"), "leases" | "events"))
    {
        let mut key = format!(
            "{} {}/{}",
            sample.label("verb"),
            sample.label("group"),
            sample.label("resource")
        );
        if !sample.label("subresource").is_empty() {
            key = format!("{key}/{}", sample.label("subresource"));
        }
        *writes.entry(key).or_insert(0.0) += sample.value;
    }
    writes
}

/// Dry-run requests by every client (`apiserver_request_total{dry_run!=""}`).
pub fn dry_runs(scrape: &[Sample]) -> f64 {
    prom::sum(scrape, "apiserver_request_total", |s| {
        !s.label("dry_run").is_empty()
    })
}

/// `after - before` per key, keeping only keys that changed.
pub fn difference(
    after: &BTreeMap<String, f64>,
    before: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v != 0.0)
        .collect()
}
