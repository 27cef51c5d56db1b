//! `windvane wait --for synced|healthy --selector … --timeout D`: polls the source server's `/api/v1/fleet`
//! until every selected cluster meets the condition (exit 0), the timeout passes first (exit 1), or the wait
//! cannot succeed or fails (exit 2). Whether the fleet as read meets the condition is the pure [`decide`];
//! this file's I/O only reads the fleet again until [`decide`] or the clock ends the wait.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use windvane_shared::text::duration::{format_duration, parse_duration};
use windvane_shared::wire::fleet_api::{ClusterRow, ClusterState, FleetView};

use crate::args::{ReadTokenArgs, SelectorArgs, ServerArgs};
use crate::error::{self, Error, Result};
use crate::terminal::clean_line;
use crate::{http, inputs, output};

/// The shortest interval between two reads of the fleet (the server is not polled harder than this).
const MIN_INTERVAL: Duration = Duration::from_millis(200);

/// `windvane wait`.
#[derive(Debug, Args)]
pub struct WaitArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// The condition every selected cluster must meet: synced (Synced on its channel's latest serial) or
    /// healthy (reporting, and neither Failed, Degraded nor still Progressing).
    #[arg(
        long = "for",
        value_name = "CONDITION",
        value_enum,
        env = "WINDVANE_WAIT_FOR"
    )]
    condition: Condition,
    #[command(flatten)]
    select: SelectorArgs,
    /// How long to wait before giving up (exit 1).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration, env = "WINDVANE_WAIT_TIMEOUT")]
    timeout: Duration,
    /// How often to read the fleet again.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration, env = "WINDVANE_WAIT_INTERVAL")]
    interval: Duration,
    #[command(flatten)]
    token: ReadTokenArgs,
}

/// What `wait` waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Condition {
    Synced,
    Healthy,
}

/// Where the wait stands after one read of the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Every selected cluster (this many) meets the condition.
    Met(usize),
    /// Not yet: which clusters do not, and why.
    NotYet(String),
    /// Waiting longer cannot help.
    Impossible(String),
}

/// Whether `fleet` (as read with the wait's selection) meets `condition` (pure). An empty selection is
/// impossible, as kubectl's `wait` says "no matching resources": a selector with a typo would otherwise
/// pass or wait out its whole timeout. Unknown and NeverSeen clusters are not yet anything.
pub fn decide(condition: Condition, fleet: &FleetView) -> Decision {
    if fleet.clusters.is_empty() {
        return Decision::Impossible(
            "no cluster matches the selection (is the selector right? are the clusters enrolled?)"
                .to_owned(),
        );
    }
    let waiting: Vec<String> = fleet
        .clusters
        .iter()
        .filter_map(|row| why_not(condition, row).map(|why| format!("{} {why}", row.name)))
        .collect();
    if waiting.is_empty() {
        Decision::Met(fleet.clusters.len())
    } else {
        Decision::NotYet(output::summarize(&waiting))
    }
}

/// Why `row` does not meet `condition`; `None` when it does.
fn why_not(condition: Condition, row: &ClusterRow) -> Option<String> {
    match condition {
        Condition::Synced if row.state != ClusterState::Synced => Some(format!("is {}", row.state)),
        Condition::Synced if row.behind() => Some(format!(
            "is Synced on serial {}, not the latest {}",
            row.applied_serial.unwrap_or_default(),
            row.latest_serial.unwrap_or_default()
        )),
        Condition::Synced => None,
        Condition::Healthy => match row.state {
            ClusterState::Failed
            | ClusterState::Degraded
            | ClusterState::Progressing
            | ClusterState::Unknown
            | ClusterState::NeverSeen => Some(format!("is {}", row.state)),
            _ => None,
        },
    }
}

pub fn wait(args: WaitArgs) -> Result<ExitCode> {
    let url = format!(
        "{}/api/v1/fleet?{}",
        args.server.server.trim_end_matches('/'),
        args.select.query()
    );
    let token = inputs::read_token_file(args.token.read_token_file.as_ref())?;
    let interval = args.interval.max(MIN_INTERVAL);
    let deadline = Instant::now() + args.timeout;
    let mut last_said = String::new();
    loop {
        let decision = match http::get_json::<FleetView>(&url, token.as_deref()) {
            Ok(fleet) => decide(args.condition, &fleet),
            // A server restarting or a proxy in between should not end a long wait: it is read again until
            // the deadline, when the error is the answer.
            Err(error) if transient(&error) && Instant::now() < deadline => Decision::NotYet(
                format!("the server did not answer ({})", error::report(&error)),
            ),
            Err(error) => return Err(error),
        };
        match decision {
            Decision::Met(count) => {
                println!(
                    "condition met: {count} cluster(s) {}",
                    condition_name(args.condition)
                );
                return Ok(ExitCode::SUCCESS);
            }
            Decision::Impossible(why) => return Err(Error::WaitImpossible { why }),
            Decision::NotYet(why) => {
                let now = Instant::now();
                if now >= deadline {
                    eprintln!(
                        "timed out after {} waiting for {}: {}",
                        format_duration(args.timeout),
                        condition_name(args.condition),
                        clean_line(&why)
                    );
                    return Ok(ExitCode::FAILURE);
                }
                if why != last_said {
                    eprintln!("waiting: {}", clean_line(&why));
                    last_said = why;
                }
                std::thread::sleep(interval.min(deadline - now));
            }
        }
    }
}

