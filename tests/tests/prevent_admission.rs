//! Prevention against a real control plane, with real users: the agent runs as its own identity
//! (`windvane-agent`, impersonated through its kubeconfig), alice and bob are users with the `edit` role
//! (impersonated by the bundled kubectl's `--as`). With `policy.prevent` on, alice's scale, edit and delete
//! of a managed Deployment are refused with the release's message, while a manager of an ignored field
//! still scales, her change of a field Windvane does not own goes through, the agent still rolls out a new
//! release, and turning prevent off removes the policy. Break-glass takes two people: alice alone, or
//! approving herself, is refused; with a ticket and bob's approval her change goes through, is Held naming
//! both and the ticket, and is reverted (its annotations cleared) when its short hold ends; an approval left
//! standing is spent when a release writes the object; a change that a release then declares is taken in:
//! closed as TakenIn, its annotations cleared, and not reverted when its hold ends; one a release writes
//! other values over is closed as Reverted. Deleting the agent's Namespace (uninstalling) removes the policy.
//!
//! Prevention fails closed: a deleted policy or a binding switched to Audit is restored within seconds; an
//! owner reference added to a guarded object (for the garbage collector to delete it) is refused; objects
//! that wait for a failed dependency stay guarded. A break-glass approval is bound to its requester: another
//! member cannot take it over by rewriting `break-glass-by`, and names written while the object was not
//! guarded are removed as soon as it is.

use anyhow::Context as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};
use windvane_tests::fleet::{
    AGENT_NAMESPACE, Agent, AgentOptions, FleetTree, Publisher, object_state,
};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::store_server::StoreServer;

const WAIT: Duration = Duration::from_secs(60);
const GROUP: &str = "sre:break-glass";
const POLICY: &str = "windvane-prevent-acme";

fn fleet(prevent: bool) -> String {
    format!(
        "fleet: acme\napps:\n  - name: web\n    path: web\n    policy:\n      prevent: {prevent}\n      \
         ignoreDifferences:\n        - {{group: apps, kind: Deployment, name: scaled, jsonPointers: [/spec/replicas]}}\n"
    )
}

fn objects(image: &str) -> String {
    format!(
        "\
apiVersion: v1
kind: Namespace
metadata: {{name: shop}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: shop}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      containers: [{{name: web, image: {image}}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: scaled, namespace: shop}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: scaled}}}}
  template:
    metadata: {{labels: {{app: scaled}}}}
    spec:
      containers: [{{name: scaled, image: registry.example.com/scaled:1.0}}]
"
    )
}

struct Setup {
    kube: LocalKube,
    publisher: Publisher,
    tree: FleetTree,
    _server: StoreServer,
    agent: Agent,
    serial: u64,
}

async fn setup(seed: u8) -> anyhow::Result<Setup> {
    let kube = LocalKube::start().await?;
    grant_edit(&kube, &["alice", "bob", "carol", "hpa-like"]).await?;
    let publisher = Publisher::new(seed)?;
    let tree = FleetTree::new()?;
    tree.write("fleet.yaml", &fleet(true))?;
    tree.write("web/objects.yaml", &objects("registry.example.com/web:1.0"))?;
    let serial = publisher.publish(&tree, "stable")?.serial;
    let server = StoreServer::start(publisher.store()).await?;
    let mut options = AgentOptions::new(&server.url(), &publisher.public_key_path(), "c1");
    options.kubeconfig = Some(agent_kubeconfig(&kube)?);
    options
        .extra
        .extend(["--break-glass-group".to_owned(), GROUP.to_owned()]);
    let agent = Agent::start(&kube, &options).await?;
    agent
        .wait_status("synced", WAIT, |st| st["state"] == "Synced")
        .await?;
    Ok(Setup {
        kube,
        publisher,
        tree,
        _server: server,
        agent,
        serial,
    })
}

