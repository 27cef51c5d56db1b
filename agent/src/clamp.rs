//! Every number the agent takes from the network, made safe in one place: the waits a store or the server asks
//! for (`Retry-After`, `nextIntervalSeconds`), the sizes of the replies it reads, and the deadlines built from
//! them. The source client ([`crate::fetch::source`]), the fetcher's poll loop ([`crate::fetch::fetcher`]), the
//! engine ([`crate::engine`]) and the heartbeat reporter ([`crate::report::heartbeat`]) take their numbers from
//! here, never raw. Pure.
//!
//! A hostile or broken peer can send any bytes: a wait of `u64::MAX` seconds (which once overflowed
//! `Instant + Duration` and crash-looped the agent), zero (a hot loop), a date in the past or the far
//! future, or words. Each is mapped into a range that keeps the agent working and the peer's load bounded.

use std::time::{Duration, Instant};

use jiff::Timestamp;

/// The shortest wait a `Retry-After` can ask for: a peer saying "0" must not make the agent spin.
pub const MIN_RETRY_AFTER: Duration = Duration::from_secs(1);
/// The longest wait a `Retry-After` can ask for: a peer cannot silence the agent for longer than this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);
/// The wait when a 429/503 says nothing usable.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(30);
/// The shortest heartbeat interval the server can ask for.
pub const MIN_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
/// The longest heartbeat interval the server can ask for (a server cannot make a cluster go silent).
pub const MAX_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(3600);
/// The longest wait any timer of the agent is set for, whatever computed it.
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);
/// The most bytes of a reply from the source server (enrolment, heartbeat) the agent reads: both replies
/// are a few small JSON fields.
pub const MAX_REPLY_BYTES: u64 = 64 * 1024;
/// The most characters of a peer's error body quoted in a log line or status.
pub const MAX_QUOTED_CHARS: usize = 200;

/// The wait a `Retry-After` header value asks for, in `[MIN_RETRY_AFTER, MAX_RETRY_AFTER]`: delay-seconds
/// (`120`, any number of digits) or an HTTP-date (`Wed, 21 Oct 2015 07:28:00 GMT`, counted from `now`);
/// [`DEFAULT_RETRY_AFTER`] when the header is missing or is neither.
pub fn retry_after(value: Option<&[u8]>, now: Timestamp) -> Duration {
    let Some(text) = value
        .and_then(|v| std::str::from_utf8(v).ok())
        .map(str::trim)
    else {
        return DEFAULT_RETRY_AFTER;
    };
    let asked = if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        // More digits than a u64 holds is still "a very long time".
        Duration::from_secs(text.parse::<u64>().unwrap_or(u64::MAX))
    } else if let Ok(at) = jiff::fmt::rfc2822::DateTimeParser::new().parse_timestamp(text) {
        let seconds = at.as_second().saturating_sub(now.as_second());
        Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
    } else {
        return DEFAULT_RETRY_AFTER;
    };
    asked.clamp(MIN_RETRY_AFTER, MAX_RETRY_AFTER)
}

/// The heartbeat interval the server asked for, in `[MIN_HEARTBEAT_INTERVAL, MAX_HEARTBEAT_INTERVAL]`.
pub fn heartbeat_interval(next_interval_seconds: u64) -> Duration {
    Duration::from_secs(next_interval_seconds).clamp(MIN_HEARTBEAT_INTERVAL, MAX_HEARTBEAT_INTERVAL)
}

/// `now + wait`, with the wait capped at [`MAX_WAIT`]: never an overflow, whatever computed the wait.
pub fn after(now: Instant, wait: Duration) -> Instant {
    let wait = wait.min(MAX_WAIT);
    now.checked_add(wait).unwrap_or(now)
}

/// [`after`] for tokio's clock (the reporter's timers, which tests may pause).
pub fn after_tokio(now: tokio::time::Instant, wait: Duration) -> tokio::time::Instant {
    tokio::time::Instant::from_std(after(now.into_std(), wait))
}

