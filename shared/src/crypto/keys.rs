//! Release keys: Ed25519 keys in the PEM files that `windvane keygen` writes (the same files as
//! `openssl genpkey -algorithm ed25519`), their key ids, and the set of trusted public keys an
//! agent (or `windvane verify`) checks signatures against ([`TrustedKeys`]).
//!
//! Private keys come from a release engineer's key file and go to [`crate::crypto::dsse::sign`]; public
//! keys come from the operator's `--trusted-key` files and go to [`crate::crypto::dsse::verify`]. Trusting
//! a set of keys is how keys are rotated: trust the new key next to the old one, then sign with the
//! new one, then drop the old one. Weak (small-order) and non-canonically encoded public keys are
//! refused when they are loaded, so they never reach signature checks.

use std::collections::BTreeMap;
use std::fmt;

use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::spki::der::zeroize::Zeroize;
use ed25519_dalek::pkcs8::{
    DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey, KeypairBytes,
};
use ed25519_dalek::{SigningKey, VerifyingKey};

use crate::crypto::digest::sha256_hex;
use crate::{Error, Result};

/// The key id of a public key: lower-case hex SHA-256 of its raw 32-byte encoding. Envelopes name
/// their signer by it, and it is what messages and the fleet page show.
pub fn keyid(key: &VerifyingKey) -> String {
    sha256_hex(key.as_bytes())
}

/// The signing key whose 32-byte secret (RFC 8032 seed) is `seed`. The caller supplies the
/// randomness (`windvane keygen` reads it from the operating system); the seed is wiped here after
/// use.
pub fn signing_key_from_seed(seed: [u8; 32]) -> SigningKey {
    let mut seed = seed;
    let key = SigningKey::from_bytes(&seed);
    seed.zeroize();
    key
}

/// PKCS#8 v1 PEM (`-----BEGIN PRIVATE KEY-----`, seed only, LF line endings), byte for byte what
/// `openssl genpkey -algorithm ed25519` writes. Intermediate copies of the secret are wiped; the
/// returned string is the caller's to write and drop.
pub fn signing_key_to_pem(key: &SigningKey) -> String {
    // No public key in the document: that is PKCS#8 v1, the form OpenSSL writes and every tool
    // reads.
    let keypair = KeypairBytes {
        secret_key: key.to_bytes(),
        public_key: None,
    };
    let mut pem = keypair
        .to_pkcs8_pem(LineEnding::LF)
        .expect("encoding a 32-byte Ed25519 seed as PKCS#8 PEM cannot fail");
    // Move the text out without copying it; the emptied `Zeroizing` wrapper wipes nothing more on
    // drop.
    std::mem::take(&mut *pem)
}

/// Reads an Ed25519 private key from PKCS#8 PEM (v1 as OpenSSL writes it, or v2 with the public
/// key, which must then match). `source_name` (usually the file path) names the key in errors.
pub fn signing_key_from_pem(pem: &str, source_name: &str) -> Result<SigningKey> {
    let pem = pem.trim();
    SigningKey::from_pkcs8_pem(pem).map_err(|e| {
        let detail = if pem.contains("-----BEGIN PUBLIC KEY-----") {
            "this is a public key; signing needs the private key (the file without .pub)".to_owned()
        } else {
            e.to_string()
        };
        Error::KeyPem {
            path: source_name.to_owned(),
            expected: "private",
            detail,
        }
    })
}

/// SubjectPublicKeyInfo PEM (`-----BEGIN PUBLIC KEY-----`, LF line endings), byte for byte what
/// `openssl pkey -pubout` writes.
pub fn verifying_key_to_pem(key: &VerifyingKey) -> String {
    key.to_public_key_pem(LineEnding::LF)
        .expect("encoding a 32-byte Ed25519 public key as SPKI PEM cannot fail")
}

