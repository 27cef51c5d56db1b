//! `windvane publish`: signs a fleet tree (built as `build` builds it) or a built bundle and publishes it on
//! a channel of a store, as the next serial. The store's layout, its lock and the checks of the channel's
//! current pointer (signed by a trusted key, this fleet's) are `windvane_store::publish`'s.

use std::path::PathBuf;

use clap::Args;
use jiff::Timestamp;
use windvane_shared::crypto::keys;
use windvane_store::{self as store, PublishRequest};

use crate::args::{ChannelArgs, ExpiryArgs, SigningArgs, StoreArgs, StrictArgs, TrustArgs, reword};
use crate::commands::build::load_bundle_source;
use crate::engines::EngineArgs;
use crate::error::{Error, Result};
use crate::http::block_on;
use crate::inputs;

#[derive(Debug, Args)]
#[command(mut_args(|a| reword(a, "channel", "The channel to publish on, e.g. `stable`")))]
#[command(mut_args(|a| reword(a, "trusted_keys",
    "Public keys that may have signed the channel's current pointer besides KEY (the old key during a rotation)"
)))]
pub struct PublishArgs {
    /// A fleet source tree (directory with fleet.yaml) or a bundle written by `windvane build`.
    #[arg(value_name = "SOURCE")]
    source: PathBuf,
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    channel: ChannelArgs,
    #[command(flatten)]
    key: SigningArgs,
    #[command(flatten)]
    expiry: ExpiryArgs,
    /// Allow publishing a release with no objects (clusters that prune will remove everything).
    #[arg(long, env = "WINDVANE_ALLOW_EMPTY")]
    allow_empty: bool,
    #[command(flatten)]
    trust: TrustArgs,
    #[command(flatten)]
    strict: StrictArgs,
    #[command(flatten)]
    engines: EngineArgs,
}

pub fn publish(args: PublishArgs) -> Result<()> {
    let bundle = load_bundle_source(&args.source, &args.engines, args.strict.strict)?;
    inputs::warn_if_readable_by_others(&args.key.key);
    let key = inputs::signing_key(&args.key.key)?;
    let also_trusted = inputs::trusted_keys(&args.trust.trusted_keys, false)?;
    let (root, channel) = (&args.store.root, &args.channel.channel);
    let request = PublishRequest {
        channel,
        bundle: &bundle,
        key: &key,
        also_trusted: &also_trusted,
        expires_in: args.expiry.expires_in,
        allow_empty: args.allow_empty,
        now: Timestamp::now(),
    };
    let published = block_on(store::publish(root, &request))?.map_err(|source| Error::Publish {
        channel: channel.clone(),
        store: root.to_string(),
        source,
    })?;
    let pointer = &published.pointer;
    let previous = published
        .previous_serial
        .map_or("first release".to_owned(), |s| format!("was {s}"));
    println!(
        "published fleet {} on channel {}: serial {} ({previous})",
        pointer.fleet, pointer.channel, pointer.serial
    );
    println!(
        "bundle:  {} ({} bytes{})",
        store::bundle_path(&pointer.bundle.sha256),
        pointer.bundle.size,
        if published.bundle_was_new {
            ""
        } else {
            ", already in the store"
        }
    );
    println!("signed:  key {}", keys::keyid(&key.verifying_key()));
    println!("expires: {} (re-publish before then)", pointer.expires_at);
    Ok(())
}
