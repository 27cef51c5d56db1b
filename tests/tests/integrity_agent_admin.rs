//! The agent's admin server (`/livez`, `/readyz`, `/status`, `/metrics`) against anonymous clients (issue 42,
//! item 17), with the real `windvane-agent` on a localkube: it listens on loopback unless told otherwise,
//! holds at most 32 connections (a new one closes the oldest, so a probe always gets in), and closes a
//! connection whose client does not send its headers within 5 s.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use windvane_tests::fleet::{Agent, AgentOptions, Publisher};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::process::{ChildProcess, binary};

/// The agent's connection cap and header timeout (agent/src/report/admin.rs).
const MAX_CONNECTIONS: usize = 32;
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether the peer closed the connection (a read would return end of file, or fails).
fn closed(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match stream.try_read(&mut byte) {
        Ok(_) => true,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

async fn livez(admin: SocketAddr) -> anyhow::Result<u16> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()?;
    Ok(http
        .get(format!("http://{admin}/livez"))
        .send()
        .await?
        .status()
        .as_u16())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_server_listens_on_loopback_unless_told_otherwise() -> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(71)?;
    let log = kube.data_dir().join("agent-default-admin.log");
    // No --admin-listen: the default address. The source is unreachable; the admin server runs regardless.
    let args: Vec<String> = [
        "run",
        "--source",
        "http://127.0.0.1:9",
        "--channel",
        "stable",
        "--fleet",
        "acme",
        "--cluster",
        "c1",
        "--trusted-key",
        &publisher.public_key_path().display().to_string(),
        "--kubeconfig",
        &kube.kubeconfig_path().display().to_string(),
    ]
    .map(str::to_owned)
    .to_vec();
    let agent = ChildProcess::start(
        "windvane-agent",
        &binary("windvane-agent")?,
        &args,
        &[("WINDVANE_LOG", "info")],
        &log,
    )?;
    let loopback: SocketAddr = "127.0.0.1:8481".parse()?;
    wait_for(
        "the admin server on 127.0.0.1:8481",
        Duration::from_secs(60),
        || async { Ok((livez(loopback).await.ok() == Some(200)).then_some(())) },
    )
    .await
    .map_err(|e| {
        anyhow::anyhow!(
            "{e:#}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    })?;
    // Another address of this host (in this network namespace, one on the loopback interface): nothing
    // listens there, where an agent listening on every address would answer.
    let elsewhere: SocketAddr = "127.0.0.2:8481".parse()?;
    let reached = TcpStream::connect(elsewhere).await;
    assert!(
        reached.is_err(),
        "the admin server answered on {elsewhere}: it listens beyond loopback"
    );
    let text = std::fs::read_to_string(&log)?;
    assert!(
        text.contains("admin server listening on loopback only"),
        "the start-up line says so:\n{text}"
    );
    drop(agent);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_capped_and_silent_clients_timed_out_while_probes_get_in()
-> anyhow::Result<()> {
    let kube = LocalKube::start().await?;
    let publisher = Publisher::new(72)?;
    let options = AgentOptions::new("http://127.0.0.1:9", &publisher.public_key_path(), "c1");
    let agent = Agent::start(&kube, &options).await?;
    let admin = agent.admin;
    wait_for("the admin server", Duration::from_secs(60), || async {
        Ok((livez(admin).await.ok() == Some(200)).then_some(()))
    })
    .await?;

    // Clients that connect and say nothing, more than the cap, and one that trickles its headers.
    let opened = Instant::now();
    let mut silent = Vec::new();
    for _ in 0..MAX_CONNECTIONS + 8 {
        silent.push(TcpStream::connect(admin).await?);
    }
    let mut trickler = TcpStream::connect(admin).await?;
    trickler
        .write_all(b"GET /livez HTTP/1.1\r\nHost: agent\r\nX-Slow: ")
        .await?;

    // The oldest make room at once (no waiting for the header timeout), and a probe is served.
    let evicted = wait_for(
        "the oldest connections closed to stay within the cap",
        HEADER_READ_TIMEOUT / 2,
        || {
            let n = silent.iter().filter(|s| closed(s)).count();
            async move { Ok((n >= 9).then_some(n)) }
        },
    )
    .await?;
    assert!(
        silent[..9].iter().all(closed),
        "the oldest went first ({evicted} closed)"
    );
    assert_eq!(livez(admin).await?, 200, "a probe gets in");
    assert!(
        opened.elapsed() < HEADER_READ_TIMEOUT,
        "{:?}",
        opened.elapsed()
    );

    // Silent and trickling clients are closed by the header timeout, each within it (and some slack).
    let deadline = HEADER_READ_TIMEOUT * 3;
    let mut pace = tokio::time::interval(Duration::from_millis(200));
    while !closed(&trickler) {
        assert!(
            opened.elapsed() < deadline,
            "a client trickling its headers kept its connection for {deadline:?}"
        );
        pace.tick().await;
        if trickler.write_all(b"a").await.is_err() {
            break;
        }
    }
    wait_for(
        "every silent connection closed by the header timeout",
        deadline.saturating_sub(opened.elapsed()),
        || {
            let all = silent.iter().all(closed);
            async move { Ok(all.then_some(())) }
        },
    )
    .await?;
    assert_eq!(livez(admin).await?, 200);
    eprintln!(
        "{evicted} oldest closed at once; every silent or trickling client closed within {:?}",
        opened.elapsed()
    );
    drop(agent);
    Ok(())
}
