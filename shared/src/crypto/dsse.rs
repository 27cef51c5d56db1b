//! DSSE envelopes (<https://github.com/secure-systems-lab/dsse>, protocol v1): how a signed payload
//! travels through the untrusted store. `windvane publish` signs a release pointer into an
//! [`Envelope`] with [`sign`] and writes its JSON to `channels/<ch>.json`; an agent reads those
//! bytes back with [`Envelope::from_json_slice`] and checks them with [`verify`] against its
//! [`TrustedKeys`] before it looks at the payload at all.
//!
//! Signatures are Ed25519 over the pre-authentication encoding ([`pae`]) of the payload type and
//! the payload, checked with `verify_strict` (no small-order keys or `R`, no malleable `S`). The
//! key id in a signature is only a hint for finding the key: nothing is trusted until the signature
//! verifies with the trusted key of that id.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::{Signer as _, SigningKey};
use serde::{Deserialize, Serialize};

use crate::crypto::keys::{TrustedKeys, keyid};
use crate::{Error, Result};

/// A DSSE envelope as it is stored: the payload and its signatures, in JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// The payload, standard base64 (with padding).
    pub payload: String,
    /// What the payload is; part of what is signed, so a signature for one type never passes for
    /// another.
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    /// One or more signatures over `PAE(payloadType, payload)`.
    pub signatures: Vec<Signature>,
}

/// One signature of an envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signature {
    /// Which key signed ([`crate::crypto::keys::keyid`]): a hint for finding the key, not a proof of
    /// anything.
    pub keyid: String,
    /// The 64-byte Ed25519 signature, standard base64.
    pub sig: String,
}

/// The DSSE v1 pre-authentication encoding: `"DSSEv1" SP LEN(type) SP type SP LEN(body) SP body`,
/// lengths in ASCII decimal. This, not the payload alone, is what is signed.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let type_len = payload_type.len().to_string();
    let body_len = payload.len().to_string();
    let mut out = Vec::with_capacity(
        10 + type_len.len() + payload_type.len() + body_len.len() + payload.len(),
    );
    out.extend_from_slice(b"DSSEv1 ");
    out.extend_from_slice(type_len.as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload_type.as_bytes());
    out.push(b' ');
    out.extend_from_slice(body_len.as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload);
    out
}

/// Signs `payload` as `payload_type` with `key`: an envelope with one signature, whose key id is
/// the key's.
pub fn sign(payload_type: &str, payload: &[u8], key: &SigningKey) -> Envelope {
    let signature = key.sign(&pae(payload_type, payload));
    Envelope {
        payload: BASE64.encode(payload),
        payload_type: payload_type.to_owned(),
        signatures: vec![Signature {
            keyid: keyid(&key.verifying_key()),
            sig: BASE64.encode(signature.to_bytes()),
        }],
    }
}

fn malformed(detail: impl Into<String>) -> Error {
    Error::Malformed {
        what: "envelope",
        detail: detail.into(),
    }
}

impl Envelope {
    /// Parses envelope JSON. Unknown fields are ignored (DSSE allows extensions); missing fields,
    /// fields of the wrong type and an empty signature list are [`Error::Malformed`]. Nothing is
    /// decoded or trusted yet.
    pub fn from_json_slice(bytes: &[u8]) -> Result<Envelope> {
        let envelope: Envelope =
            serde_json::from_slice(bytes).map_err(|e| malformed(e.to_string()))?;
        if envelope.signatures.is_empty() {
            return Err(malformed("no signatures"));
        }
        Ok(envelope)
    }

    /// Compact JSON with a fixed field order and no trailing newline: the same envelope always
    /// gives the same bytes, and no byte of them is insignificant whitespace.
    pub fn to_json_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an envelope is always serializable")
    }

    /// The payload, base64-decoded. Unverified: use [`verify`] to get a payload that can be
    /// trusted.
    pub fn payload_bytes(&self) -> Result<Vec<u8>> {
        BASE64
            .decode(&self.payload)
            .map_err(|e| malformed(format!("payload is not standard base64: {e}")))
    }
}

/// Verifies the envelope against the trusted set: the payload type must equal
/// `expected_payload_type` ([`Error::WrongPayloadType`]), and some signature whose key id is
/// trusted must verify (`verify_strict`) over the PAE with the trusted key of that id. Returns the
/// payload and the key id that signed it.
///
/// No signature with a trusted key id is [`Error::UnknownKey`] (listing the key ids offered);
/// trusted key ids present but none verifying is [`Error::BadSignature`] (naming the first such key
/// id).
pub fn verify(
    envelope: &Envelope,
    expected_payload_type: &'static str,
    trusted: &TrustedKeys,
) -> Result<(Vec<u8>, String)> {
    signed_parts(envelope, expected_payload_type, trusted)?.decide(|candidate, message| {
        candidate
            .signature
            .is_some_and(|sig| candidate.key.verify_strict(message, &sig).is_ok())
    })
}

