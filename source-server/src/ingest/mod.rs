//! Enrolment and heartbeat intake. The checks are pure functions ([`check_enroll`], [`check_heartbeat`]):
//! bytes and the bound key in, a verified heartbeat or a [`Refusal`] (with its HTTP status and a clear
//! message) out, nothing stored. Accepted heartbeats go through a bounded queue to one writer task
//! ([`run_writer`]) that stores them in batches, one transaction each (group commit), and answers each
//! request only after its batch committed. When the queue is full the handler answers 429 with
//! `Retry-After` at once: a slow disk sheds load instead of growing memory or latency.

//!
//! This folder is stage 3 of the server: data comes from [`crate::http`] (request bodies), is checked here
//! (signatures in batches by [`verify`]), and goes to [`crate::db`] and, once committed, to
//! [`crate::notify`] and the audit export. `enroll`, `heartbeat` and `admin` (rekey, forget: a
//! binding's lifecycle) are the HTTP handlers around these checks.

pub(crate) mod admin;
pub(crate) mod enroll;
pub(crate) mod heartbeat;
pub mod verify;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hyper::StatusCode;
use jiff::Timestamp;
use tokio::sync::{mpsc, oneshot};
use windvane_shared::crypto::dsse::{self, Envelope};
use windvane_shared::crypto::keys::{self, TrustedKeys};
use windvane_shared::wire::heartbeat::{
    EnrollRequest, HEARTBEAT_PAYLOAD_TYPE, Heartbeat, MAX_DRIFT_RECORDS_PER_HEARTBEAT,
    MAX_PROBLEMS_PER_HEARTBEAT,
};

use crate::db::{Database, Db, IngestOutcome, VerifiedHeartbeat};
use crate::fleet::metrics::{HeartbeatResult, Metrics};
use crate::notify;

/// Longest interval an agent may announce (the grace period is a multiple of it).
pub const MAX_INTERVAL_SECONDS: u64 = 24 * 3600;
/// Most labels a cluster may carry, and the longest key or value.
const MAX_LABELS: usize = 64;
const MAX_LABEL_LEN: usize = 317;

/// Why a request was refused: each maps to a 4xx (or 429/503) and a stable `reason` code in the JSON error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Malformed(String),
    TooLarge {
        limit: u64,
    },
    /// The body did not arrive in time (a stalled or trickling client).
    BodyTimeout {
        seconds: u64,
    },
    UnknownCluster(String),
    BadSignature(String),
    ClusterMismatch {
        url: String,
        signed: String,
    },
    FleetMismatch {
        enrolled: String,
        signed: String,
    },
    ClockSkew {
        sent_at: Timestamp,
        now: Timestamp,
        max_skew: Duration,
    },
    Replay {
        sequence: u64,
        last: u64,
    },
    KeyConflict(String),
    Overloaded {
        retry_after: u64,
    },
    Unavailable(String),
}

