//! Polling with a deadline, the one way tests wait for a condition: [`wait_for`] returns an error at the
//! deadline (for `anyhow` tests and tools), [`eventually`] panics (for tests that assert). And [`scenario`],
//! which runs one named step of a long end-to-end test and says how long it took.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::anyhow;

/// How often [`wait_for`] checks: conditions on a Kubernetes API or a real agent, where a check costs requests.
pub const WAIT_FOR_INTERVAL: Duration = Duration::from_millis(100);
/// How often [`eventually`] checks: conditions on one local server, where a check is cheap.
pub const EVENTUALLY_INTERVAL: Duration = Duration::from_millis(25);

/// Polls `check` until it returns `Some`, failing after `timeout`. `check` runs right away and then every
/// [`WAIT_FOR_INTERVAL`]; an `Err` from it is remembered (the condition may not hold yet, e.g. an object not
/// created yet) and reported if the deadline passes.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    poll(what, timeout, WAIT_FOR_INTERVAL, check).await
}

/// Polls `check` until it returns `Some`, every [`EVENTUALLY_INTERVAL`], or panics with `what` at the deadline.
pub async fn eventually<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let checked = poll(what, deadline, EVENTUALLY_INTERVAL, || {
        let pending = check();
        async move { Ok(pending.await) }
    });
    checked.await.unwrap_or_else(|error| panic!("{error:#}"))
}

/// Polls `check` every `interval` until it returns `Some` or `timeout` has passed.
pub async fn poll<T, F, Fut>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    mut check: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if Instant::now() >= deadline {
            return Err(match last_err {
                Some(e) => e.context(format!("timed out after {timeout:?} waiting for {what}")),
                None => anyhow!("timed out after {timeout:?} waiting for {what}"),
            });
        }
        tokio::time::sleep(interval).await;
    }
}

/// Runs one scenario of a long end-to-end test: prints when it starts and how it ended after how long, and
/// names it in any error.
pub async fn scenario<T>(
    name: &str,
    future: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    use anyhow::Context;
    let started = Instant::now();
    eprintln!("scenario {name}: started");
    let result = future.await.with_context(|| format!("scenario {name}"));
    eprintln!(
        "scenario {name}: {} after {:.1}s",
        if result.is_ok() { "passed" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    result
}
