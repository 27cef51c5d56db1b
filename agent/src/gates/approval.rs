//! Two-person approval on the agent: a verified release whose signed rollout requires approval waits in the
//! wave gate ([`crate::gates::wave::run`]) until the approval file of its serial in the store
//! (`approvals/<channel>/<serial>.json`) carries enough signatures of the operator's approver keys
//! (`--approver-key`). Which signatures count is [`windvane_shared::decide::approval::tally`] (pure); this module is
//! the thin reader: [`watch_store`] fetches the file every few seconds (at most
//! [`windvane_shared::decide::approval::MAX_APPROVAL_BYTES`], a missing file is no approval yet), tallies it, and
//! publishes the tally to the gate. Meanwhile the engine keeps enforcing and healing its last known good.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use tokio::sync::watch;
use tracing::{info, warn};
use windvane_shared::crypto::keys::TrustedKeys;
use windvane_shared::decide::approval::{self, ApprovalStatement, MAX_APPROVAL_BYTES, Tally};
use windvane_shared::format::release::AcceptedRelease;
use windvane_shared::spec::rollout::ApprovalPolicy;

use crate::fetch::http::{read_capped, with_deadline};
use crate::report::metrics::Metrics;

/// Total deadline of one read of the approval file.
const READ_DEADLINE: Duration = Duration::from_secs(10);

/// What a release waiting for approval needs: the threshold in force (the larger of its signed policy's and
/// the operator's floor), the statement approvers sign, and the key that published it (which never counts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalNeed {
    pub policy: ApprovalPolicy,
    pub statement: ApprovalStatement,
    pub publisher_keyid: String,
    /// The operator's floor (`--require-approvals`), 0 when none; reported when it is what holds the release.
    pub floor: u32,
}

impl ApprovalNeed {
    /// The need of a verified release under the operator's floor of `floor` approvals (`--require-approvals`,
    /// 0: none), `None` when neither its signed rollout nor the floor requires approval. The floor is the
    /// operator's, not the publisher's: a release signed without `rollout.approval` (or a rollback to one
    /// that had none) still waits for `floor` approvals here.
    pub fn of(accepted: &AcceptedRelease, floor: u32) -> Option<ApprovalNeed> {
        let signed = accepted
            .pointer
            .rollout
            .as_ref()
            .and_then(|r| r.approval)
            .map_or(0, |p| p.threshold);
        let threshold = signed.max(floor);
        (threshold > 0).then(|| ApprovalNeed {
            policy: ApprovalPolicy { threshold },
            statement: ApprovalStatement::of(&accepted.pointer),
            publisher_keyid: accepted.keyid.clone(),
            floor,
        })
    }

    /// Why the release waits, beyond the count: named when the operator's floor is above what the release
    /// itself asks for.
    pub fn floor_note(&self) -> Option<String> {
        (self.floor > 0 && self.floor >= self.policy.threshold).then(|| {
            format!(
                "this cluster requires {} approval(s) by --approver-key keys other than the publisher's (--require-approvals), whatever the release says",
                self.floor
            )
        })
    }
}

/// The latest tally of the approval file; `None` before the first read.
pub type ApprovalObservation = Option<Tally>;

/// Where and how often the approval file is read, and with which keys it is judged.
#[derive(Debug, Clone)]
pub struct ApprovalSource {
    pub source_url: String,
    pub approvers: TrustedKeys,
    pub every: Duration,
    pub metrics: Arc<Metrics>,
}

