//! Secrets and who may do what: the fleet registration token (enrolment only), the admin token (the admin
//! endpoints, `windvane cluster rekey|forget`; they are refused when the server has none), the optional read
//! token (page, JSON API and `/metrics`), and the limiter that slows down anyone guessing them. Every cluster
//! holds the registration token, so it never authorises anything but enrolling a name not bound yet.
//!
//! Tokens are read once from their files at start-up; only their SHA-256 is kept in memory ([`TokenHash`]),
//! and an offered token is hashed and compared in constant time. Neither the tokens nor their hashes are ever
//! logged. The limiter ([`FailureLimiter`]) is pure: it is given the time, so tests step through a window.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::{Error, Result};

/// Shortest admin token accepted (after trimming): it guards every cluster's enrolment, so a guessable one is
/// refused at start (`head -c 32 /dev/urandom | base64` gives 44 characters).
pub const MIN_ADMIN_TOKEN_LEN: usize = 16;

/// The SHA-256 of a secret token; the only form in which the server keeps it.
#[derive(Clone)]
pub struct TokenHash([u8; 32]);

impl std::fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenHash(<redacted>)")
    }
}

impl TokenHash {
    /// Hashes a token (surrounding whitespace, such as a file's trailing newline, is not part of it).
    pub fn of(token: &str) -> TokenHash {
        TokenHash(Sha256::digest(token.trim().as_bytes()).into())
    }

    /// Reads a token file: non-empty after trimming, at most 4 KiB.
    pub fn from_file(path: &Path) -> Result<TokenHash> {
        TokenHash::from_file_min(path, 1)
    }

    /// Reads a token file whose token must have at least `min_len` characters after trimming.
    pub fn from_file_min(path: &Path, min_len: usize) -> Result<TokenHash> {
        let bad = |detail: String| Error::TokenFile {
            path: path.to_path_buf(),
            detail,
        };
        let bytes = windvane_store::read_capped_file(path, 4096, "token file")
            .map_err(|e| bad(e.to_string()))?;
        let text = String::from_utf8(bytes).map_err(|_| bad("not UTF-8".to_owned()))?;
        let length = text.trim().chars().count();
        if length == 0 {
            return Err(bad("empty token".to_owned()));
        }
        if windvane_shared::keys::is_placeholder(&text) {
            return Err(bad(
                "still holds the example's REPLACE-ME placeholder; write the real token into it (make one with \
                 `head -c 32 /dev/urandom | base64`)"
                    .to_owned(),
            ));
        }
        if length < min_len {
            return Err(bad(format!(
                "token too short ({length} characters, at least {min_len}): make one with `head -c 32 /dev/urandom | base64`"
            )));
        }
        Ok(TokenHash::of(&text))
    }

    /// Whether two tokens are the same, compared in constant time.
    pub fn same_as(&self, other: &TokenHash) -> bool {
        bool::from(self.0.ct_eq(&other.0))
    }

    /// Whether `offered` is the token, compared in constant time over the hashes.
    pub fn verify(&self, offered: &str) -> bool {
        let offered = TokenHash::of(offered);
        bool::from(self.0.ct_eq(&offered.0))
    }
}

/// The credential in an `Authorization` header: a bearer token, or the password of HTTP Basic (so that a
/// browser can prompt for the read token). `None` when absent or unreadable.
pub fn credential(authorization: Option<&[u8]>) -> Option<String> {
    let text = std::str::from_utf8(authorization?).ok()?.trim();
    let (scheme, rest) = text.split_once(' ')?;
    if scheme.eq_ignore_ascii_case("bearer") {
        return Some(rest.trim().to_owned());
    }
    if scheme.eq_ignore_ascii_case("basic") {
        use base64::Engine as _;
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(rest.trim())
            .ok()?;
        let decoded = String::from_utf8(decoded).ok()?;
        return decoded
            .split_once(':')
            .map(|(_, password)| password.to_owned());
    }
    None
}

/// Counts failed token checks per source address; once an address has failed `max_failures` times within
/// `window`, it is refused (429) until the window that began with its first failure ends.
#[derive(Debug)]
pub struct FailureLimiter {
    max_failures: u32,
    window: Duration,
    failures: HashMap<IpAddr, (Instant, u32)>,
}

impl FailureLimiter {
    pub fn new(max_failures: u32, window: Duration) -> Self {
        Self {
            max_failures,
            window,
            failures: HashMap::new(),
        }
    }

