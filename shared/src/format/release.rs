//! The signed channel pointer and the checks that bind a bundle to it: the one place where an agent
//! (or `windvane verify`) decides whether bytes fetched from the untrusted store may be used.
//!
//! `windvane publish` writes a [`ReleasePointer`] (fleet, channel, serial, validity window, the
//! bundle's SHA-256 and size) signed into a DSSE envelope ([`ReleasePointer::sign`]) as
//! `channels/<ch>.json`, next to the bundle at `bundles/<sha256>.json`. The agent passes the
//! pointer bytes to [`verify_pointer`] with its own state ([`PointerExpectations`]: trusted keys,
//! fleet, channel, highest serial accepted, clock), then the bundle bytes to [`verify_bundle`];
//! only a bundle that passes both becomes its new last known good. Every refusal is one [`Error`]
//! variant whose [`Error::reason`] the agent reports.

use std::time::Duration;

use ed25519_dalek::SigningKey;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::crypto::digest::{is_sha256_hex, sha256_hex};
use crate::crypto::dsse::{self, Envelope};
use crate::crypto::keys::TrustedKeys;
use crate::format::bundle::{Bundle, BundleLimits};
use crate::{Error, Result};

/// The DSSE payload type of a release pointer.
pub const RELEASE_PAYLOAD_TYPE: &str = "application/vnd.windvane.release.v1+json";
/// Default cap on a channel pointer's size: nothing larger is parsed.
pub const DEFAULT_MAX_POINTER_BYTES: u64 = 64 * 1024;
/// Default cap on a bundle's size.
pub const DEFAULT_MAX_BUNDLE_BYTES: u64 = 64 * 1024 * 1024;
/// Default allowance for a publisher's clock running ahead of the agent's.
pub const DEFAULT_MAX_FUTURE_SKEW: Duration = Duration::from_secs(5 * 60);

/// What a channel pointer says, signed by a release key: which bundle is the current release of one
/// channel of one fleet, in which order (serial) and for how long.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReleasePointer {
    /// The fleet this release is for; an agent of another fleet refuses it.
    pub fleet: String,
    /// The channel this release is for; an agent following another channel refuses it.
    pub channel: String,
    /// Strictly increasing per channel; an agent never goes below the highest it has accepted.
    pub serial: u64,
    /// When the publisher signed it.
    pub issued_at: Timestamp,
    /// After this the pointer is refused, so a store that stops serving new releases is noticed.
    pub expires_at: Timestamp,
    /// The bundle this release is.
    pub bundle: BundleRef,
    /// Whether a bundle with no objects may prune everything (guard against publishing an empty
    /// tree).
    pub allow_empty: bool,
    /// The rollout plan (waves, halt), from the bundle's `rollout:`; absent: every cluster at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<crate::spec::rollout::Rollout>,
}

/// The bundle a pointer binds: its digest (which is also its file name) and exact size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BundleRef {
    /// Lower-case hex SHA-256 of the bundle bytes.
    pub sha256: String,
    /// Length of the bundle in bytes.
    pub size: u64,
}

impl ReleasePointer {
    /// Signs this pointer with `key`: its JSON as the payload of a DSSE envelope of
    /// [`RELEASE_PAYLOAD_TYPE`].
    pub fn sign(&self, key: &SigningKey) -> Envelope {
        let payload = serde_json::to_vec(self).expect("a release pointer is always serializable");
        dsse::sign(RELEASE_PAYLOAD_TYPE, &payload, key)
    }
}

/// What the verifier compares a pointer against: the agent's (or publisher's) own configuration and
/// state.
#[derive(Debug, Clone, Copy)]
pub struct PointerExpectations<'a> {
    /// The release keys to trust.
    pub trusted: &'a TrustedKeys,
    /// The fleet this agent belongs to.
    pub fleet: &'a str,
    /// The channel this agent follows.
    pub channel: &'a str,
    /// The highest serial accepted so far, with the bundle sha256 accepted at that serial.
    pub highest_accepted: Option<(u64, &'a str)>,
    /// The verifier's clock.
    pub now: Timestamp,
    /// How far ahead of `now` an `issued_at` may be.
    pub max_future_skew: Duration,
    /// Pointer bodies larger than this are refused unread.
    pub max_pointer_bytes: u64,
}

