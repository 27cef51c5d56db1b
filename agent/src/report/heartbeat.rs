//! Heartbeats to the source server. The agent's identity is an Ed25519 key kept in a Secret in its namespace
//! (made on first start); it enrols once with the fleet's registration token, binding that key to the
//! cluster's name, then signs every heartbeat as a DSSE envelope. A heartbeat goes out every interval
//! (jittered) and at once when the cluster's state changes; while the server is away the agent backs off and
//! keeps its drift records until a heartbeat carrying them is acknowledged. When the server stops accepting
//! the key (404: an admin forgot the cluster; 401: another key is bound to the name) the agent enrols again,
//! which the server grants only for a free name or one an admin allowed to rekey (409 otherwise: the agent
//! says so and retries slowly).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ed25519_dalek::SigningKey;
use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use reqwest::StatusCode;
use tokio::sync::watch;
use tracing::{debug, info, warn};
use windvane_shared::crypto::dsse;
use windvane_shared::crypto::keys::{
    signing_key_from_pem, signing_key_from_seed, signing_key_to_pem, verifying_key_to_pem,
};
use windvane_shared::decide::render::ClusterIdentity;
use windvane_shared::wire::heartbeat::{
    EnrollOutcome, EnrollReply, EnrollRequest, HEARTBEAT_PAYLOAD_TYPE, Heartbeat, HeartbeatReply,
    MAX_DRIFT_RECORDS_PER_HEARTBEAT, MAX_PROBLEMS_PER_HEARTBEAT,
};
use windvane_shared::wire::status::SyncState;

use crate::backoff::{after_busy, full_jitter, jittered, random_unit};
use crate::fetch::http::{fetch_error, read_capped, with_deadline};
use crate::kube::cluster::api_message;
use crate::report::metrics::Metrics;
use crate::report::status::{AgentStatus, StatusRx};
use crate::{Error, Result, clamp};

/// Total deadline of one enrolment or heartbeat request, its reply read whole.
const REPLY_DEADLINE: Duration = Duration::from_secs(30);

/// Name of the Secret holding the cluster's identity key.
pub const IDENTITY_SECRET: &str = "windvane-identity";

/// Where and how to report.
#[derive(Debug, Clone)]
pub struct ReporterConfig {
    pub server: String,
    /// The fleet registration token (a secret: never logged).
    pub token: String,
    pub fleet: String,
    pub identity: ClusterIdentity,
    pub interval: Duration,
    pub namespace: String,
}

/// Loads the identity key from its Secret, creating it on first start. Two replicas starting together both
/// try to create it; the loser reads the winner's.
pub async fn identity_key(client: kube::Client, namespace: &str) -> Result<SigningKey> {
    let secrets: Api<Secret> = Api::namespaced(client, namespace);
    let object = format!("Secret {namespace}/{IDENTITY_SECRET}");
    let state_error = |e: &kube::Error| Error::State {
        object: object.clone(),
        detail: api_message(e),
    };
    let read = |secret: Secret| key_of_secret(secret, &object);
    if let Some(secret) = secrets
        .get_opt(IDENTITY_SECRET)
        .await
        .map_err(|e| state_error(&e))?
    {
        return read(secret);
    }
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| Error::State {
        object: object.clone(),
        detail: format!("random source: {e}"),
    })?;
    let key = signing_key_from_seed(seed);
    seed.fill(0);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(IDENTITY_SECRET.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "key.pem".to_owned(),
            ByteString(signing_key_to_pem(&key).into_bytes()),
        )])),
        type_: Some("Opaque".to_owned()),
        ..Secret::default()
    };
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            info!(secret = %object, "created the cluster identity key");
            Ok(key)
        }
        Err(kube::Error::Api(status)) if status.code == 409 => read(
            secrets
                .get(IDENTITY_SECRET)
                .await
                .map_err(|e| state_error(&e))?,
        ),
        Err(e) => Err(state_error(&e)),
    }
}

/// The identity key held in the identity Secret's `key.pem`.
pub fn key_of_secret(secret: Secret, object: &str) -> Result<SigningKey> {
    let pem = secret
        .data
        .and_then(|mut d| d.remove("key.pem"))
        .ok_or_else(|| Error::StateCorrupt {
            object: object.to_owned(),
            detail: "no key.pem".to_owned(),
        })?;
    let pem = String::from_utf8(pem.0).map_err(|e| Error::StateCorrupt {
        object: object.to_owned(),
        detail: e.to_string(),
    })?;
    Ok(signing_key_from_pem(&pem, object)?)
}