/// Reads the approval file of `need`'s release every `source.every` and publishes each new tally, until the
/// receivers are gone.
pub async fn watch_store(
    source: ApprovalSource,
    need: ApprovalNeed,
    tx: watch::Sender<ApprovalObservation>,
) {
    let client = reqwest::Client::new();
    let url = format!(
        "{}/{}",
        source.source_url.trim_end_matches('/'),
        approval::approval_path(&need.statement.channel, need.statement.serial)
    );
    if source.approvers.is_empty() {
        warn!(
            "the release requires approval but no --approver-key is configured: it cannot be approved here"
        );
    }
    loop {
        let tally = match fetch(&client, &url).await {
            Ok(None) => Tally::default(),
            Ok(Some(bytes)) => approval::tally(
                &bytes,
                &source.approvers,
                &need.publisher_keyid,
                &need.statement,
            ),
            Err(why) => Tally {
                refused: vec![format!("cannot read the approvals ({why})")],
                ..Tally::default()
            },
        };
        let changed = tx.borrow().as_ref() != Some(&tally);
        if changed {
            for refusal in &tally.refused {
                warn!(serial = need.statement.serial, %refusal, "approval refused");
            }
            source.metrics.approvals_refused(tally.refused.len());
            info!(
                serial = need.statement.serial,
                approved = tally.approved.len(),
                threshold = need.policy.threshold,
                "read the release's approvals"
            );
            if tx.send(Some(tally)).is_err() {
                return;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(source.every) => {}
            () = tx.closed() => return,
        }
    }
}

/// The approval file's bytes, `None` when there is none (404).
async fn fetch(client: &reqwest::Client, url: &str) -> crate::Result<Option<Vec<u8>>> {
    with_deadline(url, READ_DEADLINE, async {
        let response = client
            .get(url)
            .send()
            .await
            .map_err(|e| crate::fetch::http::fetch_error(url, &e))?;
        let status = response.status();
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let body = read_capped(url, response, MAX_APPROVAL_BYTES, "approval file").await?;
        if !status.is_success() {
            return Err(crate::Error::Fetch {
                url: url.to_owned(),
                detail: format!("HTTP {status}"),
            });
        }
        Ok(Some(body))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use windvane_shared::format::release::{BundleRef, ReleasePointer};
    use windvane_shared::spec::rollout::Rollout;

    fn accepted(signed_threshold: Option<u32>) -> AcceptedRelease {
        let issued_at: jiff::Timestamp = "2026-12-07T10:00:00Z".parse().expect("time");
        AcceptedRelease {
            pointer: ReleasePointer {
                fleet: "acme".into(),
                channel: "prod".into(),
                serial: 7,
                issued_at,
                expires_at: issued_at,
                bundle: BundleRef {
                    sha256: "cd".repeat(32),
                    size: 10,
                },
                allow_empty: false,
                rollout: signed_threshold.map(|threshold| Rollout {
                    approval: Some(ApprovalPolicy { threshold }),
                    ..Rollout::default()
                }),
            },
            keyid: "publisher".into(),
        }
    }

    #[test]
    fn the_operators_floor_holds_a_release_that_asks_for_no_approval() {
        assert_eq!(ApprovalNeed::of(&accepted(None), 0), None);
        let need = ApprovalNeed::of(&accepted(None), 2).expect("the floor requires approval");
        assert_eq!(need.policy.threshold, 2);
        assert_eq!(need.publisher_keyid, "publisher");
        // What approvers sign names this fleet, channel, serial and bundle.
        assert_eq!(
            need.statement,
            ApprovalStatement {
                fleet: "acme".into(),
                channel: "prod".into(),
                serial: 7,
                bundle_sha256: "cd".repeat(32),
            }
        );
        let note = need.floor_note().expect("the floor is why it waits");
        assert!(note.contains("--require-approvals"), "{note}");
    }

    #[test]
    fn the_larger_of_the_signed_threshold_and_the_floor_applies() {
        let signed_higher = ApprovalNeed::of(&accepted(Some(3)), 1).expect("need");
        assert_eq!(signed_higher.policy.threshold, 3);
        assert_eq!(signed_higher.floor_note(), None);
        let floor_higher = ApprovalNeed::of(&accepted(Some(1)), 2).expect("need");
        assert_eq!(floor_higher.policy.threshold, 2);
        assert!(floor_higher.floor_note().is_some());
        let signed_only = ApprovalNeed::of(&accepted(Some(1)), 0).expect("need");
        assert_eq!(signed_only.policy.threshold, 1);
        assert_eq!(signed_only.floor_note(), None);
    }
}
