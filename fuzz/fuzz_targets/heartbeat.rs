//! What the server does with an agent's POST bodies: heartbeats (`ingest::check_heartbeat`) and enrolments
//! (`EnrollRequest` parsing and `ingest::check_enroll`), and, for a heartbeat it accepts, what it later does
//! with the stored payload: read it back as the cluster's report (`view::parse_report`) and render the fleet
//! and cluster pages from it.
//!
//! Mode 0: the bytes are a heartbeat body. Mode 1: the bytes are a heartbeat payload, signed here with the
//! enrolled cluster's key, so the checks after the signature are reached (as for an agent whose key is in
//! hostile hands). Mode 2: the bytes are an enrolment body.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use windvane_fuzz::{CLUSTER, FLEET, cluster_key, mode, now};
use windvane_shared::crypto::dsse;
use windvane_shared::wire::heartbeat::{
    EnrollRequest, HEARTBEAT_PAYLOAD_TYPE, MAX_DRIFT_RECORDS_PER_HEARTBEAT,
};
use windvane_shared::crypto::keys::{keyid, verifying_key_from_pem, verifying_key_to_pem};
use windvane_source_server::db::{ClusterSummary, DriftEntry, VerifiedHeartbeat};
use windvane_source_server::ingest::{
    ClusterKey, MAX_INTERVAL_SECONDS, check_enroll, check_heartbeat,
};
use windvane_source_server::fleet::status::Filter;
use windvane_source_server::fleet::{page, view};
use windvane_source_server::notify::break_glass;

const MAX_SKEW: Duration = Duration::from_secs(300);

/// The key the cluster enrolled with, as the server reads it back from its database.
fn bound_key() -> &'static ClusterKey {
    static KEY: OnceLock<ClusterKey> = OnceLock::new();
    KEY.get_or_init(|| {
        let pem = verifying_key_to_pem(&cluster_key().verifying_key());
        ClusterKey::from_stored(CLUSTER, FLEET.to_owned(), &pem).expect("a stored key reads")
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((mode, data)) = mode(data, 3) else {
        return;
    };
    match mode {
        0 => {
            if let Ok(verified) = check_heartbeat(CLUSTER, data, bound_key(), now(), MAX_SKEW) {
                accepted(&verified);
            }
        }
        1 => {
            let body = dsse::sign(HEARTBEAT_PAYLOAD_TYPE, data, &cluster_key()).to_json_bytes();
            if let Ok(verified) = check_heartbeat(CLUSTER, &body, bound_key(), now(), MAX_SKEW) {
                assert_eq!(verified.payload.as_bytes(), data);
                accepted(&verified);
            }
        }
        _ => {
            let Ok(request) = serde_json::from_slice::<EnrollRequest>(data) else {
                return;
            };
            if let Ok(checked) = check_enroll(CLUSTER, &request) {
                let key = verifying_key_from_pem(&checked.public_key_pem, "stored")
                    .expect("the normalised key reads back");
                assert_eq!(keyid(&key), checked.keyid);
                ClusterKey::from_stored(CLUSTER, request.fleet.clone(), &checked.public_key_pem)
                    .expect("an accepted enrolment's key can be bound");
            }
        }
    }
});

/// Checks what `check_heartbeat` promises of an accepted heartbeat, then stores and shows it as the server
/// would.
fn accepted(verified: &VerifiedHeartbeat) {
    let heartbeat = &verified.heartbeat;
    assert_eq!(heartbeat.cluster, CLUSTER);
    assert_eq!(heartbeat.fleet, FLEET);
    assert!(heartbeat.sequence >= 1 && i64::try_from(heartbeat.sequence).is_ok());
    assert!((1..=MAX_INTERVAL_SECONDS).contains(&heartbeat.interval_seconds));
    assert!(heartbeat.drift.len() <= MAX_DRIFT_RECORDS_PER_HEARTBEAT);
    assert_eq!(verified.keyid, bound_key().keyid);

    let report = view::parse_report(Some(&verified.payload));
    assert_eq!(
        report.as_ref(),
        Some(heartbeat),
        "a stored payload no longer reads as its heartbeat"
    );

    let summary = ClusterSummary {
        name: heartbeat.cluster.clone(),
        fleet: heartbeat.fleet.clone(),
        keyid: verified.keyid.clone(),
        labels: heartbeat.labels.clone(),
        enrolled_at: now(),
        rekey_allowed_until: None,
        last_sequence: heartbeat.sequence,
        last_seen: Some(verified.received_at),
        interval_seconds: Some(heartbeat.interval_seconds),
        state: Some(heartbeat.state),
        channel: Some(heartbeat.source.channel.clone()),
        applied_serial: heartbeat.source.applied_serial,
        last_error: heartbeat.last_error.clone(),
        drift_total: heartbeat.drift.len() as u64,
        public_key: verifying_key_to_pem(&cluster_key().verifying_key()),
    };
    let latest = |_: &str| Some(7);
    let fleet = view::fleet_view(
        vec![summary.clone()],
        now(),
        None,
        &Filter::default(),
        &latest,
    );
    let drift: Vec<DriftEntry> = heartbeat
        .drift
        .iter()
        .map(|record| DriftEntry {
            cluster: heartbeat.cluster.clone(),
            sequence: heartbeat.sequence,
            received_at: verified.received_at,
            record: record.clone(),
        })
        .collect();
    // Open break-glass changes, from hostile drift records, on the fleet page.
    let open = break_glass::open(&drift, now());
    let _ = page::fleet_page(&fleet, "", &[], &open);
    let detail = view::ClusterDetail {
        cluster: view::cluster_row(summary, now(), None, &latest),
        report,
        drift,
    };
    let _ = page::cluster_page(&detail, now());
    let _ = serde_json::to_vec(&detail).expect("the API serialises a cluster");
}
