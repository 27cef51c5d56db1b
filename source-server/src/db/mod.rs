//! The server's database behind one trait ([`Database`]): enrolled clusters and their keys, the last
//! heartbeat of each, a log of accepted heartbeats, the drift audit log, and the notification dedup keys.
//! [`sqlite::SqliteDb`] is the embedded default (one file under `--data`); [`postgres::PostgresDb`] serves
//! several replicas (`--database-url`); [`Db`] is whichever was configured.
//!
//! Data comes from the enrolment and heartbeat handlers (already verified: this layer checks only what needs
//! the stored state — key binding and sequence order — with the pure [`decide_enroll`] and
//! [`check_sequence`]; notification claims per alert episode with [`decide_episode`]) and goes to the page,
//! the API, `/metrics` and the notifier. Both backends run the same statements, written once in `sql`
//! (SQLite's `?N` placeholders, turned into PostgreSQL's `$N`), and read their rows through the same mapping,
//! `rows`; each backend keeps only its driver's calls, transactions and locks.
//! Heartbeats are written in batches ([`Database::ingest`]): one transaction per batch, and each heartbeat
//! is answered only after the transaction that holds it has committed, so every 2xx survives a crash.

pub mod postgres;
mod rows;
mod sql;
pub mod sqlite;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use jiff::Timestamp;
use windvane_shared::wire::heartbeat::Heartbeat;
use windvane_shared::wire::status::SyncState;

use crate::Result;

/// How long the heartbeat log keeps rows (the latest heartbeat of each cluster is kept for ever).
pub const HEARTBEAT_LOG_RETENTION: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// An enrolment, checked by the handler (token, names, key), to be bound.
#[derive(Debug, Clone)]
pub struct Enrollment {
    pub cluster: String,
    pub fleet: String,
    pub keyid: String,
    pub public_key_pem: String,
    pub labels: BTreeMap<String, String>,
    pub at: Timestamp,
}

/// What is stored about an enrolled cluster's binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub fleet: String,
    pub keyid: String,
    /// Until when an admin's rekey lets the next enrolment bind a new key ([`Database::allow_rekey`]).
    pub rekey_until: Option<Timestamp>,
}

/// The stored `rekey_allowed` column as a deadline: it holds the milliseconds until which a rekey is allowed,
/// 0 when none is. A database written before rekeys expired holds 1 for an allowed rekey: that reads as a
/// deadline long past, so a permission granted then and never used is void.
pub(crate) fn rekey_deadline(ms: i64) -> Option<Timestamp> {
    (ms != 0).then(|| from_ms(ms))
}

pub use windvane_shared::wire::fleet_api::DriftEntry;
pub use windvane_shared::wire::heartbeat::EnrollOutcome;

pub use crate::http::auth::RecentFailures;

/// Decides an enrolment at `now` from the stored binding (pure): a rekey allowed until `now` or earlier is
/// no longer allowed.
pub fn decide_enroll(
    existing: Option<&Binding>,
    fleet: &str,
    keyid: &str,
    now: Timestamp,
) -> EnrollOutcome {
    let rekey_allowed = |b: &Binding| b.rekey_until.is_some_and(|until| until > now);
    match existing {
        None => EnrollOutcome::Enrolled,
        Some(b) if b.fleet != fleet && !rekey_allowed(b) => EnrollOutcome::FleetConflict,
        Some(b) if b.keyid == keyid && b.fleet == fleet => EnrollOutcome::AlreadyEnrolled,
        Some(b) if rekey_allowed(b) => EnrollOutcome::Rekeyed,
        Some(_) => EnrollOutcome::KeyConflict,
    }
}

/// A heartbeat whose signature, names and clock have been checked, waiting for its batch.
#[derive(Debug, Clone)]
pub struct VerifiedHeartbeat {
    /// The key id that signed it (the bound key when verification happened).
    pub keyid: String,
    pub received_at: Timestamp,
    pub heartbeat: Heartbeat,
    /// The payload exactly as signed (JSON), stored as the cluster's latest report.
    pub payload: String,
}

