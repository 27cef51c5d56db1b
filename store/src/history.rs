//! The channel's signed history: a copy of every pointer published on a channel, exactly as signed, at
//! `channels/<channel>.releases/<serial>.json` ([`entry_path`]). It is what commands that sign on the
//! strength of what they read check against, and what `windvane rollback` picks its target from.
//!
//! Why copies of the signed pointers rather than a signed history file: each entry is verified by the same
//! verifier as the pointer itself (no new signed format, no new parser), an entry is written once and never
//! rewritten (a create-only write, no read-modify-write race in a bucket), and a store writer can delete
//! entries but never add or alter one without the release key. The unsigned `channels/<channel>.history`
//! that older versions wrote is no longer read.
//!
//! [`check_read`] decides (pure) whether a pointer read from the store is what a command asked for: its
//! channel and fleet, not expired, and not older than the signed history. [`read_current`] does the I/O
//! around it for `promote`, `approve`, `rollout halt|resume`, `rollback` and `publish`. [`rollback_target`]
//! decides (pure) which entry a rollback goes back to.

use jiff::Timestamp;
use windvane_shared::crypto::keys::TrustedKeys;
use windvane_shared::format::release::{self, ReleasePointer};

use crate::{CHANNELS_DIR, Error, Put, Result, Store, channel_path};

/// How many earlier entries `windvane rollback` reads back, at most, to find its target.
pub const MAX_ROLLBACK_DEPTH: u64 = 64;

/// The signed history entry of `serial` on `channel`, relative to the store root.
pub fn entry_path(channel: &str, serial: u64) -> String {
    format!("{CHANNELS_DIR}/{channel}.releases/{serial}.json")
}

/// Records a signed pointer as the history entry of its serial, unless one is there already (an entry is
/// the first pointer signed for its serial; a halt or resume re-signs the same serial and bundle).
pub(crate) async fn record(store: &Store, pointer: &ReleasePointer, envelope: &[u8]) -> Result<()> {
    let path = entry_path(&pointer.channel, pointer.serial);
    if store
        .get(&path, release::DEFAULT_MAX_POINTER_BYTES, "history entry")
        .await?
        .is_some()
    {
        return Ok(());
    }
    match store.put(&path, envelope, Put::IfUnchanged(None)).await {
        // Another publisher recorded the same serial meanwhile: the pointer write decided who won.
        Err(Error::ChangedConcurrently { .. }) => Ok(()),
        other => other,
    }
}

/// The verified history entry of `serial` on `channel`; `None` when there is none. An entry that does not
/// verify with `trusted`, or is another channel's or serial's, is an error: the store was tampered with.
pub async fn read_entry(
    store: &Store,
    channel: &str,
    serial: u64,
    trusted: &TrustedKeys,
) -> Result<Option<ReleasePointer>> {
    let path = entry_path(channel, serial);
    let Some(bytes) = store
        .read(&path, release::DEFAULT_MAX_POINTER_BYTES, "history entry")
        .await?
    else {
        return Ok(None);
    };
    let bad = |detail: String| Error::HistoryEntry {
        path: store.describe(&path),
        detail,
    };
    let pointer =
        release::verify_signed_pointer(&bytes, trusted, release::DEFAULT_MAX_POINTER_BYTES)
            .map_err(|e| bad(e.to_string()))?
            .pointer;
    if pointer.channel != channel || pointer.serial != serial {
        return Err(bad(format!(
            "it holds channel {:?} serial {}, not channel {channel:?} serial {serial}",
            pointer.channel, pointer.serial
        )));
    }
    Ok(Some(pointer))
}

/// What a command asks of the pointer it read.
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    pub channel: &'a str,
    /// The fleet given on the command line; when `None`, the fleet of the channel's signed history entry.
    pub fleet: Option<&'a str>,
    pub now: Timestamp,
    /// Whether an expired pointer will do (publish and rollback renew the channel; halt, resume, approve
    /// and promote act on the release as it stands).
    pub expired_ok: bool,
}

