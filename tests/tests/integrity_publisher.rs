//! The publisher's own tools against a hostile store and a hostile fleet tree, each test running the real
//! `windvane` binary (issue 42): rollback signs only a bundle an earlier signed pointer of the channel named
//! (an edited unsigned history and a planted bundle are never enough) and does not toggle back; promote,
//! approve and `rollout halt` refuse a pointer that is another channel's, or older than the channel's signed
//! history; the build-time engines (the real helm and kustomize) never take flags or files from the tree.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tempfile::TempDir;
use windvane_shared::crypto::digest::sha256_hex;
use windvane_shared::crypto::dsse::Envelope;
use windvane_tests::process::binary;

fn windvane(args: &[&str]) -> Output {
    Command::new(binary("windvane").expect("the windvane binary"))
        .args(args)
        .env_remove("WINDVANE_FLEET")
        .output()
        .expect("run windvane")
}

fn ok(args: &[&str]) -> String {
    let out = windvane(args);
    assert!(
        out.status.success(),
        "windvane {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `windvane args`, asserting it fails; its stderr.
fn fails(args: &[&str]) -> String {
    let out = windvane(args);
    assert!(
        !out.status.success(),
        "windvane {args:?} should have failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn pointer(store: &Path, channel: &str) -> serde_json::Value {
    let bytes = std::fs::read(store.join(format!("channels/{channel}.json"))).expect("pointer");
    let envelope = Envelope::from_json_slice(&bytes).expect("envelope");
    serde_json::from_slice(&envelope.payload_bytes().expect("payload")).expect("json")
}

/// A fleet tree with one ConfigMap carrying `greeting`, and a two-wave rollout when `rollout`.
fn tree(dir: &Path, greeting: &str, rollout: bool) {
    let mut fleet = "fleet: acme\napps:\n  - name: web\n    path: web\n".to_owned();
    if rollout {
        fleet.push_str(
            "rollout:\n  waves:\n    - {name: canary, percent: 10, soak: 10m}\n    - {}\n",
        );
    }
    std::fs::create_dir_all(dir.join("web")).expect("dir");
    std::fs::write(dir.join("fleet.yaml"), fleet).expect("fleet.yaml");
    std::fs::write(
        dir.join("web/config.yaml"),
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: web, namespace: web}}\ndata: {{greeting: {greeting}}}\n"
        ),
    )
    .expect("manifest");
}

struct Workspace {
    dir: TempDir,
}

impl Workspace {
    fn new() -> Self {
        let dir = TempDir::new().expect("dir");
        let ws = Self { dir };
        ok(&["keygen", "--out", &ws.path("release")]);
        ws
    }

    fn path(&self, relative: &str) -> String {
        self.dir.path().join(relative).display().to_string()
    }