/// What the stored state says about one heartbeat of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IngestOutcome {
    /// Stored; `previous` is the state reported before it.
    Accepted { previous: Option<SyncState> },
    /// The cluster is not (or no longer) enrolled.
    UnknownCluster,
    /// The cluster's key changed since the signature was checked (rekeyed or forgotten meanwhile).
    KeyChanged,
    /// The sequence is not above the last one stored.
    Replay { last: u64 },
}

/// What the stored row needs to judge a heartbeat's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceState {
    pub keyid: String,
    pub last_sequence: u64,
}

/// Decides whether a verified heartbeat may be stored over the current row (pure).
pub fn check_sequence(
    current: Option<&SequenceState>,
    keyid: &str,
    sequence: u64,
) -> Option<IngestOutcome> {
    match current {
        None => Some(IngestOutcome::UnknownCluster),
        Some(c) if c.keyid != keyid => Some(IngestOutcome::KeyChanged),
        Some(c) if sequence <= c.last_sequence => Some(IngestOutcome::Replay {
            last: c.last_sequence,
        }),
        Some(_) => None,
    }
}

/// How a notification relates to its cluster's alert episode: an episode opens when the cluster enters an
/// alerting state and closes when it recovers (Synced again); each trigger notifies at most once per
/// episode and release serial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpisodeClaim {
    /// Entering an alerting state: within the open episode, or opening the next one.
    Open,
    /// Within the current episode, without opening one (critical drift).
    Within,
    /// Recovery: closes the open episode; nothing to claim when none is open.
    Close,
}

/// A notification's delivery to one sink, queued in the database with its claim (the outbox): whichever replica
/// leads the sender delivers it, so a replica that dies with deliveries pending leaves them to the next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDelivery {
    pub notification_id: String,
    pub sink: String,
    /// The request body, as the sink's kind wants it.
    pub body: String,
}

/// A delivery taken from the outbox for an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedDelivery {
    pub id: i64,
    pub notification_id: String,
    pub sink: String,
    pub body: String,
    /// Attempts so far, this one included.
    pub attempts: u32,
}

/// What became of a delivery attempt, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Try again at this time.
    RetryAt(Timestamp),
    Delivered,
    GaveUp,
}

impl Settled {
    /// The `done` column and the next attempt's time in milliseconds.
    pub(crate) fn columns(self, now: Timestamp) -> (i64, i64) {
        match self {
            Settled::RetryAt(at) => (0, at.as_millisecond()),
            Settled::Delivered => (1, now.as_millisecond()),
            Settled::GaveUp => (2, now.as_millisecond()),
        }
    }
}

/// A cluster's current alert episode as stored: its number (0: it never had one) and whether it is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Episode {
    pub number: u64,
    pub open: bool,
}

/// Decides a claim against the stored episode (pure): the episode number to claim the notification under and
/// the episode to store, or `None` when there is nothing to claim (a recovery without an open episode).
pub fn decide_episode(current: Episode, claim: EpisodeClaim) -> Option<(u64, Episode)> {
    match claim {
        EpisodeClaim::Open if current.open => Some((current.number, current)),
        EpisodeClaim::Open => {
            let next = Episode {
                number: current.number.saturating_add(1),
                open: true,
            };
            Some((next.number, next))
        }
        EpisodeClaim::Within => Some((current.number, current)),
        EpisodeClaim::Close if current.open => Some((
            current.number,
            Episode {
                number: current.number,
                open: false,
            },
        )),
        EpisodeClaim::Close => None,
    }
}

/// The dedup key of a trigger in an episode, as stored with the serial. The first episode (and the time before
/// any) uses the bare trigger key, which is also what claims stored before episodes existed hold, so an
/// upgrade does not repeat them.
pub fn episode_key(trigger_key: &str, episode: u64) -> String {
    if episode <= 1 {
        trigger_key.to_owned()
    } else {
        format!("{trigger_key}#{episode}")
    }
}

/// One row of the fleet table: what is known about an enrolled cluster, without its full report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSummary {
    pub name: String,
    pub fleet: String,
    pub keyid: String,
    pub labels: BTreeMap<String, String>,
    pub enrolled_at: Timestamp,
    /// Until when an admin's rekey is allowed (possibly past); `None` when none was allowed since the last
    /// enrolment or good heartbeat.
    pub rekey_allowed_until: Option<Timestamp>,
    pub last_sequence: u64,
    pub last_seen: Option<Timestamp>,
    pub interval_seconds: Option<u64>,
    pub state: Option<SyncState>,
    pub channel: Option<String>,
    pub applied_serial: Option<u64>,
    pub last_error: Option<String>,
    pub drift_total: u64,
    /// The bound key (SPKI PEM), for the cluster's age recipient.
    pub public_key: String,
}

