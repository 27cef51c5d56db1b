//! Progressive rollouts end to end: one real `windvane-server` and six localkube clusters with real agents
//! — a canary (`tier=canary`), two clusters the 40 % wave takes by the hash of their names, and three left
//! for the last wave — following a channel whose releases carry `rollout:` (canary, 40 %, the rest; soak
//! 20 s each, `gate: healthy`). In order, on the same clusters:
//!
//! 1. a release reaches the waves in order: no cluster of a later wave changes before every cluster of the
//!    earlier waves is Synced on it and its signed time has come; a waiting agent reports
//!    `Pending (wave 2, opens in …)`; `windvane rollout status` exits 1 until every cluster has it, then 0;
//! 2. a canary that goes Degraded holds wave 2 past its time, and the server's rollout view (API and page)
//!    and the waiting agent say why; the fleet page links the rollout; server and agent metrics show it;
//! 3. with the server stopped during a gated rollout, the waiting agents do not advance (they say they cannot
//!    read the rollout status); they advance once it is back;
//! 4. `windvane rollout halt` stops the next waves of the current serial; `resume` lets them go on;
//! 5. `windvane rollback` publishes the previous bundle as a new serial, and every cluster returns to its
//!    objects: the value changed back, and the object only the newer release had pruned.
//!
//! Each cluster's ConfigMap `web/release` carries the release's version: the test reads it from the
//! clusters' own API servers.

use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use serde_json::Value;
use windvane_shared::decide::rollout::{BUCKETS, bucket};
use windvane_tests::fleet::{AgentOptions, Cluster, FleetTree, Publisher};
use windvane_tests::poll::wait_for;
use windvane_tests::process::binary;
use windvane_tests::server::SourceServer;

const WAIT: Duration = Duration::from_secs(120);
const SOAK_SECONDS: i64 = 20;
/// The index of each cluster's wave (0-based) in [`names`]'s order.
const WAVES: [usize; 6] = [0, 1, 1, 2, 2, 2];

const ROLLOUT: &str = "\
rollout:
  waves:
    - name: canary
      selector: {matchLabels: {tier: canary}}
      soak: 20s
      gate: healthy
    - name: forty
      percent: 40
      soak: 20s
      gate: healthy
    - name: rest
";

fn fleet_yaml(with_rollout: bool, trouble: bool) -> String {
    let mut text =
        "fleet: acme\napps:\n  - name: web\n    path: web\n    policy: {prune: true}\n".to_owned();
    if trouble {
        text.push_str(
            "  - name: trouble\n    path: trouble\n    selector: {matchLabels: {tier: canary}}\n",
        );
    }
    if with_rollout {
        text.push_str(ROLLOUT);
    }
    text
}

fn web(version: u32) -> String {
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: web}}\n---\napiVersion: v1\nkind: ConfigMap\n\
         metadata: {{name: release, namespace: web}}\ndata: {{version: \"{version}\"}}\n"
    )
}

/// An object that only release 5 carries.
const EXTRA: &str = "\
apiVersion: v1
kind: ConfigMap
metadata: {name: extra, namespace: web}
data: {only: release-5}
";

