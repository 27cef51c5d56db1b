//! Secrets in the release, against a real control plane: a Secret encrypted by the real `sops` (age
//! recipients) travels encrypted; the agent without the identity reports that object Failed naming the
//! recipient while the rest is Synced; once the operator installs the identity Secret it applies as the
//! right Secret (no restart), and drift on it is healed; a file sealed to a new key after rotation applies;
//! a tampered MAC is refused while the applied Secret stays. No value (as written or in base64) is in the
//! store, the server's database or log, the agent's `/status`, `/metrics` or log, the cluster's Events or the
//! control plane's log; `windvane render` shows it only with `--reveal` and the key, and `windvane-agent
//! diff` masks both sides of a Secret that differs, and every value a SOPS file held of any other kind.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use windvane_tests::fleet::{Agent, AgentOptions, FleetTree, Publisher};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::process::binary;
use windvane_tests::secrets::{
    AGE_KEY_SECRET, age_secret_key, b64, ensure_not_in_cluster, ensure_not_in_files, forms,
    install_age_identities,
};
use windvane_tests::server::SourceServer;

const WAIT: Duration = Duration::from_secs(90);
const SECRET: &str = "Secret app/db";
const CONFIG: &str = "ConfigMap app/settings";
/// The secret value (in the Secret's `data`, base64 as Kubernetes wants it) and its base64 form.
const PLAIN: &str = "pl41n-s3cr3t-h0rse";
const PLAIN_ROTATED: &str = "r0t4ted-s3cr3t-b4ttery";
/// The value of a newer release on another channel, which only `windvane-agent diff` sees.
const PLAIN_NEXT: &str = "n3xt-s3cr3t-st4ple";
/// A value sealed in a ConfigMap (not a Secret) of the newer release: `windvane-agent diff` masks it too.
const PLAIN_CONFIG: &str = "c0nf1g-s3cr3t-d5n";
/// What a hand edit writes into the live Secret (healed away).
const HAND: &str = "h4nd-s3cr3t-c0rrect";

/// A real tool built by tests/tools/build.sh: `WINDVANE_<NAME>` (set by tests/run), else target/tools.
fn tool(name: &str) -> anyhow::Result<PathBuf> {
    let env = format!("WINDVANE_{}", name.to_ascii_uppercase().replace('-', "_"));
    let path = match std::env::var_os(&env) {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/tools")
            .join(name),
    };
    ensure!(
        path.is_file(),
        "{} is missing: run tests/tools/build.sh (or set {env})",
        path.display()
    );
    Ok(path)
}

/// A new identity file from the real age-keygen, and its recipient.
fn age_keygen(dir: &Path, name: &str) -> anyhow::Result<(PathBuf, String)> {
    let path = dir.join(name);
    let output = Command::new(tool("age-keygen")?)
        .arg("-o")
        .arg(&path)
        .output()?;
    ensure!(output.status.success(), "age-keygen: {output:?}");
    let text = std::fs::read_to_string(&path)?;
    let recipient = text
        .lines()
        .find_map(|l| l.strip_prefix("# public key: "))
        .context("age-keygen wrote no public key")?
        .to_owned();
    Ok((path, recipient))
}

fn secret_yaml(value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\n  namespace: app\n  labels: {{tier: backend}}\ntype: Opaque\ndata:\n  password: {}\n",
        b64(value)
    )
}

/// Encrypts `plain` with the real sops to `recipients`, only data/stringData encrypted.
fn sops_encrypt(dir: &Path, plain: &str, recipients: &[&str]) -> anyhow::Result<String> {
    let input = dir.join("plain-secret.yaml");
    std::fs::write(&input, plain)?;
    let output = Command::new(tool("sops")?)
        .current_dir(dir)
        .args([
            "encrypt",
            "--encrypted-regex",
            "^(data|stringData)$",
            "--age",
        ])
        .arg(recipients.join(","))
        .arg(&input)
        .output()?;
    std::fs::remove_file(&input)?;
    ensure!(
        output.status.success(),
        "sops encrypt: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

fn object<'a>(status: &'a Value, name: &str) -> Option<&'a Value> {
    status["objects"]
        .as_array()?
        .iter()
        .find(|o| o["object"] == name)
}

