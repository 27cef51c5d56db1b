//! `windvane history CHANNEL --root STORE`: the channel's signed history, newest first — each serial's bundle
//! digest, the key that signed it, when it was issued and until when agents accept it, whether the current
//! release is halted, and which serials carry an earlier serial's bundle again (a rollback, or an identical
//! publish). Reads the channel's pointer and its history entries (`channels/<ch>.releases/<serial>.json`,
//! `windvane_store::history`) from a directory, a bucket or a static host, and verifies each with
//! `--trusted-key` before anything of it is shown: an entry that does not verify is listed as untrusted, with
//! why, never shown as if signed, and makes the command exit 1; so does a pointer older than the signed
//! history (a replayed pointer). [`entries`] decides the rows (pure).

use std::process::ExitCode;

use clap::Args;
use jiff::Timestamp;
use serde::Serialize;
use windvane_shared::crypto::keys::TrustedKeys;
use windvane_shared::format::release::{self, AcceptedRelease, BundleRef};
use windvane_store::{self as store, StoreLocation};

use crate::args::{OutputArgs, TrustArgs};
use crate::error::{Error, Result};
use crate::http::runtime;
use crate::{inputs, output};

/// `windvane history`.
#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// The channel, e.g. `stable`.
    #[arg(value_name = "CHANNEL")]
    channel: String,
    /// The store: a directory, s3://BUCKET[/PREFIX], or the base URL of a static host.
    #[arg(long, value_name = "DIR|S3|URL", env = "WINDVANE_ROOT")]
    root: String,
    #[command(flatten)]
    trust: TrustArgs,
    /// Most serials listed, newest first.
    #[arg(long, value_name = "N", default_value_t = 50,
          value_parser = clap::value_parser!(u64).range(1..=1000))]
    limit: u64,
    #[command(flatten)]
    output: OutputArgs,
}

/// A signed pointer as read: verified with the trusted keys, or why not.
#[derive(Debug, Clone)]
pub enum Read {
    Verified(AcceptedRelease),
    Untrusted(String),
}

/// One row of the history.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// `None` only for a current pointer that did not verify (its serial is not known).
    pub serial: Option<u64>,
    pub trusted: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub untrusted_because: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bundle: Option<BundleRef>,
    /// The key id of the trusted key whose signature verified.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signer: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub issued_at: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Timestamp>,
    /// The channel's pointer is at this serial now.
    pub current: bool,
    /// The rollout of this serial is halted (`windvane rollout halt`; known for the current serial).
    pub halted: bool,
    /// How many halts and resumes the current serial has had.
    pub control: u64,
    /// The newest earlier serial listed whose bundle this serial carries again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub same_bundle_as: Option<u64>,
    /// On the current row: the signed history has this newer serial, so the store serves an older pointer
    /// than was published (a replay, or a half-restored store). Agents that saw the newer one refuse it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history_has_newer: Option<u64>,
}

impl Entry {
    fn untrusted(serial: Option<u64>, why: String) -> Entry {
        Entry {
            serial,
            trusted: false,
            untrusted_because: Some(why),
            bundle: None,
            signer: None,
            issued_at: None,
            expires_at: None,
            current: serial.is_none(),
            halted: false,
            control: 0,
            same_bundle_as: None,
            history_has_newer: None,
        }
    }
}

