//! Changes to a channel's rollout that are not a new release: a signed halt or resume of the current serial
//! ([`set_halted`]: the same serial and bundle, the rollout's `halted` flipped and its `control` counter
//! raised so that agents never go back to an older control), and the channel's history
//! (`channels/<channel>.history`, one line per published serial: `serial sha256`), which
//! [`previous_bundle`] reads for `windvane rollback`. In a directory both run under the store's lock, like
//! publishing; in a bucket both are conditional writes on the file as read.

use ed25519_dalek::SigningKey;
use windvane_shared::keys::TrustedKeys;
use windvane_shared::release::{self, ReleasePointer};

use crate::{CHANNELS_DIR, Error, Put, Result, Store, channel_path};

/// The history file of a channel, relative to the store root.
pub fn history_path(channel: &str) -> String {
    format!("{CHANNELS_DIR}/{channel}.history")
}

/// How much history is read back; older lines are dropped when it would grow past it (a rollback only ever
/// needs the last few).
const MAX_HISTORY_BYTES: u64 = 256 * 1024;

/// Appends a published serial to the channel's history. A bucket has no append: the file is rewritten on
/// the condition that it is still as read, and read again when another publisher changed it meanwhile.
pub(crate) async fn record(store: &Store, channel: &str, pointer: &ReleasePointer) -> Result<()> {
    let path = history_path(channel);
    let line = format!("{} {}\n", pointer.serial, pointer.bundle.sha256);
    let mut attempts = 0;
    loop {
        let current = store
            .get(&path, MAX_HISTORY_BYTES, "channel history")
            .await?;
        let mut text = current
            .as_ref()
            .map(|stored| String::from_utf8_lossy(&stored.bytes).into_owned())
            .unwrap_or_default();
        text.push_str(&line);
        let text = keep_tail(&text, MAX_HISTORY_BYTES as usize / 2);
        let put = Put::IfUnchanged(current.as_ref().map(|stored| &stored.version));
        match store.put(&path, text.as_bytes(), put).await {
            Err(Error::ChangedConcurrently { .. }) if attempts < 3 => attempts += 1,
            other => return other,
        }
    }
}

/// The whole lines at the end of `text` that fit in `limit` bytes.
fn keep_tail(text: &str, limit: usize) -> &str {
    if text.len() <= limit {
        return text;
    }
    let cut = text.len() - limit;
    match text[cut..].find('\n') {
        Some(newline) => &text[cut + newline + 1..],
        None => "",
    }
}

/// The bundle digest published before the current one (the latest history entry with another digest than
/// `current`), or why there is none.
pub async fn previous_bundle(store: &Store, channel: &str, current: &str) -> Result<String> {
    let no_history = || Error::NoHistory {
        channel: channel.to_owned(),
    };
    let stored = store
        .get(&history_path(channel), MAX_HISTORY_BYTES, "channel history")
        .await?
        .ok_or_else(no_history)?;
    String::from_utf8_lossy(&stored.bytes)
        .lines()
        .rev()
        .filter_map(|line| line.split_whitespace().nth(1))
        .find(|sha| *sha != current && windvane_shared::digest::is_sha256_hex(sha))
        .map(str::to_owned)
        .ok_or_else(no_history)
}

/// Re-signs the channel's current pointer with its rollout halted (or resumed): same serial, bundle and
/// issue time, `control` one higher. Refused when the release has no rollout (every cluster took it at once)
/// or is already in that state.
pub async fn set_halted(
    store: &Store,
    channel: &str,
    key: &SigningKey,
    also_trusted: &TrustedKeys,
    halted: bool,
) -> Result<ReleasePointer> {
    crate::check_channel_name(channel)?;
    let _hold = store.hold(false)?;
    let path = channel_path(channel);
    let Some(current) = store
        .get(&path, release::DEFAULT_MAX_POINTER_BYTES, "channel pointer")
        .await?
    else {
        return Err(Error::NoSuchChannel {
            location: store.to_string(),
            channel: channel.to_owned(),
        });
    };
    let mut pointer = verify_with(store, &path, &current.bytes, key, also_trusted)?;
    let Some(rollout) = pointer.rollout.as_mut() else {
        return Err(Error::NoRollout {
            channel: channel.to_owned(),
            serial: pointer.serial,
        });
    };
    if rollout.halted == halted {
        return Err(Error::AlreadyInState {
            channel: channel.to_owned(),
            serial: pointer.serial,
            halted,
        });
    }
    rollout.halted = halted;
    rollout.control += 1;
    let bytes = pointer.sign(key).to_json_bytes();
    store
        .put(&path, &bytes, Put::IfUnchanged(Some(&current.version)))
        .await?;
    Ok(pointer)
}

