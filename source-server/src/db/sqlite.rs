//! The embedded database: one SQLite file (`windvane.db` under `--data`) in WAL mode with
//! `synchronous=FULL`, so that a committed transaction survives `kill -9` and power loss. Throughput comes
//! from group commit, not from weaker syncing: the ingest task hands over a whole batch of heartbeats, they
//! go into one transaction with one fsync, and only then are their 2xx answers sent.
//!
//! One connection writes (behind a mutex, used from blocking threads); another reads, so the page and API
//! never wait for a commit (WAL lets readers run beside the writer).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use jiff::Timestamp;
use rusqlite::{Connection, OptionalExtension, params};

use super::{
    Binding, ClusterSummary, Database, DriftEntry, EnrollOutcome, Enrollment, EpisodeClaim,
    IngestOutcome, LOG_DELETE_CHUNK, MIGRATE_HEARTBEAT_LOG, NewDelivery, QueuedDelivery,
    RecentFailures, RowUpdate, Settled, VerifiedHeartbeat, check_sequence, decide_enroll,
    decide_episode, episode_key, id_ranges, schema, to_i64, to_u64,
};
use super::{rows, sql};
use crate::{Error, Result};

/// The database file's name under `--data`.
pub const FILE_NAME: &str = "windvane.db";

/// SQLite behind the [`Database`] trait.
#[derive(Debug, Clone)]
pub struct SqliteDb {
    path: PathBuf,
    writer: Arc<Mutex<Connection>>,
    reader: Arc<Mutex<Connection>>,
}

fn db_err(operation: impl Into<String>) -> impl FnOnce(rusqlite::Error) -> Error {
    let operation = operation.into();
    move |e| Error::Database {
        operation,
        detail: e.to_string(),
    }
}

fn open_connection(path: &Path) -> std::result::Result<Connection, rusqlite::Error> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // FULL: the WAL is fsynced at every commit, so an answered heartbeat is on disk.
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

impl SqliteDb {
    /// Opens (creating if needed) `dir/windvane.db` and its schema.
    pub fn open(dir: &Path) -> Result<SqliteDb> {
        let path = dir.join(FILE_NAME);
        let open_err = |detail: String| Error::DatabaseOpen {
            location: path.display().to_string(),
            detail,
        };
        std::fs::create_dir_all(dir)
            .map_err(|e| open_err(format!("create {}: {e}", dir.display())))?;
        let mut writer = open_connection(&path).map_err(|e| open_err(e.to_string()))?;
        writer
            .execute_batch(&schema(
                "INTEGER PRIMARY KEY AUTOINCREMENT",
                "INTEGER PRIMARY KEY",
            ))
            .map_err(|e| open_err(format!("create schema: {e}")))?;
        migrate(&mut writer).map_err(|e| open_err(format!("migrate the heartbeat log: {e}")))?;
        let reader = open_connection(&path).map_err(|e| open_err(e.to_string()))?;
        Ok(SqliteDb {
            path,
            writer: Arc::new(Mutex::new(writer)),
            reader: Arc::new(Mutex::new(reader)),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    async fn with_writer<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let conn = Arc::clone(&self.writer);
        blocking(move || f(&mut conn.lock().unwrap_or_else(|p| p.into_inner()))).await
    }

    async fn with_reader<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let conn = Arc::clone(&self.reader);
        blocking(move || f(&conn.lock().unwrap_or_else(|p| p.into_inner()))).await
    }
}

/// Brings a database of an earlier layout up to date (see [`MIGRATE_HEARTBEAT_LOG`]).
fn migrate(conn: &mut Connection) -> rusqlite::Result<()> {
    let old_log: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'heartbeats')",
        [],
        |r| r.get(0),
    )?;
    if old_log {
        let tx = conn.transaction()?;
        tx.execute_batch(MIGRATE_HEARTBEAT_LOG)?;
        tx.commit()?;
        tracing::info!("moved the heartbeat log to its new layout (table heartbeat_log)");
    }
    Ok(())
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Database {
            operation: "run blocking task".into(),
            detail: e.to_string(),
        })?
}

