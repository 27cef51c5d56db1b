//! Policy the agent enforces on its own, against a real control plane (localkube) and the real agent binary:
//! the operator's namespace allowlist judged on the namespace an object lands in (a namespaced object naming
//! none lands in `default`), by `run` and `diff` alike, and holding back cluster-scoped objects (a
//! ClusterRoleBinding) unless the kinds list names their kind; prunes judged per app (a failing object of one app
//! never holds another app's prunes back, and its own app's wait until that app applies completely);
//! `driftGracePeriod` (drift left alone during the grace period and reverted after it, and not written at all
//! when undone meanwhile); and `windvane.io/prune: disabled` set on the live object keeping it when it leaves
//! the release.

mod fault_support;

use std::process::Command;
use std::time::{Duration, Instant};

use fault_support::{SYNC, config_map, data, holds_for, inventory, wait_config_map};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use windvane_tests::fleet::{Agent, AgentOptions, FleetTree, Publisher, object_state};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::process::binary;
use windvane_tests::store_server::StoreServer;

/// `windvane-agent diff` with the agent's flags: exit code and stdout.
fn diff(kube: &LocalKube, options: &AgentOptions) -> anyhow::Result<(i32, String)> {
    let output = Command::new(binary("windvane-agent")?)
        .args([
            "diff",
            "--source",
            &options.source,
            "--channel",
            &options.channel,
        ])
        .args(["--fleet", &options.fleet, "--cluster", &options.cluster])
        .arg("--trusted-key")
        .arg(&options.trusted_keys[0])
        .arg("--kubeconfig")
        .arg(kube.kubeconfig_path())
        .args(&options.extra)
        .output()?;
    Ok((
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout)? + &String::from_utf8(output.stderr)?,
    ))
}

/// The message the agent reports for an object (`kind ns/name`).
fn object_message(status: &Value, object: &str) -> String {
    status["objects"]
        .as_array()
        .and_then(|o| o.iter().find(|x| x["object"] == object))
        .and_then(|x| x["message"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// The message the agent reports for an app, if any.
fn app_message<'a>(status: &'a Value, app: &str) -> Option<&'a str> {
    status["apps"]
        .as_array()?
        .iter()
        .find(|a| a["name"] == app)?["message"]
        .as_str()
}

fn config_maps(kube: &LocalKube, namespace: &str) -> Api<ConfigMap> {
    Api::namespaced(kube.client(), namespace)
}

/// A merge patch of a ConfigMap's data by another field manager, as `kubectl edit` would make it.
async fn edit(kube: &LocalKube, name: &str, patch: Value) -> anyhow::Result<ConfigMap> {
    let params = PatchParams {
        field_manager: Some("kubectl-edit".to_owned()),
        ..PatchParams::default()
    };
    Ok(config_maps(kube, "default")
        .patch(name, &params, &Patch::Merge(patch))
        .await?)
}

struct Setup {
    kube: LocalKube,
    publisher: Publisher,
    tree: FleetTree,
    _server: StoreServer,
    options: AgentOptions,
}

/// A localkube, and a release of `fleet` with the given files, served to an agent's options.
async fn setup(seed: u8, fleet: &str, files: &[(&str, &str)]) -> anyhow::Result<Setup> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(seed)?;
    let tree = FleetTree::new()?;
    tree.write("fleet.yaml", fleet)?;
    for (path, contents) in files {
        tree.write(path, contents)?;
    }
    publisher.publish(&tree, "stable")?;
    let server = StoreServer::start(publisher.store()).await?;
    let options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1");
    Ok(Setup {
        kube,
        publisher,
        tree,
        _server: server,
        options,
    })
}

