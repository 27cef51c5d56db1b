//! Sealed to a cluster's own enrolled identity: `windvane seal --to-cluster eu-1 --server URL` encrypts to the
//! age recipient of the Ed25519 key eu-1 enrolled with (the server shows it; nothing else to install). eu-1's
//! agent opens it with that key and applies the Secret; us-1, enrolled at the same server, reports the object
//! Failed naming the recipient it needed, and its other objects stay Synced. The value, as written or in
//! base64, is nowhere in the store, the server's database or log, or either cluster's agent `/status`,
//! `/metrics` and log, Events or control-plane log.

use std::process::Command;
use std::time::Duration;

use anyhow::ensure;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use serde_json::Value;
use windvane_tests::fleet::{Agent, AgentOptions, FleetTree, Publisher};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::process::binary;
use windvane_tests::secrets::{ensure_not_in_cluster, ensure_not_in_files};
use windvane_tests::server::SourceServer;

const WAIT: Duration = Duration::from_secs(90);
const SECRET: &str = "Secret payments/eu-1-token";
const VALUE: &str = "eu-1-only-token-5f1c";

fn windvane(args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(binary("windvane")?).args(args).output()?;
    ensure!(
        output.status.success(),
        "windvane {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

fn state<'a>(status: &'a Value, name: &str) -> (&'a str, &'a str) {
    let found = status["objects"]
        .as_array()
        .and_then(|o| o.iter().find(|o| o["object"] == name));
    (
        found.and_then(|o| o["state"].as_str()).unwrap_or(""),
        found.and_then(|o| o["message"].as_str()).unwrap_or(""),
    )
}

fn tree() -> anyhow::Result<FleetTree> {
    let tree = FleetTree::new()?;
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: payments\n    path: payments\n",
    )?;
    tree.write(
        "payments/base.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: payments}\n---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: payments}\ndata: {mode: live}\n",
    )?;
    Ok(tree)
}

async fn start_cluster(
    server: &SourceServer,
    publisher: &Publisher,
    name: &str,
) -> anyhow::Result<(LocalKube, Agent)> {
    let kube = LocalKube::start().await?;
    let options = AgentOptions::new(&server.url, &publisher.public_key_path(), name).reporting_to(
        &server.url,
        &server.token_file,
        "1s",
    );
    let agent = Agent::start(&kube, &options).await?;
    agent
        .wait_status(&format!("{name} Synced on release 1"), WAIT, |s| {
            s["state"] == "Synced" && s["source"]["appliedSerial"] == 1
        })
        .await?;
    Ok((kube, agent))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_sealed_to_one_clusters_enrolled_key_opens_there_only() -> anyhow::Result<()> {
    let publisher = Publisher::new(71)?;
    let tree = tree()?;
    publisher.publish(&tree, "stable")?;
    let server = SourceServer::start(&publisher.store(), &[]).await?;
    let ((eu_kube, eu), (us_kube, us)) = tokio::try_join!(
        start_cluster(&server, &publisher, "eu-1"),
        start_cluster(&server, &publisher, "us-1"),
    )?;
    let http = windvane_tests::http::client();
    let (recipient, keyid) = wait_for("eu-1's age recipient on the server", WAIT, || async {
        let body = http
            .get(format!("{}/api/v1/clusters/eu-1", server.url))
            .send()
            .await?
            .text()
            .await?;
        let detail: Value = serde_json::from_str(&body)?;
        let recipient = detail["cluster"]["ageRecipient"].as_str();
        let keyid = detail["cluster"]["keyid"].as_str();
        Ok(recipient
            .zip(keyid)
            .map(|(r, k)| (r.to_owned(), k.to_owned())))
    })
    .await?;

    let plain = tree.path().join("plain-secret.yaml");
    std::fs::write(
        &plain,
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: eu-1-token, namespace: payments}}\n\
             stringData: {{token: {VALUE}}}\n"
        ),
    )?;
    let sealed = tree.path().join("payments/eu-1-token.yaml");
    let plain_arg = plain.display().to_string();
    let sealed_arg = sealed.display().to_string();
    // Pinned to another key id (the operator's note of eu-1's key, say, before a re-key): refused.
    let wrong = Command::new(binary("windvane")?)
        .args([
            "seal",
            &plain_arg,
            "-o",
            &sealed_arg,
            "--server",
            &server.url,
        ])
        .args(["--to-cluster", "eu-1=00000000000000000000"])
        .output()?;
    let said = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        !wrong.status.success() && said.contains("not the pinned"),
        "{said}"
    );
    // Pinned to the key id eu-1's agent enrolled (what it logs at start).
    let pinned = format!("eu-1={}", &keyid[..16]);
    windvane(&[
        "seal",
        &plain_arg,
        "-o",
        &sealed_arg,
        "--to-cluster",
        &pinned,
        "--server",
        &server.url,
    ])?;
    std::fs::remove_file(&plain)?;
    let sealed_text = std::fs::read_to_string(&sealed)?;
    assert!(sealed_text.contains(&recipient), "{sealed_text}");
    assert!(!sealed_text.contains(VALUE));
    publisher.publish(&tree, "stable")?;

    let eu_status = eu
        .wait_status("eu-1 Synced on release 2", WAIT, |s| {
            s["source"]["appliedSerial"] == 2 && state(s, SECRET).0 == "Synced"
        })
        .await?;
    assert_eq!(eu_status["state"], "Synced", "{eu_status}");
    let secrets: Api<Secret> = Api::namespaced(eu_kube.client(), "payments");
    let applied = secrets.get("eu-1-token").await?;
    let token = applied.data.and_then(|mut d| d.remove("token"));
    assert_eq!(token.map(|t| t.0), Some(VALUE.as_bytes().to_vec()));

    let us_status = us
        .wait_status("us-1 refuses the Secret sealed to eu-1", WAIT, |s| {
            s["source"]["appliedSerial"] == 2 && state(s, SECRET).0 == "Failed"
        })
        .await?;
    let (_, message) = state(&us_status, SECRET);
    assert!(message.contains(&recipient), "{message}");
    assert_eq!(state(&us_status, "ConfigMap payments/settings").0, "Synced");

    ensure_not_in_cluster(&eu_kube, &eu, &[VALUE]).await?;
    ensure_not_in_cluster(&us_kube, &us, &[VALUE]).await?;
    ensure_not_in_files(&[publisher.store(), server.dir().to_path_buf()], &[VALUE])?;
    Ok(())
}
