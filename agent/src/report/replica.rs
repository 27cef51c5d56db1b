//! What this replica is doing in the leader election, and whether it works: the election loop
//! ([`crate::leader::Elector`]) records every round trip to the API server here, the admin server reads it for
//! `/readyz`, the `replica` field of `/status` and the `windvane_agent_leader` gauge.
//!
//! Readiness means "this replica works": its election loop runs and reaches the API server. It does not mean
//! "this replica leads": every replica of the DaemonSet is Ready, the standbys included, so that `kubectl
//! rollout status`, `helm install --wait` and the tools that wait for health see a working install, and a
//! rolling update can replace one node's replica at a time. Which replica leads is the gauge and the status.

use std::time::Duration;

use tokio::time::Instant;

/// This replica's part in the election.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Has not yet read the Lease.
    Candidate,
    /// Another replica holds the Lease; this one is ready to take over.
    Standby,
    /// Holds the Lease: polls, applies and heals.
    Leader,
}

impl Role {
    /// The word used in `/readyz`, `/status` and the logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Candidate => "candidate",
            Role::Standby => "standby",
            Role::Leader => "leader",
        }
    }
}

/// The replica's election state and its last contact with the API server.
#[derive(Debug, Clone)]
pub struct Replica {
    pub role: Role,
    /// When a request to the API server last succeeded (reading or writing the Lease).
    pub reached_api: Option<Instant>,
    /// The last failed request's error, cleared by the next success.
    pub api_error: Option<String>,
}

impl Default for Replica {
    fn default() -> Self {
        Self {
            role: Role::Candidate,
            reached_api: None,
            api_error: None,
        }
    }
}

impl Replica {
    /// Records one round of the election: `Ok(true)` leads, `Ok(false)` stands by, `Err` did not reach the
    /// API server (the role is kept: a leader that cannot renew stops on its own, see `Elector::keep`).
    pub fn record(&mut self, outcome: Result<bool, String>, now: Instant) {
        match outcome {
            Ok(leads) => {
                self.role = if leads { Role::Leader } else { Role::Standby };
                self.reached_api = Some(now);
                self.api_error = None;
            }
            Err(error) => self.api_error = Some(error),
        }
    }

    /// `Ok(text)` when the replica works at `now`: it reached the API server within `stale_after`.
    /// `Err(text)` says why not. The texts are `/readyz`'s body.
    pub fn readiness(&self, now: Instant, stale_after: Duration) -> Result<String, String> {
        let why = self.api_error.as_deref().unwrap_or("no answer yet");
        let Some(reached) = self.reached_api else {
            return Err(format!(
                "not ready: has not reached the API server yet ({why})"
            ));
        };
        let since = now.saturating_duration_since(reached);
        if since > stale_after {
            return Err(format!(
                "not ready: no answer from the API server for {} s ({why})",
                since.as_secs()
            ));
        }
        Ok(format!("ok: {}", self.role.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STALE: Duration = Duration::from_secs(15);

    #[test]
    fn a_standby_that_reaches_the_api_server_is_ready() {
        let start = Instant::now();
        let mut replica = Replica::default();
        assert!(
            replica.readiness(start, STALE).is_err(),
            "before any answer"
        );
        replica.record(Ok(false), start);
        assert_eq!(replica.role, Role::Standby);
        assert_eq!(replica.readiness(start, STALE), Ok("ok: standby".into()));
        replica.record(Ok(true), start + Duration::from_secs(2));
        assert_eq!(
            replica.readiness(start + Duration::from_secs(3), STALE),
            Ok("ok: leader".into())
        );
    }

    #[test]
    fn a_replica_that_stops_reaching_the_api_server_turns_not_ready_with_the_error() {
        let start = Instant::now();
        let mut replica = Replica::default();
        replica.record(Err("connection refused".into()), start);
        let never = replica.readiness(start, STALE).unwrap_err();
        assert!(never.contains("has not reached") && never.contains("connection refused"));

        replica.record(Ok(false), start);
        replica.record(Err("timed out".into()), start + Duration::from_secs(10));
        assert!(
            replica
                .readiness(start + Duration::from_secs(10), STALE)
                .is_ok(),
            "one failure within the window is no reason to leave the rotation"
        );
        let stale = replica
            .readiness(start + Duration::from_secs(16), STALE)
            .unwrap_err();
        assert!(
            stale.contains("for 16 s") && stale.contains("timed out"),
            "{stale}"
        );
        assert_eq!(replica.role, Role::Standby, "an error keeps the role");

        replica.record(Ok(false), start + Duration::from_secs(17));
        assert!(
            replica
                .readiness(start + Duration::from_secs(17), STALE)
                .is_ok()
        );
        assert_eq!(replica.api_error, None);
    }
}
