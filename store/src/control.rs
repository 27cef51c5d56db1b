//! Changes to a channel's rollout that are not a new release: a signed halt or resume of the current serial
//! ([`set_halted`]: the same serial and bundle, the rollout's `halted` flipped and its `control` counter
//! raised so that agents never go back to an older control), and the channel's history
//! (`channels/<channel>.history`, one line per published serial: `serial sha256`), which
//! [`previous_bundle`] reads for `windvane rollback`. Both run under the store's lock, like publishing.

use std::fs::{self, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::Path;

use ed25519_dalek::SigningKey;
use windvane_shared::keys::TrustedKeys;
use windvane_shared::release::{self, ReleasePointer};

use crate::{
    CHANNELS_DIR, Error, Result, channel_path, lock_store, read_capped_file, write_atomic,
};

/// The history file of a channel, relative to the store root.
pub fn history_path(channel: &str) -> String {
    format!("{CHANNELS_DIR}/{channel}.history")
}

/// Appends a published serial to the channel's history.
pub(crate) fn record(root: &Path, channel: &str, pointer: &ReleasePointer) -> Result<()> {
    let path = root.join(history_path(channel));
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| Error::io(&path, e))?;
    writeln!(file, "{} {}", pointer.serial, pointer.bundle.sha256)
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::io(&path, e))
}

/// The bundle digest published before the current one (the latest history entry with another digest than
/// `current`), or why there is none.
pub fn previous_bundle(root: &Path, channel: &str, current: &str) -> Result<String> {
    let path = root.join(history_path(channel));
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Err(Error::NoHistory {
                channel: channel.to_owned(),
            });
        }
        Err(e) => return Err(Error::io(&path, e)),
    };
    text.lines()
        .rev()
        .filter_map(|line| line.split_whitespace().nth(1))
        .find(|sha| *sha != current && windvane_shared::digest::is_sha256_hex(sha))
        .map(str::to_owned)
        .ok_or(Error::NoHistory {
            channel: channel.to_owned(),
        })
}

/// Re-signs the channel's current pointer with its rollout halted (or resumed): same serial, bundle and
/// issue time, `control` one higher. Refused when the release has no rollout (every cluster took it at once)
/// or is already in that state.
pub fn set_halted(
    root: &Path,
    channel: &str,
    key: &SigningKey,
    also_trusted: &TrustedKeys,
    halted: bool,
) -> Result<ReleasePointer> {
    crate::check_channel_name(channel)?;
    let _lock = lock_store(root)?;
    let path = root.join(channel_path(channel));
    let mut pointer = read_current(&path, key, also_trusted)?;
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
    write_atomic(&path, &pointer.sign(key).to_json_bytes())?;
    Ok(pointer)
}

fn read_current(
    path: &Path,
    key: &SigningKey,
    also_trusted: &TrustedKeys,
) -> Result<ReleasePointer> {
    let bytes = match read_capped_file(path, release::DEFAULT_MAX_POINTER_BYTES, "channel pointer")
    {
        Err(Error::Io { source, .. }) if source.kind() == ErrorKind::NotFound => {
            return Err(Error::NoSuchChannel {
                location: path.display().to_string(),
                channel: String::new(),
            });
        }
        other => other?,
    };
    let mut trusted = also_trusted.clone();
    let unverifiable = |source| Error::CurrentPointerUnverifiable {
        path: path.to_path_buf(),
        source,
    };
    trusted.insert(key.verifying_key()).map_err(unverifiable)?;
    Ok(
        release::verify_signed_pointer(&bytes, &trusted, release::DEFAULT_MAX_POINTER_BYTES)
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

    use super::*;
    use crate::{PublishRequest, publish};

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
        publish(root, &request).expect("publish").pointer
    }

    #[test]
    fn the_history_names_the_previous_bundle_for_a_rollback() {
        let dir = tempfile::tempdir().expect("dir");
        let key = signing_key_from_seed([3; 32]);
        let first = publish_one(dir.path(), &key, &bundle("one", None));
        assert!(matches!(
            previous_bundle(dir.path(), "prod", &first.bundle.sha256),
            Err(Error::NoHistory { .. })
        ));
        let second = publish_one(dir.path(), &key, &bundle("two", None));
        assert_eq!(
            previous_bundle(dir.path(), "prod", &second.bundle.sha256).expect("previous"),
            first.bundle.sha256
        );
        let history = fs::read_to_string(dir.path().join(history_path("prod"))).expect("history");
        assert_eq!(history.lines().count(), 2, "{history}");
    }

    #[test]
    fn halt_and_resume_re_sign_the_same_serial_with_a_higher_control() {
        let dir = tempfile::tempdir().expect("dir");
        let key = signing_key_from_seed([3; 32]);
        let none = TrustedKeys::new();
        publish_one(dir.path(), &key, &bundle("one", None));
        assert!(matches!(
            set_halted(dir.path(), "prod", &key, &none, true),
            Err(Error::NoRollout { serial: 1, .. })
        ));
        let waves = Rollout {
            waves: vec![Wave::default()],
            ..Rollout::default()
        };
        let published = publish_one(dir.path(), &key, &bundle("two", Some(waves)));
        let halted = set_halted(dir.path(), "prod", &key, &none, true).expect("halt");
        assert_eq!(halted.serial, published.serial);
        assert_eq!(halted.bundle, published.bundle);
        assert_eq!(halted.issued_at, published.issued_at);
        let rollout = halted.rollout.expect("rollout");
        assert!(rollout.halted);
        assert_eq!(rollout.control, 1);
        assert!(matches!(
            set_halted(dir.path(), "prod", &key, &none, true),
            Err(Error::AlreadyInState { halted: true, .. })
        ));
        let resumed = set_halted(dir.path(), "prod", &key, &none, false).expect("resume");
        assert_eq!(
            resumed.rollout.map(|r| (r.halted, r.control)),
            Some((false, 2))
        );
        let other = signing_key_from_seed([4; 32]);
        assert!(matches!(
            set_halted(dir.path(), "prod", &other, &none, true),
            Err(Error::CurrentPointerUnverifiable { .. })
        ));
    }
}
