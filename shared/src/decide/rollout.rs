//! Progressive rollouts, as pure functions over the signed release: which wave a cluster is in, when each
//! wave opens, whether a cluster may take a release now, and the rollout view that the server shows and
//! agents read for their gate.
//!
//! The plan comes from `fleet.yaml`'s `rollout:` section (read by `windvane_publisher::source`) into the bundle, and
//! `windvane publish` copies it into the signed channel pointer ([`crate::format::release::ReleasePointer::rollout`]):
//! the store and the server cannot alter it. Every agent computes its own wave from the plan and its identity
//! ([`wave_of`]), the time its wave opens from the release's issue time ([`opens_at`]), and decides with
//! [`decide`]. The server builds a [`RolloutView`] from its fleet status ([`rollout_view`]); an agent whose
//! earlier waves have `gate: healthy` opens only once that view shows them done ([`gate_ready`]). The server
//! can thereby only delay a wave, never open one before its signed time.

use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::spec::rollout::{Gate, MAX_SOAK, Rollout};
use crate::spec::selector::Labels;
use crate::wire::fleet_api::ClusterState;
use crate::wire::heartbeat::PendingReport;

/// Basis points in a whole: a cluster's [`bucket`] is below this.
pub const BUCKETS: u32 = 10_000;

/// A cluster's place in the hash space, in basis points `0..BUCKETS`: the first eight bytes of the SHA-256
/// of its name. Stable across releases, versions and machines.
pub fn bucket(cluster: &str) -> u32 {
    let digest = Sha256::digest(cluster.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let point = u64::from_be_bytes(first);
    ((u128::from(point) * u128::from(BUCKETS)) >> 64) as u32
}

/// The 0-based wave of a cluster: the first wave whose selector matches its labels and whose percent its
/// bucket falls below. A cluster in no wave is in the implicit last wave, `waves.len()`, which opens after
/// the last one's soak.
pub fn wave_of(rollout: &Rollout, name: &str, labels: &Labels) -> usize {
    let point = bucket(name);
    rollout
        .waves
        .iter()
        .position(|wave| {
            wave.selector.matches(labels)
                && point < wave.percent.unwrap_or(100).min(100) * (BUCKETS / 100)
        })
        .unwrap_or(rollout.waves.len())
}

/// How many waves there are, counting the implicit last one when some cluster may fall in it (the last
/// declared wave does not take every cluster).
pub fn wave_count(rollout: &Rollout) -> usize {
    let catch_all = rollout
        .waves
        .last()
        .is_some_and(|w| w.selector.is_empty() && w.percent.unwrap_or(100) >= 100);
    rollout.waves.len() + usize::from(!catch_all)
}

/// When wave `wave` (0-based) opens: the release's issue time plus the soaks of every earlier wave, each
/// clamped to [`MAX_SOAK`] and the sum saturating (a pointer the server reads unverified may say anything;
/// a time past what a timestamp holds is "never", [`Timestamp::MAX`]).
pub fn opens_at(rollout: &Rollout, issued_at: Timestamp, wave: usize) -> Timestamp {
    let soak = rollout
        .waves
        .iter()
        .take(wave)
        .fold(Duration::ZERO, |sum, w| {
            sum.saturating_add(w.soak.min(MAX_SOAK))
        });
    let soak = jiff::SignedDuration::try_from(soak).unwrap_or(jiff::SignedDuration::MAX);
    issued_at.checked_add(soak).unwrap_or(Timestamp::MAX)
}

/// Whether this cluster may take the release now, and if not, why and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaveDecision {
    /// Take it.
    Open,
    /// The publisher halted the rollout before this wave.
    Halted,
    /// The wave opens at this time (signed schedule).
    Scheduled { opens_at: Timestamp },
    /// The time has come, but an earlier wave's gate holds it: why.
    Gated { reason: String },
}

