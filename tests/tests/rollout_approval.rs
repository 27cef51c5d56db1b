//! Two-person approval end to end: one real `windvane-server` and one localkube cluster with a real agent that
//! trusts an approver key (`--approver-key`, and — to show it still never counts — the publisher's own key).
//! Release 2 carries `rollout: {approval: {threshold: 1}}`, signed in its pointer. In order:
//!
//! 1. release 2 is not applied: the cluster keeps release 1, and the server's cluster API and page show
//!    `Awaiting approval (0 of 1)` and what it would change (one object updated); the agent's metrics say
//!    one approval is required;
//! 2. `windvane approve` with the publisher's key is refused, and an approval file signed by it by hand does
//!    not count (the agent says why);
//! 3. a forged approval (the approver's signature damaged) and one for another serial are refused, and the
//!    agent's status says so;
//! 4. `windvane approve --key alice.key` lands release 2 within a poll interval (plus an apply).
//!
//! The cluster's ConfigMap `web/release` carries the release's version, read from its own API server.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use windvane_shared::crypto::keys::signing_key_from_pem;
use windvane_shared::decide::approval::{ApprovalStatement, add_signature, approval_path};
use windvane_shared::format::release::ReleasePointer;
use windvane_tests::fleet::{AgentOptions, Cluster, FleetTree, Publisher, metric};
use windvane_tests::poll::wait_for;
use windvane_tests::process::binary;
use windvane_tests::server::SourceServer;

const WAIT: Duration = Duration::from_secs(60);
const CLUSTER: &str = "prod-1";

fn web(version: u32) -> String {
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: web}}\n---\napiVersion: v1\nkind: ConfigMap\n\
         metadata: {{name: release, namespace: web}}\ndata: {{version: \"{version}\"}}\n"
    )
}

fn windvane(args: &[&str]) -> anyhow::Result<std::process::Output> {
    Ok(Command::new(binary("windvane")?).args(args).output()?)
}

async fn version(cluster: &Cluster) -> Option<String> {
    Api::<ConfigMap>::namespaced(cluster.kube.client(), "web")
        .get("release")
        .await
        .ok()
        .and_then(|c| c.data)
        .and_then(|mut d| d.remove("version"))
}

async fn pending_message(cluster: &Cluster) -> String {
    let Ok(agent) = cluster.agent() else {
        return String::new();
    };
    agent
        .status()
        .await
        .ok()
        .and_then(|s| {
            s["source"]["pending"]["message"]
                .as_str()
                .map(str::to_owned)
        })
        .unwrap_or_default()
}

/// Waits until the agent's pending message contains `text`; the cluster stays at version 1 meanwhile.
async fn wait_message(cluster: &Cluster, text: &str) -> anyhow::Result<String> {
    let message = wait_for(&format!("the agent to report {text:?}"), WAIT, || async {
        let message = pending_message(cluster).await;
        Ok(message.contains(text).then_some(message))
    })
    .await
    .with_context(|| windvane_tests::process::tail(&cluster.agent_log(), 30))?;
    assert_eq!(
        version(cluster).await.as_deref(),
        Some("1"),
        "applied before approval"
    );
    Ok(message)
}

