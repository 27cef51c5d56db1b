//! `windvane rollout status|halt|resume` and `windvane rollback`. Status reads the source server's rollout
//! view (`/api/v1/rollouts/CHANNEL`) and exits 0 only when the rollout is complete; halt and resume re-sign
//! the channel's current pointer with its rollout halted or running (`windvane_store::set_halted`); rollback
//! publishes the bundle the channel carried before as a new serial, so that rollback protection stays intact.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use jiff::Timestamp;
use windvane_shared::bundle::{Bundle, BundleLimits};
use windvane_shared::keys;
use windvane_shared::rollout::RolloutView;
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
    /// The store directory.
    #[arg(long, value_name = "DIR", env = "WINDVANE_ROOT")]
    root: PathBuf,
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
}

/// `windvane rollback`.
#[derive(Debug, Args)]
pub struct RollbackArgs {
    #[command(flatten)]
    sign: SignArgs,
    /// How long agents accept the rollback release.
    #[arg(long, value_name = "DURATION", default_value = "30d", value_parser = crate::release::parse_duration_arg, env = "WINDVANE_EXPIRES_IN")]
    expires_in: std::time::Duration,
}

pub fn rollout(args: RolloutArgs) -> anyhow::Result<ExitCode> {
    match args.action {
        RolloutAction::Status(args) => status(args),
        RolloutAction::Halt(args) => halt(args, true).map(|()| ExitCode::SUCCESS),
        RolloutAction::Resume(args) => halt(args, false).map(|()| ExitCode::SUCCESS),
    }
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
    let pointer = store::set_halted(&args.root, &args.channel, &key, &trusted, halted)
        .with_context(|| format!("channel {:?} in {}", args.channel, args.root.display()))?;
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
    let pointer_path = sign.root.join(store::channel_path(&sign.channel));
    let bytes = std::fs::read(&pointer_path).with_context(|| pointer_path.display().to_string())?;
    let mut all = trusted.clone();
    all.insert(key.verifying_key())?;
    let current = windvane_shared::release::verify_signed_pointer(
        &bytes,
        &all,
        windvane_shared::release::DEFAULT_MAX_POINTER_BYTES,
    )
    .with_context(|| pointer_path.display().to_string())?
    .pointer;
    let previous = store::previous_bundle(&sign.root, &sign.channel, &current.bundle.sha256)?;
    let bundle_path = sign.root.join(store::bundle_path(&previous));
    let bundle_bytes =
        std::fs::read(&bundle_path).with_context(|| bundle_path.display().to_string())?;
    if windvane_shared::digest::sha256_hex(&bundle_bytes) != previous {
        bail!(
            "{}: the file does not have its digest",
            bundle_path.display()
        );
    }
    let bundle = Bundle::from_json_slice(&bundle_bytes, BundleLimits::default())
        .with_context(|| bundle_path.display().to_string())?;
    let request = PublishRequest {
        channel: &sign.channel,
        bundle: &bundle,
        key: &key,
        also_trusted: &trusted,
        expires_in: args.expires_in,
        allow_empty: current.allow_empty,
        now: Timestamp::now(),
    };
    let published = store::publish(&sign.root, &request)?;
    println!(
        "rolled back channel {}: serial {} carries bundle {} again (was serial {} with {})",
        sign.channel, published.pointer.serial, previous, current.serial, current.bundle.sha256
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
        print!("{}", render(&view));
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
                "  {:<24} {:<12} serial {:<6} {:?}\n",
                cluster.name,
                cluster.state.as_str(),
                cluster
                    .applied_serial
                    .map_or("-".to_owned(), |s| s.to_string()),
                cluster.phase
            ));
        }
    }
    out
}