/// Verifies a channel pointer read from `store` with `key` and the keys trusted besides it.
pub(crate) fn verify_with(
    store: &Store,
    path: &str,
    bytes: &[u8],
    key: &SigningKey,
    also_trusted: &TrustedKeys,
) -> Result<ReleasePointer> {
    let mut trusted = also_trusted.clone();
    let unverifiable = |source| Error::CurrentPointerUnverifiable {
        path: store.describe(path),
        source,
    };
    trusted.insert(key.verifying_key()).map_err(unverifiable)?;
    Ok(
        release::verify_signed_pointer(bytes, &trusted, release::DEFAULT_MAX_POINTER_BYTES)
            .map_err(unverifiable)?
            .pointer,
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use jiff::Timestamp;
    use windvane_shared::bundle::{App, BUNDLE_API_VERSION, Bundle};
    use windvane_shared::keys::signing_key_from_seed;
    use windvane_shared::rollout::{Rollout, Wave};

    use std::path::Path;

    use futures::executor::block_on;

    use super::*;
    use crate::{PublishRequest, publish_dir};

    fn at(dir: &Path) -> Store {
        Store::Dir(dir.to_path_buf())
    }

    #[test]
    fn the_history_keeps_whole_lines_at_its_end() {
        assert_eq!(keep_tail("1 a\n2 b\n", 100), "1 a\n2 b\n");
        assert_eq!(keep_tail("1 a\n2 b\n3 c\n", 6), "3 c\n");
        assert_eq!(keep_tail("1 aaaaaaaa", 4), "");
    }

    fn bundle(greeting: &str, rollout: Option<Rollout>) -> Bundle {
        let object = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "web", "namespace": "web"}, "data": {"greeting": greeting}
        });
        let app: App = serde_json::from_value(serde_json::json!({
            "name": "web",
            "manifests": [{"file": "web.yaml", "document": 0, "object": object}]
        }))
        .expect("app");
        Bundle {
            api_version: BUNDLE_API_VERSION.to_owned(),
            fleet: "acme".to_owned(),
            apps: vec![app],
            rollout,
        }
    }

    fn publish_one(root: &Path, key: &SigningKey, bundle: &Bundle) -> ReleasePointer {
        let request = PublishRequest {
            channel: "prod",
            bundle,
            key,
            also_trusted: &TrustedKeys::new(),
            expires_in: Duration::from_secs(3600),
            allow_empty: false,
            now: Timestamp::now(),
        };
        publish_dir(root, &request).expect("publish").pointer
    }

    #[test]
    fn the_history_names_the_previous_bundle_for_a_rollback() {
        let dir = tempfile::tempdir().expect("dir");
        let key = signing_key_from_seed([3; 32]);
        let first = publish_one(dir.path(), &key, &bundle("one", None));
        assert!(matches!(
            block_on(previous_bundle(
                &at(dir.path()),
                "prod",
                &first.bundle.sha256
            )),
            Err(Error::NoHistory { .. })
        ));
        let second = publish_one(dir.path(), &key, &bundle("two", None));
        assert_eq!(
            block_on(previous_bundle(
                &at(dir.path()),
                "prod",
                &second.bundle.sha256
            ))
            .expect("previous"),
            first.bundle.sha256
        );
        let history =
            std::fs::read_to_string(dir.path().join(history_path("prod"))).expect("history");
        assert_eq!(history.lines().count(), 2, "{history}");
    }

    #[test]
    fn halt_and_resume_re_sign_the_same_serial_with_a_higher_control() {
        let dir = tempfile::tempdir().expect("dir");
        let key = signing_key_from_seed([3; 32]);
        let none = TrustedKeys::new();
        publish_one(dir.path(), &key, &bundle("one", None));
        assert!(matches!(
            block_on(set_halted(&at(dir.path()), "prod", &key, &none, true)),
            Err(Error::NoRollout { serial: 1, .. })
        ));
        let waves = Rollout {
            waves: vec![Wave::default()],
            ..Rollout::default()
        };
        let published = publish_one(dir.path(), &key, &bundle("two", Some(waves)));
        let halted =
            block_on(set_halted(&at(dir.path()), "prod", &key, &none, true)).expect("halt");
        assert_eq!(halted.serial, published.serial);
        assert_eq!(halted.bundle, published.bundle);
        assert_eq!(halted.issued_at, published.issued_at);
        let rollout = halted.rollout.expect("rollout");
        assert!(rollout.halted);
        assert_eq!(rollout.control, 1);
        assert!(matches!(
            block_on(set_halted(&at(dir.path()), "prod", &key, &none, true)),
            Err(Error::AlreadyInState { halted: true, .. })
        ));
        let resumed =
            block_on(set_halted(&at(dir.path()), "prod", &key, &none, false)).expect("resume");
        assert_eq!(
            resumed.rollout.map(|r| (r.halted, r.control)),
            Some((false, 2))
        );
        let other = signing_key_from_seed([4; 32]);
        assert!(matches!(
            block_on(set_halted(&at(dir.path()), "prod", &other, &none, true)),
            Err(Error::CurrentPointerUnverifiable { .. })
        ));
    }
}
