//! `windvane approve`: adds an approver's signature over the channel's current release to
//! `approvals/<channel>/<serial>.json` in the store ([`windvane_shared::approval`] says what is signed and
//! what counts). The current pointer is verified with the release keys the approver trusts first, so an
//! approver signs only a release they could check; the publisher's own key is refused (it would not count).
//! Runs under the store's lock, like publishing, so two approvers never lose each other's signature.

use std::io::ErrorKind;
use std::path::Path;

use ed25519_dalek::SigningKey;
use windvane_shared::approval::{self, ApprovalStatement, MAX_APPROVAL_BYTES};
use windvane_shared::dsse::Envelope;
use windvane_shared::keys::{TrustedKeys, keyid};
use windvane_shared::release::{self, ReleasePointer};

use crate::{Error, Result, channel_path, lock_store, read_capped_file, write_atomic};

/// Signs an approval of `serial` on `channel` with `key`, after verifying the current pointer with
/// `release_keys`. Returns the approved pointer and how many signatures the approval file now holds.
pub fn approve(
    root: &Path,
    channel: &str,
    serial: u64,
    key: &SigningKey,
    release_keys: &TrustedKeys,
) -> Result<(ReleasePointer, usize)> {
    crate::check_channel_name(channel)?;
    let _lock = lock_store(root)?;
    let pointer_file = root.join(channel_path(channel));
    let bytes = match read_capped_file(
        &pointer_file,
        release::DEFAULT_MAX_POINTER_BYTES,
        "channel pointer",
    ) {
        Err(Error::Io { source, .. }) if source.kind() == ErrorKind::NotFound => {
            return Err(Error::NoSuchChannel {
                location: root.display().to_string(),
                channel: channel.to_owned(),
            });
        }
        other => other?,
    };
    let accepted =
        release::verify_signed_pointer(&bytes, release_keys, release::DEFAULT_MAX_POINTER_BYTES)
            .map_err(|source| Error::CurrentPointerUnverifiable {
                path: pointer_file.clone(),
                source,
            })?;
    let pointer = accepted.pointer;
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
    let path = root.join(approval::approval_path(channel, serial));
    let existing = match read_capped_file(&path, MAX_APPROVAL_BYTES, "approval file") {
        Ok(bytes) => Some(
            Envelope::from_json_slice(&bytes).map_err(|e| Error::ApprovalFile {
                path: path.clone(),
                detail: e.to_string(),
            })?,
        ),
        Err(Error::Io { source, .. }) if source.kind() == ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    let envelope = approval::add_signature(existing, &ApprovalStatement::of(&pointer), key)
        .map_err(|detail| Error::ApprovalFile {
            path: path.clone(),
            detail,
        })?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    write_atomic(&path, &envelope.to_json_bytes())?;
    Ok((pointer, envelope.signatures.len()))
}