fn config_map_yaml(name: &str, namespace: Option<&str>) -> String {
    let namespace = namespace.map_or_else(String::new, |ns| format!(", namespace: {ns}"));
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}{namespace}}}\ndata: {{k: v}}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_namespace_allowlist_judges_the_namespace_an_object_lands_in() -> anyhow::Result<()> {
    let objects = [
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a}\n".to_owned(),
        config_map_yaml("placed", Some("team-a")),
        // Names no namespace: it would land in default, which the operator does not allow.
        config_map_yaml("unplaced", None),
        config_map_yaml("elsewhere", Some("team-b")),
    ]
    .join("---\n");
    let fleet = "fleet: acme\napps:\n  - name: team\n    path: team\n    policy: {prune: true}\n";
    let mut s = setup(41, fleet, &[("team/objects.yaml", &objects)]).await?;
    s.options.extra = vec!["--allow-namespaces".into(), "team-a".into()];
    let agent = Agent::start(&s.kube, &s.options).await?;
    let status = agent
        .wait_status(
            "the allowed objects applied, the others refused",
            SYNC,
            |st| {
                object_state(st, "ConfigMap team-a/placed") == Some("Synced")
                    && object_state(st, "ConfigMap default/unplaced") == Some("Failed")
                    && object_state(st, "ConfigMap team-b/elsewhere") == Some("Failed")
            },
        )
        .await?;
    let message = object_message(&status, "ConfigMap default/unplaced");
    assert!(
        message.contains("ConfigMap default/unplaced")
            && message.contains("not in the operator's allowed namespaces (team-a)"),
        "the refusal names the object and the allowlist: {message}"
    );
    assert!(
        config_map(&s.kube, "default", "unplaced").await?.is_none(),
        "nothing lands in default"
    );
    let inventory = inventory(&s.kube).await?;
    assert!(
        inventory.contains("ConfigMap team-a/placed")
            && !inventory.iter().any(|o| o.contains("unplaced")),
        "{inventory:?}"
    );

    // `diff` places objects as the agent does: the same refusal, and the applied objects unchanged.
    let (code, out) = diff(&s.kube, &s.options)?;
    assert_eq!(code, 2, "objects that cannot be compared exit 2: {out}");
    assert!(
        out.contains(
            "! ConfigMap default/unplaced: refused: namespace default is not in the operator's allowed namespaces (team-a)"
        ),
        "{out}"
    );
    assert!(
        out.contains("2 unchanged, 0 to change, 0 to create, 2 failed"),
        "{out}"
    );
    Ok(())
}

