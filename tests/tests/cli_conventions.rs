//! The command line's conventions, on the real binaries: `windvane get` against a real `windvane-server`
//! (tables, JSON and YAML of the server's objects, selectors and states, text from clusters made safe for a
//! terminal), `windvane wait` (exit 0 once met, 1 at its timeout, 2 when nothing can be waited for),
//! `windvane history` on a store with two publishes (verified; an entry signed by another key listed as
//! untrusted), the exit-code rule (2 for a failure), and the generated shell completion and man pages.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

use windvane_shared::wire::heartbeat::{DriftAction, DriftRecord, Heartbeat};
use windvane_shared::wire::status::SyncState;
use windvane_tests::fleet::{FleetTree, Publisher};
use windvane_tests::heartbeat_agent::SimulatedAgent;
use windvane_tests::http::client;
use windvane_tests::process::binary;
use windvane_tests::server::{Options, ServerProcess};

fn windvane(args: &[&str]) -> Output {
    Command::new(binary("windvane").expect("the windvane binary"))
        .args(args)
        .env_remove("WINDVANE_OUTPUT")
        .output()
        .expect("run windvane")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Sends `heartbeat` signed by `agent`, asserting the server stored it.
async fn send(agent: &SimulatedAgent, http: &reqwest::Client, url: &str, heartbeat: &Heartbeat) {
    let response = agent.post(http, url, agent.sign(heartbeat)).await;
    assert_eq!(
        response.status(),
        200,
        "{}",
        response.text().await.unwrap_or_default()
    );
}

/// The next heartbeat of `agent` in `state`, on the server's latest serial (4, `ServerProcess`'s store).
fn on_latest(agent: &mut SimulatedAgent, state: SyncState) -> Heartbeat {
    let mut heartbeat = agent.next(state);
    heartbeat.source.applied_serial = Some(4);
    heartbeat
}

fn drift_record() -> DriftRecord {
    DriftRecord {
        app: "monitoring".to_owned(),
        group: "apps".to_owned(),
        kind: "Deployment".to_owned(),
        namespace: Some("monitoring".to_owned()),
        name: "prometheus".to_owned(),
        fields: vec!["/spec/replicas".to_owned()],
        deleted: false,
        manager: Some("kubectl-scale".to_owned()),
        operation: Some("Update".to_owned()),
        changed_at: None,
        detected_at: jiff::Timestamp::now(),
        reverted_at: None,
        action: DriftAction::Reverted,
        break_glass: None,
        revert_requested_by: None,
    }
}

/// A server with three clusters: prod-eu Synced on the latest serial, prod-us Synced (its last error holds an
/// escape sequence) and staging Degraded with one drift record.
async fn fleet() -> ServerProcess {
    let server = ServerProcess::start(Options {
        read_token: true,
        ..Options::default()
    });
    let http = client();
    let mut eu = SimulatedAgent::new("prod-eu", 1, &[("env", "prod"), ("region", "eu")]);
    let mut us = SimulatedAgent::new("prod-us", 2, &[("env", "prod"), ("region", "us")]);
    let mut stg = SimulatedAgent::new("staging", 3, &[("env", "staging")]);
    for agent in [&eu, &us, &stg] {
        assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
    }
    let heartbeat = on_latest(&mut eu, SyncState::Synced);
    send(&eu, &http, &server.url, &heartbeat).await;
    let mut heartbeat = on_latest(&mut us, SyncState::Synced);
    heartbeat.last_error = Some("retrying\u{1b}]0;pwned\u{7}\u{1b}[2J".to_owned());
    send(&us, &http, &server.url, &heartbeat).await;
    let mut heartbeat = stg.next(SyncState::Degraded);
    heartbeat.drift = vec![drift_record()];
    send(&stg, &http, &server.url, &heartbeat).await;
    server
}

fn read_args(server: &ServerProcess) -> Vec<String> {
    let token = server.dir.join("read-token");
    vec![
        "--server".to_owned(),
        server.url.clone(),
        "--read-token-file".to_owned(),
        token.display().to_string(),
    ]
}

fn get(server: &ServerProcess, args: &[&str]) -> Output {
    let mut all: Vec<&str> = vec!["get"];
    all.extend_from_slice(args);
    let read = read_args(server);
    all.extend(read.iter().map(String::as_str));
    windvane(&all)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_clusters_prints_the_server_s_objects_as_a_table_json_or_yaml() {
    let server = fleet().await;

    let json = get(
        &server,
        &["clusters", "--selector", "env=prod", "-o", "json"],
    );
    assert_eq!(json.status.code(), Some(0), "{}", stderr(&json));
    let parsed: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    let names: Vec<&str> = parsed["clusters"]
        .as_array()
        .expect("the server's clusters list")
        .iter()
        .map(|c| c["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names.len(), 2, "{parsed}");
    assert!(names.contains(&"prod-eu") && names.contains(&"prod-us"));
    let us = parsed["clusters"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "prod-us"))
        .expect("prod-us");
    assert_eq!(
        us["lastError"], "retrying\u{1b}]0;pwned\u{7}\u{1b}[2J",
        "JSON keeps the server's value"
    );
    let body = client()
        .get(format!(
            "{}/api/v1/clusters?selector=env%3Dprod",
            server.url
        ))
        .bearer_auth(
            std::fs::read_to_string(server.dir.join("read-token"))
                .expect("token")
                .trim(),
        )
        .send()
        .await
        .expect("get")
        .bytes()
        .await
        .expect("body");
    let server_view: serde_json::Value = serde_json::from_slice(&body).expect("json");
    // The server's own objects, field for field (but for the heartbeat's age, which ticks between reads).
    let without_age = |view: &serde_json::Value| {
        let mut view = view.clone();
        for cluster in view["clusters"].as_array_mut().expect("clusters") {
            cluster
                .as_object_mut()
                .expect("object")
                .remove("heartbeatAgeSeconds");
        }
        view
    };
    assert_eq!(without_age(&parsed), without_age(&server_view));

    let table = get(&server, &["clusters"]);
    assert_eq!(table.status.code(), Some(0), "{}", stderr(&table));
    let text = stdout(&table);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("CLUSTER   STATE")
            && lines[0].contains("HEARTBEAT")
            && lines[0].ends_with("LAST ERROR"),
        "{text}"
    );
    assert_eq!(lines.len(), 4, "a header and three clusters: {text}");
    assert!(
        lines[1].starts_with("staging ") && lines[1].contains("Degraded"),
        "worst first: {text}"
    );
    // Columns line up: each row's STATE starts where the header's does.
    let state_at = lines[0].find("STATE").expect("STATE");
    for line in &lines[1..] {
        assert!(
            line[state_at..].starts_with(['S', 'D']) && line.as_bytes()[state_at - 1] == b' ',
            "{text}"
        );
    }
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}'),
        "no escape reaches the terminal: {text:?}"
    );
    assert!(text.contains("retrying\\u{1b}]0;pwned\\u{7}"), "{text}");
    assert!(
        !stdout(&json).contains('\u{1b}'),
        "JSON escapes it: {}",
        stdout(&json)
    );

    let yaml = get(
        &server,
        &["clusters", "--state", "degraded", "--output", "yaml"],
    );
    assert_eq!(yaml.status.code(), Some(0), "{}", stderr(&yaml));
    let text = stdout(&yaml);
    assert!(text.starts_with("clusters:\n- name: staging\n"), "{text}");
    assert!(text.contains("  state: Degraded\n"), "{text}");
    assert!(!text.contains("prod-"), "{text}");

    let one = get(&server, &["cluster", "staging"]);
    assert_eq!(one.status.code(), Some(0), "{}", stderr(&one));
    let text = stdout(&one);
    assert!(text.contains("CLUSTER   APP          STATE"), "{text}");
    assert!(
        text.contains("staging   monitoring   Degraded   4"),
        "{text}"
    );

    let apps = get(&server, &["apps", "--state", "Degraded", "-o", "json"]);
    assert_eq!(apps.status.code(), Some(0), "{}", stderr(&apps));
    let parsed: serde_json::Value = serde_json::from_slice(&apps.stdout).expect("JSON");
    assert_eq!(
        parsed["apps"],
        serde_json::json!([{"cluster": "staging", "name": "monitoring", "state": "Degraded", "objects": 4}])
    );

    let drift = get(&server, &["drift", "--since", "1h", "-o", "json"]);
    assert_eq!(drift.status.code(), Some(0), "{}", stderr(&drift));
    let parsed: serde_json::Value = serde_json::from_slice(&drift.stdout).expect("JSON");
    assert_eq!(parsed["drift"][0]["cluster"], "staging", "{parsed}");
    assert_eq!(
        parsed["drift"][0]["record"]["fields"],
        serde_json::json!(["/spec/replicas"])
    );
    let table = stdout(&get(&server, &["drift"]));
    assert!(
        table.contains("staging   monitoring   Deployment monitoring/prometheus   /spec/replicas   Reverted   kubectl-scale"),
        "{table}"
    );
    let prod_only = get(&server, &["drift", "--selector", "env=prod", "-o", "json"]);
    let parsed: serde_json::Value = serde_json::from_slice(&prod_only.stdout).expect("JSON");
    assert_eq!(parsed["drift"], serde_json::json!([]), "{parsed}");

    // The exit-code rule: a failure (no token: 401) and a usage error (a selector that does not parse) are 2.
    let refused = windvane(&["get", "clusters", "--server", &server.url]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(stderr(&refused).contains("401"), "{}", stderr(&refused));
    let bad = get(&server, &["clusters", "--selector", "env in ("]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("--selector"), "{}", stderr(&bad));
    let state = get(&server, &["clusters", "--state", "drifted"]);
    assert_eq!(state.status.code(), Some(2));
    assert!(stderr(&state).contains("NeverSeen"), "{}", stderr(&state));
}

fn wait_args<'a>(read: &'a [String], extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["wait"];
    args.extend(read.iter().map(String::as_str));
    args.extend_from_slice(extra);
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_exits_zero_once_met_and_one_at_its_timeout() {
    let server = fleet().await;
    let read = read_args(&server);

    let met = windvane(&wait_args(
        &read,
        &[
            "--for",
            "synced",
            "--selector",
            "env=prod",
            "--timeout",
            "20s",
        ],
    ));
    assert_eq!(met.status.code(), Some(0), "{}", stderr(&met));
    assert!(
        stdout(&met).contains("condition met: 2 cluster(s) synced"),
        "{}",
        stdout(&met)
    );

    let started = std::time::Instant::now();
    let late = windvane(&wait_args(
        &read,
        &["--for", "healthy", "--timeout", "2s", "--interval", "500ms"],
    ));
    assert_eq!(late.status.code(), Some(1), "{}", stderr(&late));
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert!(
        stderr(&late).contains("timed out after 2s waiting for healthy: staging is Degraded"),
        "{}",
        stderr(&late)
    );

    // A wait that is met while it waits: staging turns Synced on the latest serial.
    let waiting = tokio::process::Command::new(binary("windvane").expect("windvane"))
        .args(wait_args(
            &read,
            &[
                "--for",
                "synced",
                "--selector",
                "env=staging",
                "--timeout",
                "60s",
                "--interval",
                "300ms",
            ],
        ))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn wait");
    // It has read the fleet and said what it waits for before anything changes.
    let mut waiting = waiting;
    let mut lines = BufReader::new(waiting.stderr.take().expect("stderr")).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("wait says what it waits for")
        .expect("read stderr");
    assert_eq!(
        first.as_deref(),
        Some("waiting: staging is Degraded"),
        "{first:?}"
    );
    let http = client();
    let mut stg = SimulatedAgent::new("staging", 3, &[("env", "staging")]);
    // The server knows staging's last sequence: start the re-created agent after it.
    let _ = stg.next(SyncState::Synced);
    let heartbeat = on_latest(&mut stg, SyncState::Synced);
    send(&stg, &http, &server.url, &heartbeat).await;
    let done = tokio::time::timeout(Duration::from_secs(60), waiting.wait_with_output())
        .await
        .expect("wait ends once staging is synced")
        .expect("wait output");
    assert_eq!(done.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&done.stdout),
        "condition met: 1 cluster(s) synced\n"
    );

    let nothing = windvane(&wait_args(
        &read,
        &[
            "--for",
            "synced",
            "--selector",
            "env=dev",
            "--timeout",
            "30s",
        ],
    ));
    assert_eq!(nothing.status.code(), Some(2), "{}", stderr(&nothing));
    assert!(
        stderr(&nothing).contains("no cluster matches"),
        "{}",
        stderr(&nothing)
    );

    // No server answering: read again until the timeout, then the error, exit 2 (not "not met").
    let gone = windvane(&[
        "wait",
        "--server",
        "http://127.0.0.1:9",
        "--for",
        "synced",
        "--timeout",
        "1s",
        "--interval",
        "200ms",
    ]);
    assert_eq!(gone.status.code(), Some(2), "{}", stderr(&gone));
    assert!(
        stderr(&gone).contains("waiting: the server did not answer")
            && stderr(&gone).contains("error: GET http://127.0.0.1:9/api/v1/fleet"),
        "{}",
        stderr(&gone)
    );
}

