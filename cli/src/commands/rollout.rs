//! `windvane rollout status|halt|resume`. Status reads the source server's rollout view
//! (`/api/v1/rollouts/CHANNEL`) and exits 0 only when the rollout is complete; halt and resume re-sign the
//! channel's current pointer with its rollout halted or running (`windvane_store::set_halted`), after checking
//! that the pointer it read is the channel's and fleet's own, unexpired, and not older than the channel's
//! signed history.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use windvane_shared::decide::rollout::RolloutView;
use windvane_store as store;

use crate::args::{ChannelArgs, OutputArgs, ReadTokenArgs, ServerArgs, SignArgs};
use crate::error::{Error, Result};
use crate::http::{self, block_on};
use crate::inputs::{self, Signer};
use crate::output;

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
    #[command(flatten)]
    server: ServerArgs,
    #[command(flatten)]
    channel: ChannelArgs,
    #[command(flatten)]
    token: ReadTokenArgs,
    #[command(flatten)]
    output: OutputArgs,
}

pub fn rollout(args: RolloutArgs) -> Result<ExitCode> {
    match args.action {
        RolloutAction::Status(args) => status(args),
        RolloutAction::Halt(args) => halt(args, true).map(|()| ExitCode::SUCCESS),
        RolloutAction::Resume(args) => halt(args, false).map(|()| ExitCode::SUCCESS),
    }
}

fn halt(args: SignArgs, halted: bool) -> Result<()> {
    let signer = Signer::load(&args.key.key, &args.trust.trusted_keys)?;
    let (root, channel) = (&args.store.root, &args.channel.channel);
    let pointer = block_on(store::set_halted(
        root,
        channel,
        args.fleet.fleet.as_deref(),
        &signer.key,
        &signer.trusted,
        halted,
    ))?
    .map_err(|source| Error::SetHalted {
        channel: channel.clone(),
        store: root.to_string(),
        source,
    })?;
    println!(
        "{} the rollout of serial {} on channel {} (control {})",
        if halted { "halted" } else { "resumed" },
        pointer.serial,
        pointer.channel,
        pointer.rollout.map_or(0, |r| r.control)
    );
    Ok(())
}

fn status(args: StatusArgs) -> Result<ExitCode> {
    let url = format!(
        "{}/api/v1/rollouts/{}",
        args.server.server.trim_end_matches('/'),
        args.channel.channel
    );
    let token = inputs::read_token_file(args.token.read_token_file.as_ref())?;
    let view: RolloutView = http::get_json(&url, token.as_deref())?;
    output::print(args.output.output, &view, "the rollout", || render(&view))?;
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