/// A ClusterRoleBinding granting `cluster-admin` to a ServiceAccount of `team-a`: what a release confined to
/// one namespace must not be able to create.
const ESCALATION: &str = "\
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: team-a-is-admin}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects: [{kind: ServiceAccount, name: deployer, namespace: team-a}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: team-a-reader}
rules: [{apiGroups: [\"\"], resources: [pods], verbs: [get]}]
";

async fn cluster_role_binding_exists(kube: &LocalKube, name: &str) -> anyhow::Result<bool> {
    let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(kube.client());
    Ok(bindings.get_opt(name).await?.is_some())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narrowed_namespaces_refuse_cluster_scoped_kinds_the_kinds_do_not_name()
-> anyhow::Result<()> {
    let objects = [
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a}\n".to_owned(),
        config_map_yaml("settings", Some("team-a")),
        ESCALATION.to_owned(),
    ]
    .join("---\n");
    let fleet = "fleet: acme\napps:\n  - name: team\n    path: team\n";
    let mut s = setup(43, fleet, &[("team/objects.yaml", &objects)]).await?;

    // Only team-a, every kind (`*`, the default): the namespace and its ConfigMap apply, the cluster-wide
    // binding and role do not, and say which flag would allow them.
    s.options.extra = vec!["--allow-namespaces".into(), "team-a".into()];
    let agent = Agent::start(&s.kube, &s.options).await?;
    let status = agent
        .wait_status(
            "team-a applied, the cluster-scoped objects refused",
            SYNC,
            |st| {
                object_state(st, "ConfigMap team-a/settings") == Some("Synced")
                    && object_state(st, "Namespace team-a") == Some("Synced")
                    && object_state(st, "ClusterRoleBinding team-a-is-admin") == Some("Failed")
                    && object_state(st, "ClusterRole team-a-reader") == Some("Failed")
            },
        )
        .await?;
    let message = object_message(&status, "ClusterRoleBinding team-a-is-admin");
    assert!(
        message.contains(
            "rbac.authorization.k8s.io/ClusterRoleBinding is cluster-scoped and the operator allows only namespaces \
             team-a: it applies only when --allow-kinds (allowKinds) names it"
        ),
        "{message}"
    );
    assert!(!cluster_role_binding_exists(&s.kube, "team-a-is-admin").await?);
    let log = agent.process.log();
    assert!(
        log.contains("allowlist: only namespaces team-a are allowed: cluster-scoped objects"),
        "said at start-up:\n{log}"
    );
    drop(agent);

    // The operator names the binding's kind: it applies; the role, not named, still does not.
    s.options.extra.extend([
        "--allow-kinds".into(),
        "*,rbac.authorization.k8s.io/ClusterRoleBinding".into(),
    ]);
    let agent = Agent::start(&s.kube, &s.options).await?;
    agent
        .wait_status("the named kind applied", SYNC, |st| {
            object_state(st, "ClusterRoleBinding team-a-is-admin") == Some("Synced")
                && object_state(st, "ClusterRole team-a-reader") == Some("Failed")
                && object_state(st, "ConfigMap team-a/settings") == Some("Synced")
        })
        .await?;
    assert!(cluster_role_binding_exists(&s.kube, "team-a-is-admin").await?);
    Ok(())
}

const TWO_APPS: &str = "\
fleet: acme
apps:
  - name: alpha
    path: alpha
    policy: {prune: true}
  - name: beta
    path: beta
    policy: {prune: true}
";

/// A Service the API server refuses (port out of range).
const BROKEN: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: broken, namespace: default}\nspec: {ports: [{port: 99999}]}\n";

fn objects(names: &[&str]) -> String {
    names
        .iter()
        .map(|name| config_map_yaml(name, Some("default")))
        .collect::<Vec<_>>()
        .join("---\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_object_postpones_only_its_own_apps_prunes() -> anyhow::Result<()> {
    let s = setup(
        42,
        TWO_APPS,
        &[
            ("alpha/objects.yaml", &objects(&["a-keep", "a-gone"])),
            ("beta/objects.yaml", &objects(&["b-keep", "b-gone"])),
        ],
    )
    .await?;
    let agent = Agent::start(&s.kube, &s.options).await?;
    agent
        .wait_status("release 1 synced", SYNC, |st| {
            st["state"] == "Synced" && st["counts"]["Synced"] == 4
        })
        .await?;

    // Release 2 removes one object of each app, and alpha gains an object the API server refuses.
    s.tree.write(
        "alpha/objects.yaml",
        &format!("{}---\n{BROKEN}", objects(&["a-keep"])),
    )?;
    s.tree.write("beta/objects.yaml", &objects(&["b-keep"]))?;
    s.publisher.publish(&s.tree, "stable")?;
    wait_config_map(&s.kube, "default", "b-gone", |cm| cm.is_none()).await?;
    let status = agent
        .wait_status("alpha's prune reported postponed", SYNC, |st| {
            st["source"]["appliedSerial"] == 2 && app_message(st, "alpha").is_some()
        })
        .await?;
    assert_eq!(
        app_message(&status, "alpha"),
        Some("prune of app alpha postponed: 1 object failed to apply"),
        "{status}"
    );
    assert_eq!(app_message(&status, "beta"), None, "{status}");
    assert_eq!(
        status["lastError"], "prune of app alpha postponed: 1 object failed to apply",
        "{status}"
    );
    assert_eq!(
        object_state(&status, "Service default/broken"),
        Some("Failed")
    );
    // Decided in the same sync that pruned b-gone: a-gone is kept, and still Windvane's.
    assert!(config_map(&s.kube, "default", "a-gone").await?.is_some());
    let inventory_now = inventory(&s.kube).await?;
    assert!(
        inventory_now.contains("ConfigMap default/a-gone")
            && !inventory_now.contains("ConfigMap default/b-gone"),
        "{inventory_now:?}"
    );

    // Release 3 fixes alpha: it applies completely, and its prune goes ahead.
    s.tree.write("alpha/objects.yaml", &objects(&["a-keep"]))?;
    s.publisher.publish(&s.tree, "stable")?;
    wait_config_map(&s.kube, "default", "a-gone", |cm| cm.is_none()).await?;
    let status = agent
        .wait_status("release 3 synced", SYNC, |st| {
            st["source"]["appliedSerial"] == 3 && st["state"] == "Synced"
        })
        .await?;
    assert_eq!(app_message(&status, "alpha"), None, "{status}");
    assert!(status["lastError"].is_null(), "{status}");
    assert!(config_map(&s.kube, "default", "a-keep").await?.is_some());
    assert!(config_map(&s.kube, "default", "b-keep").await?.is_some());
    Ok(())
}

const SETTINGS: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: default}\ndata: {mode: strict}\n";

async fn mode(kube: &LocalKube) -> anyhow::Result<Option<String>> {
    let cm = config_map(kube, "default", "settings").await?;
    Ok(data(cm.as_ref(), "mode").map(str::to_owned))
}

/// The drift records of `settings`.
fn drift_actions(status: &Value) -> Vec<String> {
    status["drift"]
        .as_array()
        .map(|d| {
            d.iter()
                .filter(|r| r["name"] == "settings")
                .map(|r| r["action"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_waits_out_the_grace_period_and_drift_undone_meanwhile_is_not_written()
-> anyhow::Result<()> {
    let fleet =
        "fleet: acme\napps:\n  - name: app\n    path: app\n    policy: {driftGracePeriod: 3s}\n";
    let s = setup(43, fleet, &[("app/settings.yaml", SETTINGS)]).await?;
    let agent = Agent::start(&s.kube, &s.options).await?;
    agent
        .wait_status("synced", SYNC, |st| st["state"] == "Synced")
        .await?;
    const OBJECT: &str = "ConfigMap default/settings";

    // A drift: left alone through the grace period (still drifted at 1.5 s, reported OutOfSync) …
    let drifted_at = Instant::now();
    edit(&s.kube, "settings", json!({"data": {"mode": "loose"}})).await?;
    let status = agent
        .wait_status("drift reported", SYNC, |st| {
            object_state(st, OBJECT) == Some("OutOfSync")
        })
        .await?;
    assert!(
        object_message(&status, OBJECT).contains("reverting after the grace period"),
        "{status}"
    );
    let until = Duration::from_millis(1500).saturating_sub(drifted_at.elapsed());
    holds_for(until, async || {
        Ok(mode(&s.kube).await?.as_deref() == Some("loose"))
    })
    .await?;
    assert_eq!(mode(&s.kube).await?.as_deref(), Some("loose"));
    let status = agent.status().await?;
    assert_eq!(object_state(&status, OBJECT), Some("OutOfSync"), "{status}");
    // … and reverted after it.
    wait_for("drift reverted", SYNC, || async {
        Ok((mode(&s.kube).await?.as_deref() == Some("strict")).then_some(()))
    })
    .await?;
    let reverted_after = drifted_at.elapsed();
    assert!(
        reverted_after >= Duration::from_secs(3),
        "reverted {reverted_after:?} after the drift, before the 3 s grace period"
    );
    let status = agent
        .wait_status("synced again", SYNC, |st| {
            object_state(st, OBJECT) == Some("Synced")
        })
        .await?;
    assert_eq!(drift_actions(&status), ["Reverted"], "{status}");

    // A drift taken back by the same editor within the grace period: Windvane writes nothing.
    edit(&s.kube, "settings", json!({"data": {"mode": "loose"}})).await?;
    agent
        .wait_status("second drift reported", SYNC, |st| {
            object_state(st, OBJECT) == Some("OutOfSync")
        })
        .await?;
    let undone = edit(&s.kube, "settings", json!({"data": {"mode": "strict"}})).await?;
    let undone_version = undone.metadata.resource_version.clone();
    let windvane_fields = |cm: &ConfigMap| {
        cm.metadata
            .managed_fields
            .iter()
            .flatten()
            .find(|f| f.manager.as_deref() == Some("windvane"))
            .cloned()
    };
    let status = agent
        .wait_status(
            "the grace period ended with nothing to revert",
            SYNC,
            |st| object_state(st, OBJECT) == Some("Synced"),
        )
        .await?;
    let live = config_maps(&s.kube, "default").get("settings").await?;
    assert_eq!(
        live.metadata.resource_version, undone_version,
        "no write after the undo"
    );
    assert_eq!(windvane_fields(&live), windvane_fields(&undone));
    assert_eq!(drift_actions(&status), ["Reverted", "Reported"], "{status}");
    assert!(
        agent
            .process
            .log()
            .contains("drift undone within the grace period"),
        "{}",
        agent.process.log()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_annotated_prune_disabled_on_the_cluster_is_kept_when_it_leaves()
-> anyhow::Result<()> {
    let fleet = "fleet: acme\napps:\n  - name: app\n    path: app\n    policy: {prune: true}\n";
    let s = setup(
        44,
        fleet,
        &[("app/objects.yaml", &objects(&["stays", "keep-me", "goes"]))],
    )
    .await?;
    let agent = Agent::start(&s.kube, &s.options).await?;
    agent
        .wait_status("synced", SYNC, |st| {
            st["state"] == "Synced" && st["counts"]["Synced"] == 3
        })
        .await?;
    // An operator marks the live object (not the release): a field Windvane does not own, so no drift.
    let params = PatchParams {
        field_manager: Some("oncall-bob".to_owned()),
        ..PatchParams::default()
    };
    config_maps(&s.kube, "default")
        .patch(
            "keep-me",
            &params,
            &Patch::Merge(json!({"metadata": {"annotations": {"windvane.io/prune": "disabled"}}})),
        )
        .await?;

    // Both leave the release: the unmarked one is pruned, the marked one kept and reported as an orphan.
    s.tree.write("app/objects.yaml", &objects(&["stays"]))?;
    s.publisher.publish(&s.tree, "stable")?;
    wait_config_map(&s.kube, "default", "goes", |cm| cm.is_none()).await?;
    let status = agent
        .wait_status("the kept object reported as an orphan", SYNC, |st| {
            st["source"]["appliedSerial"] == 2
                && st["orphans"]
                    .as_array()
                    .is_some_and(|o| o.iter().any(|x| x == "ConfigMap default/keep-me"))
        })
        .await?;
    assert_eq!(
        status["state"], "Synced",
        "an orphan does not count: {status}"
    );
    assert!(config_map(&s.kube, "default", "keep-me").await?.is_some());
    assert!(
        inventory(&s.kube)
            .await?
            .contains("ConfigMap default/keep-me"),
        "still in the inventory, as an orphan"
    );
    // Orphans are never reconsidered: a later release does not delete it either.
    s.tree.write(
        "app/objects.yaml",
        &objects(&["stays"]).replace("k: v", "k: w"),
    )?;
    s.publisher.publish(&s.tree, "stable")?;
    wait_config_map(&s.kube, "default", "stays", |cm| data(cm, "k") == Some("w")).await?;
    agent
        .wait_status("release 3 applied", SYNC, |st| {
            st["source"]["appliedSerial"] == 3
        })
        .await?;
    assert!(config_map(&s.kube, "default", "keep-me").await?.is_some());
    Ok(())
}