/// Whether `pointer`, read at `path`, is what was asked for (pure). `recorded` is the channel's signed
/// history entry of the pointer's serial, if any; `newer` the serial after it when the history has that one.
pub fn check_read(
    path: &std::path::Path,
    pointer: &ReleasePointer,
    asked: &Asked<'_>,
    recorded: Option<&ReleasePointer>,
    newer: Option<u64>,
) -> Result<()> {
    let refuse = |detail: String| {
        Err(Error::NotWhatWasAsked {
            path: path.to_path_buf(),
            detail,
        })
    };
    if pointer.channel != asked.channel {
        return refuse(format!(
            "it is channel {:?}'s release, not channel {:?}'s (was another channel's pointer copied here?)",
            pointer.channel, asked.channel
        ));
    }
    let fleet = asked
        .fleet
        .or(recorded.map(|r| r.fleet.as_str()))
        .unwrap_or(&pointer.fleet);
    if pointer.fleet != fleet {
        return refuse(format!(
            "it is fleet {:?}'s release, not fleet {fleet:?}'s",
            pointer.fleet
        ));
    }
    if !asked.expired_ok && pointer.expires_at <= asked.now {
        return refuse(format!(
            "it expired at {}; publish the channel anew",
            pointer.expires_at
        ));
    }
    if let Some(recorded) = recorded
        && recorded.bundle != pointer.bundle
    {
        return refuse(format!(
            "it names bundle {} for serial {}, but the channel's signed history has {} for that serial",
            pointer.bundle.sha256, pointer.serial, recorded.bundle.sha256
        ));
    }
    if let Some(newer) = newer {
        return refuse(format!(
            "it is serial {}, but the channel's signed history already has serial {newer}: the store holds an \
             older pointer than was published",
            pointer.serial
        ));
    }
    Ok(())
}

/// Verifies the channel's current pointer `bytes` with `trusted` and checks it ([`check_current`]).
pub(crate) async fn read_current(
    store: &Store,
    bytes: &[u8],
    trusted: &TrustedKeys,
    asked: &Asked<'_>,
) -> Result<ReleasePointer> {
    let path = channel_path(asked.channel);
    let pointer =
        release::verify_signed_pointer(bytes, trusted, release::DEFAULT_MAX_POINTER_BYTES)
            .map_err(|source| Error::CurrentPointerUnverifiable {
                path: store.describe(&path),
                source,
            })?
            .pointer;
    check_current(store, &pointer, trusted, asked).await?;
    Ok(pointer)
}

/// The current pointer of `asked.channel`, verified with `trusted` and checked ([`check_current`]): what
/// `promote` and `rollback` sign on the strength of.
pub async fn current(
    store: &Store,
    trusted: &TrustedKeys,
    asked: &Asked<'_>,
) -> Result<ReleasePointer> {
    crate::check_channel_name(asked.channel)?;
    let bytes = store
        .read(
            &channel_path(asked.channel),
            release::DEFAULT_MAX_POINTER_BYTES,
            "channel pointer",
        )
        .await?
        .ok_or_else(|| Error::NoSuchChannel {
            location: store.to_string(),
            channel: asked.channel.to_owned(),
        })?;
    read_current(store, &bytes, trusted, asked).await
}

/// [`check_read`] of the verified current pointer of `asked.channel`, with the signed history entries of
/// its serial and the next one read from `store`.
pub(crate) async fn check_current(
    store: &Store,
    pointer: &ReleasePointer,
    trusted: &TrustedKeys,
    asked: &Asked<'_>,
) -> Result<()> {
    let described = store.describe(&channel_path(asked.channel));
    // A wrong channel is said before anything is read under its name.
    check_read(&described, pointer, asked, None, None)?;
    let recorded = read_entry(store, asked.channel, pointer.serial, trusted).await?;
    let next = pointer.serial.saturating_add(1);
    let newer = read_entry(store, asked.channel, next, trusted)
        .await?
        .map(|p| p.serial);
    check_read(&described, pointer, asked, recorded.as_ref(), newer)
}