/// The admin kubeconfig, acting as user `windvane-agent` (still in system:masters, for its rights): the
/// agent's identity differs from the admin's, as it does in a real cluster.
fn agent_kubeconfig(kube: &LocalKube) -> anyhow::Result<PathBuf> {
    let admin = std::fs::read_to_string(kube.kubeconfig_path())?;
    anyhow::ensure!(
        admin.contains("\n  user:\n"),
        "unexpected kubeconfig layout"
    );
    let agent = admin.replacen(
        "\n  user:\n",
        "\n  user:\n    as: windvane-agent\n    as-groups: [system:masters]\n",
        1,
    );
    let path = kube.data_dir().join("agent.kubeconfig");
    std::fs::write(&path, agent)?;
    Ok(path)
}

/// Binds the built-in `edit` ClusterRole to `users`.
async fn grant_edit(kube: &LocalKube, users: &[&str]) -> anyhow::Result<()> {
    let subjects: Vec<Value> = users
        .iter()
        .map(|u| json!({"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": u}))
        .collect();
    let binding = serde_json::from_value(json!({
        "metadata": {"name": "people-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": subjects,
    }))?;
    Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(kube.client())
        .create(&PostParams::default(), &binding)
        .await?;
    Ok(())
}

/// What one kubectl run said: success, and stdout with stderr.
struct Run {
    ok: bool,
    output: String,
}

/// The bundled kubectl acting as `user` in `groups` (empty `user`: the admin), in namespace shop.
async fn kubectl(
    kube: &LocalKube,
    user: &str,
    groups: &[&str],
    args: &[&str],
    env: &[(&str, &Path)],
) -> anyhow::Result<Run> {
    let mut all: Vec<String> = vec!["-n".into(), "shop".into()];
    if !user.is_empty() {
        all.extend(["--as".into(), user.into()]);
    }
    for group in groups {
        all.extend(["--as-group".into(), (*group).into()]);
    }
    all.extend(args.iter().map(|a| (*a).to_owned()));
    let mut command = kube.kubectl(all);
    for (name, value) in env {
        command.env(name, value);
    }
    let output = tokio::task::spawn_blocking(move || command.output()).await??;
    Ok(Run {
        ok: output.status.success(),
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    })
}

fn denial(serial: u64) -> String {
    format!(
        "managed by Windvane release {serial} of fleet acme; change it in the release, or use break-glass"
    )
}

async fn policy_objects(kube: &LocalKube) -> anyhow::Result<Vec<Option<DynamicObject>>> {
    let mut found = Vec::new();
    for kind in [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        found.push(kube.admission_api(kind).get_opt(POLICY).await?);
    }
    Ok(found)
}

/// Waits until `user` in `groups` scaling `web` is refused with `message`: the policy is in force.
async fn wait_refused(
    kube: &LocalKube,
    user: &str,
    groups: &[&str],
    message: &str,
) -> anyhow::Result<()> {
    let last = std::sync::Mutex::new(String::new());
    let refused = wait_for("the policy refusing a scale", WAIT, || async {
        let run = kubectl(
            kube,
            user,
            groups,
            // A server-side dry run: admission judges it, nothing changes. A real scale let through before
            // the policy is in force would leave replicas at 7, where every later scale to 7 is a no-op
            // that no policy refuses.
            &[
                "scale",
                "deployment/web",
                "--replicas=7",
                "--dry-run=server",
            ],
            &[],
        )
        .await?;
        let done = !run.ok && run.output.contains(message);
        *last.lock().expect("lock") = run.output;
        Ok(done.then_some(()))
    })
    .await;
    refused.with_context(|| {
        format!(
            "the last answer to {user}'s scale: {}",
            last.lock().expect("lock")
        )
    })
}

async fn image(kube: &LocalKube) -> anyhow::Result<Option<String>> {
    let deployments: Api<Deployment> = Api::namespaced(kube.client(), "shop");
    Ok(deployments
        .get("web")
        .await?
        .spec
        .template
        .spec
        .and_then(|s| s.containers.first().and_then(|c| c.image.clone())))
}

async fn wait_image(kube: &LocalKube, want: &str) -> anyhow::Result<()> {
    wait_for(&format!("image {want}"), WAIT, || async {
        Ok((image(kube).await?.as_deref() == Some(want)).then_some(()))
    })
    .await
}

/// An editor for `kubectl edit` that logs every file it is given (kubectl reopens it with the API server's
/// refusal at the top) and changes the image.
fn editor(dir: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    let log = dir.join("editor.log");
    let script = dir.join("editor.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncat \"$1\" >> '{}'\nsed -i 's#registry.example.com/web:1.0#registry.example.com/web:6.6#' \"$1\"\n",
            log.display()
        ),
    )?;
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&script)
        .status()?;
    Ok((script, log))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alice_is_refused_while_the_release_and_ignored_fields_go_through() -> anyhow::Result<()> {
    let s = setup(31).await?;
    let kube = &s.kube;
    let message = denial(s.serial);

    // The agent keeps the policy and its binding, owned by its namespace (uninstalling removes them).
    let found = wait_for("the policy and binding", WAIT, || async {
        let found = policy_objects(kube).await?;
        Ok(found.iter().all(Option::is_some).then_some(found))
    })
    .await?;
    let namespace: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(kube.client());
    let owner_uid = namespace.get(AGENT_NAMESPACE).await?.metadata.uid;
    for object in found.iter().flatten() {
        let owners = object.metadata.owner_references.clone().unwrap_or_default();
        assert_eq!(owners.len(), 1, "{object:?}");
        assert_eq!(Some(owners[0].uid.clone()), owner_uid);
    }

    // alice: kubectl scale, edit and delete are refused with the release's message.
    wait_refused(kube, "alice", &[], &message).await?;
    let (script, log) = editor(kube.data_dir())?;
    let edit = kubectl(
        kube,
        "alice",
        &[],
        &["edit", "deployment/web"],
        &[("KUBE_EDITOR", &script)],
    )
    .await?;
    assert!(!edit.ok, "{}", edit.output);
    let edited = std::fs::read_to_string(&log)?;
    assert!(edited.contains(&message), "{edited}");
    let delete = kubectl(
        kube,
        "alice",
        &[],
        &["delete", "deployment/web", "--wait=false"],
        &[],
    )
    .await?;
    assert!(
        !delete.ok && delete.output.contains(&message),
        "{}",
        delete.output
    );
    // The admin is not the agent either.
    let admin = kubectl(
        kube,
        "",
        &[],
        &["set", "image", "deployment/web", "web=evil:1"],
        &[],
    )
    .await?;
    assert!(
        !admin.ok && admin.output.contains(&message),
        "{}",
        admin.output
    );
    assert_eq!(
        image(kube).await?.as_deref(),
        Some("registry.example.com/web:1.0")
    );

    // A field Windvane does not own stays hers; the manager of an ignored field scales through /scale.
    let label = kubectl(
        kube,
        "alice",
        &[],
        &["label", "deployment/web", "team=checkout"],
        &[],
    )
    .await?;
    assert!(label.ok, "{}", label.output);
    let scale = kubectl(
        kube,
        "hpa-like",
        &[],
        &["scale", "deployment/scaled", "--replicas=4"],
        &[],
    )
    .await?;
    assert!(scale.ok, "{}", scale.output);

    // A new release still rolls out (the agent's own writes pass), and the policy names it.
    s.tree
        .write("web/objects.yaml", &objects("registry.example.com/web:2.0"))?;
    let serial = s.publisher.publish(&s.tree, "stable")?.serial;
    wait_image(kube, "registry.example.com/web:2.0").await?;
    wait_refused(kube, "alice", &[], &denial(serial)).await?;
    let deployments: Api<Deployment> = Api::namespaced(kube.client(), "shop");
    let scaled = deployments.get("scaled").await?;
    assert_eq!(scaled.spec.replicas, Some(4), "the ignored field stayed");

    // Prevent off: the policy goes, and alice's scale goes through (then drift heals it).
    s.tree.write("fleet.yaml", &fleet(false))?;
    s.publisher.publish(&s.tree, "stable")?;
    wait_for("the policy removed", WAIT, || async {
        let found = policy_objects(kube).await?;
        Ok(found.iter().all(Option::is_none).then_some(()))
    })
    .await?;
    wait_for("alice's scale admitted", WAIT, || async {
        let run = kubectl(
            kube,
            "alice",
            &[],
            &["scale", "deployment/web", "--replicas=5"],
            &[],
        )
        .await?;
        Ok(run.ok.then_some(()))
    })
    .await?;
    drop(s.agent);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_glass_needs_a_ticket_and_a_second_person_and_is_held_then_reverted()
-> anyhow::Result<()> {
    let s = setup(32).await?;
    let kube = &s.kube;
    let group = [GROUP];
    let patch = |image: &str| {
        [
            "set".to_owned(),
            "image".to_owned(),
            "deployment/web".to_owned(),
            format!("web={image}"),
        ]
    };
    let run = async |user: &str, args: &[String]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        kubectl(kube, user, &group, &args, &[]).await
    };
    let annotate = |pairs: &[&str]| {
        let mut args = vec![
            "annotate".to_owned(),
            "--overwrite".to_owned(),
            "deployment/web".to_owned(),
        ];
        args.extend(pairs.iter().map(|p| (*p).to_owned()));
        args
    };

    // alice alone, in the group, is refused and told what break-glass needs.
    wait_refused(
        kube,
        "alice",
        &group,
        "a break-glass change needs annotations",
    )
    .await
    .with_context(|| {
        format!(
            "agent log:\n{}",
            windvane_tests::process::tail(&s.agent.process.log(), 60)
        )
    })?;
    let alone = run("alice", &patch("registry.example.com/web:6.6")).await?;
    assert!(
        !alone.ok && alone.output.contains(&denial(s.serial)),
        "{}",
        alone.output
    );

    // Approving herself: the annotations are hers to write, but the change is still refused.
    let own = run(
        "alice",
        &annotate(&[
            "windvane.io/break-glass-ticket=INC-7",
            "windvane.io/break-glass-by=alice",
            "windvane.io/break-glass-approver=alice",
        ]),
    )
    .await?;
    assert!(own.ok, "{}", own.output);
    let self_approved = run("alice", &patch("registry.example.com/web:6.6")).await?;
    assert!(!self_approved.ok, "{}", self_approved.output);
    // Nor can she write bob's name for him.
    let forged = run(
        "alice",
        &annotate(&["windvane.io/break-glass-approver=bob"]),
    )
    .await?;
    assert!(
        !forged.ok
            && forged
                .output
                .contains("can only be written by the approver themself"),
        "{}",
        forged.output
    );
    assert_eq!(
        image(kube).await?.as_deref(),
        Some("registry.example.com/web:1.0")
    );

    // bob approves; alice's change with the ticket and a short hold goes through.
    let approval = run("bob", &annotate(&["windvane.io/break-glass-approver=bob"])).await?;
    assert!(approval.ok, "{}", approval.output);
    let until = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_secs(20))?
        .round(jiff::Unit::Second)?;
    let hold = format!("windvane.io/hold-until={until}");
    let held = run("alice", &annotate(&[hold.as_str()])).await?;
    assert!(held.ok, "{}", held.output);
    let change = run("alice", &patch("registry.example.com/web:6.6")).await?;
    assert!(change.ok, "{}", change.output);

    // Held, naming both people and the ticket; the change stays meanwhile.
    let status = s
        .agent
        .wait_status("held", WAIT, |st| {
            object_state(st, "Deployment shop/web") == Some("Held")
        })
        .await?;
    let message = status["objects"]
        .as_array()
        .and_then(|o| o.iter().find(|x| x["object"] == "Deployment shop/web"))
        .map(|x| x["message"].to_string())
        .unwrap_or_default();
    assert!(
        message.contains("break-glass by alice, approved by bob, ticket INC-7"),
        "{message}"
    );
    assert_eq!(
        image(kube).await?.as_deref(),
        Some("registry.example.com/web:6.6")
    );

    // At the end of the hold it is reverted, and the approval is spent.
    wait_image(kube, "registry.example.com/web:1.0").await?;
    let deployments: Api<Deployment> = Api::namespaced(kube.client(), "shop");
    let annotations = wait_for("the break-glass annotations cleared", WAIT, || async {
        let annotations = deployments
            .get("web")
            .await?
            .metadata
            .annotations
            .unwrap_or_default();
        Ok((!annotations
            .keys()
            .any(|k| k.starts_with("windvane.io/break-glass")))
        .then_some(annotations))
    })
    .await?;
    assert!(
        !annotations.contains_key("windvane.io/hold-until"),
        "{annotations:?}"
    );
    let status = s
        .agent
        .wait_status("synced again", WAIT, |st| {
            object_state(st, "Deployment shop/web") == Some("Synced")
        })
        .await?;
    let reverted = status["drift"].as_array().is_some_and(|d| {
        d.iter()
            .any(|r| r["name"] == "web" && r["action"] == "Reverted")
    });
    assert!(reverted, "{status}");
    let again = run("alice", &patch("registry.example.com/web:6.7")).await?;
    assert!(!again.ok, "the approval was used once: {}", again.output);

    // An approval left standing is spent when a release writes the object.
    let own = run(
        "alice",
        &annotate(&[
            "windvane.io/break-glass-ticket=INC-8",
            "windvane.io/break-glass-by=alice",
        ]),
    )
    .await?;
    assert!(own.ok, "{}", own.output);
    let approval = run("bob", &annotate(&["windvane.io/break-glass-approver=bob"])).await?;
    assert!(approval.ok, "{}", approval.output);
    s.tree
        .write("web/objects.yaml", &objects("registry.example.com/web:3.0"))?;
    s.publisher.publish(&s.tree, "stable")?;
    wait_image(kube, "registry.example.com/web:3.0").await?;
    wait_for("the standing approval removed", WAIT, || async {
        let annotations = deployments
            .get("web")
            .await?
            .metadata
            .annotations
            .unwrap_or_default();
        Ok((!annotations.contains_key("windvane.io/break-glass-approver")).then_some(()))
    })
    .await?;
    let stale = run("alice", &patch("registry.example.com/web:6.8")).await?;
    assert!(!stale.ok, "{}", stale.output);

    // A release that takes the change in: it is closed as TakenIn, and not reverted when its hold ends.
    let own = run(
        "alice",
        &annotate(&[
            "windvane.io/break-glass-ticket=INC-9",
            "windvane.io/break-glass-by=alice",
        ]),
    )
    .await?;
    assert!(own.ok, "{}", own.output);
    let approval = run("bob", &annotate(&["windvane.io/break-glass-approver=bob"])).await?;
    assert!(approval.ok, "{}", approval.output);
    let until = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_secs(20))?
        .round(jiff::Unit::Second)?;
    let hold = format!("windvane.io/hold-until={until}");
    let held = run("alice", &annotate(&[hold.as_str()])).await?;
    assert!(held.ok, "{}", held.output);
    let change = run("alice", &patch("registry.example.com/web:6.9")).await?;
    assert!(change.ok, "{}", change.output);
    s.agent
        .wait_status("held again", WAIT, |st| {
            object_state(st, "Deployment shop/web") == Some("Held")
        })
        .await?;
    s.tree
        .write("web/objects.yaml", &objects("registry.example.com/web:6.9"))?;
    s.publisher.publish(&s.tree, "stable")?;
    let inc9 = |st: &Value, action: &str| {
        st["drift"].as_array().is_some_and(|d| {
            d.iter()
                .any(|r| r["breakGlass"]["ticket"] == "INC-9" && r["action"] == action)
        })
    };
    let status = s
        .agent
        .wait_status("taken in", WAIT, |st| {
            inc9(st, "TakenIn") && object_state(st, "Deployment shop/web") != Some("Held")
        })
        .await?;
    assert!(!inc9(&status, "Held"), "{status}");
    wait_for(
        "the taken-in change's annotations cleared",
        WAIT,
        || async {
            let annotations = deployments
                .get("web")
                .await?
                .metadata
                .annotations
                .unwrap_or_default();
            let cleared = !annotations
                .keys()
                .any(|k| k.starts_with("windvane.io/break-glass") || k == "windvane.io/hold-until");
            Ok(cleared.then_some(()))
        },
    )
    .await?;
    // Past the end of its hold, the change stands and nothing was reverted.
    let after_hold = until.checked_add(jiff::SignedDuration::from_secs(5))?;
    wait_for("the hold's end passed", WAIT, || async {
        Ok((jiff::Timestamp::now() > after_hold).then_some(()))
    })
    .await?;
    assert_eq!(
        image(kube).await?.as_deref(),
        Some("registry.example.com/web:6.9")
    );
    let status = s
        .agent
        .wait_status("not held", WAIT, |st| {
            object_state(st, "Deployment shop/web") != Some("Held")
        })
        .await?;
    assert!(inc9(&status, "TakenIn"), "{status}");
    assert!(!inc9(&status, "Reverted"), "{status}");

    // A release that writes other values over a held change ends it too, recorded as Reverted.
    let own = run(
        "alice",
        &annotate(&[
            "windvane.io/break-glass-ticket=INC-10",
            "windvane.io/break-glass-by=alice",
        ]),
    )
    .await?;
    assert!(own.ok, "{}", own.output);
    let approval = run("bob", &annotate(&["windvane.io/break-glass-approver=bob"])).await?;
    assert!(approval.ok, "{}", approval.output);
    let change = run("alice", &patch("registry.example.com/web:7.7")).await?;
    assert!(change.ok, "{}", change.output);
    s.agent
        .wait_status("held a third time", WAIT, |st| {
            object_state(st, "Deployment shop/web") == Some("Held")
        })
        .await?;
    s.tree
        .write("web/objects.yaml", &objects("registry.example.com/web:8.0"))?;
    s.publisher.publish(&s.tree, "stable")?;
    wait_image(kube, "registry.example.com/web:8.0").await?;
    s.agent
        .wait_status("replaced by the release", WAIT, |st| {
            st["drift"].as_array().is_some_and(|d| {
                d.iter()
                    .any(|r| r["breakGlass"]["ticket"] == "INC-10" && r["action"] == "Reverted")
            })
        })
        .await?;

    // Uninstalling the agent (its Namespace deleted) removes the policy and binding through their owner.
    drop(s.agent);
    assert!(
        policy_objects(kube).await?.iter().all(Option::is_some),
        "the policy outlives the agent's process"
    );
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(kube.client());
    namespaces
        .delete(AGENT_NAMESPACE, &kube::api::DeleteParams::default())
        .await?;
    wait_for(
        "the policy removed with the agent's namespace",
        WAIT,
        || async {
            let found = policy_objects(kube).await?;
            Ok(found.iter().all(Option::is_none).then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// A fleet where web waits for app `db`, whose one object the API server refuses.
const FLEET_WITH_BROKEN_DEPENDENCY: &str = "\
fleet: acme
apps:
  - name: db
    path: db
  - name: web
    path: web
    dependsOn: [db]
    policy:
      prevent: true
      ignoreDifferences:
        - {group: apps, kind: Deployment, name: scaled, jsonPointers: [/spec/replicas]}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prevention_fails_closed_against_deletion_owner_references_and_failed_dependencies()
-> anyhow::Result<()> {
    let s = setup(33).await?;
    let kube = &s.kube;
    wait_refused(kube, "alice", &[], &denial(s.serial)).await?;

    // An admin deletes the policy: it is back within seconds, not at the hourly backstop.
    let started = std::time::Instant::now();
    let deleted = kubectl(
        kube,
        "",
        &[],
        &["delete", "validatingadmissionpolicy", POLICY],
        &[],
    )
    .await?;
    assert!(deleted.ok, "{}", deleted.output);
    wait_for("the policy restored", Duration::from_secs(20), || async {
        let found = policy_objects(kube).await?;
        Ok(found.iter().all(Option::is_some).then_some(()))
    })
    .await?;
    wait_refused(kube, "alice", &[], &denial(s.serial)).await?;
    println!(
        "deleted policy restored and refusing within {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // The binding switched to Audit only: Deny again within seconds.
    let log_from = s.agent.process.log().len();
    let audit = kubectl(
        kube,
        "",
        &[],
        &[
            "patch",
            "validatingadmissionpolicybinding",
            POLICY,
            "--type=merge",
            "-p",
            r#"{"spec":{"validationActions":["Audit"]}}"#,
        ],
        &[],
    )
    .await?;
    assert!(audit.ok, "{}", audit.output);
    wait_for(
        "the binding denying again",
        Duration::from_secs(20),
        || async {
            let binding = kube
                .admission_api("ValidatingAdmissionPolicyBinding")
                .get_opt(POLICY)
                .await?;
            Ok(binding
                .filter(|b| b.data["spec"]["validationActions"] == json!(["Deny"]))
                .map(|_| ()))
        },
    )
    .await
    .map_err(|e| {
        anyhow::anyhow!(
            "{e}; agent log since the patch:\n{}",
            &s.agent.process.log()[log_from..]
        )
    })?;

    // An owner reference to nothing, for the garbage collector to delete web: refused.
    let owner = r#"{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"gone","uid":"0b5e7c1e-0000-4000-8000-000000000001"}]}}"#;
    let dangling = kubectl(
        kube,
        "alice",
        &[],
        &["patch", "deployment/web", "--type=merge", "-p", owner],
        &[],
    )
    .await?;
    assert!(
        !dangling.ok && dangling.output.contains(&denial(s.serial)),
        "{}",
        dangling.output
    );

    // web now waits for db, which fails: web is still the release's, and stays guarded.
    s.tree.write("fleet.yaml", FLEET_WITH_BROKEN_DEPENDENCY)?;
    s.tree.write(
        "db/broken.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: broken, namespace: default}\ndata: {\"not a key!\": x}\n",
    )?;
    s.tree
        .write("web/objects.yaml", &objects("registry.example.com/web:2.0"))?;
    let serial = s.publisher.publish(&s.tree, "stable")?.serial;
    wait_refused(kube, "alice", &[], &denial(serial))
        .await
        .with_context(|| windvane_tests::process::tail(&s.agent.process.log(), 40))?;
    assert_eq!(
        image(kube).await?.as_deref(),
        Some("registry.example.com/web:1.0"),
        "web waits for db"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_glass_approval_is_bound_to_its_requester_and_checked_names_only()
-> anyhow::Result<()> {
    let s = setup(34).await?;
    let kube = &s.kube;
    let group = [GROUP];
    let run = async |user: &str, args: &[&str]| kubectl(kube, user, &group, args, &[]).await;
    let annotate = |pairs: &[&'static str]| {
        let mut args = vec!["annotate", "--overwrite", "deployment/web"];
        args.extend(pairs);
        args
    };
    let patch = [
        "set",
        "image",
        "deployment/web",
        "web=registry.example.com/web:6.6",
    ];
    wait_refused(kube, "alice", &group, &denial(s.serial)).await?;

    // alice asks, bob approves; carol rewrites the requester to herself to use bob's approval: refused.
    let asked = run(
        "alice",
        &annotate(&[
            "windvane.io/break-glass-ticket=INC-11",
            "windvane.io/break-glass-by=alice",
        ]),
    )
    .await?;
    assert!(asked.ok, "{}", asked.output);
    let approved = run("bob", &annotate(&["windvane.io/break-glass-approver=bob"])).await?;
    assert!(approved.ok, "{}", approved.output);
    let taken = run("carol", &annotate(&["windvane.io/break-glass-by=carol"])).await?;
    assert!(
        !taken.ok && taken.output.contains("needs a new approval"),
        "{}",
        taken.output
    );
    let carols = run("carol", &patch).await?;
    assert!(!carols.ok, "{}", carols.output);
    assert_eq!(
        image(kube).await?.as_deref(),
        Some("registry.example.com/web:1.0")
    );

    // Prevention off: alice writes all three names herself, nothing checks them. Prevention on again: the
    // agent removes them, and her change is refused.
    s.tree.write("fleet.yaml", &fleet(false))?;
    s.publisher.publish(&s.tree, "stable")?;
    wait_for("the policy removed", WAIT, || async {
        let found = policy_objects(kube).await?;
        Ok(found.iter().all(Option::is_none).then_some(()))
    })
    .await?;
    // The API server stops enforcing a deleted policy a moment after it is gone.
    wait_for("alice's unchecked names admitted", WAIT, || async {
        let unchecked = run(
            "alice",
            &annotate(&[
                "windvane.io/break-glass-ticket=INC-12",
                "windvane.io/break-glass-by=alice",
                "windvane.io/break-glass-approver=bob",
            ]),
        )
        .await?;
        Ok(unchecked.ok.then_some(()))
    })
    .await?;
    s.tree.write("fleet.yaml", &fleet(true))?;
    let serial = s.publisher.publish(&s.tree, "stable")?.serial;
    wait_refused(kube, "alice", &[], &denial(serial)).await?;
    let deployments: Api<Deployment> = Api::namespaced(kube.client(), "shop");
    wait_for("the unchecked names removed", WAIT, || async {
        let annotations = deployments
            .get("web")
            .await?
            .metadata
            .annotations
            .unwrap_or_default();
        Ok((!annotations
            .keys()
            .any(|k| k.starts_with("windvane.io/break-glass")))
        .then_some(()))
    })
    .await
    .with_context(|| windvane_tests::process::tail(&s.agent.process.log(), 40))?;
    let forged = run("alice", &patch).await?;
    assert!(!forged.ok, "{}", forged.output);
    assert_eq!(
        image(kube).await?.as_deref(),
        Some("registry.example.com/web:1.0")
    );

    // A checked approval serves one change: the agent marks it spent, and alice's second change is refused.
    let asked = run(
        "alice",
        &annotate(&[
            "windvane.io/break-glass-ticket=INC-13",
            "windvane.io/break-glass-by=alice",
        ]),
    )
    .await?;
    assert!(asked.ok, "{}", asked.output);
    let approved = run("bob", &annotate(&["windvane.io/break-glass-approver=bob"])).await?;
    assert!(approved.ok, "{}", approved.output);
    let first = run("alice", &patch).await?;
    assert!(first.ok, "{}", first.output);
    wait_for("the approval marked spent", WAIT, || async {
        let annotations = deployments
            .get("web")
            .await?
            .metadata
            .annotations
            .unwrap_or_default();
        Ok(annotations
            .contains_key("windvane.io/break-glass-spent")
            .then_some(()))
    })
    .await
    .with_context(|| windvane_tests::process::tail(&s.agent.process.log(), 40))?;
    // A second change of another owned field (replicas, in the object itself) under the same approval.
    let second = run(
        "alice",
        &[
            "patch",
            "deployment/web",
            "--type=merge",
            "-p",
            r#"{"spec":{"replicas":3}}"#,
        ],
    )
    .await?;
    assert!(!second.ok, "{}", second.output);
    // Nor can she remove the mark herself.
    let unmark = run(
        "alice",
        &[
            "annotate",
            "deployment/web",
            "windvane.io/break-glass-spent-",
        ],
    )
    .await?;
    assert!(
        !unmark.ok && unmark.output.contains("written by the Windvane agent only"),
        "{}",
        unmark.output
    );
    assert_eq!(
        image(kube).await?.as_deref(),
        Some("registry.example.com/web:6.6")
    );
    Ok(())
}
