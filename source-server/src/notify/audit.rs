//! Audit export: every drift record the server stores also goes out as one JSON line — to a file (appended)
//! or to an HTTP endpoint (POSTed in batches as `application/x-ndjson`, retried with backoff) — for the
//! security team's log pipeline. The line's fields are [`line`]'s (documented in the operator guide); the
//! ingest writer hands over the lines of each committed batch, and this task writes them, so storing
//! heartbeats never waits on the export (a full queue drops lines and says so in the log).

use std::path::PathBuf;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use windvane_shared::wire::heartbeat::DriftRecord;

/// Where the lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditTarget {
    /// Appended to this file.
    File(PathBuf),
    /// POSTed to this URL.
    Http(String),
}

impl AuditTarget {
    /// `http://…` or `https://…` is an endpoint; anything else a file path.
    pub fn parse(text: &str) -> AuditTarget {
        if text.starts_with("http://") || text.starts_with("https://") {
            AuditTarget::Http(text.to_owned())
        } else {
            AuditTarget::File(PathBuf::from(text))
        }
    }
}

/// One drift record as an audit line: who changed what fields of which object on which cluster and release,
/// when it was changed, detected and repaired, and what Windvane did.
pub fn line(
    cluster: &str,
    serial: Option<u64>,
    received_at: Timestamp,
    record: &DriftRecord,
) -> String {
    // Escaped like every JSON body the server sends ([`crate::notify::escape::json`]): a log pipeline that
    // renders a line as HTML gets no markup from a cluster.
    crate::notify::escape::json(&json!({
        "cluster": cluster,
        "release": serial,
        "app": record.app,
        "group": record.group,
        "kind": record.kind,
        "namespace": record.namespace,
        "name": record.name,
        "fields": record.fields,
        "deleted": record.deleted,
        "who": record.manager,
        "operation": record.operation,
        "changedAt": record.changed_at,
        "detectedAt": record.detected_at,
        "repairedAt": record.reverted_at,
        "action": record.action,
        "breakGlass": record.break_glass,
        "revertRequestedBy": record.revert_requested_by,
        "receivedAt": received_at,
    }))
}

/// How many times one batch is POSTed before its lines are given up.
const MAX_ATTEMPTS: u32 = 6;

/// Writes the lines that arrive on `lines` to `target` until the channel closes.
pub async fn run(target: AuditTarget, mut lines: mpsc::Receiver<Vec<String>>) {
    // Only an endpoint needs an HTTP client (and the process's TLS provider).
    let client = match &target {
        AuditTarget::Http(url) => reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .build()
            .inspect_err(|error| tracing::error!(%error, %url, "cannot build the audit export's HTTP client"))
            .ok(),
        AuditTarget::File(_) => None,
    };
    while let Some(mut batch) = lines.recv().await {
        // Whatever else is queued goes with it.
        while let Ok(more) = lines.try_recv() {
            batch.extend(more);
        }
        let mut text = batch.join("\n");
        text.push('\n');
        let result = match (&target, &client) {
            (AuditTarget::File(path), _) => append(path, &text).await,
            (AuditTarget::Http(url), Some(client)) => post(client, url, text).await,
            (AuditTarget::Http(url), None) => Err(crate::Error::AuditNoClient { url: url.clone() }),
        };
        if let Err(error) = result {
            tracing::error!(%error, lines = batch.len(), "audit export failed; these drift lines are not exported");
        }
    }
}

async fn append(path: &std::path::Path, text: &str) -> crate::Result<()> {
    let failed = |source| crate::Error::AuditWrite {
        path: path.to_owned(),
        source,
    };
    let mut file = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .await
        .map_err(failed)?;
    file.write_all(text.as_bytes()).await.map_err(failed)?;
    file.flush().await.map_err(failed)
}

async fn post(client: &reqwest::Client, url: &str, text: String) -> crate::Result<()> {
    let mut last = crate::Error::AuditNoClient {
        url: url.to_owned(),
    };
    for attempt in 1..=MAX_ATTEMPTS {
        let sent = client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/x-ndjson")
            .body(text.clone())
            .send()
            .await;
        match sent {
            Ok(response) if response.status().is_success() => return Ok(()),
            Ok(response) => {
                last = crate::Error::AuditStatus {
                    url: url.to_owned(),
                    status: response.status(),
                }
            }
            Err(source) => {
                last = crate::Error::AuditSend {
                    url: url.to_owned(),
                    source,
                }
            }
        }
        tracing::warn!(error = %last, attempt, "audit export attempt failed");
        if attempt < MAX_ATTEMPTS {
            tokio::time::sleep(crate::notify::backoff(attempt)).await;
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use windvane_shared::wire::heartbeat::{BreakGlassRecord, DriftAction};

    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).expect("valid")
    }

    #[test]
    fn a_line_holds_the_documented_fields() {
        let record = DriftRecord {
            app: "web".into(),
            group: "apps".into(),
            kind: "Deployment".into(),
            namespace: Some("shop".into()),
            name: "web".into(),
            fields: vec!["/spec/replicas".into()],
            deleted: false,
            manager: Some("kubectl-scale".into()),
            operation: Some("Update".into()),
            changed_at: Some(at(0)),
            detected_at: at(1),
            reverted_at: Some(at(2)),
            action: DriftAction::Reverted,
            break_glass: Some(BreakGlassRecord {
                by: "alice".into(),
                approver: "bob".into(),
                ticket: "INC-7".into(),
                until: at(3600),
            }),
            revert_requested_by: None,
        };
        let text = line("prod-eu", Some(7), at(5), &record);
        assert!(!text.contains('\n'), "one line");
        let value: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(value["cluster"], "prod-eu");
        assert_eq!(value["release"], 7);
        assert_eq!(value["who"], "kubectl-scale");
        assert_eq!(value["fields"], json!(["/spec/replicas"]));
        assert_eq!(value["changedAt"], "2027-01-15T08:00:00Z");
        assert_eq!(value["detectedAt"], "2027-01-15T08:00:01Z");
        assert_eq!(value["repairedAt"], "2027-01-15T08:00:02Z");
        assert_eq!(value["action"], "Reverted");
        assert_eq!(value["breakGlass"]["approver"], "bob");
        assert_eq!(value["receivedAt"], "2027-01-15T08:00:05Z");
        for field in [
            "app",
            "group",
            "kind",
            "namespace",
            "name",
            "deleted",
            "operation",
            "revertRequestedBy",
        ] {
            assert!(value.get(field).is_some(), "{field}");
        }
    }

    #[test]
    fn targets_are_endpoints_or_files() {
        assert_eq!(
            AuditTarget::parse("https://logs.example/drift"),
            AuditTarget::Http("https://logs.example/drift".into())
        );
        assert_eq!(
            AuditTarget::parse("/var/log/windvane/drift.jsonl"),
            AuditTarget::File("/var/log/windvane/drift.jsonl".into())
        );
    }

    #[tokio::test]
    async fn lines_are_appended_to_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("drift.jsonl");
        let (tx, rx) = mpsc::channel(4);
        let task = tokio::spawn(run(AuditTarget::File(path.clone()), rx));
        tx.send(vec!["{\"a\":1}".into(), "{\"a\":2}".into()])
            .await
            .expect("send");
        tx.send(vec!["{\"a\":3}".into()]).await.expect("send");
        drop(tx);
        task.await.expect("task");
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(text, "{\"a\":1}\n{\"a\":2}\n{\"a\":3}\n");
    }
}