/// The rows of a channel's history (pure): `current` is the channel's pointer, `history` its entries as read,
/// newest first, each with the serial its file is named for (entries newer than the current pointer
/// included). An entry that holds another channel's or serial's pointer is untrusted; so is the current
/// serial's entry when the current pointer names another bundle for it; and the current row says so when the
/// history has a newer serial than the pointer.
pub fn entries(channel: &str, current: &Read, history: Vec<(u64, Read)>) -> Vec<Entry> {
    let current = match current {
        Read::Verified(accepted) => Some(&accepted.pointer),
        Read::Untrusted(why) => {
            return vec![Entry::untrusted(
                None,
                format!("the channel's pointer: {why} (its history cannot be walked without it)"),
            )];
        }
    };
    let mut rows: Vec<Entry> = history
        .into_iter()
        .map(|(serial, read)| row(channel, serial, read, current))
        .collect();
    let newest = rows
        .iter()
        .filter(|r| r.trusted)
        .filter_map(|r| r.serial)
        .max();
    if let (Some(current), Some(newest)) = (current, newest)
        && newest > current.serial
        && let Some(row) = rows.iter_mut().find(|r| r.current)
    {
        row.history_has_newer = Some(newest);
    }
    for i in 0..rows.len() {
        let Some(bundle) = rows[i].bundle.clone() else {
            continue;
        };
        rows[i].same_bundle_as = rows[i + 1..]
            .iter()
            .find(|older| older.bundle.as_ref() == Some(&bundle))
            .and_then(|older| older.serial);
    }
    rows
}

fn row(channel: &str, serial: u64, read: Read, current: Option<&release::ReleasePointer>) -> Entry {
    let accepted = match read {
        Read::Untrusted(why) => return Entry::untrusted(Some(serial), why),
        Read::Verified(accepted) => accepted,
    };
    let pointer = &accepted.pointer;
    if pointer.channel != channel || pointer.serial != serial {
        return Entry::untrusted(
            Some(serial),
            format!(
                "the entry holds channel {:?} serial {}, not channel {channel:?} serial {serial}",
                pointer.channel, pointer.serial
            ),
        );
    }
    let now = current.filter(|c| c.serial == serial);
    if let Some(now) = now
        && now.bundle != pointer.bundle
    {
        return Entry::untrusted(
            Some(serial),
            format!(
                "the channel's pointer names bundle {} for this serial, its signed history entry {}",
                now.bundle.sha256, pointer.bundle.sha256
            ),
        );
    }
    let rollout = now.unwrap_or(pointer).rollout.as_ref();
    Entry {
        serial: Some(serial),
        trusted: true,
        untrusted_because: None,
        bundle: Some(pointer.bundle.clone()),
        signer: Some(accepted.keyid.clone()),
        issued_at: Some(pointer.issued_at),
        expires_at: Some(now.unwrap_or(pointer).expires_at),
        current: now.is_some(),
        halted: rollout.is_some_and(|r| r.halted),
        control: rollout.map_or(0, |r| r.control),
        same_bundle_as: None,
        history_has_newer: None,
    }
}

/// Verifies a signed pointer's envelope with `trusted`.
fn check(bytes: &[u8], trusted: &TrustedKeys) -> Read {
    match release::verify_signed_pointer(bytes, trusted, release::DEFAULT_MAX_POINTER_BYTES) {
        Ok(accepted) => Read::Verified(accepted),
        Err(error) => Read::Untrusted(error.to_string()),
    }
}

