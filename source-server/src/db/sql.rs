//! The statements both backends run, written once in SQLite's numbered-placeholder style (`?1`, `?2`, …).
//! The SQLite backend uses them as they are; the PostgreSQL backend turns them into its own style (`$1`) with
//! [`postgres`], and adds the row locks only it needs (SQLite has a single writer) with [`postgres_locked`].
//! Anything a backend writes for itself alone (its catalogue queries, PostgreSQL's advisory lock) stays in
//! its own module.

/// The columns of [`ClusterSummary`](super::ClusterSummary), in the order `summary_from_row` reads them.
macro_rules! summary_columns {
    () => {
        "name, fleet, keyid, labels, enrolled_ms, rekey_allowed, last_sequence, last_seen_ms, \
         interval_seconds, state, channel, applied_serial, last_error, drift_total, public_key"
    };
}

/// How many columns `summary_columns!` names: a statement's next column is at this index.
pub(crate) const SUMMARY_COLUMNS: usize = 15;

// ---- heartbeats ----

/// A cluster's bound key and sequence, read (and, on PostgreSQL, locked) while a batch is judged.
pub(crate) const SELECT_SEQUENCE: &str =
    "SELECT keyid, last_sequence, state FROM clusters WHERE name = ?1";
/// A cluster's row after an accepted heartbeat; labels are kept when the heartbeat carries none (`{}`). The
/// bound key just signed, so the cluster still has it: an admin's rekey permission, if any, is withdrawn.
pub(crate) const UPDATE_FROM_HEARTBEAT: &str = "UPDATE clusters SET last_sequence = ?2, last_seen_ms = ?3, \
     interval_seconds = ?4, state = ?5, channel = ?6, applied_serial = ?7, last_error = ?8, \
     labels = CASE WHEN ?9 = '{}' THEN labels ELSE ?9 END, \
     drift_total = drift_total + ?10, heartbeat = ?11, rekey_allowed = 0 WHERE name = ?1";
pub(crate) const INSERT_HEARTBEAT_LOG: &str =
    "INSERT INTO heartbeat_log (cluster, sequence, received_ms, state) VALUES (?1, ?2, ?3, ?4)";
pub(crate) const INSERT_DRIFT: &str = "INSERT INTO drift (cluster, sequence, received_ms, detected_ms, record) \
     VALUES (?1, ?2, ?3, ?4, ?5)";

// ---- enrolment and admin ----

/// What a name is bound to (and, on PostgreSQL, locked) while an enrolment is decided.
pub(crate) const SELECT_BINDING: &str =
    "SELECT fleet, keyid, rekey_allowed FROM clusters WHERE name = ?1";
pub(crate) const INSERT_CLUSTER: &str = "INSERT INTO clusters (name, fleet, keyid, public_key, labels, enrolled_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)";
pub(crate) const UPDATE_LABELS: &str = "UPDATE clusters SET labels = ?2 WHERE name = ?1";
/// A rekeyed cluster starts over: new key, sequence 0, no further rekey allowed.
pub(crate) const UPDATE_REKEYED: &str = "UPDATE clusters SET fleet = ?2, keyid = ?3, public_key = ?4, \
     labels = ?5, enrolled_ms = ?6, rekey_allowed = 0, last_sequence = 0 WHERE name = ?1";
pub(crate) const SELECT_KEY: &str = "SELECT fleet, keyid, public_key FROM clusters WHERE name = ?1";
/// Allows a rekey until `?2` (ms); the column holds the deadline ([`super::rekey_deadline`]).
pub(crate) const ALLOW_REKEY: &str = "UPDATE clusters SET rekey_allowed = ?2 WHERE name = ?1";
pub(crate) const DELETE_CLUSTER: &str = "DELETE FROM clusters WHERE name = ?1";
/// What else `forget` deletes in the cluster's transaction; its heartbeat log goes a chunk at a time after.
pub(crate) const DELETE_CLUSTER_RECORDS: [&str; 3] = [
    "DELETE FROM drift WHERE cluster = ?1",
    "DELETE FROM notifications WHERE cluster = ?1",
    "DELETE FROM alert_episodes WHERE cluster = ?1",
];
/// The heartbeat log's id range `[first, end)`.
pub(crate) const LOG_SPAN: &str =
    "SELECT COALESCE(MIN(id), 0), COALESCE(MAX(id), -1) + 1 FROM heartbeat_log";
