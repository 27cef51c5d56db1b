//! Source-side faults against the real agent, a real control plane (localkube) and a real HTTP store server
//! that misbehaves on purpose (`windvane_tests::store_server`): a source down for many poll intervals, bodies
//! cut short, bodies that never end (cut at the cap, the agent's memory bounded), pointers signed by an
//! unknown or weak key, for another channel, replaying a serial with another bundle or issued in the future,
//! a validly signed empty release without `allowEmpty`, and a release that would prune beyond the deletion
//! budget. In every case the last known good release stays enforced and the fault is reported.
//!
//! Covered elsewhere and not repeated here (`agent_sync.rs`, `refused_releases_leave_the_last_known_good_
//! enforced`): a tampered bundle, a bad signature, a rolled-back serial, another fleet's release, an expired
//! release, and a source that is down when the agent starts.

mod fault_support;

use std::time::Duration;

use base64::Engine;
use fault_support::{
    SYNC, bundle_of, config_map, config_map_names, data, holds_for, inventory, memory, metric,
    pruned_count, refusal, release_key, sign_by_hand, wait_config_map,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use windvane_shared::crypto::dsse::Envelope;
use windvane_shared::crypto::keys::keyid;
use windvane_tests::fleet::{Agent, AgentOptions, FleetTree, Publisher};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::process::{binary, tail};
use windvane_tests::store_server::{Mode, StoreServer, Target};

const FLEET: &str = "fleet: acme\napps:\n  - name: app\n    path: app\n    policy: {prune: true}\n    values: {v: one}\n";
const VALUE: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: value, namespace: default}\ndata: {v: '${values.v}'}\n";
const OTHER: &str =
    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: other, namespace: default}\ndata: {k: v}\n";

/// A tree whose ConfigMap `value` carries `v`.
fn tree_with(v: &str) -> anyhow::Result<FleetTree> {
    let tree = FleetTree::new()?;
    tree.write("fleet.yaml", &FLEET.replace("v: one", &format!("v: {v}")))?;
    tree.write("app/objects.yaml", &format!("{VALUE}---\n{OTHER}"))?;
    Ok(tree)
}

async fn value(kube: &LocalKube) -> anyhow::Result<Option<String>> {
    let cm = config_map(kube, "default", "value").await?;
    Ok(data(cm.as_ref(), "v").map(str::to_owned))
}

/// Waits until the agent reports a refusal for `reason`, and checks that release `serial` with value `v`
/// stays enforced.
async fn expect_refusal(
    agent: &Agent,
    kube: &LocalKube,
    reason: &str,
    serial: u64,
    v: &str,
) -> anyhow::Result<Value> {
    let status = agent
        .wait_status(&format!("refusal {reason}"), SYNC, |s| {
            refusal(s) == Some(reason)
        })
        .await?;
    assert_eq!(status["state"], "Failed", "a refusal is reported as Failed");
    assert_eq!(
        status["source"]["appliedSerial"], serial,
        "the last known good stays enforced"
    );
    assert_eq!(value(kube).await?.as_deref(), Some(v), "nothing applied");
    let metrics = agent.metrics().await?;
    assert!(
        metric(
            &metrics,
            &format!("windvane_source_fetch_total{{result=\"{reason}\"}}")
        )
        .is_some_and(|n| n >= 1.0),
        "the refusal is counted in /metrics: {metrics}"
    );
    Ok(status)
}