/// Builds this cycle's heartbeat from the agent's status. Pure.
pub fn build_heartbeat(
    status: &AgentStatus,
    config: &ReporterConfig,
    sequence: u64,
    sent_at: Timestamp,
    drift_since: Option<Timestamp>,
) -> Heartbeat {
    let changed =
        |r: &windvane_shared::wire::heartbeat::DriftRecord| r.reverted_at.unwrap_or(r.detected_at);
    let drift: Vec<_> = status
        .drift
        .iter()
        .filter(|r| drift_since.is_none_or(|since| changed(r) > since))
        .take(MAX_DRIFT_RECORDS_PER_HEARTBEAT)
        .cloned()
        .collect();
    Heartbeat {
        cluster: config.identity.name.clone(),
        fleet: config.fleet.clone(),
        sequence,
        sent_at,
        interval_seconds: config.interval.as_secs().max(1),
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        labels: config.identity.labels.clone(),
        state: status.cluster_state(),
        source: status.source.clone(),
        counts: status.counts(),
        apps: status.apps(),
        problems: status.problems(MAX_PROBLEMS_PER_HEARTBEAT),
        drift,
        last_error: status.last_error.clone(),
    }
}

/// Sends heartbeats until `shutdown`. A heartbeat answered 404 (the cluster was forgotten) or 401 (another key
/// is bound to its name: it was rekeyed) makes the agent enrol again, counted in `windvane_enrolments_total`.
pub async fn run(
    config: ReporterConfig,
    key: SigningKey,
    mut status: StatusRx,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let http = match reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(REPLY_DEADLINE)
        .build()
    {
        Ok(http) => http,
        Err(error) => return warn!(%error, "cannot build the heartbeat HTTP client"),
    };
    let base = config.server.trim_end_matches('/').to_owned();
    let cluster = &config.identity.name;
    let Some(sequence) =
        enroll_until_accepted(&http, &base, &config, &key, &metrics, &mut shutdown).await
    else {
        return;
    };
    let url = format!("{base}/api/v1/clusters/{cluster}/heartbeat");
    let mut cadence = Cadence::new(sequence, config.interval);
    let mut engine_running = true;
    loop {
        let current = sent_of(&status.borrow_and_update());
        let changed = cadence.last_sent.as_ref() != Some(&current);
        let now = tokio::time::Instant::now();
        if let Next::Wait { until, on_change } =
            next_heartbeat(changed, now, cadence.earliest, cadence.next)
        {
            tokio::select! {
                changed = status.changed(), if on_change && engine_running => {
                    engine_running = changed.is_ok();
                }
                () = tokio::time::sleep_until(until) => {}
                _ = shutdown.changed() => return,
            }
            continue;
        }
        cadence.sending(now);
        let heartbeat = build_heartbeat(
            &status.borrow(),
            &config,
            cadence.sequence,
            Timestamp::now(),
            cadence.drift_acknowledged,
        );
        let newest_drift = heartbeat
            .drift
            .iter()
            .map(|r| r.reverted_at.unwrap_or(r.detected_at))
            .max();
        match send(&http, &url, &heartbeat, &key).await {
            Ok(reply) => {
                debug!(sequence = cadence.sequence, state = %heartbeat.state, "heartbeat acknowledged");
                cadence.acknowledged(&reply, current, newest_drift);
            }
            Err(error) => {
                let wait = failure_wait(&error, cadence.failures, cadence.interval);
                if needs_enrolment(&error) {
                    warn!(%error, "the source server no longer accepts this cluster's key (an admin forgot or rekeyed it); enrolling again");
                    let Some(last) =
                        enroll_until_accepted(&http, &base, &config, &key, &metrics, &mut shutdown)
                            .await
                    else {
                        return;
                    };
                    cadence.enrolled_again(last);
                } else {
                    warn!(%error, wait_s = wait.as_secs(), "heartbeat failed; keeping drift records for the next one");
                }
                cadence.failed(wait, current);
            }
        }
    }
}