/// What the agent knows of the earlier waves from the server, for a gate.
#[derive(Debug, Clone, PartialEq)]
pub enum GateInput<'a> {
    /// Not asked (no gate needed, or not yet time).
    NotAsked,
    /// The server's rollout view.
    View(&'a RolloutView),
    /// The server could not be asked or gave nothing usable: why. A gate then stays closed.
    Unreachable(&'a str),
}

/// Whether the cluster in wave `wave` may take release `serial`: the first wave opens at issue; a later one
/// at its [`opens_at`], not halted, and — when an earlier wave has `gate: healthy` — once [`gate_ready`].
pub fn decide(
    rollout: &Rollout,
    serial: u64,
    issued_at: Timestamp,
    wave: usize,
    now: Timestamp,
    gate: &GateInput<'_>,
) -> WaveDecision {
    if wave == 0 {
        return WaveDecision::Open;
    }
    if rollout.halted {
        return WaveDecision::Halted;
    }
    let opens = opens_at(rollout, issued_at, wave);
    if now < opens {
        return WaveDecision::Scheduled { opens_at: opens };
    }
    if !needs_gate(rollout, wave) {
        return WaveDecision::Open;
    }
    match gate {
        GateInput::NotAsked => WaveDecision::Gated {
            reason: "waiting for the server's rollout status".to_owned(),
        },
        GateInput::Unreachable(why) => WaveDecision::Gated {
            reason: format!("cannot read the rollout status from the server ({why}); waiting"),
        },
        GateInput::View(view) => match gate_ready(rollout, serial, wave, view) {
            GateVerdict::Ready => WaveDecision::Open,
            held => WaveDecision::Gated {
                reason: held.to_string(),
            },
        },
    }
}

/// Whether any wave before `wave` has `gate: healthy`.
pub fn needs_gate(rollout: &Rollout, wave: usize) -> bool {
    rollout
        .waves
        .iter()
        .take(wave)
        .any(|w| w.gate == Gate::Healthy)
}

/// What the gate says of a wave, from the server's rollout view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateVerdict {
    /// Every cluster of every gated wave before it is done.
    Ready,
    /// The view is of another serial than the release waiting.
    OtherSerial { reported: u64, waiting: u64 },
    /// These clusters (`name (wave) is …`, or `N more of wave`) are not done.
    Held { holding: Vec<String> },
}

impl std::fmt::Display for GateVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GateVerdict::Ready => f.write_str("ready"),
            GateVerdict::OtherSerial { reported, waiting } => write!(
                f,
                "the server reports serial {reported} for the channel, not {waiting}; waiting"
            ),
            GateVerdict::Held { holding } => write!(f, "held by the gate: {}", holding.join(", ")),
        }
    }
}

/// [`GateVerdict::Ready`] when every cluster of every gated wave before `wave` is done on `serial` in `view`;
/// otherwise which clusters hold it, and why.
pub fn gate_ready(rollout: &Rollout, serial: u64, wave: usize, view: &RolloutView) -> GateVerdict {
    if view.serial != serial {
        return GateVerdict::OtherSerial {
            reported: view.serial,
            waiting: serial,
        };
    }
    let mut holding = Vec::new();
    for (index, spec) in rollout.waves.iter().enumerate().take(wave) {
        if spec.gate != Gate::Healthy {
            continue;
        }
        let Some(shown) = view.waves.iter().find(|w| w.index == index) else {
            continue;
        };
        let mut listed = 0u64;
        for cluster in shown.clusters.iter().filter(|c| !c.done) {
            listed += 1;
            holding.push(format!(
                "{} ({}) is {}",
                cluster.name,
                spec.label(index),
                cluster.describe(serial)
            ));
        }
        // A summary lists only some of the clusters not done: its counts still hold the gate.
        let unlisted = shown.not_done().saturating_sub(listed);
        if unlisted > 0 {
            holding.push(format!("{unlisted} more of {} not done", spec.label(index)));
        }
    }
    if holding.is_empty() {
        GateVerdict::Ready
    } else {
        GateVerdict::Held { holding }
    }
}

/// How a cluster stands on a rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum RolloutPhase {
    /// Applied and Synced on the serial.
    Done,
    /// Failed, Degraded or Contested.
    Failed,
    /// Silent (Unknown) or never seen: not counted as done.
    Unknown,
    /// Not there yet (its wave has not opened, or it is applying).
    Pending,
}

/// One cluster in the rollout view.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WaveCluster {
    pub name: String,
    pub state: ClusterState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_serial: Option<u64>,
    pub phase: RolloutPhase,
    /// True when applied and Synced on the serial.
    pub done: bool,
    /// What the agent says it waits for (`Pending (wave 2, opens in 14m)`), when it reports waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
}

