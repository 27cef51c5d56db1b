//! `windvane verify`: reads a channel's signed pointer and its bundle from a store (a directory, a bucket or
//! any static host's URL), verifies both as an agent with no history would, and describes the release. Also
//! how `render --root` reads a published release.

use std::time::Duration;

use clap::Args;
use jiff::Timestamp;
use serde::Serialize;
use windvane_shared::crypto::keys::TrustedKeys;
use windvane_shared::format::bundle::{Bundle, BundleLimits};
use windvane_shared::format::release::{
    self, AcceptedRelease, PointerExpectations, ReleasePointer,
};
use windvane_shared::text::duration::format_duration;
use windvane_store::{self as store, StoreLocation};

use crate::args::{FleetArgs, OutputArgs, TrustArgs, reword};
use crate::error::{Error, Result};
use crate::http::runtime;
use crate::{inputs, output};

/// Where a release comes from, verified, for `verify` and `render --root`.
#[derive(Debug, Args)]
#[command(mut_args(|a| reword(a, "fleet",
    "The fleet the release must be for (an agent always knows its fleet); default: whatever the pointer says"
)))]
pub struct ReleaseArgs {
    /// The store: a directory, s3://BUCKET[/PREFIX], or the base URL of a static host (e.g.
    /// https://releases.example.com/fleet).
    #[arg(long, value_name = "DIR|S3|URL", env = "WINDVANE_ROOT")]
    pub root: Option<String>,
    /// The channel to read.
    #[arg(long, value_name = "CHANNEL", env = "WINDVANE_CHANNEL")]
    channel: Option<String>,
    #[command(flatten)]
    trust: TrustArgs,
    #[command(flatten)]
    fleet: FleetArgs,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    release: ReleaseArgs,
    #[command(flatten)]
    output: OutputArgs,
}

/// What `verify -o json|yaml` prints: the verified pointer, the key that signed it, and the bundle's apps.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Verified<'a> {
    pointer: &'a ReleasePointer,
    signer: &'a str,
    apps: Vec<VerifiedApp>,
}

#[derive(Debug, Serialize)]
struct VerifiedApp {
    name: String,
    objects: usize,
    selector: String,
}

pub fn verify(args: VerifyArgs) -> Result<()> {
    let (accepted, bundle) = fetch_verified(&args.release)?;
    let verified = Verified {
        pointer: &accepted.pointer,
        signer: &accepted.keyid,
        apps: bundle
            .apps
            .iter()
            .map(|app| VerifiedApp {
                name: app.name.clone(),
                objects: app.object_count(),
                selector: app.selector.to_string(),
            })
            .collect(),
    };
    output::print(args.output.output, &verified, "the release", || {
        describe(&verified)
    })
}

/// The release as text, for people.
fn describe(verified: &Verified<'_>) -> String {
    let pointer = verified.pointer;
    let left = pointer
        .expires_at
        .duration_since(Timestamp::now())
        .unsigned_abs();
    let mut text = format!(
        "verified: fleet {} channel {}\nserial:   {}\nbundle:   sha256 {} ({} bytes)\nsigned:   key {}\n\
         issued:   {}\nexpires:  {} (in {})\nallow_empty: {}\napps:\n",
        pointer.fleet,
        pointer.channel,
        pointer.serial,
        pointer.bundle.sha256,
        pointer.bundle.size,
        verified.signer,
        pointer.issued_at,
        pointer.expires_at,
        format_duration(Duration::from_secs(left.as_secs())),
        pointer.allow_empty
    );
    for app in &verified.apps {
        let selector = if app.selector.is_empty() {
            "every cluster"
        } else {
            &app.selector
        };
        text.push_str(&format!(
            "  {:<24} {:>5} objects  selector: {selector}\n",
            app.name, app.objects
        ));
    }
    text
}

/// Fetches a channel's pointer and bundle and verifies both, as an agent with no history would.
pub fn fetch_verified(args: &ReleaseArgs) -> Result<(AcceptedRelease, Bundle)> {
    let (Some(root), Some(channel)) = (&args.root, &args.channel) else {
        return Err(Error::NeedRootAndChannel);
    };
    let trusted = inputs::trusted_keys(&args.trust.trusted_keys, true)?;
    let location = StoreLocation::parse(root).map_err(|source| Error::StoreLocation {
        root: root.clone(),
        source,
    })?;
    let shown = (location.to_string(), channel.clone());
    let pointer_bytes = runtime()?
        .block_on(location.read_pointer(channel))
        .map_err(|source| Error::ReadPointer {
            location: shown.0.clone(),
            channel: shown.1.clone(),
            source,
        })?;
    let refused = |source| Error::RefusePointer {
        location: shown.0.clone(),
        channel: shown.1.clone(),
        source,
    };
    let fleet = match &args.fleet.fleet {
        Some(fleet) => fleet.clone(),
        None => signed_fleet(&pointer_bytes, &trusted).map_err(refused)?,
    };
    let expectations = PointerExpectations::new(&trusted, &fleet, channel, Timestamp::now());
    let accepted = release::verify_pointer(&pointer_bytes, &expectations).map_err(refused)?;
    let bundle = fetch_bundle(&location, &accepted, channel)?;
    Ok((accepted, bundle))
}

/// The bundle an accepted pointer names, read from `location` and checked against the pointer.
fn fetch_bundle(
    location: &StoreLocation,
    accepted: &AcceptedRelease,
    channel: &str,
) -> Result<Bundle> {
    let cap = release::DEFAULT_MAX_BUNDLE_BYTES;
    let relative = store::bundle_path(&accepted.pointer.bundle.sha256);
    let bytes = runtime()?
        .block_on(location.read(&relative, cap, "bundle"))
        .map_err(|source| Error::ReadChannelBundle {
            location: location.to_string(),
            channel: channel.to_owned(),
            source,
        })?;
    release::verify_bundle(&bytes, &accepted.pointer, cap, BundleLimits::default()).map_err(
        |source| Error::RefuseBundle {
            location: location.to_string(),
            channel: channel.to_owned(),
            source,
        },
    )
}

/// The fleet named by a pointer whose signature checks out, for when the caller did not say which fleet.
fn signed_fleet(
    pointer_bytes: &[u8],
    trusted: &TrustedKeys,
) -> Result<String, windvane_shared::Error> {
    Ok(
        release::verify_signed_pointer(pointer_bytes, trusted, release::DEFAULT_MAX_POINTER_BYTES)?
            .pointer
            .fleet,
    )
}