impl Refusal {
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::Malformed(_) | Refusal::ClockSkew { .. } => StatusCode::BAD_REQUEST,
            Refusal::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Refusal::UnknownCluster(_) => StatusCode::NOT_FOUND,
            Refusal::BadSignature(_) => StatusCode::UNAUTHORIZED,
            Refusal::ClusterMismatch { .. } | Refusal::FleetMismatch { .. } => {
                StatusCode::FORBIDDEN
            }
            Refusal::Replay { .. } | Refusal::KeyConflict(_) => StatusCode::CONFLICT,
            Refusal::Overloaded { .. } => StatusCode::TOO_MANY_REQUESTS,
            Refusal::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The stable code in the JSON error's `reason`.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::KeyConflict(_) => "key_conflict",
            Refusal::BodyTimeout { .. } => "body_timeout",
            other => other.metric().as_str(),
        }
    }

    pub fn metric(&self) -> HeartbeatResult {
        match self {
            Refusal::Malformed(_) | Refusal::BodyTimeout { .. } => HeartbeatResult::Malformed,
            Refusal::TooLarge { .. } => HeartbeatResult::TooLarge,
            Refusal::UnknownCluster(_) => HeartbeatResult::UnknownCluster,
            Refusal::BadSignature(_) | Refusal::KeyConflict(_) => HeartbeatResult::BadSignature,
            Refusal::ClusterMismatch { .. } | Refusal::FleetMismatch { .. } => {
                HeartbeatResult::ClusterMismatch
            }
            Refusal::ClockSkew { .. } => HeartbeatResult::ClockSkew,
            Refusal::Replay { .. } => HeartbeatResult::Replay,
            Refusal::Overloaded { .. } => HeartbeatResult::Overloaded,
            Refusal::Unavailable(_) => HeartbeatResult::Error,
        }
    }

    pub fn message(&self) -> String {
        match self {
            Refusal::Malformed(detail) => format!("malformed request: {detail}"),
            Refusal::TooLarge { limit } => format!("body larger than {limit} bytes"),
            Refusal::BodyTimeout { seconds } => {
                format!("the request body did not arrive within {seconds} s")
            }
            Refusal::UnknownCluster(name) => {
                format!("cluster {name} is not enrolled: enrol it first")
            }
            Refusal::BadSignature(detail) => format!("signature refused: {detail}"),
            Refusal::ClusterMismatch { url, signed } => {
                format!(
                    "heartbeat is signed for cluster {signed:?} but was sent for cluster {url:?}"
                )
            }
            Refusal::FleetMismatch { enrolled, signed } => {
                format!(
                    "heartbeat is for fleet {signed:?} but the cluster is enrolled in fleet {enrolled:?}"
                )
            }
            Refusal::ClockSkew {
                sent_at,
                now,
                max_skew,
            } => format!(
                "sent_at {sent_at} is more than {} away from the server's clock ({now}): check the cluster's clock",
                windvane_shared::text::duration::format_duration(*max_skew)
            ),
            Refusal::Replay { sequence, last } => {
                format!(
                    "sequence {sequence} is not above the last stored sequence {last} (replay or restarted counter)"
                )
            }
            Refusal::KeyConflict(name) => format!(
                "cluster {name} is enrolled with another key; an admin must run `windvane cluster rekey {name}` (or \
                 `forget`) first"
            ),
            Refusal::Overloaded { retry_after } => {
                format!("server busy; retry after {retry_after} s")
            }
            Refusal::Unavailable(detail) => format!("cannot store now: {detail}"),
        }
    }
}

/// The key a cluster enrolled with, ready for checking its signatures.
#[derive(Debug, Clone)]
pub struct ClusterKey {
    pub fleet: String,
    pub keyid: String,
    pub trusted: TrustedKeys,
}

impl ClusterKey {
    /// From the stored `(fleet, keyid, PEM)`; `None` if the stored PEM no longer reads (never expected).
    pub fn from_stored(cluster: &str, fleet: String, pem: &str) -> Option<ClusterKey> {
        let key = keys::verifying_key_from_pem(pem, cluster).ok()?;
        let mut trusted = TrustedKeys::new();
        let keyid = trusted.insert(key).ok()?;
        Some(ClusterKey {
            fleet,
            keyid,
            trusted,
        })
    }
}

/// A checked enrolment: the key's id and its normalised PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedEnroll {
    pub keyid: String,
    pub public_key_pem: String,
}

/// Checks an enrolment body (the token is checked by the caller, before this): names, labels, and a strong
/// Ed25519 public key.
pub fn check_enroll(url_cluster: &str, request: &EnrollRequest) -> Result<CheckedEnroll, Refusal> {
    check_fleet_name(&request.fleet)?;
    check_labels(&request.labels)?;
    let key = keys::verifying_key_from_pem(
        &request.public_key,
        &format!("public key of cluster {url_cluster}"),
    )
    .map_err(|e| Refusal::Malformed(e.to_string()))?;
    Ok(CheckedEnroll {
        keyid: keys::keyid(&key),
        public_key_pem: keys::verifying_key_to_pem(&key),
    })
}

fn check_fleet_name(fleet: &str) -> Result<(), Refusal> {
    if fleet.is_empty() || fleet.len() > 253 || !fleet.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Refusal::Malformed(format!("invalid fleet name {fleet:?}")));
    }
    Ok(())
}

fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), Refusal> {
    if labels.len() > MAX_LABELS {
        return Err(Refusal::Malformed(format!(
            "{} labels, at most {MAX_LABELS}",
            labels.len()
        )));
    }
    for (key, value) in labels {
        if key.is_empty() || key.len() > MAX_LABEL_LEN || value.len() > MAX_LABEL_LEN {
            return Err(Refusal::Malformed(format!(
                "label {key:?} is empty or too long"
            )));
        }
    }
    Ok(())
}

