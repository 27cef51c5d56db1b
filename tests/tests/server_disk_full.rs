//! A full disk under the store and under the server's database, with the real binaries. The disk "fills" by
//! lowering the process's file-size limit (`RLIMIT_FSIZE`, set with util-linux's `prlimit`, on a command being
//! started or on the running server): every write past the limit then fails (EFBIG) as it would with ENOSPC,
//! without root, mounts or filling a real filesystem, so it works on any Linux machine. The processes are
//! started with SIGXFSZ ignored (a shell `trap` survives `exec`), as nothing sends that signal on a real full
//! disk. The server's log goes through a pipe, so it is still written while the server cannot write files.
//!
//! - `windvane publish` into a full store fails naming the file, leaves the store byte-identical, and succeeds
//!   once there is room again.
//! - The server answers heartbeats and enrolments 503 while its SQLite database cannot grow, logs why, never
//!   answers 2xx for what it did not store, keeps the database intact, and recovers by itself.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use windvane_shared::wire::status::SyncState;
use windvane_tests::heartbeat_agent::SimulatedAgent;
use windvane_tests::http::{assert_refused, client, get_json};
use windvane_tests::poll::eventually;
use windvane_tests::process::binary;
use windvane_tests::server::{Options, ServerProcess};

const EXAMPLE_FLEET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/examples/fleet");
/// Runs `"$@"` with SIGXFSZ ignored, so that a write past the file-size limit fails instead of killing.
const IGNORE_SIGXFSZ: &str = "trap '' XFSZ; exec \"$@\"";

/// Runs `windvane ARGS`, with every file write limited to `file_size_limit` bytes when given.
fn windvane(file_size_limit: Option<u64>, args: &[&str]) -> Output {
    let mut command = Command::new("sh");
    command.arg("-c").arg(IGNORE_SIGXFSZ).arg("sh");
    if let Some(limit) = file_size_limit {
        command
            .arg("prlimit")
            .arg(format!("--fsize={limit}"))
            .arg("--");
    }
    command
        .arg(binary("windvane").expect("the windvane binary"))
        .args(args)
        .output()
        .expect("run windvane through sh and prlimit (util-linux)")
}

fn ok(args: &[&str]) -> String {
    let out = windvane(None, args);
    assert!(
        out.status.success(),
        "windvane {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every file under `root` with its bytes (directories as empty entries).
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir") {
            let path = entry.expect("entry").path();
            let relative = path.strip_prefix(root).expect("under root").to_path_buf();
            if path.is_dir() {
                out.insert(relative.join(""), Vec::new());
                dirs.push(path);
            } else {
                out.insert(relative, std::fs::read(&path).expect("read file"));
            }
        }
    }
    out
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copy");
        }
    }
}

#[test]
fn publish_into_a_full_store_fails_naming_the_file_and_leaves_it_byte_identical() {
    let work = tempfile::tempdir().expect("tempdir");
    let p = |name: &str| work.path().join(name);
    let s = |path: &Path| path.to_str().expect("utf-8").to_owned();
    ok(&["keygen", "--out", &s(&p("release"))]);
    let key = s(&p("release.key"));
    let root = p("store");
    let publish = |source: &str, limit: Option<u64>| {
        windvane(
            limit,
            &[
                "publish",
                source,
                "--root",
                &s(&root),
                "--channel",
                "stable",
                "--key",
                &key,
            ],
        )
    };
    let first = publish(EXAMPLE_FLEET, None);
    assert!(first.status.success(), "{first:?}");
    let pointer_size = std::fs::metadata(root.join("channels/stable.json"))
        .expect("pointer")
        .len();

    // A changed fleet, so that publishing it writes a new bundle (larger than the pointer).
    let changed = p("fleet");
    copy_tree(Path::new(EXAMPLE_FLEET), &changed);
    let fleet_yaml = changed.join("fleet.yaml");
    let text = std::fs::read_to_string(&fleet_yaml)
        .expect("fleet.yaml")
        .replace("retention: 15d", "retention: 20d");
    std::fs::write(&fleet_yaml, text).expect("write fleet.yaml");

    let before = snapshot(&root);
    // Room for the pointer but not for the bundle: the bundle's write fails.
    let full = publish(&s(&changed), Some(pointer_size + 16));
    let err = String::from_utf8_lossy(&full.stderr);
    assert!(
        !full.status.success(),
        "publish into a full store succeeded"
    );
    assert!(
        err.contains("bundles/.") && err.contains(".json.tmp") && err.contains("File too large"),
        "{err}"
    );
    assert_eq!(snapshot(&root), before, "the store changed: {err}");

    // The bundle already there (the same release again), no room for the pointer: its write fails.
    let full = publish(EXAMPLE_FLEET, Some(16));
    let err = String::from_utf8_lossy(&full.stderr);
    assert!(
        !full.status.success(),
        "publish into a full store succeeded"
    );
    assert!(
        err.contains("channels/.stable.json.tmp") && err.contains("File too large"),
        "{err}"
    );
    assert_eq!(snapshot(&root), before, "the store changed: {err}");

    // Room again: the same publish goes through, and the store verifies.
    let out = publish(&s(&changed), None);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("serial 2"),
        "{out:?}"
    );
    ok(&[
        "verify",
        "--root",
        &s(&root),
        "--channel",
        "stable",
        "--trusted-key",
        &s(&p("release.pub")),
    ]);
}