/// What a heartbeat said, to know whether the status changed since: the cluster's state, the object
/// counts, and why a held release waits (a wave gate elsewhere may be waiting on it).
type Sent = (SyncState, BTreeMap<SyncState, u64>, Option<String>);

fn sent_of(status: &AgentStatus) -> Sent {
    let pending = status.source.pending.as_ref().map(|p| p.message.clone());
    (status.cluster_state(), status.counts(), pending)
}

/// The heartbeat task's own state between two heartbeats: the sequence, when the next one is due, what the
/// server acknowledged last.
#[derive(Debug)]
struct Cadence {
    sequence: u64,
    /// The interval the server asked for last.
    interval: Duration,
    /// The newest drift record the server acknowledged: older ones are not sent again.
    drift_acknowledged: Option<Timestamp>,
    last_sent: Option<Sent>,
    next: tokio::time::Instant,
    /// Failed heartbeats in a row.
    failures: u32,
    /// No heartbeat for a change before this.
    earliest: tokio::time::Instant,
}

impl Cadence {
    /// After an enrolment that left the server's sequence at `sequence`: a heartbeat at once.
    fn new(sequence: u64, interval: Duration) -> Self {
        let now = tokio::time::Instant::now();
        Self {
            sequence,
            interval,
            drift_acknowledged: None,
            last_sent: None,
            next: now,
            failures: 0,
            earliest: now,
        }
    }

    /// A heartbeat goes out now.
    fn sending(&mut self, now: tokio::time::Instant) {
        self.earliest = clamp::after_tokio(now, MIN_CHANGE_SPACING);
        // The server's last sequence is a number from outside: never an overflow.
        self.sequence = self.sequence.saturating_add(1);
    }

    fn acknowledged(
        &mut self,
        reply: &HeartbeatReply,
        current: Sent,
        newest_drift: Option<Timestamp>,
    ) {
        self.failures = 0;
        self.last_sent = Some(current);
        if newest_drift.is_some() {
            self.drift_acknowledged = newest_drift;
        }
        self.interval = clamp::heartbeat_interval(reply.next_interval_seconds);
        self.next = clamp::after_tokio(
            tokio::time::Instant::now(),
            jittered(self.interval, 0.2, random_unit()),
        );
    }

    /// Enrolled again after the server forgot the key: its sequence is `last`, and a forgotten cluster's
    /// drift log is gone, so what is still held is sent again.
    fn enrolled_again(&mut self, last: u64) {
        self.sequence = last;
        self.drift_acknowledged = None;
    }

    fn failed(&mut self, wait: Duration, current: Sent) {
        self.failures += 1;
        self.next = clamp::after_tokio(tokio::time::Instant::now(), wait);
        // Do not resend on every state flicker while the server is away.
        self.last_sent = Some(current);
    }
}

/// Shortest time between two heartbeats sent because the status changed: a burst of changes (a release
/// applied object after object) makes one heartbeat, not one per object.
const MIN_CHANGE_SPACING: Duration = Duration::from_secs(1);

/// What the reporter does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    Send,
    /// Sleep until `until`; when `on_change`, wake earlier if the status changes.
    Wait {
        until: tokio::time::Instant,
        on_change: bool,
    },
}

/// Decides when the next heartbeat goes out (pure): at `due` (the interval, or the back-off after a failure)
/// whatever happens, and as soon as the reported state or counts changed (`changed`), but no earlier than
/// `earliest`, so that changes are spaced by [`MIN_CHANGE_SPACING`].
fn next_heartbeat(
    changed: bool,
    now: tokio::time::Instant,
    earliest: tokio::time::Instant,
    due: tokio::time::Instant,
) -> Next {
    if now >= due || (changed && now >= earliest) {
        Next::Send
    } else if changed {
        Next::Wait {
            until: earliest.min(due),
            on_change: false,
        }
    } else {
        Next::Wait {
            until: due,
            on_change: true,
        }
    }
}

/// How long to wait after the `failures`-th failed heartbeat in a row (see [`retry_wait`]).
fn failure_wait(error: &Error, failures: u32, interval: Duration) -> Duration {
    let busy = match error {
        Error::SourceBusy { retry_after, .. } => Some(*retry_after),
        _ => None,
    };
    retry_wait(failures, interval, busy)
}

