//! `windvane rollout status|halt|resume` and `windvane rollback`. Status reads the source server's rollout
//! view (`/api/v1/rollouts/CHANNEL`) and exits 0 only when the rollout is complete; halt and resume re-sign
//! the channel's current pointer with its rollout halted or running (`windvane_store::set_halted`); rollback
//! publishes, as a new serial (so that rollback protection stays intact), a bundle that an earlier signed
//! pointer of the same channel named (`windvane_store::history`), after printing what it changes.
//! Every command here that signs checks first that the pointer it read is the channel's and fleet's own,
//! unexpired, and not older than the channel's signed history.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use jiff::Timestamp;
use windvane_shared::crypto::keys;
use windvane_shared::decide::rollout::RolloutView;
use windvane_shared::format::bundle::{Bundle, BundleLimits};
use windvane_store::{self as store, PublishRequest};

/// `windvane rollout …`.
#[derive(Debug, Args)]
pub struct RolloutArgs {
    #[command(subcommand)]
    action: RolloutAction,
}

#[derive(Debug, Subcommand)]
enum RolloutAction {
    /// Print each wave of the channel's current rollout; exit 0 only when every cluster has it, Synced.
    Status(StatusArgs),
    /// Sign a halt of the channel's current serial: clusters that have not taken it stay where they are.
    Halt(SignArgs),
    /// Sign a resume of a halted rollout: waiting clusters go on by the signed schedule.
    Resume(SignArgs),
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The source server, e.g. https://windvane.example.com.
    #[arg(long, env = "WINDVANE_SERVER", value_name = "URL")]
    server: String,
    #[arg(long, env = "WINDVANE_CHANNEL", value_name = "CHANNEL")]
    channel: String,
    /// File with the server's read token, if it requires one.
    #[arg(long, env = "WINDVANE_READ_TOKEN_FILE", value_name = "FILE")]
    read_token_file: Option<PathBuf>,
    /// Output format.
    #[arg(long, env = "WINDVANE_OUTPUT", default_value = "table", value_parser = ["table", "json"])]
    output: String,
}

#[derive(Debug, Args)]
pub struct SignArgs {
    #[arg(long, value_name = "STORE", env = "WINDVANE_ROOT", value_parser = crate::parse_store_arg, help = crate::ROOT_HELP)]
    root: store::Store,
    #[arg(long, value_name = "CHANNEL", env = "WINDVANE_CHANNEL")]
    channel: String,
    /// The release signing key.
    #[arg(long, value_name = "KEY", env = "WINDVANE_KEY")]
    key: PathBuf,
    /// Public keys that may have signed the current pointer besides KEY.
    #[arg(
        long = "trusted-key",
        value_name = "PUB",
        value_delimiter = ',',
        env = "WINDVANE_TRUSTED_KEYS"
    )]
    trusted_keys: Vec<PathBuf>,
    #[command(flatten)]
    fleet: FleetArg,
}

/// The fleet a command acts on, checked against every pointer it reads.
#[derive(Debug, Clone, Args)]
pub struct FleetArg {
    /// The fleet the channel must belong to; default: the fleet of the channel's signed history.
    #[arg(long, value_name = "FLEET", env = "WINDVANE_FLEET")]
    fleet: Option<String>,
}

