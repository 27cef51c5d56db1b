//! A progressive rollout at fleet scale: the convergence section's 10,000 simulated agents (same server,
//! same timeline, same agents: [`crate::convergence`]) with the second release published in three signed
//! waves — a canary (1 % of the fleet by the stable hash; more in tiny runs so that it is not empty), 40 %,
//! and the rest — each with a short soak and `gate: healthy`.
//!
//! Each simulated agent does what the agent does with such a release (`agent/src/gates/pending.rs`,
//! `wave.rs`), through the agent's own code: on the verified pointer it computes its wave with
//! [`windvane_agent::gates::wave::GatePlan::of`] (the shared `rollout::wave_of`), holds the release, and from its
//! wave's signed time on reads `GET /api/v1/rollouts/stable?summary=1` every `min(poll, 5 s)` with
//! `If-None-Match`, deciding with [`windvane_agent::gates::wave::judge`] (the shared `rollout::decide`); once open
//! it takes the release and reports at once. Simplification, stated: the gate's reads share the agent's one
//! keep-alive connection with its polls and heartbeats, and carry no token (the bench's server has no read
//! token; the agent sends the registration token).
//!
//! Per wave: its signed time (issue + earlier soaks), when it could open (the later of that and the moment
//! the server acknowledged the last heartbeat of the earlier, gated waves: the server's view cannot show
//! them done before), and from then until each of its agents was acknowledged on the release: p50, p99 and
//! the maximum, whose goal is the single wave's — the longest poll interval (+20 % jitter) + 5 s. And the
//! server's CPU from the publish until the whole fleet was on the release, against the same fleet idle.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use windvane_shared::decide::rollout;

use windvane_shared::spec::rollout::Rollout;
use windvane_tests::fleet::FleetTree;

use crate::convergence::{self, Convergence, JITTER, Published, format_count};
use crate::drift::quantile;
use crate::report::{Goal, Row, Unit};

/// The fleet, its pace, and each wave's soak.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub convergence: convergence::Settings,
    pub soak: Duration,
}

/// Row keys and names of the three waves.
const WAVES: [(&str, &str); 3] = [
    ("waves_canary_acked_seconds", "canary"),
    ("waves_forty_acked_seconds", "40 %"),
    ("waves_rest_acked_seconds", "rest"),
];

/// The canary's share of the fleet, percent: 1 %, or enough for a few clusters in a small run.
fn canary_percent(agents: usize) -> u32 {
    u32::try_from(500 / agents.max(1))
        .unwrap_or(10)
        .clamp(1, 10)
}

/// The convergence section's release `version` with a `rollout:` of three gated waves.
pub fn fleet_tree(version: u32, s: Settings) -> anyhow::Result<FleetTree> {
    let tree = convergence::fleet_tree(version)?;
    let mut fleet = std::fs::read_to_string(tree.path().join("fleet.yaml"))?;
    let soak = windvane_shared::text::duration::format_duration(s.soak);
    let _ = write!(
        fleet,
        "rollout:\n  waves:\n    - name: canary\n      percent: {}\n      soak: {soak}\n      gate: healthy\n    \
         - name: forty\n      percent: 40\n      soak: {soak}\n      gate: healthy\n    - name: rest\n",
        canary_percent(s.convergence.agents)
    );
    tree.write("fleet.yaml", &fleet)?;
    Ok(tree)
}

/// One wave's figures, seconds since the publish unless said otherwise.
#[derive(Debug, Clone)]
pub struct WaveFigures {
    pub agents: usize,
    /// The wave's signed time.
    pub scheduled: f64,
    /// When its gate could open: the later of `scheduled` and the last acknowledgement of earlier waves.
    pub opened: f64,
    /// From `opened` to each agent's acknowledgement: p50, p99, max.
    pub after: [f64; 3],
    /// The first acknowledgement of the wave (never before `scheduled`: the signed schedule holds).
    pub first_ack: f64,
    /// Agents never acknowledged.
    pub unacked: usize,
}

/// The measured rollout.
#[derive(Debug)]
pub struct Waves {
    pub convergence: Convergence,
    pub published: Published,
    pub waves: Vec<WaveFigures>,
}

/// Runs the convergence timeline with the second release in waves.
pub async fn measure(binary: &Path, work: &Path, s: Settings) -> anyhow::Result<Waves> {
    let second = fleet_tree(2, s)?;
    let (convergence, published) =
        convergence::measure_with(binary, work, s.convergence, "waves", &second).await?;
    let rollout = published
        .pointer
        .rollout
        .clone()
        .ok_or_else(|| anyhow::anyhow!("the published release has no rollout"))?;
    let waves = figures(&rollout, &published, s.convergence.agents);
    Ok(Waves {
        convergence,
        published,
        waves,
    })
}