/// Writes an approval file by hand: `key` signs `statement` (the approval file of `serial`).
fn write_approval(
    store: &std::path::Path,
    serial: u64,
    statement: &ApprovalStatement,
    key: &ed25519_dalek::SigningKey,
    damage: bool,
) -> anyhow::Result<()> {
    let mut envelope = add_signature(None, statement, key).map_err(anyhow::Error::msg)?;
    if damage {
        let other = add_signature(
            None,
            &ApprovalStatement {
                serial: 99,
                ..statement.clone()
            },
            key,
        )
        .map_err(anyhow::Error::msg)?;
        envelope.signatures[0].sig = other.signatures[0].sig.clone();
    }
    let path = store.join(approval_path("stable", serial));
    std::fs::create_dir_all(path.parent().expect("parent"))?;
    std::fs::write(&path, envelope.to_json_bytes())?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_requires_approval_waits_for_a_second_persons_key() -> anyhow::Result<()> {
    let publisher = Publisher::new(93)?;
    let keys = tempfile::tempdir()?;
    let alice = keys.path().join("alice");
    let made = windvane(&["keygen", "--out", &alice.display().to_string()])?;
    anyhow::ensure!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let (alice_key, alice_pub) = (alice.with_extension("key"), alice.with_extension("pub"));

    let tree = FleetTree::new()?;
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: web\n    path: web\n",
    )?;
    tree.write("web/config.yaml", &web(1))?;
    publisher.publish(&tree, "stable")?;
    let server = SourceServer::start(&publisher.store(), &[]).await?;
    let mut options = AgentOptions::new(&server.url, &publisher.public_key_path(), CLUSTER)
        .reporting_to(&server.url, &server.token_file, "1s");
    let approvers = format!(
        "{},{}",
        alice_pub.display(),
        publisher.public_key_path().display()
    );
    options
        .extra
        .extend(["--approver-key".to_owned(), approvers]);
    let cluster = Cluster::start(options).await?;
    wait_for("release 1 applied", WAIT, || async {
        Ok((version(&cluster).await.as_deref() == Some("1")).then_some(()))
    })
    .await?;

    // 1. Release 2 requires one approval: it waits, and the server shows it.
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: web\n    path: web\nrollout:\n  approval: {threshold: 1}\n",
    )?;
    tree.write("web/config.yaml", &web(2))?;
    let pointer: ReleasePointer = publisher.publish(&tree, "stable")?;
    assert_eq!(
        pointer
            .rollout
            .as_ref()
            .and_then(|r| r.approval)
            .map(|a| a.threshold),
        Some(1)
    );
    wait_message(&cluster, "Awaiting approval (0 of 1)").await?;
    let api = format!("/api/v1/clusters/{CLUSTER}");
    wait_for("the server to show Awaiting approval", WAIT, || async {
        let body = server.api(&api).await?.to_string();
        Ok(body.contains("Awaiting approval").then_some(()))
    })
    .await?;
    let (_, page) = server.get(&format!("/clusters/{CLUSTER}")).await?;
    assert!(page.contains("Awaiting approval (0 of 1)"), "{page}");
    // What approving it would change, worked out by the agent against what it applied: one ConfigMap.
    assert!(
        page.contains("would create 0, update 1 and prune 0 objects"),
        "{page}"
    );
    let detail = server.api(&api).await?;
    assert_eq!(
        detail["report"]["source"]["pending"]["changes"],
        serde_json::json!({"create": 0, "update": 1, "prune": 0}),
        "{detail}"
    );
    let metrics = cluster.agent()?.metrics().await?;
    assert_eq!(
        metric(&metrics, "windvane_approvals_required"),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(metric(&metrics, "windvane_approvals_valid"), Some(0.0));

    // 2. The publisher's own key: refused by the command line, not counted by the agent.
    let store = publisher.store().display().to_string();
    let release_key = publisher.key_path()?.display().to_string();
    let release_pub = publisher.public_key_path().display().to_string();
    let approve = |key: &str, serial: &str| {
        windvane(&[
            "approve",
            "--root",
            &store,
            "--channel",
            "stable",
            "--serial",
            serial,
            "--key",
            key,
            "--trusted-key",
            &release_pub,
        ])
    };
    let own = approve(&release_key, "2")?;
    assert!(
        !own.status.success(),
        "the publisher approved its own release"
    );
    assert!(
        String::from_utf8_lossy(&own.stderr).contains("second person"),
        "{own:?}"
    );
    let wrong_serial = approve(&alice_key.display().to_string(), "1")?;
    assert!(
        !wrong_serial.status.success(),
        "approved a serial that is not current"
    );
    let publisher_key =
        signing_key_from_pem(&std::fs::read_to_string(&release_key)?, "release.key")?;
    let statement = ApprovalStatement::of(&pointer);
    write_approval(&publisher.store(), 2, &statement, &publisher_key, false)?;
    wait_message(&cluster, "it is the key that published the release").await?;

    // 3. Forged: the approver's signature damaged; and a genuine approval of another serial.
    let alice_signing = signing_key_from_pem(&std::fs::read_to_string(&alice_key)?, "alice.key")?;
    write_approval(&publisher.store(), 2, &statement, &alice_signing, true)?;
    wait_message(&cluster, "bad signature").await?;
    let other = ApprovalStatement {
        serial: 1,
        ..statement.clone()
    };
    write_approval(&publisher.store(), 2, &other, &alice_signing, false)?;
    wait_message(&cluster, "not this release").await?;
    let metrics = cluster.agent()?.metrics().await?;
    assert!(
        metric(&metrics, "windvane_approvals_refused_total").unwrap_or(0.0) >= 3.0,
        "{metrics}"
    );

    // 4. A second person approves: the release lands within a poll interval.
    std::fs::remove_file(publisher.store().join(approval_path("stable", 2)))?;
    let approved = approve(&alice_key.display().to_string(), "2")?;
    anyhow::ensure!(
        approved.status.success(),
        "{}",
        String::from_utf8_lossy(&approved.stderr)
    );
    // What the approver is told counts both sides: the rollout's threshold and an agent's own floor.
    let told = String::from_utf8_lossy(&approved.stdout);
    assert!(
        told.contains(
            "the release requires 1 approval(s); agents started with --require-approvals N"
        ),
        "{told}"
    );
    let started = Instant::now();
    wait_for("release 2 applied after approval", WAIT, || async {
        Ok((version(&cluster).await.as_deref() == Some("2")).then_some(()))
    })
    .await
    .with_context(|| windvane_tests::process::tail(&cluster.agent_log(), 30))?;
    let took = started.elapsed();
    println!("applied {:.1} s after windvane approve", took.as_secs_f64());
    assert!(took < Duration::from_secs(10), "took {took:?}");
    wait_for("the pending report to clear", WAIT, || async {
        Ok(pending_message(&cluster).await.is_empty().then_some(()))
    })
    .await?;
    Ok(())
}

