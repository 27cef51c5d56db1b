//! DSSE envelopes as an agent (pointers) and the server (heartbeats) read them from the network.
//!
//! Mode 0: the bytes are an envelope: parse it, check that re-encoding is stable, decode the payload and
//! verify it against the release key. Mode 1: the bytes are `payloadType NUL payload`: sign them with the
//! release key and check that the envelope survives JSON and verifies to the same payload (and, for another
//! expected type or another trusted key, is refused).
#![no_main]

use libfuzzer_sys::fuzz_target;
use windvane_fuzz::{mode, release_key, trusting};
use windvane_shared::Error;
use windvane_shared::crypto::dsse::{self, Envelope};
use windvane_shared::crypto::keys::{keyid, signing_key_from_seed};
use windvane_shared::format::release::RELEASE_PAYLOAD_TYPE;

fuzz_target!(|data: &[u8]| {
    let Some((mode, data)) = mode(data, 2) else {
        return;
    };
    let key = release_key();
    let trusted = trusting(&key);
    if mode == 0 {
        let Ok(envelope) = Envelope::from_json_slice(data) else {
            return;
        };
        assert!(!envelope.signatures.is_empty(), "parsed with no signature");
        let bytes = envelope.to_json_bytes();
        let again = Envelope::from_json_slice(&bytes).expect("a re-encoded envelope parses");
        assert_eq!(again, envelope, "re-encoding changed the envelope");
        assert_eq!(
            again.to_json_bytes(),
            bytes,
            "encoding is not deterministic"
        );
        let decoded = envelope.payload_bytes();
        match dsse::verify(&envelope, RELEASE_PAYLOAD_TYPE, &trusted) {
            Ok((payload, signer)) => {
                assert_eq!(signer, keyid(&key.verifying_key()));
                assert_eq!(Some(&payload), decoded.as_ref().ok());
            }
            Err(Error::Malformed { .. }) => assert!(decoded.is_err()),
            Err(_) => {}
        }
        return;
    }

    let (payload_type, payload) = match data.iter().position(|b| *b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (&b""[..], data),
    };
    let Ok(payload_type) = std::str::from_utf8(payload_type) else {
        return;
    };
    let bytes = dsse::sign(payload_type, payload, &key).to_json_bytes();
    let envelope = Envelope::from_json_slice(&bytes).expect("a signed envelope parses");
    let decoded = envelope.payload_bytes().expect("own payload decodes");
    assert_eq!(decoded, payload);
    if payload_type == RELEASE_PAYLOAD_TYPE {
        let (verified, _) = dsse::verify(&envelope, RELEASE_PAYLOAD_TYPE, &trusted)
            .expect("own signature verifies");
        assert_eq!(verified, payload);
        let stranger = trusting(&signing_key_from_seed([0x43; 32]));
        assert!(matches!(
            dsse::verify(&envelope, RELEASE_PAYLOAD_TYPE, &stranger),
            Err(Error::UnknownKey { .. })
        ));
    } else {
        assert!(matches!(
            dsse::verify(&envelope, RELEASE_PAYLOAD_TYPE, &trusted),
            Err(Error::WrongPayloadType { .. })
        ));
        // `verify` only takes a fixed expected type; check the signature over the PAE directly instead.
        let sig = ed25519_dalek::Signature::from_slice(
            &base64_decode(&envelope.signatures[0].sig).expect("own signature is base64"),
        )
        .expect("own signature is 64 bytes");
        key.verifying_key()
            .verify_strict(&dsse::pae(&envelope.payload_type, payload), &sig)
            .expect("own signature verifies over the PAE");
    }
});

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    // The envelope's own base64 decoder, through an envelope whose payload is the text.
    Envelope {
        payload: text.to_owned(),
        payload_type: String::new(),
        signatures: Vec::new(),
    }
    .payload_bytes()
    .ok()
}