/// [`verify`] split in two, for a caller that checks the signatures of many envelopes at once (a
/// batch verification): the payload, what is signed, and the signatures to check — nothing checked
/// yet. [`SignedParts::decide`] then gives [`verify`]'s answer from the signatures' outcomes.
#[derive(Debug, Clone)]
pub struct SignedParts {
    /// The payload, base64-decoded; not to be believed before [`SignedParts::decide`] says so.
    pub payload: Vec<u8>,
    /// `PAE(payloadType, payload)`: what the signatures sign.
    pub message: Vec<u8>,
    /// The signatures whose key id is trusted, in envelope order.
    pub candidates: Vec<Candidate>,
    offered: Vec<String>,
}

/// One signature by a trusted key id.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub keyid: String,
    pub key: ed25519_dalek::VerifyingKey,
    /// `None` when the signature is not base64 of exactly 64 bytes (a bad signature).
    pub signature: Option<ed25519_dalek::Signature>,
}

/// The first half of [`verify`]: payload type, payload and the candidate signatures.
pub fn signed_parts(
    envelope: &Envelope,
    expected_payload_type: &'static str,
    trusted: &TrustedKeys,
) -> Result<SignedParts> {
    if envelope.payload_type != expected_payload_type {
        return Err(Error::WrongPayloadType {
            expected: expected_payload_type,
            found: envelope.payload_type.clone(),
        });
    }
    let payload = envelope.payload_bytes()?;
    let message = pae(&envelope.payload_type, &payload);
    let candidates = envelope
        .signatures
        .iter()
        .filter_map(|signature| {
            Some(Candidate {
                keyid: signature.keyid.clone(),
                key: *trusted.get(&signature.keyid)?,
                signature: decode_signature(&signature.sig),
            })
        })
        .collect();
    Ok(SignedParts {
        payload,
        message,
        candidates,
        offered: envelope
            .signatures
            .iter()
            .map(|s| s.keyid.clone())
            .collect(),
    })
}

impl SignedParts {
    /// The second half of [`verify`]: `verified` is asked about the candidates in order (with the
    /// message) until one verified; that one's key id and the payload are the answer, else
    /// [`Error::BadSignature`] (the first candidate's key id) or, without candidates,
    /// [`Error::UnknownKey`].
    pub fn decide(
        self,
        mut verified: impl FnMut(&Candidate, &[u8]) -> bool,
    ) -> Result<(Vec<u8>, String)> {
        let message = &self.message;
        if let Some(good) = self.candidates.iter().position(|c| verified(c, message)) {
            let keyid = self.candidates[good].keyid.clone();
            return Ok((self.payload, keyid));
        }
        match self.candidates.into_iter().next() {
            Some(first) => Err(Error::BadSignature { keyid: first.keyid }),
            None => Err(Error::UnknownKey {
                keyids: self.offered,
            }),
        }
    }
}

