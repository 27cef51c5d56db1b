//! Where the machine's CPU went during a timed run: the control plane (localkube is one process: etcd,
//! apiserver, controllers, fake node), the contestant (the agent, or kubectl — a child of this process, so
//! its time shows up in our children's time once it is reaped), the benchmark itself, and everything else
//! on the machine. "Everything else" is the noise: another engineer's tests on the same two cores.
//! All from `/proc` (clock ticks of 10 ms, the `CLK_TCK` of every Linux this runs on).

use std::time::Duration;

pub use windvane_tests::procfs::{machine_busy, own, process};

/// How many cores the process `pid` used over the next `length` (CPU seconds per second), and how long the
/// window really was.
pub async fn cores_over(pid: u32, length: Duration) -> anyhow::Result<(f64, Duration)> {
    let before = process(pid)?;
    let start = std::time::Instant::now();
    tokio::time::sleep(length).await;
    let elapsed = start.elapsed();
    let used = process(pid)?.saturating_sub(before);
    Ok((used.as_secs_f64() / elapsed.as_secs_f64(), elapsed))
}

/// CPU use over one timed run.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuUse {
    pub control_plane: Duration,
    pub contestant: Duration,
    pub bench: Duration,
    /// Everything else on the machine.
    pub other: Duration,
}

impl CpuUse {
    /// As JSON, in seconds.
    pub fn to_json(self) -> serde_json::Value {
        serde_json::json!({
            "controlPlaneSeconds": self.control_plane.as_secs_f64(),
            "contestantSeconds": self.contestant.as_secs_f64(),
            "benchSeconds": self.bench.as_secs_f64(),
            "otherSeconds": self.other.as_secs_f64(),
        })
    }

    /// `control plane 6.0 s, agent 0.6 s, other 0.1 s`.
    pub fn describe(self, contestant: &str) -> String {
        format!(
            "CPU: control plane {:.1} s, {contestant} {:.1} s, other processes {:.1} s",
            self.control_plane.as_secs_f64(),
            self.contestant.as_secs_f64(),
            self.other.as_secs_f64()
        )
    }
}

/// Whose CPU time is the contestant's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contestant {
    /// A process that started within the run (the agent): all its CPU time.
    Process(u32),
    /// A child of ours that has been waited for (kubectl).
    Child,
    /// The benchmark itself (an in-process client).
    Benchmark,
}

/// A CPU snapshot at the start of a run.
#[derive(Debug, Clone, Copy)]
pub struct CpuMeter {
    machine: Duration,
    control_plane: Duration,
    own: Duration,
    children: Duration,
}

impl CpuMeter {
    /// Starts measuring; `control_plane` is localkube's pid.
    pub fn start(control_plane: u32) -> anyhow::Result<Self> {
        let (own, children) = own()?;
        Ok(Self {
            machine: machine_busy()?,
            control_plane: process(control_plane)?,
            own,
            children,
        })
    }

    /// The CPU used since the start.
    pub fn stop(&self, control_plane: u32, contestant: Contestant) -> anyhow::Result<CpuUse> {
        let (own, children) = own()?;
        let control_plane = process(control_plane)?.saturating_sub(self.control_plane);
        let children = children.saturating_sub(self.children);
        let mut bench = own.saturating_sub(self.own);
        let contestant = match contestant {
            Contestant::Process(pid) => process(pid)?,
            Contestant::Child => children,
            Contestant::Benchmark => std::mem::take(&mut bench),
        };
        let machine = machine_busy()?.saturating_sub(self.machine);
        Ok(CpuUse {
            control_plane,
            contestant,
            bench,
            other: machine.saturating_sub(control_plane + contestant + bench),
        })
    }
}
