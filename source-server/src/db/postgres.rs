//! PostgreSQL behind the [`Database`] trait, for several server replicas behind a load balancer
//! (`--database-url postgres://…`). Same schema and the same decisions as SQLite; per-cluster rows are locked
//! (`SELECT … FOR UPDATE`) while a batch is judged, so two replicas never store out-of-order sequences.
//!
//! One connection runs transactions (behind an async mutex), another serves reads; both reconnect when
//! PostgreSQL closes them. TLS is not built in: run it over loopback, a private network or a TLS proxy.

use std::sync::Arc;

use jiff::Timestamp;
use tokio::sync::Mutex;
use tokio_postgres::{Client, NoTls};

use super::{
    ClusterSummary, Database, DriftEntry, EnrollOutcome, Enrollment, EpisodeClaim, IngestOutcome,
    LOG_DELETE_CHUNK, MIGRATE_HEARTBEAT_LOG, NewDelivery, QueuedDelivery, RecentFailures,
    RowUpdate, Settled, VerifiedHeartbeat, check_sequence, decide_enroll, decide_episode,
    episode_key, id_ranges, schema, to_i64, to_u64,
};
use super::{rows, sql};
use crate::{Error, Result};

/// PostgreSQL behind the [`Database`] trait.
pub struct PostgresDb {
    url: String,
    writer: Mutex<Client>,
    reader: Mutex<Client>,
    /// The session holding the notification sender's advisory lock, while this replica leads it.
    leader: Mutex<Option<Client>>,
}

/// The key of the session advisory lock that the replica leading the notification sender holds.
const NOTIFIER_LOCK: i64 = 0x7769_6e64_6e6f_7466; // "windnotf"

impl std::fmt::Debug for PostgresDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold a password.
        f.debug_struct("PostgresDb").finish_non_exhaustive()
    }
}

fn db_err(operation: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> Error {
    let operation = operation.into();
    move |e| Error::Database {
        operation,
        detail: e.to_string(),
    }
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

async fn connect(url: &str) -> std::result::Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "PostgreSQL connection closed");
        }
    });
    Ok(client)
}

impl PostgresDb {
    /// Connects and creates the schema if needed.
    pub async fn open(url: &str) -> Result<PostgresDb> {
        let open_err = |detail: String| Error::DatabaseOpen {
            location: redact(url),
            detail,
        };
        let mut writer = connect(url).await.map_err(|e| open_err(e.to_string()))?;
        writer
            .batch_execute(&schema("BIGSERIAL PRIMARY KEY", "BIGSERIAL PRIMARY KEY"))
            .await
            .map_err(|e| open_err(format!("create schema: {e}")))?;
        migrate(&mut writer)
            .await
            .map_err(|e| open_err(format!("migrate the heartbeat log: {e}")))?;
        let reader = connect(url).await.map_err(|e| open_err(e.to_string()))?;
        Ok(PostgresDb {
            url: url.to_owned(),
            writer: Mutex::new(writer),
            reader: Mutex::new(reader),
            leader: Mutex::new(None),
        })
    }

    /// A live client from `slot`, reconnecting when the old one was closed.
    async fn client<'a>(
        &self,
        slot: &'a Mutex<Client>,
    ) -> Result<tokio::sync::MutexGuard<'a, Client>> {
        let mut guard = slot.lock().await;
        if guard.is_closed() {
            *guard = connect(&self.url).await.map_err(db_err("reconnect"))?;
        }
        Ok(guard)
    }
}

/// Brings a database of an earlier layout up to date (see [`MIGRATE_HEARTBEAT_LOG`]).
async fn migrate(client: &mut Client) -> std::result::Result<(), tokio_postgres::Error> {
    let old_log: bool = client
        .query_one("SELECT to_regclass('heartbeats') IS NOT NULL", &[])
        .await?
        .get(0);
    if old_log {
        let tx = client.transaction().await?;
        tx.batch_execute(MIGRATE_HEARTBEAT_LOG).await?;
        tx.commit().await?;
        tracing::info!("moved the heartbeat log to its new layout (table heartbeat_log)");
    }
    Ok(())
}