pub fn history(args: HistoryArgs) -> Result<ExitCode> {
    let trusted = inputs::trusted_keys(&args.trust.trusted_keys, true)?;
    let location = StoreLocation::parse(&args.root).map_err(|source| Error::StoreLocation {
        root: args.root.clone(),
        source,
    })?;
    let channel = &args.channel;
    let runtime = runtime()?;
    let pointer = runtime
        .block_on(location.read_pointer(channel))
        .map_err(|source| Error::ReadPointer {
            location: location.to_string(),
            channel: channel.clone(),
            source,
        })?;
    let current = check(&pointer, &trusted);
    let mut read = Vec::new();
    if let Read::Verified(accepted) = &current {
        let top = newest_entry(
            &runtime,
            &location,
            channel,
            accepted.pointer.serial,
            args.limit,
        )?;
        let oldest = top.saturating_sub(args.limit - 1).max(1);
        for serial in (oldest..=top).rev() {
            let path = store::history::entry_path(channel, serial);
            // The first missing entry is where the signed history begins.
            let Some(bytes) = runtime.block_on(read_optional(&location, &path))? else {
                break;
            };
            read.push((serial, check(&bytes, &trusted)));
        }
    }
    let rows = entries(channel, &current, read);
    output::print(args.output.output, &rows, "the history", || table(&rows))?;
    let untrusted = rows.iter().filter(|r| !r.trusted).count();
    if untrusted > 0 {
        eprintln!(
            "{untrusted} of the channel's signed pointers did not verify with the --trusted-key keys (listed as UNTRUSTED)"
        );
    }
    let behind = rows.iter().find_map(|r| r.history_has_newer);
    if let Some(newer) = behind {
        eprintln!(
            "the channel's pointer is older than its signed history (which has serial {newer}): the store serves a \
             replayed or restored pointer"
        );
    }
    Ok(if untrusted == 0 && behind.is_none() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The newest serial the signed history has from `current` on: entries after the current pointer's serial
/// are looked for (at most `limit`), since a store serving an older pointer than it recorded is a finding.
fn newest_entry(
    runtime: &tokio::runtime::Runtime,
    location: &StoreLocation,
    channel: &str,
    current: u64,
    limit: u64,
) -> Result<u64> {
    let mut newest = current;
    while newest - current < limit {
        let path = store::history::entry_path(channel, newest + 1);
        if runtime.block_on(read_optional(location, &path))?.is_none() {
            break;
        }
        newest += 1;
    }
    Ok(newest)
}

/// `relative` from `location`; `None` when it is not there.
async fn read_optional(location: &StoreLocation, relative: &str) -> Result<Option<Vec<u8>>> {
    let cap = release::DEFAULT_MAX_POINTER_BYTES;
    match location.read(relative, cap, "history entry").await {
        Ok(bytes) => Ok(Some(bytes)),
        Err(store::Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Ok(None)
        }
        Err(store::Error::Http { detail, .. }) if detail.starts_with("404") => Ok(None),
        Err(source) => Err(Error::ReadHistory {
            path: location.to_string() + "/" + relative,
            source,
        }),
    }
}

fn table(rows: &[Entry]) -> String {
    // Seconds and the key id's first 16 hex digits are enough to tell entries apart; -o json has it all.
    let time = |t: Option<Timestamp>| {
        t.map_or("-".to_owned(), |t| {
            t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
        })
    };
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.serial.map_or("?".to_owned(), |s| s.to_string()),
                r.bundle
                    .as_ref()
                    .map_or("-".to_owned(), |b| b.sha256.chars().take(12).collect()),
                r.signer
                    .as_ref()
                    .map_or("-".to_owned(), |k| k.chars().take(16).collect()),
                time(r.issued_at),
                time(r.expires_at),
                notes(r),
            ]
        })
        .collect();
    output::table(
        ["SERIAL", "BUNDLE", "SIGNER", "ISSUED", "EXPIRES", "NOTES"],
        &cells,
    )
}

fn notes(row: &Entry) -> String {
    if let Some(why) = &row.untrusted_because {
        return format!("UNTRUSTED: {why}");
    }
    let mut notes = Vec::new();
    if row.current {
        notes.push("current".to_owned());
    }
    if row.halted {
        notes.push("HALTED".to_owned());
    } else if row.control > 0 {
        notes.push("resumed".to_owned());
    }
    if let Some(newer) = row.history_has_newer {
        notes.push(format!("OLDER than the signed history's serial {newer}"));
    }
    if let Some(serial) = row.same_bundle_as {
        notes.push(format!("bundle of serial {serial} again"));
    }
    notes.join(", ")
}

#[cfg(test)]
mod tests {
    use windvane_shared::spec::rollout::Rollout;

    use super::*;

    fn accepted(channel: &str, serial: u64, bundle: char) -> AcceptedRelease {
        AcceptedRelease {
            pointer: release::ReleasePointer {
                fleet: "acme".to_owned(),
                channel: channel.to_owned(),
                serial,
                issued_at: "2026-12-07T10:00:00Z".parse().expect("time"),
                expires_at: "2026-12-08T10:00:00Z".parse().expect("time"),
                bundle: BundleRef {
                    sha256: bundle.to_string().repeat(64),
                    size: 10,
                },
                allow_empty: false,
                rollout: None,
            },
            keyid: "key1".to_owned(),
        }
    }

