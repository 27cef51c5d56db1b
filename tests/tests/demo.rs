//! The one-command demo, run as its user runs it: the built `demo` binary (with the workspace's other
//! binaries beside it) tells its story, waits for Ctrl-C, gets SIGINT, and stops. The test checks the
//! story's outcomes in what it printed (at the default size, three clusters and a joiner, to keep it
//! quick; `--clusters` changes only how many run the same story) — drift healed, a deleted pod replaced by its ReplicaSet with the
//! agent's write and drift counters unchanged, the joiner with the store unchanged, the cut-off cluster
//! Unknown, healing, Synced again with its repair logged — that it exited cleanly, and that nothing it
//! started is left: no process it reported (nor any in a localkube's process group, nor any naming its work
//! directory), no proxy (it says it closed each and read back that none accepts) and no directory it
//! created. The same story runs with `--real-node`, where the deleted pod's replacement must be a real
//! container.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;

/// The story takes 1–2 minutes; a loaded machine may need much more.
const STORY: Duration = Duration::from_secs(480);
/// Stopping everything after Ctrl-C.
const SHUTDOWN: Duration = Duration::from_secs(120);

/// Numbers that follow `marker` in `line` (`"localkube pid 12, agent pid 13"`, marker `"pid "`).
fn numbers_after(line: &str, marker: &str) -> Vec<u32> {
    line.split(marker)
        .skip(1)
        .filter_map(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|n| n.parse().ok())
        })
        .collect()
}

/// The first line containing `needle`.
fn line_with<'a>(output: &'a str, needle: &str) -> Option<&'a str> {
    output.lines().find(|l| l.contains(needle))
}

/// The line after the first line containing `needle`.
fn line_after<'a>(output: &'a str, needle: &str) -> Option<&'a str> {
    output.lines().skip_while(|l| !l.contains(needle)).nth(1)
}

/// `(A, B)` from `… NAME A → B …` in a line.
fn change(line: &str, name: &str) -> Option<(u64, u64)> {
    let rest = line.split(name).nth(1)?;
    let mut words = rest.split_whitespace();
    let before = words.next()?.trim_end_matches(',').parse().ok()?;
    (words.next()? == "→").then_some(())?;
    let after = words.next()?.trim_end_matches([',', ';']).parse().ok()?;
    Some((before, after))
}

/// Whether a process runs with this id and a command line mentioning `what` (so a reused id is not
/// mistaken for ours). Zombies count as gone.
fn running(pid: u32, what: &[&str]) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
    if state == Some(Some('Z')) {
        return false;
    }
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline);
    what.iter().any(|w| cmdline.contains(w))
}

/// Every live process: id, process group and command line.
fn processes() -> Vec<(u32, u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (_, rest) = stat.rsplit_once(") ")?;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            if fields.first() == Some(&"Z") {
                return None;
            }
            let pgid = fields.get(2)?.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            Some((
                pid,
                pgid,
                String::from_utf8_lossy(&cmdline).replace('\0', " "),
            ))
        })
        .collect()
}

#[test]
fn the_demo_tells_its_story_and_leaves_nothing_behind() -> anyhow::Result<()> {
    tell(&[])
}

/// `./demo --real-node`: the same story, with prod-us on a real node (containerd, runc, a kubelet), where the
/// deleted pod's replacement is a real container (issue 45, item 6). Needs what `localkube_real_node.rs`
/// needs; the test already runs in tests/loopback-only's namespace, so the demo does not enter another.
#[test]
fn the_demo_on_a_real_node_recreates_a_real_container() -> anyhow::Result<()> {
    tell(&["--real-node"])
}

