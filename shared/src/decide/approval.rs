//! Two-person approval of a release, as pure functions: what an approver signs, and which of the signatures
//! found in the store count toward the release's threshold.
//!
//! A release requires approval when its signed rollout says so (`rollout: {approval: {threshold: N}}` in
//! `fleet.yaml`, copied by `windvane publish` into the signed pointer, so neither the store nor the server can
//! remove it). `windvane approve` signs an [`ApprovalStatement`] (fleet, channel, serial, bundle digest) into
//! a DSSE envelope of [`APPROVAL_PAYLOAD_TYPE`] at `approvals/<channel>/<serial>.json` in the store; further
//! approvers add their signatures to the same envelope. The agent fetches that file (capped at
//! [`MAX_APPROVAL_BYTES`]) and calls [`tally`] with the approver keys its operator configured and the key id
//! that signed the pointer: only distinct approver keys whose signature verifies over the exact statement of
//! the release count, and the publisher's key never counts as its own approver.

use std::collections::BTreeSet;

use ed25519_dalek::SigningKey;
use serde::{Deserialize, Serialize};

use crate::crypto::dsse::{self, Envelope};
use crate::crypto::keys::TrustedKeys;
use crate::format::release::ReleasePointer;
use crate::spec::rollout::ApprovalPolicy;
use crate::spec::rollout::Rollout;
use crate::wire::heartbeat::{ApprovalProgress, PendingReport};
use crate::{Error, Result};

/// The DSSE payload type of an approval.
pub const APPROVAL_PAYLOAD_TYPE: &str = "application/vnd.windvane.approval.v1+json";
/// Most bytes of an approval file that are read; a larger one is refused unread.
pub const MAX_APPROVAL_BYTES: u64 = 64 * 1024;

/// What an approver signs: exactly one release of one channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApprovalStatement {
    pub fleet: String,
    pub channel: String,
    pub serial: u64,
    pub bundle_sha256: String,
}

impl ApprovalStatement {
    /// The statement that approves `pointer`.
    pub fn of(pointer: &ReleasePointer) -> ApprovalStatement {
        ApprovalStatement {
            fleet: pointer.fleet.clone(),
            channel: pointer.channel.clone(),
            serial: pointer.serial,
            bundle_sha256: pointer.bundle.sha256.clone(),
        }
    }

    /// The statement's payload bytes (compact JSON, fixed field order).
    pub fn payload(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an approval statement is always serializable")
    }
}

/// The store path of a release's approvals, relative to the store root.
pub fn approval_path(channel: &str, serial: u64) -> String {
    format!("approvals/{channel}/{serial}.json")
}

/// Adds `key`'s signature over `statement` to `existing` (or starts an envelope). Refused (with why) when the
/// existing envelope is of another type or signs another statement; a key that already signed is replaced.
pub fn add_signature(
    existing: Option<Envelope>,
    statement: &ApprovalStatement,
    key: &SigningKey,
) -> Result<Envelope> {
    let payload = statement.payload();
    let mut fresh = dsse::sign(APPROVAL_PAYLOAD_TYPE, &payload, key);
    let Some(mut envelope) = existing else {
        return Ok(fresh);
    };
    if envelope.payload_type != APPROVAL_PAYLOAD_TYPE || envelope.payload != fresh.payload {
        return Err(Error::ApprovalSignsOther {
            channel: statement.channel.clone(),
            serial: statement.serial,
        });
    }
    let signature = fresh.signatures.remove(0);
    envelope.signatures.retain(|s| s.keyid != signature.keyid);
    envelope.signatures.push(signature);
    Ok(envelope)
}

/// Which approvals of a release count, and why the others do not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Key ids of the distinct approver keys whose signature over the release's statement verified.
    pub approved: BTreeSet<String>,
    /// Why each other signature (or the whole file) was refused, one line each.
    pub refused: Vec<String>,
}

impl Tally {
    /// Whether `policy`'s threshold is met.
    pub fn meets(&self, policy: &ApprovalPolicy) -> bool {
        self.approved.len() >= usize::try_from(policy.threshold).unwrap_or(usize::MAX)
    }
}