async fn ingest_batch(
    client: &mut Client,
    batch: &[VerifiedHeartbeat],
) -> std::result::Result<Vec<IngestOutcome>, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    let select = tx
        .prepare(&sql::postgres_locked(sql::SELECT_SEQUENCE))
        .await?;
    let update = tx
        .prepare(&sql::postgres(sql::UPDATE_FROM_HEARTBEAT))
        .await?;
    let log = tx
        .prepare(&sql::postgres(sql::INSERT_HEARTBEAT_LOG))
        .await?;
    let drift = tx.prepare(&sql::postgres(sql::INSERT_DRIFT)).await?;
    let mut outcomes = Vec::with_capacity(batch.len());
    for hb in batch {
        let name = &hb.heartbeat.cluster;
        let current = tx
            .query_opt(&select, &[name])
            .await?
            .as_ref()
            .map(rows::sequence)
            .transpose()?;
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
        tx.execute(
            &update,
            &[
                name,
                &row.sequence,
                &row.received_ms,
                &row.interval_seconds,
                &row.state,
                &row.channel,
                &row.applied_serial,
                &row.last_error,
                &row.labels_json,
                &row.drift_count,
                &hb.payload,
            ],
        )
        .await?;
        tx.execute(&log, &[name, &row.sequence, &row.received_ms, &row.state])
            .await?;
        for record in &hb.heartbeat.drift {
            let json = serde_json::to_string(record).unwrap_or_default();
            tx.execute(
                &drift,
                &[
                    name,
                    &row.sequence,
                    &row.received_ms,
                    &record.detected_at.as_millisecond(),
                    &json,
                ],
            )
            .await?;
        }
        outcomes.push(IngestOutcome::Accepted { previous });
    }
    tx.commit().await?;
    Ok(outcomes)
}

async fn enroll_tx(
    client: &mut Client,
    e: &Enrollment,
) -> std::result::Result<EnrollOutcome, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    // Serialise enrolments of the same name even when the row does not exist yet.
    tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&e.cluster])
        .await?;
    let existing = tx
        .query_opt(&sql::postgres_locked(sql::SELECT_BINDING), &[&e.cluster])
        .await?
        .as_ref()
        .map(rows::binding)
        .transpose()?;
    let outcome = decide_enroll(existing.as_ref(), &e.fleet, &e.keyid, e.at);
    let labels = serde_json::to_string(&e.labels).unwrap_or_else(|_| "{}".into());
    let at = e.at.as_millisecond();
    match outcome {
        EnrollOutcome::Enrolled => {
            tx.execute(
                &sql::postgres(sql::INSERT_CLUSTER),
                &[
                    &e.cluster,
                    &e.fleet,
                    &e.keyid,
                    &e.public_key_pem,
                    &labels,
                    &at,
                ],
            )
            .await?;
        }
        EnrollOutcome::AlreadyEnrolled => {
            tx.execute(&sql::postgres(sql::UPDATE_LABELS), &[&e.cluster, &labels])
                .await?;
        }
        EnrollOutcome::Rekeyed => {
            tx.execute(
                &sql::postgres(sql::UPDATE_REKEYED),
                &[
                    &e.cluster,
                    &e.fleet,
                    &e.keyid,
                    &e.public_key_pem,
                    &labels,
                    &at,
                ],
            )
            .await?;
        }
        EnrollOutcome::KeyConflict | EnrollOutcome::FleetConflict => {}
    }
    tx.commit().await?;
    Ok(outcome)
}

impl Database for PostgresDb {
    async fn enroll(&self, e: Enrollment) -> Result<EnrollOutcome> {
        let mut client = self.client(&self.writer).await?;
        enroll_tx(&mut client, &e)
            .await
            .map_err(db_err(format!("enroll cluster {}", e.cluster)))
    }