/// Whether reading the fleet may work when tried again: no answer, or the server's 5xx. A refusal (a wrong
/// token, a bad selector) or a body that is not the fleet will not change.
fn transient(error: &Error) -> bool {
    match error {
        Error::Request { .. } => true,
        Error::Refused { status, .. } => status.is_server_error(),
        _ => false,
    }
}

fn condition_name(condition: Condition) -> &'static str {
    match condition {
        Condition::Synced => "synced",
        Condition::Healthy => "healthy",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use windvane_shared::wire::status::SyncState;

    fn row(name: &str, state: ClusterState, applied: u64) -> ClusterRow {
        ClusterRow {
            name: name.to_owned(),
            fleet: "acme".to_owned(),
            labels: Default::default(),
            state,
            last_reported: Some(SyncState::Synced),
            last_seen: None,
            heartbeat_age_seconds: Some(3),
            grace_seconds: 90,
            interval_seconds: Some(30),
            channel: Some("stable".to_owned()),
            applied_serial: Some(applied),
            latest_serial: Some(4),
            drift_total: 0,
            last_error: None,
            enrolled_at: jiff::Timestamp::UNIX_EPOCH,
            keyid: "k".to_owned(),
            age_recipient: None,
            sequence: 1,
        }
    }

    fn fleet(clusters: Vec<ClusterRow>) -> FleetView {
        FleetView {
            generated_at: jiff::Timestamp::UNIX_EPOCH,
            total: clusters.len() as u64,
            counts: Default::default(),
            clusters,
        }
    }

    use ClusterState::*;
    use Condition::{Healthy, Synced as SyncedOn};

    #[test]
    fn synced_means_synced_on_the_latest_serial_everywhere() {
        let all = fleet(vec![row("a", Synced, 4), row("b", Synced, 4)]);
        assert_eq!(decide(SyncedOn, &all), Decision::Met(2));
        let behind = fleet(vec![row("a", Synced, 4), row("b", Synced, 3)]);
        assert_eq!(
            decide(SyncedOn, &behind),
            Decision::NotYet("b is Synced on serial 3, not the latest 4".to_owned())
        );
        let unknown = fleet(vec![row("a", Unknown, 4), row("b", Progressing, 4)]);
        assert_eq!(
            decide(SyncedOn, &unknown),
            Decision::NotYet("a is Unknown, b is Progressing".to_owned())
        );
    }

    #[test]
    fn healthy_allows_drift_and_holds_but_not_failure_or_silence() {
        let fine = fleet(vec![
            row("a", Synced, 3),
            row("b", OutOfSync, 4),
            row("c", Held, 4),
            row("d", Contested, 4),
        ]);
        assert_eq!(decide(Healthy, &fine), Decision::Met(4));
        for state in [Failed, Degraded, Progressing, Unknown, NeverSeen] {
            assert_eq!(
                decide(
                    Healthy,
                    &fleet(vec![row("a", Synced, 4), row("x", state, 4)])
                ),
                Decision::NotYet(format!("x is {state}")),
                "{state}"
            );
        }
    }

    #[test]
    fn only_a_missing_answer_or_a_server_error_is_read_again() {
        let refused = |code: u16| Error::Refused {
            request: "GET u".to_owned(),
            status: reqwest::StatusCode::from_u16(code).expect("status"),
            message: String::new(),
        };
        assert!(transient(&refused(503)));
        assert!(transient(&refused(502)));
        assert!(!transient(&refused(401)));
        assert!(!transient(&refused(400)));
        assert!(!transient(&Error::WaitImpossible { why: String::new() }));
    }

    #[test]
    fn nothing_selected_cannot_be_waited_for_and_long_lists_are_cut() {
        assert!(matches!(
            decide(Healthy, &fleet(vec![])),
            Decision::Impossible(_)
        ));
        let many = fleet((0..7).map(|i| row(&format!("c{i}"), Failed, 4)).collect());
        assert_eq!(
            decide(SyncedOn, &many),
            Decision::NotYet(
                "c0 is Failed, c1 is Failed, c2 is Failed, c3 is Failed, c4 is Failed, and 2 more"
                    .to_owned()
            )
        );
    }
}
