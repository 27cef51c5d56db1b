//! The engine's own deadlines in one value, after the idea of kube-runtime's scheduler: the backstop (a
//! periodic dry-run of every object, jittered) and the retry of a sync that did not complete (full-jitter
//! back-off). The engine's loop asks it what is due and when to wake next; the healer's grace, hold and
//! back-off timers are folded in at that moment. Pure: `now` and the random unit come in as arguments, so the
//! schedule is tested without a clock.

use std::time::{Duration, Instant};

use crate::backoff::{full_jitter, jittered};
use crate::clamp;

/// First and longest wait before a failed sync is tried again.
const RETRY_BASE: Duration = Duration::from_secs(1);
const RETRY_CAP: Duration = Duration::from_secs(300);
/// Longest wait before apps waiting for their dependencies are looked at again.
pub const RECHECK_CAP: Duration = Duration::from_secs(10);
/// The backstop's interval varies by this fraction either way, so that a fleet's backstops spread out.
const BACKSTOP_JITTER: f64 = 0.2;

/// What a sync asks of the loop, as a kube reconciler returns its `Action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Everything applied and pruned: wait for a change, a new release or the backstop.
    Idle,
    /// Something failed or waits (an object, a render, a prune): sync again after a back-off.
    Retry,
    /// Nothing failed, but apps wait for their dependencies to become healthy (`dependsOn`): sync again
    /// soon, the back-off growing only to [`RECHECK_CAP`], so that they follow shortly after.
    Recheck,
}

/// A pending retry: how many have failed in a row, and when the next is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Retry {
    attempt: u32,
    at: Instant,
}

/// The engine's deadlines.
#[derive(Debug, Clone)]
pub struct Timers {
    backstop_every: Duration,
    backstop_at: Instant,
    retry: Option<Retry>,
    /// When a maintenance window turns healing off or on again for some app: the release is synced then.
    policy_at: Option<Instant>,
}

impl Timers {
    /// The first backstop one jittered interval from `now`; no retry pending.
    pub fn new(backstop_every: Duration, now: Instant, unit: f64) -> Self {
        Self {
            backstop_every,
            backstop_at: clamp::after(now, jittered(backstop_every, BACKSTOP_JITTER, unit)),
            retry: None,
            policy_at: None,
        }
    }

    pub fn backstop_due(&self, now: Instant) -> bool {
        now >= self.backstop_at
    }

    /// The backstop ran: the next one a jittered interval later.
    pub fn backstop_ran(&mut self, now: Instant, unit: f64) {
        self.backstop_at = clamp::after(now, jittered(self.backstop_every, BACKSTOP_JITTER, unit));
    }

    pub fn retry_due(&self, now: Instant) -> bool {
        self.retry.is_some_and(|retry| now >= retry.at)
    }

    /// A sync finished and asks for `next`: a retry is scheduled (its back-off growing with each failure in
    /// a row) or cleared.
    pub fn synced(&mut self, next: Next, now: Instant, unit: f64) {
        self.retry = match next {
            Next::Idle => None,
            Next::Retry | Next::Recheck => {
                let attempt = self
                    .retry
                    .map_or(0, |retry| retry.attempt.saturating_add(1));
                let cap = if next == Next::Recheck {
                    RECHECK_CAP
                } else {
                    RETRY_CAP
                };
                let wait = full_jitter(attempt, RETRY_BASE, cap, unit);
                Some(Retry {
                    attempt,
                    at: clamp::after(now, wait),
                })
            }
        };
    }

    /// The next time a maintenance window changes an app's healing policy (`None`: none is coming).
    pub fn policy_changes_at(&mut self, at: Option<Instant>) {
        self.policy_at = at;
    }

    /// True when a window changed a healing policy: the release is to be synced again (once).
    pub fn take_policy_due(&mut self, now: Instant) -> bool {
        let due = self.policy_at.is_some_and(|at| now >= at);
        if due {
            self.policy_at = None;
        }
        due
    }

    /// A new release arrived: failures of the previous one no longer count toward the back-off.
    pub fn new_release(&mut self) {
        self.retry = None;
    }

