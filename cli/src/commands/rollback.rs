//! `windvane rollback`: publishes, as a new serial (so that rollback protection stays intact), a bundle that
//! an earlier signed pointer of the same channel named (`windvane_store::history`), after printing what it
//! changes (`diff.rs`). The current pointer it starts from is checked first: the channel's and fleet's own,
//! and not older than the channel's signed history.

use clap::Args;
use jiff::Timestamp;
use windvane_store::{self as store, PublishRequest};

use crate::args::{ExpiryArgs, SignArgs};
use crate::error::{Error, Result};
use crate::http::block_on;
use crate::inputs::Signer;
use crate::stored::stored_bundle;

/// `windvane rollback`.
#[derive(Debug, Args)]
pub struct RollbackArgs {
    #[command(flatten)]
    sign: SignArgs,
    #[command(flatten)]
    expiry: ExpiryArgs,
    /// The serial to go back to (its signed pointer must be in the channel's history); default: the newest
    /// earlier serial with another bundle.
    #[arg(long, value_name = "SERIAL")]
    to: Option<u64>,
    /// Print what the rollback would change and stop without signing.
    #[arg(long)]
    dry_run: bool,
}

pub fn rollback(args: RollbackArgs) -> Result<()> {
    let sign = &args.sign;
    let (root, channel) = (&sign.store.root, &sign.channel.channel);
    let signer = Signer::load(&sign.key.key, &sign.trust.trusted_keys)?;
    let all = signer.with_own_key()?;
    let asked = store::history::Asked {
        channel,
        fleet: sign.fleet.fleet.as_deref(),
        now: Timestamp::now(),
        expired_ok: true,
    };
    let history = |source| Error::History {
        channel: channel.clone(),
        source,
    };
    let current = block_on(store::history::current(root, &all, &asked))?.map_err(history)?;
    let earlier =
        block_on(store::history::earlier_entries(root, &current, &all))?.map_err(history)?;
    let target =
        store::history::rollback_target(&current, &earlier, args.to).map_err(|source| {
            Error::RollbackTarget {
                channel: channel.clone(),
                source,
            }
        })?;
    let bundle = stored_bundle(root, &target.bundle.sha256, &current.fleet)?;
    let now = stored_bundle(root, &current.bundle.sha256, &current.fleet)?;
    println!(
        "rolling back channel {channel} from serial {} (bundle {}) to the bundle of serial {} ({}):",
        current.serial, current.bundle.sha256, target.serial, target.bundle.sha256
    );
    for line in crate::diff::bundle_changes(&now, &bundle) {
        println!("  {}", crate::terminal::clean_line(&line));
    }
    if args.dry_run {
        println!("dry run: nothing signed");
        return Ok(());
    }
    let request = PublishRequest {
        channel,
        bundle: &bundle,
        key: &signer.key,
        also_trusted: &signer.trusted,
        expires_in: args.expiry.expires_in,
        allow_empty: target.allow_empty,
        now: Timestamp::now(),
    };
    let published = block_on(store::publish(root, &request))?.map_err(|source| Error::Publish {
        channel: channel.clone(),
        store: root.to_string(),
        source,
    })?;
    println!(
        "rolled back channel {channel}: serial {} carries the bundle of serial {} again ({})",
        published.pointer.serial, target.serial, target.bundle.sha256
    );
    Ok(())
}