/// Checks a heartbeat body against the cluster's bound key, in order: envelope, payload type and signature
/// (before anything in the payload is believed), payload, cluster and fleet names, limits, and the clock.
/// The sequence is judged later against the stored row, inside the batch's transaction. The server does the
/// same in two halves around a batched signature check ([`open_heartbeat`], [`finish_heartbeat`]).
pub fn check_heartbeat(
    url_cluster: &str,
    body: &[u8],
    key: &ClusterKey,
    now: Timestamp,
    max_skew: Duration,
) -> Result<VerifiedHeartbeat, Refusal> {
    let signed = open_heartbeat(body, key)?;
    finish_heartbeat(
        url_cluster,
        signed,
        |candidate, message| {
            candidate
                .signature
                .is_some_and(|sig| candidate.key.verify_strict(message, &sig).is_ok())
        },
        key,
        now,
        max_skew,
    )
}

/// A heartbeat body read as an envelope for the bound key, its signatures not checked yet.
#[derive(Debug)]
pub struct SignedHeartbeat {
    parts: dsse::SignedParts,
}

impl SignedHeartbeat {
    /// The signature checks to make, one per signature by the bound key (agents send one). The signed
    /// message moves into them: [`finish_heartbeat`] then needs a `verified` that does not look at it.
    pub fn take_checks(&mut self) -> Vec<verify::Check> {
        let message = std::mem::take(&mut self.parts.message);
        let mut checks: Vec<verify::Check> = self
            .parts
            .candidates
            .iter()
            .filter_map(|c| {
                Some(verify::Check {
                    message: Vec::new(),
                    key: c.key,
                    signature: c.signature?,
                })
            })
            .collect();
        if let Some((last, others)) = checks.split_last_mut() {
            for check in others {
                check.message.clone_from(&message);
            }
            last.message = message;
        }
        checks
    }
}

/// The first half of [`check_heartbeat`]: the envelope, its payload type, and the signatures to check.
pub fn open_heartbeat(body: &[u8], key: &ClusterKey) -> Result<SignedHeartbeat, Refusal> {
    let envelope =
        Envelope::from_json_slice(body).map_err(|e| Refusal::Malformed(e.to_string()))?;
    let parts = dsse::signed_parts(&envelope, HEARTBEAT_PAYLOAD_TYPE, &key.trusted)
        .map_err(|e| Refusal::Malformed(e.to_string()))?;
    Ok(SignedHeartbeat { parts })
}

/// The second half of [`check_heartbeat`]: `verified` says whether each signature by the bound key verified
/// (asked in order until one did, as [`dsse::SignedParts::decide`]); then the payload's checks.
pub fn finish_heartbeat(
    url_cluster: &str,
    signed: SignedHeartbeat,
    verified: impl FnMut(&dsse::Candidate, &[u8]) -> bool,
    key: &ClusterKey,
    now: Timestamp,
    max_skew: Duration,
) -> Result<VerifiedHeartbeat, Refusal> {
    let (payload, keyid) = signed.parts.decide(verified).map_err(|e| {
        Refusal::BadSignature(format!(
            "{e}; cluster {url_cluster} is enrolled with key {}",
            key.keyid
        ))
    })?;
    let heartbeat: Heartbeat = serde_json::from_slice(&payload)
        .map_err(|e| Refusal::Malformed(format!("heartbeat payload: {e}")))?;
    if heartbeat.cluster != url_cluster {
        return Err(Refusal::ClusterMismatch {
            url: url_cluster.to_owned(),
            signed: heartbeat.cluster,
        });
    }
    if heartbeat.fleet != key.fleet {
        return Err(Refusal::FleetMismatch {
            enrolled: key.fleet.clone(),
            signed: heartbeat.fleet,
        });
    }
    if heartbeat.sequence == 0 || i64::try_from(heartbeat.sequence).is_err() {
        return Err(Refusal::Malformed(format!(
            "sequence {} is outside 1..=2^63-1",
            heartbeat.sequence
        )));
    }
    if !(1..=MAX_INTERVAL_SECONDS).contains(&heartbeat.interval_seconds) {
        return Err(Refusal::Malformed(format!(
            "intervalSeconds {} is outside 1..={MAX_INTERVAL_SECONDS}",
            heartbeat.interval_seconds
        )));
    }
    if heartbeat.drift.len() > MAX_DRIFT_RECORDS_PER_HEARTBEAT
        || heartbeat.problems.len() > MAX_PROBLEMS_PER_HEARTBEAT
    {
        return Err(Refusal::Malformed(
            "too many drift records or problems in one heartbeat".to_owned(),
        ));
    }
    check_labels(&heartbeat.labels)?;
    let skew = heartbeat
        .sent_at
        .as_millisecond()
        .abs_diff(now.as_millisecond());
    if u128::from(skew) > max_skew.as_millis() {
        return Err(Refusal::ClockSkew {
            sent_at: heartbeat.sent_at,
            now,
            max_skew,
        });
    }
    let payload = String::from_utf8(payload)
        .map_err(|_| Refusal::Malformed("payload is not UTF-8".to_owned()))?;
    Ok(VerifiedHeartbeat {
        keyid,
        received_at: now,
        heartbeat,
        payload,
    })
}

