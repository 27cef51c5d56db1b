//! Pointer `304 Not Modified` throughput: what a fleet of agents polling an unchanged channel costs the source
//! server, against nginx serving the same file from the same store directory (the static host the design
//! says any store may use instead). Both answer `If-None-Match` with their own strong ETag; the load is
//! closed-loop on the same number of keep-alive connections, from `wrk` (when installed: C, the least CPU
//! taken from the servers on this 2-core machine) and from a hyper client in this process (what the agents'
//! reqwest uses underneath). The machine is noisy, so the two servers alternate in short rounds (the order
//! flips every round) and the medians are compared; the servers' own CPU per request (`/proc`, nginx's
//! workers included) is recorded beside the throughput, since on two shared cores throughput alone also
//! measures who the load generator and the neighbours leave room for.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use jiff::{SignedDuration, Timestamp};
use windvane_shared::crypto::keys::signing_key_from_seed;
use windvane_shared::format::release::{BundleRef, ReleasePointer};

use crate::report::{Goal, Row, Unit};
use crate::server::{Conn, CpuSplit, Nginx, ServerProcess};

/// How long and how hard.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Rounds per server and generator.
    pub rounds: usize,
    pub round: Duration,
    pub connections: usize,
}

/// Which load generator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Generator {
    Wrk,
    Hyper,
}

impl Generator {
    pub fn describe(self) -> &'static str {
        match self {
            Self::Wrk => "wrk -t2",
            Self::Hyper => "hyper client",
        }
    }
}

/// One server's rounds.
#[derive(Debug, Clone, Default)]
pub struct Rounds {
    /// Requests per second, one per round, in round order.
    pub rates: Vec<f64>,
    /// Server CPU per request, µs, one per round.
    pub cpu_us: Vec<f64>,
    /// Cores other processes on the machine used, one per round.
    pub others: Vec<f64>,
}

impl Rounds {
    pub fn median_rate(&self) -> f64 {
        median(&self.rates)
    }

    /// The fastest round: other processes only ever take throughput away, so on a shared machine the best
    /// round is the best estimate of what a server can do.
    pub fn best_rate(&self) -> f64 {
        self.rates.iter().copied().fold(0.0, f64::max)
    }

    pub fn median_cpu_us(&self) -> f64 {
        median(&self.cpu_us)
    }
}

/// Both servers under one generator.
#[derive(Debug, Clone)]
pub struct Contest {
    pub generator: Generator,
    pub windvane: Rounds,
    pub nginx: Rounds,
}

impl Contest {
    /// Windvane's rate over nginx's, round by round (each pair ran back to back).
    pub fn paired_ratios(&self) -> Vec<f64> {
        self.windvane
            .rates
            .iter()
            .zip(&self.nginx.rates)
            .map(|(w, n)| w / n)
            .collect()
    }
}

pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Writes a signed channel pointer of realistic size (a DSSE envelope of about 600 bytes) as
/// `root/channels/stable.json`, and returns its bytes.
pub fn write_pointer(root: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::create_dir_all(root.join("channels"))?;
    std::fs::create_dir_all(root.join("bundles"))?;
    let now = Timestamp::now();
    let pointer = ReleasePointer {
        fleet: "acme".into(),
        channel: "stable".into(),
        serial: 42,
        issued_at: now,
        expires_at: now.checked_add(SignedDuration::from_hours(24))?,
        bundle: BundleRef {
            sha256: "ab".repeat(32),
            size: 123_456,
        },
        allow_empty: false,
        rollout: None,
    };
    let bytes = pointer
        .sign(&signing_key_from_seed([7; 32]))
        .to_json_bytes();
    std::fs::write(root.join("channels/stable.json"), &bytes)?;
    Ok(bytes)
}

const PATH: &str = "/channels/stable.json";

/// Checks that a server serves `pointer` and answers its own ETag with 304; returns the ETag.
async fn etag_of(addr: SocketAddr, pointer: &[u8]) -> anyhow::Result<String> {
    let mut conn = Conn::open(addr).await?;
    let first = conn.get(PATH, &[]).await?;
    anyhow::ensure!(
        first.status == 200 && first.body[..] == *pointer,
        "{addr} does not serve the pointer (status {})",
        first.status
    );
    let etag = first.etag.context("no ETag")?;
    let again = conn.get(PATH, &[("if-none-match", &etag)]).await?;
    anyhow::ensure!(
        again.status == 304,
        "{addr} answered {} to If-None-Match",
        again.status
    );
    Ok(etag)
}

