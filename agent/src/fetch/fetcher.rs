//! The fetcher: a task of its own that polls the channel pointer and fetches new bundles from the store, each
//! request within a total deadline ([`crate::fetch::source`]), verifies what it got and hands it to the engine
//! through a channel. The engine never waits on the network, so a store that accepts and never answers, or
//! trickles a byte at a time, delays only the next release — never drift repair.
//!
//! Verification happens here, before anything parses: the pointer's signature and fields
//! (`release::verify_pointer`), then the bundle's size and digest against the pointer
//! (`release::verify_bundle`). The engine persists a new release as last known good before applying it,
//! and says whether it did, so that a release it could not persist is fetched again.

use std::time::{Duration, Instant};

use jiff::Timestamp;
use tokio::sync::{mpsc, oneshot};
use windvane_shared::crypto::keys::TrustedKeys;
use windvane_shared::format::bundle::{Bundle, BundleLimits};
use windvane_shared::format::release::{self, AcceptedRelease, PointerExpectations};

use crate::backoff::{after_busy, full_jitter, jittered, random_unit};
use crate::fetch::source::{Poll, SourceClient};
use crate::{Error, Result, clamp};

/// The least time between the starts of two polls of a store that holds polls, so that one which claims to
/// but answers at once is still asked at most once a second.
pub const MIN_LONG_POLL_SPACING: Duration = Duration::from_secs(1);

/// How long to wait after the `failures`-th failure in a row (the store unreachable, or a release the engine
/// could not persist), `unit` drawing the jitter: exponential from half an interval up to ten intervals, so
/// that a fleet does not hammer a store that is coming back. Pure.
pub fn failure_wait(failures: u32, interval: Duration, unit: f64) -> Duration {
    full_jitter(failures, interval / 2, interval.saturating_mul(10), unit)
}

/// How long to wait before the next poll of a store that holds polls, after one that took `took`. Pure.
pub fn long_poll_gap(took: Duration) -> Duration {
    MIN_LONG_POLL_SPACING.saturating_sub(took)
}

/// What the fetcher checks a release against.
#[derive(Debug, Clone)]
pub struct FetcherConfig {
    pub trusted: TrustedKeys,
    pub fleet: String,
    pub channel: String,
    pub poll_interval: Duration,
    pub max_pointer_bytes: u64,
    pub max_bundle_bytes: u64,
}

/// What one poll found, for the engine.
#[derive(Debug)]
pub enum Fetched {
    /// `304 Not Modified`: nothing was read or verified; the source is fresh.
    NotModified,
    /// The pointer verified and names the release already enforced (or held for its wave); it may carry a
    /// newer control of it (a halt or resume).
    Current(Box<AcceptedRelease>),
    /// A new release, verified. The engine persists it, then applies it.
    Release(Box<NewRelease>),
    /// The store could not be reached, failed, was busy or passed its deadline: the source is stale.
    Unavailable(Error),
    /// The store served what the checks refuse (signature, fleet, rollback, digest, size cap).
    Refused(Error),
}

/// A verified release on its way to the engine.
#[derive(Debug)]
pub struct NewRelease {
    pub pointer_bytes: Vec<u8>,
    pub bundle_bytes: Vec<u8>,
    pub accepted: AcceptedRelease,
    /// The bundle as parsed while verifying it.
    pub bundle: Bundle,
    /// The engine answers whether it persisted (and so enforces) the release.
    pub taken: oneshot::Sender<bool>,
}

/// Polls until the engine drops the receiver.
#[derive(Debug)]
pub struct Fetcher {
    config: FetcherConfig,
    source: SourceClient,
    /// Serial and digest of the release the engine enforces.
    highest: Option<(u64, String)>,
    failures: u32,
}

impl Fetcher {
    /// A fetcher over `source`, knowing that the engine enforces `highest` (from its last known good).
    pub fn new(
        config: FetcherConfig,
        source: SourceClient,
        highest: Option<(u64, String)>,
    ) -> Self {
        Self {
            config,
            source,
            highest,
            failures: 0,
        }
    }