/// `windvane promote`.
#[derive(Debug, Args)]
pub struct PromoteArgs {
    #[arg(long, value_name = "STORE", env = "WINDVANE_ROOT", value_parser = crate::parse_store_arg, help = crate::ROOT_HELP)]
    root: store::Store,
    /// The channel whose current bundle is promoted, e.g. `staging`.
    #[arg(long, value_name = "CHANNEL")]
    from: String,
    /// The channel it is published on, e.g. `prod`.
    #[arg(long, value_name = "CHANNEL")]
    to: String,
    /// The release signing key.
    #[arg(long, value_name = "KEY", env = "WINDVANE_KEY")]
    key: PathBuf,
    /// Public keys that may have signed the channels' pointers besides KEY.
    #[arg(
        long = "trusted-key",
        value_name = "PUB",
        value_delimiter = ',',
        env = "WINDVANE_TRUSTED_KEYS"
    )]
    trusted_keys: Vec<PathBuf>,
    /// Promote only when every cluster this selector picks (at least one) follows --from and is Synced on
    /// its current serial, as the server shows; needs --server.
    #[arg(long, value_name = "SEL", requires = "server")]
    require_synced: Option<String>,
    /// The source server to check --require-synced against.
    #[arg(long, env = "WINDVANE_SERVER", value_name = "URL")]
    server: Option<String>,
    /// File with the server's read token, if it requires one.
    #[arg(long, env = "WINDVANE_READ_TOKEN_FILE", value_name = "FILE")]
    read_token_file: Option<PathBuf>,
    /// How long agents accept the promoted release.
    #[arg(long, value_name = "DURATION", default_value = "30d", value_parser = crate::release::parse_duration_arg, env = "WINDVANE_EXPIRES_IN")]
    expires_in: std::time::Duration,
    #[command(flatten)]
    fleet: FleetArg,
}

/// `windvane approve`.
#[derive(Debug, Args)]
pub struct ApproveArgs {
    #[arg(long, value_name = "STORE", env = "WINDVANE_ROOT", value_parser = crate::parse_store_arg, help = crate::ROOT_HELP)]
    root: store::Store,
    #[arg(long, value_name = "CHANNEL", env = "WINDVANE_CHANNEL")]
    channel: String,
    /// The serial approved: it must be the channel's current one.
    #[arg(long, value_name = "N")]
    serial: u64,
    /// The approver's signing key (not the key that published the release).
    #[arg(long, value_name = "KEY", env = "WINDVANE_APPROVER_KEY_FILE")]
    key: PathBuf,
    /// The release keys the current pointer is verified with before it is approved (one at least).
    #[arg(
        long = "trusted-key",
        value_name = "PUB",
        value_delimiter = ',',
        env = "WINDVANE_TRUSTED_KEYS",
        required = true
    )]
    trusted_keys: Vec<PathBuf>,
    #[command(flatten)]
    fleet: FleetArg,
}

/// `windvane approve`: verify the channel's current release, then add this approver's signature to
/// `approvals/<channel>/<serial>.json`.
pub fn approve(args: ApproveArgs) -> anyhow::Result<()> {
    let (key, trusted) = signing_key(&SignArgs {
        root: args.root.clone(),
        channel: args.channel.clone(),
        key: args.key.clone(),
        trusted_keys: args.trusted_keys.clone(),
        fleet: args.fleet.clone(),
    })?;
    let (pointer, signatures) = crate::block_on(store::approve(
        &args.root,
        &args.channel,
        args.fleet.fleet.as_deref(),
        args.serial,
        &key,
        &trusted,
    ))?
    .with_context(|| {
        format!(
            "approving channel {:?} serial {}",
            args.channel, args.serial
        )
    })?;
    let needed = pointer
        .rollout
        .as_ref()
        .and_then(|r| r.approval)
        .map(|a| a.threshold);
    println!(
        "approved channel {} serial {} (bundle {}) with key {}: {signatures} approval signature(s) in {}",
        pointer.channel,
        pointer.serial,
        pointer.bundle.sha256,
        keys::keyid(&key.verifying_key()),
        windvane_shared::decide::approval::approval_path(&pointer.channel, pointer.serial),
    );
    match needed {
        Some(threshold) => println!("the release requires {threshold} approval(s)"),
        None => println!("note: this release does not require approval (no rollout.approval)"),
    }
    Ok(())
}

/// `windvane rollback`.
#[derive(Debug, Args)]
pub struct RollbackArgs {
    #[command(flatten)]
    sign: SignArgs,
    /// How long agents accept the rollback release.
    #[arg(long, value_name = "DURATION", default_value = "30d", value_parser = crate::release::parse_duration_arg, env = "WINDVANE_EXPIRES_IN")]
    expires_in: std::time::Duration,
    /// The serial to go back to (its signed pointer must be in the channel's history); default: the newest
    /// earlier serial with another bundle.
    #[arg(long, value_name = "SERIAL")]
    to: Option<u64>,
    /// Print what the rollback would change and stop without signing.
    #[arg(long)]
    dry_run: bool,
}

