//! Enrolment: the registration token (rate-limited per address) binds a cluster name to its identity key,
//! once, or again after an admin's rekey.

use std::net::IpAddr;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use jiff::Timestamp;
use windvane_shared::wire::heartbeat::{EnrollReply, EnrollRequest};

use crate::db::{Database, EnrollOutcome, Enrollment};
use crate::http::App;
use crate::ingest::{self, Refusal};

use crate::http::handlers::{
    Body, MAX_SMALL_BODY, json, json_error, rate_limited, read_body, refusal_response, token_failed,
};
use crate::ingest::heartbeat;

pub(crate) async fn handle(
    app: &Arc<App>,
    request: Request<Incoming>,
    cluster: &str,
    client: IpAddr,
) -> Response<Body> {
    if let Some(limited) = rate_limited(app, client).await {
        return limited;
    }
    let body = match read_body(request, MAX_SMALL_BODY).await {
        Ok(body) => body,
        Err(refusal) => return refusal_response(&refusal),
    };
    let enroll: EnrollRequest = match serde_json::from_slice(&body) {
        Ok(enroll) => enroll,
        Err(e) => return refusal_response(&Refusal::Malformed(format!("enrolment body: {e}"))),
    };
    if !app.registration_token.verify(&enroll.token) {
        app.metrics.enrolment(false);
        return token_failed(app, client, "registration token").await;
    }
    let checked = match ingest::check_enroll(cluster, &enroll) {
        Ok(checked) => checked,
        Err(refusal) => return refusal_response(&refusal),
    };
    let enrollment = Enrollment {
        cluster: cluster.to_owned(),
        fleet: enroll.fleet.clone(),
        keyid: checked.keyid.clone(),
        public_key_pem: checked.public_key_pem,
        labels: enroll.labels,
        at: Timestamp::now(),
    };
    let outcome = match app.db.enroll(enrollment).await {
        Ok(outcome) => outcome,
        Err(error) => {
            tracing::error!(cluster, %error, "enrolment could not be stored");
            return json_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                &error.to_string(),
            );
        }
    };
    heartbeat::forget_key(app, cluster);
    tracing::info!(cluster, keyid = %checked.keyid, ?outcome, "enrolment");
    let status = match outcome {
        EnrollOutcome::Enrolled => StatusCode::CREATED,
        EnrollOutcome::AlreadyEnrolled | EnrollOutcome::Rekeyed => StatusCode::OK,
        EnrollOutcome::KeyConflict => {
            app.metrics.enrolment(false);
            return refusal_response(&Refusal::KeyConflict(cluster.to_owned()));
        }
        EnrollOutcome::FleetConflict => {
            app.metrics.enrolment(false);
            return json_error(
                StatusCode::CONFLICT,
                "fleet_conflict",
                &format!(
                    "cluster {cluster} is enrolled in another fleet; an admin must rekey or forget it first"
                ),
            );
        }
    };
    app.metrics.enrolment(true);
    let last_sequence = match app.db.get_cluster(cluster).await {
        Ok(Some((summary, _))) => summary.last_sequence,
        _ => 0,
    };
    json(
        status,
        &EnrollReply {
            cluster: cluster.to_owned(),
            keyid: checked.keyid,
            outcome,
            last_sequence,
        },
    )
}