/// Counts the approvals in `bytes` (the approval file, already capped) for `expected`, with the operator's
/// approver keys, never counting `publisher_keyid`. Signatures are checked before the payload is parsed; a
/// payload for another release refuses every signature on it.
pub fn tally(
    bytes: &[u8],
    approvers: &TrustedKeys,
    publisher_keyid: &str,
    expected: &ApprovalStatement,
) -> Tally {
    let mut out = Tally::default();
    let envelope = match Envelope::from_json_slice(bytes) {
        Ok(envelope) => envelope,
        Err(e) => {
            out.refused
                .push(format!("the approval file is not an envelope: {e}"));
            return out;
        }
    };
    let parts = match dsse::signed_parts(&envelope, APPROVAL_PAYLOAD_TYPE, approvers) {
        Ok(parts) => parts,
        Err(e) => {
            out.refused
                .push(format!("the approval file is refused: {e}"));
            return out;
        }
    };
    let mut verified = BTreeSet::new();
    for signature in &envelope.signatures {
        let keyid = &signature.keyid;
        if keyid == publisher_keyid {
            out.refused.push(format!(
                "approval by {keyid} does not count: it is the key that published the release"
            ));
            continue;
        }
        let Some(candidate) = parts.candidates.iter().find(|c| &c.keyid == keyid) else {
            out.refused
                .push(format!("approval by {keyid}: not a trusted approver key"));
            continue;
        };
        let good = candidate
            .signature
            .is_some_and(|sig| candidate.key.verify_strict(&parts.message, &sig).is_ok());
        if good {
            verified.insert(keyid.clone());
        } else {
            out.refused.push(format!(
                "approval by {keyid}: bad signature (forged or damaged)"
            ));
        }
    }
    if verified.is_empty() {
        return out;
    }
    match serde_json::from_slice::<ApprovalStatement>(&parts.payload) {
        Ok(statement) if statement == *expected => out.approved = verified,
        Ok(statement) => out.refused.push(format!(
            "approval signed for fleet {:?} channel {:?} serial {} bundle {}, not this release (serial {} bundle {}); refused",
            statement.fleet,
            statement.channel,
            statement.serial,
            statement.bundle_sha256,
            expected.serial,
            expected.bundle_sha256
        )),
        Err(e) => out
            .refused
            .push(format!("the approval's payload is not an approval statement: {e}")),
    }
    out
}