    fn store(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    fn publish(&self, greeting: &str, channel: &str, rollout: bool) -> String {
        let src = self.dir.path().join(format!("src-{greeting}"));
        tree(&src, greeting, rollout);
        ok(&[
            "publish",
            &src.display().to_string(),
            "--root",
            &self.path("store"),
            "--channel",
            channel,
            "--key",
            &self.path("release.key"),
        ])
    }
}

#[test]
fn rollback_signs_only_a_bundle_an_earlier_signed_pointer_of_the_channel_named() {
    let ws = Workspace::new();
    let store = ws.store();
    ws.publish("good", "prod", false);
    let good = pointer(&store, "prod");
    ws.publish("bad", "prod", false);

    // A store writer plants a bundle (any content, named by its own digest) and names it in the unsigned
    // history file, as the issue reproduced.
    let hostile = ws.dir.path().join("src-hostile");
    tree(&hostile, "owned", false);
    let built = ws.path("hostile.json");
    ok(&["build", &hostile.display().to_string(), "--output", &built]);
    let bytes = std::fs::read(&built).expect("bundle");
    let sha = sha256_hex(&bytes);
    std::fs::write(store.join(format!("bundles/{sha}.json")), &bytes).expect("plant");
    std::fs::write(
        store.join("channels/prod.history"),
        format!(
            "1 {}\n9 {sha}\n",
            good["bundle"]["sha256"].as_str().expect("sha")
        ),
    )
    .expect("history");

    let rollback = [
        "rollback",
        "--root",
        &ws.path("store"),
        "--channel",
        "prod",
        "--key",
        &ws.path("release.key"),
    ];
    let out = ok(&rollback);
    assert!(
        out.contains("carries the bundle of serial 1 again"),
        "{out}"
    );
    let rolled = pointer(&store, "prod");
    assert_eq!(rolled["serial"], 3);
    assert_eq!(
        rolled["bundle"], good["bundle"],
        "the signed serial 1's bundle"
    );
    assert_ne!(rolled["bundle"]["sha256"], sha.as_str());
    assert!(
        out.contains("~ ConfigMap web/web"),
        "the change shown: {out}"
    );

    // A second rollback would bring the bad release back: refused, unless asked for by serial.
    let again = fails(&rollback);
    assert!(
        again.contains("name the release to go back to with --to SERIAL"),
        "{again}"
    );
    let unknown = fails(&[&rollback[..], &["--to", "9"]].concat());
    assert!(
        unknown.contains("not earlier than the current serial 3"),
        "{unknown}"
    );

    // What a rollback changes is shown before anything is signed; --dry-run stops there.
    let dry = ok(&[&rollback[..], &["--to", "2", "--dry-run"]].concat());
    assert!(dry.contains("to the bundle of serial 2"), "{dry}");
    assert!(
        dry.contains("~ app web: 0 added, 0 removed, 1 changed"),
        "{dry}"
    );
    assert!(dry.contains("~ ConfigMap web/web"), "{dry}");
    assert!(dry.contains("dry run: nothing signed"), "{dry}");
    assert_eq!(pointer(&store, "prod")["serial"], 3);

    // An unsigned entry put where the signed history lives is refused, naming the file.
    std::fs::write(
        store.join("channels/prod.releases/2.json"),
        format!("{{\"serial\": 2, \"bundle\": \"{sha}\"}}"),
    )
    .expect("forge");
    let forged = fails(&[&rollback[..], &["--to", "2"]].concat());
    assert!(forged.contains("prod.releases/2.json"), "{forged}");
    assert!(forged.contains("signed history was altered"), "{forged}");
    assert_eq!(pointer(&store, "prod")["serial"], 3, "nothing signed");
}

#[test]
fn an_older_store_without_signed_history_is_refused_until_the_next_publish() {
    let ws = Workspace::new();
    let store = ws.store();
    ws.publish("one", "prod", false);
    ws.publish("two", "prod", false);
    // A store as an older version left it: no signed history, only the unsigned lines.
    std::fs::remove_dir_all(store.join("channels/prod.releases")).expect("remove");
    let rollback = [
        "rollback",
        "--root",
        &ws.path("store"),
        "--channel",
        "prod",
        "--key",
        &ws.path("release.key"),
    ];
    let refused = fails(&rollback);
    assert!(
        refused.contains("has no signed history before serial 2"),
        "{refused}"
    );
    assert!(refused.contains("publish once more"), "{refused}");
    // The next publish records the pointer it replaces too, so rollback can go back to serial 2.
    ws.publish("three", "prod", false);
    let out = ok(&rollback);
    assert!(
        out.contains("carries the bundle of serial 2 again"),
        "{out}"
    );
}

#[test]
fn promote_approve_and_halt_refuse_another_channels_pointer_and_a_replayed_one() {
    let ws = Workspace::new();
    let store = ws.store();
    ws.publish("dev", "dev", true);
    ws.publish("staging", "staging", true);
    ok(&["keygen", "--out", &ws.path("approver")]);
    let staging = std::fs::read(store.join("channels/staging.json")).expect("staging");
    std::fs::copy(
        store.join("channels/dev.json"),
        store.join("channels/staging.json"),
    )
    .expect("copy dev over staging");
    let dev_before = std::fs::read(store.join("channels/dev.json")).expect("dev");

    let (root, key) = (ws.path("store"), ws.path("release.key"));
    let promote = [
        "promote", "--root", &root, "--from", "staging", "--to", "prod", "--key", &key,
    ];
    let halt = [
        "rollout",
        "halt",
        "--root",
        &root,
        "--channel",
        "staging",
        "--key",
        &key,
    ];
    let approve = [
        "approve",
        "--root",
        &root,
        "--channel",
        "staging",
        "--serial",
        "1",
        "--key",
        &ws.path("approver.key"),
        "--trusted-key",
        &ws.path("release.pub"),
    ];
    for command in [&promote[..], &halt[..], &approve[..]] {
        let error = fails(command);
        assert!(
            error.contains("it is channel \"dev\"'s release, not channel \"staging\"'s"),
            "{command:?}: {error}"
        );
        assert!(error.contains("refusing to sign"), "{error}");
    }
    assert!(
        !store.join("channels/prod.json").exists(),
        "nothing promoted"
    );
    assert_eq!(
        std::fs::read(store.join("channels/dev.json")).expect("dev"),
        dev_before,
        "dev's control was not re-signed"
    );
    assert!(
        !store.join("approvals/staging").exists(),
        "nothing approved"
    );

    // The channel's own pointer, but older than its signed history (a store replaying serial 1).
    std::fs::write(store.join("channels/staging.json"), &staging).expect("restore");
    ws.publish("staging-2", "staging", true);
    let second = std::fs::read(store.join("channels/staging.json")).expect("serial 2");
    std::fs::write(store.join("channels/staging.json"), &staging).expect("replay");
    let error = fails(&promote);
    assert!(
        error.contains("the channel's signed history already has serial 2"),
        "{error}"
    );
    let error = fails(&halt);
    assert!(error.contains("already has serial 2"), "{error}");

    let error = fails(&[
        "publish",
        &ws.dir.path().join("src-staging-2").display().to_string(),
        "--root",
        &root,
        "--channel",
        "staging",
        "--key",
        &key,
    ]);
    assert!(
        error.contains("already has serial 2"),
        "publish would sign a second serial 2: {error}"
    );

    // A fleet named on the command line is held to.
    std::fs::write(store.join("channels/staging.json"), &second).expect("restore serial 2");
    let error = fails(&[&halt[..], &["--fleet", "umbrella"]].concat());
    assert!(error.contains("not fleet \"umbrella\"'s"), "{error}");
    ok(&[&promote[..], &["--fleet", "acme"]].concat());
    assert_eq!(
        pointer(&store, "prod")["bundle"],
        pointer(&store, "staging")["bundle"]
    );
}

/// The real helm or kustomize: `WINDVANE_HELM` / `WINDVANE_KUSTOMIZE`, else the repository's
/// target/tools build.
fn engine(name: &str) -> PathBuf {
    let path = std::env::var_os(format!("WINDVANE_{}", name.to_ascii_uppercase()))
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../target/tools")
                .join(name)
        });
    assert!(
        path.is_file(),
        "{} is missing: run tests/tools/build.sh (or set WINDVANE_{})",
        path.display(),
        name.to_ascii_uppercase()
    );
    path
}

