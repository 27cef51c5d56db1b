//! `windvane-agent diff`: what the agent would change on this cluster, like `terraform plan`. It fetches and
//! verifies the release exactly as the agent does, renders this cluster's share, asks the API server for a
//! server-side-apply dry run of every object, and prints a unified diff of live state against the result —
//! ignoreDifferences honoured (those fields are never sent), Secret values masked. Exit status: 0 no
//! difference, 1 differences, 2 error.

use std::io::Write;

use jiff::Timestamp;
use similar::TextDiff;
use windvane_shared::bundle::BundleLimits;
use windvane_shared::release::{self, PointerExpectations};
use windvane_shared::yaml_out::to_yaml_string;

use crate::cluster::Cluster;
use crate::compare::{comparable, mask_secret, would_change};
use crate::config::DiffConfig;
use crate::source::{Poll, SourceClient};
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
    let mut desired = Vec::new();
    for app in windvane_shared::render::selected_apps(&bundle, &config.identity) {
        let rendered = windvane_shared::render::render_app(app, &config.identity)?;
        desired.extend(
            windvane_shared::desired::desired_objects(&bundle.fleet, &rendered)?
                .into_iter()
                .map(crate::desired::Desired::of),
        );
    }
    let write = |out: &mut dyn Write, text: &str| {
        out.write_all(text.as_bytes())
            .map_err(|e| Error::Config(format!("writing the diff: {e}")))
    };
    write(
        out,
        &format!(
            "# release serial {} of fleet {} channel {}, cluster {}\n",
            accepted.pointer.serial, bundle.fleet, config.channel, config.identity.name
        ),
    )?;

    let cluster = Cluster::new(client);
    let mut summary = DiffSummary::default();
    for mut object in desired {
        if let Err(reason) = config.allowlist.check_kind(&object.id) {
            write(out, &format!("! {}: refused: {reason}\n", object.id))?;
            summary.failed += 1;
            continue;
        }
        let resolved = match cluster
            .resolve(&object.id.api_version, &object.id.kind)
            .await
        {
            Ok(resolved) => resolved,
            Err(error) => {
                write(out, &format!("! {}: {error}\n", object.id))?;
                summary.failed += 1;
                continue;
            }
        };
        // Placed as the agent places it: the allowlist judges the namespace the object would land in.
        match crate::plan::place(&mut object, resolved.scope, &config.allowlist) {
            Ok(_) => {}
            Err(crate::plan::Unplaced::Refused(reason)) => {
                write(out, &format!("! {}: refused: {reason}\n", object.id))?;
                summary.failed += 1;
                continue;
            }
            Err(crate::plan::Unplaced::Invalid(message)) => {
                write(out, &format!("! {}: {message}\n", object.id))?;
                summary.failed += 1;
                continue;
            }
        }
        let live = cluster.get(&object.id, &resolved).await?;
        let dry_run = match cluster
            .apply(&object.id, &resolved, &object.body(), true)
            .await
        {
            Ok(result) => result,
            Err(failure) => {
                write(out, &format!("! {}: {}\n", object.id, failure.message))?;
                summary.failed += 1;
                continue;
            }
        };
        if !would_change(live.as_ref(), &dry_run) {
            summary.unchanged += 1;
            continue;
        }
        let before = live
            .as_ref()
            .map(|l| to_yaml_string(&mask_secret(&comparable(l))))
            .unwrap_or_default();
        let after = to_yaml_string(&mask_secret(&comparable(&dry_run)));
        if live.is_some() {
            summary.changed += 1
        } else {
            summary.created += 1
        }
        let header_before = if live.is_some() {
            format!("live/{}", object.id)
        } else {
            "/dev/null".to_owned()
        };
        let diff = TextDiff::from_lines(&before, &after);
        write(
            out,
            &diff
                .unified_diff()
                .context_radius(3)
                .header(&header_before, &format!("desired/{}", object.id))
                .to_string(),
        )?;
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