    /// `Some(retry_after)` when `ip` is currently blocked.
    pub fn check(&mut self, ip: IpAddr, now: Instant) -> Option<Duration> {
        let (start, count) = *self.failures.get(&ip)?;
        let elapsed = now.saturating_duration_since(start);
        if elapsed >= self.window {
            self.failures.remove(&ip);
            return None;
        }
        (count >= self.max_failures).then(|| self.window - elapsed)
    }

    /// Records a failed attempt from `ip`.
    pub fn fail(&mut self, ip: IpAddr, now: Instant) {
        if self.failures.len() > 100_000 {
            let window = self.window;
            self.failures
                .retain(|_, (start, _)| now.saturating_duration_since(*start) < window);
        }
        let entry = self.failures.entry(ip).or_insert((now, 0));
        if now.saturating_duration_since(entry.0) >= self.window {
            *entry = (now, 0);
        }
        entry.1 = entry.1.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_by_hash_and_ignore_surrounding_whitespace() {
        let hash = TokenHash::of("s3cret\n");
        assert!(hash.verify("s3cret"));
        assert!(hash.verify("  s3cret "));
        assert!(!hash.verify("s3cre"));
        assert!(!hash.verify(""));
        assert!(!format!("{hash:?}").contains("s3cret"));
        assert!(hash.same_as(&TokenHash::of(" s3cret")));
        assert!(!hash.same_as(&TokenHash::of("s3cret2")));
    }

    #[test]
    fn token_files_must_hold_a_long_enough_token() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("admin-token");
        std::fs::write(&file, "  \n").expect("write");
        let empty = TokenHash::from_file_min(&file, MIN_ADMIN_TOKEN_LEN).expect_err("empty");
        assert!(empty.to_string().contains("empty token"), "{empty}");
        std::fs::write(&file, "short\n").expect("write");
        let short = TokenHash::from_file_min(&file, MIN_ADMIN_TOKEN_LEN).expect_err("short");
        assert!(
            short
                .to_string()
                .contains("too short (5 characters, at least 16)"),
            "{short}"
        );
        assert!(
            TokenHash::from_file(&file).is_ok(),
            "the plain check only refuses empty tokens"
        );
        std::fs::write(&file, "REPLACE-ME-with-an-admin-token-of-its-own\n").expect("write");
        let placeholder = TokenHash::from_file(&file).expect_err("placeholder");
        assert!(
            placeholder.to_string().contains("REPLACE-ME placeholder"),
            "{placeholder}"
        );
        std::fs::write(&file, "0123456789abcdef\n").expect("write");
        assert!(
            TokenHash::from_file_min(&file, MIN_ADMIN_TOKEN_LEN)
                .is_ok_and(|h| h.verify("0123456789abcdef"))
        );
    }

    #[test]
    fn credentials_from_bearer_and_basic() {
        assert_eq!(credential(Some(b"Bearer abc")).as_deref(), Some("abc"));
        assert_eq!(credential(Some(b"bearer  abc ")).as_deref(), Some("abc"));
        // "any:tok" in base64
        assert_eq!(
            credential(Some(b"Basic YW55OnRvaw==")).as_deref(),
            Some("tok")
        );
        assert_eq!(credential(Some(b"Digest xyz")), None);
        assert_eq!(credential(Some(b"Bearer")), None);
        assert_eq!(credential(None), None);
    }

    #[test]
    fn limiter_blocks_after_too_many_failures_until_the_window_ends() {
        let mut limiter = FailureLimiter::new(3, Duration::from_secs(60));
        let ip: IpAddr = "192.0.2.1".parse().expect("ip");
        let other: IpAddr = "192.0.2.2".parse().expect("ip");
        let t0 = Instant::now();
        for i in 0..3 {
            assert_eq!(limiter.check(ip, t0), None, "attempt {i}");
            limiter.fail(ip, t0 + Duration::from_secs(i));
        }
        assert_eq!(
            limiter.check(ip, t0 + Duration::from_secs(10)),
            Some(Duration::from_secs(50))
        );
        assert_eq!(
            limiter.check(other, t0 + Duration::from_secs(10)),
            None,
            "per address"
        );
        assert_eq!(
            limiter.check(ip, t0 + Duration::from_secs(60)),
            None,
            "window over"
        );
        limiter.fail(ip, t0 + Duration::from_secs(61));
        assert_eq!(
            limiter.check(ip, t0 + Duration::from_secs(62)),
            None,
            "counting afresh"
        );
    }
}
