//! Secrets in the release, against a real control plane: a Secret encrypted by the real `sops` (age
//! recipients) travels encrypted; the agent without the identity reports that object Failed naming the
//! recipient while the rest is Synced; once the operator installs the identity Secret it applies as the
//! right Secret (no restart), and drift on it is healed; a file sealed to a new key after rotation applies;
//! a tampered MAC is refused while the applied Secret stays. The plaintext is in none of the store, the
//! server's database, or any log; `windvane render` shows it only with `--reveal` and the key, and
//! `windvane-agent diff` masks it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use windvane_tests::fleet::{AGENT_NAMESPACE, Agent, AgentOptions, FleetTree, Publisher};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::process::binary;
use windvane_tests::server::SourceServer;

const WAIT: Duration = Duration::from_secs(90);
const SECRET: &str = "Secret app/db";
const CONFIG: &str = "ConfigMap app/settings";
/// The secret value (in the Secret's `data`, base64 as Kubernetes wants it) and its base64 form.
const PLAIN: &str = "pl41n-s3cr3t-h0rse";
const PLAIN_ROTATED: &str = "r0t4ted-s3cr3t-b4ttery";
const IDENTITY_SECRET: &str = "windvane-age";

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

fn b64(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
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

/// Installs (or replaces) the identity Secret in the agent's namespace with these identity files.
async fn install_identities(kube: &LocalKube, files: &[(&str, &Path)]) -> anyhow::Result<()> {
    let mut data = serde_json::Map::new();
    for (key, path) in files {
        data.insert(
            (*key).to_owned(),
            json!(b64(&std::fs::read_to_string(path)?)),
        );
    }
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": IDENTITY_SECRET, "namespace": AGENT_NAMESPACE},
        "data": data,
    }))?;
    let api: Api<Secret> = Api::namespaced(kube.client(), AGENT_NAMESPACE);
    match api.get_opt(IDENTITY_SECRET).await? {
        Some(_) => {
            api.replace(IDENTITY_SECRET, &PostParams::default(), &secret)
                .await?;
        }
        None => {
            api.create(&PostParams::default(), &secret).await?;
        }
    }
    Ok(())
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

/// Every file under `dir` whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if std::fs::read(&path)
                .is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle.as_bytes()))
            {
                found.push(path);
            }
        }
    }
    found
}

fn windvane(args: &[&str]) -> anyhow::Result<(bool, String)> {
    let output = Command::new(binary("windvane")?).args(args).output()?;
    Ok((
        output.status.success(),
        String::from_utf8(output.stdout)? + &String::from_utf8(output.stderr)?,
    ))
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
        .extend(["--age-key-secret".to_owned(), IDENTITY_SECRET.to_owned()]);
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
    install_identities(&kube, &[("old.agekey", &old_key)]).await?;
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

    // Drift on the decrypted Secret is healed like on any object.
    let params = PatchParams {
        field_manager: Some("kubectl-edit".into()),
        ..PatchParams::default()
    };
    Api::<Secret>::namespaced(kube.client(), "app")
        .patch(
            "db",
            &params,
            &Patch::Merge(json!({"data": {"password": b64("changed-by-hand")}})),
        )
        .await?;
    wait_for("the Secret healed", WAIT, || async {
        Ok((live_password(&kube).await?.as_deref() == Some(PLAIN)).then_some(()))
    })
    .await?;

    // windvane-agent diff opens it with the cluster's identity and masks its values.
    let diff = Command::new(binary("windvane-agent")?)
        .args([
            "diff",
            "--source",
            &options.source,
            "--channel",
            "stable",
            "--fleet",
            "acme",
            "--cluster",
            "c1",
        ])
        .arg("--trusted-key")
        .arg(&options.trusted_keys[0])
        .arg("--kubeconfig")
        .arg(kube.kubeconfig_path())
        .args(["--age-key-secret", IDENTITY_SECRET])
        .output()?;
    let diff_out = String::from_utf8_lossy(&diff.stdout).into_owned();
    ensure!(
        diff.status.code() == Some(0),
        "{diff_out}{}",
        String::from_utf8_lossy(&diff.stderr)
    );
    ensure!(
        !diff_out.contains(&b64(PLAIN)) && !diff_out.contains(PLAIN),
        "{diff_out}"
    );

    // Rotation: add the new identity, re-seal to the new recipient only, then remove the old identity.
    install_identities(&kube, &[("old.agekey", &old_key), ("new.agekey", &new_key)]).await?;
    tree.write(
        "app/db.sops.yaml",
        &sops_encrypt(tree.path(), &secret_yaml(PLAIN_ROTATED), &[&new_recipient])?,
    )?;
    publisher.publish(&tree, "stable")?;
    wait_for("the re-sealed Secret applied", WAIT, || async {
        Ok((live_password(&kube).await?.as_deref() == Some(PLAIN_ROTATED)).then_some(()))
    })
    .await?;
    install_identities(&kube, &[("new.agekey", &new_key)]).await?;
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

    // No plaintext outside the cluster: not in the store, the server's database or log, the agent's log.
    let agent_log = agent.process.log();
    drop(agent);
    for value in [PLAIN, PLAIN_ROTATED] {
        for needle in [value.to_owned(), b64(value)] {
            for dir in [publisher.store(), server.dir().to_path_buf()] {
                let found = files_containing(&dir, &needle);
                ensure!(found.is_empty(), "{needle:?} in {found:?}");
            }
            ensure!(
                !agent_log.contains(&needle),
                "{needle:?} in the agent's log"
            );
        }
    }
    Ok(())
}