/// Each wave's figures from the agents' acknowledgements. Pure.
fn figures(rollout: &Rollout, published: &Published, agents: usize) -> Vec<WaveFigures> {
    let secs = |d: Duration| d.as_secs_f64();
    let mut members: Vec<Vec<Option<Duration>>> = vec![Vec::new(); rollout::wave_count(rollout)];
    for i in 0..agents {
        let identity = convergence::identity(i);
        let wave = rollout::wave_of(rollout, &identity.name, &identity.labels);
        if let Some(wave_members) = members.get_mut(wave) {
            wave_members.push(published.acked.get(i).copied().flatten());
        }
    }
    let mut out = Vec::new();
    let mut earlier_last = 0.0_f64;
    for (index, acks) in members.iter().enumerate() {
        let scheduled = rollout::opens_at(rollout, published.pointer.issued_at, index)
            .duration_since(published.at)
            .as_secs_f64();
        let gated = rollout::needs_gate(rollout, index);
        let opened = if gated {
            scheduled.max(earlier_last)
        } else {
            scheduled
        };
        let mut after: Vec<Duration> = acks
            .iter()
            .flatten()
            .map(|ack| Duration::from_secs_f64((secs(*ack) - opened).max(0.0)))
            .collect();
        after.sort();
        let last = acks.iter().flatten().map(|a| secs(*a)).fold(0.0, f64::max);
        earlier_last = earlier_last.max(last);
        out.push(WaveFigures {
            agents: acks.len(),
            scheduled,
            opened,
            after: [0.5, 0.99, 1.0].map(|q| secs(quantile(&after, q))),
            first_ack: acks
                .iter()
                .flatten()
                .map(|a| secs(*a))
                .fold(f64::INFINITY, f64::min),
            unacked: acks.iter().filter(|a| a.is_none()).count(),
        });
    }
    out
}

/// The rows: per wave, opening → all acknowledged against the single wave's goal; the whole rollout; the
/// server's CPU during it.
pub fn report(m: &Waves, s: Settings, results: &mut crate::Results) {
    let interval = s.convergence.poll_interval.as_secs_f64();
    let longest_wait = interval * (1.0 + JITTER);
    let agents = format_count(m.convergence.agents);
    for ((key, name), wave) in WAVES.iter().zip(&m.waves) {
        results.rows.push(
            Row::new(
                "waves",
                key,
                &format!(
                    "wave {name} ({} agents): opening → all acknowledged, max",
                    format_count(wave.agents)
                ),
                Unit::Seconds,
                wave.after[2],
            )
            .baseline("poll schedule: longest poll interval", longest_wait)
            .goal(Goal::AtMost(longest_wait + 5.0))
            .note(format!(
                "signed time {:.1} s after the publish, could open at {:.1} s (the later of that and the last \
                 acknowledgement of the earlier gated waves); opening → acknowledged p50 {:.1} s, p99 {:.1} s, \
                 max {:.1} s; first acknowledgement {:.1} s after the publish; {} never acknowledged. Goal: the \
                 single wave's, longest poll interval + 5 s",
                wave.scheduled,
                wave.opened,
                wave.after[0],
                wave.after[1],
                wave.after[2],
                wave.first_ack,
                wave.unacked
            )),
        );
    }
    let c = &m.convergence;
    let gate = &m.published;
    let [polls, _, bundles, heartbeats, shed, errors, _, _] = c.during;
    results.rows.push(
        Row::new(
            "waves",
            "waves_rollout_seconds",
            &format!("rollout in three gated waves, {agents} simulated agents"),
            Unit::Seconds,
            c.converged.as_secs_f64(),
        )
        .note(format!(
            "publish until the server's database shows every cluster on the new serial; soaks {} s each; \
             the held agents' gates read the rollout view {} times ({} answered 304). Meanwhile {polls} \
             pointer polls, {bundles} bundle downloads, {heartbeats} heartbeats, {shed} shed with 429 (retried \
             after Retry-After), {errors} failed requests retried",
            s.soak.as_secs(),
            gate.gate_reads,
            gate.gate_not_modified
        )),
    );
    results.rows.push(
        Row::new(
            "waves",
            "waves_server_cores",
            &format!("server CPU during the rollout, {agents} agents"),
            Unit::Cores,
            c.converging_cores,
        )
        .baseline("same fleet idle (304s and heartbeats)", c.idle_cores)
        .note(format!(
            "CPU seconds per second of windvane-server (/proc) from the publish until every cluster was on \
             the release; the simulated agents used {:.2} cores, other processes {:.2}; server peak RSS {:.0} MiB",
            c.bench_cores, c.others_cores, c.rss_peak_converging_mib
        )),
    );
    let waves: Vec<serde_json::Value> = m
        .waves
        .iter()
        .map(|w| {
            serde_json::json!({
                "agents": w.agents, "scheduledSeconds": w.scheduled, "openedSeconds": w.opened,
                "ackedP50Seconds": w.after[0], "ackedP99Seconds": w.after[1], "ackedMaxSeconds": w.after[2],
                "firstAckSeconds": w.first_ack, "unacked": w.unacked,
            })
        })
        .collect();
    results.details.insert(
        "waves".into(),
        serde_json::json!({
            "agents": c.agents,
            "pollIntervalSeconds": interval,
            "soakSeconds": s.soak.as_secs_f64(),
            "rolloutSeconds": c.converged.as_secs_f64(),
            "convergingCores": c.converging_cores,
            "idleCores": c.idle_cores,
            "gateReads": gate.gate_reads,
            "gateNotModified": gate.gate_not_modified,
            "polls": polls, "bundles": bundles, "heartbeats": heartbeats, "shed": shed, "errors": errors,
            "waves": waves,
        }),
    );
}