/// Sets the running process's soft file-size limit (`unlimited` or bytes). Only the soft limit: raising it
/// back up to the (untouched) hard limit needs no privilege.
fn set_file_size_limit(pid: u32, limit: &str) {
    let out = Command::new("prlimit")
        .arg("--pid")
        .arg(pid.to_string())
        .arg(format!("--fsize={limit}:"))
        .output()
        .expect("run prlimit (util-linux)");
    assert!(
        out.status.success(),
        "prlimit --pid {pid} --fsize={limit}: : {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_under_the_database_is_answered_503_and_nothing_acknowledged_is_lost() {
    let mut server = ServerProcess::start(Options {
        wrapper: vec!["sh".into(), "-c".into(), IGNORE_SIGXFSZ.into(), "sh".into()],
        log_through_pipe: true,
        ..Options::default()
    });
    let http = client();
    let mut c1 = SimulatedAgent::new("c1", 1, &[]);
    assert_eq!(c1.enroll(&http, &server.url).await.status(), 201);
    let mut acknowledged = Vec::new();
    for _ in 0..3 {
        c1.beat(&http, &server.url, SyncState::Synced).await;
        acknowledged.push(c1.sequence);
    }

    // The disk fills up.
    set_file_size_limit(server.pid(), "1");
    let mut refused_bodies = Vec::new();
    for _ in 0..5 {
        let hb = c1.next(SyncState::Degraded);
        let body = c1.sign(&hb);
        let message = assert_refused(
            c1.post(&http, &server.url, body.clone()).await,
            503,
            "error",
        )
        .await;
        assert!(
            message.starts_with("cannot store now: database"),
            "{message}"
        );
        refused_bodies.push(body);
    }
    let message = assert_refused(
        SimulatedAgent::new("c2", 2, &[])
            .enroll(&http, &server.url)
            .await,
        503,
        "unavailable",
    )
    .await;
    assert!(message.contains("enroll cluster c2"), "{message}");
    eventually(
        "the log to say why heartbeats are not stored",
        std::time::Duration::from_secs(20),
        || {
            let logs = server.logs();
            async move {
                logs.lines()
                    .any(|l| l.contains("storing heartbeats failed") && l.contains("ERROR"))
                    .then_some(())
            }
        },
    )
    .await;
    // Reads still work meanwhile.
    let detail = get_json(&http, &format!("{}/api/v1/clusters/c1", server.url)).await;
    assert_eq!(detail["cluster"]["sequence"], 3);
    assert_eq!(detail["cluster"]["state"], "Synced");

    // Room again: the server recovers by itself; the very heartbeat it refused is taken now (it was not
    // half-stored), and so is the next.
    set_file_size_limit(server.pid(), "unlimited");
    let retried = c1
        .post(
            &http,
            &server.url,
            refused_bodies.last().expect("refused").clone(),
        )
        .await;
    assert_eq!(retried.status(), 200);
    acknowledged.push(c1.sequence);
    c1.beat(&http, &server.url, SyncState::Synced).await;
    acknowledged.push(c1.sequence);
    assert_eq!(
        SimulatedAgent::new("c2", 2, &[])
            .enroll(&http, &server.url)
            .await
            .status(),
        201
    );

    // After kill -9, the database is intact and holds exactly what was acknowledged.
    server.kill9();
    let conn = rusqlite::Connection::open(server.db_path()).expect("open db");
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity check");
    assert_eq!(check, "ok");
    let mut stored: Vec<u64> = conn
        .prepare("SELECT sequence FROM heartbeat_log WHERE cluster = 'c1' ORDER BY sequence")
        .expect("prepare")
        .query_map([], |r| r.get::<_, i64>(0))
        .expect("query")
        .map(|r| r.expect("row") as u64)
        .collect();
    stored.sort_unstable();
    assert_eq!(stored, acknowledged);
    drop(conn);
    server.restart();
    let detail = get_json(&http, &format!("{}/api/v1/clusters/c1", server.url)).await;
    assert_eq!(
        detail["cluster"]["sequence"],
        *acknowledged.last().expect("some")
    );
}