    /// Starts the fetcher task; its findings arrive on the returned receiver. The task ends when the
    /// receiver is dropped.
    pub fn spawn(self) -> (mpsc::Receiver<Fetched>, tokio::task::JoinHandle<()>) {
        // One finding at a time: the fetcher waits for the engine to take a release before polling again.
        let (tx, rx) = mpsc::channel(1);
        (rx, tokio::spawn(self.run(tx)))
    }

    async fn run(mut self, tx: mpsc::Sender<Fetched>) {
        loop {
            let started = Instant::now();
            let (fetched, taken) = self.poll_once().await;
            let mut wait = self.wait_after(&fetched, started.elapsed());
            let offered = match &fetched {
                Fetched::Release(release) => Some((
                    release.accepted.pointer.serial,
                    release.accepted.pointer.bundle.sha256.clone(),
                )),
                _ => None,
            };
            if tx.send(fetched).await.is_err() {
                return;
            }
            if let (Some(offered), Some(taken)) = (offered, taken) {
                let taken = taken.await.unwrap_or(false);
                if taken {
                    self.highest = Some(offered);
                } else {
                    // Not persisted: read the pointer whole next time, to offer the release again.
                    self.source.forget_etag();
                }
                wait = self.wait_after_offer(taken, wait);
            }
            let until = clamp::after(Instant::now(), wait);
            tokio::select! {
                () = tokio::time::sleep_until(until.into()) => {}
                () = tx.closed() => return,
            }
        }
    }

    /// When to poll next: the interval (jittered) after an answer — or at once when the store holds polls
    /// ([`long_poll_gap`]) — what a busy store asks for (clamped, spread), an exponential backoff while the
    /// store is unreachable. `took` is how long the poll took.
    fn wait_after(&mut self, fetched: &Fetched, took: Duration) -> Duration {
        let interval = self.config.poll_interval;
        match fetched {
            Fetched::Unavailable(Error::SourceBusy { retry_after, .. }) => {
                after_busy(*retry_after, Duration::ZERO, random_unit())
            }
            Fetched::Unavailable(_) => {
                self.failures = self.failures.saturating_add(1);
                failure_wait(self.failures, interval, random_unit())
            }
            // Whether it counts as a failure is known once the engine answers (`wait_after_offer`).
            Fetched::Release(_) => self.next_poll_wait(took),
            _ => {
                self.failures = 0;
                self.next_poll_wait(took)
            }
        }
    }

    /// The wait after a poll that went well: at once (at most once a second) for a store that holds polls,
    /// else the interval, jittered.
    fn next_poll_wait(&self, took: Duration) -> Duration {
        if self.source.holds_polls() {
            long_poll_gap(took)
        } else {
            jittered(self.config.poll_interval, 0.2, random_unit())
        }
    }

    /// The wait after offering a release: `planned` when the engine took it; when it could not persist it, a
    /// backoff as after an unreachable store. Each offer downloads the bundle again, and a store that holds
    /// polls would otherwise be asked within a second, again and again, by every agent whose writes fail.
    fn wait_after_offer(&mut self, taken: bool, planned: Duration) -> Duration {
        if taken {
            self.failures = 0;
            return planned;
        }
        self.failures = self.failures.saturating_add(1);
        failure_wait(self.failures, self.config.poll_interval, random_unit())
    }

    /// One poll: the pointer, and the bundle when the pointer names a new release (with the channel the
    /// engine answers on).
    async fn poll_once(&mut self) -> (Fetched, Option<oneshot::Receiver<bool>>) {
        let pointer_bytes = match self.source.poll_pointer().await {
            Ok(Poll::Unchanged) => return (Fetched::NotModified, None),
            Ok(Poll::Changed(bytes)) => bytes,
            Err(error) => return (self.failed(error), None),
        };
        let accepted = match self.verify_pointer(&pointer_bytes) {
            Ok(accepted) => accepted,
            Err(error) => return (self.failed(error), None),
        };
        if self
            .highest
            .as_ref()
            .is_some_and(|(serial, _)| *serial == accepted.pointer.serial)
        {
            return (Fetched::Current(Box::new(accepted)), None);
        }
        // When the agent first saw a release, apart from when it could apply it: the long-poll tests and an
        // operator timing a publish read this line.
        tracing::info!(
            serial = accepted.pointer.serial,
            "a new release pointer verified; fetching its bundle"
        );
        match self.fetch_bundle(&accepted).await {
            Ok((bundle_bytes, bundle)) => {
                let (taken, answer) = oneshot::channel();
                let release = NewRelease {
                    pointer_bytes,
                    bundle_bytes,
                    accepted,
                    bundle,
                    taken,
                };
                (Fetched::Release(Box::new(release)), Some(answer))
            }
            Err(error) => (self.failed(error), None),
        }
    }

