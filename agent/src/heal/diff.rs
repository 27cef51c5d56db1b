//! `windvane-agent diff`: what the agent would change on this cluster, like `terraform plan`. It fetches and
//! verifies the release exactly as the agent does, renders this cluster's share, asks the API server for a
//! server-side-apply dry run of every object, and prints a unified diff of live state against the result —
//! ignoreDifferences honoured (those fields are never sent), Secret values masked, and so is every value that
//! came encrypted from a SOPS file, whatever the object's kind ([`crate::apply::secrets::SealedPaths`]). Exit
//! status: 0 no difference, 1 differences, 2 error.

use std::io::Write;

use jiff::Timestamp;
use similar::TextDiff;
use windvane_shared::format::bundle::{Bundle, BundleLimits};
use windvane_shared::format::release::{self, PointerExpectations};
use windvane_shared::text::yaml_out::to_yaml_string;

use crate::apply::desired::Desired;
use crate::config::DiffConfig;
use crate::fetch::source::{Poll, SourceClient};
use crate::heal::compare::{comparable, mask_secret, would_change};
use crate::kube::cluster::Cluster;
use crate::{Error, Result};

/// What `diff` found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DiffSummary {
    pub unchanged: usize,
    pub changed: usize,
    pub created: usize,
    pub failed: usize,
}

/// Runs the diff and writes it to `out`.
pub async fn run(
    config: &DiffConfig,
    client: kube::Client,
    out: &mut impl Write,
) -> Result<DiffSummary> {
    let (serial, mut bundle) = fetch_release(config).await?;
    // SOPS objects open with the agent's own identities; those that do not are counted as failed, by name.
    let keyring = crate::apply::secrets::load_keyring(
        &client,
        &config.namespace,
        config.age_key_secret.as_deref(),
    )
    .await;
    let masks = crate::apply::secrets::SealedPaths::of(&bundle, &config.identity);
    let sealed = crate::apply::secrets::open_selected(&mut bundle, &config.identity, &keyring);
    drop(keyring);
    let shares = windvane_shared::decide::desired::cluster_share(&bundle, &config.identity);
    let desired: Vec<Desired> = windvane_shared::decide::desired::all_or_first_error(shares)?
        .into_iter()
        .map(Desired::of)
        .collect();
    write(
        out,
        &format!(
            "# release serial {serial} of fleet {} channel {}, cluster {}\n",
            bundle.fleet, config.channel, config.identity.name
        ),
    )?;
    let cluster = Cluster::new(client);
    let mut summary = DiffSummary::default();
    for (object, message) in &sealed {
        summary.failed += 1;
        write(out, &format!("# {}: {message}\n", object.id))?;
    }
    for object in desired {
        let (counter, text) = match diff_object(&cluster, config, &masks, object).await? {
            ObjectDiff::Failed(text) => (&mut summary.failed, text),
            ObjectDiff::Unchanged => (&mut summary.unchanged, String::new()),
            ObjectDiff::Changed(text) => (&mut summary.changed, text),
            ObjectDiff::Created(text) => (&mut summary.created, text),
        };
        *counter += 1;
        write(out, &text)?;
    }
    write(
        out,
        &format!(
            "# {} unchanged, {} to change, {} to create, {} failed\n",
            summary.unchanged, summary.changed, summary.created, summary.failed
        ),
    )?;
    Ok(summary)
}

/// Fetches and verifies the channel's current release exactly as the agent does: its serial and bundle.
async fn fetch_release(config: &DiffConfig) -> Result<(u64, Bundle)> {
    let mut source = SourceClient::new(&config.source_url, &config.channel, Default::default())?;
    let Poll::Changed(pointer_bytes) = source.poll_pointer().await? else {
        return Err(Error::Fetch {
            url: source.pointer_url(),
            detail: "no pointer body".to_owned(),
        });
    };
    let expectations = PointerExpectations::new(
        &config.trusted,
        &config.fleet,
        &config.channel,
        Timestamp::now(),
    );
    let accepted = release::verify_pointer(&pointer_bytes, &expectations)?;
    let bundle_bytes = source.fetch_bundle(&accepted.pointer.bundle.sha256).await?;
    let bundle = release::verify_bundle(
        &bundle_bytes,
        &accepted.pointer,
        release::DEFAULT_MAX_BUNDLE_BYTES,
        BundleLimits::default(),
    )?;
    Ok((accepted.pointer.serial, bundle))
}

/// What one object's comparison found, with the text to print (a `!` line, or a unified diff).
enum ObjectDiff {
    Failed(String),
    Unchanged,
    Changed(String),
    Created(String),
}

/// Compares one desired object with the cluster: allowlist and placement as the agent judges them, then a
/// server-side-apply dry run against the live object. Errors of one object are its verdict; only a failed
/// read of live state stops the diff.
async fn diff_object(
    cluster: &Cluster,
    config: &DiffConfig,
    masks: &crate::apply::secrets::SealedPaths,
    mut object: Desired,
) -> Result<ObjectDiff> {
    let failed = |id: &dyn std::fmt::Display, why: String| {
        Ok(ObjectDiff::Failed(format!("! {id}: {why}\n")))
    };
    if let Err(reason) = config.allowlist.check_kind(&object.id) {
        return failed(&object.id, format!("refused: {reason}"));
    }
    let resolved = match cluster
        .resolve(&object.id.api_version, &object.id.kind)
        .await
    {
        Ok(resolved) => resolved,
        Err(error) => return failed(&object.id, error.to_string()),
    };
    // Placed as the agent places it: the allowlist judges the namespace the object would land in.
    match crate::apply::plan::place(&mut object, resolved.scope, &config.allowlist) {
        Ok(_) => {}
        Err(crate::apply::plan::Unplaced::Refused(reason)) => {
            return failed(&object.id, format!("refused: {reason}"));
        }
        Err(crate::apply::plan::Unplaced::Invalid(message)) => return failed(&object.id, message),
    }
    let live = cluster.get(&object.id, &resolved).await?;
    let dry_run = match cluster
        .apply(&object.id, &resolved, object.raw_body(), true)
        .await
    {
        Ok(result) => result,
        Err(failure) => return failed(&object.id, failure.message),
    };
    if !would_change(live.as_ref(), &dry_run) {
        return Ok(ObjectDiff::Unchanged);
    }
    let object_id = object.id.clone();
    let shown = |object: &serde_json::Value| {
        to_yaml_string(&mask_secret(&masks.mask(&object_id, &comparable(object))))
    };
    let before = live.as_ref().map(shown).unwrap_or_default();
    let after = shown(&dry_run);
    let header_before = match live {
        Some(_) => format!("live/{}", object.id),
        None => "/dev/null".to_owned(),
    };
    let text = TextDiff::from_lines(&before, &after)
        .unified_diff()
        .context_radius(3)
        .header(&header_before, &format!("desired/{}", object.id))
        .to_string();
    Ok(match live {
        Some(_) => ObjectDiff::Changed(text),
        None => ObjectDiff::Created(text),
    })
}

fn write(out: &mut dyn Write, text: &str) -> Result<()> {
    out.write_all(text.as_bytes())
        .map_err(|e| Error::Config(format!("writing the diff: {e}")))
}