fn ingest_batch(
    conn: &mut Connection,
    batch: &[VerifiedHeartbeat],
) -> rusqlite::Result<Vec<IngestOutcome>> {
    let tx = conn.transaction()?;
    let mut outcomes = Vec::with_capacity(batch.len());
    {
        let mut select = tx.prepare_cached(sql::SELECT_SEQUENCE)?;
        let mut update = tx.prepare_cached(sql::UPDATE_FROM_HEARTBEAT)?;
        let mut log = tx.prepare_cached(sql::INSERT_HEARTBEAT_LOG)?;
        let mut drift = tx.prepare_cached(sql::INSERT_DRIFT)?;
        for hb in batch {
            let name = &hb.heartbeat.cluster;
            let current = select.query_row([name], |r| rows::sequence(r)).optional()?;
            if let Some(refusal) = check_sequence(
                current.as_ref().map(|(state, _)| state),
                &hb.keyid,
                hb.heartbeat.sequence,
            ) {
                outcomes.push(refusal);
                continue;
            }
            let previous = current.and_then(|(_, state)| state);
            let row = RowUpdate::of(hb);
            update.execute(params![
                name,
                row.sequence,
                row.received_ms,
                row.interval_seconds,
                row.state,
                row.channel,
                row.applied_serial,
                row.last_error,
                row.labels_json,
                row.drift_count,
                hb.payload,
            ])?;
            log.execute(params![name, row.sequence, row.received_ms, row.state])?;
            for record in &hb.heartbeat.drift {
                let json = serde_json::to_string(record).unwrap_or_default();
                drift.execute(params![
                    name,
                    row.sequence,
                    row.received_ms,
                    record.detected_at.as_millisecond(),
                    json
                ])?;
            }
            outcomes.push(IngestOutcome::Accepted { previous });
        }
    }
    tx.commit()?;
    Ok(outcomes)
}

impl Database for SqliteDb {
    async fn enroll(&self, e: Enrollment) -> Result<EnrollOutcome> {
        let operation = format!("enroll cluster {}", e.cluster);
        self.with_writer(move |conn| {
            let run = |conn: &mut Connection| -> rusqlite::Result<EnrollOutcome> {
                let tx = conn.transaction()?;
                let existing: Option<Binding> = tx
                    .query_row(sql::SELECT_BINDING, [&e.cluster], |r| rows::binding(r))
                    .optional()?;
                let outcome = decide_enroll(existing.as_ref(), &e.fleet, &e.keyid, e.at);
                let labels = serde_json::to_string(&e.labels).unwrap_or_else(|_| "{}".into());
                match outcome {
                    EnrollOutcome::Enrolled => {
                        tx.execute(
                            sql::INSERT_CLUSTER,
                            params![
                                e.cluster,
                                e.fleet,
                                e.keyid,
                                e.public_key_pem,
                                labels,
                                e.at.as_millisecond()
                            ],
                        )?;
                    }
                    EnrollOutcome::AlreadyEnrolled => {
                        tx.execute(sql::UPDATE_LABELS, params![e.cluster, labels])?;
                    }
                    EnrollOutcome::Rekeyed => {
                        tx.execute(
                            sql::UPDATE_REKEYED,
                            params![
                                e.cluster,
                                e.fleet,
                                e.keyid,
                                e.public_key_pem,
                                labels,
                                e.at.as_millisecond()
                            ],
                        )?;
                    }
                    EnrollOutcome::KeyConflict | EnrollOutcome::FleetConflict => {}
                }
                tx.commit()?;
                Ok(outcome)
            };
            run(conn).map_err(db_err(operation))
        })
        .await
    }

    async fn cluster_key(&self, cluster: &str) -> Result<Option<(String, String, String)>> {
        let cluster = cluster.to_owned();
        self.with_reader(move |conn| {
            conn.prepare_cached(sql::SELECT_KEY)
                .and_then(|mut s| s.query_row([&cluster], |r| rows::key(r)).optional())
                .map_err(db_err(format!("read key of cluster {cluster}")))
        })
        .await
    }

    async fn ingest(&self, batch: Arc<[VerifiedHeartbeat]>) -> Result<Vec<IngestOutcome>> {
        let size = batch.len();
        self.with_writer(move |conn| {
            ingest_batch(conn, &batch)
                .map_err(db_err(format!("store a batch of {size} heartbeats")))
        })
        .await
    }

    async fn list_clusters(&self) -> Result<Vec<ClusterSummary>> {
        self.with_reader(|conn| {
            let run = || -> rusqlite::Result<Vec<ClusterSummary>> {
                let mut stmt = conn.prepare_cached(sql::LIST_CLUSTERS)?;
                let found = stmt.query_map([], |r| rows::summary(r))?;
                found.collect()
            };
            run().map_err(db_err("list clusters"))
        })
        .await
    }

    async fn waiting_reports(&self) -> Result<Vec<(String, String)>> {
        self.with_reader(|conn| {
            let run = || -> rusqlite::Result<Vec<(String, String)>> {
                let mut stmt = conn.prepare_cached(sql::LIST_WAITING)?;
                let found = stmt.query_map([], |r| rows::waiting(r))?;
                found.collect()
            };
            run().map_err(db_err("list waiting clusters"))
        })
        .await
    }