fn state<'a>(status: &'a Value, name: &str) -> &'a str {
    object(status, name)
        .and_then(|o| o["state"].as_str())
        .unwrap_or("")
}

fn message(status: &Value, name: &str) -> String {
    object(status, name)
        .and_then(|o| o["message"].as_str())
        .unwrap_or("")
        .to_owned()
}

async fn live_password(kube: &LocalKube) -> anyhow::Result<Option<String>> {
    let api: Api<Secret> = Api::namespaced(kube.client(), "app");
    Ok(api.get_opt("db").await?.and_then(|s| {
        s.data?
            .get("password")
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
    }))
}

fn windvane(args: &[&str]) -> anyhow::Result<(bool, String)> {
    let output = Command::new(binary("windvane")?).args(args).output()?;
    Ok((
        output.status.success(),
        String::from_utf8(output.stdout)? + &String::from_utf8(output.stderr)?,
    ))
}

/// Runs the real `windvane-agent diff` for this cluster against `channel`: its exit code, stdout and stderr.
fn agent_diff(
    options: &AgentOptions,
    kube: &LocalKube,
    channel: &str,
) -> anyhow::Result<(Option<i32>, String)> {
    let diff = Command::new(binary("windvane-agent")?)
        .args(["diff", "--source", &options.source, "--channel", channel])
        .args(["--fleet", &options.fleet, "--cluster", &options.cluster])
        .arg("--trusted-key")
        .arg(&options.trusted_keys[0])
        .arg("--kubeconfig")
        .arg(kube.kubeconfig_path())
        .args(["--age-key-secret", AGE_KEY_SECRET])
        .output()?;
    Ok((
        diff.status.code(),
        String::from_utf8_lossy(&diff.stdout).into_owned() + &String::from_utf8_lossy(&diff.stderr),
    ))
}