impl<'a> PointerExpectations<'a> {
    /// Expectations with no serial accepted yet, [`DEFAULT_MAX_FUTURE_SKEW`] and
    /// [`DEFAULT_MAX_POINTER_BYTES`].
    pub fn new(trusted: &'a TrustedKeys, fleet: &'a str, channel: &'a str, now: Timestamp) -> Self {
        Self {
            trusted,
            fleet,
            channel,
            highest_accepted: None,
            now,
            max_future_skew: DEFAULT_MAX_FUTURE_SKEW,
            max_pointer_bytes: DEFAULT_MAX_POINTER_BYTES,
        }
    }
}

/// A pointer that passed [`verify_pointer`], with the key id of the key that signed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptedRelease {
    /// The verified pointer.
    pub pointer: ReleasePointer,
    /// Key id of the trusted key whose signature verified.
    pub keyid: String,
}

fn malformed_pointer(detail: impl Into<String>) -> Error {
    Error::Malformed {
        what: "release pointer",
        detail: detail.into(),
    }
}

fn len_u64(bytes: &[u8]) -> u64 {
    u64::try_from(bytes.len()).unwrap_or(u64::MAX)
}

/// Verifies channel pointer bytes. In order: size cap on the raw bytes ([`Error::SizeCap`], before
/// anything is parsed); envelope ([`Error::Malformed`]); payload type; signature
/// ([`Error::UnknownKey`], [`Error::BadSignature`]); only then the payload ([`Error::Malformed`]:
/// not a pointer, sha256 not 64 lower-case hex digits, `issued_at` not before `expires_at`); fleet
/// ([`Error::OtherFleet`]); channel ([`Error::OtherChannel`]); serial below the highest accepted
/// ([`Error::Rollback`]); same serial with another digest ([`Error::Equivocation`]); expiry at or
/// before `now` ([`Error::Expired`]); `issued_at` beyond `now + max_future_skew`
/// ([`Error::IssuedInFuture`]).
///
/// The same serial with the same digest is accepted again (an agent re-polling an unchanged
/// channel).
pub fn verify_pointer(
    envelope_bytes: &[u8],
    expect: &PointerExpectations,
) -> Result<AcceptedRelease> {
    let AcceptedRelease { pointer, keyid } =
        verify_signed_pointer(envelope_bytes, expect.trusted, expect.max_pointer_bytes)?;
    check_fleet_and_channel(&pointer, expect.fleet, expect.channel)?;
    if let Some((highest, accepted)) = expect.highest_accepted {
        if pointer.serial < highest {
            return Err(Error::Rollback {
                highest,
                offered: pointer.serial,
            });
        }
        if pointer.serial == highest && pointer.bundle.sha256 != accepted {
            return Err(Error::Equivocation {
                serial: highest,
                accepted: accepted.to_owned(),
                offered: pointer.bundle.sha256,
            });
        }
    }
    if pointer.expires_at <= expect.now {
        return Err(Error::Expired {
            expires_at: pointer.expires_at.to_string(),
        });
    }
    // A skew so large that `now + skew` leaves jiff's range allows any issued_at.
    if let Ok(latest) = expect.now.checked_add(expect.max_future_skew)
        && pointer.issued_at > latest
    {
        return Err(Error::IssuedInFuture {
            issued_at: pointer.issued_at.to_string(),
            now: expect.now.to_string(),
        });
    }
    Ok(AcceptedRelease { pointer, keyid })
}

