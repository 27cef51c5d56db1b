//! `windvane approve`: adds an approver's signature over the channel's current release to
//! `approvals/<channel>/<serial>.json` in the store ([`windvane_shared::decide::approval`] says what is signed and
//! what counts). The current pointer is verified with the release keys the approver trusts first, and
//! checked to be the channel's own, unexpired and not older than its signed history, so an approver signs
//! only a release they could check; the publisher's own key is refused (it would not count).
//! In a directory it runs under the store's lock, in a bucket it writes on the condition that the file is
//! as read, so two approvers never lose each other's signature.

use ed25519_dalek::SigningKey;
use windvane_shared::crypto::dsse::Envelope;
use windvane_shared::crypto::keys::{TrustedKeys, keyid};
use windvane_shared::decide::approval::{self, ApprovalStatement, MAX_APPROVAL_BYTES};
use windvane_shared::format::release::{self, ReleasePointer};

use crate::{Error, Put, Result, Store, channel_path};

/// Signs an approval of `serial` on `channel` with `key`, after verifying the current pointer with
/// `release_keys`. Returns the approved pointer and how many signatures the approval file now holds.
pub async fn approve(
    store: &Store,
    channel: &str,
    fleet: Option<&str>,
    serial: u64,
    key: &SigningKey,
    release_keys: &TrustedKeys,
) -> Result<(ReleasePointer, usize)> {
    crate::check_channel_name(channel)?;
    let _hold = store.hold(false)?;
    let pointer_file = channel_path(channel);
    let Some(current) = store
        .get(
            &pointer_file,
            release::DEFAULT_MAX_POINTER_BYTES,
            "channel pointer",
        )
        .await?
    else {
        return Err(Error::NoSuchChannel {
            location: store.to_string(),
            channel: channel.to_owned(),
        });
    };
    let accepted = release::verify_signed_pointer(
        &current.bytes,
        release_keys,
        release::DEFAULT_MAX_POINTER_BYTES,
    )
    .map_err(|source| Error::CurrentPointerUnverifiable {
        path: store.describe(&pointer_file),
        source,
    })?;
    let pointer = accepted.pointer;
    let asked = crate::history::Asked {
        channel,
        fleet,
        now: jiff::Timestamp::now(),
        expired_ok: false,
    };
    crate::history::check_current(store, &pointer, release_keys, &asked).await?;
    if pointer.serial != serial {
        return Err(Error::NotCurrentSerial {
            channel: channel.to_owned(),
            current: pointer.serial,
            asked: serial,
        });
    }
    let own = keyid(&key.verifying_key());
    if own == accepted.keyid {
        return Err(Error::SelfApproval {
            channel: channel.to_owned(),
            serial,
            keyid: own,
        });
    }
    let path = approval::approval_path(channel, serial);
    let file_error = |detail: String| Error::ApprovalFile {
        path: store.describe(&path),
        detail,
    };
    let existing = store
        .get(&path, MAX_APPROVAL_BYTES, "approval file")
        .await?;
    let envelope = match &existing {
        Some(stored) => {
            Some(Envelope::from_json_slice(&stored.bytes).map_err(|e| file_error(e.to_string()))?)
        }
        None => None,
    };
    let envelope = approval::add_signature(envelope, &ApprovalStatement::of(&pointer), key)
        .map_err(|e| file_error(e.to_string()))?;
    // Two approvers at once: in a bucket the later write finds the file changed and is refused, so no
    // signature is silently lost (the approver runs the command again).
    let put = Put::IfUnchanged(existing.as_ref().map(|stored| &stored.version));
    store.put(&path, &envelope.to_json_bytes(), put).await?;
    Ok((pointer, envelope.signatures.len()))
}
