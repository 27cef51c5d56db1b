//! The `windvane` release command line, run as a user runs it: keygen, build, publish, verify and render
//! through the real binary, against a store in a temporary directory. Also: a failed publish leaves the store
//! byte-identical, and keys made by openssl work.

mod common;

use common::{fails, ok, windvane};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

const EXAMPLE_FLEET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/examples/fleet");

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// Every file under `root` with its bytes, to compare a store before and after.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries {
            let entry = entry.unwrap();
            let p = entry.path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            if p.is_dir() {
                out.insert(rel.join(""), Vec::new());
                walk(&p, root, out);
            } else {
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

struct Workspace {
    dir: TempDir,
}

impl Workspace {
    fn new() -> Self {
        Self {
            dir: TempDir::new().unwrap(),
        }
    }
    fn p(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn keygen(&self, name: &str) -> (PathBuf, PathBuf) {
        ok(&["keygen", "--out", path(&self.p(name))]);
        (
            self.p(&format!("{name}.key")),
            self.p(&format!("{name}.pub")),
        )
    }
}

#[test]
fn keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites() {
    use std::os::unix::fs::PermissionsExt;
    let ws = Workspace::new();
    let (key, public) = ws.keygen("release");
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(
        std::fs::read_to_string(&key)
            .unwrap()
            .starts_with("-----BEGIN PRIVATE KEY-----")
    );
    assert!(
        std::fs::read_to_string(&public)
            .unwrap()
            .starts_with("-----BEGIN PUBLIC KEY-----")
    );
    let before = std::fs::read(&key).unwrap();
    let err = fails(&["keygen", "--out", path(&ws.p("release"))]);
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(std::fs::read(&key).unwrap(), before);
}

#[test]
fn publish_verify_render_round_trip() {
    let ws = Workspace::new();
    let (key, public) = ws.keygen("release");
    let root = ws.p("store");
    let built = ws.p("bundle.json");
    let out = ok(&["build", EXAMPLE_FLEET, "-o", path(&built)]);
    assert!(out.contains("fleet acme, 2 apps"), "{out}");

    let out = ok(&[
        "publish",
        EXAMPLE_FLEET,
        "--root",
        path(&root),
        "--channel",
        "stable",
        "--key",
        path(&key),
    ]);
    assert!(out.contains("serial 1 (first release)"), "{out}");
    // Publishing the built bundle gives the same digest: a tree and its build are the same release.
    let out = ok(&[
        "publish",
        path(&built),
        "--root",
        path(&root),
        "--channel",
        "stable",
        "--key",
        path(&key),
    ]);
    assert!(
        out.contains("serial 2 (was 1)") && out.contains("already in the store"),
        "{out}"
    );

    let out = ok(&[
        "verify",
        "--root",
        path(&root),
        "--channel",
        "stable",
        "--trusted-key",
        path(&public),
    ]);
    assert!(out.contains("fleet acme channel stable"), "{out}");
    assert!(out.contains("serial:   2"), "{out}");
    assert!(
        out.contains("monitoring") && out.contains("env=prod"),
        "{out}"
    );

    let render = |cluster: &str, labels: &[&str]| {
        let mut args = vec![
            "render",
            "--root",
            path(&root),
            "--channel",
            "stable",
            "--trusted-key",
            path(&public),
        ];
        args.extend(["--cluster", cluster]);
        for label in labels {
            args.extend(["--label", label]);
        }
        ok(&args)
    };
    let eu = render("prod-eu", &["env=prod", "region=eu"]);
    assert!(
        eu.contains("# app: monitoring (apps/monitoring/prometheus.yaml document 1)"),
        "{eu}"
    );
    assert!(
        eu.contains("--storage.tsdb.retention.time=30d"),
        "EU customization applies: {eu}"
    );
    assert!(eu.contains("cluster: prod-eu"), "{eu}");
    assert!(
        eu.contains("  minReplicas: 3\n"),
        "typed values for prod: {eu}"
    );
    assert!(
        eu.contains("windvane.io/app: api"),
        "labels as applied: {eu}"
    );
    assert!(
        !eu.contains("  replicas: 3\n"),
        "the HPA's field is not sent: {eu}"
    );
    let us = render("prod-us", &["env=prod", "region=us"]);
    assert!(us.contains("--storage.tsdb.retention.time=15d"), "{us}");
    let staging = render("staging-eu", &["env=staging", "region=eu"]);
    assert!(
        !staging.contains("app: monitoring"),
        "monitoring is prod only: {staging}"
    );
    assert!(
        staging.contains("  minReplicas: 1\n") && staging.contains("LOG_LEVEL: debug"),
        "{staging}"
    );

    // Rendering the source tree directly gives the same stream as rendering the published release.
    let direct = ok(&[
        "render",
        EXAMPLE_FLEET,
        "--cluster",
        "prod-eu",
        "--label",
        "env=prod",
        "--label",
        "region=eu",
    ]);
    assert_eq!(direct, eu);
}

#[test]
fn verify_refuses_with_one_line_reason() {
    let ws = Workspace::new();
    let (key, _public) = ws.keygen("release");
    let (_other_key, other_public) = ws.keygen("other");
    let root = ws.p("store");
    ok(&[
        "publish",
        EXAMPLE_FLEET,
        "--root",
        path(&root),
        "--channel",
        "stable",
        "--key",
        path(&key),
    ]);

    let err = fails(&[
        "verify",
        "--root",
        path(&root),
        "--channel",
        "stable",
        "--trusted-key",
        path(&other_public),
    ]);
    assert!(err.contains("unknown key"), "{err}");
    let err = fails(&[
        "verify",
        "--root",
        path(&root),
        "--channel",
        "beta",
        "--trusted-key",
        path(&other_public),
    ]);
    assert!(
        err.contains("no release published on channel \"beta\""),
        "{err}"
    );

    ok(&[
        "publish",
        EXAMPLE_FLEET,
        "--root",
        path(&root),
        "--channel",
        "frozen",
        "--key",
        path(&key),
        "--expires-in",
        "1ms",
    ]);
    let (_, public) = (key.clone(), ws.p("release.pub"));
    let err = fails(&[
        "verify",
        "--root",
        path(&root),
        "--channel",
        "frozen",
        "--trusted-key",
        path(&public),
    ]);
    assert!(err.contains("expired"), "{err}");
    let err = fails(&[
        "verify",
        "--root",
        path(&root),
        "--channel",
        "stable",
        "--trusted-key",
        path(&public),
        "--fleet",
        "other",
    ]);
    assert!(
        err.contains("fleet \"acme\"") && err.contains("\"other\""),
        "{err}"
    );
}

#[test]
fn a_failed_publish_leaves_the_store_byte_identical() {
    let ws = Workspace::new();
    let (key, _) = ws.keygen("release");
    let (intruder, _) = ws.keygen("intruder");
    let root = ws.p("store");
    ok(&[
        "publish",
        EXAMPLE_FLEET,
        "--root",
        path(&root),
        "--channel",
        "stable",
        "--key",
        path(&key),
    ]);
    let before = snapshot(&root);

    // A changed fleet, so that a publish would write a new bundle.
    let changed = ws.p("fleet");
    copy_tree(Path::new(EXAMPLE_FLEET), &changed);
    let fleet_yaml = changed.join("fleet.yaml");
    let text = std::fs::read_to_string(&fleet_yaml)
        .unwrap()
        .replace("retention: 15d", "retention: 20d");
    std::fs::write(&fleet_yaml, text).unwrap();

    // Another key cannot take over the channel.
    let err = fails(&[
        "publish",
        path(&changed),
        "--root",
        path(&root),
        "--channel",
        "stable",
        "--key",
        path(&intruder),
    ]);
    assert!(err.contains("refusing to publish over it"), "{err}");
    assert_eq!(snapshot(&root), before);

    // A failure after the bundle was written (the pointer's temporary file cannot be created) is undone.
    let blocker = root.join("channels/.stable.json.tmp");
    std::fs::create_dir(&blocker).unwrap();
    let before = snapshot(&root);
    let err = fails(&[
        "publish",
        path(&changed),
        "--root",
        path(&root),
        "--channel",
        "stable",
        "--key",
        path(&key),
    ]);
    assert!(err.contains(".stable.json.tmp"), "{err}");
    assert_eq!(snapshot(&root), before);
    std::fs::remove_dir(&blocker).unwrap();

    // An empty release needs to be asked for.
    let empty = ws.p("empty");
    std::fs::create_dir_all(empty.join("apps/none")).unwrap();
    std::fs::write(
        empty.join("fleet.yaml"),
        "fleet: acme\napps:\n  - name: none\n    path: apps/none\n",
    )
    .unwrap();
    let before = snapshot(&root);
    let err = fails(&[
        "publish",
        path(&empty),
        "--root",
        path(&root),
        "--channel",
        "stable",
        "--key",
        path(&key),
    ]);
    assert!(err.contains("--allow-empty"), "{err}");
    assert_eq!(snapshot(&root), before);
    let out = ok(&[
        "publish",
        path(&empty),
        "--root",
        path(&root),
        "--channel",
        "stable",
        "--key",
        path(&key),
        "--allow-empty",
    ]);
    assert!(out.contains("serial 2"), "{out}");
}

#[test]
fn build_names_the_file_and_document_of_a_bad_manifest() {
    let ws = Workspace::new();
    let fleet = ws.p("fleet");
    copy_tree(Path::new(EXAMPLE_FLEET), &fleet);
    std::fs::write(
        fleet.join("apps/api/extra.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ok\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: s\ndata:\n  mode: 0644\n",
    )
    .unwrap();
    let out_file = ws.p("bundle.json");
    // A YAML 1.1 form is refused, naming file, line and the two readings, only with --strict.
    let err = fails(&["build", "--strict", path(&fleet), "-o", path(&out_file)]);
    assert!(
        err.contains("apps/api/extra.yaml:11:9") && err.contains("0644") && err.contains("420"),
        "{err}"
    );
    assert!(!out_file.exists(), "nothing written on failure");
    // Without it the file is read as kubectl reads it (420), with a warning naming the same place.
    let out = windvane(&["build", path(&fleet), "-o", path(&out_file)]);
    let warned = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{warned}");
    assert!(
        warned.contains("warning: apps/api/extra.yaml:11:9") && warned.contains("420"),
        "{warned}"
    );
    std::fs::remove_file(&out_file).unwrap();

    std::fs::write(
        fleet.join("apps/api/extra.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n",
    )
    .unwrap();
    let err = fails(&["build", path(&fleet), "-o", path(&out_file)]);
    assert!(
        err.contains("apps/api/extra.yaml document 0") && err.contains("metadata.name"),
        "{err}"
    );
}

#[test]
fn openssl_keys_sign_and_verify_releases() {
    let ws = Workspace::new();
    let key = ws.p("ossl.key");
    let public = ws.p("ossl.pub");
    let openssl = |args: &[&str]| {
        let status = Command::new("openssl")
            .args(args)
            .status()
            .expect("openssl must be installed (apt-get install openssl)");
        assert!(status.success(), "openssl {args:?}");
    };
    openssl(&["genpkey", "-algorithm", "ed25519", "-out", path(&key)]);
    openssl(&["pkey", "-in", path(&key), "-pubout", "-out", path(&public)]);
    let root = ws.p("store");
    ok(&[
        "publish",
        EXAMPLE_FLEET,
        "--root",
        path(&root),
        "--channel",
        "stable",
        "--key",
        path(&key),
    ]);
    ok(&[
        "verify",
        "--root",
        path(&root),
        "--channel",
        "stable",
        "--trusted-key",
        path(&public),
    ]);
}

#[test]
fn key_rotation_trusts_the_new_key_before_signing_with_it() {
    let ws = Workspace::new();
    let (old_key, old_public) = ws.keygen("old");
    let (new_key, new_public) = ws.keygen("new");
    let root = ws.p("store");
    ok(&[
        "publish",
        EXAMPLE_FLEET,
        "--root",
        path(&root),
        "--channel",
        "stable",
        "--key",
        path(&old_key),
    ]);
    // Agents trust both keys; the publisher signs with the new one, naming the old one for the current pointer.
    ok(&[
        "publish",
        EXAMPLE_FLEET,
        "--root",
        path(&root),
        "--channel",
        "stable",
        "--key",
        path(&new_key),
        "--trusted-key",
        path(&old_public),
    ]);
    let both = format!("{},{}", path(&old_public), path(&new_public));
    let out = ok(&[
        "verify",
        "--root",
        path(&root),
        "--channel",
        "stable",
        "--trusted-key",
        &both,
    ]);
    assert!(out.contains("serial:   2"), "{out}");
    let err = fails(&[
        "verify",
        "--root",
        path(&root),
        "--channel",
        "stable",
        "--trusted-key",
        path(&old_public),
    ]);
    assert!(err.contains("unknown key"), "{err}");
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The last line of a failed run's stderr: the one error line (a build may print warnings before it).
fn error_line(stderr: &str) -> &str {
    let line = stderr.lines().last().unwrap_or_default();
    assert!(line.starts_with("error: "), "{stderr}");
    line
}

#[test]
fn a_failure_names_its_step_flag_and_file_and_each_cause_once() {
    let ws = Workspace::new();
    let (key, public) = ws.keygen("release");
    let junk = ws.p("junk.pem");
    std::fs::write(&junk, "not a key\n").unwrap();
    let root = ws.p("store");
    let publish = |key: &Path| {
        windvane(&[
            "publish",
            EXAMPLE_FLEET,
            "--root",
            path(&root),
            "--channel",
            "stable",
            "--key",
            path(key),
        ])
    };

    let out = publish(&junk);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let line = error_line(&err);
    assert!(
        line.starts_with("error: the signing key (--key): ") && line.contains("junk.pem"),
        "{line}"
    );
    assert!(publish(&key).status.success());

    let verify = |trusted: &Path| {
        fails(&[
            "verify",
            "--root",
            path(&root),
            "--channel",
            "stable",
            "--trusted-key",
            &format!("{},{}", path(&public), path(trusted)),
        ])
    };
    let err = verify(&junk);
    let line = error_line(&err);
    assert!(
        line.starts_with("error: a trusted key (--trusted-key): ") && line.contains("junk.pem"),
        "{line}"
    );
    let missing = ws.p("missing.pub");
    let err = verify(&missing);
    let line = error_line(&err);
    assert!(line.contains("missing.pub"), "{line}");
    assert_eq!(
        line.matches("No such file").count(),
        1,
        "the cause once: {line}"
    );

    // An empty token file is refused before anything is sent, whichever verb reads it.
    let empty = ws.p("empty-token");
    std::fs::write(&empty, "\n").unwrap();
    for verb in [
        &["status"][..],
        &["rollout", "status", "--channel", "stable"],
    ] {
        let mut run = verb.to_vec();
        run.extend([
            "--server",
            "http://127.0.0.1:9",
            "--read-token-file",
            path(&empty),
        ]);
        let err = fails(&run);
        assert!(
            error_line(&err).ends_with("empty-token: empty token"),
            "{verb:?}: {err}"
        );
    }
}