    async fn cluster_key(&self, cluster: &str) -> Result<Option<(String, String, String)>> {
        let client = self.client(&self.reader).await?;
        let row = client
            .query_opt(&sql::postgres(sql::SELECT_KEY), &[&cluster])
            .await
            .map_err(db_err(format!("read key of cluster {cluster}")))?;
        row.as_ref()
            .map(rows::key)
            .transpose()
            .map_err(db_err(format!("read key of cluster {cluster}")))
    }

    async fn ingest(&self, batch: Arc<[VerifiedHeartbeat]>) -> Result<Vec<IngestOutcome>> {
        let mut client = self.client(&self.writer).await?;
        ingest_batch(&mut client, &batch)
            .await
            .map_err(db_err(format!(
                "store a batch of {} heartbeats",
                batch.len()
            )))
    }

    async fn list_clusters(&self) -> Result<Vec<ClusterSummary>> {
        let client = self.client(&self.reader).await?;
        let found = client
            .query(sql::LIST_CLUSTERS, &[])
            .await
            .map_err(db_err("list clusters"))?;
        found
            .iter()
            .map(rows::summary)
            .collect::<std::result::Result<_, _>>()
            .map_err(db_err("list clusters"))
    }

    async fn waiting_reports(&self) -> Result<Vec<(String, String)>> {
        let client = self.client(&self.reader).await?;
        let found = client
            .query(sql::LIST_WAITING, &[])
            .await
            .map_err(db_err("list waiting clusters"))?;
        found
            .iter()
            .map(rows::waiting)
            .collect::<std::result::Result<_, _>>()
            .map_err(db_err("list waiting clusters"))
    }

    async fn get_cluster(&self, cluster: &str) -> Result<Option<(ClusterSummary, Option<String>)>> {
        let client = self.client(&self.reader).await?;
        let row = client
            .query_opt(&sql::postgres(sql::GET_CLUSTER), &[&cluster])
            .await
            .map_err(db_err(format!("read cluster {cluster}")))?;
        row.as_ref()
            .map(rows::summary_and_report)
            .transpose()
            .map_err(db_err(format!("read cluster {cluster}")))
    }

    async fn drift(
        &self,
        cluster: Option<&str>,
        since: Option<Timestamp>,
        limit: u32,
        offset: u64,
    ) -> Result<Vec<DriftEntry>> {
        let offset = i64::try_from(offset).unwrap_or(i64::MAX);
        let client = self.client(&self.reader).await?;
        let since_ms = since.map_or(i64::MIN, |t| t.as_millisecond());
        let found = client
            .query(
                &sql::postgres(sql::SELECT_DRIFT),
                &[&cluster, &since_ms, &i64::from(limit), &offset],
            )
            .await
            .map_err(db_err("read drift log"))?;
        found
            .iter()
            .map(rows::drift)
            .filter_map(std::result::Result::transpose)
            .collect::<std::result::Result<_, _>>()
            .map_err(db_err("read drift log"))
    }

    async fn allow_rekey(&self, cluster: &str, until: Timestamp) -> Result<bool> {
        let client = self.client(&self.writer).await?;
        let until_ms = until.as_millisecond();
        let n = client
            .execute(&sql::postgres(sql::ALLOW_REKEY), &[&cluster, &until_ms])
            .await
            .map_err(db_err(format!("allow rekey of cluster {cluster}")))?;
        Ok(n > 0)
    }

