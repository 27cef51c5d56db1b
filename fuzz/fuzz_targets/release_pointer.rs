//! Channel pointers as an agent fetches them from the untrusted store (`verify_pointer`), re-reads its last
//! known good (`verify_known_good`), and a publisher reads the current one (`verify_signed_pointer`).
//!
//! Mode 0: the bytes are the pointer file. Mode 1: the bytes are the pointer's payload, signed here with the
//! trusted release key, so that the payload checks after the signature are reached; whatever is accepted must
//! hold every promise the verifier documents, and must survive being signed again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use windvane_fuzz::{CHANNEL, FLEET, HIGHEST_ACCEPTED, mode, now, release_key, trusting};
use windvane_shared::crypto::digest::{is_sha256_hex, sha256_hex};
use windvane_shared::crypto::dsse;
use windvane_shared::format::release::{AcceptedRelease, DEFAULT_MAX_POINTER_BYTES, PointerExpectations, RELEASE_PAYLOAD_TYPE, verify_known_good, verify_pointer, verify_signed_pointer};

fuzz_target!(|data: &[u8]| {
    let Some((mode, data)) = mode(data, 2) else {
        return;
    };
    let key = release_key();
    let trusted = trusting(&key);
    let bytes = match mode {
        0 => data.to_vec(),
        _ => dsse::sign(RELEASE_PAYLOAD_TYPE, data, &key).to_json_bytes(),
    };

    let accepted_digest = sha256_hex(b"the bundle accepted at serial 3");
    let mut expect = PointerExpectations::new(&trusted, FLEET, CHANNEL, now());
    expect.highest_accepted = Some((HIGHEST_ACCEPTED, &accepted_digest));
    let fresh = verify_pointer(&bytes, &expect);
    let signed = verify_signed_pointer(&bytes, &trusted, DEFAULT_MAX_POINTER_BYTES);
    let known_good = verify_known_good(&bytes, &trusted, FLEET, CHANNEL);

    // Each verifier is the one before it plus more checks: what a stricter one accepts, the laxer accepts too.
    if let Ok(accepted) = &fresh {
        check_promises(accepted);
        assert!(accepted.pointer.serial >= HIGHEST_ACCEPTED);
        if accepted.pointer.serial == HIGHEST_ACCEPTED {
            assert_eq!(accepted.pointer.bundle.sha256, accepted_digest);
        }
        assert!(accepted.pointer.expires_at > now());
        assert_eq!(known_good.as_ref().ok(), Some(accepted));
    }
    if let Ok(accepted) = &known_good {
        check_promises(accepted);
        assert_eq!(signed.as_ref().ok(), Some(accepted));
    }
    if let Ok(accepted) = &signed {
        assert!(is_sha256_hex(&accepted.pointer.bundle.sha256));
        assert!(accepted.pointer.issued_at < accepted.pointer.expires_at);
        // What was accepted, signed again by the publisher, is accepted as the same pointer.
        let resigned = accepted.pointer.sign(&key).to_json_bytes();
        let again =
            verify_signed_pointer(&resigned, &trusted, u64::MAX).expect("re-signed pointer");
        assert_eq!(again.pointer, accepted.pointer);
    }
});

fn check_promises(accepted: &AcceptedRelease) {
    assert_eq!(accepted.pointer.fleet, FLEET);
    assert_eq!(accepted.pointer.channel, CHANNEL);
    assert!(is_sha256_hex(&accepted.pointer.bundle.sha256));
}