/// How long the reporter waits before its next heartbeat after the `failures`-th failed one in a row (0 for
/// the first): a jittered back-off from 1 s up to the interval (at least a minute), or, when a busy server
/// answered with a `Retry-After` (`busy`, already clamped), at least that. The next attempt is a new
/// heartbeat with the next sequence. Public so that the tests' simulated agents retry as this one does.
pub fn retry_wait(failures: u32, interval: Duration, busy: Option<Duration>) -> Duration {
    let backoff = full_jitter(
        failures,
        Duration::from_secs(1),
        interval.max(Duration::from_secs(60)),
        random_unit(),
    );
    // A busy server says when to come back; sooner would only add to its load.
    match busy {
        Some(retry_after) => after_busy(retry_after, backoff, random_unit()),
        None => backoff,
    }
}

/// Whether a heartbeat refusal means the server no longer holds this cluster's key, so it must enrol again.
fn needs_enrolment(error: &Error) -> bool {
    matches!(
        error,
        Error::ServerRefused {
            status: 401 | 404,
            ..
        }
    )
}

/// Enrols until the server binds this key to the cluster's name (or already holds it); the last sequence it
/// stored, or `None` on shutdown. Failures back off with jitter; a 409 (the name is bound to another key:
/// only an admin's `windvane cluster rekey|forget` resolves it, as the registration token never takes a name
/// from another key) retries slowly and says so.
async fn enroll_until_accepted(
    http: &reqwest::Client,
    base: &str,
    config: &ReporterConfig,
    key: &SigningKey,
    metrics: &Metrics,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<u64> {
    let cluster = &config.identity.name;
    let mut failures = 0u32;
    loop {
        let error = match enroll(http, base, config, key).await {
            Ok(reply) => {
                metrics.enrolment(match reply.outcome {
                    EnrollOutcome::Enrolled => "enrolled",
                    EnrollOutcome::Rekeyed => "rekeyed",
                    _ => "already_enrolled",
                });
                info!(outcome = ?reply.outcome, keyid = %reply.keyid, "enrolled with the source server");
                return Some(reply.last_sequence);
            }
            Err(error) => error,
        };
        let conflict = matches!(error, Error::ServerRefused { status: 409, .. });
        metrics.enrolment(match &error {
            _ if conflict => "conflict",
            Error::ServerRefused { .. } => "refused",
            _ => "error",
        });
        let first = if conflict { 30 } else { 1 };
        let wait = full_jitter(
            failures,
            Duration::from_secs(first),
            Duration::from_secs(300),
            random_unit(),
        );
        if conflict {
            warn!(%error, wait_s = wait.as_secs(), "cluster {cluster} is bound to another key at the source server: not reporting until an admin runs `windvane cluster rekey {cluster}` (or `forget`); retrying");
        } else {
            warn!(%error, wait_s = wait.as_secs(), "cannot enrol yet; retrying");
        }
        failures = failures.saturating_add(1);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => return None,
        }
    }
}

async fn enroll(
    http: &reqwest::Client,
    base: &str,
    config: &ReporterConfig,
    key: &SigningKey,
) -> Result<EnrollReply> {
    let url = format!("{base}/api/v1/clusters/{}/enroll", config.identity.name);
    let request = EnrollRequest {
        token: config.token.clone(),
        fleet: config.fleet.clone(),
        public_key: verifying_key_to_pem(&key.verifying_key()),
        labels: config.identity.labels.clone(),
    };
    let body =
        serde_json::to_vec(&request).map_err(|e| Error::Config(format!("enrolment: {e}")))?;
    with_deadline(&url, REPLY_DEADLINE, async {
        let response = http
            .post(&url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| fetch_error(&url, &e))?;
        let status = response.status();
        let body = read_capped(&url, response, clamp::MAX_REPLY_BYTES, "enrolment reply")
            .await
            .map_err(|e| naming(&url, e))?;
        enroll_reply(&url, status, &body)
    })
    .await
}

/// A reply over its cap, as a failed request naming the URL (for the source a size cap is a refused release;
/// for the server it is a failed exchange, retried with the backoff).
fn naming(url: &str, error: Error) -> Error {
    match error {
        Error::Release(inner) => Error::Fetch {
            url: url.to_owned(),
            detail: inner.to_string(),
        },
        other => other,
    }
}