/// The interval to ask for next: the agent's own, doubled (up to 5 minutes) while the queue is over half full.
pub fn next_interval(agent_interval: u64, queued: usize, capacity: usize) -> u64 {
    if capacity > 0 && queued * 2 > capacity {
        (agent_interval.saturating_mul(2))
            .min(300)
            .max(agent_interval)
    } else {
        agent_interval
    }
}

/// One heartbeat waiting in the queue, with where to send its outcome.
#[derive(Debug)]
pub struct IngestJob {
    pub heartbeat: VerifiedHeartbeat,
    pub reply: oneshot::Sender<crate::Result<IngestOutcome>>,
}

/// A batch commit at least this slow is worth a warning: every heartbeat in it, and every one queued behind
/// it, waited that long for its answer (the p99 goal for a whole answer is 50 ms).
const SLOW_COMMIT: Duration = Duration::from_millis(250);
/// At most one slow-commit warning per this period, so that a disk that stays slow is reported, not flooded.
const SLOW_COMMIT_REPORT_EVERY: Duration = Duration::from_secs(10);

/// Counts slow batch commits and says when to report them: the first at once, then at most one summary per
/// [`SLOW_COMMIT_REPORT_EVERY`].
#[derive(Debug, Default)]
struct SlowCommits {
    /// Slow commits since the last report, and the slowest of them.
    count: u64,
    slowest: Duration,
    last_report: Option<std::time::Instant>,
}

/// What a slow-commit warning says.
#[derive(Debug, PartialEq, Eq)]
struct SlowCommitReport {
    count: u64,
    slowest: Duration,
}

impl SlowCommits {
    fn record(&mut self, took: Duration, now: std::time::Instant) -> Option<SlowCommitReport> {
        if took < SLOW_COMMIT {
            return None;
        }
        self.count += 1;
        self.slowest = self.slowest.max(took);
        let due = self
            .last_report
            .is_none_or(|last| now.duration_since(last) >= SLOW_COMMIT_REPORT_EVERY);
        if !due {
            return None;
        }
        self.last_report = Some(now);
        let report = SlowCommitReport {
            count: self.count,
            slowest: self.slowest,
        };
        self.count = 0;
        self.slowest = Duration::ZERO;
        Some(report)
    }
}

