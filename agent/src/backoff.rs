//! Retry timing: exponential backoff with full jitter after failures, and ±jitter on regular intervals, so
//! that a fleet of agents spreads its load on the source and the API server instead of moving in step.
//! Pure given a random number; [`random_unit`] supplies one from the OS.

use std::time::Duration;

/// Exponential backoff with full jitter: a uniformly random wait in `[0, min(cap, base × 2^attempt)]`,
/// never less than `base / 10` so a hot failure loop cannot spin. `unit` is a random number in `[0, 1)`.
pub fn full_jitter(attempt: u32, base: Duration, cap: Duration, unit: f64) -> Duration {
    let ceiling = base
        .saturating_mul(2u32.saturating_pow(attempt.min(30)))
        .min(cap);
    ceiling.mul_f64(unit.clamp(0.0, 1.0)).max(base / 10)
}

/// `interval` moved by up to ±`fraction` of itself: `unit` 0 gives the shortest, 1 the longest.
pub fn jittered(interval: Duration, fraction: f64, unit: f64) -> Duration {
    let factor = 1.0 + fraction * (2.0 * unit.clamp(0.0, 1.0) - 1.0);
    interval.mul_f64(factor.max(0.0))
}

/// The wait after a server answered "busy" with `Retry-After`: at least what it asked, plus up to half of it
/// again so that agents refused together do not come back together; never shorter than the backoff the
/// failure count alone would give.
pub fn after_busy(retry_after: Duration, backoff: Duration, unit: f64) -> Duration {
    retry_after
        .mul_f64(1.0 + 0.5 * unit.clamp(0.0, 1.0))
        .max(backoff)
}

/// A random number in `[0, 1)` from the operating system (falls back to the clock's nanoseconds, which is
/// enough to de-synchronize agents).
pub fn random_unit() -> f64 {
    let bits = getrandom::u64().unwrap_or_else(|_| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos().into())
    });
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_then_caps() {
        let base = Duration::from_millis(100);
        let cap = Duration::from_secs(5);
        assert_eq!(full_jitter(0, base, cap, 1.0), base);
        assert_eq!(full_jitter(3, base, cap, 1.0), Duration::from_millis(800));
        assert_eq!(full_jitter(20, base, cap, 1.0), cap);
        assert_eq!(
            full_jitter(20, base, cap, 0.0),
            base / 10,
            "never a zero wait"
        );
    }

    #[test]
    fn a_busy_answer_is_honoured_and_spread() {
        let asked = Duration::from_secs(5);
        let short = Duration::from_millis(300);
        assert_eq!(
            after_busy(asked, short, 0.0),
            asked,
            "never sooner than asked"
        );
        assert_eq!(after_busy(asked, short, 1.0), Duration::from_millis(7_500));
        assert_eq!(
            after_busy(asked, Duration::from_secs(40), 0.5),
            Duration::from_secs(40),
            "a longer backoff wins"
        );
    }

    #[test]
    fn jitter_stays_within_the_fraction() {
        let interval = Duration::from_secs(30);
        assert_eq!(jittered(interval, 0.2, 0.0), Duration::from_secs(24));
        assert_eq!(jittered(interval, 0.2, 0.5), interval);
        assert_eq!(jittered(interval, 0.2, 1.0), Duration::from_secs(36));
        let r = random_unit();
        assert!((0.0..1.0).contains(&r));
    }
}