pub fn rollout(args: RolloutArgs) -> anyhow::Result<ExitCode> {
    match args.action {
        RolloutAction::Status(args) => status(args),
        RolloutAction::Halt(args) => halt(args, true).map(|()| ExitCode::SUCCESS),
        RolloutAction::Resume(args) => halt(args, false).map(|()| ExitCode::SUCCESS),
    }
}

/// `trusted` and the signer's own key: what a pointer this signer or a trusted key signed verifies with.
fn with_own_key(
    trusted: &keys::TrustedKeys,
    key: &ed25519_dalek::SigningKey,
) -> anyhow::Result<keys::TrustedKeys> {
    let mut all = trusted.clone();
    all.insert(key.verifying_key())?;
    Ok(all)
}

fn signing_key(args: &SignArgs) -> anyhow::Result<(ed25519_dalek::SigningKey, keys::TrustedKeys)> {
    let pem = super::read_text(&args.key)?;
    let key = keys::signing_key_from_pem(&pem, &args.key.display().to_string())?;
    let mut trusted = keys::TrustedKeys::new();
    for path in &args.trusted_keys {
        let pem = super::read_text(path)?;
        trusted.insert(keys::verifying_key_from_pem(
            &pem,
            &path.display().to_string(),
        )?)?;
    }
    Ok((key, trusted))
}

fn halt(args: SignArgs, halted: bool) -> anyhow::Result<()> {
    let (key, trusted) = signing_key(&args)?;
    let pointer = crate::block_on(store::set_halted(
        &args.root,
        &args.channel,
        args.fleet.fleet.as_deref(),
        &key,
        &trusted,
        halted,
    ))?
    .with_context(|| format!("channel {:?} in {}", args.channel, args.root))?;
    println!(
        "{} the rollout of serial {} on channel {} (control {})",
        if halted { "halted" } else { "resumed" },
        pointer.serial,
        pointer.channel,
        pointer.rollout.map_or(0, |r| r.control)
    );
    Ok(())
}

pub fn rollback(args: RollbackArgs) -> anyhow::Result<()> {
    let sign = &args.sign;
    let (key, trusted) = signing_key(sign)?;
    let all = with_own_key(&trusted, &key)?;
    let asked = store::history::Asked {
        channel: &sign.channel,
        fleet: sign.fleet.fleet.as_deref(),
        now: Timestamp::now(),
        expired_ok: true,
    };
    let current = crate::block_on(store::history::current(&sign.root, &all, &asked))??;
    let earlier = crate::block_on(store::history::earlier_entries(&sign.root, &current, &all))??;
    let target = store::history::rollback_target(&current, &earlier, args.to)?;
    let bundle = stored_bundle(&sign.root, &target.bundle.sha256, &current.fleet)?;
    let now = stored_bundle(&sign.root, &current.bundle.sha256, &current.fleet)?;
    println!(
        "rolling back channel {} from serial {} (bundle {}) to the bundle of serial {} ({}):",
        sign.channel, current.serial, current.bundle.sha256, target.serial, target.bundle.sha256
    );
    for line in crate::diff::bundle_changes(&now, &bundle) {
        println!("  {}", crate::terminal::clean_line(&line));
    }
    if args.dry_run {
        println!("dry run: nothing signed");
        return Ok(());
    }
    let request = PublishRequest {
        channel: &sign.channel,
        bundle: &bundle,
        key: &key,
        also_trusted: &trusted,
        expires_in: args.expires_in,
        allow_empty: target.allow_empty,
        now: Timestamp::now(),
    };
    let published = crate::block_on(store::publish(&sign.root, &request))??;
    println!(
        "rolled back channel {}: serial {} carries the bundle of serial {} again ({})",
        sign.channel, published.pointer.serial, target.serial, target.bundle.sha256
    );
    Ok(())
}