/// The writer task: takes whatever is queued (at most `max_batch`), stores it in one transaction, answers
/// every job, tells the notifier about accepted heartbeats, and repeats until the queue closes.
pub async fn run_writer(
    db: Arc<Db>,
    mut queue: mpsc::Receiver<IngestJob>,
    max_batch: usize,
    metrics: Arc<Metrics>,
    notifier: Option<mpsc::Sender<notify::Event>>,
    audit: Option<mpsc::Sender<Vec<String>>>,
) {
    let mut jobs: Vec<IngestJob> = Vec::with_capacity(max_batch);
    let mut slow = SlowCommits::default();
    while queue.recv_many(&mut jobs, max_batch).await > 0 {
        metrics
            .ingest_queue_depth
            .set(i64::try_from(queue.len()).unwrap_or(i64::MAX));
        let (batch, replies): (Vec<VerifiedHeartbeat>, Vec<_>) =
            jobs.drain(..).map(|j| (j.heartbeat, j.reply)).unzip();
        let batch: Arc<[VerifiedHeartbeat]> = batch.into();
        let span = tracing::debug_span!("ingest_batch", size = batch.len());
        let started = std::time::Instant::now();
        let result = tracing::Instrument::instrument(db.ingest(Arc::clone(&batch)), span).await;
        let took = started.elapsed();
        metrics.ingest_commit_seconds.observe(took.as_secs_f64());
        if let Some(report) = slow.record(took, std::time::Instant::now()) {
            tracing::warn!(
                slow_batches = report.count,
                slowest_ms = report.slowest.as_millis() as u64,
                last_batch = batch.len(),
                queued = queue.len(),
                "storing heartbeats took over {} ms; their answers waited (a slow or busy disk? see \
                 windvane_ingest_commit_duration_seconds)",
                SLOW_COMMIT.as_millis()
            );
        }
        metrics.ingest_batches.inc();
        match result {
            Ok(outcomes) => {
                for ((heartbeat, reply), outcome) in batch.iter().zip(replies).zip(outcomes) {
                    if let IngestOutcome::Accepted { .. } = &outcome {
                        count_drift(&metrics, &heartbeat.heartbeat.drift);
                    }
                    if let (IngestOutcome::Accepted { .. }, Some(audit)) = (&outcome, &audit)
                        && !heartbeat.heartbeat.drift.is_empty()
                    {
                        let h = &heartbeat.heartbeat;
                        let lines = h
                            .drift
                            .iter()
                            .map(|r| {
                                notify::audit::line(
                                    &h.cluster,
                                    h.source.applied_serial,
                                    heartbeat.received_at,
                                    r,
                                )
                            })
                            .collect();
                        if audit.try_send(lines).is_err() {
                            tracing::warn!(cluster = %h.cluster, "audit export queue full; drift lines dropped");
                        }
                    }
                    if let (IngestOutcome::Accepted { previous }, Some(notifier)) =
                        (&outcome, &notifier)
                    {
                        let event = notify::Event::from_heartbeat(heartbeat, *previous);
                        if notifier.try_send(event).is_err() {
                            metrics.notification("dropped");
                        }
                    }
                    let _ = reply.send(Ok(outcome));
                }
            }
            Err(error) => {
                tracing::error!(%error, "storing heartbeats failed");
                // One failed transaction answers every heartbeat it held.
                let error = Arc::new(error);
                for reply in replies {
                    let _ = reply.send(Err(crate::Error::BatchNotStored(Arc::clone(&error))));
                }
            }
        }
    }
}

/// Counts an accepted heartbeat's drift records by severity (`windvane_drift_events_total`).
fn count_drift(metrics: &Metrics, drift: &[windvane_shared::wire::heartbeat::DriftRecord]) {
    let critical = drift
        .iter()
        .filter(|r| notify::drift_severity(r) == notify::Severity::Critical)
        .count();
    metrics.drift(drift.len(), critical);
}

#[cfg(test)]
mod tests {
    use super::*;
    use windvane_shared::crypto::keys::{signing_key_from_seed, verifying_key_to_pem};
    use windvane_shared::wire::heartbeat::SourceReport;
    use windvane_shared::wire::status::SyncState;

    fn now() -> Timestamp {
        Timestamp::from_second(1_800_000_000).expect("valid")
    }

    #[test]
    fn slow_commits_are_reported_at_once_then_summarised_at_most_every_period() {
        let start = std::time::Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let slow = |ms: u64| Duration::from_millis(ms);
        let mut commits = SlowCommits::default();
        assert_eq!(
            commits.record(slow(3), at(0)),
            None,
            "a fast commit is not news"
        );
        assert_eq!(
            commits.record(slow(300), at(1)),
            Some(SlowCommitReport {
                count: 1,
                slowest: slow(300)
            })
        );
        assert_eq!(commits.record(slow(900), at(2_000)), None);
        assert_eq!(commits.record(slow(400), at(5_000)), None);
        assert_eq!(commits.record(slow(5), at(9_000)), None);
        assert_eq!(
            commits.record(slow(260), at(10_001)),
            Some(SlowCommitReport {
                count: 3,
                slowest: slow(900)
            }),
            "the summary counts every slow commit since the last report and keeps the slowest"
        );
        assert_eq!(commits.record(slow(260), at(12_000)), None);
        assert_eq!(
            commits.record(slow(250), at(20_001)).map(|r| r.count),
            Some(2)
        );
    }

