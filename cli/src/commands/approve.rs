//! `windvane approve`: verifies the channel's current release with the release keys, then adds this
//! approver's signature to `approvals/<channel>/<serial>.json` (`windvane_store::approve`). The approver's key
//! is not a release key: it has its own flag's variable, `WINDVANE_APPROVER_KEY_FILE`.

use std::path::PathBuf;

use clap::Args;
use windvane_shared::crypto::keys;
use windvane_store as store;

use crate::args::{ChannelArgs, FleetArgs, StoreArgs, TrustArgs};
use crate::error::{Error, Result};
use crate::http::block_on;
use crate::inputs::Signer;

/// `windvane approve`.
#[derive(Debug, Args)]
#[command(mut_args(|a| if a.get_id() == "trusted_keys" {
    // Approving needs the release keys: the release is verified before it is approved.
    a.required(true)
        .help("The release keys the current pointer is verified with before it is approved (one at least)")
} else {
    a
}))]
pub struct ApproveArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    channel: ChannelArgs,
    /// The serial approved: it must be the channel's current one.
    #[arg(long, value_name = "N")]
    serial: u64,
    /// The approver's signing key (not the key that published the release).
    #[arg(long, value_name = "KEY", env = "WINDVANE_APPROVER_KEY_FILE")]
    key: PathBuf,
    #[command(flatten)]
    trust: TrustArgs,
    #[command(flatten)]
    fleet: FleetArgs,
}

pub fn approve(args: ApproveArgs) -> Result<()> {
    let signer = Signer::load(&args.key, &args.trust.trusted_keys)?;
    let channel = &args.channel.channel;
    let (pointer, signatures) = block_on(store::approve(
        &args.store.root,
        channel,
        args.fleet.fleet.as_deref(),
        args.serial,
        &signer.key,
        &signer.trusted,
    ))?
    .map_err(|source| Error::Approve {
        channel: channel.clone(),
        serial: args.serial,
        source,
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
        keys::keyid(&signer.key.verifying_key()),
        windvane_shared::decide::approval::approval_path(&pointer.channel, pointer.serial),
    );
    // The publisher's threshold is only half of it: an agent started with `--require-approvals N` applies
    // the release only with N approvals, whatever the rollout says; the CLI cannot see that floor.
    let floor =
        "agents started with --require-approvals N wait for N approvals by distinct approver keys";
    match needed {
        Some(threshold) => println!("the release requires {threshold} approval(s); {floor}"),
        None => {
            println!("note: this release does not require approval (no rollout.approval); {floor}")
        }
    }
    Ok(())
}