/// Reads an Ed25519 public key from SPKI PEM (as `openssl pkey -pubout` writes it). Refuses weak
/// (small-order) and non-canonically encoded keys with [`Error::WeakKey`]. `source_name` (usually
/// the file path) names the key in errors.
pub fn verifying_key_from_pem(pem: &str, source_name: &str) -> Result<VerifyingKey> {
    let pem = pem.trim();
    let key = VerifyingKey::from_public_key_pem(pem).map_err(|e| {
        let detail = if pem.contains("PRIVATE KEY-----") {
            "this is a private key: trust its public key instead (openssl pkey -in KEY -pubout) \
             and keep the private key away from clusters"
                .to_owned()
        } else {
            e.to_string()
        };
        Error::KeyPem {
            path: source_name.to_owned(),
            expected: "public",
            detail,
        }
    })?;
    check_strong(&key, Some(source_name))?;
    Ok(key)
}

/// Refuses a key that no signature check should ever rely on: a small-order point (a signature by
/// it can verify for many messages) or a non-canonical encoding (two key ids for one key).
fn check_strong(key: &VerifyingKey, source_name: Option<&str>) -> Result<()> {
    let canonical = key.to_edwards().compress().to_bytes() == key.to_bytes();
    if key.is_weak() || !canonical {
        return Err(Error::WeakKey {
            keyid: keyid(key),
            source_name: source_name.map(str::to_owned),
        });
    }
    Ok(())
}

/// The public keys an agent trusts for releases, by key id. More than one key is how keys rotate.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TrustedKeys {
    keys: BTreeMap<String, VerifyingKey>,
}

impl fmt::Debug for TrustedKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.keys.keys()).finish()
    }
}

impl TrustedKeys {
    /// An empty set, which trusts nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts `key` and returns its key id. Refuses weak and non-canonical keys
    /// ([`Error::WeakKey`]). Inserting a key that is already trusted is a no-op.
    pub fn insert(&mut self, key: VerifyingKey) -> Result<String> {
        check_strong(&key, None)?;
        let id = keyid(&key);
        self.keys.insert(id.clone(), key);
        Ok(id)
    }

    /// Reads each `(source name, PEM text)` pair with [`verifying_key_from_pem`] and trusts them
    /// all; the first key that cannot be read (or is weak) fails the whole set.
    pub fn from_pems<'a>(pems: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Self> {
        let mut set = Self::new();
        for (source_name, pem) in pems {
            let key = verifying_key_from_pem(pem, source_name)?;
            set.insert(key)?;
        }
        Ok(set)
    }

    /// The trusted key with this key id, if any.
    pub fn get(&self, keyid: &str) -> Option<&VerifyingKey> {
        self.keys.get(keyid)
    }

    /// The trusted key ids, sorted.
    pub fn keyids(&self) -> Vec<String> {
        self.keys.keys().cloned().collect()
    }

    /// How many keys are trusted.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when no key is trusted (every signature would be refused).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// The mark the deploy examples put where a real secret goes (`REPLACE-ME-with-the-fleet-registration-token`).
pub const PLACEHOLDER_MARK: &str = "REPLACE-ME";

