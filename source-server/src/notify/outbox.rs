//! The notification sender: delivers what the notifier queued in the database's outbox (a notification is
//! claimed and its deliveries queued in one transaction, [`crate::notify`]). On several replicas only
//! the one that leads sends ([`Database::lead_notifications`]: a PostgreSQL session advisory lock, taken over
//! by another replica within a tick when the leader's connection ends), so each notification is sent once for
//! the fleet, and a replica that dies with deliveries pending leaves them to the next leader. A delivery taken
//! for an attempt is leased for [`LEASE`]: if its sender dies mid-attempt it is tried again after that, so a
//! receiver may, rarely, see one twice — with the same `id` to dedupe on; it is never lost.
//!
//! What to do after an attempt is pure ([`after_attempt`]); the loop around it is thin.

use std::sync::Arc;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use tokio::sync::Semaphore;

use crate::db::{Database, Db, QueuedDelivery, Settled};
use crate::fleet::metrics::Metrics;
use crate::notify::{Config, MAX_ATTEMPTS, backoff};

/// How often the sender looks for due deliveries (and whether it leads).
pub const TICK: Duration = Duration::from_millis(250);
/// How long a delivery taken for an attempt is not taken again: longer than an attempt can take.
pub const LEASE: Duration = Duration::from_secs(15);
/// Most deliveries taken per tick.
const BATCH: u32 = 64;
/// Most attempts in flight.
const IN_FLIGHT: usize = 32;

/// How one attempt went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    Delivered,
    /// Worth trying again: the network, a 5xx, 408 or 429.
    Retriable,
    /// Refused for good (another 4xx), or no such sink any more.
    Refused,
}

/// What becomes of a delivery after its `attempts`-th attempt (pure).
pub fn after_attempt(attempt: Attempt, attempts: u32, now: Timestamp) -> Settled {
    match attempt {
        Attempt::Delivered => Settled::Delivered,
        Attempt::Retriable if attempts < MAX_ATTEMPTS => {
            let wait = SignedDuration::try_from(backoff(attempts)).unwrap_or(SignedDuration::MAX);
            Settled::RetryAt(now.checked_add(wait).unwrap_or(Timestamp::MAX))
        }
        Attempt::Retriable | Attempt::Refused => Settled::GaveUp,
    }
}

/// The running sender; dropping it stops it (with the notifier that started it).
#[derive(Debug)]
pub struct Sender(tokio::task::JoinHandle<()>);

impl Drop for Sender {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts the sender.
pub fn spawn(
    config: Arc<Config>,
    db: Arc<Db>,
    metrics: Arc<Metrics>,
    client: reqwest::Client,
) -> Sender {
    Sender(tokio::spawn(run(config, db, metrics, client)))
}

/// The sender task: every [`TICK`], while this replica leads, delivers what is due.
async fn run(config: Arc<Config>, db: Arc<Db>, metrics: Arc<Metrics>, client: reqwest::Client) {
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut leading = false;
    loop {
        tick.tick().await;
        let leads = db.lead_notifications().await.unwrap_or_else(|error| {
            tracing::warn!(%error, "cannot tell whether this replica leads the notification sender");
            false
        });
        if leads != leading {
            tracing::info!(leads, "notification sender leadership changed");
            leading = leads;
            metrics.notification_sender_leader.set(i64::from(leads));
        }
        if !leads {
            continue;
        }
        let now = Timestamp::now();
        let lease_until = now
            .checked_add(SignedDuration::try_from(LEASE).unwrap_or_default())
            .unwrap_or(Timestamp::MAX);
        let due = match db.take_due_deliveries(now, lease_until, BATCH).await {
            Ok(due) => due,
            Err(error) => {
                tracing::warn!(%error, "cannot read the notification outbox");
                continue;
            }
        };
        for delivery in due {
            let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
                return;
            };
            let (config, db, metrics, client) = (
                Arc::clone(&config),
                Arc::clone(&db),
                Arc::clone(&metrics),
                client.clone(),
            );
            tokio::spawn(async move {
                let _permit = permit;
                send(&config, &db, &metrics, &client, delivery).await;
            });
        }
    }
}

/// One attempt at one delivery, and what it settles to.
async fn send(
    config: &Config,
    db: &Db,
    metrics: &Metrics,
    client: &reqwest::Client,
    delivery: QueuedDelivery,
) {
    let attempt = match config.sinks.iter().find(|s| s.name == delivery.sink) {
        Some(sink) => attempt(client, &sink.url, &delivery).await,
        None => {
            tracing::warn!(sink = %delivery.sink, id = %delivery.notification_id, "no such sink in the configuration any more; dropping the delivery");
            Attempt::Refused
        }
    };
    let now = Timestamp::now();
    let settled = after_attempt(attempt, delivery.attempts, now);
    match settled {
        Settled::Delivered => {
            metrics.notification("sent");
        }
        Settled::GaveUp => {
            metrics.notification("failed");
            tracing::error!(sink = %delivery.sink, id = %delivery.notification_id, attempts = delivery.attempts, "notification not delivered");
        }
        Settled::RetryAt(_) => {}
    }
    if let Err(error) = db.settle_delivery(delivery.id, settled, now).await {
        tracing::warn!(%error, id = %delivery.notification_id, "cannot record a delivery; it will be tried again after its lease");
    }
}

async fn attempt(client: &reqwest::Client, url: &str, delivery: &QueuedDelivery) -> Attempt {
    let result = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(delivery.body.clone())
        .send()
        .await;
    let (sink, id, attempt) = (&delivery.sink, &delivery.notification_id, delivery.attempts);
    match result {
        Ok(response) if response.status().is_success() => Attempt::Delivered,
        Ok(response) => {
            let status = response.status();
            tracing::warn!(%sink, %id, %status, attempt, "notification refused");
            let retriable = status.is_server_error()
                || status == reqwest::StatusCode::TOO_MANY_REQUESTS
                || status == reqwest::StatusCode::REQUEST_TIMEOUT;
            if retriable {
                Attempt::Retriable
            } else {
                Attempt::Refused
            }
        }
        Err(error) => {
            tracing::warn!(%sink, %id, %error, attempt, "notification failed");
            Attempt::Retriable
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deliveries_are_retried_with_backoff_until_the_last_attempt() {
        let now: Timestamp = "2026-12-04T12:00:00Z".parse().expect("time");
        assert_eq!(
            after_attempt(Attempt::Delivered, 1, now),
            Settled::Delivered
        );
        assert_eq!(
            after_attempt(Attempt::Retriable, 1, now),
            Settled::RetryAt(now + SignedDuration::from_millis(500))
        );
        assert_eq!(
            after_attempt(Attempt::Retriable, 3, now),
            Settled::RetryAt(now + SignedDuration::from_secs(2))
        );
        assert_eq!(
            after_attempt(Attempt::Retriable, MAX_ATTEMPTS, now),
            Settled::GaveUp,
            "the last attempt"
        );
        assert_eq!(after_attempt(Attempt::Refused, 1, now), Settled::GaveUp);
    }
}