/// `windvane build` of `tree` with the given helm and the real kustomize; its stderr when it fails.
fn build_fails(tree: &Path, helm: &Path, env: &[(&str, &str)]) -> String {
    // Its own output directory: tests run at once, and a shared path would make two builds race on one file.
    let out_dir = TempDir::new().expect("a temporary directory");
    let out = Command::new(binary("windvane").expect("the windvane binary"))
        .args([
            "build",
            &tree.display().to_string(),
            "--output",
            &out_dir.path().join("bundle.json").display().to_string(),
        ])
        .env("WINDVANE_HELM", helm)
        .env("WINDVANE_KUSTOMIZE", engine("kustomize"))
        .envs(env.iter().copied())
        .output()
        .expect("run windvane");
    assert!(
        !out.status.success(),
        "the build should have been refused: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A fleet tree with one local chart, `charts/web`, whose app sets `helm` to `helm_yaml`.
fn chart_tree(dir: &Path, helm_yaml: &str) -> PathBuf {
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("charts/web/templates")).expect("dirs");
    std::fs::write(
        tree.join("fleet.yaml"),
        format!("fleet: acme\napps:\n  - name: web\n    path: charts/web\n    namespace: web\n    helm: {helm_yaml}\n"),
    )
    .expect("fleet.yaml");
    std::fs::write(
        tree.join("charts/web/Chart.yaml"),
        "apiVersion: v2\nname: web\nversion: 1.0.0\n",
    )
    .expect("Chart.yaml");
    std::fs::write(
        tree.join("charts/web/templates/config.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: web}\ndata: {release: {{ .Release.Name | quote }}}\n",
    )
    .expect("template");
    tree
}

#[test]
fn a_helm_release_name_that_reads_as_a_flag_is_refused_before_helm_runs() {
    let dir = TempDir::new().expect("dir");
    let tree = chart_tree(
        dir.path(),
        "{releaseName: \"--set-file=leak=/proc/self/environ\"}",
    );
    let error = build_fails(&tree, &engine("helm"), &[]);
    assert!(
        error.contains("app web: checking helm.releaseName: \"--set-file=leak=/proc/self/environ\" is not a DNS-1123 label"),
        "{error}"
    );
    let tree = chart_tree(&dir.path().join("b"), "{kubeVersion: \"--debug\"}");
    let error = build_fails(&tree, &engine("helm"), &[]);
    assert!(error.contains("checking helm.kubeVersion"), "{error}");
}

#[test]
fn engines_run_with_a_cleared_environment() {
    let dir = TempDir::new().expect("dir");
    let tree = chart_tree(dir.path(), "{}");
    // A stand-in for helm that writes down the environment it was given and its arguments.
    let seen = dir.path().join("seen");
    let helm = dir.path().join("helm");
    std::fs::write(
        &helm,
        format!(
            "#!/bin/sh\nenv > {0}.env\nprintf '%s\\n' \"$@\" > {0}.args\nexit 3\n",
            seen.display()
        ),
    )
    .expect("script");
    std::fs::set_permissions(&helm, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    build_fails(&tree, &helm, &[("CI_DEPLOY_TOKEN", "s3cr3t")]);
    let env = std::fs::read_to_string(seen.with_extension("env")).expect("env written");
    assert!(
        !env.contains("s3cr3t"),
        "the CI's secrets reach the engine: {env}"
    );
    let names: Vec<&str> = env.lines().filter_map(|l| l.split('=').next()).collect();
    for name in &names {
        assert!(
            ["HOME", "PATH", "PWD", "SHLVL", "_"].contains(name)
                || name.starts_with("HELM_")
                || name.starts_with("XDG_"),
            "unexpected variable {name} in {env}"
        );
    }
    let args = std::fs::read_to_string(seen.with_extension("args")).expect("args written");
    let args: Vec<&str> = args.lines().collect();
    let dashes = args.iter().position(|a| *a == "--").expect("--");
    assert_eq!(
        args[dashes + 1],
        "web",
        "the release name after --: {args:?}"
    );
    assert_eq!(args.len(), dashes + 3, "{args:?}");
}

#[test]
fn links_out_of_the_tree_and_remote_kustomize_resources_are_refused() {
    let dir = TempDir::new().expect("dir");
    let tree = chart_tree(dir.path(), "{}");
    std::fs::write(dir.path().join("secret.txt"), "key: outside\n").expect("outside");
    std::os::unix::fs::symlink(
        dir.path().join("secret.txt"),
        tree.join("charts/web/templates/leak.yaml"),
    )
    .expect("link");
    let error = build_fails(&tree, &engine("helm"), &[]);
    assert!(error.contains("leak.yaml is a symbolic link to"), "{error}");
    assert!(error.contains("outside the fleet tree"), "{error}");

    // A values file that is a link out of the tree (fleet.yaml's reader refuses it already; so would the engine).
    let valued = chart_tree(&dir.path().join("v"), "{valuesFiles: [values/leak.yaml]}");
    std::fs::create_dir_all(valued.join("values")).expect("dir");
    std::os::unix::fs::symlink(
        dir.path().join("secret.txt"),
        valued.join("values/leak.yaml"),
    )
    .expect("link");
    let error = build_fails(&valued, &engine("helm"), &[]);
    assert!(error.contains("outside the fleet"), "{error}");

    let kustomized = dir.path().join("k");
    std::fs::create_dir_all(kustomized.join("apps/shop")).expect("dirs");
    std::fs::write(
        kustomized.join("fleet.yaml"),
        "fleet: acme\napps:\n  - name: shop\n    path: apps/shop\n",
    )
    .expect("fleet.yaml");
    std::fs::write(
        kustomized.join("apps/shop/kustomization.yaml"),
        "resources:\n  - https://github.com/example/repo//deploy?ref=main\n",
    )
    .expect("kustomization");
    let error = build_fails(&kustomized, &engine("helm"), &[]);
    assert!(
        error.contains("\"https://github.com/example/repo//deploy?ref=main\" is a remote resource"),
        "{error}"
    );
    // Allowed on the command line, it must still be pinned to a commit.
    let error = build_fails(
        &kustomized,
        &engine("helm"),
        &[("WINDVANE_KUSTOMIZE_REMOTE", "true")],
    );
    assert!(error.contains("is not pinned to a commit"), "{error}");
    // A local base that is a link out of the tree is refused too.
    std::fs::write(
        kustomized.join("apps/shop/kustomization.yaml"),
        "resources: [../outside]\n",
    )
    .expect("kustomization");
    std::fs::create_dir_all(dir.path().join("elsewhere")).expect("dir");
    std::os::unix::fs::symlink(
        dir.path().join("elsewhere"),
        kustomized.join("apps/outside"),
    )
    .expect("link");
    let error = build_fails(&kustomized, &engine("helm"), &[]);
    assert!(error.contains("outside the fleet tree"), "{error}");
}

/// A kustomization that names an exec function (a KRM function run as a local program) or a legacy exec
/// plugin never runs it: windvane passes kustomize neither `--enable-exec` nor `--enable-alpha-plugins`,
/// and a plugin directory in the fleet tree is not searched (the engine's environment is cleared). The
/// program would leave a file behind if it ran.
#[test]
fn kustomize_exec_functions_and_plugins_in_the_tree_never_run() {
    let dir = TempDir::new().expect("dir");
    let tree = dir.path().join("tree");
    let app = tree.join("apps/shop");
    std::fs::create_dir_all(&app).expect("dirs");
    std::fs::write(
        tree.join("fleet.yaml"),
        "fleet: acme\napps:\n  - name: shop\n    path: apps/shop\n",
    )
    .expect("fleet.yaml");
    let ran = dir.path().join("the-plugin-ran");
    let script = app.join("generate.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ntouch {}\necho 'apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: made}}'\n",
            ran.display()
        ),
    )
    .expect("script");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    std::fs::write(
        app.join("function.yaml"),
        "apiVersion: example.com/v1\nkind: Generate\nmetadata:\n  name: make\n  annotations:\n    \
         config.kubernetes.io/function: |\n      exec:\n        path: ./generate.sh\n",
    )
    .expect("function");
    std::fs::write(
        app.join("kustomization.yaml"),
        "generators: [function.yaml]\nresources: [cm.yaml]\n",
    )
    .expect("kustomization");
    std::fs::write(
        app.join("cm.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: shop}\n",
    )
    .expect("cm");
    let error = build_fails(&tree, &engine("helm"), &[]);
    assert!(
        error.contains("apps/shop") || error.contains("shop"),
        "{error}"
    );
    assert!(!ran.exists(), "the exec function ran: {error}");

    // A legacy exec plugin laid in the tree where kustomize looks for plugins (KUSTOMIZE_PLUGIN_HOME, or
    // $XDG_CONFIG_HOME/kustomize/plugin): the environment that would point there is not passed on.
    let plugin = tree.join("plugins/example.com/v1/generate");
    std::fs::create_dir_all(&plugin).expect("plugin dir");
    std::fs::copy(&script, plugin.join("Generate")).expect("plugin");
    std::fs::set_permissions(
        plugin.join("Generate"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    std::fs::write(
        app.join("function.yaml"),
        "apiVersion: example.com/v1\nkind: Generate\nmetadata: {name: make}\n",
    )
    .expect("plugin config");
    let home = tree.join("plugins").display().to_string();
    let error = build_fails(
        &tree,
        &engine("helm"),
        &[
            ("KUSTOMIZE_PLUGIN_HOME", home.as_str()),
            ("XDG_CONFIG_HOME", home.as_str()),
        ],
    );
    assert!(!ran.exists(), "the exec plugin ran: {error}");
}

/// A hostile stand-in for a source server on loopback: answers every request with `head` and then `body`
/// (repeated `repeat` times), and closes.
fn hostile_server(head: String, body: Vec<u8>, repeat: usize) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            let _ = stream.write_all(head.as_bytes());
            for _ in 0..repeat {
                if stream.write_all(&body).is_err() {
                    break;
                }
            }
        }
    });
    url
}

fn fleet_reply(label: &str, error: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "generatedAt": "2026-12-07T10:00:00Z", "total": 1, "counts": {"Degraded": 1},
        "clusters": [{
            "name": "prod-eu", "fleet": "acme", "labels": {"env": label}, "state": "Degraded",
            "graceSeconds": 90, "channel": "stable", "appliedSerial": 3, "driftTotal": 0,
            "enrolledAt": "2026-12-04T10:00:00Z", "keyid": "k", "sequence": 1, "lastError": error
        }]
    }))
    .expect("json")
}