    fn heartbeat(cluster: &str, sequence: u64, sent_at: Timestamp) -> Heartbeat {
        Heartbeat {
            cluster: cluster.into(),
            fleet: "acme".into(),
            sequence,
            sent_at,
            interval_seconds: 30,
            agent_version: "test".into(),
            labels: BTreeMap::new(),
            state: SyncState::Synced,
            source: SourceReport {
                channel: "stable".into(),
                ..SourceReport::default()
            },
            counts: BTreeMap::new(),
            apps: vec![],
            problems: vec![],
            drift: vec![],
            last_error: None,
        }
    }

    fn signed(hb: &Heartbeat, seed: u8) -> Vec<u8> {
        let key = signing_key_from_seed([seed; 32]);
        dsse::sign(
            HEARTBEAT_PAYLOAD_TYPE,
            &serde_json::to_vec(hb).expect("json"),
            &key,
        )
        .to_json_bytes()
    }

    fn bound(seed: u8) -> ClusterKey {
        let pem = verifying_key_to_pem(&signing_key_from_seed([seed; 32]).verifying_key());
        ClusterKey::from_stored("c1", "acme".into(), &pem).expect("key")
    }

    const SKEW: Duration = Duration::from_secs(300);

    #[test]
    fn a_good_heartbeat_passes() {
        let body = signed(&heartbeat("c1", 1, now()), 1);
        let verified = check_heartbeat("c1", &body, &bound(1), now(), SKEW).expect("accepted");
        assert_eq!(verified.heartbeat.sequence, 1);
        assert_eq!(verified.keyid, bound(1).keyid);
        assert_eq!(verified.received_at, now());
    }

    #[test]
    fn a_spoofed_key_is_a_bad_signature() {
        let body = signed(&heartbeat("c1", 1, now()), 2);
        let refusal = check_heartbeat("c1", &body, &bound(1), now(), SKEW).unwrap_err();
        assert!(matches!(refusal, Refusal::BadSignature(_)), "{refusal:?}");
        assert_eq!(refusal.status(), StatusCode::UNAUTHORIZED);
    }

    #[test]
    fn a_tampered_payload_is_a_bad_signature() {
        let mut envelope =
            Envelope::from_json_slice(&signed(&heartbeat("c1", 1, now()), 1)).expect("parse");
        let tampered = heartbeat("c1", 99, now());
        use base64::Engine as _;
        envelope.payload = base64::engine::general_purpose::STANDARD
            .encode(serde_json::to_vec(&tampered).expect("json"));
        let refusal =
            check_heartbeat("c1", &envelope.to_json_bytes(), &bound(1), now(), SKEW).unwrap_err();
        assert!(matches!(refusal, Refusal::BadSignature(_)), "{refusal:?}");
    }

    #[test]
    fn clock_skew_both_ways_is_refused() {
        for offset in [-301, 301] {
            let sent = Timestamp::from_second(now().as_second() + offset).expect("valid");
            let body = signed(&heartbeat("c1", 1, sent), 1);
            let refusal = check_heartbeat("c1", &body, &bound(1), now(), SKEW).unwrap_err();
            assert!(
                matches!(refusal, Refusal::ClockSkew { .. }),
                "{offset}: {refusal:?}"
            );
            assert_eq!(refusal.status(), StatusCode::BAD_REQUEST);
        }
        for offset in [-300, 300] {
            let sent = Timestamp::from_second(now().as_second() + offset).expect("valid");
            check_heartbeat(
                "c1",
                &signed(&heartbeat("c1", 1, sent), 1),
                &bound(1),
                now(),
                SKEW,
            )
            .expect("at the edge");
        }
    }

    #[test]
    fn the_signed_cluster_and_fleet_must_match() {
        let body = signed(&heartbeat("c2", 1, now()), 1);
        let refusal = check_heartbeat("c1", &body, &bound(1), now(), SKEW).unwrap_err();
        assert!(
            matches!(refusal, Refusal::ClusterMismatch { .. }),
            "{refusal:?}"
        );
        let mut other_fleet = heartbeat("c1", 1, now());
        other_fleet.fleet = "other".into();
        let refusal =
            check_heartbeat("c1", &signed(&other_fleet, 1), &bound(1), now(), SKEW).unwrap_err();
        assert!(
            matches!(refusal, Refusal::FleetMismatch { .. }),
            "{refusal:?}"
        );
    }