/// What the server's answer to an enrolment means. Pure: (status, body) in, the reply or the error out.
pub fn enroll_reply(url: &str, status: StatusCode, body: &[u8]) -> Result<EnrollReply> {
    if !status.is_success() {
        return Err(refused(url, status, body));
    }
    serde_json::from_slice(body).map_err(|e| Error::Fetch {
        url: url.to_owned(),
        // serde quotes the values it refuses: bound what a peer can put in the log.
        detail: format!(
            "unreadable reply: {}",
            clamp::quoted(e.to_string().as_bytes())
        ),
    })
}

async fn send(
    http: &reqwest::Client,
    url: &str,
    heartbeat: &Heartbeat,
    key: &SigningKey,
) -> Result<HeartbeatReply> {
    let payload =
        serde_json::to_vec(heartbeat).map_err(|e| Error::Config(format!("heartbeat: {e}")))?;
    let envelope = dsse::sign(HEARTBEAT_PAYLOAD_TYPE, &payload, key);
    with_deadline(url, REPLY_DEADLINE, async {
        let response = http
            .post(url)
            .header("content-type", "application/json")
            .body(envelope.to_json_bytes())
            .send()
            .await
            .map_err(|e| fetch_error(url, &e))?;
        let status = response.status();
        if let Some(busy) =
            crate::fetch::http::busy(url, status, response.headers(), Timestamp::now())
        {
            return Err(busy);
        }
        let body = read_capped(url, response, clamp::MAX_REPLY_BYTES, "heartbeat reply")
            .await
            .map_err(|e| naming(url, e))?;
        heartbeat_reply(url, status, &body)
    })
    .await
}

/// What the server's answer to a heartbeat means (a busy 429/503 is judged before, by
/// [`crate::fetch::http::busy`]). Pure: (status, body) in, the reply or the error out.
pub fn heartbeat_reply(url: &str, status: StatusCode, body: &[u8]) -> Result<HeartbeatReply> {
    if !status.is_success() {
        return Err(refused(url, status, body));
    }
    serde_json::from_slice(body).map_err(|e| Error::Fetch {
        url: url.to_owned(),
        // serde quotes the values it refuses: bound what a peer can put in the log.
        detail: format!(
            "unreadable reply: {}",
            clamp::quoted(e.to_string().as_bytes())
        ),
    })
}