/// Runs the contest: windvane-server (`binary`) and nginx on the same store, one [`Contest`] per generator
/// (wrk only when installed).
pub async fn measure(binary: &Path, work: &Path, s: Settings) -> anyhow::Result<Vec<Contest>> {
    let root = work.join("pointer-store");
    let pointer = write_pointer(&root)?;
    let windvane = ServerProcess::start(binary, &root, work, "pointer-server", &[]).await?;
    let nginx = Nginx::start(&root, work).await?;
    let targets = [
        (
            windvane.addr,
            windvane.pid()?,
            etag_of(windvane.addr, &pointer).await?,
        ),
        (
            nginx.addr,
            nginx.pid(),
            etag_of(nginx.addr, &pointer).await?,
        ),
    ];
    let mut generators = vec![Generator::Hyper];
    if wrk_available() {
        generators.insert(0, Generator::Wrk);
    }
    let mut contests = Vec::new();
    for generator in generators {
        // Warm-up: connections, caches, the CPU's clock.
        for (addr, _, etag) in &targets {
            run_round(
                generator,
                *addr,
                etag,
                s.connections,
                Duration::from_secs(1),
            )
            .await?;
        }
        let mut rounds = [Rounds::default(), Rounds::default()];
        for round in 0..s.rounds {
            let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for i in order {
                let (addr, pid, etag) = &targets[i];
                let split = CpuSplit::start(*pid);
                let (requests, elapsed) =
                    run_round(generator, *addr, etag, s.connections, s.round).await?;
                let (cpu, _, others) = split.stop(*pid);
                rounds[i]
                    .others
                    .push(others.as_secs_f64() / elapsed.as_secs_f64());
                rounds[i]
                    .rates
                    .push(requests as f64 / elapsed.as_secs_f64());
                rounds[i]
                    .cpu_us
                    .push(cpu.as_secs_f64() * 1e6 / requests.max(1) as f64);
            }
        }
        let [windvane, nginx] = rounds;
        contests.push(Contest {
            generator,
            windvane,
            nginx,
        });
    }
    Ok(contests)
}

fn wrk_available() -> bool {
    std::process::Command::new("wrk")
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok()
}

/// One closed-loop round; returns the 304s answered and the time taken.
async fn run_round(
    generator: Generator,
    addr: SocketAddr,
    etag: &str,
    connections: usize,
    length: Duration,
) -> anyhow::Result<(u64, Duration)> {
    match generator {
        Generator::Hyper => hyper_round(addr, etag, connections, length).await,
        Generator::Wrk => wrk_round(addr, etag, connections, length).await,
    }
}

