//! A simulated agent for the server tests: an identity key, labels and a heartbeat counter; it enrols and
//! signs heartbeats exactly as the wire format says (DSSE over the JSON heartbeat), so a test can send
//! valid, stale, forged or malformed ones to a real `windvane-server`. Not the real agent: that is
//! [`crate::fleet::Agent`].

use std::collections::BTreeMap;

use ed25519_dalek::SigningKey;
use jiff::Timestamp;
use windvane_shared::dsse;
use windvane_shared::heartbeat::{
    AppReport, EnrollRequest, HEARTBEAT_PAYLOAD_TYPE, Heartbeat, ObjectReport, SourceReport,
};
use windvane_shared::keys::{signing_key_from_seed, verifying_key_to_pem};
use windvane_shared::status::SyncState;

use crate::server::{CHANNEL, FLEET, TOKEN};

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