/// A ReplicaSet whose pods a quota forbids: Degraded.
const TROUBLE: &str = "\
apiVersion: v1
kind: Namespace
metadata: {name: trouble}
---
apiVersion: v1
kind: ResourceQuota
metadata: {name: no-pods, namespace: trouble, annotations: {windvane.io/wave: \"-1\"}}
spec:
  hard: {pods: \"0\"}
---
apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: blocked, namespace: trouble}
spec:
  replicas: 1
  selector: {matchLabels: {app: blocked}}
  template:
    metadata: {labels: {app: blocked}}
    spec:
      containers: [{name: c, image: registry.example.com/c:1.0}]
";

/// The cluster names: the canary, the first two `edge-N` the 40 % wave takes, the first three it leaves.
fn names() -> Vec<String> {
    let pick = |taken: bool, count: usize| {
        (0..1000)
            .map(|n| format!("edge-{n}"))
            .filter(move |n| (bucket(n) < BUCKETS * 2 / 5) == taken)
            .take(count)
    };
    std::iter::once("canary-1".to_owned())
        .chain(pick(true, 2))
        .chain(pick(false, 3))
        .collect()
}

/// The clusters of wave `wave` (0-based), by index.
fn in_wave(wave: usize) -> impl Iterator<Item = usize> {
    (0..WAVES.len()).filter(move |&index| WAVES[index] == wave)
}

struct Fleet {
    publisher: Publisher,
    tree: FleetTree,
    server: SourceServer,
    clusters: Vec<Cluster>,
}

impl Fleet {
    fn release(&self, version: u32, trouble: bool) -> anyhow::Result<Timestamp> {
        self.tree.write("fleet.yaml", &fleet_yaml(true, trouble))?;
        self.tree.write("web/config.yaml", &web(version))?;
        // Release 5 alone has one more object: a rollback from it must prune it.
        if version == 5 {
            self.tree.write("web/extra.yaml", EXTRA)?;
        } else {
            let _ = self.tree.remove("web/extra.yaml");
        }
        if trouble {
            self.tree.write("trouble/objects.yaml", TROUBLE)?;
        } else {
            let _ = self.tree.remove("trouble/objects.yaml");
        }
        Ok(self.publisher.publish(&self.tree, "stable")?.issued_at)
    }

    async fn version(&self, index: usize) -> Option<String> {
        let configs = Api::<ConfigMap>::namespaced(self.clusters[index].kube.client(), "web");
        configs
            .get("release")
            .await
            .ok()
            .and_then(|c| c.data)
            .and_then(|mut d| d.remove("version"))
    }

    async fn versions(&self) -> Vec<Option<String>> {
        let mut out = Vec::new();
        for index in 0..self.clusters.len() {
            out.push(self.version(index).await);
        }
        out
    }

    /// True when every cluster of the later waves (2 and 3) still carries `version`.
    async fn later_waves_at(&self, version: &str) -> bool {
        let versions = self.versions().await;
        (1..WAVES.len()).all(|index| versions[index].as_deref() == Some(version))
    }

    /// Whether the object only release 5 has is on cluster `index`.
    async fn has_extra(&self, index: usize) -> anyhow::Result<bool> {
        let configs = Api::<ConfigMap>::namespaced(self.clusters[index].kube.client(), "web");
        Ok(configs.get_opt("extra").await?.is_some())
    }

    /// Waits until every cluster carries `version`.
    async fn wait_all(&self, version: u32) -> anyhow::Result<()> {
        let want = Some(version.to_string());
        wait_for(
            &format!("every cluster at version {version}"),
            WAIT,
            || async {
                Ok(self
                    .versions()
                    .await
                    .iter()
                    .all(|v| *v == want)
                    .then_some(()))
            },
        )
        .await
        .with_context(|| self.logs())
    }

    fn logs(&self) -> String {
        self.clusters
            .iter()
            .map(|c| {
                format!(
                    "agent log of {}:\n{}\n",
                    c.name(),
                    windvane_tests::process::tail(&c.agent_log(), 25)
                )
            })
            .collect()
    }

    async fn rollout(&self) -> anyhow::Result<Value> {
        self.server.api("/api/v1/rollouts/stable").await
    }

    async fn pending_message(&self, index: usize) -> String {
        let Ok(agent) = self.clusters[index].agent() else {
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

    fn windvane(&self, args: &[&str]) -> anyhow::Result<std::process::Output> {
        Ok(Command::new(binary("windvane")?).args(args).output()?)
    }

    fn sign_args(&self, key: &std::path::Path) -> Vec<String> {
        vec![
            "--root".into(),
            self.publisher.store().display().to_string(),
            "--channel".into(),
            "stable".into(),
            "--key".into(),
            key.display().to_string(),
        ]
    }
}

fn seconds_since(issued: Timestamp) -> f64 {
    Timestamp::now().duration_since(issued).as_secs_f64()
}

async fn start() -> anyhow::Result<Fleet> {
    let publisher = Publisher::new(91)?;
    let tree = FleetTree::new()?;
    tree.write("fleet.yaml", &fleet_yaml(false, false))?;
    tree.write("web/config.yaml", &web(1))?;
    publisher.publish(&tree, "stable")?;
    let server = SourceServer::start(&publisher.store(), &["--unknown-after", "5s"]).await?;
    let mut clusters = Vec::new();
    for (index, name) in names().iter().enumerate() {
        let mut options = AgentOptions::new(&server.url, &publisher.public_key_path(), name)
            .reporting_to(&server.url, &server.token_file, "1s");
        if index == 0 {
            options.labels = vec!["tier=canary".to_owned()];
        }
        clusters.push(Cluster::start(options).await?);
    }
    let fleet = Fleet {
        publisher,
        tree,
        server,
        clusters,
    };
    fleet.wait_all(1).await?;
    Ok(fleet)
}

/// Release 2 goes wave by wave; returns nothing, asserts the order.
async fn waves_in_order(fleet: &Fleet) -> anyhow::Result<()> {
    let issued = fleet.release(2, false)?;
    let want = Some("2".to_owned());
    let mut changed: Vec<Option<f64>> = vec![None; WAVES.len()];
    let mut pending_seen = false;
    let mut status_incomplete = false;
    let deadline = std::time::Instant::now() + WAIT;
    while changed.iter().any(Option::is_none) {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "release 2 did not reach every cluster: {changed:?}\n{}",
            fleet.logs()
        );
        for (index, version) in fleet.versions().await.into_iter().enumerate() {
            if changed[index].is_none() && version == want {
                changed[index] = Some(seconds_since(issued));
            }
        }
        if !pending_seen && changed[1].is_none() {
            pending_seen = fleet
                .pending_message(1)
                .await
                .starts_with("Pending (wave 2");
        }
        if !status_incomplete {
            let out = fleet.windvane(&[
                "rollout",
                "status",
                "--server",
                &fleet.server.url,
                "--channel",
                "stable",
            ])?;
            status_incomplete = out.status.code() == Some(1);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("release 2 reached the clusters after (s): {changed:?}");
    let at = |wave: usize| -> Vec<f64> {
        in_wave(wave)
            .map(|index| changed[index].unwrap_or_default())
            .collect()
    };
    let (first, second, third) = (at(0), at(1), at(2));
    let latest = |times: &[f64]| times.iter().copied().fold(f64::MIN, f64::max);
    let earliest = |times: &[f64]| times.iter().copied().fold(f64::MAX, f64::min);
    let soak = SOAK_SECONDS as f64;
    assert!(
        latest(&first) < soak,
        "the canary takes it at once: {first:?}"
    );
    assert!(
        earliest(&second) >= soak,
        "wave 2 not before its soak: {second:?}"
    );
    assert!(
        earliest(&third) >= 2.0 * soak,
        "wave 3 not before both soaks: {third:?}"
    );
    assert!(
        earliest(&second) > latest(&first) && earliest(&third) > latest(&second),
        "no cluster moves before every cluster of the earlier waves has: {changed:?}"
    );
    assert!(
        pending_seen,
        "the wave-2 agent reported Pending (wave 2, …)"
    );
    assert!(
        status_incomplete,
        "rollout status exited 1 while the rollout ran"
    );
    wait_for("rollout status complete", WAIT, || async {
        let out = fleet.windvane(&[
            "rollout",
            "status",
            "--server",
            &fleet.server.url,
            "--channel",
            "stable",
        ])?;
        Ok((out.status.code() == Some(0)).then_some(()))
    })
    .await?;
    Ok(())
}

/// Release 3 makes the canary Degraded: wave 2 stays, and the server and the agent say why.
async fn degraded_canary_holds(fleet: &Fleet) -> anyhow::Result<()> {
    let issued = fleet.release(3, true)?;
    let view = wait_for(
        "the rollout view holds wave 2 on the Degraded canary",
        WAIT,
        || async {
            let view = fleet.rollout().await?;
            let held = view["waves"][1]["held"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            Ok(
                (view["serial"] == 3 && held.contains("canary-1 (canary) is Degraded"))
                    .then_some(view),
            )
        },
    )
    .await
    .with_context(|| fleet.logs())?;
    assert_eq!(view["waves"][0]["failed"], 1, "{view}");
    wait_for("well past wave 2's time", WAIT, || async {
        Ok((seconds_since(issued) > (SOAK_SECONDS * 2 + 5) as f64).then_some(()))
    })
    .await?;
    assert!(
        fleet.later_waves_at("2").await,
        "waves 2 and 3 held: {:?}",
        fleet.versions().await
    );
    let message = fleet.pending_message(1).await;
    assert!(
        message.contains("Degraded"),
        "the waiting agent says why: {message}"
    );
    let (_, page) = fleet.server.get("/rollouts/stable").await?;
    assert!(
        page.contains("canary-1 (canary) is Degraded"),
        "the page says why"
    );
    let (_, fleet_page) = fleet.server.get("/").await?;
    assert!(
        fleet_page.contains("href=\"/rollouts/stable\""),
        "the fleet page links the rollout"
    );
    let (_, metrics) = fleet.server.get("/metrics").await?;
    for sample in [
        "windvane_rollout_serial{channel=\"stable\"} 3",
        "windvane_rollout_complete{channel=\"stable\"} 0",
        "windvane_rollout_clusters{channel=\"stable\",wave=\"1\",phase=\"failed\"} 1",
    ] {
        assert!(metrics.contains(sample), "server metrics have {sample}");
    }
    let agent = fleet.clusters[1].agent()?.metrics().await?;
    assert!(
        agent.contains("windvane_rollout_waiting_wave 2"),
        "agent metrics"
    );
    Ok(())
}

/// Release 4 (the canary fixed) with the server stopped before wave 2's time: nobody advances; then back.
async fn server_outage_holds(fleet: &mut Fleet) -> anyhow::Result<()> {
    let issued = fleet.release(4, false)?;
    wait_for("the wave-2 agent waits on serial 4", WAIT, || async {
        let status = fleet.clusters[1].agent()?.status().await?;
        Ok((status["source"]["pending"]["serial"] == 4).then_some(()))
    })
    .await?;
    // Killed, not stopped: a clean stop may take its grace period, serving meanwhile.
    let stopped = seconds_since(issued);
    fleet.server.process.kill();
    anyhow::ensure!(
        stopped < SOAK_SECONDS as f64,
        "the server stopped only {stopped}s after the release: the test cannot show the gate held\n{}",
        fleet.logs()
    );
    wait_for("past both waves' times", WAIT, || async {
        Ok((seconds_since(issued) > (SOAK_SECONDS * 2 + 8) as f64).then_some(()))
    })
    .await?;
    assert!(
        fleet.later_waves_at("2").await,
        "waves 2 and 3 did not advance without the server: {:?}",
        fleet.versions().await
    );
    let message = fleet.pending_message(1).await;
    assert!(
        message.contains("cannot read the rollout status"),
        "says so: {message}"
    );
    fleet.server.restart().await?;
    fleet.wait_all(4).await
}

/// Release 5, halted after the canary took it: the later waves stay past their time until resumed.
async fn halt_and_resume(fleet: &Fleet) -> anyhow::Result<()> {
    let key = fleet.publisher.key_path()?;
    let issued = fleet.release(5, false)?;
    wait_for("the canary at version 5", WAIT, || async {
        Ok((fleet.version(0).await.as_deref() == Some("5")).then_some(()))
    })
    .await?;
    let mut args = vec!["rollout".to_owned(), "halt".to_owned()];
    args.extend(fleet.sign_args(&key));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = fleet.windvane(&args)?;
    assert!(
        out.status.success(),
        "halt: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let halted_at = seconds_since(issued);
    anyhow::ensure!(
        halted_at < SOAK_SECONDS as f64,
        "halted only after {halted_at}s"
    );
    wait_for("the wave-2 agent reports the halt", WAIT, || async {
        Ok(fleet
            .pending_message(1)
            .await
            .starts_with("Halted")
            .then_some(()))
    })
    .await
    .with_context(|| fleet.logs())?;
    wait_for("past both waves' times", WAIT, || async {
        Ok((seconds_since(issued) > (SOAK_SECONDS * 2 + 5) as f64).then_some(()))
    })
    .await?;
    assert!(
        fleet.later_waves_at("4").await,
        "waves 2 and 3 stay where they are: {:?}",
        fleet.versions().await
    );
    assert_eq!(fleet.rollout().await?["halted"], true);
    let mut args = vec!["rollout".to_owned(), "resume".to_owned()];
    args.extend(fleet.sign_args(&key));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = fleet.windvane(&args)?;
    assert!(
        out.status.success(),
        "resume: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    fleet.wait_all(5).await?;
    for index in 0..WAVES.len() {
        assert!(
            fleet.has_extra(index).await?,
            "release 5's object on cluster {index}"
        );
    }
    Ok(())
}

/// `windvane rollback` publishes release 4's bundle again as serial 6; every cluster returns to it.
async fn rollback(fleet: &Fleet) -> anyhow::Result<()> {
    let key = fleet.publisher.key_path()?;
    let mut args = vec!["rollback".to_owned()];
    args.extend(fleet.sign_args(&key));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = fleet.windvane(&args)?;
    assert!(
        out.status.success(),
        "rollback: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("serial 6"), "{said}");
    fleet.wait_all(4).await?;
    for index in 0..WAVES.len() {
        wait_for(
            "release 5's object pruned by the rollback",
            WAIT,
            || async { Ok((!fleet.has_extra(index).await?).then_some(())) },
        )
        .await?;
    }
    let view = fleet.rollout().await?;
    assert_eq!(view["serial"], 6);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_roll_out_wave_by_wave_gated_halted_and_rolled_back() -> anyhow::Result<()> {
    let mut fleet = start().await?;
    waves_in_order(&fleet).await?;
    degraded_canary_holds(&fleet).await?;
    server_outage_holds(&mut fleet).await?;
    halt_and_resume(&fleet).await?;
    rollback(&fleet).await?;
    for cluster in &mut fleet.clusters {
        cluster.stop().await?;
    }
    Ok(())
}
