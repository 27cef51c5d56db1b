//! `windvane status` and `windvane cluster rekey|forget` against a real `windvane-server`: the table, the
//! exit code a pipeline relies on (0 only when every selected cluster is Synced, 1 when one is not, 2 when the
//! command fails: a refused token, a bad selector, a refused admin action), the read token, and the
//! admin actions (authorised by the admin token only; refused by a server without one, which also refuses to
//! start with an admin token that is the registration token or too short).

use std::process::{Command, Output};

use windvane_shared::wire::status::SyncState;
use windvane_tests::heartbeat_agent::SimulatedAgent;
use windvane_tests::http::client;
use windvane_tests::process::binary;
use windvane_tests::server::{Options, ServerProcess, TOKEN};

fn windvane(args: &[&str]) -> Output {
    Command::new(binary("windvane").expect("the windvane binary"))
        .args(args)
        .output()
        .expect("run windvane")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_exits_zero_only_when_every_selected_cluster_is_synced() {
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
    eu.beat(&http, &server.url, SyncState::Synced).await;
    us.beat(&http, &server.url, SyncState::Synced).await;
    stg.beat(&http, &server.url, SyncState::Degraded).await;
    let token = server.dir.join("read-token");
    let token = token.to_str().expect("utf-8");

    let all = windvane(&[
        "status",
        "--server",
        &server.url,
        "--read-token-file",
        token,
    ]);
    assert_eq!(all.status.code(), Some(1), "staging is Degraded");
    let table = stdout(&all);
    assert!(
        table.starts_with("3 clusters: Degraded 1 · Synced 2"),
        "{table}"
    );
    assert!(
        table.contains("staging") && table.contains("Degraded"),
        "{table}"
    );
    assert!(String::from_utf8_lossy(&all.stderr).contains("staging is Degraded"));

    let prod = windvane(&[
        "status",
        "--server",
        &server.url,
        "--selector",
        "env=prod",
        "--read-token-file",
        token,
    ]);
    assert_eq!(prod.status.code(), Some(0), "{}", stdout(&prod));
    assert!(!stdout(&prod).contains("staging"));

    let json = windvane(&[
        "status",
        "--server",
        &server.url,
        "--selector",
        "region in (eu)",
        "--output",
        "json",
        "--read-token-file",
        token,
    ]);
    assert_eq!(json.status.code(), Some(0));
    let parsed: serde_json::Value = serde_json::from_slice(&json.stdout).expect("json");
    assert_eq!(parsed["clusters"][0]["name"], "prod-eu");

    let nothing = windvane(&[
        "status",
        "--server",
        &server.url,
        "--selector",
        "env=dev",
        "--read-token-file",
        token,
    ]);
    assert_eq!(
        nothing.status.code(),
        Some(1),
        "an empty selection is not a pass"
    );

    let unauthorised = windvane(&["status", "--server", &server.url]);
    assert_eq!(unauthorised.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unauthorised.stderr).contains("401"));

    let bad_selector = windvane(&[
        "status",
        "--server",
        &server.url,
        "--selector",
        "env in (",
        "--read-token-file",
        token,
    ]);
    assert_eq!(bad_selector.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad_selector.stderr).contains("selector"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_rekey_and_forget() {
    let server = ServerProcess::start(Options::default());
    let http = client();
    let old = SimulatedAgent::new("edge-7", 1, &[]);
    let new = SimulatedAgent::new("edge-7", 2, &[]);
    assert_eq!(old.enroll(&http, &server.url).await.status(), 201);
    assert_eq!(new.enroll(&http, &server.url).await.status(), 409);
    let token = server.dir.join("admin-token");
    let token = token.to_str().expect("utf-8");
    let registration = server.dir.join("token");
    let registration = registration.to_str().expect("utf-8");

    // The registration token, which every cluster holds, is no admin credential.
    let as_a_cluster = windvane(&[
        "cluster",
        "forget",
        "edge-7",
        "--server",
        &server.url,
        "--admin-token-file",
        registration,
    ]);
    assert_eq!(as_a_cluster.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&as_a_cluster.stderr).contains("401"),
        "{}",
        String::from_utf8_lossy(&as_a_cluster.stderr)
    );
    assert_eq!(
        new.enroll(&http, &server.url).await.status(),
        409,
        "nothing was forgotten"
    );

    let rekey = windvane(&[
        "cluster",
        "rekey",
        "edge-7",
        "--server",
        &server.url,
        "--admin-token-file",
        token,
    ]);
    assert!(
        rekey.status.success(),
        "{}",
        String::from_utf8_lossy(&rekey.stderr)
    );
    assert_eq!(new.enroll(&http, &server.url).await.status(), 200);

    let forget = windvane(&[
        "cluster",
        "forget",
        "edge-7",
        "--server",
        &server.url,
        "--admin-token-file",
        token,
    ]);
    assert!(
        forget.status.success(),
        "{}",
        String::from_utf8_lossy(&forget.stderr)
    );
    assert_eq!(
        http.get(format!("{}/api/v1/clusters/edge-7", server.url))
            .send()
            .await
            .expect("get")
            .status(),
        404
    );

    let again = windvane(&[
        "cluster",
        "forget",
        "edge-7",
        "--server",
        &server.url,
        "--admin-token-file",
        token,
    ]);
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("not enrolled"));

    std::fs::write(server.dir.join("wrong"), "nope").expect("write");
    let wrong = server.dir.join("wrong");
    let denied = windvane(&[
        "cluster",
        "rekey",
        "x",
        "--server",
        &server.url,
        "--admin-token-file",
        wrong.to_str().expect("utf-8"),
    ]);
    assert_eq!(denied.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&denied.stderr).contains("401"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_actions_are_refused_by_a_server_without_an_admin_token() {
    let server = ServerProcess::start(Options {
        no_admin_token: true,
        ..Options::default()
    });
    let http = client();
    assert_eq!(
        SimulatedAgent::new("edge-7", 1, &[])
            .enroll(&http, &server.url)
            .await
            .status(),
        201
    );
    for token in ["admin-token", "token"] {
        let file = server.dir.join(token);
        let refused = windvane(&[
            "cluster",
            "forget",
            "edge-7",
            "--server",
            &server.url,
            "--admin-token-file",
            file.to_str().expect("utf-8"),
        ]);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("403") && stderr.contains("--admin-token-file"),
            "{stderr}"
        );
    }
    assert_eq!(
        http.get(format!("{}/api/v1/clusters/edge-7", server.url))
            .send()
            .await
            .expect("get")
            .status(),
        200,
        "still enrolled"
    );
}

/// Runs `windvane-server serve` with `admin_token` in its admin token file, expecting it to refuse to start;
/// returns its stderr.
fn serve_refused(admin_token: &str) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("root")).expect("root");
    std::fs::write(dir.path().join("token"), format!("{}\n", TOKEN)).expect("token");
    std::fs::write(dir.path().join("admin-token"), admin_token).expect("admin token");
    let mut child = Command::new(binary("windvane-server").expect("windvane-server binary"))
        .arg("serve")
        .arg("--root")
        .arg(dir.path().join("root"))
        .arg("--data")
        .arg(dir.path().join("data"))
        .args(["--listen", "127.0.0.1:0"])
        .arg("--registration-token-file")
        .arg(dir.path().join("token"))
        .arg("--admin-token-file")
        .arg(dir.path().join("admin-token"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start windvane-server");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("windvane-server started with admin token {admin_token:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("stderr");
    assert!(!status.success(), "{stderr}");
    stderr
}

#[test]
fn the_server_refuses_an_admin_token_that_is_the_registration_token_or_too_short() {
    let same = serve_refused(&format!("  {}\n", TOKEN));
    assert!(
        same.contains("the admin token (--admin-token-file) is the registration token"),
        "{same}"
    );
    let short = serve_refused("admin\n");
    assert!(short.contains("admin-token: token too short"), "{short}");
    let empty = serve_refused("\n");
    assert!(empty.contains("admin-token: empty token"), "{empty}");
}
