//! Fleet status as pure functions: what the server says about each cluster, and the fleet roll-up.
//!
//! Input is what the database holds about a cluster ([`ClusterFacts`]: when it was last heard from, the
//! interval it promised, the state it last reported) and the clock (`now`, passed in so tests control it).
//! Output is a [`ClusterState`]: the agent's own [`SyncState`] while the cluster keeps reporting, `Unknown`
//! once no heartbeat arrived within the grace period (by default 3 × the cluster's own interval) — shown with
//! the heartbeat's age and the last reported state, never as Synced — and `NeverSeen` for a cluster that
//! enrolled but never sent a heartbeat. The page, the JSON API, `/metrics`, notifications and `windvane
//! status` all read states from here.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use windvane_shared::spec::selector::LabelSelector;
use windvane_shared::wire::status::SyncState;

/// The agent interval assumed when a cluster has not said (it always says in a heartbeat).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);
/// The grace period is this many of the cluster's own heartbeat intervals.
pub const GRACE_INTERVALS: u32 = 3;

pub use windvane_shared::wire::fleet_api::ClusterState;

/// States that page someone when a cluster enters them (and whose end is a recovery).
pub fn is_alerting(state: ClusterState) -> bool {
    matches!(
        state,
        ClusterState::Failed
            | ClusterState::Degraded
            | ClusterState::Contested
            | ClusterState::OutOfSync
            | ClusterState::Unknown
    )
}

/// Reads a reported state name as stored in the database.
pub fn parse_sync_state(text: &str) -> Option<SyncState> {
    SyncState::ALL.into_iter().find(|s| s.as_str() == text)
}

/// What the status functions need to know about one cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterFacts {
    /// When the server accepted the last heartbeat (server clock); `None` when never.
    pub last_seen: Option<Timestamp>,
    /// The heartbeat interval the agent announced in its last heartbeat.
    pub interval: Option<Duration>,
    /// The state the agent last reported.
    pub reported: Option<SyncState>,
}

/// The server's verdict on one cluster at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub state: ClusterState,
    /// Time since the last heartbeat (zero if the server's clock is behind the stored time).
    pub heartbeat_age: Option<Duration>,
    /// The grace period that applied.
    pub grace: Duration,
    /// The last state the agent reported (shown next to Unknown).
    pub last_reported: Option<SyncState>,
}

/// The grace period before a silent cluster is Unknown: `unknown_after` when the operator set one, else
/// [`GRACE_INTERVALS`] × the cluster's own interval.
pub fn grace_period(interval: Option<Duration>, unknown_after: Option<Duration>) -> Duration {
    unknown_after.unwrap_or_else(|| {
        interval
            .unwrap_or(DEFAULT_INTERVAL)
            .saturating_mul(GRACE_INTERVALS)
    })
}

/// Decides a cluster's state at `now`.
pub fn verdict(facts: &ClusterFacts, now: Timestamp, unknown_after: Option<Duration>) -> Verdict {
    let grace = grace_period(facts.interval, unknown_after);
    let Some(last_seen) = facts.last_seen else {
        return Verdict {
            state: ClusterState::NeverSeen,
            heartbeat_age: None,
            grace,
            last_reported: None,
        };
    };
    let age = age_between(last_seen, now);
    let state = match facts.reported {
        Some(reported) if age <= grace => ClusterState::from_reported(reported),
        // A heartbeat row without a state cannot happen; treat it as silence rather than as health.
        _ => ClusterState::Unknown,
    };
    Verdict {
        state,
        heartbeat_age: Some(age),
        grace,
        last_reported: facts.reported,
    }
}

/// `now - then`, or zero when `then` is in the future.
pub fn age_between(then: Timestamp, now: Timestamp) -> Duration {
    let millis = now.as_millisecond().saturating_sub(then.as_millisecond());
    Duration::from_millis(u64::try_from(millis).unwrap_or(0))
}

/// Counts per state, every state present (zero when none), in [`ClusterState::ALL`] order.
pub fn rollup(states: impl IntoIterator<Item = ClusterState>) -> Vec<(ClusterState, u64)> {
    let mut counts: BTreeMap<ClusterState, u64> =
        ClusterState::ALL.iter().map(|s| (*s, 0)).collect();
    for state in states {
        *counts.entry(state).or_default() += 1;
    }
    ClusterState::ALL.iter().map(|s| (*s, counts[s])).collect()
}

/// Which clusters a page, API call or `windvane status` shows: a label selector and a set of states (both
/// optional; an empty filter selects everything).
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub selector: Option<LabelSelector>,
    pub states: Vec<ClusterState>,
}

impl Filter {
    /// Parses the `selector` and `state` query parameters (`state` may be comma-separated).
    pub fn parse(selector: Option<&str>, states: &[&str]) -> crate::Result<Filter> {
        let selector = match selector.map(str::trim).filter(|s| !s.is_empty()) {
            Some(text) => {
                Some(
                    LabelSelector::parse(text).map_err(|source| crate::Error::Selector {
                        selector: text.to_owned(),
                        source,
                    })?,
                )
            }
            None => None,
        };
        let mut parsed = Vec::new();
        for text in states
            .iter()
            .flat_map(|s| s.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            let state = ClusterState::parse(text).ok_or_else(|| crate::Error::UnknownState {
                state: text.to_owned(),
            })?;
            if !parsed.contains(&state) {
                parsed.push(state);
            }
        }
        Ok(Filter {
            selector,
            states: parsed,
        })
    }

