//! Maintenance windows on a real cluster, against the wall clock. App `settings` has one deny window that
//! opens at the start of every minute and lasts 30 s, with `heal: report`, so each minute has a closed half
//! (`:00`–`:30`) and an open half:
//!
//! 1. a release published in the closed half is not applied there: the agent reports it Pending, naming the
//!    window, and the ConfigMap lands only once the window has closed;
//! 2. drift made in a later closed half is reported (OutOfSync) but not reverted while the window lasts, and
//!    is reverted when it ends — the agent wakes at the window's end on its own, no new release needed.

mod fault_support;

use std::time::Duration;

use fault_support::{SYNC, config_map, data, holds_for};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use windvane_tests::fleet::{Agent, AgentOptions, FleetTree, Publisher, object_state};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::store_server::StoreServer;

const FLEET: &str = "\
fleet: acme
apps:
  - name: settings
    path: settings
    windows:
      - {kind: deny, schedule: \"* * * * *\", duration: 30s, heal: report}
";

const SETTINGS: &str = "\
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: default}
data: {mode: strict}
";

const OBJECT: &str = "ConfigMap default/settings";

/// Seconds past the current minute, by the wall clock the agent judges windows with.
fn second_of_minute(at: Timestamp) -> i64 {
    at.as_second().rem_euclid(60)
}

/// The end of the deny window that is active at `at` (the minute's second 30).
fn window_end(at: Timestamp) -> Timestamp {
    Timestamp::from_second(at.as_second() - second_of_minute(at) + 30).expect("in range")
}

/// Waits until the wall clock is `from..=to` seconds into a minute (this minute or the next): the window's
/// state is a function of the clock, so the clock is the condition waited for.
async fn wait_for_second(from: i64, to: i64) {
    let second = second_of_minute(Timestamp::now());
    if (from..=to).contains(&second) {
        return;
    }
    let wait = (from - second).rem_euclid(60);
    tokio::time::sleep(Duration::from_secs(u64::try_from(wait).unwrap_or(0))).await;
}

async fn mode(kube: &LocalKube) -> anyhow::Result<Option<String>> {
    let cm = config_map(kube, "default", "settings").await?;
    Ok(data(cm.as_ref(), "mode").map(str::to_owned))
}

/// Checks `check` all along until 2 s before `end` (the end of the window active now).
async fn holds_until(
    end: Timestamp,
    check: impl AsyncFnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let left = end.duration_since(Timestamp::now()) - jiff::SignedDuration::from_secs(2);
    holds_for(Duration::try_from(left).unwrap_or_default(), check).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_window_defers_the_release_and_only_reports_drift_until_it_ends()
-> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(71)?;
    let tree = FleetTree::new()?;
    tree.write("fleet.yaml", FLEET)?;
    tree.write("settings/settings.yaml", SETTINGS)?;
    let server = StoreServer::start(publisher.store()).await?;
    let options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1");

    // 1. Published inside the window: Pending, nothing applied until the window ends.
    wait_for_second(1, 12).await;
    publisher.publish(&tree, "stable")?;
    let closes = window_end(Timestamp::now());
    let agent = Agent::start(&kube, &options).await?;
    let status = agent
        .wait_status("the release pending on its window", SYNC, |st| {
            st["source"]["pending"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("maintenance window"))
        })
        .await?;
    let message = status["source"]["pending"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("app settings"), "{message}");
    holds_until(closes, async || Ok(mode(&kube).await?.is_none())).await?;
    wait_for("the release applied after the window", SYNC, || async {
        Ok(mode(&kube).await?.is_some().then_some(()))
    })
    .await?;
    assert!(
        Timestamp::now() >= closes,
        "applied at {}, before the window closed at {closes}",
        Timestamp::now()
    );
    agent
        .wait_status("synced", SYNC, |st| {
            object_state(st, OBJECT) == Some("Synced")
        })
        .await?;

    // 2. Drift inside the next window: reported, left alone until the window ends, then reverted.
    wait_for_second(4, 12).await;
    let params = PatchParams {
        field_manager: Some("kubectl-edit".to_owned()),
        ..PatchParams::default()
    };
    Api::<ConfigMap>::namespaced(kube.client(), "default")
        .patch(
            "settings",
            &params,
            &Patch::Merge(json!({"data": {"mode": "loose"}})),
        )
        .await?;
    let closes = window_end(Timestamp::now());
    agent
        .wait_status("drift reported in the window", SYNC, |st| {
            object_state(st, OBJECT) == Some("OutOfSync")
        })
        .await?;
    holds_until(closes, async || {
        Ok(mode(&kube).await?.as_deref() == Some("loose"))
    })
    .await?;
    wait_for("drift reverted after the window", SYNC, || async {
        Ok((mode(&kube).await?.as_deref() == Some("strict")).then_some(()))
    })
    .await?;
    assert!(
        Timestamp::now() >= closes,
        "reverted at {}, inside the window that ends at {closes}",
        Timestamp::now()
    );
    agent
        .wait_status("synced again", SYNC, |st| {
            object_state(st, OBJECT) == Some("Synced")
        })
        .await?;
    Ok(())
}
