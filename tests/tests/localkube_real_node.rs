//! localkube's real node (`localkube --real-node`): pods run as real containers (a kubelet, containerd,
//! runc) from the image `deploy/images/build.sh` builds (`windvane-test/busybox:local`), and what the
//! cluster reports about them is the kubelet's report of what really ran: a container's exit code, the
//! file it wrote, a Job that really failed. The fake node, by contrast, reports every pod Succeeded.
//!
//! Needs root, cgroups and a network namespace with only loopback (run under `tests/loopback-only`, as
//! `tests/run` does), containerd (`tests/tools/build-realnode.sh`) and the images; where any is missing,
//! starting the node fails with the list of what is missing: nothing is skipped.
//!
//! One test, one node: starting a real node costs seconds, and the three workloads are independent.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Node, Pod, ServiceAccount};
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use windvane_tests::localkube::{BUSYBOX_IMAGE, LocalKube};
use windvane_tests::poll::wait_for;

/// Deadline for a pod or a Job to finish: a container start is a second or two; the margin is for a
/// loaded machine.
const WAIT: Duration = Duration::from_secs(120);

/// A pod that runs `script` in the busybox image once (restartPolicy Never).
fn pod(name: &str, script: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "command": ["/bin/sh", "-c", script]}]
        }
    }))?)
}

/// Waits until the pod reaches `phase` (Succeeded or Failed) and returns its container's terminated state.
async fn finished(pods: &Api<Pod>, name: &str, phase: &str) -> Result<ContainerStateTerminated> {
    let pod = wait_for(&format!("pod {name} {phase}"), WAIT, || async {
        let pod = pods.get(name).await?;
        let current = pod.status.as_ref().and_then(|s| s.phase.clone());
        Ok((current.as_deref() == Some(phase)).then_some(pod))
    })
    .await?;
    let status = pod.status.unwrap_or_default();
    let container = status
        .container_statuses
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.name == "main")
        .with_context(|| format!("pod {name} has no status for its container"))?;
    // A real runtime's container, not a simulated one.
    let id = container.container_id.clone().unwrap_or_default();
    ensure!(
        id.starts_with("containerd://"),
        "pod {name}'s container id {id:?} is not containerd's"
    );
    container
        .state
        .and_then(|s| s.terminated)
        .with_context(|| format!("pod {name} is {phase} but its container is not terminated"))
}

async fn default_service_account(client: &Client) -> Result<()> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    wait_for("ServiceAccount default/default", WAIT, || async {
        Ok(accounts.get_opt("default").await?.map(|_| ()))
    })
    .await
}

#[tokio::test]
async fn real_node_runs_containers_and_reports_their_exit() -> Result<()> {
    let kube = LocalKube::start_real_node().await?;
    let client = kube.client();
    default_service_account(&client).await?;

    let node = Api::<Node>::all(client.clone())
        .get(kube.node_name())
        .await?;
    let runtime = node
        .status
        .and_then(|s| s.node_info)
        .map(|i| i.container_runtime_version)
        .unwrap_or_default();
    ensure!(
        runtime.starts_with("containerd://2."),
        "node runtime is {runtime:?}, not containerd 2.x"
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // Writes a file and exits 0. The file is the container's termination log: the kubelet reads it back
    // from the container's file system into the status, so its text proves the command really ran.
    pods.create(
        &PostParams::default(),
        &pod(
            "writes",
            "echo written-in-the-container > /dev/termination-log",
        )?,
    )
    .await?;
    pods.create(
        &PostParams::default(),
        &pod("exits-3", "echo failing; exit 3")?,
    )
    .await?;

    let ok = finished(&pods, "writes", "Succeeded").await?;
    ensure!(ok.exit_code == 0, "pod writes exited {}", ok.exit_code);
    ensure!(
        ok.message.as_deref().map(str::trim) == Some("written-in-the-container"),
        "pod writes: termination message {:?}",
        ok.message
    );
    let failed = finished(&pods, "exits-3", "Failed").await?;
    ensure!(
        failed.exit_code == 3,
        "pod exits-3 exited {} (reason {:?})",
        failed.exit_code,
        failed.reason
    );
    ensure!(
        failed.reason.as_deref() == Some("Error"),
        "pod exits-3: reason {:?}",
        failed.reason
    );

    // A Job whose only pod fails, with no retry allowed, is Failed (the fake node would complete it).
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "fails"},
        "spec": {
            "backoffLimit": 0,
            "template": {"spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "command": ["/bin/sh", "-c", "exit 1"]}]
            }}
        }
    }))?;
    jobs.create(&PostParams::default(), &job).await?;
    let reason = wait_for("Job fails to be Failed", WAIT, || async {
        let job = jobs.get("fails").await?;
        let conditions = job.status.and_then(|s| s.conditions).unwrap_or_default();
        Ok(conditions
            .into_iter()
            .find(|c| c.type_ == "Failed" && c.status == "True")
            .map(|c| c.reason.unwrap_or_default()))
    })
    .await?;
    ensure!(
        reason == "BackoffLimitExceeded",
        "Job fails: Failed because {reason:?}"
    );
    let job_pods = pods
        .list(&ListParams::default().labels("job-name=fails"))
        .await?;
    let job_pod = job_pods.items.first().context("Job fails has no pod")?;
    let exit = finished(&pods, &job_pod.name_any(), "Failed").await?;
    ensure!(
        exit.exit_code == 1,
        "Job fails' pod exited {}",
        exit.exit_code
    );
    Ok(())
}
