//! Two-person approval on the agent: a verified release whose signed rollout requires approval waits in the
//! wave gate ([`crate::wave::run`]) until the approval file of its serial in the store
//! (`approvals/<channel>/<serial>.json`) carries enough signatures of the operator's approver keys
//! (`--approver-key`). Which signatures count is [`windvane_shared::approval::tally`] (pure); this module is
//! the thin reader: [`watch_store`] fetches the file every few seconds (at most
//! [`windvane_shared::approval::MAX_APPROVAL_BYTES`], a missing file is no approval yet), tallies it, and
//! publishes the tally to the gate. Meanwhile the engine keeps enforcing and healing its last known good.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use tokio::sync::watch;
use tracing::{info, warn};
use windvane_shared::approval::{
    self, ApprovalPolicy, ApprovalStatement, MAX_APPROVAL_BYTES, Tally,
};
use windvane_shared::keys::TrustedKeys;
use windvane_shared::release::AcceptedRelease;

use crate::http::{read_capped, with_deadline};
use crate::metrics::Metrics;

/// Total deadline of one read of the approval file.
const READ_DEADLINE: Duration = Duration::from_secs(10);

/// What a release waiting for approval needs: its signed policy, the statement approvers sign, and the key
/// that published it (which never counts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalNeed {
    pub policy: ApprovalPolicy,
    pub statement: ApprovalStatement,
    pub publisher_keyid: String,
}

impl ApprovalNeed {
    /// The need of a verified release, `None` when its rollout requires no approval.
    pub fn of(accepted: &AcceptedRelease) -> Option<ApprovalNeed> {
        let policy = accepted.pointer.rollout.as_ref()?.approval?;
        Some(ApprovalNeed {
            policy,
            statement: ApprovalStatement::of(&accepted.pointer),
            publisher_keyid: accepted.keyid.clone(),
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
async fn fetch(client: &reqwest::Client, url: &str) -> Result<Option<Vec<u8>>, String> {
    with_deadline(url, READ_DEADLINE, async {
        let response = client
            .get(url)
            .send()
            .await
            .map_err(|e| crate::http::fetch_error(url, &e))?;
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
    .map_err(|e| e.to_string())
}