/// The database operations the server needs, on any backend. Every method is one transaction.
pub trait Database: Send + Sync + 'static {
    /// Binds (or re-binds, or refuses) a cluster's key per [`decide_enroll`].
    fn enroll(&self, enrollment: Enrollment) -> impl Future<Output = Result<EnrollOutcome>> + Send;
    /// The bound key of a cluster: `(fleet, keyid, public key PEM)`.
    fn cluster_key(
        &self,
        cluster: &str,
    ) -> impl Future<Output = Result<Option<(String, String, String)>>> + Send;
    /// Stores a batch of verified heartbeats in one transaction, each judged by [`check_sequence`] in order;
    /// returns one outcome per heartbeat. Only committed heartbeats are `Accepted`.
    fn ingest(
        &self,
        batch: Arc<[VerifiedHeartbeat]>,
    ) -> impl Future<Output = Result<Vec<IngestOutcome>>> + Send;
    /// Every enrolled cluster, by name.
    fn list_clusters(&self) -> impl Future<Output = Result<Vec<ClusterSummary>>> + Send;
    /// The latest report (the signed payload as stored) of each cluster that reported a release it holds
    /// for later (`source.pending`): `(name, payload)`.
    fn waiting_reports(&self) -> impl Future<Output = Result<Vec<(String, String)>>> + Send;
    /// One cluster and its latest report (the signed payload as stored).
    fn get_cluster(
        &self,
        cluster: &str,
    ) -> impl Future<Output = Result<Option<(ClusterSummary, Option<String>)>>> + Send;
    /// Drift entries, newest first, optionally for one cluster and detected at or after `since`; a page of
    /// `limit` after skipping `offset`.
    fn drift(
        &self,
        cluster: Option<&str>,
        since: Option<Timestamp>,
        limit: u32,
        offset: u64,
    ) -> impl Future<Output = Result<Vec<DriftEntry>>> + Send;
    /// Deletes drift log rows detected before `before` (the drift retention).
    fn prune_drift(&self, before: Timestamp) -> impl Future<Output = Result<u64>> + Send;
    /// Lets an enrolment of `cluster` before `until` bind a new key; the permission ends then, or with the
    /// next heartbeat the bound key signs ([`Database::ingest`]), whichever comes first. False when the cluster
    /// is not enrolled.
    fn allow_rekey(
        &self,
        cluster: &str,
        until: Timestamp,
    ) -> impl Future<Output = Result<bool>> + Send;
    /// Removes a cluster and everything stored about it. False when it was not enrolled.
    fn forget(&self, cluster: &str) -> impl Future<Output = Result<bool>> + Send;
    /// Claims the notification `(cluster, trigger, serial)` in the cluster's alert episode, moving the episode as
    /// [`decide_episode`] says, in one transaction: the episode number the first time only (across restarts
    /// and replicas), so each is sent once per episode.
    ///
    /// The deliveries `deliveries(episode)` returns are queued in the outbox in the same transaction, so a claimed
    /// notification is never lost between claiming and sending.
    fn claim_notification(
        &self,
        cluster: &str,
        trigger: &str,
        serial: u64,
        at: Timestamp,
        claim: EpisodeClaim,
        deliveries: impl FnOnce(u64) -> Vec<NewDelivery> + Send + 'static,
    ) -> impl Future<Output = Result<Option<u64>>> + Send;
    /// Takes up to `limit` deliveries due at `now` for an attempt, each leased until `lease_until`.
    fn take_due_deliveries(
        &self,
        now: Timestamp,
        lease_until: Timestamp,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<QueuedDelivery>>> + Send;
    /// Records what became of an attempt.
    fn settle_delivery(
        &self,
        id: i64,
        settled: Settled,
        now: Timestamp,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Whether this replica leads the notification sender now (takes the lead when nobody holds it). SQLite
    /// has one server, which always leads; on PostgreSQL a session advisory lock decides, released when
    /// the leader's connection ends.
    fn lead_notifications(&self) -> impl Future<Output = Result<bool>> + Send;
    /// The clusters whose alert episode is open (a restarted notifier's memory of who is alerting).
    fn open_episodes(&self) -> impl Future<Output = Result<Vec<String>>> + Send;
    /// Heartbeats in the log, for one cluster or all.
    fn heartbeat_count(&self, cluster: Option<&str>) -> impl Future<Output = Result<u64>> + Send;
    /// Deletes heartbeat log rows received before `before`.
    fn prune(&self, before: Timestamp) -> impl Future<Output = Result<u64>> + Send;
    /// Records a wrong token offered from `address` (shared by every replica's limiter).
    fn record_token_failure(
        &self,
        address: &str,
        at: Timestamp,
    ) -> impl Future<Output = Result<()>> + Send;
    /// The wrong tokens offered from `address` after `since`.
    fn recent_token_failures(
        &self,
        address: &str,
        since: Timestamp,
    ) -> impl Future<Output = Result<RecentFailures>> + Send;
    /// Forgets wrong tokens offered at or before `before`; returns how many.
    fn prune_token_failures(&self, before: Timestamp) -> impl Future<Output = Result<u64>> + Send;
    /// A trivial query: whether the database answers (`/readyz`).
    fn ping(&self) -> impl Future<Output = Result<()>> + Send;
}

/// The configured backend.
#[derive(Debug)]
pub enum Db {
    Sqlite(sqlite::SqliteDb),
    Postgres(Box<postgres::PostgresDb>),
}

macro_rules! delegate {
    ($self:ident, $db:ident => $call:expr) => {
        match $self {
            Db::Sqlite($db) => $call.await,
            Db::Postgres($db) => $call.await,
        }
    };
}

impl Database for Db {
    async fn enroll(&self, enrollment: Enrollment) -> Result<EnrollOutcome> {
        delegate!(self, db => db.enroll(enrollment))
    }
    async fn cluster_key(&self, cluster: &str) -> Result<Option<(String, String, String)>> {
        delegate!(self, db => db.cluster_key(cluster))
    }
    async fn ingest(&self, batch: Arc<[VerifiedHeartbeat]>) -> Result<Vec<IngestOutcome>> {
        delegate!(self, db => db.ingest(batch))
    }
    async fn list_clusters(&self) -> Result<Vec<ClusterSummary>> {
        delegate!(self, db => db.list_clusters())
    }
    async fn waiting_reports(&self) -> Result<Vec<(String, String)>> {
        delegate!(self, db => db.waiting_reports())
    }
    async fn get_cluster(&self, cluster: &str) -> Result<Option<(ClusterSummary, Option<String>)>> {
        delegate!(self, db => db.get_cluster(cluster))
    }
    async fn drift(
        &self,
        cluster: Option<&str>,
        since: Option<Timestamp>,
        limit: u32,
        offset: u64,
    ) -> Result<Vec<DriftEntry>> {
        delegate!(self, db => db.drift(cluster, since, limit, offset))
    }
    async fn prune_drift(&self, before: Timestamp) -> Result<u64> {
        delegate!(self, db => db.prune_drift(before))
    }
    async fn allow_rekey(&self, cluster: &str, until: Timestamp) -> Result<bool> {
        delegate!(self, db => db.allow_rekey(cluster, until))
    }
    async fn forget(&self, cluster: &str) -> Result<bool> {
        delegate!(self, db => db.forget(cluster))
    }
    async fn claim_notification(
        &self,
        cluster: &str,
        trigger: &str,
        serial: u64,
        at: Timestamp,
        claim: EpisodeClaim,
        deliveries: impl FnOnce(u64) -> Vec<NewDelivery> + Send + 'static,
    ) -> Result<Option<u64>> {
        delegate!(self, db => db.claim_notification(cluster, trigger, serial, at, claim, deliveries))
    }
    async fn take_due_deliveries(
        &self,
        now: Timestamp,
        lease_until: Timestamp,
        limit: u32,
    ) -> Result<Vec<QueuedDelivery>> {
        delegate!(self, db => db.take_due_deliveries(now, lease_until, limit))
    }
    async fn settle_delivery(&self, id: i64, settled: Settled, now: Timestamp) -> Result<()> {
        delegate!(self, db => db.settle_delivery(id, settled, now))
    }
    async fn lead_notifications(&self) -> Result<bool> {
        delegate!(self, db => db.lead_notifications())
    }
    async fn open_episodes(&self) -> Result<Vec<String>> {
        delegate!(self, db => db.open_episodes())
    }
    async fn heartbeat_count(&self, cluster: Option<&str>) -> Result<u64> {
        delegate!(self, db => db.heartbeat_count(cluster))
    }
    async fn record_token_failure(&self, address: &str, at: Timestamp) -> Result<()> {
        delegate!(self, db => db.record_token_failure(address, at))
    }
    async fn recent_token_failures(
        &self,
        address: &str,
        since: Timestamp,
    ) -> Result<RecentFailures> {
        delegate!(self, db => db.recent_token_failures(address, since))
    }
    async fn prune_token_failures(&self, before: Timestamp) -> Result<u64> {
        delegate!(self, db => db.prune_token_failures(before))
    }
    async fn prune(&self, before: Timestamp) -> Result<u64> {
        delegate!(self, db => db.prune(before))
    }
    async fn ping(&self) -> Result<()> {
        delegate!(self, db => db.ping())
    }
}

/// The summary columns a heartbeat sets on its cluster's row.
#[derive(Debug, Clone)]
pub(crate) struct RowUpdate {
    pub labels_json: String,
    pub state: &'static str,
    pub interval_seconds: i64,
    pub channel: String,
    pub applied_serial: Option<i64>,
    pub last_error: Option<String>,
    pub drift_count: i64,
    pub received_ms: i64,
    pub sequence: i64,
}

impl RowUpdate {
    pub(crate) fn of(hb: &VerifiedHeartbeat) -> RowUpdate {
        let h = &hb.heartbeat;
        RowUpdate {
            labels_json: serde_json::to_string(&h.labels).unwrap_or_else(|_| "{}".to_owned()),
            state: h.state.as_str(),
            interval_seconds: to_i64(h.interval_seconds),
            channel: h.source.channel.clone(),
            applied_serial: h.source.applied_serial.map(to_i64),
            last_error: h.last_error.clone(),
            drift_count: to_i64(h.drift.len() as u64),
            received_ms: hb.received_at.as_millisecond(),
            sequence: to_i64(h.sequence),
        }
    }
}

pub(crate) fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

pub(crate) fn to_u64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

pub(crate) fn from_ms(ms: i64) -> Timestamp {
    Timestamp::from_millisecond(ms).unwrap_or(Timestamp::UNIX_EPOCH)
}

pub(crate) fn labels_from_json(text: &str) -> BTreeMap<String, String> {
    serde_json::from_str(text).unwrap_or_default()
}

/// The schema, in SQL both backends accept (`{serial}` is the auto-increment key type, `{log_id}` the heartbeat
/// log's row id: ascending in the order rows were stored).
///
/// The heartbeat log has no index but its row id: every accepted heartbeat appends one row, and an index on
/// the cluster would cost each heartbeat a write at a random place in the file (a third of the I/O per heartbeat,
/// measured). Pruning walks it in id order ([`id_ranges`]); it is read by cluster only by `forget` and tests.
pub(crate) fn schema(serial: &str, log_id: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS clusters (
            name TEXT PRIMARY KEY,
            fleet TEXT NOT NULL,
            keyid TEXT NOT NULL,
            public_key TEXT NOT NULL,
            labels TEXT NOT NULL,
            enrolled_ms BIGINT NOT NULL,
            rekey_allowed BIGINT NOT NULL DEFAULT 0, -- until when (ms), 0: not allowed
            last_sequence BIGINT NOT NULL DEFAULT 0,
            last_seen_ms BIGINT,
            interval_seconds BIGINT,
            state TEXT,
            channel TEXT,
            applied_serial BIGINT,
            last_error TEXT,
            drift_total BIGINT NOT NULL DEFAULT 0,
            heartbeat TEXT
        );
        CREATE TABLE IF NOT EXISTS heartbeat_log (
            id {log_id},
            cluster TEXT NOT NULL,
            sequence BIGINT NOT NULL,
            received_ms BIGINT NOT NULL,
            state TEXT NOT NULL
        );
        CREATE TABLE IF NOT EXISTS drift (
            id {serial},
            cluster TEXT NOT NULL,
            sequence BIGINT NOT NULL,
            received_ms BIGINT NOT NULL,
            detected_ms BIGINT NOT NULL,
            record TEXT NOT NULL
        );
        CREATE INDEX IF NOT EXISTS drift_cluster_detected ON drift (cluster, detected_ms);
        CREATE INDEX IF NOT EXISTS drift_detected ON drift (detected_ms);
        CREATE TABLE IF NOT EXISTS notifications (
            cluster TEXT NOT NULL,
            trigger_key TEXT NOT NULL,
            serial BIGINT NOT NULL,
            sent_ms BIGINT NOT NULL,
            PRIMARY KEY (cluster, trigger_key, serial)
        );
        CREATE TABLE IF NOT EXISTS alert_episodes (
            cluster TEXT PRIMARY KEY,
            episode BIGINT NOT NULL,
            open BIGINT NOT NULL
        );
        CREATE TABLE IF NOT EXISTS outbox (
            id {serial},
            notification_id TEXT NOT NULL,
            sink TEXT NOT NULL,
            body TEXT NOT NULL,
            queued_ms BIGINT NOT NULL,
            attempts BIGINT NOT NULL,
            next_attempt_ms BIGINT NOT NULL,
            done BIGINT NOT NULL
        );
        CREATE INDEX IF NOT EXISTS outbox_due ON outbox (done, next_attempt_ms);
        CREATE TABLE IF NOT EXISTS token_failures (
            address TEXT NOT NULL,
            at_ms BIGINT NOT NULL
        );
        CREATE INDEX IF NOT EXISTS token_failures_address ON token_failures (address, at_ms);"
    )
}