/// A signature field as Ed25519 signature bytes; `None` when it is not base64 of exactly 64 bytes
/// (which counts as a bad signature, not a malformed envelope: it is the signer's claim that
/// fails).
fn decode_signature(sig: &str) -> Option<ed25519_dalek::Signature> {
    let bytes = BASE64.decode(sig).ok()?;
    ed25519_dalek::Signature::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::keys::signing_key_from_seed;

    const TYPE: &str = "application/vnd.example+json";

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

    #[test]
    fn pae_matches_the_dsse_spec_test_vector() {
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world".to_vec()
        );
        assert_eq!(pae("", b""), b"DSSEv1 0  0 ".to_vec());
    }

    #[test]
    fn sign_then_verify_round_trips_through_json() {
        let sk = key(1);
        let envelope = sign(TYPE, b"{\"hello\":1}", &sk);
        let bytes = envelope.to_json_bytes();
        assert_eq!(bytes, envelope.to_json_bytes(), "deterministic");
        assert!(!bytes.ends_with(b"\n"));
        let parsed = Envelope::from_json_slice(&bytes).expect("parse");
        assert_eq!(parsed, envelope);
        let (payload, signer) = verify(&parsed, TYPE, &trusting(&[&sk])).expect("verify");
        assert_eq!(payload, b"{\"hello\":1}");
        assert_eq!(signer, keyid(&sk.verifying_key()));
    }

    #[test]
    fn json_field_names_follow_dsse() {
        let text = String::from_utf8(sign(TYPE, b"x", &key(1)).to_json_bytes()).expect("utf-8");
        assert!(
            text.starts_with("{\"payload\":\"eA==\",\"payloadType\":"),
            "{text}"
        );
        assert!(text.contains("\"signatures\":[{\"keyid\":\""), "{text}");
        assert!(text.contains("\"sig\":\""), "{text}");
    }

    #[test]
    fn a_signature_made_elsewhere_verifies() {
        // An envelope assembled by hand from the spec, signed by the raw key: as another DSSE tool
        // would.
        let sk = key(2);
        let payload = b"hello world";
        let sig = sk.sign(&pae("http://example.com/HelloWorld", payload));
        let json = format!(
            concat!(
                r#"{{"payloadType":"http://example.com/HelloWorld","payload":"aGVsbG8gd29ybGQ=","#,
                r#""signatures":[{{"sig":"{}","keyid":"{}"}}],"extension":{{"x":1}}}}"#,
            ),
            BASE64.encode(sig.to_bytes()),
            keyid(&sk.verifying_key()),
        );
        let envelope =
            Envelope::from_json_slice(json.as_bytes()).expect("lenient on unknown fields");
        let (body, _) = verify(
            &envelope,
            "http://example.com/HelloWorld",
            &trusting(&[&sk]),
        )
        .expect("verify");
        assert_eq!(body, payload);
    }

    #[test]
    fn malformed_envelopes_are_refused() {
        for bad in [
            &b""[..],
            b"null",
            b"{}",
            b"{\"payload\":1,\"payloadType\":\"t\",\"signatures\":[]}",
            b"{\"payload\":\"\",\"payloadType\":\"t\",\"signatures\":[]}",
            b"{\"payload\":\"\",\"payloadType\":\"t\",\"signatures\":[{\"sig\":\"\"}]}",
            // a duplicate field
            concat!(
                r#"{"payload":"","payloadType":"t","payload":"","#,
                r#""signatures":[{"keyid":"","sig":""}]}"#
            )
            .as_bytes(),
        ] {
            let err = Envelope::from_json_slice(bad).expect_err(&String::from_utf8_lossy(bad));
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
    }

    #[test]
    fn payload_that_is_not_base64_is_malformed() {
        let sk = key(3);
        let mut envelope = sign(TYPE, b"x", &sk);
        envelope.payload = "not base64!".to_owned();
        let err = verify(&envelope, TYPE, &trusting(&[&sk])).expect_err("bad base64");
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
    }

    #[test]
    fn wrong_payload_type_is_refused_before_signatures() {
        let sk = key(4);
        let envelope = sign("application/other", b"x", &sk);
        let err = verify(&envelope, TYPE, &TrustedKeys::new()).expect_err("wrong type");
        let Error::WrongPayloadType { expected, found } = &err else {
            panic!("{err:?}")
        };
        assert_eq!((*expected, found.as_str()), (TYPE, "application/other"));
        assert_eq!(err.reason(), "wrong_payload_type");
    }

    #[test]
    fn unknown_key_is_refused_and_named() {
        let signer = key(5);
        let envelope = sign(TYPE, b"x", &signer);
        let err = verify(&envelope, TYPE, &trusting(&[&key(6)])).expect_err("unknown key");
        match &err {
            Error::UnknownKey { keyids } => assert_eq!(keyids, &[keyid(&signer.verifying_key())]),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(err.reason(), "unknown_key");
    }

    #[test]
    fn bad_signature_by_a_trusted_keyid_is_refused() {
        let sk = key(7);
        let mut envelope = sign(TYPE, b"x", &sk);
        envelope.payload = BASE64.encode(b"y");
        let err = verify(&envelope, TYPE, &trusting(&[&sk])).expect_err("bad signature");
        let Error::BadSignature { keyid: named } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(*named, keyid(&sk.verifying_key()));
        assert_eq!(err.reason(), "bad_signature");
    }

    #[test]
    fn a_keyid_hint_pointing_at_a_trusted_key_does_not_lend_its_trust() {
        // An attacker signs with their own key but claims the trusted key's id.
        let trusted_key = key(8);
        let attacker = key(9);
        let mut envelope = sign(TYPE, b"evil", &attacker);
        envelope.signatures[0].keyid = keyid(&trusted_key.verifying_key());
        let err = verify(&envelope, TYPE, &trusting(&[&trusted_key])).expect_err("forged hint");
        assert!(matches!(err, Error::BadSignature { .. }), "{err:?}");
    }

    #[test]
    fn signatures_that_are_not_64_bytes_of_base64_are_bad_signatures() {
        let sk = key(10);
        for sig in ["", "!!!", "AAAA", &BASE64.encode([0u8; 65])] {
            let mut envelope = sign(TYPE, b"x", &sk);
            envelope.signatures[0].sig = sig.to_owned();
            let err = verify(&envelope, TYPE, &trusting(&[&sk])).expect_err(sig);
            assert!(
                matches!(err, Error::BadSignature { .. }),
                "{sig:?}: {err:?}"
            );
        }
    }

    #[test]
    fn any_trusted_signature_suffices_and_unknown_ones_are_skipped() {
        let (old, new, stranger) = (key(11), key(12), key(13));
        let payload = b"rotating";
        let by_new = sign(TYPE, payload, &new);
        let by_stranger = sign(TYPE, payload, &stranger);
        let envelope = Envelope {
            signatures: vec![
                by_stranger.signatures[0].clone(),
                by_new.signatures[0].clone(),
            ],
            ..by_new.clone()
        };
        let (_, signer) =
            verify(&envelope, TYPE, &trusting(&[&old, &new])).expect("second signature verifies");
        assert_eq!(signer, keyid(&new.verifying_key()));
    }

    #[test]
    fn empty_signature_list_is_an_unknown_key() {
        let mut envelope = sign(TYPE, b"x", &key(14));
        envelope.signatures.clear();
        let err = verify(&envelope, TYPE, &trusting(&[&key(14)])).expect_err("unsigned");
        assert!(matches!(&err, Error::UnknownKey { keyids } if keyids.is_empty()));
    }
}