    fn verify_pointer(&self, pointer_bytes: &[u8]) -> Result<AcceptedRelease> {
        let mut expectations = PointerExpectations::new(
            &self.config.trusted,
            &self.config.fleet,
            &self.config.channel,
            Timestamp::now(),
        );
        expectations.highest_accepted = self
            .highest
            .as_ref()
            .map(|(serial, sha)| (*serial, sha.as_str()));
        expectations.max_pointer_bytes = self.config.max_pointer_bytes;
        Ok(release::verify_pointer(pointer_bytes, &expectations)?)
    }

    async fn fetch_bundle(&self, accepted: &AcceptedRelease) -> Result<(Vec<u8>, Bundle)> {
        let bytes = self
            .source
            .fetch_bundle(&accepted.pointer.bundle.sha256)
            .await?;
        let bundle = release::verify_bundle(
            &bytes,
            &accepted.pointer,
            self.config.max_bundle_bytes,
            BundleLimits::default(),
        )?;
        Ok((bytes, bundle))
    }

    /// A failed poll: refused when the store answered with what the checks refuse, else unavailable. Either
    /// way the pointer is read whole next time, even if the store then serves it unchanged.
    fn failed(&mut self, error: Error) -> Fetched {
        self.source.forget_etag();
        if matches!(error, Error::Release(_)) {
            Fetched::Refused(error)
        } else {
            Fetched::Unavailable(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_in_a_row_wait_longer_up_to_ten_intervals() {
        let interval = Duration::from_secs(30);
        let longest: Vec<Duration> = (1..=6).map(|n| failure_wait(n, interval, 1.0)).collect();
        assert_eq!(longest[0], Duration::from_secs(30));
        assert_eq!(longest[1], Duration::from_secs(60));
        assert!(longest.windows(2).all(|w| w[0] <= w[1]), "{longest:?}");
        assert_eq!(longest[5], Duration::from_secs(300));
        assert_eq!(failure_wait(40, interval, 1.0), Duration::from_secs(300));
        assert!(failure_wait(3, interval, 0.0) >= Duration::from_millis(1500));
    }

    #[tokio::test]
    async fn a_release_the_engine_could_not_persist_is_offered_again_only_after_a_backoff() {
        let config = FetcherConfig {
            trusted: TrustedKeys::default(),
            fleet: "fleet".to_owned(),
            channel: "stable".to_owned(),
            poll_interval: Duration::from_secs(30),
            max_pointer_bytes: 1024,
            max_bundle_bytes: 1024,
        };
        let _ = rustls::crypto::ring::default_provider().install_default();
        let source = SourceClient::new("http://127.0.0.1:1", "stable", Default::default())
            .expect("a client");
        let mut fetcher = Fetcher::new(config, source, None);
        let planned = Duration::from_millis(900);
        // Not taken, time after time: the waits are failures', their ceiling doubling (drawn at random
        // below it, never under a twentieth of an interval), not the second a holding store would allow.
        for _ in 0..3 {
            let wait = fetcher.wait_after_offer(false, planned);
            assert!(wait >= Duration::from_millis(1500), "{wait:?}");
        }
        assert_eq!(fetcher.failures, 3);
        // Taken: the planned wait, and the count starts over.
        assert_eq!(fetcher.wait_after_offer(true, planned), planned);
        assert_eq!(fetcher.failures, 0);
    }

    #[test]
    fn a_store_that_holds_polls_is_asked_again_at_once_but_at_most_once_a_second() {
        assert_eq!(long_poll_gap(Duration::from_secs(60)), Duration::ZERO);
        assert_eq!(long_poll_gap(Duration::from_secs(1)), Duration::ZERO);
        assert_eq!(
            long_poll_gap(Duration::from_millis(20)),
            Duration::from_millis(980)
        );
    }
}