/// The operator's floor: an agent started with `--require-approvals 1` holds every release — also the
/// first, and one whose signed rollout asks for no approval at all — until an `--approver-key` other than
/// the publisher's approved it; meanwhile it keeps the last known good and its status says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_approval_floor_holds_releases_that_ask_for_none() -> anyhow::Result<()> {
    let publisher = Publisher::new(94)?;
    let keys = tempfile::tempdir()?;
    let alice = keys.path().join("alice");
    let made = windvane(&["keygen", "--out", &alice.display().to_string()])?;
    anyhow::ensure!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let (alice_key, alice_pub) = (alice.with_extension("key"), alice.with_extension("pub"));
    let tree = FleetTree::new()?;
    // No rollout.approval, in any release of this test.
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: web\n    path: web\n",
    )?;
    tree.write("web/config.yaml", &web(1))?;
    let first: ReleasePointer = publisher.publish(&tree, "stable")?;
    assert!(first.rollout.as_ref().and_then(|r| r.approval).is_none());
    let server = SourceServer::start(&publisher.store(), &[]).await?;
    let mut options = AgentOptions::new(&server.url, &publisher.public_key_path(), CLUSTER);
    let approvers = format!(
        "{},{}",
        alice_pub.display(),
        publisher.public_key_path().display()
    );
    options.extra.extend([
        "--approver-key".to_owned(),
        approvers,
        "--require-approvals".to_owned(),
        "1".to_owned(),
    ]);
    let cluster = Cluster::start(options).await?;
    let store = publisher.store().display().to_string();
    let release_pub = publisher.public_key_path().display().to_string();
    let alice_key = alice_key.display().to_string();
    let approve = |serial: &str| {
        windvane(&[
            "approve",
            "--root",
            &store,
            "--channel",
            "stable",
            "--serial",
            serial,
            "--key",
            &alice_key,
            "--trusted-key",
            &release_pub,
        ])
    };

    // The first release waits: nothing is applied, and the status names the operator's floor.
    let message = wait_for("the first release to wait for approval", WAIT, || async {
        let message = pending_message(&cluster).await;
        Ok(message
            .contains("Awaiting approval (0 of 1)")
            .then_some(message))
    })
    .await
    .with_context(|| windvane_tests::process::tail(&cluster.agent_log(), 30))?;
    assert!(message.contains("--require-approvals"), "{message}");
    assert_eq!(version(&cluster).await, None, "applied before approval");
    let approved = approve("1")?;
    anyhow::ensure!(
        approved.status.success(),
        "{}",
        String::from_utf8_lossy(&approved.stderr)
    );
    wait_for("release 1 applied after approval", WAIT, || async {
        Ok((version(&cluster).await.as_deref() == Some("1")).then_some(()))
    })
    .await
    .with_context(|| windvane_tests::process::tail(&cluster.agent_log(), 30))?;

    // The next release, signed without approval, waits too; release 1 stays enforced.
    tree.write("web/config.yaml", &web(2))?;
    let second: ReleasePointer = publisher.publish(&tree, "stable")?;
    assert!(second.rollout.as_ref().and_then(|r| r.approval).is_none());
    wait_message(&cluster, "Awaiting approval (0 of 1)").await?;
    // The publisher's own signature is never an approval, even when its key is an --approver-key.
    let release_key = publisher.key_path()?;
    let publisher_key =
        signing_key_from_pem(&std::fs::read_to_string(&release_key)?, "release.key")?;
    write_approval(
        &publisher.store(),
        second.serial,
        &ApprovalStatement::of(&second),
        &publisher_key,
        false,
    )?;
    wait_message(&cluster, "it is the key that published the release").await?;
    // An approval of release 1's bundle under serial 2's name does not count either.
    let alice_signing = signing_key_from_pem(&std::fs::read_to_string(&alice_key)?, "alice.key")?;
    let stale = ApprovalStatement {
        bundle_sha256: first.bundle.sha256.clone(),
        ..ApprovalStatement::of(&second)
    };
    write_approval(
        &publisher.store(),
        second.serial,
        &stale,
        &alice_signing,
        false,
    )?;
    wait_message(&cluster, "not this release").await?;
    std::fs::remove_file(
        publisher
            .store()
            .join(approval_path("stable", second.serial)),
    )?;
    let approved = approve(&second.serial.to_string())?;
    anyhow::ensure!(
        approved.status.success(),
        "{}",
        String::from_utf8_lossy(&approved.stderr)
    );
    wait_for("release 2 applied after approval", WAIT, || async {
        Ok((version(&cluster).await.as_deref() == Some("2")).then_some(()))
    })
    .await
    .with_context(|| windvane_tests::process::tail(&cluster.agent_log(), 30))?;
    Ok(())
}