/// Waits until a good pointer clears the last refusal.
async fn expect_cleared(agent: &Agent) -> anyhow::Result<()> {
    agent
        .wait_status("refusal cleared", SYNC, |s| {
            s["source"]["lastRefusal"].is_null()
        })
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_down_for_many_intervals_keeps_enforcing_and_healing_and_is_reported_stale()
-> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(21)?;
    publisher.publish(&tree_with("one")?, "stable")?;
    let mut server = StoreServer::start(publisher.store()).await?;
    let agent = Agent::start(
        &kube,
        &AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1"),
    )
    .await?;
    agent
        .wait_status("synced", SYNC, |s| {
            s["state"] == "Synced" && s["counts"]["Synced"] == 2
        })
        .await?;
    assert_eq!(
        metric(&agent.metrics().await?, "windvane_source_stale"),
        Some(0.0)
    );
    let inventory_before = inventory(&kube).await?;
    assert_eq!(inventory_before.len(), 2, "{inventory_before:?}");

    server.stop();
    // A new release published meanwhile cannot be seen; the last known good stays enforced.
    publisher.publish(&tree_with("two")?, "stable")?;
    let status = agent
        .wait_status("source reported stale", SYNC, |s| {
            s["source"]["staleSince"].is_string()
        })
        .await?;
    assert!(
        status["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("/channels/stable.json")),
        "the error names the pointer URL: {status}"
    );
    // Many poll intervals (1 s, backing off exponentially up to 10 s) go by with the source down.
    let failures = wait_for("five failed polls", SYNC, || async {
        let failures = metric(
            &agent.metrics().await?,
            "windvane_source_fetch_total{result=\"fetch\"}",
        )
        .unwrap_or(0.0);
        Ok((failures >= 5.0).then_some(failures))
    })
    .await?;
    let metrics = agent.metrics().await?;
    assert_eq!(
        metric(&metrics, "windvane_source_stale"),
        Some(1.0),
        "{metrics}"
    );

    // Self-heal goes on without the source: a deleted object comes back, an edited one is reverted.
    let config_maps = Api::<ConfigMap>::namespaced(kube.client(), "default");
    config_maps
        .delete("value", &DeleteParams::default())
        .await?;
    config_maps
        .patch(
            "other",
            &PatchParams {
                field_manager: Some("kubectl-edit".into()),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({"data": {"k": "edited"}})),
        )
        .await?;
    wait_config_map(&kube, "default", "value", |cm| data(cm, "v") == Some("one")).await?;
    wait_config_map(&kube, "default", "other", |cm| data(cm, "k") == Some("v")).await?;

    // Still enforcing, still ready, nothing pruned, nothing forgotten, not refused (a stale source is not a bad
    // release).
    let status = agent.status().await?;
    assert_eq!(status["source"]["appliedSerial"], 1);
    assert!(status["source"]["lastRefusal"].is_null(), "{status}");
    assert_eq!(status["state"], "Synced", "{status}");
    assert_eq!(agent.readyz().await?, 200);
    assert_eq!(inventory(&kube).await?, inventory_before);
    assert!(config_map(&kube, "default", "value").await?.is_some());
    assert!(config_map(&kube, "default", "other").await?.is_some());
    assert_eq!(
        pruned_count(&agent.process.log()),
        0,
        "nothing is pruned while the source is down"
    );

    // The source comes back: the waiting release is taken and the staleness clears.
    server.resume().await?;
    wait_config_map(&kube, "default", "value", |cm| data(cm, "v") == Some("two")).await?;
    agent
        .wait_status("fresh again", SYNC, |s| {
            s["source"]["staleSince"].is_null() && s["source"]["appliedSerial"] == 2
        })
        .await?;
    assert_eq!(
        metric(&agent.metrics().await?, "windvane_source_stale"),
        Some(0.0)
    );
    println!("failed polls while the source was down: {failures}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_cut_short_or_endless_are_refused_and_memory_stays_bounded() -> anyhow::Result<()> {
    const MIB: u64 = 1024 * 1024;
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(22)?;
    publisher.publish(&tree_with("one")?, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let agent = Agent::start(
        &kube,
        &AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1"),
    )
    .await?;
    agent
        .wait_status("synced", SYNC, |s| s["state"] == "Synced")
        .await?;
    let pid = agent.process.pid().expect("the agent runs");

    // A pointer cut short mid-body: a fetch failure (the source is unreliable), not a release to judge.
    server.set_mode_for(Target::Pointers, Mode::Truncated);
    publisher.publish(&tree_with("two")?, "stable")?;
    let status = agent
        .wait_status("truncated pointer reported", SYNC, |s| {
            s["source"]["staleSince"].is_string()
                && s["lastError"]
                    .as_str()
                    .is_some_and(|e| e.contains("/channels/stable.json"))
        })
        .await?;
    assert_eq!(status["source"]["appliedSerial"], 1);
    assert_eq!(value(&kube).await?.as_deref(), Some("one"));
    server.set_mode(Mode::Normal);
    wait_config_map(&kube, "default", "value", |cm| data(cm, "v") == Some("two")).await?;

    // A bundle cut short: nothing is accepted or persisted from it.
    server.set_mode_for(Target::Bundles, Mode::Truncated);
    publisher.publish(&tree_with("three")?, "stable")?;
    let status = agent
        .wait_status("truncated bundle reported", SYNC, |s| {
            s["source"]["staleSince"].is_string()
                && s["lastError"]
                    .as_str()
                    .is_some_and(|e| e.contains("/bundles/"))
        })
        .await?;
    assert_eq!(status["source"]["appliedSerial"], 2);
    assert_eq!(value(&kube).await?.as_deref(), Some("two"));
    server.set_mode(Mode::Normal);
    wait_config_map(&kube, "default", "value", |cm| {
        data(cm, "v") == Some("three")
    })
    .await?;

    // An endless pointer: the agent stops reading at the pointer cap (64 KiB) and refuses it.
    server.set_mode_for(Target::Pointers, Mode::Endless);
    let status = expect_refusal(&agent, &kube, "size_cap", 3, "three").await?;
    assert!(
        status["source"]["lastRefusal"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("channel pointer")),
        "{status}"
    );
    let (_, pointer_most) = server.endless_bytes();
    server.set_mode(Mode::Normal);
    expect_cleared(&agent).await?;

    // An endless bundle behind a valid new pointer: cut at the bundle cap (64 MiB), refused, and the agent's
    // peak memory grows by no more than about that cap.
    let (rss_before, peak_before) = memory(pid)?;
    server.set_mode_for(Target::Bundles, Mode::Endless);
    publisher.publish(&tree_with("four")?, "stable")?;
    let status = expect_refusal(&agent, &kube, "size_cap", 3, "three").await?;
    let (rss_during, peak_during) = memory(pid)?;
    let (sent_total, bundle_most) = server.endless_bytes();
    server.set_mode(Mode::Normal);
    assert!(
        status["source"]["lastRefusal"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("bundle")),
        "{status}"
    );
    wait_config_map(&kube, "default", "value", |cm| {
        data(cm, "v") == Some("four")
    })
    .await?;
    let (rss_after, peak_after) = memory(pid)?;
    println!(
        "endless bodies: pointer response cut after {} KiB, bundle response cut after {} MiB ({} MiB sent in all); \
         agent RSS before {} MiB, during {} MiB, after {} MiB; peak before {} MiB, during {} MiB, after {} MiB",
        pointer_most / 1024,
        bundle_most / MIB,
        sent_total / MIB,
        rss_before / MIB,
        rss_during / MIB,
        rss_after / MIB,
        peak_before / MIB,
        peak_during / MIB,
        peak_after / MIB
    );
    // What the server managed to send before the agent hung up: the cap plus what socket buffers hold.
    assert!(
        pointer_most < 16 * MIB,
        "the pointer read stops at its cap: {pointer_most} bytes sent"
    );
    assert!(
        bundle_most < 64 * MIB + 16 * MIB,
        "the bundle read stops at its cap: {bundle_most} bytes sent"
    );
    // The body is kept in memory up to the cap, once: the peak grows by at most the cap and some slack.
    let budget = rss_before.max(peak_before) + 64 * MIB + 48 * MIB;
    assert!(
        peak_after <= budget,
        "peak RSS {} MiB exceeds {} MiB",
        peak_after / MIB,
        budget / MIB
    );
    assert!(
        rss_after <= rss_before + 64 * MIB,
        "memory is given back: RSS {} MiB after, {} MiB before",
        rss_after / MIB,
        rss_before / MIB
    );
    Ok(())
}

/// SubjectPublicKeyInfo PEM of the Ed25519 identity point: a valid encoding of the weakest key there is.
fn weak_key_pem() -> String {
    use ed25519_dalek::pkcs8::EncodePublicKey;
    use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
    let mut identity = [0u8; 32];
    identity[0] = 1;
    ed25519_dalek::pkcs8::PublicKeyBytes(identity)
        .to_public_key_pem(LineEnding::LF)
        .expect("encoding a public key")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_weak_keys_other_channels_replays_and_future_pointers_are_refused()
-> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let seed = 23;
    let publisher = Publisher::new(seed)?;
    publisher.publish(&tree_with("one")?, "stable")?;
    let good = std::fs::read(publisher.pointer_path("stable"))?;
    let server = StoreServer::start(publisher.store()).await?;
    let options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1");
    let agent = Agent::start(&kube, &options).await?;
    agent
        .wait_status("synced", SYNC, |s| s["state"] == "Synced")
        .await?;
    let restore = || std::fs::write(publisher.pointer_path("stable"), &good);

    // Unknown key: a well-formed release of this fleet and channel, signed by a key the cluster does not trust.
    let stranger = Publisher::new(99)?;
    let pointer = stranger.publish(&tree_with("stranger")?, "stable")?;
    let bundle = windvane_store::bundle_path(&pointer.bundle.sha256);
    std::fs::copy(
        stranger.store().join(&bundle),
        publisher.store().join(&bundle),
    )?;
    std::fs::copy(
        stranger.pointer_path("stable"),
        publisher.pointer_path("stable"),
    )?;
    let status = expect_refusal(&agent, &kube, "unknown_key", 1, "one").await?;
    let stranger_id = keyid(&release_key(99).verifying_key());
    assert!(
        status["source"]["lastRefusal"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(&stranger_id)),
        "the refusal names the key: {status}"
    );
    restore()?;
    expect_cleared(&agent).await?;

    // A weak key can never be trusted: the agent refuses to start with one, naming the file...
    let weak = kube.data_dir().join("weak.pub");
    std::fs::write(&weak, weak_key_pem())?;
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(binary("windvane-agent")?)
            .args(["run", "--source", &server.url(), "--channel", "stable"])
            .args(["--fleet", "acme", "--cluster", "c1", "--trusted-key"])
            .arg(&weak)
            .arg("--kubeconfig")
            .arg(kube.kubeconfig_path())
            .kill_on_drop(true)
            .output(),
    )
    .await??;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("weak") && stderr.contains("weak.pub"),
        "{stderr}"
    );
    // ...and a pointer whose signature claims the weak key is a signature by an unknown key.
    let mut envelope = Envelope::from_json_slice(&good)?;
    let weak_id = windvane_shared::crypto::digest::sha256_hex(&{
        let mut identity = [0u8; 32];
        identity[0] = 1;
        identity
    });
    for signature in &mut envelope.signatures {
        signature.keyid = weak_id.clone();
        signature.sig = base64::engine::general_purpose::STANDARD.encode([0u8; 64]);
    }
    std::fs::write(publisher.pointer_path("stable"), envelope.to_json_bytes())?;
    let status = expect_refusal(&agent, &kube, "unknown_key", 1, "one").await?;
    assert!(
        status["source"]["lastRefusal"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(&weak_id)),
        "{status}"
    );
    restore()?;
    expect_cleared(&agent).await?;

    // Another channel's valid release, by the trusted key, placed on this channel.
    publisher.publish(&tree_with("beta")?, "beta")?;
    std::fs::copy(
        publisher.pointer_path("beta"),
        publisher.pointer_path("stable"),
    )?;
    expect_refusal(&agent, &kube, "other_channel", 1, "one").await?;
    restore()?;
    expect_cleared(&agent).await?;

    // The accepted serial again, validly signed, naming another bundle (a replay with different content).
    let key = release_key(seed);
    let now = jiff::Timestamp::now();
    sign_by_hand(
        &publisher.store(),
        &key,
        "stable",
        &bundle_of(&tree_with("replayed")?)?,
        1,
        now,
        false,
    )?;
    expect_refusal(&agent, &kube, "equivocation", 1, "one").await?;

    // A new serial issued an hour in the future (a publisher's clock far ahead).
    sign_by_hand(
        &publisher.store(),
        &key,
        "stable",
        &bundle_of(&tree_with("future")?)?,
        2,
        now + jiff::SignedDuration::from_hours(1),
        false,
    )?;
    expect_refusal(&agent, &kube, "issued_in_future", 1, "one").await?;

    // The agent still takes the next good release.
    restore()?;
    publisher.publish(&tree_with("two")?, "stable")?;
    wait_config_map(&kube, "default", "value", |cm| data(cm, "v") == Some("two")).await?;
    expect_cleared(&agent).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_release_and_one_over_the_deletion_budget_prune_nothing() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let seed = 24;
    let publisher = Publisher::new(seed)?;
    let tree = FleetTree::new()?;
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: app\n    path: app\n    policy: {prune: true}\n",
    )?;
    let write_objects = |names: &[&str]| {
        let yaml: Vec<String> = names
            .iter()
            .map(|n| format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {n}, namespace: default}}\ndata: {{a: b}}\n"))
            .collect();
        tree.write("app/objects.yaml", &yaml.join("---\n"))
    };
    write_objects(&["p-0", "p-1", "p-2", "p-3"])?;
    publisher.publish(&tree, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let mut options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1");
    options.extra = vec!["--prune-budget".into(), "0.5".into()];
    let agent = Agent::start(&kube, &options).await?;
    agent
        .wait_status("synced", SYNC, |s| s["counts"]["Synced"] == 4)
        .await?;
    let all: std::collections::BTreeSet<String> =
        ["p-0", "p-1", "p-2", "p-3"].map(String::from).into();
    let all_present = || async { Ok(config_map_names(&kube, "default", "p-").await? == all) };

    // A validly signed release with no objects and without allowEmpty (`windvane publish` refuses to make one;
    // a release key can still sign one): accepted, nothing pruned, reported.
    let mut empty = bundle_of(&tree)?;
    for app in &mut empty.apps {
        app.manifests.clear();
    }
    sign_by_hand(
        &publisher.store(),
        &release_key(seed),
        "stable",
        &empty,
        2,
        jiff::Timestamp::now(),
        false,
    )?;
    let status = agent
        .wait_status("empty release held back", SYNC, |s| {
            s["source"]["appliedSerial"] == 2
                && s["lastError"].as_str().is_some_and(|e| e.contains("empty"))
        })
        .await?;
    println!("empty release: {status}");
    holds_for(Duration::from_secs(5), all_present).await?;
    assert_eq!(inventory(&kube).await?.len(), 4, "still owned");

    // A release that keeps one object of four, with a budget of half: refused, reported, nothing deleted.
    write_objects(&["p-0"])?;
    publisher.publish(&tree, "stable")?;
    let status = agent
        .wait_status("over budget held back", SYNC, |s| {
            s["source"]["appliedSerial"] == 3
                && s["lastError"]
                    .as_str()
                    .is_some_and(|e| e.contains("deletion budget"))
        })
        .await?;
    println!("over budget: {status}");
    holds_for(Duration::from_secs(5), all_present).await?;
    assert_eq!(inventory(&kube).await?.len(), 4, "still owned");
    assert_eq!(
        pruned_count(&agent.process.log()),
        0,
        "{}",
        tail(&agent.process.log(), 40)
    );

    // Within the budget (two of four), pruning goes ahead and the report clears.
    write_objects(&["p-0", "p-1"])?;
    publisher.publish(&tree, "stable")?;
    wait_for("p-2 and p-3 pruned", SYNC, || async {
        let names = config_map_names(&kube, "default", "p-").await?;
        Ok((names == ["p-0", "p-1"].map(String::from).into()).then_some(()))
    })
    .await?;
    agent
        .wait_status("report cleared", SYNC, |s| {
            s["lastError"].is_null() && s["state"] == "Synced"
        })
        .await?;
    assert_eq!(inventory(&kube).await?.len(), 2);
    Ok(())
}
