//! `windvane promote`: signs the exact bundle of one channel's current release on another channel, as its next
//! serial. The source channel's pointer is checked first (the channel's and fleet's own, unexpired, not older
//! than its signed history); with `--require-synced`, every cluster the selector picks must also be Synced on
//! that serial, as the source server shows.

use clap::Args;
use jiff::Timestamp;
use windvane_shared::wire::fleet_api::{ClusterState, FleetView};
use windvane_store::{self as store, PublishRequest};

use crate::args::{
    ExpiryArgs, FleetArgs, OptionalServerArgs, ReadTokenArgs, SigningArgs, StoreArgs, TrustArgs,
    reword,
};
use crate::error::{Error, Result};
use crate::http::{self, block_on};
use crate::inputs::{self, Signer};
use crate::stored::stored_bundle;

/// `windvane promote`.
#[derive(Debug, Args)]
#[command(mut_args(|a| reword(a, "trusted_keys",
    "Public keys that may have signed the channels' pointers besides KEY"
)))]
#[command(mut_args(|a| reword(a, "server", "The source server to check --require-synced against")))]
pub struct PromoteArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// The channel whose current bundle is promoted, e.g. `staging`.
    #[arg(long, value_name = "CHANNEL")]
    from: String,
    /// The channel it is published on, e.g. `prod`.
    #[arg(long, value_name = "CHANNEL")]
    to: String,
    #[command(flatten)]
    key: SigningArgs,
    #[command(flatten)]
    trust: TrustArgs,
    /// Promote only when every cluster this selector picks (at least one) follows --from and is Synced on
    /// its current serial, as the server shows; needs --server.
    #[arg(long, value_name = "SEL", requires = "server")]
    require_synced: Option<String>,
    #[command(flatten)]
    server: OptionalServerArgs,
    #[command(flatten)]
    token: ReadTokenArgs,
    #[command(flatten)]
    expiry: ExpiryArgs,
    #[command(flatten)]
    fleet: FleetArgs,
}

pub fn promote(args: PromoteArgs) -> Result<()> {
    let root = &args.store.root;
    let signer = Signer::load(&args.key.key, &args.trust.trusted_keys)?;
    let all = signer.with_own_key()?;
    let asked = store::history::Asked {
        channel: &args.from,
        fleet: args.fleet.fleet.as_deref(),
        now: Timestamp::now(),
        expired_ok: false,
    };
    let source = block_on(store::history::current(root, &all, &asked))?.map_err(|source| {
        Error::History {
            channel: args.from.clone(),
            source,
        }
    })?;
    if let (Some(selector), Some(server)) = (&args.require_synced, &args.server.server) {
        let fleet = fleet_view(server, selector, &args.token)?;
        if let Some(why) = synced_on(&fleet, &args.from, source.serial) {
            return Err(Error::NotSynced {
                serial: source.serial,
                from: args.from.clone(),
                selector: selector.clone(),
                why,
            });
        }
    }
    let bundle = stored_bundle(root, &source.bundle.sha256, &source.fleet)?;
    let request = PublishRequest {
        channel: &args.to,
        bundle: &bundle,
        key: &signer.key,
        also_trusted: &signer.trusted,
        expires_in: args.expiry.expires_in,
        allow_empty: source.allow_empty,
        now: Timestamp::now(),
    };
    let published = block_on(store::publish(root, &request))?.map_err(|source| Error::Publish {
        channel: args.to.clone(),
        store: root.to_string(),
        source,
    })?;
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

/// The clusters `selector` picks, as the source server shows them.
fn fleet_view(server: &str, selector: &str, token: &ReadTokenArgs) -> Result<FleetView> {
    let query: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("selector", selector)
        .finish();
    let url = format!("{}/api/v1/fleet?{query}", server.trim_end_matches('/'));
    let token = inputs::read_token_file(token.read_token_file.as_ref())?;
    http::get_json(&url, token.as_deref())
}

/// `None` when every cluster of `fleet` (at least one) follows `channel` and is Synced on `serial`;
/// otherwise why not. Pure.
fn synced_on(fleet: &FleetView, channel: &str, serial: u64) -> Option<String> {
    if fleet.clusters.is_empty() {
        return Some("no cluster matches the selector".to_owned());
    }
    let behind: Vec<String> = fleet
        .clusters
        .iter()
        .filter(|c| {
            c.state != ClusterState::Synced
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

#[cfg(test)]
mod tests {
    use super::*;

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
