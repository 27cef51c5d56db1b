//! The fleet page in real headless Chromium (Debian's `chromium`): a fleet with clusters in every kind of
//! state is rendered by a real `windvane-server`; the DOM Chromium builds shows the counts per state (Unknown
//! apart from Synced), the cluster page shows apps, problems and the drift log, the console has no errors,
//! and screenshots are kept under `target/artifacts/` for people to look at.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use windvane_shared::wire::heartbeat::{DriftAction, DriftRecord};
use windvane_shared::wire::status::SyncState;
use windvane_tests::heartbeat_agent::SimulatedAgent;
use windvane_tests::http::{client, get_json};
use windvane_tests::poll::eventually;
use windvane_tests::server::{Options, ServerProcess};

fn artifacts() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = target.join("artifacts");
    std::fs::create_dir_all(&dir).expect("artifacts dir");
    dir
}

/// Runs headless Chromium on `url` with `extra` flags; returns (stdout, stderr). Fails the test if Chromium
/// is missing or does not finish in time.
fn chromium(url: &str, extra: &[&str]) -> (String, String) {
    let profile = tempfile::tempdir().expect("profile dir");
    let mut child = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-default-apps",
            "--no-first-run",
            "--no-default-browser-check",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1440,1000",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run chromium (install Debian's `chromium` package): {e}")
        });
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if start.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            panic!("chromium did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().expect("output");
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Console errors Chromium logged for the page.
fn console_errors(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| {
            l.contains("Uncaught")
                || (l.contains("CONSOLE") && (l.contains("ERROR") || l.contains("error")))
                || l.contains("Refused to")
        })
        .collect()
}

fn count_in_dom(dom: &str, state: &str) -> Option<u64> {
    let start = dom.find(&format!("id=\"count-{state}\""))?;
    let rest = &dom[start..];
    let n = rest.find("class=\"n\">")? + "class=\"n\">".len();
    rest[n..].split('<').next()?.trim().parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_page_renders_in_chromium_with_counts_and_no_console_errors() {
    let server = ServerProcess::start(Options::default());
    let http = client();
    let mut fleet = vec![
        (
            SimulatedAgent::new("prod-eu-1", 1, &[("env", "prod"), ("region", "eu")]),
            Some(SyncState::Synced),
        ),
        (
            SimulatedAgent::new("prod-eu-2", 2, &[("env", "prod"), ("region", "eu")]),
            Some(SyncState::Synced),
        ),
        (
            SimulatedAgent::new("prod-us-1", 3, &[("env", "prod"), ("region", "us")]),
            Some(SyncState::Degraded),
        ),
        (
            SimulatedAgent::new("prod-us-2", 4, &[("env", "prod"), ("region", "us")]),
            Some(SyncState::OutOfSync),
        ),
        (
            SimulatedAgent::new("staging-1", 5, &[("env", "staging")]),
            Some(SyncState::Progressing),
        ),
        (
            SimulatedAgent::new("edge-lost", 6, &[("env", "edge")]),
            Some(SyncState::Synced),
        ),
        (SimulatedAgent::new("edge-new", 7, &[("env", "edge")]), None),
    ];
    for (agent, state) in &mut fleet {
        assert_eq!(agent.enroll(&http, &server.url).await.status(), 201);
        if agent.name == "edge-lost" {
            agent.interval_seconds = 1; // goes Unknown 3 s after its last heartbeat
        }
        let Some(state) = *state else { continue };
        let mut hb = agent.next(state);
        if state == SyncState::OutOfSync {
            let now = Timestamp::now();
            hb.drift = vec![DriftRecord {
                app: "monitoring".into(),
                group: "apps".into(),
                kind: "Deployment".into(),
                namespace: Some("monitoring".into()),
                name: "prometheus".into(),
                fields: vec!["/spec/template/spec/containers/0/securityContext/privileged".into()],
                deleted: false,
                manager: Some("kubectl-edit".into()),
                operation: Some("Update".into()),
                changed_at: Some(
                    now.checked_sub(jiff::SignedDuration::from_millis(1500))
                        .expect("time"),
                ),
                detected_at: now,
                reverted_at: None,
                action: DriftAction::Reported,
                break_glass: None,
                revert_requested_by: None,
            }];
            hb.last_error = Some(
                "drift on Deployment monitoring/prometheus held for review <not reverted>".into(),
            );
        }
        assert_eq!(
            agent
                .post(&http, &server.url, agent.sign(&hb))
                .await
                .status(),
            200
        );
    }
    let url = format!("{}/api/v1/clusters/edge-lost", server.url);
    eventually("edge-lost to turn Unknown", Duration::from_secs(20), || {
        let (http, url) = (http.clone(), url.clone());
        async move { (get_json(&http, &url).await["cluster"]["state"] == "Unknown").then_some(()) }
    })
    .await;

    let page = format!("{}/", server.url);
    let dir = artifacts();
    let shot = dir.join("fleet-page.png");
    let _ = std::fs::remove_file(&shot);
    let (_, stderr) = chromium(&page, &[&format!("--screenshot={}", shot.display())]);
    let png = std::fs::read(&shot)
        .unwrap_or_else(|e| panic!("no screenshot at {}: {e}\n{stderr}", shot.display()));
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "a real screenshot"
    );
    assert!(
        console_errors(&stderr).is_empty(),
        "console errors: {:?}",
        console_errors(&stderr)
    );

    let (dom, stderr) = chromium(&page, &["--dump-dom"]);
    assert!(
        console_errors(&stderr).is_empty(),
        "console errors: {:?}",
        console_errors(&stderr)
    );
    for (state, expected) in [
        ("Synced", 2),
        ("Degraded", 1),
        ("OutOfSync", 1),
        ("Progressing", 1),
        ("Unknown", 1),
        ("NeverSeen", 1),
        ("Failed", 0),
        ("total", 7),
    ] {
        assert_eq!(
            count_in_dom(&dom, state),
            Some(expected),
            "count of {state} in the DOM"
        );
    }
    assert!(
        dom.contains("last reported Synced"),
        "Unknown shows the last reported state"
    );
    assert!(
        dom.contains("&lt;not reverted&gt;"),
        "cluster text is escaped"
    );
    assert!(dom.contains("3 / 4"), "applied vs latest serial");

    // Filters are plain links: the selector narrows the counts too.
    let (filtered, _) = chromium(
        &format!("{}/?selector=region%3Deu", server.url),
        &["--dump-dom"],
    );
    assert_eq!(count_in_dom(&filtered, "Synced"), Some(2));
    assert_eq!(count_in_dom(&filtered, "total"), Some(2));
    assert!(!filtered.contains("prod-us-1"));

    // The cluster page: apps, problems, drift audit log with who and latency.
    let cluster_shot = dir.join("cluster-page.png");
    let cluster = format!("{}/clusters/prod-us-2", server.url);
    let (_, stderr) = chromium(
        &cluster,
        &[&format!("--screenshot={}", cluster_shot.display())],
    );
    assert!(
        console_errors(&stderr).is_empty(),
        "console errors: {:?}",
        console_errors(&stderr)
    );
    let (dom, _) = chromium(&cluster, &["--dump-dom"]);
    for needle in [
        "id=\"apps\"",
        "id=\"problems\"",
        "id=\"drift\"",
        "kubectl-edit (Update)",
        "securityContext/privileged",
        "critical",
        "1.5s",
    ] {
        assert!(dom.contains(needle), "cluster page lacks {needle:?}");
    }
}