/// The checks that need no state: size cap, envelope, payload type, signature by a trusted key, and a
/// well-formed payload. Used by [`verify_pointer`], by [`verify_known_good`], and by a publisher reading the
/// current pointer (which may have expired: publishing renews it).
pub fn verify_signed_pointer(
    envelope_bytes: &[u8],
    trusted: &TrustedKeys,
    max_pointer_bytes: u64,
) -> Result<AcceptedRelease> {
    if len_u64(envelope_bytes) > max_pointer_bytes {
        return Err(Error::SizeCap {
            what: "release pointer",
            limit: max_pointer_bytes,
        });
    }
    let envelope = Envelope::from_json_slice(envelope_bytes)?;
    let (payload, keyid) = dsse::verify(&envelope, RELEASE_PAYLOAD_TYPE, trusted)?;

    // Authenticated from here on; still checked, since a release key can sign a mistake.
    let pointer: ReleasePointer =
        serde_json::from_slice(&payload).map_err(|e| malformed_pointer(e.to_string()))?;
    if !is_sha256_hex(&pointer.bundle.sha256) {
        return Err(malformed_pointer(format!(
            "bundle.sha256 {:?} is not 64 lower-case hex digits",
            pointer.bundle.sha256
        )));
    }
    if pointer.issued_at >= pointer.expires_at {
        return Err(malformed_pointer(format!(
            "issuedAt {} is not before expiresAt {}",
            pointer.issued_at, pointer.expires_at
        )));
    }

    Ok(AcceptedRelease { pointer, keyid })
}

fn check_fleet_and_channel(pointer: &ReleasePointer, fleet: &str, channel: &str) -> Result<()> {
    if pointer.fleet != fleet {
        return Err(Error::OtherFleet {
            expected: fleet.to_owned(),
            found: pointer.fleet.clone(),
        });
    }
    if pointer.channel != channel {
        return Err(Error::OtherChannel {
            expected: channel.to_owned(),
            found: pointer.channel.clone(),
        });
    }
    Ok(())
}

/// Re-verifies a release the agent accepted before (its last known good, read back from the cluster):
/// signature, fleet and channel. Neither serial nor time is checked: an expired release stays enforced
/// until a newer one is accepted, because self-healing must never stop.
pub fn verify_known_good(
    envelope_bytes: &[u8],
    trusted: &TrustedKeys,
    fleet: &str,
    channel: &str,
) -> Result<AcceptedRelease> {
    let accepted = verify_signed_pointer(envelope_bytes, trusted, DEFAULT_MAX_POINTER_BYTES)?;
    check_fleet_and_channel(&accepted.pointer, fleet, channel)?;
    Ok(accepted)
}