/// A non-success answer: a 4xx is the server's refusal ([`Error::ServerRefused`], which the loop acts on),
/// anything else a failed fetch.
fn refused(url: &str, status: StatusCode, body: &[u8]) -> Error {
    let hint = if status == StatusCode::CONFLICT {
        " (another key is bound to this cluster name: an admin must run `windvane cluster rekey`)"
    } else {
        ""
    };
    let detail = format!("{}{hint}", clamp::quoted(body));
    if status.is_client_error() {
        Error::ServerRefused {
            url: url.to_owned(),
            status: status.as_u16(),
            detail,
        }
    } else {
        Error::Fetch {
            url: url.to_owned(),
            detail: format!("HTTP {status}: {detail}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::status::AgentStatus;

    #[test]
    fn a_heartbeat_goes_when_due_or_on_a_change_spaced_by_a_second() {
        let now = tokio::time::Instant::now();
        let s = Duration::from_secs;
        // (changed, earliest, due) → what the reporter does
        let cases = [
            (
                false,
                now,
                now + s(30),
                Next::Wait {
                    until: now + s(30),
                    on_change: true,
                },
            ),
            (false, now, now, Next::Send),
            (true, now, now + s(30), Next::Send),
            // A change right after a send waits out the spacing, and ignores further changes meanwhile.
            (
                true,
                now + s(1),
                now + s(30),
                Next::Wait {
                    until: now + s(1),
                    on_change: false,
                },
            ),
            // A back-off ending before the spacing wins.
            (
                true,
                now + s(1),
                now + Duration::from_millis(500),
                Next::Wait {
                    until: now + Duration::from_millis(500),
                    on_change: false,
                },
            ),
            (false, now + s(1), now, Next::Send),
        ];
        for (changed, earliest, due, expected) in cases {
            assert_eq!(
                next_heartbeat(changed, now, earliest, due),
                expected,
                "changed {changed}, earliest +{:?}, due +{:?}",
                earliest - now,
                due - now
            );
        }
    }

    fn test_config() -> ReporterConfig {
        ReporterConfig {
            server: "http://server".into(),
            token: "secret".into(),
            fleet: "acme".into(),
            identity: ClusterIdentity {
                name: "c1".into(),
                labels: BTreeMap::from([("env".into(), "prod".into())]),
            },
            interval: Duration::from_secs(30),
            namespace: "windvane-system".into(),
        }
    }

    /// A server on loopback that answers every request with `answer` (a whole HTTP/1.1 response).
    async fn answering(answer: &'static str) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut buf = vec![0u8; 64 * 1024];
                let _ = socket.read(&mut buf).await;
                let _ = socket.write_all(answer.as_bytes()).await;
            }
        });
        format!("http://{addr}/api/v1/clusters/c/heartbeat")
    }

    #[tokio::test]
    async fn a_busy_server_s_retry_after_reaches_the_heartbeat_loop() {
        let key = signing_key_from_seed([7; 32]);
        let heartbeat = build_heartbeat(
            &AgentStatus::default(),
            &test_config(),
            1,
            Timestamp::from_second(1_700_000_000).unwrap(),
            None,
        );
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::new();
        let busy = answering(
            "HTTP/1.1 429 Too Many Requests\r\nretry-after: 7\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        )
        .await;
        match send(&http, &busy, &heartbeat, &key).await {
            Err(Error::SourceBusy { retry_after, .. }) => {
                assert_eq!(retry_after, Duration::from_secs(7));
            }
            other => panic!("429 should be 'busy, retry after 7 s', got {other:?}"),
        }
        let failing = answering(
            "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert!(
            matches!(
                send(&http, &failing, &heartbeat, &key).await,
                Err(Error::Fetch { .. })
            ),
            "other failures keep the plain backoff"
        );
    }

    #[tokio::test]
    async fn a_forgotten_or_rekeyed_cluster_enrols_again_and_a_conflict_does_not_loop_on_heartbeats()
     {
        let key = signing_key_from_seed([7; 32]);
        let heartbeat = build_heartbeat(
            &AgentStatus::default(),
            &test_config(),
            1,
            Timestamp::from_second(1_700_000_000).unwrap(),
            None,
        );
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::new();
        for (answer, status, enrol_again) in [
            (
                "HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
                404,
                true,
            ),
            (
                "HTTP/1.1 401 Unauthorized\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
                401,
                true,
            ),
            (
                "HTTP/1.1 409 Conflict\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
                409,
                false,
            ),
        ] {
            let url = answering(answer).await;
            let error = send(&http, &url, &heartbeat, &key)
                .await
                .expect_err("refused");
            assert!(
                matches!(&error, Error::ServerRefused { status: s, .. } if *s == status),
                "{status}: {error:?}"
            );
            assert_eq!(needs_enrolment(&error), enrol_again, "{status}");
        }
    }

    #[test]
    fn heartbeats_carry_only_drift_not_yet_acknowledged() {
        let mut status = AgentStatus {
            enforced: true,
            ..AgentStatus::default()
        };
        let at = |s: i64| Timestamp::from_second(1_700_000_000 + s).unwrap();
        for i in 0..3 {
            status
                .drift
                .push(windvane_shared::wire::heartbeat::DriftRecord {
                    app: "a".into(),
                    group: String::new(),
                    kind: "ConfigMap".into(),
                    namespace: None,
                    name: format!("c{i}"),
                    fields: vec![],
                    deleted: false,
                    manager: None,
                    operation: None,
                    changed_at: None,
                    detected_at: at(i),
                    reverted_at: None,
                    action: windvane_shared::wire::heartbeat::DriftAction::Reported,
                    break_glass: None,
                    revert_requested_by: None,
                });
        }
        let config = test_config();
        let all = build_heartbeat(&status, &config, 7, at(10), None);
        assert_eq!(
            (all.sequence, all.drift.len(), all.state),
            (7, 3, SyncState::Synced)
        );
        assert_eq!(all.labels.get("env").map(String::as_str), Some("prod"));
        assert_eq!(
            build_heartbeat(&status, &config, 8, at(10), Some(at(1)))
                .drift
                .len(),
            1
        );
    }
}