fn history(store: &Path, trusted: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "history",
        "prod",
        "--root",
        store.to_str().expect("utf-8"),
        "--trusted-key",
        trusted.to_str().expect("utf-8"),
    ];
    args.extend_from_slice(extra);
    windvane(&args)
}

#[test]
fn history_lists_two_publishes_verified_and_an_entry_signed_by_another_key_as_untrusted() {
    let publisher = Publisher::new(11).expect("publisher");
    let tree = FleetTree::example().expect("tree");
    publisher.publish_cli(&tree, "prod").expect("first publish");
    let first_pointer = std::fs::read(publisher.pointer_path("prod")).expect("pointer");
    tree.write(
        "apps/monitoring/settings.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: monitoring\ndata:\n  retention: 7d\n",
    )
    .expect("change the tree");
    publisher
        .publish_cli(&tree, "prod")
        .expect("second publish");
    let store = publisher.store();
    let trusted = publisher.public_key_path();

    let json = history(&store, &trusted, &["-o", "json"]);
    assert_eq!(json.status.code(), Some(0), "{}", stderr(&json));
    let rows: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    let rows = rows.as_array().expect("a list");
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(
        (rows[0]["serial"].as_u64(), rows[1]["serial"].as_u64()),
        (Some(2), Some(1))
    );
    assert!(rows.iter().all(|r| r["trusted"] == true));
    assert_eq!(rows[0]["current"], true);
    assert_eq!(rows[1]["current"], false);
    assert_ne!(rows[0]["bundle"]["sha256"], rows[1]["bundle"]["sha256"]);
    assert_eq!(rows[0]["signer"], rows[1]["signer"]);
    assert!(rows[0]["issuedAt"].is_string() && rows[0]["expiresAt"].is_string());
    let on_disk = std::fs::read_to_string(store.join("channels/prod.json")).expect("pointer");
    assert!(
        on_disk.contains(rows[0]["signer"].as_str().expect("keyid")),
        "the signer is the key id of the signature on the pointer"
    );

    // `verify -o json` names the same signer and serial for the channel's current release.
    let verify = windvane(&[
        "verify",
        "--root",
        store.to_str().expect("utf-8"),
        "--channel",
        "prod",
        "--trusted-key",
        trusted.to_str().expect("utf-8"),
        "-o",
        "json",
    ]);
    assert_eq!(verify.status.code(), Some(0), "{}", stderr(&verify));
    let verified: serde_json::Value = serde_json::from_slice(&verify.stdout).expect("JSON");
    assert_eq!(verified["pointer"]["serial"], 2);
    assert_eq!(verified["pointer"]["bundle"], rows[0]["bundle"]);
    assert_eq!(verified["signer"], rows[0]["signer"]);

    let table = history(&store, &trusted, &[]);
    assert_eq!(table.status.code(), Some(0), "{}", stderr(&table));
    let text = stdout(&table);
    assert!(text.starts_with("SERIAL   BUNDLE         SIGNER"), "{text}");
    assert!(
        text.lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("2 ") && l.ends_with("current")),
        "{text}"
    );

    // The store serving serial 1's pointer again (a replay): said on the current row, exit 1.
    let second_pointer = std::fs::read(publisher.pointer_path("prod")).expect("pointer");
    std::fs::write(publisher.pointer_path("prod"), &first_pointer).expect("replay");
    let replayed = history(&store, &trusted, &[]);
    assert_eq!(replayed.status.code(), Some(1), "{}", stdout(&replayed));
    let text = stdout(&replayed);
    assert!(
        text.lines().nth(2).is_some_and(|l| l.starts_with("1 ")
            && l.ends_with("current, OLDER than the signed history's serial 2")),
        "{text}"
    );
    std::fs::write(publisher.pointer_path("prod"), &second_pointer).expect("restore");

    // Serial 1's entry replaced by one another key signed: listed as untrusted, never as signed; exit 1.
    let other = Publisher::new(12).expect("publisher");
    other.publish_cli(&tree, "prod").expect("other publish");
    std::fs::copy(
        other.store().join("channels/prod.releases/1.json"),
        store.join("channels/prod.releases/1.json"),
    )
    .expect("replace the entry");
    let tampered = history(&store, &trusted, &[]);
    assert_eq!(tampered.status.code(), Some(1), "{}", stdout(&tampered));
    let text = stdout(&tampered);
    let row = text
        .lines()
        .find(|l| l.starts_with("1 "))
        .unwrap_or_else(|| panic!("serial 1 listed: {text}"));
    assert!(row.contains("UNTRUSTED"), "{text}");
    assert!(
        row.contains("1        -              -"),
        "no digest or signer shown: {text}"
    );
    assert!(
        stderr(&tampered).contains("did not verify"),
        "{}",
        stderr(&tampered)
    );
    // Nothing to verify against is a usage error.
    let none = windvane(&["history", "prod", "--root", store.to_str().expect("utf-8")]);
    assert_eq!(none.status.code(), Some(2), "{}", stderr(&none));
}