/// Moves the rows of the heartbeat log's first layout (table `heartbeats`, indexed by cluster) into
/// `heartbeat_log`, oldest first, and drops it; run once, in one transaction, when `heartbeats` exists.
pub(crate) const MIGRATE_HEARTBEAT_LOG: &str = "INSERT INTO heartbeat_log (cluster, sequence, received_ms, state) \
     SELECT cluster, sequence, received_ms, state FROM heartbeats ORDER BY received_ms; \
     DROP TABLE heartbeats;";

/// Heartbeat log rows are deleted this many ids at a time, one transaction each, so that heartbeats keep
/// being stored between them (a fleet of 300,000 clusters logs 36 million rows an hour).
pub(crate) const LOG_DELETE_CHUNK: i64 = 20_000;

/// The id ranges `[from, to)` covering `first..end`, `chunk` ids each (the last one shorter).
pub(crate) fn id_ranges(first: i64, end: i64, chunk: i64) -> impl Iterator<Item = (i64, i64)> {
    let chunk = chunk.max(1);
    std::iter::successors((first < end).then_some(first), move |from| {
        from.checked_add(chunk).filter(|next| *next < end)
    })
    .map(move |from| (from, from.saturating_add(chunk).min(end)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(fleet: &str, keyid: &str, rekey_until: Option<Timestamp>) -> Binding {
        Binding {
            fleet: fleet.into(),
            keyid: keyid.into(),
            rekey_until,
        }
    }

    #[test]
    fn id_ranges_cover_the_span_in_chunks() {
        assert_eq!(
            id_ranges(1, 8, 3).collect::<Vec<_>>(),
            vec![(1, 4), (4, 7), (7, 8)]
        );
        assert_eq!(id_ranges(5, 5, 3).count(), 0);
        assert_eq!(id_ranges(9, 5, 3).count(), 0);
        assert_eq!(id_ranges(0, 6, 3).collect::<Vec<_>>(), vec![(0, 3), (3, 6)]);
        assert_eq!(
            id_ranges(i64::MAX - 2, i64::MAX, 5).collect::<Vec<_>>(),
            vec![(i64::MAX - 2, i64::MAX)]
        );
    }

    #[test]
    fn enrolment_binds_once_and_rebinds_only_while_a_rekey_is_allowed() {
        let now: Timestamp = "2026-12-07T12:00:00Z".parse().expect("time");
        let later = Some(now + jiff::SignedDuration::from_mins(30));
        let past = Some(now - jiff::SignedDuration::from_secs(1));
        let decide = |b: Binding, fleet, keyid| decide_enroll(Some(&b), fleet, keyid, now);
        assert_eq!(
            decide_enroll(None, "acme", "k1", now),
            EnrollOutcome::Enrolled
        );
        assert_eq!(
            decide(binding("acme", "k1", None), "acme", "k1"),
            EnrollOutcome::AlreadyEnrolled
        );
        assert_eq!(
            decide(binding("acme", "k1", None), "acme", "k2"),
            EnrollOutcome::KeyConflict
        );
        assert_eq!(
            decide(binding("acme", "k1", later), "acme", "k2"),
            EnrollOutcome::Rekeyed
        );
        assert_eq!(
            decide(binding("acme", "k1", None), "other", "k1"),
            EnrollOutcome::FleetConflict
        );
        assert_eq!(
            decide(binding("acme", "k1", later), "other", "k2"),
            EnrollOutcome::Rekeyed
        );
        assert_eq!(
            decide(binding("acme", "k1", past), "acme", "k2"),
            EnrollOutcome::KeyConflict,
            "an expired rekey allows nothing"
        );
        assert_eq!(
            decide(binding("acme", "k1", Some(now)), "other", "k2"),
            EnrollOutcome::FleetConflict,
            "it ends at its deadline"
        );
        assert_eq!(
            decide(binding("acme", "k1", rekey_deadline(1)), "acme", "k2"),
            EnrollOutcome::KeyConflict,
            "a permission stored before rekeys expired (1) is void"
        );
        assert_eq!(rekey_deadline(0), None);
    }

    #[test]
    fn alerts_are_claimed_once_per_episode_and_a_recovery_starts_the_next() {
        use EpisodeClaim::*;
        let never = Episode::default();
        let open = |number| Episode { number, open: true };
        let closed = |number| Episode {
            number,
            open: false,
        };
        assert_eq!(decide_episode(never, Open), Some((1, open(1))));
        assert_eq!(
            decide_episode(open(1), Open),
            Some((1, open(1))),
            "entering another state, or the same again, stays in the episode"
        );
        assert_eq!(decide_episode(open(1), Close), Some((1, closed(1))));
        assert_eq!(
            decide_episode(closed(1), Close),
            None,
            "recovered once per episode"
        );
        assert_eq!(decide_episode(never, Close), None);
        assert_eq!(
            decide_episode(closed(1), Open),
            Some((2, open(2))),
            "after a recovery, the next alert is a new episode"
        );
        assert_eq!(decide_episode(closed(2), Within), Some((2, closed(2))));
        assert_eq!(decide_episode(never, Within), Some((0, never)));
        assert_eq!(
            decide_episode(open(u64::MAX), Close),
            Some((u64::MAX, closed(u64::MAX)))
        );
        assert_eq!(
            decide_episode(closed(u64::MAX), Open).map(|(n, _)| n),
            Some(u64::MAX)
        );
    }

    #[test]
    fn the_first_episode_keeps_the_bare_trigger_key() {
        assert_eq!(episode_key("Unknown", 0), "Unknown");
        assert_eq!(episode_key("Unknown", 1), "Unknown");
        assert_eq!(episode_key("Unknown", 2), "Unknown#2");
        assert_eq!(
            episode_key("Drift apps/Deployment ns/x", 7),
            "Drift apps/Deployment ns/x#7"
        );
    }

    #[test]
    fn sequence_must_rise_and_key_must_still_be_bound() {
        let current = SequenceState {
            keyid: "k1".into(),
            last_sequence: 5,
        };
        assert_eq!(
            check_sequence(None, "k1", 1),
            Some(IngestOutcome::UnknownCluster)
        );
        assert_eq!(
            check_sequence(Some(&current), "k2", 6),
            Some(IngestOutcome::KeyChanged)
        );
        assert_eq!(
            check_sequence(Some(&current), "k1", 5),
            Some(IngestOutcome::Replay { last: 5 })
        );
        assert_eq!(
            check_sequence(Some(&current), "k1", 4),
            Some(IngestOutcome::Replay { last: 5 })
        );
        assert_eq!(check_sequence(Some(&current), "k1", 6), None);
    }
}