/// The entry a rollback goes back to (pure). `earlier` holds the channel's history entries before
/// `current`, newest first, as far back as they were read. With `to`, that serial (which must be earlier
/// and carry another bundle); without, the newest earlier entry with another bundle than the current one
/// — refused when the current bundle also appears before that entry, since then the current release is
/// itself a rollback and going "back" would bring the release it replaced again.
pub fn rollback_target<'a>(
    current: &ReleasePointer,
    earlier: &'a [ReleasePointer],
    to: Option<u64>,
) -> Result<&'a ReleasePointer> {
    let target = pick_target(current, earlier, to)?;
    if target.fleet != current.fleet {
        return Err(Error::RollbackTarget {
            channel: current.channel.clone(),
            detail: format!(
                "serial {} was fleet {:?}'s release, the channel is fleet {:?}'s now",
                target.serial, target.fleet, current.fleet
            ),
        });
    }
    Ok(target)
}

fn pick_target<'a>(
    current: &ReleasePointer,
    earlier: &'a [ReleasePointer],
    to: Option<u64>,
) -> Result<&'a ReleasePointer> {
    let refuse = |detail: String| {
        Err(Error::RollbackTarget {
            channel: current.channel.clone(),
            detail,
        })
    };
    let listing = || {
        earlier
            .iter()
            .map(|p| format!("{} {}", p.serial, short(&p.bundle.sha256)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(serial) = to {
        if serial >= current.serial {
            return refuse(format!(
                "--to {serial} is not earlier than the current serial {}",
                current.serial
            ));
        }
        return match earlier.iter().find(|p| p.serial == serial) {
            None => refuse(format!(
                "serial {serial} has no signed history entry ({}); the signed history holds: {}",
                entry_path(&current.channel, serial),
                listing()
            )),
            Some(p) if p.bundle == current.bundle => refuse(format!(
                "serial {serial} carries the current bundle {}: nothing would change",
                short(&p.bundle.sha256)
            )),
            Some(p) => Ok(p),
        };
    }
    let Some(position) = earlier.iter().position(|p| p.bundle != current.bundle) else {
        return refuse(format!(
            "no earlier serial in the signed history carries another bundle (entries {}); older stores \
             record signed history from the first publish by this version on",
            listing()
        ));
    };
    if earlier[position + 1..]
        .iter()
        .any(|p| p.bundle == current.bundle)
    {
        return refuse(format!(
            "serial {} carries a bundle the channel had before serial {} (it is itself a rollback); name the \
             release to go back to with --to SERIAL; signed history: {}",
            current.serial,
            earlier[position].serial,
            listing()
        ));
    }
    Ok(&earlier[position])
}

/// The first twelve hex digits of a digest, for listings.
fn short(sha256: &str) -> &str {
    sha256.get(..12).unwrap_or(sha256)
}

/// The channel's signed history before `current`, newest first: the entries `current.serial - 1` down to
/// the first missing one, at most [`MAX_ROLLBACK_DEPTH`].
pub async fn earlier_entries(
    store: &Store,
    current: &ReleasePointer,
    trusted: &TrustedKeys,
) -> Result<Vec<ReleasePointer>> {
    let mut entries = Vec::new();
    let oldest = current.serial.saturating_sub(MAX_ROLLBACK_DEPTH).max(1);
    for serial in (oldest..current.serial).rev() {
        match read_entry(store, &current.channel, serial, trusted).await? {
            Some(entry) => entries.push(entry),
            None => break,
        }
    }
    if entries.is_empty() {
        return Err(Error::NoSignedHistory {
            channel: current.channel.clone(),
            serial: current.serial,
            path: store.describe(&entry_path(
                &current.channel,
                current.serial.saturating_sub(1),
            )),
        });
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use windvane_shared::format::release::BundleRef;

    use super::*;

    fn pointer(channel: &str, serial: u64, bundle: char) -> ReleasePointer {
        ReleasePointer {
            fleet: "acme".to_owned(),
            channel: channel.to_owned(),
            serial,
            issued_at: "2026-12-07T10:00:00Z".parse().expect("time"),
            expires_at: "2026-12-08T10:00:00Z".parse().expect("time"),
            bundle: BundleRef {
                sha256: bundle.to_string().repeat(64),
                size: 10,
            },
            allow_empty: false,
            rollout: None,
        }
    }

    fn asked(channel: &'static str, now: &str) -> Asked<'static> {
        Asked {
            channel,
            fleet: None,
            now: now.parse().expect("time"),
            expired_ok: false,
        }
    }

    fn refused(result: Result<()>, says: &str) {
        let error = result.expect_err(says).to_string();
        assert!(error.contains(says), "{error}");
    }

    #[test]
    fn a_pointer_is_checked_for_channel_fleet_expiry_and_history() {
        let path = Path::new("store/channels/staging.json");
        let now = "2026-12-07T12:00:00Z";
        let staging = pointer("staging", 4, 'a');
        assert!(check_read(path, &staging, &asked("staging", now), Some(&staging), None).is_ok());
        refused(
            check_read(
                path,
                &pointer("dev", 4, 'a'),
                &asked("staging", now),
                None,
                None,
            ),
            "channel \"dev\"'s release, not channel \"staging\"'s",
        );
        let mut other_fleet = staging.clone();
        other_fleet.fleet = "umbrella".to_owned();
        refused(
            check_read(
                path,
                &other_fleet,
                &asked("staging", now),
                Some(&staging),
                None,
            ),
            "fleet \"umbrella\"'s release, not fleet \"acme\"'s",
        );
        let given = Asked {
            fleet: Some("umbrella"),
            ..asked("staging", now)
        };
        refused(
            check_read(path, &staging, &given, None, None),
            "not fleet \"umbrella\"'s",
        );
        refused(
            check_read(
                path,
                &staging,
                &asked("staging", "2026-12-09T00:00:00Z"),
                None,
                None,
            ),
            "expired at 2026-12-08T10:00:00Z",
        );
        let renewing = Asked {
            expired_ok: true,
            ..asked("staging", "2026-12-09T00:00:00Z")
        };
        assert!(check_read(path, &staging, &renewing, None, None).is_ok());
        refused(
            check_read(
                path,
                &staging,
                &asked("staging", now),
                Some(&pointer("staging", 4, 'b')),
                None,
            ),
            "signed history has bbbb",
        );
        refused(
            check_read(
                path,
                &staging,
                &asked("staging", now),
                Some(&staging),
                Some(5),
            ),
            "already has serial 5",
        );
    }

    #[test]
    fn rollback_goes_to_the_newest_other_bundle_or_the_serial_asked() {
        // 1 a, 2 b, and the current 3 c.
        let current = pointer("prod", 3, 'c');
        let earlier = [pointer("prod", 2, 'b'), pointer("prod", 1, 'a')];
        assert_eq!(
            rollback_target(&current, &earlier, None)
                .expect("target")
                .serial,
            2
        );
        assert_eq!(
            rollback_target(&current, &earlier, Some(1))
                .expect("to")
                .serial,
            1
        );
        let error = rollback_target(&current, &earlier, Some(3)).expect_err("not earlier");
        assert!(error.to_string().contains("not earlier"), "{error}");
        let error = rollback_target(&current, &earlier, Some(7)).expect_err("not earlier");
        assert!(error.to_string().contains("not earlier"), "{error}");
        let error = rollback_target(&pointer("prod", 9, 'c'), &earlier, Some(5)).expect_err("none");
        assert!(
            error.to_string().contains("no signed history entry"),
            "{error}"
        );
    }

    #[test]
    fn a_second_rollback_does_not_toggle_back_to_the_bad_release() {
        // 1 a (good), 2 b (bad), 3 a (the rollback): the default would bring b back.
        let current = pointer("prod", 3, 'a');
        let earlier = [pointer("prod", 2, 'b'), pointer("prod", 1, 'a')];
        let error = rollback_target(&current, &earlier, None).expect_err("toggle");
        assert!(error.to_string().contains("--to SERIAL"), "{error}");
        assert_eq!(
            rollback_target(&pointer("prod", 3, 'a'), &earlier, Some(2))
                .expect("asked for")
                .serial,
            2
        );
        let same = [pointer("prod", 1, 'a')];
        let error = rollback_target(&current, &same, None).expect_err("nothing else");
        assert!(error.to_string().contains("no earlier serial"), "{error}");
    }
}
