//! What `/proc` says of a process: CPU time used (user and system, in clock ticks of 10 ms, the `CLK_TCK`
//! of every Linux this runs on) and resident memory. The benchmark's CPU split and memory rows and the
//! full-size fleet test's figures of twelve control planes read them here.

use std::time::Duration;

use anyhow::Context;

const TICK: Duration = Duration::from_millis(10);

/// The fields of `/proc/PID/stat` after `pid (comm)`; the command name may hold spaces.
fn stat_fields(pid: &str) -> anyhow::Result<Vec<u64>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    Ok(stat
        .rsplit_once(')')
        .context("malformed /proc/PID/stat")?
        .1
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect())
}

fn ticks(fields: &[u64], range: std::ops::Range<usize>) -> anyhow::Result<Duration> {
    let sum: u64 = fields
        .get(range)
        .context("short /proc/PID/stat")?
        .iter()
        .sum();
    Ok(TICK * u32::try_from(sum)?)
}

/// CPU time (user and system) a process has used.
pub fn process(pid: u32) -> anyhow::Result<Duration> {
    // utime and stime: fields 14 and 15 of the line, 12 and 13 after `pid (comm)`.
    ticks(&stat_fields(&pid.to_string())?, 11..13)
}

/// CPU time of this process, and of its children that have been waited for.
pub fn own() -> anyhow::Result<(Duration, Duration)> {
    let fields = stat_fields("self")?;
    // cutime and cstime: fields 16 and 17.
    Ok((ticks(&fields, 11..13)?, ticks(&fields, 13..15)?))
}

/// CPU time the whole machine has been busy (all cores: user, nice, system, irq, softirq, steal).
pub fn machine_busy() -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().context("empty /proc/stat")?;
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    let busy: u64 = [0, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|i| values.get(*i))
        .sum();
    Ok(TICK * u32::try_from(busy)?)
}

/// Memory of a process, from `/proc/PID/status`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Memory {
    /// Resident set now (VmRSS), MiB.
    pub rss_mib: f64,
    /// Peak resident set so far (VmHWM), MiB.
    pub peak_mib: f64,
    /// Of the resident set now: anonymous memory (heap, stacks), MiB.
    pub anon_mib: f64,
    /// Of the resident set now: file-backed pages (the binary's code and data), MiB.
    pub file_mib: f64,
}

impl Memory {
    /// `VmRSS 20.1 MiB (anonymous 12.0, file-backed 8.1), VmHWM 25.0 MiB`.
    pub fn describe(&self) -> String {
        format!(
            "VmRSS {:.1} MiB (anonymous {:.1}, file-backed {:.1}), VmHWM {:.1} MiB",
            self.rss_mib, self.anon_mib, self.file_mib, self.peak_mib
        )
    }
}

/// VmRSS and VmHWM of a process.
pub fn read_memory(pid: u32) -> anyhow::Result<Memory> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<f64> {
        let line = text
            .lines()
            .find(|l| l.starts_with(name))
            .with_context(|| format!("no {name} in /proc/{pid}/status"))?;
        let kib: f64 = line
            .trim_start_matches(name)
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()?;
        Ok(kib / 1024.0)
    };
    Ok(Memory {
        rss_mib: field("VmRSS:")?,
        peak_mib: field("VmHWM:")?,
        anon_mib: field("RssAnon:")?,
        file_mib: field("RssFile:")?,
    })
}