    #[test]
    fn malformed_bodies_are_refused() {
        let key = bound(1);
        for body in [
            &b""[..],
            b"{",
            b"null",
            b"{\"payload\":\"\",\"payloadType\":\"x\",\"signatures\":[]}",
        ] {
            let refusal = check_heartbeat("c1", body, &key, now(), SKEW).unwrap_err();
            assert!(matches!(refusal, Refusal::Malformed(_)), "{refusal:?}");
        }
        let other_type =
            dsse::sign("application/other", b"{}", &signing_key_from_seed([1; 32])).to_json_bytes();
        assert!(matches!(
            check_heartbeat("c1", &other_type, &key, now(), SKEW),
            Err(Refusal::Malformed(_))
        ));
        let not_a_heartbeat = dsse::sign(
            HEARTBEAT_PAYLOAD_TYPE,
            b"{\"x\":1}",
            &signing_key_from_seed([1; 32]),
        );
        assert!(matches!(
            check_heartbeat("c1", &not_a_heartbeat.to_json_bytes(), &key, now(), SKEW),
            Err(Refusal::Malformed(_))
        ));
        let mut zero = heartbeat("c1", 0, now());
        assert!(matches!(
            check_heartbeat("c1", &signed(&zero, 1), &key, now(), SKEW),
            Err(Refusal::Malformed(_))
        ));
        zero.sequence = 1;
        zero.interval_seconds = 0;
        assert!(matches!(
            check_heartbeat("c1", &signed(&zero, 1), &key, now(), SKEW),
            Err(Refusal::Malformed(_))
        ));
    }

    #[test]
    fn enrolment_needs_a_strong_public_key() {
        let pem = verifying_key_to_pem(&signing_key_from_seed([3; 32]).verifying_key());
        let request = EnrollRequest {
            token: "t".into(),
            fleet: "acme".into(),
            public_key: pem,
            labels: BTreeMap::new(),
        };
        let checked = check_enroll("c1", &request).expect("ok");
        assert_eq!(checked.keyid.len(), 64);
        let bad = EnrollRequest {
            public_key: "nope".into(),
            ..request.clone()
        };
        assert!(matches!(
            check_enroll("c1", &bad),
            Err(Refusal::Malformed(_))
        ));
        let no_fleet = EnrollRequest {
            fleet: String::new(),
            ..request
        };
        assert!(matches!(
            check_enroll("c1", &no_fleet),
            Err(Refusal::Malformed(_))
        ));
    }

    #[test]
    fn intervals_stretch_under_load() {
        assert_eq!(next_interval(30, 0, 100), 30);
        assert_eq!(next_interval(30, 51, 100), 60);
        assert_eq!(next_interval(200, 99, 100), 300);
        assert_eq!(next_interval(600, 99, 100), 600);
    }

    #[test]
    fn refusal_statuses() {
        assert_eq!(
            Refusal::Replay {
                sequence: 1,
                last: 2
            }
            .status(),
            StatusCode::CONFLICT
        );
        assert_eq!(
            Refusal::TooLarge { limit: 1 }.status(),
            StatusCode::PAYLOAD_TOO_LARGE
        );
        assert_eq!(
            Refusal::UnknownCluster("x".into()).status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            Refusal::Overloaded { retry_after: 1 }.status(),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert!(
            Refusal::KeyConflict("c".into())
                .message()
                .contains("windvane cluster rekey c")
        );
    }

    #[test]
    fn accepted_drift_is_counted_by_severity() {
        let record = |group: &str, kind: &str| windvane_shared::wire::heartbeat::DriftRecord {
            app: "a".into(),
            group: group.into(),
            kind: kind.into(),
            namespace: Some("ns".into()),
            name: "x".into(),
            fields: vec!["spec.replicas".into()],
            deleted: false,
            manager: None,
            operation: None,
            changed_at: None,
            detected_at: Timestamp::from_second(1_800_000_000).expect("valid"),
            reverted_at: None,
            action: windvane_shared::wire::heartbeat::DriftAction::Reverted,
            break_glass: None,
            revert_requested_by: None,
        };
        let metrics = Metrics::default();
        count_drift(
            &metrics,
            &[
                record("rbac.authorization.k8s.io", "Role"),
                record("apps", "Deployment"),
                record("apps", "Deployment"),
            ],
        );
        let text =
            crate::fleet::metrics::render(&metrics, &crate::fleet::metrics::FleetGauges::default());
        assert!(
            text.contains("windvane_drift_events_total{severity=\"critical\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("windvane_drift_events_total{severity=\"warning\"} 2\n"),
            "{text}"
        );
    }
}