    async fn forget(&self, cluster: &str) -> Result<bool> {
        let (forgotten, (first, end)) = {
            let mut client = self.client(&self.writer).await?;
            let run = async {
                let tx = client.transaction().await?;
                let n = tx
                    .execute(&sql::postgres(sql::DELETE_CLUSTER), &[&cluster])
                    .await?;
                for statement in sql::DELETE_CLUSTER_RECORDS {
                    tx.execute(&sql::postgres(statement), &[&cluster]).await?;
                }
                let span = rows::span(&tx.query_one(sql::LOG_SPAN, &[]).await?)?;
                tx.commit().await?;
                Ok((n > 0, span))
            };
            run.await
                .map_err(db_err(format!("forget cluster {cluster}")))?
        };
        // As in SQLite: the log a chunk at a time, the writer free in between.
        for (from, to) in id_ranges(first, end, LOG_DELETE_CHUNK) {
            let client = self.client(&self.writer).await?;
            client
                .execute(
                    &sql::postgres(sql::DELETE_CLUSTER_LOG_RANGE),
                    &[&from, &to, &cluster],
                )
                .await
                .map_err(db_err(format!(
                    "forget the heartbeat log of cluster {cluster}"
                )))?;
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
        let mut client = self.client(&self.writer).await?;
        let run = async {
            let tx = client.transaction().await?;
            // The episode row is locked while the claim is decided, so replicas move it one at a time.
            let current = tx
                .query_opt(&sql::postgres_locked(sql::SELECT_EPISODE), &[&cluster])
                .await?
                .as_ref()
                .map(rows::episode)
                .transpose()?
                .unwrap_or_default();
            let Some((episode, next)) = decide_episode(current, claim) else {
                return Ok(None);
            };
            if next != current {
                tx.execute(
                    &sql::postgres(sql::UPSERT_EPISODE),
                    &[&cluster, &to_i64(next.number), &i64::from(next.open)],
                )
                .await?;
            }
            let claimed = tx
                .execute(
                    &sql::postgres(sql::CLAIM_NOTIFICATION),
                    &[
                        &cluster,
                        &episode_key(trigger, episode),
                        &to_i64(serial),
                        &at.as_millisecond(),
                    ],
                )
                .await?;
            if claimed > 0 {
                let queue = sql::postgres(sql::QUEUE_DELIVERY);
                for delivery in deliveries(episode) {
                    let row: [&(dyn tokio_postgres::types::ToSql + Sync); 4] = [
                        &delivery.notification_id,
                        &delivery.sink,
                        &delivery.body,
                        &at.as_millisecond(),
                    ];
                    tx.execute(&queue, &row).await?;
                }
            }
            tx.commit().await?;
            Ok((claimed > 0).then_some(episode))
        };
        run.await.map_err(db_err(format!(
            "claim notification {trigger} for cluster {cluster}"
        )))
    }

    async fn open_episodes(&self) -> Result<Vec<String>> {
        let client = self.client(&self.reader).await?;
        let found = client
            .query(sql::OPEN_EPISODES, &[])
            .await
            .map_err(db_err("list open alert episodes"))?;
        found
            .iter()
            .map(|row| row.try_get(0))
            .collect::<std::result::Result<_, _>>()
            .map_err(db_err("list open alert episodes"))
    }

    async fn heartbeat_count(&self, cluster: Option<&str>) -> Result<u64> {
        let client = self.client(&self.reader).await?;
        let row = client
            .query_one(&sql::postgres(sql::COUNT_HEARTBEATS), &[&cluster])
            .await
            .map_err(db_err("count heartbeats"))?;
        Ok(to_u64(row.get(0)))
    }

    async fn prune(&self, before: Timestamp) -> Result<u64> {
        let (first, end) = {
            let client = self.client(&self.reader).await?;
            let row = client
                .query_one(&sql::postgres(sql::PRUNE_SPAN), &[&before.as_millisecond()])
                .await
                .map_err(db_err("find the heartbeat log rows to prune"))?;
            rows::span(&row).map_err(db_err("find the heartbeat log rows to prune"))?
        };
        let mut pruned = 0;
        for (from, to) in id_ranges(first, end, LOG_DELETE_CHUNK) {
            let client = self.client(&self.writer).await?;
            pruned += client
                .execute(&sql::postgres(sql::DELETE_LOG_RANGE), &[&from, &to])
                .await
                .map_err(db_err("prune heartbeat log"))?;
        }
        let client = self.client(&self.writer).await?;
        client
            .execute(
                &sql::postgres(sql::PRUNE_OUTBOX),
                &[&before.as_millisecond()],
            )
            .await
            .map_err(db_err("prune settled notification deliveries"))?;
        Ok(pruned)
    }

    async fn take_due_deliveries(
        &self,
        now: Timestamp,
        lease_until: Timestamp,
        limit: u32,
    ) -> Result<Vec<QueuedDelivery>> {
        let client = self.client(&self.writer).await?;
        let found = client
            .query(
                &sql::postgres(sql::TAKE_DUE_DELIVERIES),
                &[
                    &now.as_millisecond(),
                    &lease_until.as_millisecond(),
                    &i64::from(limit),
                ],
            )
            .await
            .map_err(db_err("take due notification deliveries"))?;
        found
            .iter()
            .map(rows::delivery)
            .collect::<std::result::Result<_, _>>()
            .map_err(db_err("take due notification deliveries"))
    }

    async fn settle_delivery(&self, id: i64, settled: Settled, now: Timestamp) -> Result<()> {
        let (done, next) = settled.columns(now);
        let client = self.client(&self.writer).await?;
        client
            .execute(&sql::postgres(sql::SETTLE_DELIVERY), &[&id, &done, &next])
            .await
            .map_err(db_err("settle a notification delivery"))?;
        Ok(())
    }

    async fn lead_notifications(&self) -> Result<bool> {
        let mut leader = self.leader.lock().await;
        if let Some(client) = leader.as_ref() {
            // Still holding the lock as long as the session lives.
            if !client.is_closed() && client.simple_query("SELECT 1").await.is_ok() {
                return Ok(true);
            }
            *leader = None;
        }
        let client = connect(&self.url)
            .await
            .map_err(db_err("connect to lead notifications"))?;
        let row = client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&NOTIFIER_LOCK])
            .await
            .map_err(db_err("try the notification sender's lock"))?;
        let leads: bool = row.get(0);
        if leads {
            *leader = Some(client);
        }
        Ok(leads)
    }

    async fn record_token_failure(&self, address: &str, at: Timestamp) -> Result<()> {
        let client = self.client(&self.writer).await?;
        client
            .execute(
                &sql::postgres(sql::INSERT_TOKEN_FAILURE),
                &[&address, &at.as_millisecond()],
            )
            .await
            .map_err(db_err("record a wrong token"))?;
        Ok(())
    }

    async fn recent_token_failures(
        &self,
        address: &str,
        since: Timestamp,
    ) -> Result<RecentFailures> {
        // The writer's connection: a failure just recorded through it is counted at once.
        let client = self.client(&self.writer).await?;
        let row = client
            .query_one(
                &sql::postgres(sql::RECENT_TOKEN_FAILURES),
                &[&address, &since.as_millisecond()],
            )
            .await
            .map_err(db_err("count wrong tokens"))?;
        rows::token_failures(&row).map_err(db_err("count wrong tokens"))
    }

    async fn prune_token_failures(&self, before: Timestamp) -> Result<u64> {
        let client = self.client(&self.writer).await?;
        client
            .execute(
                &sql::postgres(sql::PRUNE_TOKEN_FAILURES),
                &[&before.as_millisecond()],
            )
            .await
            .map_err(db_err("prune wrong tokens"))
    }

    async fn prune_drift(&self, before: Timestamp) -> Result<u64> {
        let client = self.client(&self.writer).await?;
        client
            .execute(
                &sql::postgres(sql::PRUNE_DRIFT),
                &[&before.as_millisecond()],
            )
            .await
            .map_err(db_err("prune the drift log"))
    }

    async fn ping(&self) -> Result<()> {
        let client = self.client(&self.reader).await?;
        client
            .simple_query(sql::PING)
            .await
            .map_err(db_err("ping"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn urls_are_redacted() {
        assert_eq!(
            super::redact("postgres://u:secret@h:5/db"),
            "postgres://u:***@h:5/db"
        );
        assert_eq!(super::redact("host=/tmp port=5"), "host=/tmp port=5");
    }
}
