//! Secrets and who may do what: the fleet registration token (enrolment only), the admin token (the admin
//! endpoints, `windvane cluster rekey|forget`; they are refused when the server has none), the optional read
//! token (page, JSON API and `/metrics`), and the limiter that slows down anyone guessing them. Every cluster
//! holds the registration token, so it never authorises anything but enrolling a name not bound yet.
//!
//! Tokens are read once from their files at start-up; only their SHA-256 is kept in memory ([`TokenHash`]),
//! and an offered token is hashed and compared in constant time. Every token file must hold at least
//! [`MIN_TOKEN_BYTES`]. Neither the tokens nor their hashes are ever logged. The limiter's decision
//! ([`FailurePolicy`]) is pure, over the failures the database holds, so that every replica counts the same
//! failures; every kind of token is counted (registration, admin, read, and the rollout view's).
//!
//! The read token may come as HTTP Basic (so that a browser can prompt for it); the admin token only as a
//! bearer token ([`bearer`]): a browser caches Basic credentials and sends them again by itself, so a page
//! elsewhere could make a signed-in browser rekey or forget a cluster.

use std::path::Path;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::{Error, Result};

/// Shortest token accepted in any token file, in bytes after trimming: a guessable token is refused at start
/// (`head -c 32 /dev/urandom | base64` gives 44). The limiter allows ten guesses a minute per address, so
/// 16 random characters are far out of reach; one character is not.
pub const MIN_TOKEN_BYTES: usize = 16;

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

    /// Reads a token file: at least [`MIN_TOKEN_BYTES`] after trimming, at most 4 KiB.
    pub fn from_file(path: &Path) -> Result<TokenHash> {
        TokenHash::from_file_min(path, MIN_TOKEN_BYTES)
    }

    /// Reads a token file whose token must have at least `min_len` bytes after trimming.
    pub fn from_file_min(path: &Path, min_len: usize) -> Result<TokenHash> {
        let bad = |detail: String| Error::TokenFile {
            path: path.to_path_buf(),
            detail,
        };
        let bytes = windvane_store::read_capped_file(path, 4096, "token file")
            .map_err(|e| bad(e.to_string()))?;
        let text = String::from_utf8(bytes).map_err(|_| bad("not UTF-8".to_owned()))?;
        let length = text.trim().len();
        if length == 0 {
            return Err(bad("empty token".to_owned()));
        }
        if windvane_shared::crypto::keys::is_placeholder(&text) {
            return Err(bad(
                "still holds the example's REPLACE-ME placeholder; write the real token into it (make one with \
                 `head -c 32 /dev/urandom | base64`)"
                    .to_owned(),
            ));
        }
        if length < min_len {
            return Err(bad(format!(
                "token too short ({length} bytes, at least {min_len}): a short token can be guessed; make one with \
                 `head -c 32 /dev/urandom | base64`"
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

/// The token of an `Authorization: Bearer` header; `None` when absent, unreadable or of another scheme. The
/// admin endpoints take only this.
pub fn bearer(authorization: Option<&[u8]>) -> Option<String> {
    let text = std::str::from_utf8(authorization?).ok()?.trim();
    let (scheme, rest) = text.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim().to_owned())
}

/// The credential in an `Authorization` header: a bearer token, or the password of HTTP Basic (so that a
/// browser can prompt for the read token). `None` when absent or unreadable.
pub fn credential(authorization: Option<&[u8]>) -> Option<String> {
    if let Some(token) = bearer(authorization) {
        return Some(token);
    }
    let text = std::str::from_utf8(authorization?).ok()?.trim();
    let (scheme, rest) = text.split_once(' ')?;
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

/// How many wrong tokens an address may offer: once it has failed `max_failures` times within the last
/// `window`, it is refused (429) until the oldest of those failures is `window` old. The failures are stored
/// in the database ([`crate::db::Database::record_token_failure`]), so replicas behind a load
/// balancer share the count; this decision over what is stored is pure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailurePolicy {
    pub max_failures: u32,
    pub window: Duration,
}

impl Default for FailurePolicy {
    fn default() -> Self {
        Self {
            max_failures: 10,
            window: Duration::from_secs(60),
        }
    }
}

/// An address's failures within the window, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecentFailures {
    pub count: u64,
    /// When the oldest of them happened.
    pub oldest: Option<Timestamp>,
}

impl FailurePolicy {
    /// Failures before this instant no longer count.
    pub fn window_start(&self, now: Timestamp) -> Timestamp {
        let window = SignedDuration::try_from(self.window).unwrap_or(SignedDuration::MAX);
        now.checked_sub(window).unwrap_or(Timestamp::MIN)
    }

    /// `Some(retry_after)` (at least a second) when an address with these failures is refused now.
    pub fn blocked(&self, recent: RecentFailures, now: Timestamp) -> Option<Duration> {
        if recent.count < u64::from(self.max_failures) {
            return None;
        }
        let oldest = recent.oldest.unwrap_or(now);
        let aged = Duration::try_from(now.duration_since(oldest)).unwrap_or(Duration::ZERO);
        Some(self.window.saturating_sub(aged).max(Duration::from_secs(1)))
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
        let empty = TokenHash::from_file(&file).expect_err("empty");
        assert!(empty.to_string().contains("empty token"), "{empty}");
        std::fs::write(&file, "short\n").expect("write");
        let short = TokenHash::from_file(&file).expect_err("short");
        let short = short.to_string();
        assert!(
            short.contains("too short (5 bytes, at least 16)") && short.contains("admin-token"),
            "the error names the file: {short}"
        );
        std::fs::write(&file, "ééééééé\n").expect("write");
        let multibyte = TokenHash::from_file(&file).expect_err("14 bytes");
        assert!(multibyte.to_string().contains("(14 bytes"), "{multibyte}");
        std::fs::write(&file, "REPLACE-ME-with-an-admin-token-of-its-own\n").expect("write");
        let placeholder = TokenHash::from_file(&file).expect_err("placeholder");
        assert!(
            placeholder.to_string().contains("REPLACE-ME placeholder"),
            "{placeholder}"
        );
        std::fs::write(&file, "0123456789abcdef\n").expect("write");
        assert!(TokenHash::from_file(&file).is_ok_and(|h| h.verify("0123456789abcdef")));
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
        assert_eq!(bearer(Some(b"bearer  abc ")).as_deref(), Some("abc"));
        assert_eq!(
            bearer(Some(b"Basic YW55OnRvaw==")),
            None,
            "the admin endpoints take no Basic credentials"
        );
    }

    #[test]
    fn an_address_is_refused_after_too_many_failures_until_the_oldest_ages_out() {
        let policy = FailurePolicy {
            max_failures: 3,
            window: Duration::from_secs(60),
        };
        let t0: Timestamp = "2026-12-04T12:00:00Z".parse().expect("time");
        let at = |s: i64| t0 + SignedDuration::from_secs(s);
        let recent = |count, oldest| RecentFailures {
            count,
            oldest: Some(oldest),
        };
        assert_eq!(policy.blocked(RecentFailures::default(), t0), None);
        assert_eq!(
            policy.blocked(recent(2, t0), at(10)),
            None,
            "below the limit"
        );
        assert_eq!(
            policy.blocked(recent(3, t0), at(10)),
            Some(Duration::from_secs(50)),
            "refused until the oldest failure is a window old"
        );
        assert_eq!(
            policy.blocked(recent(3, t0), at(60)),
            Some(Duration::from_secs(1)),
            "never told to retry at once while still over the limit"
        );
        assert_eq!(policy.window_start(at(60)), t0);
        assert_eq!(
            policy.window_start(Timestamp::MIN),
            Timestamp::MIN,
            "no underflow"
        );
    }
}