#[test]
fn completion_and_man_pages_come_from_the_command_definitions() {
    let bash = windvane(&["completion", "bash"]);
    assert_eq!(bash.status.code(), Some(0));
    let script = stdout(&bash);
    assert!(!script.is_empty() && script.contains("history"), "{script}");
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("windvane.bash");
    std::fs::write(&file, &script).expect("write");
    let sourced = Command::new("bash")
        .arg("-c")
        .arg("set -e; source \"$1\"; complete -p windvane")
        .arg("bash")
        .arg(&file)
        .output()
        .expect("run bash");
    assert!(
        sourced.status.success(),
        "bash: {}",
        String::from_utf8_lossy(&sourced.stderr)
    );
    assert!(
        String::from_utf8_lossy(&sourced.stdout).contains("windvane"),
        "{}",
        String::from_utf8_lossy(&sourced.stdout)
    );
    assert!(
        sourced.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&sourced.stderr)
    );
    for shell in ["zsh", "fish"] {
        let out = windvane(&["completion", shell]);
        assert!(out.status.success() && !out.stdout.is_empty(), "{shell}");
    }

    let man = dir.path().join("man");
    let out = windvane(&["man", "--dir", man.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let page = std::fs::read_to_string(man.join("windvane.1")).expect("windvane.1");
    assert!(
        page.starts_with(".ie"),
        "a roff page: {}",
        &page[..page.len().min(200)]
    );
    assert!(
        page.contains("Exit status"),
        "the exit-code rule is in the page"
    );
    let wait = std::fs::read_to_string(man.join("windvane-wait.1")).expect("windvane-wait.1");
    assert!(wait.contains("\\-\\-timeout"), "{wait}");
    assert!(man.join("windvane-get-clusters.1").exists());

    let version = windvane(&["version", "-o", "json"]);
    let parsed: serde_json::Value = serde_json::from_slice(&version.stdout).expect("JSON");
    assert_eq!(parsed["version"], env!("CARGO_PKG_VERSION"));
    assert!(parsed["commit"].as_str().is_some_and(|c| !c.is_empty()));
    assert!(parsed["target"].as_str().is_some_and(|t| t.contains('-')));
    let long = stdout(&windvane(&["--version"]));
    assert!(
        long.starts_with("windvane ") && long.contains("\ncommit: ") && long.contains("\ntarget: "),
        "{long}"
    );
}