    async fn get_cluster(&self, cluster: &str) -> Result<Option<(ClusterSummary, Option<String>)>> {
        let cluster = cluster.to_owned();
        self.with_reader(move |conn| {
            conn.prepare_cached(sql::GET_CLUSTER)
                .and_then(|mut s| {
                    s.query_row([&cluster], |r| rows::summary_and_report(r))
                        .optional()
                })
                .map_err(db_err(format!("read cluster {cluster}")))
        })
        .await
    }

    async fn drift(
        &self,
        cluster: Option<&str>,
        since: Option<Timestamp>,
        limit: u32,
        offset: u64,
    ) -> Result<Vec<DriftEntry>> {
        let offset = i64::try_from(offset).unwrap_or(i64::MAX);
        let cluster = cluster.map(str::to_owned);
        let since_ms = since.map_or(i64::MIN, |t| t.as_millisecond());
        self.with_reader(move |conn| {
            let run = || -> rusqlite::Result<Vec<DriftEntry>> {
                let mut stmt = conn.prepare_cached(sql::SELECT_DRIFT)?;
                let found = stmt
                    .query_map(params![cluster, since_ms, i64::from(limit), offset], |r| {
                        rows::drift(r)
                    })?;
                found.filter_map(Result::transpose).collect()
            };
            run().map_err(db_err("read drift log"))
        })
        .await
    }

    async fn allow_rekey(&self, cluster: &str, until: Timestamp) -> Result<bool> {
        let cluster = cluster.to_owned();
        self.with_writer(move |conn| {
            conn.execute(sql::ALLOW_REKEY, params![cluster, until.as_millisecond()])
                .map(|n| n > 0)
                .map_err(db_err(format!("allow rekey of cluster {cluster}")))
        })
        .await
    }

    async fn forget(&self, cluster: &str) -> Result<bool> {
        let name = cluster.to_owned();
        let (forgotten, log_span) = self
            .with_writer(move |conn| {
                let run = |conn: &mut Connection| -> rusqlite::Result<(bool, (i64, i64))> {
                    let tx = conn.transaction()?;
                    let n = tx.execute(sql::DELETE_CLUSTER, [&name])?;
                    for statement in sql::DELETE_CLUSTER_RECORDS {
                        tx.execute(statement, [&name])?;
                    }
                    let span = tx.query_row(sql::LOG_SPAN, [], |r| rows::span(r))?;
                    tx.commit()?;
                    Ok((n > 0, span))
                };
                run(conn).map_err(db_err(format!("forget cluster {name}")))
            })
            .await?;
        // The cluster is gone, so no new rows of it arrive; its log rows go a chunk at a time (rows left by a
        // crash here age out with the retention).
        for (from, to) in id_ranges(log_span.0, log_span.1, LOG_DELETE_CHUNK) {
            let name = cluster.to_owned();
            self.with_writer(move |conn| {
                conn.execute(sql::DELETE_CLUSTER_LOG_RANGE, params![from, to, name])
                    .map_err(db_err(format!(
                        "forget the heartbeat log of cluster {name}"
                    )))
            })
            .await?;
        }
        Ok(forgotten)
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
        let (cluster, trigger) = (cluster.to_owned(), trigger.to_owned());
        let operation = format!("claim notification {trigger} for cluster {cluster}");
        self.with_writer(move |conn| {
            let run = |conn: &mut Connection| -> rusqlite::Result<Option<u64>> {
                let tx = conn.transaction()?;
                let current = tx
                    .query_row(sql::SELECT_EPISODE, [&cluster], |r| rows::episode(r))
                    .optional()?
                    .unwrap_or_default();
                let Some((episode, next)) = decide_episode(current, claim) else {
                    return Ok(None);
                };
                if next != current {
                    tx.execute(
                        sql::UPSERT_EPISODE,
                        params![cluster, to_i64(next.number), i64::from(next.open)],
                    )?;
                }
                let claimed = tx.execute(
                    sql::CLAIM_NOTIFICATION,
                    params![
                        cluster,
                        episode_key(&trigger, episode),
                        to_i64(serial),
                        at.as_millisecond()
                    ],
                )?;
                if claimed > 0 {
                    for delivery in deliveries(episode) {
                        tx.execute(
                            sql::QUEUE_DELIVERY,
                            params![
                                delivery.notification_id,
                                delivery.sink,
                                delivery.body,
                                at.as_millisecond()
                            ],
                        )?;
                    }
                }
                tx.commit()?;
                Ok((claimed > 0).then_some(episode))
            };
            run(conn).map_err(db_err(operation))
        })
        .await
    }