/// What an agent reports while release `serial` (with `rollout`) waits for approval: `Awaiting approval
/// (1 of 2)`, followed by why any approval found was refused.
pub fn awaiting_report(
    rollout: &Rollout,
    serial: u64,
    wave: usize,
    policy: &ApprovalPolicy,
    tally: &Tally,
) -> PendingReport {
    let mut message = format!(
        "Awaiting approval ({} of {})",
        tally.approved.len(),
        policy.threshold
    );
    if !tally.refused.is_empty() {
        message.push_str(": ");
        message.push_str(&tally.refused.join("; "));
    }
    PendingReport {
        serial,
        wave: u32::try_from(wave + 1).unwrap_or(u32::MAX),
        waves: u32::try_from(crate::decide::rollout::wave_count(rollout)).unwrap_or(u32::MAX),
        opens_at: None,
        halted: rollout.halted,
        message,
        approval: Some(ApprovalProgress {
            approved: u32::try_from(tally.approved.len()).unwrap_or(u32::MAX),
            threshold: policy.threshold,
        }),
        changes: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::keys::{keyid, signing_key_from_seed};

    fn statement(serial: u64) -> ApprovalStatement {
        ApprovalStatement {
            fleet: "acme".into(),
            channel: "prod".into(),
            serial,
            bundle_sha256: "ab".repeat(32),
        }
    }

    fn trusting(keys: &[&SigningKey]) -> TrustedKeys {
        let mut trusted = TrustedKeys::new();
        for key in keys {
            trusted.insert(key.verifying_key()).expect("strong key");
        }
        trusted
    }

    fn signed(keys: &[&SigningKey], statement: &ApprovalStatement) -> Vec<u8> {
        let mut envelope = None;
        for key in keys {
            envelope = Some(add_signature(envelope, statement, key).expect("add"));
        }
        envelope.expect("one key").to_json_bytes()
    }

    #[test]
    fn distinct_trusted_approvers_count_toward_the_threshold() {
        let (publisher, alice, bob) = (
            signing_key_from_seed([1; 32]),
            signing_key_from_seed([2; 32]),
            signing_key_from_seed([3; 32]),
        );
        let approvers = trusting(&[&alice, &bob]);
        let publisher_id = keyid(&publisher.verifying_key());
        let two = ApprovalPolicy { threshold: 2 };
        let one = tally(
            &signed(&[&alice, &alice], &statement(4)),
            &approvers,
            &publisher_id,
            &statement(4),
        );
        assert_eq!(one.approved.len(), 1, "{one:?}");
        assert!(!one.meets(&two));
        assert!(one.meets(&ApprovalPolicy { threshold: 1 }));
        let both = tally(
            &signed(&[&alice, &bob], &statement(4)),
            &approvers,
            &publisher_id,
            &statement(4),
        );
        assert!(both.meets(&two), "{both:?}");
    }

    #[test]
    fn the_publishers_key_never_approves_its_own_release() {
        let publisher = signing_key_from_seed([1; 32]);
        // Even when the operator also configured it as an approver key.
        let approvers = trusting(&[&publisher]);
        let counted = tally(
            &signed(&[&publisher], &statement(4)),
            &approvers,
            &keyid(&publisher.verifying_key()),
            &statement(4),
        );
        assert!(counted.approved.is_empty());
        assert!(
            counted.refused[0].contains("published the release"),
            "{counted:?}"
        );
    }

    #[test]
    fn forged_unknown_and_misdirected_approvals_are_refused() {
        let (publisher, alice, mallory) = (
            signing_key_from_seed([1; 32]),
            signing_key_from_seed([2; 32]),
            signing_key_from_seed([9; 32]),
        );
        let approvers = trusting(&[&alice]);
        let publisher_id = keyid(&publisher.verifying_key());

        let mut forged = add_signature(None, &statement(4), &alice).expect("sign");
        forged.signatures[0].sig = dsse::sign(APPROVAL_PAYLOAD_TYPE, b"other", &alice).signatures
            [0]
        .sig
        .clone();
        let counted = tally(
            &forged.to_json_bytes(),
            &approvers,
            &publisher_id,
            &statement(4),
        );
        assert!(counted.approved.is_empty());
        assert!(counted.refused[0].contains("bad signature"), "{counted:?}");

        let unknown = tally(
            &signed(&[&mallory], &statement(4)),
            &approvers,
            &publisher_id,
            &statement(4),
        );
        assert!(unknown.approved.is_empty(), "{unknown:?}");

        let other_serial = tally(
            &signed(&[&alice], &statement(3)),
            &approvers,
            &publisher_id,
            &statement(4),
        );
        assert!(other_serial.approved.is_empty());
        assert!(
            other_serial.refused[0].contains("serial 3"),
            "{other_serial:?}"
        );

        let garbage = tally(b"{", &approvers, &publisher_id, &statement(4));
        assert!(garbage.approved.is_empty() && !garbage.refused.is_empty());
    }

    #[test]
    fn an_approval_is_bound_to_fleet_channel_serial_and_bundle_digest() {
        let (publisher, alice) = (
            signing_key_from_seed([1; 32]),
            signing_key_from_seed([2; 32]),
        );
        let approvers = trusting(&[&alice]);
        let publisher_id = keyid(&publisher.verifying_key());
        let release = statement(4);
        let others = [
            ApprovalStatement {
                fleet: "other".into(),
                ..release.clone()
            },
            ApprovalStatement {
                channel: "dev".into(),
                ..release.clone()
            },
            ApprovalStatement {
                serial: 5,
                ..release.clone()
            },
            ApprovalStatement {
                bundle_sha256: "ef".repeat(32),
                ..release.clone()
            },
        ];
        for other in &others {
            // An approval of another fleet, channel, serial or bundle never counts for this release.
            let counted = tally(
                &signed(&[&alice], other),
                &approvers,
                &publisher_id,
                &release,
            );
            assert!(
                counted.approved.is_empty(),
                "{other:?} counted: {counted:?}"
            );
            assert!(
                counted.refused[0].contains("not this release"),
                "{counted:?}"
            );
            // The signed bytes name all four: the payload of each differs from the release's.
            assert_ne!(other.payload(), release.payload());
        }
        let payload: serde_json::Value = serde_json::from_slice(&release.payload()).expect("json");
        for field in ["fleet", "channel", "serial", "bundleSha256"] {
            assert!(
                payload.get(field).is_some(),
                "{field} not signed: {payload}"
            );
        }
        let counted = tally(
            &signed(&[&alice], &release),
            &approvers,
            &publisher_id,
            &release,
        );
        assert_eq!(counted.approved.len(), 1, "{counted:?}");
    }

    #[test]
    fn a_second_approver_adds_to_the_file_but_not_to_another_statement() {
        let (alice, bob) = (
            signing_key_from_seed([2; 32]),
            signing_key_from_seed([3; 32]),
        );
        let first = add_signature(None, &statement(4), &alice).expect("first");
        let second = add_signature(Some(first.clone()), &statement(4), &bob).expect("second");
        assert_eq!(second.signatures.len(), 2);
        let again = add_signature(Some(second), &statement(4), &bob).expect("again");
        assert_eq!(again.signatures.len(), 2);
        assert!(add_signature(Some(first), &statement(5), &bob).is_err());
    }
}
