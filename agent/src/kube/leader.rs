//! Leader election on a coordination.k8s.io Lease in the agent's namespace, so that of several replicas
//! (a DaemonSet on every control-plane node, say) exactly one writes. A candidate takes the Lease when it is
//! free or its holder stopped renewing for a whole lease duration; every write is conditional on the Lease's
//! resourceVersion, so two candidates can never both win. The leader renews it; a leader that cannot renew in
//! time stops (the process exits and restarts as a candidate) rather than risk two writers. Every round is
//! recorded in the replica's state ([`crate::report::replica`]), which the admin server reads for readiness.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::kube::cluster::api_message;
use crate::report::replica::Replica;
use crate::{Error, Result};

/// Timing of the election.
#[derive(Debug, Clone)]
pub struct LeaseTiming {
    /// How long a holder's claim is valid after its last renewal.
    pub duration: Duration,
    /// How often the leader renews (well within `duration`).
    pub renew_every: Duration,
    /// How often a candidate tries to take the Lease.
    pub retry_every: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
            retry_every: Duration::from_secs(2),
        }
    }
}

/// What the Lease says, reduced to what the decision needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    pub holder: Option<String>,
    pub renewed_at: Option<Timestamp>,
    pub duration: Duration,
}

/// True when `me` may take (or keep) the Lease at `now`: it is unheld, held by `me`, or its holder has not
/// renewed for a whole duration.
pub fn may_acquire(lease: &LeaseView, me: &str, now: Timestamp) -> bool {
    match (&lease.holder, lease.renewed_at) {
        (None, _) => true,
        (Some(holder), _) if holder == me || holder.is_empty() => true,
        (Some(_), None) => true,
        (Some(_), Some(renewed)) => {
            now.duration_since(renewed).unsigned_abs() > lease.duration
                || renewed > now + lease.duration
        }
    }
}

/// One candidate for the Lease `name` in `namespace`.
#[derive(Debug, Clone)]
pub struct Elector {
    leases: Api<Lease>,
    name: String,
    identity: String,
    timing: LeaseTiming,
    /// Every round's outcome, for `/readyz` and `/status`.
    replica: Arc<watch::Sender<Replica>>,
}

impl Elector {
    /// A candidate named `identity` (the pod name).
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: &str,
        timing: LeaseTiming,
    ) -> Self {
        Self {
            leases: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            timing,
            replica: Arc::new(watch::Sender::new(Replica::default())),
        }
    }

    /// This replica's election state, updated after every round.
    pub fn replica(&self) -> watch::Receiver<Replica> {
        self.replica.subscribe()
    }

    /// One round of the election, recorded in the replica's state.
    async fn round(&self) -> Result<bool> {
        let outcome = self.try_acquire_or_renew().await;
        let recorded = outcome
            .as_ref()
            .map(|leads| *leads)
            .map_err(|e| e.to_string());
        let now = tokio::time::Instant::now();
        self.replica
            .send_modify(|replica| replica.record(recorded, now));
        outcome
    }

    fn lease_error(&self, detail: String) -> Error {
        Error::Lease {
            lease: self.name.clone(),
            detail,
        }
    }

    /// Waits until this candidate holds the Lease. API errors (the namespace missing, RBAC, the API server
    /// away) are logged and retried: a candidate keeps trying until it leads or is stopped.
    pub async fn acquire(&self) {
        let mut announced = false;
        loop {
            match self.round().await {
                Ok(true) => {
                    info!(lease = %self.name, identity = %self.identity, "became the leader");
                    return;
                }
                Ok(false) if !announced => {
                    info!(lease = %self.name, "another replica leads; standing by");
                    announced = true;
                }
                Ok(false) => {}
                Err(error) => warn!(%error, "cannot take part in leader election yet; retrying"),
            }
            tokio::time::sleep(self.timing.retry_every).await;
        }
    }

    /// Renews the Lease until renewal fails for longer than the lease duration; returns then, and the caller
    /// must stop writing.
    pub async fn keep(&self) -> Error {
        let mut last_renewed = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.timing.renew_every).await;
            match self.round().await {
                Ok(true) => last_renewed = tokio::time::Instant::now(),
                Ok(false) => return self.lease_error("another replica took the Lease".to_owned()),
                Err(error) => {
                    warn!(%error, "could not renew the Lease");
                    // Stop before the Lease can expire for others, so two writers never overlap.
                    if last_renewed.elapsed() + self.timing.renew_every >= self.timing.duration {
                        return self.lease_error(format!("could not renew in time: {error}"));
                    }
                }
            }
        }
    }

    /// Takes or renews the Lease; false when another holder's claim is still valid or we lost a race.
    pub async fn try_acquire_or_renew(&self) -> Result<bool> {
        let now = Timestamp::now();
        let existing = self
            .leases
            .get_opt(&self.name)
            .await
            .map_err(|e| self.lease_error(api_message(&e)))?;
        let Some(mut lease) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(now, now, 0)),
            };
            return match self.leases.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
                Err(e) => Err(self.lease_error(api_message(&e))),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let view = LeaseView {
            holder: spec.holder_identity.clone(),
            renewed_at: spec.renew_time.as_ref().map(|t| t.0),
            duration: Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(1) as u64),
        };
        if !may_acquire(&view, &self.identity, now) {
            return Ok(false);
        }
        let ours = view.holder.as_deref() == Some(self.identity.as_str());
        let acquired = if ours {
            spec.acquire_time.map_or(now, |t| t.0)
        } else {
            now
        };
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!ours);
        lease.spec = Some(self.spec(acquired, now, transitions));
        // replace carries the resourceVersion we read: a concurrent writer makes this fail with 409.
        match self
            .leases
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(e) => Err(self.lease_error(api_message(&e))),
        }
    }

    fn spec(&self, acquired: Timestamp, renewed: Timestamp, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.timing.duration.as_secs() as i32),
            acquire_time: Some(MicroTime(acquired)),
            renew_time: Some(MicroTime(renewed)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap()
    }

    #[test]
    fn a_held_lease_is_taken_only_after_its_holder_stops_renewing() {
        let lease = LeaseView {
            holder: Some("a".into()),
            renewed_at: Some(at(0)),
            duration: Duration::from_secs(15),
        };
        assert!(may_acquire(&lease, "a", at(5)), "the holder renews");
        assert!(!may_acquire(&lease, "b", at(10)), "still valid");
        assert!(may_acquire(&lease, "b", at(16)), "expired");
        assert!(may_acquire(
            &LeaseView {
                holder: None,
                renewed_at: None,
                duration: Duration::from_secs(15)
            },
            "b",
            at(0)
        ));
    }
}