#[test]
fn text_from_a_server_reaches_the_terminal_escaped_and_replies_are_capped() {
    let title = "prod\u{1b}]0;owned\u{7}";
    let clear = "failed\u{1b}[2J\u{1b}[1;1Hall good";
    let body = fleet_reply(title, clear);
    let url = hostile_server(
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        ),
        body,
        1,
    );
    let out = windvane(&["status", "--server", &url]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        !stdout.contains('\u{1b}') && !stderr.contains('\u{1b}'),
        "{stdout:?} {stderr:?}"
    );
    assert!(!stdout.contains('\u{7}'), "{stdout:?}");
    assert!(stdout.contains("env=prod\\u{1b}]0;owned\\u{7}"), "{stdout}");
    assert!(stdout.contains("failed\\u{1b}[2J"), "{stdout}");

    // An error reply's message too.
    let error = br#"{"error": "denied\u001b[31m red"}"#.to_vec();
    let url = hostile_server(
        format!(
            "HTTP/1.1 403 Forbidden\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            error.len()
        ),
        error,
        1,
    );
    let stderr = fails(&["status", "--server", &url]);
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
    assert!(stderr.contains("denied\\u{1b}[31m red"), "{stderr}");

    // A reply without end: the CLI stops reading at its cap instead of filling memory.
    let url = hostile_server(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n".to_owned(),
        vec![b' '; 1 << 20],
        64,
    );
    let stderr = fails(&["status", "--server", &url]);
    assert!(
        stderr.contains("the reply is larger than 32 MiB; refused"),
        "{stderr}"
    );
    let stderr = fails(&["rollout", "status", "--server", &url, "--channel", "stable"]);
    assert!(
        stderr.contains("the reply is larger than 32 MiB; refused"),
        "{stderr}"
    );
}