/// Verifies bundle bytes against a pointer that [`verify_pointer`] accepted. In order: size cap
/// ([`Error::SizeCap`], also when the pointer itself names a size above the cap); size equals
/// `pointer.bundle.size` ([`Error::SizeMismatch`]); SHA-256 equals `pointer.bundle.sha256`
/// ([`Error::DigestMismatch`]); only then is the bundle parsed and validated
/// ([`Bundle::from_json_slice`]) and its fleet compared with the pointer's ([`Error::OtherFleet`]).
///
/// A bundle without objects is not refused here, whatever `allow_empty` says: the agent's prune
/// decision reads `allow_empty`.
pub fn verify_bundle(
    bytes: &[u8],
    pointer: &ReleasePointer,
    max_bundle_bytes: u64,
    limits: BundleLimits,
) -> Result<Bundle> {
    let size = len_u64(bytes);
    if size > max_bundle_bytes || pointer.bundle.size > max_bundle_bytes {
        return Err(Error::SizeCap {
            what: "bundle",
            limit: max_bundle_bytes,
        });
    }
    if size != pointer.bundle.size {
        return Err(Error::SizeMismatch {
            expected: pointer.bundle.size,
            found: size,
        });
    }
    let digest = sha256_hex(bytes);
    if digest != pointer.bundle.sha256 {
        return Err(Error::DigestMismatch {
            expected: pointer.bundle.sha256.clone(),
            found: digest,
        });
    }
    let bundle = Bundle::from_json_slice(bytes, limits)?;
    if bundle.fleet != pointer.fleet {
        return Err(Error::OtherFleet {
            expected: pointer.fleet.clone(),
            found: bundle.fleet,
        });
    }
    Ok(bundle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::keys::{keyid, signing_key_from_seed};
    use crate::format::bundle::BUNDLE_API_VERSION;
    use serde_json::json;

    const FLEET: &str = "prod";
    const CHANNEL: &str = "stable";

    fn key(n: u8) -> SigningKey {
        signing_key_from_seed([n; 32])
    }

    fn trusting(keys: &[&SigningKey]) -> TrustedKeys {
        let mut trusted = TrustedKeys::new();
        for key in keys {
            trusted.insert(key.verifying_key()).expect("strong key");
        }
        trusted
    }

    fn now() -> Timestamp {
        "2026-05-01T12:00:00Z".parse().expect("timestamp")
    }

    fn minutes(n: i64) -> jiff::SignedDuration {
        jiff::SignedDuration::from_mins(n)
    }

    fn bundle_bytes(fleet: &str) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": BUNDLE_API_VERSION,
            "fleet": fleet,
            "apps": [{
                "name": "web",
                "manifests": [{
                    "file": "apps/web/config.yaml",
                    "document": 0,
                    "object": {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "metadata": {"name": "web", "namespace": "web"},
                        "data": {"greeting": "hello"},
                    },
                }],
            }],
        }))
        .expect("json")
    }

    fn pointer_for(bytes: &[u8], serial: u64) -> ReleasePointer {
        ReleasePointer {
            fleet: FLEET.to_owned(),
            channel: CHANNEL.to_owned(),
            serial,
            issued_at: now() - minutes(1),
            expires_at: now() + minutes(7 * 24 * 60),
            bundle: BundleRef {
                sha256: sha256_hex(bytes),
                size: len_u64(bytes),
            },
            allow_empty: false,
            rollout: None,
        }
    }

    fn pointer(serial: u64) -> ReleasePointer {
        pointer_for(&bundle_bytes(FLEET), serial)
    }

    fn signed(pointer: &ReleasePointer, key: &SigningKey) -> Vec<u8> {
        pointer.sign(key).to_json_bytes()
    }

    /// Verifies `bytes` as the agent of FLEET/CHANNEL trusting `trusted`, with `adjust` applied to
    /// the default expectations.
    fn check<'a>(
        bytes: &[u8],
        trusted: &'a TrustedKeys,
        adjust: impl FnOnce(&mut PointerExpectations<'a>),
    ) -> Result<AcceptedRelease> {
        let mut expect = PointerExpectations::new(trusted, FLEET, CHANNEL, now());
        adjust(&mut expect);
        verify_pointer(bytes, &expect)
    }

    fn refused(result: Result<AcceptedRelease>) -> Error {
        match result {
            Ok(accepted) => panic!("accepted {accepted:?}"),
            Err(err) => err,
        }
    }

    #[test]
    fn signed_pointer_is_accepted_with_its_keyid() {
        let sk = key(1);
        let accepted =
            check(&signed(&pointer(1), &sk), &trusting(&[&sk]), |_| {}).expect("accepted");
        assert_eq!(accepted.pointer, pointer(1));
        assert_eq!(accepted.keyid, keyid(&sk.verifying_key()));
    }

    #[test]
    fn pointer_json_is_camel_case() {
        let envelope = pointer(1).sign(&key(1));
        let payload = String::from_utf8(envelope.payload_bytes().expect("base64")).expect("utf-8");
        for field in [
            "\"issuedAt\":\"2026-05-01T11:59:00Z\"",
            "\"expiresAt\"",
            "\"allowEmpty\":false",
            "\"sha256\"",
        ] {
            assert!(payload.contains(field), "{field} in {payload}");
        }
        assert_eq!(envelope.payload_type, RELEASE_PAYLOAD_TYPE);
    }

    #[test]
    fn key_rotation_either_trusted_key_may_sign() {
        let (old, new) = (key(2), key(3));
        let trusted = trusting(&[&old, &new]);
        let by_old = check(&signed(&pointer(1), &old), &trusted, |_| {}).expect("old key");
        assert_eq!(by_old.keyid, keyid(&old.verifying_key()));
        let by_new = check(&signed(&pointer(2), &new), &trusted, |_| {}).expect("new key");
        assert_eq!(by_new.keyid, keyid(&new.verifying_key()));
        // After the old key is dropped, its signatures are refused.
        let err = refused(check(
            &signed(&pointer(3), &old),
            &trusting(&[&new]),
            |_| {},
        ));
        assert!(matches!(err, Error::UnknownKey { .. }), "{err:?}");
    }

    #[test]
    fn refuses_pointer_over_size_cap_before_parsing() {
        let sk = key(1);
        let bytes = signed(&pointer(1), &sk);
        let cap = len_u64(&bytes) - 1;
        let err = refused(check(&bytes, &trusting(&[&sk]), |e| {
            e.max_pointer_bytes = cap
        }));
        assert!(
            matches!(err, Error::SizeCap { what: "release pointer", limit } if limit == cap),
            "{err:?}"
        );
        assert_eq!(err.reason(), "size_cap");
        // Garbage over the cap is a size refusal, not a parse error: nothing was parsed.
        let garbage = vec![b'x'; 65 * 1024];
        let err = refused(check(&garbage, &trusting(&[&sk]), |_| {}));
        assert!(
            matches!(
                err,
                Error::SizeCap {
                    limit: DEFAULT_MAX_POINTER_BYTES,
                    ..
                }
            ),
            "{err:?}"
        );
        // Exactly at the cap is fine.
        check(&bytes, &trusting(&[&sk]), |e| e.max_pointer_bytes = cap + 1).expect("at the cap");
    }

    #[test]
    fn refuses_malformed_envelope() {
        let sk = key(1);
        let err = refused(check(b"{\"payload\": 42}", &trusting(&[&sk]), |_| {}));
        assert!(
            matches!(
                err,
                Error::Malformed {
                    what: "envelope",
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.reason(), "malformed");
    }

    #[test]
    fn refuses_malformed_payload_after_checking_its_signature() {
        let sk = key(1);
        let trusted = trusting(&[&sk]);
        let valid = serde_json::to_value(pointer(1)).expect("json");
        let with = |field: &str, value: serde_json::Value| {
            let mut changed = valid.clone();
            changed[field] = value;
            serde_json::to_vec(&changed).expect("json")
        };
        let bad_payloads = [
            b"not json".to_vec(),
            b"{\"fleet\":\"prod\"}".to_vec(),
            // an unknown field in a signed pointer is refused, not ignored
            with("extra", json!(1)),
            // a timestamp that is not RFC 3339
            with("issuedAt", json!("yesterday")),
            // a negative serial
            with("serial", json!(-1)),
        ];
        for payload in &bad_payloads {
            let bytes = dsse::sign(RELEASE_PAYLOAD_TYPE, payload, &sk).to_json_bytes();
            let err = refused(check(&bytes, &trusted, |_| {}));
            assert!(
                matches!(
                    err,
                    Error::Malformed {
                        what: "release pointer",
                        ..
                    }
                ),
                "{err:?}"
            );
            assert_eq!(err.reason(), "malformed");
        }
        // The same garbage signed by an unknown key is refused for the key: the payload is never
        // parsed.
        let bytes = dsse::sign(RELEASE_PAYLOAD_TYPE, b"not json", &key(2)).to_json_bytes();
        assert!(matches!(
            refused(check(&bytes, &trusted, |_| {})),
            Error::UnknownKey { .. }
        ));
    }

    #[test]
    fn refuses_digest_that_is_not_lower_case_hex() {
        let sk = key(1);
        for digest in [
            sha256_hex(b"x").to_uppercase(),
            "abc".to_owned(),
            "../../etc/passwd".to_owned(),
        ] {
            let mut p = pointer(1);
            p.bundle.sha256 = digest;
            let err = refused(check(&signed(&p, &sk), &trusting(&[&sk]), |_| {}));
            assert!(
                matches!(
                    err,
                    Error::Malformed {
                        what: "release pointer",
                        ..
                    }
                ),
                "{err:?}"
            );
        }
    }

    #[test]
    fn refuses_issued_at_not_before_expires_at() {
        let sk = key(1);
        let mut p = pointer(1);
        p.expires_at = p.issued_at;
        let err = refused(check(&signed(&p, &sk), &trusting(&[&sk]), |_| {}));
        assert!(
            matches!(
                err,
                Error::Malformed {
                    what: "release pointer",
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn refuses_unknown_key() {
        let signer = key(4);
        let err = refused(check(
            &signed(&pointer(1), &signer),
            &trusting(&[&key(5)]),
            |_| {},
        ));
        let Error::UnknownKey { keyids } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(*keyids, [keyid(&signer.verifying_key())]);
        assert_eq!(err.reason(), "unknown_key");
    }

    #[test]
    fn refuses_when_nothing_is_trusted() {
        let err = refused(check(
            &signed(&pointer(1), &key(4)),
            &TrustedKeys::new(),
            |_| {},
        ));
        assert!(matches!(err, Error::UnknownKey { .. }), "{err:?}");
    }

    #[test]
    fn refuses_bad_signature() {
        let sk = key(1);
        let mut envelope = pointer(1).sign(&sk);
        // Swap in another (validly signed, by someone else) pointer body under the trusted
        // signature.
        envelope.payload = pointer(9).sign(&key(2)).payload;
        let err = refused(check(&envelope.to_json_bytes(), &trusting(&[&sk]), |_| {}));
        assert!(
            matches!(&err, Error::BadSignature { keyid: k } if *k == keyid(&sk.verifying_key())),
            "{err:?}"
        );
        assert_eq!(err.reason(), "bad_signature");
    }

    #[test]
    fn refuses_wrong_payload_type() {
        let sk = key(1);
        let payload = serde_json::to_vec(&pointer(1)).expect("json");
        let bytes =
            dsse::sign("application/vnd.windvane.heartbeat.v1+json", &payload, &sk).to_json_bytes();
        let err = refused(check(&bytes, &trusting(&[&sk]), |_| {}));
        assert!(
            matches!(
                err,
                Error::WrongPayloadType {
                    expected: RELEASE_PAYLOAD_TYPE,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.reason(), "wrong_payload_type");
    }

    #[test]
    fn refuses_other_fleet() {
        let sk = key(1);
        let mut p = pointer(1);
        p.fleet = "staging".to_owned();
        let err = refused(check(&signed(&p, &sk), &trusting(&[&sk]), |_| {}));
        let Error::OtherFleet { expected, found } = &err else {
            panic!("{err:?}")
        };
        assert_eq!((expected.as_str(), found.as_str()), (FLEET, "staging"));
        assert_eq!(err.reason(), "other_fleet");
    }

    #[test]
    fn refuses_other_channel() {
        let sk = key(1);
        let mut p = pointer(1);
        p.channel = "canary".to_owned();
        let err = refused(check(&signed(&p, &sk), &trusting(&[&sk]), |_| {}));
        let Error::OtherChannel { expected, found } = &err else {
            panic!("{err:?}")
        };
        assert_eq!((expected.as_str(), found.as_str()), (CHANNEL, "canary"));
        assert_eq!(err.reason(), "other_channel");
    }

    #[test]
    fn refuses_rollback() {
        let sk = key(1);
        let accepted = sha256_hex(b"the bundle accepted at 5");
        let err = refused(check(&signed(&pointer(4), &sk), &trusting(&[&sk]), |e| {
            e.highest_accepted = Some((5, &accepted));
        }));
        assert!(
            matches!(
                err,
                Error::Rollback {
                    highest: 5,
                    offered: 4
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.reason(), "rollback");
        // Moving forward is fine.
        check(&signed(&pointer(6), &sk), &trusting(&[&sk]), |e| {
            e.highest_accepted = Some((5, &accepted))
        })
        .expect("forward");
    }

    #[test]
    fn refuses_equivocation() {
        let sk = key(1);
        let accepted = sha256_hex(b"the bundle accepted at 5");
        let p = pointer(5);
        let err = refused(check(&signed(&p, &sk), &trusting(&[&sk]), |e| {
            e.highest_accepted = Some((5, &accepted));
        }));
        match &err {
            Error::Equivocation {
                serial: 5,
                accepted: a,
                offered,
            } => {
                assert_eq!(*a, accepted);
                assert_eq!(*offered, p.bundle.sha256);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(err.reason(), "equivocation");
    }

    #[test]
    fn same_serial_same_digest_is_accepted_again() {
        let sk = key(1);
        let p = pointer(5);
        let accepted = p.bundle.sha256.clone();
        let again = check(&signed(&p, &sk), &trusting(&[&sk]), |e| {
            e.highest_accepted = Some((5, &accepted))
        })
        .expect("idempotent re-poll");
        assert_eq!(again.pointer, p);
    }

    #[test]
    fn refuses_expired() {
        let sk = key(1);
        let mut p = pointer(1);
        p.issued_at = now() - minutes(120);
        p.expires_at = now(); // expiry is exclusive: at `now` it is already expired
        let err = refused(check(&signed(&p, &sk), &trusting(&[&sk]), |_| {}));
        assert!(
            matches!(&err, Error::Expired { expires_at } if *expires_at == now().to_string()),
            "{err:?}"
        );
        assert_eq!(err.reason(), "expired");
        p.expires_at = now() + minutes(1);
        check(&signed(&p, &sk), &trusting(&[&sk]), |_| {}).expect("not yet expired");
    }

    #[test]
    fn refuses_issued_in_the_future() {
        let sk = key(1);
        let mut p = pointer(1);
        p.issued_at = now() + minutes(6);
        let err = refused(check(&signed(&p, &sk), &trusting(&[&sk]), |_| {}));
        assert!(matches!(err, Error::IssuedInFuture { .. }), "{err:?}");
        assert_eq!(err.reason(), "issued_in_future");
        // Within the default 5 minute skew is fine; a tighter skew refuses it.
        p.issued_at = now() + minutes(4);
        check(&signed(&p, &sk), &trusting(&[&sk]), |_| {}).expect("within skew");
        let err = refused(check(&signed(&p, &sk), &trusting(&[&sk]), |e| {
            e.max_future_skew = Duration::ZERO
        }));
        assert!(matches!(err, Error::IssuedInFuture { .. }), "{err:?}");
    }

    #[test]
    fn checks_run_in_the_documented_order() {
        let sk = key(1);
        let accepted = sha256_hex(b"other");
        // Everything is wrong at once: other fleet, other channel, rollback, expired.
        let mut p = pointer(1);
        p.fleet = "staging".to_owned();
        p.channel = "canary".to_owned();
        p.issued_at = now() - minutes(120);
        p.expires_at = now() - minutes(60);
        let bytes = signed(&p, &sk);
        let trusted = trusting(&[&sk]);
        let state = Some((5, accepted.as_str()));
        assert!(matches!(
            refused(check(&bytes, &trusted, |e| e.highest_accepted = state)),
            Error::OtherFleet { .. }
        ));
        p.fleet = FLEET.to_owned();
        let bytes = signed(&p, &sk);
        assert!(matches!(
            refused(check(&bytes, &trusted, |e| e.highest_accepted = state)),
            Error::OtherChannel { .. }
        ));
        p.channel = CHANNEL.to_owned();
        let bytes = signed(&p, &sk);
        assert!(matches!(
            refused(check(&bytes, &trusted, |e| e.highest_accepted = state)),
            Error::Rollback { .. }
        ));
        assert!(matches!(
            refused(check(&bytes, &trusted, |_| {})),
            Error::Expired { .. }
        ));
    }

    fn accept_bundle(bytes: &[u8], pointer: &ReleasePointer) -> Result<Bundle> {
        verify_bundle(
            bytes,
            pointer,
            DEFAULT_MAX_BUNDLE_BYTES,
            BundleLimits::default(),
        )
    }

    #[test]
    fn bundle_bound_by_the_pointer_is_accepted() {
        let bytes = bundle_bytes(FLEET);
        let bundle = accept_bundle(&bytes, &pointer_for(&bytes, 1)).expect("accepted");
        assert_eq!(bundle.fleet, FLEET);
        assert_eq!(bundle.apps.len(), 1);
    }

    #[test]
    fn empty_bundle_is_not_refused_here() {
        let bytes = serde_json::to_vec(
            &json!({"apiVersion": BUNDLE_API_VERSION, "fleet": FLEET, "apps": []}),
        )
        .expect("json");
        let p = pointer_for(&bytes, 1);
        assert!(!p.allow_empty);
        assert!(
            accept_bundle(&bytes, &p)
                .expect("empty bundle")
                .apps
                .is_empty()
        );
    }

    #[test]
    fn refuses_bundle_over_size_cap() {
        let bytes = bundle_bytes(FLEET);
        let p = pointer_for(&bytes, 1);
        let cap = len_u64(&bytes) - 1;
        let err = verify_bundle(&bytes, &p, cap, BundleLimits::default()).expect_err("over cap");
        assert!(
            matches!(err, Error::SizeCap { what: "bundle", limit } if limit == cap),
            "{err:?}"
        );
        assert_eq!(err.reason(), "size_cap");
        // A pointer that names a size over the cap is refused whatever bytes arrive (the agent
        // reads no more than the cap, so it may hold a truncated prefix).
        let err = verify_bundle(&bytes[..10], &p, cap, BundleLimits::default())
            .expect_err("named over cap");
        assert!(
            matches!(err, Error::SizeCap { what: "bundle", .. }),
            "{err:?}"
        );
    }

    #[test]
    fn refuses_bundle_size_mismatch() {
        let bytes = bundle_bytes(FLEET);
        let mut p = pointer_for(&bytes, 1);
        p.bundle.size += 1;
        let err = accept_bundle(&bytes, &p).expect_err("size mismatch");
        let Error::SizeMismatch { expected, found } = &err else {
            panic!("{err:?}")
        };
        assert_eq!((*expected, *found), (len_u64(&bytes) + 1, len_u64(&bytes)));
        assert_eq!(err.reason(), "size_mismatch");
    }

    #[test]
    fn refuses_bundle_digest_mismatch() {
        let bytes = bundle_bytes(FLEET);
        let p = pointer_for(&bytes, 1);
        let mut tampered = bytes.clone();
        let at = tampered
            .iter()
            .position(|&b| b == b'h')
            .expect("an h in hello");
        tampered[at] = b'j';
        let err = accept_bundle(&tampered, &p).expect_err("digest mismatch");
        match &err {
            Error::DigestMismatch { expected, found } => {
                assert_eq!(*expected, p.bundle.sha256);
                assert_eq!(*found, sha256_hex(&tampered));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(err.reason(), "digest_mismatch");
    }

    #[test]
    fn refuses_bundle_of_other_fleet() {
        let bytes = bundle_bytes("staging");
        let p = pointer_for(&bytes, 1);
        let err = accept_bundle(&bytes, &p).expect_err("other fleet");
        let Error::OtherFleet { expected, found } = &err else {
            panic!("{err:?}")
        };
        assert_eq!((expected.as_str(), found.as_str()), (FLEET, "staging"));
        assert_eq!(err.reason(), "other_fleet");
    }

    #[test]
    fn refuses_malformed_bundle_with_matching_digest() {
        let bytes = b"{\"not\":\"a bundle\"}".to_vec();
        let err = accept_bundle(&bytes, &pointer_for(&bytes, 1)).expect_err("malformed");
        assert!(
            matches!(err, Error::Malformed { what: "bundle", .. }),
            "{err:?}"
        );
        assert_eq!(err.reason(), "malformed");
    }
}