    /// The earliest deadline: the backstop, the retry, or the healer's next timer.
    pub fn next_wake(&self, heal: Option<Instant>) -> Instant {
        [
            Some(self.backstop_at),
            self.retry.map(|retry| retry.at),
            self.policy_at,
            heal,
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(self.backstop_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn the_backstop_comes_round_within_its_jitter() {
        let start = Instant::now();
        let early = Timers::new(HOUR, start, 0.0);
        let late = Timers::new(HOUR, start, 1.0);
        assert!(!early.backstop_due(start + HOUR.mul_f64(0.79)));
        assert!(early.backstop_due(start + HOUR.mul_f64(0.8)));
        assert!(!late.backstop_due(start + HOUR.mul_f64(1.19)));
        assert!(late.backstop_due(start + HOUR.mul_f64(1.2)));

        let mut timers = early;
        let ran = start + HOUR;
        timers.backstop_ran(ran, 0.5);
        assert!(!timers.backstop_due(ran + HOUR - Duration::from_millis(1)));
        assert!(timers.backstop_due(ran + HOUR));
    }

    #[test]
    fn failed_syncs_back_off_and_a_complete_one_clears_the_retry() {
        let start = Instant::now();
        let mut timers = Timers::new(HOUR, start, 0.5);
        assert!(!timers.retry_due(start + HOUR));
        // With the random unit at 1 the full-jitter wait is its ceiling: 1 s, 2 s, 4 s … capped at 300 s.
        let mut now = start;
        for ceiling in [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300] {
            timers.synced(Next::Retry, now, 1.0);
            let ceiling = Duration::from_secs(ceiling);
            assert!(
                !timers.retry_due(now + ceiling - Duration::from_millis(1)),
                "{ceiling:?}"
            );
            assert!(timers.retry_due(now + ceiling), "{ceiling:?}");
            now += ceiling;
        }
        timers.synced(Next::Idle, now, 1.0);
        assert!(!timers.retry_due(now + HOUR * 24));
    }

    #[test]
    fn apps_waiting_for_dependencies_are_looked_at_again_within_the_recheck_cap() {
        let start = Instant::now();
        let mut timers = Timers::new(HOUR, start, 0.5);
        let mut now = start;
        for ceiling in [1, 2, 4, 8, 10, 10, 10] {
            timers.synced(Next::Recheck, now, 1.0);
            let ceiling = Duration::from_secs(ceiling);
            assert!(!timers.retry_due(now + ceiling - Duration::from_millis(1)));
            assert!(timers.retry_due(now + ceiling), "{ceiling:?}");
            now += ceiling;
        }
        timers.synced(Next::Idle, now, 1.0);
        assert!(!timers.retry_due(now + HOUR / 2));
    }

    #[test]
    fn a_window_changing_the_healing_policy_wakes_the_loop_once() {
        let start = Instant::now();
        let mut timers = Timers::new(HOUR, start, 0.5);
        let change = start + Duration::from_secs(90);
        timers.policy_changes_at(Some(change));
        assert_eq!(timers.next_wake(None), change);
        assert!(!timers.take_policy_due(change - Duration::from_millis(1)));
        assert!(timers.take_policy_due(change));
        assert!(!timers.take_policy_due(change + HOUR / 4), "only once");
        assert_ne!(timers.next_wake(None), change);
    }

    #[test]
    fn a_new_release_starts_the_back_off_again() {
        let start = Instant::now();
        let mut timers = Timers::new(HOUR, start, 0.5);
        for _ in 0..5 {
            timers.synced(Next::Retry, start, 1.0);
        }
        timers.new_release();
        timers.synced(Next::Retry, start, 1.0);
        assert!(timers.retry_due(start + Duration::from_secs(1)));
    }

    #[test]
    fn the_loop_wakes_at_the_earliest_deadline() {
        let start = Instant::now();
        let mut timers = Timers::new(HOUR, start, 0.5);
        let backstop = start + HOUR;
        assert_eq!(timers.next_wake(None), backstop);
        let heal = start + Duration::from_secs(30);
        assert_eq!(timers.next_wake(Some(heal)), heal);
        timers.synced(Next::Retry, start, 1.0);
        assert_eq!(timers.next_wake(Some(heal)), start + Duration::from_secs(1));
        assert_eq!(
            timers.next_wake(Some(start + HOUR * 2)),
            start + Duration::from_secs(1)
        );
    }
}
