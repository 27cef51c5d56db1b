//! SHA-256 digests as lower-case hex: the names of bundles in the store, of keys (keyid), and of releases.

use sha2::{Digest, Sha256};

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    to_hex(&Sha256::digest(bytes))
}

/// Lower-case hex of arbitrary bytes.
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(DIGITS[usize::from(byte >> 4)] as char);
        out.push(DIGITS[usize::from(byte & 0x0f)] as char);
    }
    out
}

/// True when `s` looks like a SHA-256 hex digest (64 lower-case hex digits): the only file names the store
/// serves under `bundles/`.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digest() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn digest_names() {
        assert!(is_sha256_hex(&sha256_hex(b"")));
        assert!(!is_sha256_hex("../../etc/passwd"));
        assert!(!is_sha256_hex(&sha256_hex(b"").to_uppercase()));
    }
}
