//! Health of StatefulSets, DaemonSets and ReplicaSets as the real agent reports it, from the status their
//! real controllers write on localkube (whose fake node binds pods and reports them Ready unless a readiness
//! gate says otherwise). Each kind is Progressing until its pods are Ready, then Synced; one whose pods
//! never become Ready (a readiness gate nobody sets) stays Progressing; a ReplicaSet whose pods a
//! ResourceQuota forbids is Degraded, naming the reason; a DaemonSet no node is selected for has nothing to
//! wait for and is Synced.

use std::time::Duration;

use serde_json::Value;
use windvane_tests::fleet::{Agent, AgentOptions, FleetTree, Publisher, object_state};
use windvane_tests::localkube::LocalKube;
use windvane_tests::store_server::StoreServer;

const WAIT: Duration = Duration::from_secs(90);

const FLEET: &str = "\
fleet: acme
apps:
  - name: ready
    path: ready
  - name: stuck
    path: stuck
";

/// One StatefulSet, DaemonSet and ReplicaSet whose pods the fake node makes Ready, and a DaemonSet no node
/// matches.
const READY: &str = "\
apiVersion: v1
kind: Namespace
metadata: {name: kinds}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, namespace: kinds}
spec:
  replicas: 2
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      containers: [{name: db, image: registry.example.com/db:1.0}]
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: node-agent, namespace: kinds}
spec:
  selector: {matchLabels: {app: node-agent}}
  template:
    metadata: {labels: {app: node-agent}}
    spec:
      containers: [{name: agent, image: registry.example.com/node-agent:1.0}]
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: gpu-agent, namespace: kinds}
spec:
  selector: {matchLabels: {app: gpu-agent}}
  template:
    metadata: {labels: {app: gpu-agent}}
    spec:
      nodeSelector: {example.com/gpu: \"true\"}
      containers: [{name: agent, image: registry.example.com/gpu-agent:1.0}]
---
apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: cache, namespace: kinds}
spec:
  replicas: 2
  selector: {matchLabels: {app: cache}}
  template:
    metadata: {labels: {app: cache}}
    spec:
      containers: [{name: cache, image: registry.example.com/cache:1.0}]
";

/// Pods that never become Ready (a readiness gate nobody sets), and a ReplicaSet whose pods a quota forbids.
const STUCK: &str = "\
apiVersion: v1
kind: Namespace
metadata: {name: stuck}
---
apiVersion: v1
kind: ResourceQuota
metadata: {name: no-pods, namespace: stuck, annotations: {windvane.io/wave: \"-1\"}}
spec:
  hard: {pods: \"0\"}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: never-ready, namespace: kinds}
spec:
  replicas: 1
  serviceName: never-ready
  selector: {matchLabels: {app: never-ready}}
  template:
    metadata: {labels: {app: never-ready}}
    spec:
      readinessGates: [{conditionType: example.com/never}]
      containers: [{name: db, image: registry.example.com/db:1.0}]
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: never-ready-agent, namespace: kinds}
spec:
  selector: {matchLabels: {app: never-ready-agent}}
  template:
    metadata: {labels: {app: never-ready-agent}}
    spec:
      readinessGates: [{conditionType: example.com/never}]
      containers: [{name: agent, image: registry.example.com/node-agent:1.0}]
---
apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: blocked, namespace: stuck}
spec:
  replicas: 2
  selector: {matchLabels: {app: blocked}}
  template:
    metadata: {labels: {app: blocked}}
    spec:
      containers: [{name: cache, image: registry.example.com/cache:1.0}]
";

fn message<'a>(status: &'a Value, object: &str) -> &'a str {
    status["objects"]
        .as_array()
        .and_then(|o| o.iter().find(|x| x["object"] == object))
        .and_then(|x| x["message"].as_str())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stateful_daemon_and_replica_sets_report_their_pods_readiness() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(61)?;
    let tree = FleetTree::new()?;
    tree.write("fleet.yaml", FLEET)?;
    tree.write("ready/objects.yaml", READY)?;
    tree.write("stuck/objects.yaml", STUCK)?;
    publisher.publish(&tree, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1");
    let agent = Agent::start(&kube, &options).await?;

    let ready = [
        "StatefulSet kinds/db",
        "DaemonSet kinds/node-agent",
        "DaemonSet kinds/gpu-agent",
        "ReplicaSet kinds/cache",
    ];
    let status = agent
        .wait_status("every set Synced or stuck", WAIT, |st| {
            ready.iter().all(|o| object_state(st, o) == Some("Synced"))
                && object_state(st, "ReplicaSet stuck/blocked") == Some("Degraded")
                && object_state(st, "StatefulSet kinds/never-ready") == Some("Progressing")
                && message(st, "StatefulSet kinds/never-ready").contains("0 of 1 replicas ready")
                && object_state(st, "DaemonSet kinds/never-ready-agent") == Some("Progressing")
                && message(st, "DaemonSet kinds/never-ready-agent")
                    .contains("0 of 1 pods available")
        })
        .await?;
    let blocked = message(&status, "ReplicaSet stuck/blocked");
    assert!(
        blocked.contains("FailedCreate") && blocked.contains("quota"),
        "the reason is named: {blocked}"
    );
    assert_eq!(
        status["state"], "Degraded",
        "the worst object wins: {status}"
    );
    Ok(())
}