    async fn open_episodes(&self) -> Result<Vec<String>> {
        self.with_reader(|conn| {
            let run = || -> rusqlite::Result<Vec<String>> {
                let mut stmt = conn.prepare_cached(sql::OPEN_EPISODES)?;
                let found = stmt.query_map([], |r| r.get(0))?;
                found.collect()
            };
            run().map_err(db_err("list open alert episodes"))
        })
        .await
    }

    async fn heartbeat_count(&self, cluster: Option<&str>) -> Result<u64> {
        let cluster = cluster.map(str::to_owned);
        self.with_reader(move |conn| {
            conn.query_row(sql::COUNT_HEARTBEATS, [&cluster], |r| r.get::<_, i64>(0))
                .map(to_u64)
                .map_err(db_err("count heartbeats"))
        })
        .await
    }

    async fn prune(&self, before: Timestamp) -> Result<u64> {
        let before_ms = before.as_millisecond();
        // Rows are stored in the order they arrive: everything below the first row received since `before`
        // is older (give or take a batch).
        let (first, end) = self
            .with_reader(move |conn| {
                conn.query_row(sql::PRUNE_SPAN, [before_ms], |r| rows::span(r))
                    .map_err(db_err("find the heartbeat log rows to prune"))
            })
            .await?;
        let mut pruned = 0;
        for (from, to) in id_ranges(first, end, LOG_DELETE_CHUNK) {
            pruned += self
                .with_writer(move |conn| {
                    conn.execute(sql::DELETE_LOG_RANGE, params![from, to])
                        .map(|n| n as u64)
                        .map_err(db_err("prune heartbeat log"))
                })
                .await?;
        }
        self.with_writer(move |conn| {
            conn.execute(sql::PRUNE_OUTBOX, [before_ms])
                .map_err(db_err("prune settled notification deliveries"))
        })
        .await?;
        Ok(pruned)
    }

    async fn take_due_deliveries(
        &self,
        now: Timestamp,
        lease_until: Timestamp,
        limit: u32,
    ) -> Result<Vec<QueuedDelivery>> {
        self.with_writer(move |conn| {
            let take = |conn: &mut Connection| -> rusqlite::Result<Vec<QueuedDelivery>> {
                let mut statement = conn.prepare_cached(sql::TAKE_DUE_DELIVERIES)?;
                let params = params![
                    now.as_millisecond(),
                    lease_until.as_millisecond(),
                    i64::from(limit)
                ];
                let found = statement.query_map(params, |r| rows::delivery(r))?;
                found.collect()
            };
            take(conn).map_err(db_err("take due notification deliveries"))
        })
        .await
    }

    async fn settle_delivery(&self, id: i64, settled: Settled, now: Timestamp) -> Result<()> {
        let (done, next) = settled.columns(now);
        self.with_writer(move |conn| {
            conn.execute(sql::SETTLE_DELIVERY, params![id, done, next])
                .map(drop)
                .map_err(db_err("settle a notification delivery"))
        })
        .await
    }

    async fn lead_notifications(&self) -> Result<bool> {
        Ok(true)
    }

    async fn record_token_failure(&self, address: &str, at: Timestamp) -> Result<()> {
        let address = address.to_owned();
        self.with_writer(move |conn| {
            conn.execute(
                sql::INSERT_TOKEN_FAILURE,
                params![address, at.as_millisecond()],
            )
            .map(drop)
            .map_err(db_err("record a wrong token"))
        })
        .await
    }

    async fn recent_token_failures(
        &self,
        address: &str,
        since: Timestamp,
    ) -> Result<RecentFailures> {
        let address = address.to_owned();
        self.with_reader(move |conn| {
            conn.query_row(
                sql::RECENT_TOKEN_FAILURES,
                params![address, since.as_millisecond()],
                |r| rows::token_failures(r),
            )
            .map_err(db_err("count wrong tokens"))
        })
        .await
    }

    async fn prune_token_failures(&self, before: Timestamp) -> Result<u64> {
        self.with_writer(move |conn| {
            conn.execute(sql::PRUNE_TOKEN_FAILURES, [before.as_millisecond()])
                .map(|n| n as u64)
                .map_err(db_err("prune wrong tokens"))
        })
        .await
    }

    async fn prune_drift(&self, before: Timestamp) -> Result<u64> {
        let before_ms = before.as_millisecond();
        self.with_writer(move |conn| {
            conn.execute(sql::PRUNE_DRIFT, params![before_ms])
                .map(|n| n as u64)
                .map_err(db_err("prune the drift log"))
        })
        .await
    }
    async fn ping(&self) -> Result<()> {
        self.with_reader(|conn| {
            conn.query_row(sql::PING, [], |_| Ok(()))
                .map_err(db_err("ping"))
        })
        .await
    }
}