pub(crate) const DELETE_CLUSTER_LOG_RANGE: &str =
    "DELETE FROM heartbeat_log WHERE id >= ?1 AND id < ?2 AND cluster = ?3";

// ---- wrong tokens ----

pub(crate) const INSERT_TOKEN_FAILURE: &str =
    "INSERT INTO token_failures (address, at_ms) VALUES (?1, ?2)";
/// An address's failures after `?2`: how many, and the oldest one's time.
pub(crate) const RECENT_TOKEN_FAILURES: &str =
    "SELECT COUNT(*), MIN(at_ms) FROM token_failures WHERE address = ?1 AND at_ms > ?2";
pub(crate) const PRUNE_TOKEN_FAILURES: &str = "DELETE FROM token_failures WHERE at_ms <= ?1";

// ---- reads ----

pub(crate) const LIST_CLUSTERS: &str = concat!(
    "SELECT ",
    summary_columns!(),
    " FROM clusters ORDER BY name"
);
/// The latest heartbeat of each cluster whose report says it holds a release for later (`source.pending`,
/// as the agent serializes it): `(name, payload)`. A text match, so most rows are not parsed.
pub(crate) const LIST_WAITING: &str =
    "SELECT name, heartbeat FROM clusters WHERE heartbeat LIKE '%\"pending\":{%'";
/// A cluster's summary and its latest heartbeat (column 14).
pub(crate) const GET_CLUSTER: &str = concat!(
    "SELECT ",
    summary_columns!(),
    ", heartbeat FROM clusters WHERE name = ?1"
);
/// The drift log, newest first: of one cluster or all (`?1` NULL), detected at or after `?2`, at most `?3`.
/// The cast gives PostgreSQL the parameter's type; SQLite accepts it as it is.
pub(crate) const SELECT_DRIFT: &str = "SELECT cluster, sequence, received_ms, record FROM drift \
     WHERE (CAST(?1 AS TEXT) IS NULL OR cluster = ?1) AND detected_ms >= ?2 \
     ORDER BY detected_ms DESC, id DESC LIMIT ?3 OFFSET ?4";
pub(crate) const PRUNE_DRIFT: &str = "DELETE FROM drift WHERE detected_ms < ?1";
pub(crate) const COUNT_HEARTBEATS: &str =
    "SELECT COUNT(*) FROM heartbeat_log WHERE (CAST(?1 AS TEXT) IS NULL OR cluster = ?1)";
pub(crate) const PING: &str = "SELECT 1";

// ---- notifications ----

/// A cluster's alert episode (and, on PostgreSQL, its row locked while a claim is decided).
pub(crate) const SELECT_EPISODE: &str =
    "SELECT episode, open FROM alert_episodes WHERE cluster = ?1";
pub(crate) const UPSERT_EPISODE: &str = "INSERT INTO alert_episodes (cluster, episode, open) VALUES (?1, ?2, ?3) \
     ON CONFLICT (cluster) DO UPDATE SET episode = excluded.episode, open = excluded.open";
/// Claims a notification: one row per (cluster, trigger in its episode, serial); a second claim inserts nothing.
pub(crate) const CLAIM_NOTIFICATION: &str = "INSERT INTO notifications (cluster, trigger_key, serial, sent_ms) \
     VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING";
pub(crate) const OPEN_EPISODES: &str = "SELECT cluster FROM alert_episodes WHERE open = 1";
/// A delivery queued with its claim, due at once.
pub(crate) const QUEUE_DELIVERY: &str = "INSERT INTO outbox (notification_id, sink, body, queued_ms, attempts, \
     next_attempt_ms, done) VALUES (?1, ?2, ?3, ?4, 0, ?4, 0)";
/// Takes up to `?3` due deliveries for an attempt: each is counted and not due again until `?2` (a lease, so a
/// sender that dies mid-attempt leaves it to the next); returns them.
pub(crate) const TAKE_DUE_DELIVERIES: &str = "UPDATE outbox SET attempts = attempts + 1, next_attempt_ms = ?2 \
     WHERE id IN (SELECT id FROM outbox WHERE done = 0 AND next_attempt_ms <= ?1 ORDER BY id LIMIT ?3) \
     RETURNING id, notification_id, sink, body, attempts";