    /// Whether the labels match the selector (the roll-up counts use only this).
    pub fn matches_labels(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selector.as_ref().is_none_or(|s| s.matches(labels))
    }

    /// Whether a cluster with these labels and this state is shown.
    pub fn matches(&self, labels: &BTreeMap<String, String>, state: ClusterState) -> bool {
        self.matches_labels(labels) && (self.states.is_empty() || self.states.contains(&state))
    }
}

/// The states a `state` filter may name, for messages.
pub fn state_names() -> String {
    let names: Vec<&str> = ClusterState::ALL.iter().map(|s| s.as_str()).collect();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("valid")
    }

    fn facts(last_seen: Option<i64>, interval: u64, reported: Option<SyncState>) -> ClusterFacts {
        ClusterFacts {
            last_seen: last_seen.map(at),
            interval: Some(Duration::from_secs(interval)),
            reported,
        }
    }

    #[test]
    fn a_fresh_cluster_shows_what_it_reported() {
        for reported in SyncState::ALL {
            let v = verdict(&facts(Some(0), 30, Some(reported)), at(10), None);
            assert_eq!(v.state, ClusterState::from_reported(reported));
            assert_eq!(v.heartbeat_age, Some(Duration::from_secs(10)));
        }
    }

    #[test]
    fn silence_beyond_three_intervals_is_unknown_never_synced() {
        let f = facts(Some(0), 30, Some(SyncState::Synced));
        assert_eq!(
            verdict(&f, at(90), None).state,
            ClusterState::Synced,
            "exactly at the grace period"
        );
        let v = verdict(&f, at(91), None);
        assert_eq!(v.state, ClusterState::Unknown);
        assert_eq!(v.last_reported, Some(SyncState::Synced));
        assert_eq!(v.heartbeat_age, Some(Duration::from_secs(91)));
        assert_eq!(v.grace, Duration::from_secs(90));
    }

    #[test]
    fn the_grace_period_follows_each_clusters_own_interval() {
        let slow = facts(Some(0), 300, Some(SyncState::Synced));
        assert_eq!(verdict(&slow, at(600), None).state, ClusterState::Synced);
        assert_eq!(verdict(&slow, at(901), None).state, ClusterState::Unknown);
        let no_interval = ClusterFacts {
            interval: None,
            ..slow
        };
        assert_eq!(
            verdict(&no_interval, at(91), None).state,
            ClusterState::Unknown
        );
    }

    #[test]
    fn unknown_after_overrides_the_interval_rule() {
        let f = facts(Some(0), 30, Some(SyncState::Degraded));
        let override_ = Some(Duration::from_secs(5));
        assert_eq!(verdict(&f, at(5), override_).state, ClusterState::Degraded);
        let v = verdict(&f, at(6), override_);
        assert_eq!(
            (v.state, v.last_reported),
            (ClusterState::Unknown, Some(SyncState::Degraded))
        );
    }

    #[test]
    fn enrolled_but_silent_is_never_seen() {
        let v = verdict(&facts(None, 30, None), at(1_000_000), None);
        assert_eq!(v.state, ClusterState::NeverSeen);
        assert_eq!(v.heartbeat_age, None);
    }

    #[test]
    fn a_clock_behind_the_stored_time_gives_age_zero() {
        let v = verdict(&facts(Some(100), 30, Some(SyncState::Synced)), at(50), None);
        assert_eq!(v.heartbeat_age, Some(Duration::ZERO));
        assert_eq!(v.state, ClusterState::Synced);
    }

    #[test]
    fn rollup_counts_every_state_in_order() {
        use ClusterState::*;
        let counts = rollup([Synced, Unknown, Synced, NeverSeen, Failed]);
        assert_eq!(counts.len(), ClusterState::ALL.len());
        assert_eq!(counts[0], (Failed, 1));
        assert!(counts.contains(&(Synced, 2)));
        assert!(counts.contains(&(Unknown, 1)));
        assert!(counts.contains(&(Degraded, 0)));
        assert_eq!(counts.last(), Some(&(NeverSeen, 1)));
    }

    #[test]
    fn state_names_round_trip() {
        for state in SyncState::ALL {
            assert_eq!(parse_sync_state(state.as_str()), Some(state));
        }
    }

    #[test]
    fn filters_by_selector_and_state() {
        let labels: BTreeMap<String, String> = [
            ("env".to_owned(), "prod".to_owned()),
            ("region".to_owned(), "eu".to_owned()),
        ]
        .into();
        let filter =
            Filter::parse(Some("env=prod,region in (eu,us)"), &["Unknown,Failed"]).expect("parse");
        assert!(filter.matches(&labels, ClusterState::Unknown));
        assert!(!filter.matches(&labels, ClusterState::Synced));
        assert!(filter.matches_labels(&labels));
        let other = Filter::parse(Some("env=staging"), &[]).expect("parse");
        assert!(!other.matches(&labels, ClusterState::Synced));
        assert!(Filter::default().matches(&labels, ClusterState::NeverSeen));
        assert!(
            Filter::parse(None, &["Sideways"])
                .unwrap_err()
                .to_string()
                .starts_with("unknown state \"Sideways\"; use one of ")
        );
        assert!(Filter::parse(Some("env in (prod"), &[]).is_err());
    }

    #[test]
    fn alerting_states() {
        use ClusterState::*;
        let alerting: Vec<_> = ClusterState::ALL
            .into_iter()
            .filter(|s| is_alerting(*s))
            .collect();
        assert_eq!(
            alerting,
            vec![Failed, Degraded, Contested, OutOfSync, Unknown]
        );
    }
}
