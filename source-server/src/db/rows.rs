//! The row mapping both backends share: each statement's result row read into its type once, through
//! [`Columns`], which `rusqlite::Row` and `tokio_postgres::Row` both implement. The statements are in
//! [`super::sql`]; the column order each function reads is the one its statement selects.

use windvane_shared::wire::status::SyncState;

use super::{
    Binding, ClusterSummary, DriftEntry, Episode, QueuedDelivery, RecentFailures, SequenceState,
    from_ms, labels_from_json, rekey_deadline, to_u64,
};
use crate::fleet::status::parse_sync_state;

/// A result row, by column index; both drivers' errors name the column and type on a mismatch.
pub(crate) trait Columns {
    type Error;
    fn text(&self, i: usize) -> Result<String, Self::Error>;
    fn opt_text(&self, i: usize) -> Result<Option<String>, Self::Error>;
    fn int(&self, i: usize) -> Result<i64, Self::Error>;
    fn opt_int(&self, i: usize) -> Result<Option<i64>, Self::Error>;
}

impl Columns for rusqlite::Row<'_> {
    type Error = rusqlite::Error;
    fn text(&self, i: usize) -> rusqlite::Result<String> {
        self.get(i)
    }
    fn opt_text(&self, i: usize) -> rusqlite::Result<Option<String>> {
        self.get(i)
    }
    fn int(&self, i: usize) -> rusqlite::Result<i64> {
        self.get(i)
    }
    fn opt_int(&self, i: usize) -> rusqlite::Result<Option<i64>> {
        self.get(i)
    }
}

impl Columns for tokio_postgres::Row {
    type Error = tokio_postgres::Error;
    fn text(&self, i: usize) -> Result<String, tokio_postgres::Error> {
        self.try_get(i)
    }
    fn opt_text(&self, i: usize) -> Result<Option<String>, tokio_postgres::Error> {
        self.try_get(i)
    }
    fn int(&self, i: usize) -> Result<i64, tokio_postgres::Error> {
        self.try_get(i)
    }
    fn opt_int(&self, i: usize) -> Result<Option<i64>, tokio_postgres::Error> {
        self.try_get(i)
    }
}

/// A [`ClusterSummary`] from the columns `summary_columns!` names ([`super::sql::LIST_CLUSTERS`],
/// [`super::sql::GET_CLUSTER`]).
pub(crate) fn summary<R: Columns>(r: &R) -> Result<ClusterSummary, R::Error> {
    Ok(ClusterSummary {
        name: r.text(0)?,
        fleet: r.text(1)?,
        keyid: r.text(2)?,
        labels: labels_from_json(&r.text(3)?),
        enrolled_at: from_ms(r.int(4)?),
        rekey_allowed_until: rekey_deadline(r.int(5)?),
        last_sequence: to_u64(r.int(6)?),
        last_seen: r.opt_int(7)?.map(from_ms),
        interval_seconds: r.opt_int(8)?.map(to_u64),
        state: r.opt_text(9)?.as_deref().and_then(parse_sync_state),
        channel: r.opt_text(10)?,
        applied_serial: r.opt_int(11)?.map(to_u64),
        last_error: r.opt_text(12)?,
        drift_total: to_u64(r.int(13)?),
        public_key: r.text(14)?,
    })
}

/// A cluster's summary and its latest heartbeat ([`super::sql::GET_CLUSTER`]).
pub(crate) fn summary_and_report<R: Columns>(
    r: &R,
) -> Result<(ClusterSummary, Option<String>), R::Error> {
    Ok((summary(r)?, r.opt_text(super::sql::SUMMARY_COLUMNS)?))
}

/// The bound key and sequence, and the state reported last ([`super::sql::SELECT_SEQUENCE`]).
pub(crate) fn sequence<R: Columns>(r: &R) -> Result<(SequenceState, Option<SyncState>), R::Error> {
    Ok((
        SequenceState {
            keyid: r.text(0)?,
            last_sequence: to_u64(r.int(1)?),
        },
        r.opt_text(2)?.as_deref().and_then(parse_sync_state),
    ))
}

/// What a name is bound to ([`super::sql::SELECT_BINDING`]).
pub(crate) fn binding<R: Columns>(r: &R) -> Result<Binding, R::Error> {
    Ok(Binding {
        fleet: r.text(0)?,
        keyid: r.text(1)?,
        rekey_until: rekey_deadline(r.int(2)?),
    })
}