fn status(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let url = format!(
        "{}/api/v1/rollouts/{}",
        args.server.trim_end_matches('/'),
        args.channel
    );
    let token = args
        .read_token_file
        .as_ref()
        .map(|p| super::read_text(p).map(|t| t.trim().to_owned()))
        .transpose()?;
    let view: RolloutView = crate::fleet::get_json(&url, token.as_deref())?;
    if args.output == "json" {
        println!("{}", serde_json::to_string_pretty(&view)?);
    } else {
        print!("{}", crate::terminal::clean(&render(&view)));
    }
    if view.complete {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("rollout of serial {} not complete", view.serial);
        Ok(ExitCode::FAILURE)
    }
}

/// The rollout as a table: one block per wave.
pub fn render(view: &RolloutView) -> String {
    let mut out = format!(
        "channel {} serial {} issued {}{}{}\n",
        view.channel,
        view.serial,
        view.issued_at,
        if view.halted { " · HALTED" } else { "" },
        if view.complete { " · complete" } else { "" }
    );
    for wave in &view.waves {
        out.push_str(&format!(
            "{:<12} {:<9} opens {}  done {} pending {} failed {} unknown {}\n",
            wave.name,
            if wave.opened { "open" } else { "not open" },
            wave.opens_at,
            wave.done,
            wave.pending,
            wave.failed,
            wave.unknown
        ));
        if let Some(held) = &wave.held {
            out.push_str(&format!("  held: {held}\n"));
        }
        for cluster in &wave.clusters {
            out.push_str(&format!(
                "  {:<24} {:<12} serial {:<6} {:?}{}\n",
                cluster.name,
                cluster.state.as_str(),
                cluster
                    .applied_serial
                    .map_or("-".to_owned(), |s| s.to_string()),
                cluster.phase,
                cluster
                    .waiting
                    .as_deref()
                    .map(|w| format!("  {w}"))
                    .unwrap_or_default()
            ));
        }
    }
    out
}

/// Reads the bundle `sha256` from the store, checking its digest and that it is `fleet`'s.
fn stored_bundle(root: &store::Store, sha256: &str, fleet: &str) -> anyhow::Result<Bundle> {
    let path = store::bundle_path(sha256);
    let described = root.describe(&path);
    let cap = windvane_shared::format::release::DEFAULT_MAX_BUNDLE_BYTES;
    let bytes = crate::block_on(root.read(&path, cap, "bundle"))??
        .with_context(|| format!("{}: not in the store", described.display()))?;
    if windvane_shared::crypto::digest::sha256_hex(&bytes) != sha256 {
        bail!("{}: the file does not have its digest", described.display());
    }
    let bundle = Bundle::from_json_slice(&bytes, BundleLimits::default())
        .with_context(|| described.display().to_string())?;
    if windvane_shared::crypto::digest::sha256_hex(&bundle.to_json_bytes()) != sha256 {
        bail!(
            "{}: the bundle does not serialize back to the same bytes, so it cannot be signed again with the same digest",
            described.display()
        );
    }
    if bundle.fleet != fleet {
        bail!(
            "{}: the bundle is fleet {:?}'s, not {fleet:?}'s; refusing to sign it",
            described.display(),
            bundle.fleet
        );
    }
    Ok(bundle)
}

/// `None` when every cluster of `fleet` (at least one) follows `channel` and is Synced on `serial`;
/// otherwise why not. Pure.
pub fn synced_on(
    fleet: &windvane_shared::wire::fleet_api::FleetView,
    channel: &str,
    serial: u64,
) -> Option<String> {
    if fleet.clusters.is_empty() {
        return Some("no cluster matches the selector".to_owned());
    }
    let behind: Vec<String> = fleet
        .clusters
        .iter()
        .filter(|c| {
            c.state != windvane_shared::wire::fleet_api::ClusterState::Synced
                || c.channel.as_deref() != Some(channel)
                || c.applied_serial != Some(serial)
        })
        .map(|c| {
            format!(
                "{} is {} on {} serial {}",
                c.name,
                c.state,
                c.channel.as_deref().unwrap_or("no channel"),
                c.applied_serial.map_or("-".to_owned(), |s| s.to_string())
            )
        })
        .collect();
    (!behind.is_empty()).then(|| behind.join(", "))
}