impl WaveCluster {
    fn describe(&self, serial: u64) -> String {
        match self.applied_serial {
            Some(applied) if applied >= serial => self.state.as_str().to_owned(),
            Some(applied) => format!("{} on serial {applied}", self.state),
            None => self.state.as_str().to_owned(),
        }
    }
}

/// One wave in the rollout view.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WaveView {
    /// 0-based.
    pub index: usize,
    pub name: String,
    pub opens_at: Timestamp,
    /// True once its signed time has come, not halted, and no gate holds it.
    pub opened: bool,
    /// Why a wave whose time has come does not open: the halt, or the clusters an earlier gate waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
    pub soak_seconds: u64,
    pub gate: Gate,
    pub done: u64,
    pub pending: u64,
    pub failed: u64,
    pub unknown: u64,
    pub clusters: Vec<WaveCluster>,
}

impl WaveView {
    /// Clusters of the wave not done (pending, failed or unknown), by the counts.
    pub fn not_done(&self) -> u64 {
        self.pending + self.failed + self.unknown
    }
}

/// Most clusters not done that a [`summary`] lists per wave.
pub const SUMMARY_LISTED: usize = 20;

/// What a waiting agent's gate needs of a view, in size O(waves) instead of O(fleet): every wave with its
/// counts, listing only its clusters not done, at most `listed` of them (`GET
/// /api/v1/rollouts/CHANNEL?summary=1`). [`gate_ready`] holds a wave on the counts as well as on the listed
/// clusters, so a summary opens a gate exactly when the full view would.
pub fn summary(view: &RolloutView, listed: usize) -> RolloutView {
    let waves = view
        .waves
        .iter()
        .map(|wave| WaveView {
            index: wave.index,
            name: wave.name.clone(),
            opens_at: wave.opens_at,
            opened: wave.opened,
            held: wave.held.clone(),
            soak_seconds: wave.soak_seconds,
            gate: wave.gate,
            done: wave.done,
            pending: wave.pending,
            failed: wave.failed,
            unknown: wave.unknown,
            clusters: wave
                .clusters
                .iter()
                .filter(|c| !c.done)
                .take(listed)
                .cloned()
                .collect(),
        })
        .collect();
    RolloutView {
        channel: view.channel.clone(),
        serial: view.serial,
        issued_at: view.issued_at,
        halted: view.halted,
        complete: view.complete,
        waves,
    }
}

/// A channel's rollout as the server sees it (`GET /api/v1/rollouts/CHANNEL`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutView {
    pub channel: String,
    pub serial: u64,
    pub issued_at: Timestamp,
    pub halted: bool,
    /// Every cluster of every wave done.
    pub complete: bool,
    pub waves: Vec<WaveView>,
}

/// A cluster as the server knows it, for [`rollout_view`].
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterFacts<'a> {
    pub name: &'a str,
    pub labels: &'a Labels,
    pub state: ClusterState,
    pub applied_serial: Option<u64>,
    pub waiting: Option<String>,
}

/// The phase of a cluster on `serial`.
pub fn phase(state: ClusterState, applied_serial: Option<u64>, serial: u64) -> RolloutPhase {
    let there = applied_serial.is_some_and(|a| a >= serial);
    match state {
        ClusterState::Unknown | ClusterState::NeverSeen => RolloutPhase::Unknown,
        ClusterState::Synced if there => RolloutPhase::Done,
        ClusterState::Failed | ClusterState::Degraded | ClusterState::Contested => {
            RolloutPhase::Failed
        }
        _ => RolloutPhase::Pending,
    }
}