/// Runs the demo with `args`, checks its story and that it leaves nothing behind.
fn tell(args: &[&str]) -> anyhow::Result<()> {
    let real_node = args.contains(&"--real-node");
    let stderr_file = tempfile::NamedTempFile::new()?;
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_demo"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr_file.reopen()?))
        .spawn()
        .context("starting the demo")?;
    let pid = child.id();
    let stdout = child.stdout.take().context("stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut output = String::new();
    let failed = |output: &str, why: &str| {
        anyhow::anyhow!(
            "{why}\n--- demo stdout ---\n{output}\n--- demo stderr ---\n{}",
            std::fs::read_to_string(stderr_file.path()).unwrap_or_default()
        )
    };

    // The story, up to its invitation to press Ctrl-C.
    let deadline = Instant::now() + STORY;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                output.push_str(&line);
                output.push('\n');
                if line.contains("Press Ctrl-C") {
                    break;
                }
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(failed(
                    &output,
                    "the demo did not reach the end of its story",
                ));
            }
        }
    }
    let story = started.elapsed();
    eprintln!("the story took {:.1}s", story.as_secs_f64());

    // Ctrl-C, as its user would press it.
    let status = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "kill -INT {pid}: {status}");
    let deadline = Instant::now() + SHUTDOWN;
    let exit = loop {
        while let Ok(line) = rx.try_recv() {
            output.push_str(&line);
            output.push('\n');
        }
        if let Some(exit) = child.try_wait()? {
            break exit;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(failed(
                &output,
                "the demo did not stop within its deadline after Ctrl-C",
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(5)) {
        output.push_str(&line);
        output.push('\n');
    }
    if !exit.success() {
        return Err(failed(&output, &format!("the demo exited with {exit}")));
    }

    // The story's outcomes, as it read them from the running system.
    let expect = |needle: &str| -> anyhow::Result<()> {
        if output.contains(needle) {
            Ok(())
        } else {
            Err(failed(&output, &format!("the demo never said {needle:?}")))
        }
    };
    expect("published fleet acme on channel stable: serial 1")?;
    expect("The fleet is up: 3 clusters and their agents started in")?;
    expect("All 3 enrolled and Synced")?;
    expect("env=prod     Synced 2 (total 2)")?;
    expect("env=staging  Synced 1 (total 1)")?;
    expect("prometheus --storage.tsdb.retention.time=30d, external label region: eu")?;
    expect("prometheus --storage.tsdb.retention.time=15d, external label region: us")?;
    expect("no monitoring (it is env=staging); api HPA minReplicas 1, LOG_LEVEL debug")?;
    expect("/spec/replicas  changed by kubectl")?;
    expect("prometheus replicas 1 (again); api replicas 5 — the HPA's field, no drift recorded")?;
    // A deleted pod: the ReplicaSet replaced it, Windvane wrote nothing and logged no drift.
    expect("== Step 2 of 4 — a pod deleted on prod-us")?;
    expect("Running on node localkube-node")?;
    if real_node {
        // Read from the kubelet's container status: only a container that really runs has one.
        expect("a real container: containerd://")?;
        eprintln!(
            "{}",
            line_with(&output, "a real container").unwrap_or_default()
        );
    }
    let quiet =
        line_with(&output, "Windvane did nothing").context("no 'Windvane did nothing' line")?;
    for counter in [
        "windvane_apply_total{result=\"written\"}",
        "windvane_drift_detected_total",
    ] {
        let (before, after) = change(quiet, counter)
            .with_context(|| format!("no figures for {counter} in {quiet:?}"))?;
        assert_eq!(before, after, "{counter} changed: {quiet}");
    }
    assert!(
        quiet.contains("drift log for prod-us: 0 → 0 records"),
        "{quiet}"
    );
    // The joiner, with the store byte-identical.
    expect("prod-ap Synced at release 1")?;
    expect("the store is unchanged: its")?;
    expect("prometheus --storage.tsdb.retention.time=15d, external label region: ap")?;
    // The network cut: Unknown apart from Synced, healing meanwhile, Synced again, the repair logged.
    expect("== Step 4 of 4 — prod-us cut off from the network")?;
    expect("prod-us is Unknown")?;
    expect("last reported Synced")?;
    expect("env=prod (")?;
    expect("Unknown 1 · Synced 2 (total 3)")?;
    expect("Unknown 1 · Synced 3 (total 4)")?;
    expect("the other 3 clusters all Synced")?;
    expect("shows the same: prod-us Unknown, last reported Synced")?;
    expect("prometheus replicas 1 again")?;
    expect("still shows prod-us Unknown")?;
    expect("prod-us is Synced again")?;
    expect("The repair made during the outage is in the server's drift log")?;
    let repair = line_after(&output, "The repair made during the outage")
        .context("no drift record after the outage line")?;
    assert!(
        repair.contains("Deployment monitoring/prometheus  /spec/replicas  changed by kubectl"),
        "{repair}"
    );
    expect("env=prod now: Synced 3 (total 3)")?;
    expect("closed proxies:")?;
    expect("(4 proxies, none accepts connections)")?;
    expect("Everything stopped.")?;

    // Nothing it started is left.
    let mut localkubes = BTreeSet::new();
    let mut agents = BTreeSet::new();
    for line in output.lines().filter(|l| l.contains("localkube pid ")) {
        localkubes.extend(numbers_after(line, "localkube pid "));
        agents.extend(numbers_after(line, "agent pid "));
    }
    let stopped: BTreeSet<u32> = output
        .lines()
        .find(|l| l.contains("stopped pids:"))
        .map(|l| {
            l.split("stopped pids:")
                .nth(1)
                .unwrap_or_default()
                .split_whitespace()
                .map_while(|n| n.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(localkubes.len(), 4, "four localkubes: {output}");
    assert_eq!(agents.len(), 4, "four agents: {output}");
    assert!(
        localkubes.is_subset(&stopped) && agents.is_subset(&stopped),
        "the demo reports stopping every process it started:\n{output}"
    );
    assert_eq!(
        stopped.len(),
        9,
        "server + 4 localkubes + 4 agents: {output}"
    );
    for pid in &stopped {
        assert!(
            !running(*pid, &["windvane", "localkube"]),
            "pid {pid} is still running after the demo exited"
        );
    }
    let removed: Vec<&str> = output
        .lines()
        .find_map(|l| l.split_once("removed: ").map(|(_, r)| r))
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        removed.len(),
        5,
        "the work directory and 4 localkube data directories: {output}"
    );
    assert!(removed[0].contains("windvane-demo-"), "{removed:?}");
    for dir in &removed {
        assert!(!std::path::Path::new(dir).exists(), "{dir} is left behind");
    }
    let left: Vec<(u32, u32, String)> = processes()
        .into_iter()
        .filter(|(_, pgid, cmdline)| {
            localkubes.contains(pgid) || removed.iter().any(|d| cmdline.contains(d))
        })
        .collect();
    assert!(left.is_empty(), "processes left behind: {left:?}");
    eprintln!(
        "the demo ran {:.1}s in all (story {:.1}s)",
        started.elapsed().as_secs_f64(),
        story.as_secs_f64()
    );
    Ok(())
}
