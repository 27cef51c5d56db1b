//! A simulated agent for the server tests: an identity key, labels and a heartbeat counter; it enrols and
//! signs heartbeats exactly as the wire format says (DSSE over the JSON heartbeat), so a test can send
//! valid, stale, forged or malformed ones to a real `windvane-server`, or report on a schedule and retry
//! failed heartbeats with the real agent's back-off ([`Answer::wait`]). Not the real agent: that is
//! [`crate::fleet::Agent`].

use std::collections::BTreeMap;
use std::time::Duration;

use ed25519_dalek::SigningKey;
use jiff::Timestamp;
use windvane_agent::backoff::{jittered, random_unit};
use windvane_agent::clamp;
use windvane_agent::report::heartbeat::retry_wait;
use windvane_shared::crypto::dsse;
use windvane_shared::crypto::keys::{signing_key_from_seed, verifying_key_to_pem};
use windvane_shared::wire::heartbeat::{
    AppReport, EnrollRequest, HEARTBEAT_PAYLOAD_TYPE, Heartbeat, ObjectReport, SourceReport,
};
use windvane_shared::wire::status::SyncState;

use crate::server::{CHANNEL, FLEET, TOKEN};

/// What became of one heartbeat sent by [`SimulatedAgent::try_beat`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// A 2xx: the server has stored the heartbeat.
    Acknowledged,
    /// No answer (the connection failed or broke) or a non-2xx `status`; `retry_after` is a busy server's
    /// (429/503) `Retry-After`, clamped.
    Failed {
        status: Option<u16>,
        retry_after: Option<Duration>,
    },
}

impl Answer {
    /// When the real agent sends its next heartbeat after this answer, with `failures` failed ones in a row
    /// before it, heartbeating every `interval`: the interval ±20 % after an acknowledgement, the reporter's
    /// own back-off after a failure ([`windvane_agent::report::heartbeat::retry_wait`]).
    pub fn wait(&self, failures: u32, interval: Duration) -> Duration {
        match self {
            Answer::Acknowledged => jittered(interval, 0.2, random_unit()),
            Answer::Failed { retry_after, .. } => retry_wait(failures, interval, *retry_after),
        }
    }
}

/// A simulated agent: its identity key and heartbeat counter.
#[derive(Debug)]
pub struct SimulatedAgent {
    pub name: String,
    pub key: SigningKey,
    pub sequence: u64,
    pub labels: BTreeMap<String, String>,
    pub interval_seconds: u64,
}

impl SimulatedAgent {
    pub fn new(name: &str, seed: u8, labels: &[(&str, &str)]) -> SimulatedAgent {
        SimulatedAgent {
            name: name.into(),
            key: signing_key_from_seed([seed; 32]),
            sequence: 0,
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            interval_seconds: 30,
        }
    }

    pub fn enroll_request(&self, token: &str) -> EnrollRequest {
        EnrollRequest {
            token: token.into(),
            fleet: FLEET.into(),
            public_key: verifying_key_to_pem(&self.key.verifying_key()),
            labels: self.labels.clone(),
        }
    }

    pub async fn enroll(&self, http: &reqwest::Client, url: &str) -> reqwest::Response {
        http.post(format!("{url}/api/v1/clusters/{}/enroll", self.name))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&self.enroll_request(TOKEN)).expect("json"))
            .send()
            .await
            .expect("enroll")
    }

    /// The next heartbeat (sequence incremented) in `state`.
    pub fn next(&mut self, state: SyncState) -> Heartbeat {
        self.sequence += 1;
        Heartbeat {
            cluster: self.name.clone(),
            fleet: FLEET.into(),
            sequence: self.sequence,
            sent_at: Timestamp::now(),
            interval_seconds: self.interval_seconds,
            agent_version: "0.1.0-test".into(),
            labels: self.labels.clone(),
            state,
            source: SourceReport {
                channel: CHANNEL.into(),
                applied_serial: Some(3),
                applied_sha256: Some("ab".repeat(32)),
                ..SourceReport::default()
            },
            counts: [(state, 4)].into(),
            apps: vec![AppReport {
                name: "monitoring".into(),
                state,
                objects: 4,
            }],
            problems: if state == SyncState::Synced {
                vec![]
            } else {
                vec![ObjectReport {
                    app: "monitoring".into(),
                    object: "Deployment monitoring/prometheus".into(),
                    group: "apps".into(),
                    kind: "Deployment".into(),
                    state,
                    message: "replicas 1/2 ready".into(),
                }]
            },
            drift: vec![],
            last_error: None,
        }
    }

    pub fn sign(&self, heartbeat: &Heartbeat) -> Vec<u8> {
        self.sign_with(heartbeat, &self.key)
    }

    pub fn sign_with(&self, heartbeat: &Heartbeat, key: &SigningKey) -> Vec<u8> {
        let payload = serde_json::to_vec(heartbeat).expect("json");
        dsse::sign(HEARTBEAT_PAYLOAD_TYPE, &payload, key).to_json_bytes()
    }

    pub async fn post(
        &self,
        http: &reqwest::Client,
        url: &str,
        body: Vec<u8>,
    ) -> reqwest::Response {
        http.post(format!("{url}/api/v1/clusters/{}/heartbeat", self.name))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("post heartbeat")
    }

    /// Signs and sends the next heartbeat in `state` without judging the answer, as the real agent's
    /// reporter does: its sequence and what came back. A failed attempt still uses up its sequence (the next
    /// one is a new heartbeat), and [`Answer::wait`] says when the real agent would send it.
    pub async fn try_beat(
        &mut self,
        http: &reqwest::Client,
        url: &str,
        state: SyncState,
    ) -> (u64, Answer) {
        let hb = self.next(state);
        let sent = http
            .post(format!("{url}/api/v1/clusters/{}/heartbeat", self.name))
            .header("content-type", "application/json")
            .body(self.sign(&hb))
            .send()
            .await;
        let answer = match sent {
            Ok(response) if response.status().is_success() => match response.bytes().await {
                Ok(_) => Answer::Acknowledged,
                Err(_) => Answer::Failed {
                    status: None,
                    retry_after: None,
                },
            },
            Ok(response) => {
                let status = response.status();
                // Only a busy answer's Retry-After counts, clamped as the agent clamps it.
                let busy = matches!(status.as_u16(), 429 | 503).then(|| {
                    let header = response.headers().get(reqwest::header::RETRY_AFTER);
                    clamp::retry_after(header.map(|v| v.as_bytes()), Timestamp::now())
                });
                Answer::Failed {
                    status: Some(status.as_u16()),
                    retry_after: busy,
                }
            }
            Err(_) => Answer::Failed {
                status: None,
                retry_after: None,
            },
        };
        (hb.sequence, answer)
    }

    /// Signs and sends the next heartbeat in `state`, asserting a 200.
    pub async fn beat(&mut self, http: &reqwest::Client, url: &str, state: SyncState) {
        let hb = self.next(state);
        let response = self.post(http, url, self.sign(&hb)).await;
        let status = response.status();
        assert_eq!(
            status,
            200,
            "heartbeat {} refused: {}",
            hb.sequence,
            response.text().await.unwrap_or_default()
        );
    }
}