/// `(fleet, keyid, public key PEM)` ([`super::sql::SELECT_KEY`]).
pub(crate) fn key<R: Columns>(r: &R) -> Result<(String, String, String), R::Error> {
    Ok((r.text(0)?, r.text(1)?, r.text(2)?))
}

/// `(name, payload)` of a waiting cluster ([`super::sql::LIST_WAITING`]).
pub(crate) fn waiting<R: Columns>(r: &R) -> Result<(String, String), R::Error> {
    Ok((r.text(0)?, r.text(1)?))
}

/// A drift log row ([`super::sql::SELECT_DRIFT`]); `None` when its stored record no longer parses (it is
/// left out of the answer rather than failing the whole page).
pub(crate) fn drift<R: Columns>(r: &R) -> Result<Option<DriftEntry>, R::Error> {
    let Ok(record) = serde_json::from_str(&r.text(3)?) else {
        return Ok(None);
    };
    Ok(Some(DriftEntry {
        cluster: r.text(0)?,
        sequence: to_u64(r.int(1)?),
        received_at: from_ms(r.int(2)?),
        record,
    }))
}

/// A cluster's alert episode ([`super::sql::SELECT_EPISODE`]).
pub(crate) fn episode<R: Columns>(r: &R) -> Result<Episode, R::Error> {
    Ok(Episode {
        number: to_u64(r.int(0)?),
        open: r.int(1)? != 0,
    })
}

/// A delivery taken for an attempt ([`super::sql::TAKE_DUE_DELIVERIES`]).
pub(crate) fn delivery<R: Columns>(r: &R) -> Result<QueuedDelivery, R::Error> {
    Ok(QueuedDelivery {
        id: r.int(0)?,
        notification_id: r.text(1)?,
        sink: r.text(2)?,
        body: r.text(3)?,
        attempts: u32::try_from(r.int(4)?).unwrap_or(u32::MAX),
    })
}

/// An address's recent wrong tokens ([`super::sql::RECENT_TOKEN_FAILURES`]).
pub(crate) fn token_failures<R: Columns>(r: &R) -> Result<RecentFailures, R::Error> {
    Ok(RecentFailures {
        count: to_u64(r.int(0)?),
        oldest: r.opt_int(1)?.map(from_ms),
    })
}

/// An id range `[first, end)` ([`super::sql::LOG_SPAN`], [`super::sql::PRUNE_SPAN`]).
pub(crate) fn span<R: Columns>(r: &R) -> Result<(i64, i64), R::Error> {
    Ok((r.int(0)?, r.int(1)?))
}

#[cfg(test)]
mod tests {
    use jiff::Timestamp;

    use super::*;

    /// The mapping read from a real SQLite row, as the SQLite backend reads it.
    #[test]
    fn a_summary_row_maps_every_column_and_null() {
        let conn = rusqlite::Connection::open_in_memory().expect("sqlite");
        let row = conn
            .query_row(
                "SELECT 'c1', 'acme', 'k1', '{\"env\":\"prod\"}', 1800000000000, 0, 7, NULL, 30, \
                 'Synced', 'stable', NULL, NULL, 2, 'PEM', '{\"hb\":1}'",
                [],
                |r| summary_and_report(r),
            )
            .expect("row");
        let (summary, report) = row;
        assert_eq!(summary.name, "c1");
        assert_eq!(summary.labels.get("env").map(String::as_str), Some("prod"));
        assert_eq!(
            summary.enrolled_at,
            Timestamp::from_millisecond(1_800_000_000_000).expect("time")
        );
        assert_eq!(summary.rekey_allowed_until, None);
        assert_eq!(summary.last_sequence, 7);
        assert_eq!(summary.last_seen, None);
        assert_eq!(summary.interval_seconds, Some(30));
        assert_eq!(summary.state, Some(SyncState::Synced));
        assert_eq!(summary.applied_serial, None);
        assert_eq!(summary.drift_total, 2);
        assert_eq!(report.as_deref(), Some("{\"hb\":1}"));
    }

    #[test]
    fn a_drift_row_whose_record_no_longer_parses_is_left_out() {
        let conn = rusqlite::Connection::open_in_memory().expect("sqlite");
        let entry = conn
            .query_row("SELECT 'c1', 3, 5, 'not json'", [], |r| drift(r))
            .expect("row");
        assert_eq!(entry, None);
    }
}