/// Settles an attempt: done (`?2`: 0 to try again at `?3`, 1 delivered, 2 given up).
pub(crate) const SETTLE_DELIVERY: &str =
    "UPDATE outbox SET done = ?2, next_attempt_ms = ?3 WHERE id = ?1";
/// Settled deliveries queued at or before `?1`.
pub(crate) const PRUNE_OUTBOX: &str = "DELETE FROM outbox WHERE done <> 0 AND queued_ms <= ?1";

// ---- retention ----

/// The id range `[first, end)` of heartbeat log rows received before `?1` (ids ascend in storing order).
pub(crate) const PRUNE_SPAN: &str = "SELECT COALESCE(MIN(id), 0), \
     COALESCE((SELECT id FROM heartbeat_log WHERE received_ms >= ?1 ORDER BY id LIMIT 1), MAX(id) + 1, 0) \
     FROM heartbeat_log";
pub(crate) const DELETE_LOG_RANGE: &str = "DELETE FROM heartbeat_log WHERE id >= ?1 AND id < ?2";

/// A statement in PostgreSQL's placeholder style: `?N` becomes `$N`. No statement here has a `?` in a
/// literal, so every `?` before a digit is a placeholder.
pub(crate) fn postgres(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        let placeholder = c == '?' && chars.peek().is_some_and(char::is_ascii_digit);
        out.push(if placeholder { '$' } else { c });
    }
    out
}

/// [`postgres`], with the selected rows locked until the transaction ends, so that two replicas judge one
/// cluster's heartbeats, enrolments or alert episodes one after the other.
pub(crate) fn postgres_locked(sql: &str) -> String {
    format!("{} FOR UPDATE", postgres(sql))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: &[&str] = &[
        SELECT_SEQUENCE,
        UPDATE_FROM_HEARTBEAT,
        INSERT_HEARTBEAT_LOG,
        INSERT_DRIFT,
        SELECT_BINDING,
        INSERT_CLUSTER,
        UPDATE_LABELS,
        UPDATE_REKEYED,
        SELECT_KEY,
        ALLOW_REKEY,
        DELETE_CLUSTER,
        DELETE_CLUSTER_RECORDS[0],
        DELETE_CLUSTER_RECORDS[1],
        DELETE_CLUSTER_RECORDS[2],
        LOG_SPAN,
        DELETE_CLUSTER_LOG_RANGE,
        LIST_CLUSTERS,
        LIST_WAITING,
        GET_CLUSTER,
        SELECT_DRIFT,
        COUNT_HEARTBEATS,
        PING,
        SELECT_EPISODE,
        UPSERT_EPISODE,
        CLAIM_NOTIFICATION,
        OPEN_EPISODES,
        PRUNE_SPAN,
        DELETE_LOG_RANGE,
    ];

    #[test]
    fn placeholders_become_postgres_style_and_nothing_else_changes() {
        assert_eq!(
            postgres("UPDATE t SET a = ?2, b = '?' WHERE name = ?1 AND c = ?10"),
            "UPDATE t SET a = $2, b = '?' WHERE name = $1 AND c = $10"
        );
        assert_eq!(
            postgres_locked(SELECT_EPISODE),
            "SELECT episode, open FROM alert_episodes WHERE cluster = $1 FOR UPDATE"
        );
    }

    #[test]
    fn every_statement_is_numbered_and_converts_completely() {
        for sql in ALL {
            let converted = postgres(sql);
            assert!(!converted.contains('?'), "{sql}");
            assert_eq!(
                converted.matches('$').count(),
                sql.matches('?').count(),
                "{sql}"
            );
        }
    }

    #[test]
    fn summary_columns_are_as_many_as_summary_from_row_reads() {
        let columns = summary_columns!().split(',').count();
        assert_eq!(columns, SUMMARY_COLUMNS);
        assert!(GET_CLUSTER.contains(", heartbeat FROM clusters"));
    }
}