/// Whether a token or key file still holds a deploy example's placeholder instead of the real secret: such a
/// file must be refused, or every installation copied from the examples would share one known token.
pub fn is_placeholder(text: &str) -> bool {
    text.contains(PLACEHOLDER_MARK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::pkcs8::PublicKeyBytes;

    /// The encoding of the identity point (y = 1): a valid curve point of order 1, the weakest key
    /// there is.
    const IDENTITY: [u8; 32] = {
        let mut bytes = [0u8; 32];
        bytes[0] = 1;
        bytes
    };

    fn key(n: u8) -> SigningKey {
        signing_key_from_seed([n; 32])
    }

    #[test]
    fn keyid_is_sha256_of_raw_public_key() {
        let vk = key(1).verifying_key();
        assert_eq!(keyid(&vk), sha256_hex(&vk.to_bytes()));
        assert!(crate::crypto::digest::is_sha256_hex(&keyid(&vk)));
        assert_ne!(keyid(&vk), keyid(&key(2).verifying_key()));
    }

    #[test]
    fn rfc8032_test_vector_1_seed_gives_its_public_key() {
        // RFC 8032 section 7.1, TEST 1.
        let seed: [u8; 32] = [
            0x9d, 0x61, 0xb1, 0x9d, 0xef, 0xfd, 0x5a, 0x60, 0xba, 0x84, 0x4a, 0xf4, 0x92, 0xec,
            0x2c, 0xc4, 0x44, 0x49, 0xc5, 0x69, 0x7b, 0x32, 0x69, 0x19, 0x70, 0x3b, 0xac, 0x03,
            0x1c, 0xae, 0x7f, 0x60,
        ];
        let vk = signing_key_from_seed(seed).verifying_key();
        assert_eq!(
            crate::crypto::digest::to_hex(vk.as_bytes()),
            "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
        );
    }

    #[test]
    fn private_pem_round_trip_is_pkcs8_v1() {
        let sk = key(7);
        let pem = signing_key_to_pem(&sk);
        assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----\n"), "{pem}");
        assert!(pem.ends_with("-----END PRIVATE KEY-----\n"), "{pem}");
        // PKCS#8 v1 of an Ed25519 seed is 48 bytes of DER: 64 base64 characters, one line.
        assert_eq!(pem.lines().count(), 3, "{pem}");
        assert_eq!(pem.lines().nth(1).map(str::len), Some(64));
        let back = signing_key_from_pem(&pem, "k.pem").expect("round trip");
        assert_eq!(back.to_bytes(), sk.to_bytes());
    }

    #[test]
    fn private_pem_with_crlf_and_surrounding_whitespace_reads() {
        let sk = key(8);
        let pem = format!("\n{}  \n", signing_key_to_pem(&sk).replace('\n', "\r\n"));
        let back = signing_key_from_pem(&pem, "k.pem").expect("lenient on line endings");
        assert_eq!(back.to_bytes(), sk.to_bytes());
    }

    #[test]
    fn private_pem_v2_with_matching_public_key_reads_and_mismatch_is_refused() {
        let sk = key(9);
        let v2 = KeypairBytes {
            secret_key: sk.to_bytes(),
            public_key: Some(PublicKeyBytes(sk.verifying_key().to_bytes())),
        };
        let pem = v2.to_pkcs8_pem(LineEnding::LF).expect("encode");
        assert_eq!(
            signing_key_from_pem(&pem, "v2.pem").expect("v2").to_bytes(),
            sk.to_bytes()
        );

        let lying = KeypairBytes {
            secret_key: sk.to_bytes(),
            public_key: Some(PublicKeyBytes(key(10).verifying_key().to_bytes())),
        };
        let pem = lying.to_pkcs8_pem(LineEnding::LF).expect("encode");
        let err = signing_key_from_pem(&pem, "lying.pem").expect_err("mismatched public key");
        assert!(
            matches!(&err, Error::KeyPem { path, expected: "private", .. } if path == "lying.pem")
        );
        assert_eq!(err.reason(), "key");
    }

    #[test]
    fn public_pem_round_trip() {
        let vk = key(11).verifying_key();
        let pem = verifying_key_to_pem(&vk);
        assert!(pem.starts_with("-----BEGIN PUBLIC KEY-----\n"), "{pem}");
        assert!(pem.ends_with("-----END PUBLIC KEY-----\n"), "{pem}");
        assert_eq!(
            verifying_key_from_pem(&pem, "k.pub").expect("round trip"),
            vk
        );
    }

    #[test]
    fn keys_in_the_wrong_file_are_named_and_explained() {
        let sk = key(12);
        let private = signing_key_to_pem(&sk);
        let public = verifying_key_to_pem(&sk.verifying_key());

        let err = verifying_key_from_pem(&private, "release.key")
            .expect_err("private key as trusted key");
        match &err {
            Error::KeyPem {
                path,
                expected: "public",
                detail,
            } => {
                assert_eq!(path, "release.key");
                assert!(detail.contains("private key"), "{detail}");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(
            !err.to_string()
                .contains(private.lines().nth(1).unwrap_or("-")),
            "secret leaked into message"
        );

        let err =
            signing_key_from_pem(&public, "release.pub").expect_err("public key as signing key");
        let Error::KeyPem {
            expected, detail, ..
        } = &err
        else {
            panic!("{err:?}")
        };
        assert_eq!(*expected, "private");
        assert!(detail.contains("public key"), "{detail}");

        let err = signing_key_from_pem("not a pem", "garbage").expect_err("garbage");
        assert!(matches!(err, Error::KeyPem { .. }));
        let err = verifying_key_from_pem("", "empty").expect_err("empty");
        assert!(matches!(err, Error::KeyPem { .. }));
    }

    #[test]
    fn weak_key_is_refused_at_load() {
        let weak_pem = PublicKeyBytes(IDENTITY)
            .to_public_key_pem(LineEnding::LF)
            .expect("encode");
        let err =
            verifying_key_from_pem(&weak_pem, "weak.pub").expect_err("identity point is weak");
        match &err {
            Error::WeakKey { keyid, source_name } => {
                assert_eq!(*keyid, sha256_hex(&IDENTITY));
                assert_eq!(source_name.as_deref(), Some("weak.pub"));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(err.reason(), "weak_key");
        assert!(err.to_string().contains("weak.pub"), "{err}");

        let err =
            TrustedKeys::from_pems([("weak.pub", weak_pem.as_str())]).expect_err("weak in a set");
        assert!(matches!(err, Error::WeakKey { .. }));
    }

    #[test]
    fn weak_key_is_refused_by_insert() {
        let weak = VerifyingKey::from_bytes(&IDENTITY).expect("the identity is a curve point");
        let mut trusted = TrustedKeys::new();
        let err = trusted.insert(weak).expect_err("weak");
        assert!(matches!(
            &err,
            Error::WeakKey {
                source_name: None,
                ..
            }
        ));
        assert_eq!(err.reason(), "weak_key");
        assert!(trusted.is_empty());
    }

    #[test]
    fn non_canonical_key_encodings_are_refused() {
        // Encodings of y = p + k (p = 2^255 - 19) are not canonical: the decoder reduces them to y
        // = k, so one point would have two key ids. Some of them are small-order too; all must be
        // refused, and at least one must be refused for being non-canonical alone.
        let mut non_canonical_only = 0;
        for k in 0u8..19 {
            let mut bytes = [0xffu8; 32];
            bytes[0] = 0xed + k; // low byte of p is 0xed; p + k for k < 19 never carries.
            bytes[31] = 0x7f;
            let Ok(vk) = VerifyingKey::from_bytes(&bytes) else {
                continue;
            };
            if !vk.is_weak() {
                non_canonical_only += 1;
            }
            let err = TrustedKeys::new().insert(vk).expect_err("non-canonical");
            assert!(matches!(err, Error::WeakKey { .. }), "{err:?}");
        }
        assert!(
            non_canonical_only > 0,
            "no strong point with a non-canonical encoding among y = p..p+18"
        );
    }

    #[test]
    fn trusted_set_holds_several_keys_by_keyid() {
        let (a, b) = (key(20).verifying_key(), key(21).verifying_key());
        let pem_a = verifying_key_to_pem(&a);
        let pem_b = verifying_key_to_pem(&b);
        let trusted =
            TrustedKeys::from_pems([("a.pub", pem_a.as_str()), ("b.pub", pem_b.as_str())])
                .expect("set");
        assert_eq!(trusted.len(), 2);
        assert!(!trusted.is_empty());
        assert_eq!(trusted.get(&keyid(&a)), Some(&a));
        assert_eq!(trusted.get(&keyid(&b)), Some(&b));
        assert_eq!(trusted.get(&keyid(&key(22).verifying_key())), None);
        let mut ids = vec![keyid(&a), keyid(&b)];
        ids.sort();
        assert_eq!(trusted.keyids(), ids);

        let mut again = trusted.clone();
        assert_eq!(again.insert(a).expect("same key"), keyid(&a));
        assert_eq!(again.len(), 2);
    }

    #[test]
    fn debug_never_prints_secrets() {
        let sk = key(30);
        let secret_hex = crate::crypto::digest::to_hex(&sk.to_bytes());
        let mut trusted = TrustedKeys::new();
        trusted.insert(sk.verifying_key()).expect("insert");
        assert!(!format!("{sk:?}").contains(&secret_hex));
        assert!(format!("{trusted:?}").contains(&keyid(&sk.verifying_key())));
    }
}