/// A peer's error body as a log line may quote it: lossy UTF-8, control characters replaced, at most
/// [`MAX_QUOTED_CHARS`] characters.
pub fn quoted(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut out: String = text
        .trim()
        .chars()
        .take(MAX_QUOTED_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.trim().chars().count() > MAX_QUOTED_CHARS {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        "2026-05-01T12:00:00Z".parse().unwrap()
    }

    fn retry(value: &str) -> Duration {
        retry_after(Some(value.as_bytes()), now())
    }

    #[test]
    fn retry_after_in_seconds_is_honoured_within_bounds() {
        assert_eq!(retry("7"), Duration::from_secs(7));
        assert_eq!(retry(" 120 "), Duration::from_secs(120));
        assert_eq!(retry("0"), MIN_RETRY_AFTER, "zero would be a hot loop");
        assert_eq!(retry("18446744073709551615"), MAX_RETRY_AFTER);
        assert_eq!(retry("99999999999999999999999999999"), MAX_RETRY_AFTER);
        assert_eq!(retry("3601"), MAX_RETRY_AFTER);
    }

    #[test]
    fn retry_after_that_is_no_number_waits_the_default() {
        for hostile in ["-5", "", " ", "1.5", "soon", "+3", "1e9", "0x10", "٣"] {
            assert_eq!(retry(hostile), DEFAULT_RETRY_AFTER, "{hostile:?}");
        }
        assert_eq!(retry_after(None, now()), DEFAULT_RETRY_AFTER);
        assert_eq!(
            retry_after(Some(b"\xff\xfe"), now()),
            DEFAULT_RETRY_AFTER,
            "not UTF-8"
        );
    }

    #[test]
    fn retry_after_as_an_http_date_counts_from_now() {
        assert_eq!(
            retry("Fri, 01 May 2026 12:02:00 GMT"),
            Duration::from_secs(120)
        );
        assert_eq!(
            retry("Fri, 01 May 2026 11:00:00 GMT"),
            MIN_RETRY_AFTER,
            "a date in the past: come back soon, not never"
        );
        assert_eq!(retry("Thu, 31 Dec 2099 23:59:59 GMT"), MAX_RETRY_AFTER);
        assert_eq!(
            retry("Mon, 01 May 2026 12:02:00 GMT"),
            DEFAULT_RETRY_AFTER,
            "a wrong weekday is no date"
        );
    }

    #[test]
    fn the_server_s_heartbeat_interval_is_bounded() {
        assert_eq!(heartbeat_interval(0), MIN_HEARTBEAT_INTERVAL);
        assert_eq!(heartbeat_interval(30), Duration::from_secs(30));
        assert_eq!(heartbeat_interval(u64::MAX), MAX_HEARTBEAT_INTERVAL);
    }

    #[test]
    fn deadlines_never_overflow() {
        let now = Instant::now();
        assert_eq!(
            after(now, Duration::from_secs(5)),
            now + Duration::from_secs(5)
        );
        assert_eq!(after(now, Duration::MAX), now + MAX_WAIT);
        assert_eq!(after(now, Duration::from_secs(u64::MAX)), now + MAX_WAIT);
        let tokio_now = tokio::time::Instant::now();
        assert_eq!(after_tokio(tokio_now, Duration::MAX), tokio_now + MAX_WAIT);
    }

    #[test]
    fn quoted_bodies_are_short_and_printable() {
        assert_eq!(quoted(b"  conflict\n"), "conflict");
        assert_eq!(quoted(b"a\x1b[31mb"), "a [31mb");
        let long = quoted(&[b'x'; 10_000]);
        assert_eq!(long.chars().count(), MAX_QUOTED_CHARS + 1);
        assert!(long.ends_with('…'));
        assert_eq!(quoted(b"\xff"), "\u{fffd}");
    }
}