/// The rollout view of release `serial` over `clusters` (those following the channel), at `now`.
pub fn rollout_view(
    channel: &str,
    serial: u64,
    issued_at: Timestamp,
    rollout: &Rollout,
    clusters: &[ClusterFacts<'_>],
    now: Timestamp,
) -> RolloutView {
    let mut waves: Vec<WaveView> = (0..wave_count(rollout))
        .map(|index| {
            let spec = rollout.waves.get(index);
            let opens = opens_at(rollout, issued_at, index);
            WaveView {
                index,
                name: spec.map_or_else(|| "the rest".to_owned(), |w| w.label(index)),
                opens_at: opens,
                opened: index == 0 || (now >= opens && !rollout.halted),
                held: None,
                soak_seconds: spec.map_or(0, |w| w.soak.as_secs()),
                gate: spec.map_or(Gate::None, |w| w.gate),
                done: 0,
                pending: 0,
                failed: 0,
                unknown: 0,
                clusters: Vec::new(),
            }
        })
        .collect();
    for cluster in clusters {
        let index = wave_of(rollout, cluster.name, cluster.labels);
        let Some(wave) = waves.get_mut(index) else {
            continue;
        };
        let phase = phase(cluster.state, cluster.applied_serial, serial);
        match phase {
            RolloutPhase::Done => wave.done += 1,
            RolloutPhase::Failed => wave.failed += 1,
            RolloutPhase::Unknown => wave.unknown += 1,
            RolloutPhase::Pending => wave.pending += 1,
        }
        wave.clusters.push(WaveCluster {
            name: cluster.name.to_owned(),
            state: cluster.state,
            applied_serial: cluster.applied_serial,
            phase,
            done: phase == RolloutPhase::Done,
            waiting: cluster.waiting.clone(),
        });
    }
    let complete = waves.iter().all(|w| w.pending + w.failed + w.unknown == 0);
    let mut view = RolloutView {
        channel: channel.to_owned(),
        serial,
        issued_at,
        halted: rollout.halted,
        complete,
        waves,
    };
    let held: Vec<Option<String>> = (0..view.waves.len())
        .map(|index| {
            match decide(
                rollout,
                serial,
                issued_at,
                index,
                now,
                &GateInput::View(&view),
            ) {
                WaveDecision::Halted => Some(format!("the rollout of serial {serial} is halted")),
                WaveDecision::Gated { reason } => Some(reason),
                WaveDecision::Open | WaveDecision::Scheduled { .. } => None,
            }
        })
        .collect();
    for (wave, held) in view.waves.iter_mut().zip(held) {
        wave.opened = wave.opened && held.is_none();
        wave.held = held;
    }
    view
}

/// The report for a release that [`decide`] did not open, at `now`.
pub fn pending_report(
    rollout: &Rollout,
    serial: u64,
    issued_at: Timestamp,
    wave: usize,
    decision: &WaveDecision,
    now: Timestamp,
) -> PendingReport {
    let shown = wave + 1;
    let opens = opens_at(rollout, issued_at, wave);
    let message = match decision {
        WaveDecision::Open => format!("wave {shown} open"),
        WaveDecision::Halted => {
            format!("Halted (wave {shown}): the rollout of serial {serial} is halted")
        }
        WaveDecision::Scheduled { opens_at } => {
            let left = opens_at.duration_since(now).unsigned_abs();
            format!(
                "Pending (wave {shown}, opens in {})",
                crate::text::duration::format_duration(Duration::from_secs(left.as_secs().max(1)))
            )
        }
        WaveDecision::Gated { reason } => format!("Pending (wave {shown}, gated): {reason}"),
    };
    PendingReport {
        serial,
        wave: u32::try_from(shown).unwrap_or(u32::MAX),
        waves: u32::try_from(wave_count(rollout)).unwrap_or(u32::MAX),
        opens_at: Some(opens),
        halted: matches!(decision, WaveDecision::Halted),
        message,
        approval: None,
        changes: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::rollout::Wave;

    fn ts(text: &str) -> Timestamp {
        text.parse().expect("timestamp")
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn canary_forty_rest(soak: u64, gate: Gate) -> Rollout {
        let mut canary = Wave {
            name: Some("canary".to_owned()),
            soak: Duration::from_secs(soak),
            gate,
            ..Wave::default()
        };
        canary
            .selector
            .match_labels
            .insert("tier".to_owned(), "canary".to_owned());
        Rollout {
            waves: vec![
                canary,
                Wave {
                    percent: Some(40),
                    soak: Duration::from_secs(soak),
                    gate,
                    ..Wave::default()
                },
                Wave::default(),
            ],
            ..Rollout::default()
        }
    }

    #[test]
    fn buckets_are_stable_and_spread() {
        // Fixed values: a change of the hash would move clusters between waves of a running rollout.
        assert_eq!(bucket("prod-eu-1"), bucket("prod-eu-1"));
        assert_eq!(bucket(""), 8_894);
        assert_eq!(bucket("prod-eu-1"), bucket_of_known("prod-eu-1"));
        let below_half = (0..1000)
            .filter(|n| bucket(&format!("cluster-{n}")) < BUCKETS / 2)
            .count();
        assert!((430..=570).contains(&below_half), "{below_half}");
        assert!((0..1000).all(|n| bucket(&format!("c{n}")) < BUCKETS));
    }

    fn bucket_of_known(name: &str) -> u32 {
        // The same computation spelled out, so that the test fails if `bucket` drifts from it.
        let digest = Sha256::digest(name.as_bytes());
        let point = u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"));
        ((point as u128 * 10_000) >> 64) as u32
    }

    #[test]
    fn percent_split_takes_about_that_share_and_the_rest_follow() {
        let rollout = canary_forty_rest(20, Gate::None);
        let none = Labels::new();
        let mut counts = [0usize; 3];
        for n in 0..1000 {
            counts[wave_of(&rollout, &format!("cluster-{n}"), &none)] += 1;
        }
        assert_eq!(counts[0], 0);
        assert!((340..=460).contains(&counts[1]), "{counts:?}");
        assert_eq!(counts[1] + counts[2], 1000);
        let canary = labels(&[("tier", "canary")]);
        assert_eq!(wave_of(&rollout, "anything", &canary), 0);
        // Raising the percent in a later release only adds clusters to the wave.
        let mut wider = rollout.clone();
        wider.waves[1].percent = Some(60);
        for n in 0..1000 {
            let name = format!("cluster-{n}");
            if wave_of(&rollout, &name, &none) == 1 {
                assert_eq!(wave_of(&wider, &name, &none), 1);
            }
        }
    }

    #[test]
    fn clusters_in_no_wave_go_last() {
        let mut rollout = canary_forty_rest(10, Gate::None);
        rollout.waves.pop();
        assert_eq!(wave_count(&rollout), 3);
        let name = (0..100)
            .map(|n| format!("c{n}"))
            .find(|n| bucket(n) >= 4000)
            .expect("some cluster above 40 %");
        assert_eq!(wave_of(&rollout, &name, &Labels::new()), 2);
        assert_eq!(wave_count(&canary_forty_rest(10, Gate::None)), 3);
    }

    #[test]
    fn soaks_beyond_any_timestamp_are_clamped_not_a_panic() {
        // What a pointer read unverified may carry: soaks whose sum overflows a Duration.
        let huge = Wave {
            soak: Duration::MAX,
            ..Wave::default()
        };
        let rollout = Rollout {
            waves: vec![huge.clone(), huge.clone(), huge],
            ..Rollout::default()
        };
        let issued = ts("2026-12-04T10:00:00Z");
        assert_eq!(opens_at(&rollout, issued, 0), issued);
        let one_year = jiff::SignedDuration::try_from(MAX_SOAK).expect("fits");
        assert_eq!(opens_at(&rollout, issued, 1), issued + one_year);
        assert_eq!(opens_at(&rollout, issued, 3), issued + one_year * 3);
        assert_eq!(opens_at(&rollout, Timestamp::MAX, 3), Timestamp::MAX);
    }

    proptest::proptest! {
        #[test]
        fn opens_at_never_panics_and_never_goes_back(
            soaks in proptest::collection::vec(proptest::num::u64::ANY, 0..8),
            nanos in proptest::num::u32::ANY,
            issued in 0i64..=253_402_207_200,
        ) {
            let rollout = Rollout {
                waves: soaks
                    .iter()
                    .map(|s| Wave { soak: Duration::new(*s, nanos % 1_000_000_000), ..Wave::default() })
                    .collect(),
                ..Rollout::default()
            };
            let issued = Timestamp::from_second(issued).expect("in range");
            let mut last = issued;
            for wave in 0..=rollout.waves.len() {
                let opens = opens_at(&rollout, issued, wave);
                proptest::prop_assert!(opens >= last);
                last = opens;
            }
        }
    }

    #[test]
    fn each_wave_opens_after_the_earlier_soaks() {
        let rollout = canary_forty_rest(600, Gate::None);
        let issued = ts("2026-12-04T10:00:00Z");
        assert_eq!(opens_at(&rollout, issued, 0), issued);
        assert_eq!(opens_at(&rollout, issued, 1), ts("2026-12-04T10:10:00Z"));
        assert_eq!(opens_at(&rollout, issued, 2), ts("2026-12-04T10:20:00Z"));
        let open = |wave, now| decide(&rollout, 7, issued, wave, ts(now), &GateInput::NotAsked);
        assert_eq!(open(0, "2026-12-04T10:00:00Z"), WaveDecision::Open);
        assert_eq!(
            open(2, "2026-12-04T10:06:00Z"),
            WaveDecision::Scheduled {
                opens_at: ts("2026-12-04T10:20:00Z")
            }
        );
        assert_eq!(open(2, "2026-12-04T10:20:00Z"), WaveDecision::Open);
        let report = pending_report(
            &rollout,
            7,
            issued,
            2,
            &open(2, "2026-12-04T10:06:00Z"),
            ts("2026-12-04T10:06:00Z"),
        );
        assert_eq!(report.message, "Pending (wave 3, opens in 14m)");
        assert_eq!((report.wave, report.waves), (3, 3));
    }

    #[test]
    fn halt_stops_waves_that_have_not_moved_but_not_the_first() {
        let mut rollout = canary_forty_rest(0, Gate::None);
        rollout.halted = true;
        let issued = ts("2026-12-04T10:00:00Z");
        assert_eq!(
            decide(&rollout, 1, issued, 1, issued, &GateInput::NotAsked),
            WaveDecision::Halted
        );
        assert_eq!(
            decide(&rollout, 1, issued, 0, issued, &GateInput::NotAsked),
            WaveDecision::Open
        );
    }

    fn view(
        rollout: &Rollout,
        serial: u64,
        clusters: &[(&str, &Labels, ClusterState, u64)],
    ) -> RolloutView {
        let facts: Vec<ClusterFacts> = clusters
            .iter()
            .map(|(name, labels, state, applied)| ClusterFacts {
                name,
                labels,
                state: *state,
                applied_serial: Some(*applied),
                waiting: None,
            })
            .collect();
        rollout_view(
            "prod",
            serial,
            ts("2026-12-04T10:00:00Z"),
            rollout,
            &facts,
            ts("2026-12-04T10:00:30Z"),
        )
    }

    #[test]
    fn the_gate_opens_only_on_earlier_waves_synced_on_the_serial() {
        let rollout = canary_forty_rest(20, Gate::Healthy);
        let issued = ts("2026-12-04T10:00:00Z");
        let after = ts("2026-12-04T10:00:30Z");
        let canary = labels(&[("tier", "canary")]);
        let decide_with =
            |v: &RolloutView| decide(&rollout, 5, issued, 1, after, &GateInput::View(v));

        let synced = view(&rollout, 5, &[("c1", &canary, ClusterState::Synced, 5)]);
        assert_eq!(decide_with(&synced), WaveDecision::Open);

        for (state, applied, why) in [
            (ClusterState::Degraded, 5, "c1 (canary) is Degraded"),
            (ClusterState::Unknown, 5, "c1 (canary) is Unknown"),
            (ClusterState::Synced, 4, "c1 (canary) is Synced on serial 4"),
            (
                ClusterState::NeverSeen,
                4,
                "c1 (canary) is NeverSeen on serial 4",
            ),
        ] {
            let held = view(&rollout, 5, &[("c1", &canary, state, applied)]);
            match decide_with(&held) {
                WaveDecision::Gated { reason } => assert!(reason.contains(why), "{reason}"),
                other => panic!("{state}: {other:?}"),
            }
        }
        let other_serial = view(&rollout, 6, &[("c1", &canary, ClusterState::Synced, 6)]);
        assert!(matches!(
            decide_with(&other_serial),
            WaveDecision::Gated { .. }
        ));
        // Unreachable or not asked: closed. Before its time: the schedule, whatever the server says.
        assert!(matches!(
            decide(&rollout, 5, issued, 1, after, &GateInput::Unreachable("connection refused")),
            WaveDecision::Gated { reason } if reason.contains("connection refused")
        ));
        assert!(matches!(
            decide(
                &rollout,
                5,
                issued,
                1,
                ts("2026-12-04T10:00:10Z"),
                &GateInput::View(&synced)
            ),
            WaveDecision::Scheduled { .. }
        ));
        // No gate: time alone.
        let ungated = canary_forty_rest(20, Gate::None);
        assert_eq!(
            decide(
                &ungated,
                5,
                issued,
                1,
                after,
                &GateInput::Unreachable("down")
            ),
            WaveDecision::Open
        );
    }

    #[test]
    fn the_view_counts_each_wave_and_is_complete_only_when_all_are_done() {
        let rollout = canary_forty_rest(20, Gate::Healthy);
        let canary = labels(&[("tier", "canary")]);
        let none = Labels::new();
        let partial = view(
            &rollout,
            5,
            &[
                ("c1", &canary, ClusterState::Synced, 5),
                ("x1", &none, ClusterState::Synced, 4),
                ("x2", &none, ClusterState::Unknown, 5),
            ],
        );
        assert_eq!(partial.waves.len(), 3);
        assert_eq!(partial.waves[0].done, 1);
        let later: u64 = partial.waves[1..]
            .iter()
            .map(|w| w.pending + w.unknown)
            .sum();
        assert_eq!(later, 2);
        assert!(!partial.complete);
        assert!(partial.waves[1].opened && !partial.waves[2].opened);
        let degraded = view(&rollout, 5, &[("c1", &canary, ClusterState::Degraded, 5)]);
        let held = degraded.waves[1].held.as_deref().unwrap_or_default();
        assert!(
            held.contains("c1 (canary) is Degraded"),
            "{held} {degraded:?}"
        );
        assert!(!degraded.waves[1].opened);
        let ungated = canary_forty_rest(20, Gate::None);
        assert!(view(&ungated, 5, &[("c1", &canary, ClusterState::Degraded, 5)]).waves[1].opened);
        let done = view(&rollout, 5, &[("c1", &canary, ClusterState::Synced, 5)]);
        assert!(done.complete);
    }

    #[test]
    fn a_summary_lists_only_clusters_not_done_and_holds_the_gate_as_the_full_view() {
        let rollout = canary_forty_rest(20, Gate::Healthy);
        let canary = labels(&[("tier", "canary")]);
        let names: Vec<String> = (0..30).map(|n| format!("c{n}")).collect();
        let mut clusters: Vec<(&str, &Labels, ClusterState, u64)> = names
            .iter()
            .map(|n| (n.as_str(), &canary, ClusterState::Synced, 4))
            .collect();
        let full = view(&rollout, 5, &clusters);
        let small = summary(&full, 3);
        assert_eq!(small.waves.len(), full.waves.len());
        assert_eq!(small.waves[0].clusters.len(), 3);
        assert_eq!(
            (small.waves[0].pending, small.waves[0].not_done()),
            (30, 30)
        );
        let issued = ts("2026-12-04T10:00:00Z");
        let after = ts("2026-12-04T10:00:30Z");
        match decide(&rollout, 5, issued, 1, after, &GateInput::View(&small)) {
            WaveDecision::Gated { reason } => {
                assert!(
                    reason.contains("c0 (canary) is Synced on serial 4"),
                    "{reason}"
                );
                assert!(reason.contains("27 more of canary not done"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        // Every cluster but one done: the summary lists that one alone, and still holds.
        for cluster in clusters.iter_mut().skip(1) {
            cluster.3 = 5;
        }
        let small = summary(&view(&rollout, 5, &clusters), 3);
        assert_eq!(small.waves[0].clusters.len(), 1);
        assert!(matches!(
            decide(&rollout, 5, issued, 1, after, &GateInput::View(&small)),
            WaveDecision::Gated { reason } if reason == "held by the gate: c0 (canary) is Synced on serial 4"
        ));
        // All done: the summary lists none and opens the gate, as the full view does.
        clusters[0].3 = 5;
        let full = view(&rollout, 5, &clusters);
        let small = summary(&full, 3);
        assert!(small.waves.iter().all(|w| w.clusters.is_empty()));
        assert_eq!(
            decide(&rollout, 5, issued, 1, after, &GateInput::View(&small)),
            decide(&rollout, 5, issued, 1, after, &GateInput::View(&full))
        );
        assert_eq!(
            decide(&rollout, 5, issued, 1, after, &GateInput::View(&small)),
            WaveDecision::Open
        );
    }

    #[test]
    fn the_plan_round_trips_as_json_and_omits_defaults() {
        let rollout = canary_forty_rest(20, Gate::Healthy);
        let text = serde_json::to_string(&rollout).expect("json");
        assert!(
            text.contains(r#""soak":"20s""#) && text.contains(r#""gate":"healthy""#),
            "{text}"
        );
        assert!(
            !text.contains("halted") && !text.contains("control"),
            "{text}"
        );
        let back: Rollout = serde_json::from_str(&text).expect("parse");
        assert_eq!(back, rollout);
    }
}