    fn verified(channel: &str, serial: u64, bundle: char) -> Read {
        Read::Verified(accepted(channel, serial, bundle))
    }

    #[test]
    fn rows_show_signer_halt_and_a_bundle_seen_before() {
        let mut now = accepted("prod", 3, 'a');
        now.pointer.rollout = Some(Rollout {
            waves: vec![],
            halted: true,
            control: 1,
            approval: None,
        });
        let history = vec![
            (3, verified("prod", 3, 'a')),
            (2, verified("prod", 2, 'b')),
            (1, verified("prod", 1, 'a')),
        ];
        let rows = entries("prod", &Read::Verified(now), history);
        assert_eq!(rows.len(), 3);
        assert!(rows.iter().all(|r| r.trusted));
        assert!(rows[0].current && rows[0].halted && rows[0].control == 1);
        assert_eq!(
            rows[0].same_bundle_as,
            Some(1),
            "serial 3 rolled back to 1's bundle"
        );
        assert_eq!(rows[1].same_bundle_as, None);
        assert!(!rows[1].current && !rows[1].halted);
        assert_eq!(rows[2].signer.as_deref(), Some("key1"));
        let text = table(&rows);
        assert!(text.starts_with("SERIAL   BUNDLE"), "{text}");
        assert!(
            text.lines()
                .nth(1)
                .is_some_and(|l| l.ends_with("current, HALTED, bundle of serial 1 again")),
            "{text}"
        );
    }

    #[test]
    fn a_pointer_older_than_the_signed_history_is_said_on_its_row() {
        let history = vec![(3, verified("prod", 3, 'c')), (2, verified("prod", 2, 'b'))];
        let rows = entries("prod", &verified("prod", 2, 'b'), history);
        assert!(!rows[0].current && rows[1].current);
        assert_eq!(rows[1].history_has_newer, Some(3));
        assert_eq!(
            notes(&rows[1]),
            "current, OLDER than the signed history's serial 3"
        );
        let rows = entries(
            "prod",
            &verified("prod", 3, 'c'),
            vec![(3, verified("prod", 3, 'c'))],
        );
        assert_eq!(rows[0].history_has_newer, None);
    }

    #[test]
    fn an_entry_that_does_not_verify_or_is_misplaced_is_shown_untrusted() {
        let history = vec![
            (3, verified("prod", 3, 'a')),
            (2, Read::Untrusted("signed by an unknown key k9".to_owned())),
            (1, verified("staging", 1, 'c')),
        ];
        let rows = entries("prod", &verified("prod", 3, 'a'), history);
        assert!(rows[0].trusted);
        assert!(!rows[1].trusted && rows[1].bundle.is_none() && rows[1].signer.is_none());
        assert_eq!(notes(&rows[1]), "UNTRUSTED: signed by an unknown key k9");
        assert!(!rows[2].trusted);
        assert!(
            notes(&rows[2]).contains("holds channel \"staging\" serial 1"),
            "{rows:?}"
        );
    }

    #[test]
    fn a_current_pointer_that_disagrees_with_its_entry_or_does_not_verify_is_untrusted() {
        let rows = entries(
            "prod",
            &verified("prod", 2, 'z'),
            vec![(2, verified("prod", 2, 'b'))],
        );
        assert!(!rows[0].trusted, "{rows:?}");
        let rows = entries("prod", &Read::Untrusted("bad signature".to_owned()), vec![]);
        assert_eq!(rows.len(), 1);
        assert!(!rows[0].trusted && rows[0].current && rows[0].serial.is_none());
        let json = serde_json::to_value(&rows[0]).expect("json");
        assert_eq!(json["serial"], serde_json::Value::Null);
    }
}