async fn hyper_round(
    addr: SocketAddr,
    etag: &str,
    connections: usize,
    length: Duration,
) -> anyhow::Result<(u64, Duration)> {
    let count = Arc::new(AtomicU64::new(0));
    let mut conns = Vec::with_capacity(connections);
    for _ in 0..connections {
        conns.push(Conn::open(addr).await?);
    }
    let start = Instant::now();
    let deadline = start + length;
    let mut tasks = Vec::new();
    for mut conn in conns {
        let (count, etag) = (Arc::clone(&count), etag.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut local = 0;
            while Instant::now() < deadline {
                let answer = conn.get(PATH, &[("if-none-match", &etag)]).await?;
                anyhow::ensure!(answer.status == 304, "answered {}", answer.status);
                local += 1;
            }
            count.fetch_add(local, Ordering::Relaxed);
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok((count.load(Ordering::Relaxed), start.elapsed()))
}

async fn wrk_round(
    addr: SocketAddr,
    etag: &str,
    connections: usize,
    length: Duration,
) -> anyhow::Result<(u64, Duration)> {
    let output = tokio::process::Command::new("wrk")
        .args([
            "-t2".to_owned(),
            format!("-c{connections}"),
            format!("-d{}s", length.as_secs().max(1)),
            "-H".to_owned(),
            format!("If-None-Match: {etag}"),
            format!("http://{addr}{PATH}"),
        ])
        .output()
        .await
        .context("running wrk")?;
    let text = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.success() && !text.contains("Non-2xx or 3xx responses"),
        "wrk failed or saw errors:\n{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // "  123456 requests in 3.00s, 12.34MB read"
    let (requests, seconds) = text
        .lines()
        .find_map(|line| {
            let (count, rest) = line.trim().split_once(" requests in ")?;
            let seconds = rest.split(['s', ',']).next()?.parse::<f64>().ok()?;
            Some((count.parse::<u64>().ok()?, seconds))
        })
        .with_context(|| format!("cannot read wrk's output:\n{text}"))?;
    Ok((requests, Duration::from_secs_f64(seconds)))
}

/// The rows: one per generator, the first (wrk when installed) carrying the goal.
pub fn report(contests: &[Contest], s: Settings, results: &mut crate::Results) {
    for (i, contest) in contests.iter().enumerate() {
        let generator = contest.generator.describe();
        let key = match contest.generator {
            Generator::Wrk => "pointer_304_rps_wrk",
            Generator::Hyper => "pointer_304_rps_hyper",
        };
        let ratios: Vec<String> = contest
            .paired_ratios()
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect();
        let row = Row::new(
            "pointer-304",
            key,
            &format!("pointer 304 throughput ({generator}, {} conns)", s.connections),
            Unit::PerSecond,
            contest.windvane.best_rate(),
        )
        .baseline("nginx, same file", contest.nginx.best_rate())
        .note(format!(
            "best of {} rounds of {} s each (other processes only take throughput away), the two servers \
             alternating, order flipped every round; medians: windvane {:.0}/s, nginx {:.0}/s; round-by-round \
             ratios {}; other processes used {:.2} cores on average during the rounds; server CPU per 304 \
             (median): windvane {:.1} µs, nginx {:.1} µs (its workers included){}",
            s.rounds,
            s.round.as_secs(),
            contest.windvane.median_rate(),
            contest.nginx.median_rate(),
            ratios.join(", "),
            (contest.windvane.others.iter().sum::<f64>() + contest.nginx.others.iter().sum::<f64>())
                / (contest.windvane.others.len() + contest.nginx.others.len()).max(1) as f64,
            contest.windvane.median_cpu_us(),
            contest.nginx.median_cpu_us(),
            if i == 0 {
                ""
            } else {
                "; a second view with the agents' HTTP stack as the load generator (it takes more of the two \
                 cores from the servers than wrk), no goal"
            }
        ));
        if i == 0 {
            // Throughput per CPU-second of each server: what each would serve given the same CPU, which is the
            // comparison that survives other processes taking the shared cores (raw throughput is then mostly
            // who got scheduled).
            results.rows.push(
                Row::new(
                    "pointer-304",
                    "pointer_304_per_cpu_second",
                    &format!("pointer 304s per server CPU-second ({generator})"),
                    Unit::PerSecond,
                    1e6 / contest.windvane.median_cpu_us(),
                )
                .baseline("nginx, same file", 1e6 / contest.nginx.median_cpu_us())
                .goal(Goal::RatioAtLeast(1.0))
                .note(format!(
                    "1 / (the server's CPU per 304, from /proc, median of the rounds below): windvane {:.1} µs, \
                     nginx {:.1} µs with its two workers — the throughput each would reach with the same CPU",
                    contest.windvane.median_cpu_us(),
                    contest.nginx.median_cpu_us()
                )),
            );
        }
        let others: Vec<f64> = contest
            .windvane
            .others
            .iter()
            .chain(&contest.nginx.others)
            .copied()
            .collect();
        if median(&others) > crate::NOISY_CORES {
            results.warnings.push(format!(
                "noisy run: other processes on the machine used {:.2} cores (median) during the 304 rounds \
                 ({generator}); throughput on two shared cores is then mostly who gets the CPU — the CPU per \
                 304 is the figure that holds; re-run when the machine is quiet",
                median(&others)
            ));
        }
        results.rows.push(row);
    }
    results.details.insert(
        "pointer304".into(),
        serde_json::Value::Array(
            contests
                .iter()
                .map(|c| {
                    serde_json::json!({
                        "generator": c.generator.describe(),
                        "windvaneRps": c.windvane.rates,
                        "nginxRps": c.nginx.rates,
                        "windvaneCpuUsPerRequest": c.windvane.cpu_us,
                        "nginxCpuUsPerRequest": c.nginx.cpu_us,
                        "windvaneRoundOtherCores": c.windvane.others,
                        "nginxRoundOtherCores": c.nginx.others,
                    })
                })
                .collect(),
        ),
    );
}