/// `windvane-agent diff` opens the SOPS Secret with the cluster's identity: nothing differs on the release
/// the agent applied; a newer release (on another channel, sealed to `recipient`) that changes the value is
/// shown as a difference with both sides masked and neither value in the output.
async fn diff_masks_secrets(
    options: &AgentOptions,
    kube: &LocalKube,
    (publisher, tree): (&Publisher, &FleetTree),
    recipient: &str,
) -> anyhow::Result<()> {
    // windvane-agent diff opens it with the cluster's identity: nothing differs on this release.
    let (code, out) = agent_diff(options, kube, "stable")?;
    ensure!(code == Some(0), "{out}");
    ensure!(forms(&[PLAIN]).iter().all(|v| !out.contains(v)), "{out}");

    // A newer release (on another channel, which the agent does not follow) changes the value: diff shows the
    // Secret as different, both sides masked, neither value in clear or base64.
    let next = FleetTree::new()?;
    for file in ["fleet.yaml", "app/settings.yaml"] {
        next.write(file, &std::fs::read_to_string(tree.path().join(file))?)?;
    }
    next.write(
        "app/db.sops.yaml",
        &sops_encrypt(next.path(), &secret_yaml(PLAIN_NEXT), &[recipient])?,
    )?;
    next.write(
        "app/conf.sops.yaml",
        &sops_encrypt(
            next.path(),
            &format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: conf, namespace: app}}\ndata:\n  dsn: {PLAIN_CONFIG}\n"
            ),
            &[recipient],
        )?,
    )?;
    publisher.publish(&next, "next")?;
    let (code, out) = agent_diff(options, kube, "next")?;
    // The sealed ConfigMap is new: shown whole, but its sealed value masked.
    ensure!(
        out.contains("desired/ConfigMap app/conf") && out.contains("1 to create"),
        "{out}"
    );
    ensure!(
        out.lines()
            .any(|l| l.contains("dsn:") && l.contains("<masked ")),
        "the sealed ConfigMap value is masked: {out}"
    );
    ensure!(code == Some(1), "diff exits 1 on a difference: {out}");
    ensure!(
        out.contains(&format!("live/{SECRET}"))
            && out.contains(&format!("desired/{SECRET}"))
            && out.contains("1 to change"),
        "the Secret is reported as different: {out}"
    );
    let masked: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("password:") && l.contains("<masked "))
        .collect();
    ensure!(
        masked.len() == 2 && masked[0] != masked[1],
        "both sides masked and different: {out}"
    );
    for value in forms(&[PLAIN, PLAIN_NEXT, PLAIN_CONFIG]) {
        ensure!(!out.contains(&value), "{value:?} in the diff: {out}");
    }
    ensure!(
        live_password(kube).await?.as_deref() == Some(PLAIN),
        "diff changes nothing"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sops_secrets_open_only_where_the_identity_is() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let keys = tempfile::tempdir()?;
    let (old_key, old_recipient) = age_keygen(keys.path(), "old.txt")?;
    let (new_key, new_recipient) = age_keygen(keys.path(), "new.txt")?;

    let publisher = Publisher::new(41)?;
    let tree = FleetTree::new()?;
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: app\n    path: app\n    createNamespace: true\n    namespace: app\n",
    )?;
    tree.write(
        "app/settings.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: app}\ndata: {mode: strict}\n",
    )?;
    let sealed = sops_encrypt(tree.path(), &secret_yaml(PLAIN), &[&old_recipient])?;
    ensure!(
        !sealed.contains(&b64(PLAIN)),
        "sops left the value in clear"
    );
    tree.write("app/db.sops.yaml", &sealed)?;
    // Publishing needs no key: the file travels as written.
    publisher.publish(&tree, "stable")?;

    // windvane render shows it encrypted; with --reveal and the key, decrypted.
    let tree_arg = tree.path().display().to_string();
    let (ok, out) = windvane(&["render", &tree_arg, "--cluster", "c1"])?;
    ensure!(
        ok && out.contains("ENC[AES256_GCM") && !out.contains(&b64(PLAIN)),
        "{out}"
    );
    let old_key_arg = old_key.display().to_string();
    let new_key_arg = new_key.display().to_string();
    let (ok, out) = windvane(&[
        "render",
        &tree_arg,
        "--cluster",
        "c1",
        "--reveal",
        "--age-key-file",
        &old_key_arg,
    ])?;
    ensure!(
        ok && out.contains(&b64(PLAIN)) && !out.contains("sops:"),
        "{out}"
    );
    let (ok, out) = windvane(&[
        "render",
        &tree_arg,
        "--cluster",
        "c1",
        "--reveal",
        "--age-key-file",
        &new_key_arg,
    ])?;
    ensure!(!ok && out.contains(&old_recipient), "{out}");

    let server = SourceServer::start(&publisher.store(), &[]).await?;
    let mut options = AgentOptions::new(&server.url, &publisher.public_key_path(), "c1")
        .reporting_to(&server.url, &server.token_file, "1s");
    options
        .extra
        .extend(["--age-key-secret".to_owned(), AGE_KEY_SECRET.to_owned()]);
    let agent = Agent::start(&kube, &options).await?;

    // No identity in the cluster yet: that object is Failed, naming the recipient it needs; the rest Synced.
    let status = agent
        .wait_status("the SOPS Secret Failed, the rest Synced", WAIT, |s| {
            state(s, SECRET) == "Failed" && state(s, CONFIG) == "Synced"
        })
        .await?;
    let failure = message(&status, SECRET);
    ensure!(
        // It holds at most its own identity key (once the reporter has created it), never this one.
        failure.contains(&old_recipient) && failure.contains("this cluster holds"),
        "{failure}"
    );
    ensure!(live_password(&kube).await?.is_none(), "never sent");
    server
        .wait_cluster("c1", "the server sees the failure", WAIT, |view| {
            view.to_string().contains(&old_recipient)
        })
        .await?;

    // The operator installs the identity: the Secret applies, decrypted, without a restart.
    install_age_identities(&kube, &[("old.agekey", &old_key)]).await?;
    agent
        .wait_status("the SOPS Secret Synced", WAIT, |s| {
            state(s, SECRET) == "Synced" && state(s, CONFIG) == "Synced"
        })
        .await?;
    ensure!(live_password(&kube).await?.as_deref() == Some(PLAIN));
    let live: Secret = Api::namespaced(kube.client(), "app").get("db").await?;
    ensure!(
        live.metadata
            .labels
            .unwrap_or_default()
            .get("tier")
            .map(String::as_str)
            == Some("backend")
    );

    // Drift on the decrypted Secret is healed like on any object, and its Events carry no value.
    let params = PatchParams {
        field_manager: Some("kubectl-edit".into()),
        ..PatchParams::default()
    };
    Api::<Secret>::namespaced(kube.client(), "app")
        .patch(
            "db",
            &params,
            &Patch::Merge(json!({"data": {"password": b64(HAND)}})),
        )
        .await?;
    wait_for("the Secret healed", WAIT, || async {
        Ok((live_password(&kube).await?.as_deref() == Some(PLAIN)).then_some(()))
    })
    .await?;
    let events: Api<Event> = Api::namespaced(kube.client(), "app");
    wait_for("the Secret's DriftReverted Event", WAIT, || async {
        let list = events.list(&ListParams::default()).await?;
        Ok(list
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("DriftReverted")
                    && e.involved_object.name.as_deref() == Some("db")
            })
            .then_some(()))
    })
    .await?;
    let faces = ensure_not_in_cluster(&kube, &agent, &[PLAIN, HAND]).await?;
    ensure!(
        faces
            .iter()
            .any(|(place, text)| place.ends_with("(DriftReverted)") && text.contains("\"db\"")),
        "the search covered the drift Event"
    );

    diff_masks_secrets(&options, &kube, (&publisher, &tree), &old_recipient).await?;

    // Rotation: add the new identity, re-seal to the new recipient only, then remove the old identity.
    install_age_identities(&kube, &[("old.agekey", &old_key), ("new.agekey", &new_key)]).await?;
    tree.write(
        "app/db.sops.yaml",
        &sops_encrypt(tree.path(), &secret_yaml(PLAIN_ROTATED), &[&new_recipient])?,
    )?;
    publisher.publish(&tree, "stable")?;
    wait_for("the re-sealed Secret applied", WAIT, || async {
        Ok((live_password(&kube).await?.as_deref() == Some(PLAIN_ROTATED)).then_some(()))
    })
    .await?;
    install_age_identities(&kube, &[("new.agekey", &new_key)]).await?;
    tree.write(
        "app/settings.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: app}\ndata: {mode: lax}\n",
    )?;
    publisher.publish(&tree, "stable")?;
    agent
        .wait_status("synced after the old identity left", WAIT, |s| {
            state(s, SECRET) == "Synced"
                && state(s, CONFIG) == "Synced"
                && s["source"]["appliedSerial"] == 3
        })
        .await?;

    // A tampered MAC is refused: the object is Failed, the Secret as applied stays, the rest applies.
    let mut tampered: Vec<String> =
        sops_encrypt(tree.path(), &secret_yaml(PLAIN_ROTATED), &[&new_recipient])?
            .lines()
            .map(str::to_owned)
            .collect();
    for line in &mut tampered {
        if let Some(at) = line.find("mac: ENC[AES256_GCM,data:") {
            let index = at + "mac: ENC[AES256_GCM,data:".len();
            let flipped = if &line[index..=index] == "A" {
                "B"
            } else {
                "A"
            };
            line.replace_range(index..=index, flipped);
        }
    }
    tree.write("app/db.sops.yaml", &(tampered.join("\n") + "\n"))?;
    tree.write(
        "app/settings.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: app}\ndata: {mode: tampered-release}\n",
    )?;
    publisher.publish(&tree, "stable")?;
    let status = agent
        .wait_status("the tampered Secret refused", WAIT, |s| {
            state(s, SECRET) == "Failed" && s["source"]["appliedSerial"] == 4
        })
        .await?;
    ensure!(
        message(&status, SECRET).contains("MAC mismatch"),
        "{status}"
    );
    ensure!(state(&status, CONFIG) == "Synced", "{status}");
    ensure!(live_password(&kube).await?.as_deref() == Some(PLAIN_ROTATED));

    // No value, nor identity, outside the cluster, as written or in base64: not in the agent's /status,
    // /metrics or log, any Event, the control plane's log, the store, or the server's database and log.
    let (old_secret, new_secret) = (age_secret_key(&old_key)?, age_secret_key(&new_key)?);
    let values = [
        PLAIN,
        PLAIN_ROTATED,
        PLAIN_NEXT,
        HAND,
        &old_secret,
        &new_secret,
    ];
    ensure_not_in_cluster(&kube, &agent, &values).await?;
    drop(agent);
    ensure_not_in_files(&[publisher.store(), server.dir().to_path_buf()], &values)?;
    Ok(())
}
