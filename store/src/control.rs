//! Changes to a channel's rollout that are not a new release: a signed halt or resume of the current serial
//! ([`set_halted`]: the same serial and bundle, the rollout's `halted` flipped and its `control` counter
//! raised so that agents never go back to an older control). The pointer re-signed is first checked to be
//! the channel's own, current and not older than its signed history ([`history::read_current`]).
//! In a directory it runs under the store's lock, like publishing; in a bucket it is a conditional write on
//! the pointer as read.

use ed25519_dalek::SigningKey;
use jiff::Timestamp;
use windvane_shared::crypto::keys::TrustedKeys;
use windvane_shared::format::release::{self, ReleasePointer};

use crate::{Error, Put, Result, Store, channel_path, history};

/// Re-signs the channel's current pointer with its rollout halted (or resumed): same serial, bundle and
/// issue time, `control` one higher. Refused when the release has no rollout (every cluster took it at once)
/// or is already in that state.
pub async fn set_halted(
    store: &Store,
    channel: &str,
    fleet: Option<&str>,
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
    let trusted = crate::with_key(store, channel, key, also_trusted)?;
    let asked = history::Asked {
        channel,
        fleet,
        now: Timestamp::now(),
        expired_ok: false,
    };
    let mut pointer = history::read_current(store, &current.bytes, &trusted, &asked).await?;
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use jiff::Timestamp;
    use windvane_shared::crypto::keys::signing_key_from_seed;
    use windvane_shared::format::bundle::{App, BUNDLE_API_VERSION, Bundle};
    use windvane_shared::spec::rollout::{Rollout, Wave};

    use std::path::Path;

    use futures::executor::block_on;

    use super::*;
    use crate::{PublishRequest, publish_dir};

    fn at(dir: &Path) -> Store {
        Store::Dir(dir.to_path_buf())
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
    fn each_published_serial_is_kept_signed_and_a_replayed_pointer_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let key = signing_key_from_seed([3; 32]);
        let trusted =
            crate::with_key(&at(dir.path()), "prod", &key, &TrustedKeys::new()).expect("keys");
        let first = publish_one(dir.path(), &key, &bundle("one", None));
        let first_bytes =
            std::fs::read(dir.path().join(channel_path("prod"))).expect("first pointer");
        let second = publish_one(dir.path(), &key, &bundle("two", None));
        for pointer in [&first, &second] {
            let entry = block_on(history::read_entry(
                &at(dir.path()),
                "prod",
                pointer.serial,
                &trusted,
            ))
            .expect("entry")
            .expect("recorded");
            assert_eq!(&entry, pointer);
        }
        // A store writer puts serial 1's (validly signed) pointer back: halting it would re-sign the past.
        std::fs::write(dir.path().join(channel_path("prod")), &first_bytes).expect("replay");
        let error = block_on(set_halted(
            &at(dir.path()),
            "prod",
            None,
            &key,
            &TrustedKeys::new(),
            true,
        ))
        .expect_err("replayed");
        assert!(
            error.to_string().contains("already has serial 2"),
            "{error}"
        );
        // An edited entry is not taken for history.
        std::fs::write(dir.path().join(history::entry_path("prod", 2)), b"{}").expect("tamper");
        assert!(matches!(
            block_on(history::read_entry(&at(dir.path()), "prod", 2, &trusted)),
            Err(Error::HistoryEntry { .. })
        ));
    }

    #[test]
    fn halt_and_resume_re_sign_the_same_serial_with_a_higher_control() {
        let dir = tempfile::tempdir().expect("dir");
        let key = signing_key_from_seed([3; 32]);
        let none = TrustedKeys::new();
        publish_one(dir.path(), &key, &bundle("one", None));
        assert!(matches!(
            block_on(set_halted(&at(dir.path()), "prod", None, &key, &none, true)),
            Err(Error::NoRollout { serial: 1, .. })
        ));
        let waves = Rollout {
            waves: vec![Wave::default()],
            ..Rollout::default()
        };
        let published = publish_one(dir.path(), &key, &bundle("two", Some(waves)));
        let halted =
            block_on(set_halted(&at(dir.path()), "prod", None, &key, &none, true)).expect("halt");
        assert_eq!(halted.serial, published.serial);
        assert_eq!(halted.bundle, published.bundle);
        assert_eq!(halted.issued_at, published.issued_at);
        let rollout = halted.rollout.expect("rollout");
        assert!(rollout.halted);
        assert_eq!(rollout.control, 1);
        assert!(matches!(
            block_on(set_halted(&at(dir.path()), "prod", None, &key, &none, true)),
            Err(Error::AlreadyInState { halted: true, .. })
        ));
        let resumed = block_on(set_halted(
            &at(dir.path()),
            "prod",
            None,
            &key,
            &none,
            false,
        ))
        .expect("resume");
        assert_eq!(
            resumed.rollout.map(|r| (r.halted, r.control)),
            Some((false, 2))
        );
        let other = signing_key_from_seed([4; 32]);
        assert!(matches!(
            block_on(set_halted(
                &at(dir.path()),
                "prod",
                None,
                &other,
                &none,
                true
            )),
            Err(Error::CurrentPointerUnverifiable { .. })
        ));
    }
}
