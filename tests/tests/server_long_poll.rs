//! Long polls of channel pointers on `windvane-server`, over real HTTP: a poll with `If-None-Match` and
//! `Prefer: wait=N` is held while the pointer is unchanged (a 304 when the wait ends), answered with the new
//! pointer as soon as a publish lands, and every answer says `Preference-Applied`. Many held polls share one
//! watcher; a client that goes away stops counting as held; a server told to stop answers its held polls at
//! once instead of waiting out their wait.

use std::time::{Duration, Instant};

use windvane_tests::http::client;
use windvane_tests::poll::eventually;
use windvane_tests::server::{CHANNEL, Options, ServerProcess, write_store};

async fn held_polls(http: &reqwest::Client, server: &ServerProcess) -> Option<u64> {
    let text = http
        .get(format!("{}/metrics", server.url))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("windvane_held_polls "))
        .and_then(|value| value.trim().parse().ok())
}

fn long_poll(http: &reqwest::Client, url: &str, etag: &str, wait: u64) -> reqwest::RequestBuilder {
    http.get(url)
        .header("if-none-match", etag)
        .header("prefer", format!("wait={wait}"))
}

#[tokio::test]
async fn a_held_poll_answers_when_the_pointer_changes_or_the_wait_ends() {
    let server = ServerProcess::start(Options::default());
    let http = client();
    let url = format!("{}/channels/{CHANNEL}.json", server.url);
    let first = http
        .get(&url)
        .header("prefer", "wait=30")
        .send()
        .await
        .expect("GET");
    assert_eq!(first.status(), 200, "without If-None-Match nothing is held");
    assert_eq!(first.headers()["preference-applied"], "wait=30");
    let etag = first.headers()["etag"].to_str().expect("etag").to_owned();

    // Unchanged: held for the whole wait, then 304.
    let started = Instant::now();
    let unchanged = long_poll(&http, &url, &etag, 2).send().await.expect("GET");
    let held_for = started.elapsed();
    assert_eq!(unchanged.status(), 304);
    assert_eq!(unchanged.headers()["preference-applied"], "wait=2");
    assert!(
        held_for >= Duration::from_millis(1900),
        "the poll was held for its wait, not {held_for:?}"
    );

    // Three agents wait; a publish answers all of them with the new pointer, long before their wait ends.
    let waiting: Vec<_> = (0..3)
        .map(|_| tokio::spawn(long_poll(&http, &url, &etag, 60).send()))
        .collect();
    eventually("three polls held", Duration::from_secs(10), || async {
        (held_polls(&http, &server).await == Some(3)).then_some(())
    })
    .await;
    let published = Instant::now();
    write_store(&server.root(), 5);
    for poll in waiting {
        let answer = poll.await.expect("task").expect("GET");
        assert_eq!(answer.status(), 200);
        assert_ne!(answer.headers()["etag"].to_str().expect("etag"), etag);
        let body = answer.bytes().await.expect("body");
        let on_disk =
            std::fs::read(server.root().join(format!("channels/{CHANNEL}.json"))).expect("read");
        assert_eq!(body.as_ref(), on_disk.as_slice());
    }
    let latency = published.elapsed();
    println!("publish → held polls answered: {latency:?}");
    assert!(
        latency < Duration::from_secs(10),
        "woken by the publish, not by the 60 s wait: {latency:?}"
    );
    assert_eq!(held_polls(&http, &server).await, Some(0));
}

#[tokio::test]
async fn a_client_that_goes_away_is_no_longer_held() {
    let server = ServerProcess::start(Options::default());
    let http = client();
    let url = format!("{}/channels/{CHANNEL}.json", server.url);
    let first = http.get(&url).send().await.expect("GET");
    let etag = first.headers()["etag"].to_str().expect("etag").to_owned();
    let poll = tokio::spawn(long_poll(&http, &url, &etag, 60).send());
    eventually("one poll held", Duration::from_secs(10), || async {
        (held_polls(&http, &server).await == Some(1)).then_some(())
    })
    .await;
    poll.abort();
    eventually(
        "the abandoned poll released",
        Duration::from_secs(10),
        || async { (held_polls(&http, &server).await == Some(0)).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn a_stopping_server_answers_its_held_polls_at_once() {
    let mut server = ServerProcess::start(Options::default());
    let http = client();
    let url = format!("{}/channels/{CHANNEL}.json", server.url);
    let first = http.get(&url).send().await.expect("GET");
    let etag = first.headers()["etag"].to_str().expect("etag").to_owned();
    let poll = tokio::spawn(long_poll(&http, &url, &etag, 120).send());
    eventually("one poll held", Duration::from_secs(10), || async {
        (held_polls(&http, &server).await == Some(1)).then_some(())
    })
    .await;
    let stopping = Instant::now();
    // Before the fix the server waited 10 s for the held poll, then dropped it: the client saw an error.
    assert!(server.stop().await, "the server exits on SIGTERM");
    let answer = poll
        .await
        .expect("task")
        .expect("the held poll gets an answer, not a dropped connection");
    assert_eq!(answer.status(), 304, "the pointer did not change");
    println!("SIGTERM → exited: {:?}", stopping.elapsed());
    assert!(
        !server.logs().contains("did not finish"),
        "no open request outlived the shutdown: {}",
        server.logs()
    );
}