pub fn promote(args: PromoteArgs) -> anyhow::Result<()> {
    let (key, trusted) = signing_key(&SignArgs {
        root: args.root.clone(),
        channel: args.from.clone(),
        key: args.key.clone(),
        trusted_keys: args.trusted_keys.clone(),
        fleet: args.fleet.clone(),
    })?;
    let all = with_own_key(&trusted, &key)?;
    let asked = store::history::Asked {
        channel: &args.from,
        fleet: args.fleet.fleet.as_deref(),
        now: Timestamp::now(),
        expired_ok: false,
    };
    let source = crate::block_on(store::history::current(&args.root, &all, &asked))??;
    if let (Some(selector), Some(server)) = (&args.require_synced, &args.server) {
        let query: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("selector", selector)
            .finish();
        let url = format!("{}/api/v1/fleet?{query}", server.trim_end_matches('/'));
        let token = args
            .read_token_file
            .as_ref()
            .map(|p| super::read_text(p).map(|t| t.trim().to_owned()))
            .transpose()?;
        let fleet: windvane_shared::wire::fleet_api::FleetView =
            crate::fleet::get_json(&url, token.as_deref())?;
        if let Some(why) = synced_on(&fleet, &args.from, source.serial) {
            bail!(
                "not promoting serial {} of {}: not every {selector} cluster is Synced on it: {why}",
                source.serial,
                args.from
            );
        }
    }
    let bundle = stored_bundle(&args.root, &source.bundle.sha256, &source.fleet)?;
    let request = PublishRequest {
        channel: &args.to,
        bundle: &bundle,
        key: &key,
        also_trusted: &trusted,
        expires_in: args.expires_in,
        allow_empty: source.allow_empty,
        now: Timestamp::now(),
    };
    let published = crate::block_on(store::publish(&args.root, &request))??;
    println!(
        "promoted {} serial {} to {} serial {}: bundle {}",
        args.from,
        source.serial,
        args.to,
        published.pointer.serial,
        published.pointer.bundle.sha256
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use windvane_shared::wire::fleet_api::FleetView;

    fn fleet(rows: &[(&str, &str, &str, u64)]) -> FleetView {
        let clusters: Vec<serde_json::Value> = rows
            .iter()
            .map(|(name, state, channel, serial)| {
                serde_json::json!({
                    "name": name, "fleet": "acme", "labels": {}, "state": state, "graceSeconds": 90,
                    "channel": channel, "appliedSerial": serial, "driftTotal": 0,
                    "enrolledAt": "2026-12-04T10:00:00Z", "keyid": "k", "sequence": 1
                })
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "generatedAt": "2026-12-04T10:00:00Z", "total": rows.len(), "counts": {}, "clusters": clusters
        }))
        .expect("fleet")
    }

    #[test]
    fn promotion_requires_every_selected_cluster_synced_on_the_source_serial() {
        let all = fleet(&[
            ("s1", "Synced", "staging", 4),
            ("s2", "Synced", "staging", 4),
        ]);
        assert_eq!(synced_on(&all, "staging", 4), None);
        for (rows, says) in [
            (
                vec![
                    ("s1", "Synced", "staging", 4),
                    ("s2", "OutOfSync", "staging", 4),
                ],
                "s2 is OutOfSync",
            ),
            (
                vec![("s1", "Synced", "staging", 3)],
                "s1 is Synced on staging serial 3",
            ),
            (vec![("s1", "Unknown", "staging", 4)], "s1 is Unknown"),
            (vec![("s1", "Synced", "prod", 4)], "on prod"),
            (vec![], "no cluster"),
        ] {
            let why = synced_on(&fleet(&rows), "staging", 4).expect("refused");
            assert!(why.contains(says), "{why}");
        }
    }
}
