//! `windvane render`: exactly what one cluster (a name and labels) would get from a fleet tree, a built
//! bundle or a published release (`--root`, verified as `verify` does), as the YAML stream the agent would
//! apply: Windvane's labels added, fields left to others removed. SOPS-encrypted objects are shown encrypted,
//! or opened with `--reveal --age-key-file`.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use windvane_shared::decide::desired::{DesiredObject, all_or_first_error, cluster_share};
use windvane_shared::decide::render::ClusterIdentity;
use windvane_shared::format::bundle::Bundle;
use windvane_shared::spec::selector::{Labels, parse_label_assignment};
use windvane_shared::text::yaml_out;

use crate::commands::build::load_bundle_source;
use crate::commands::verify::{ReleaseArgs, fetch_verified};
use crate::engines::EngineArgs;
use crate::error::{Error, Result};
use crate::inputs;

#[derive(Debug, Args)]
pub struct RenderArgs {
    /// A fleet source tree or built bundle; or leave it out and give --root and --channel.
    #[arg(
        value_name = "SOURCE",
        required_unless_present = "root",
        conflicts_with = "root"
    )]
    source: Option<PathBuf>,
    #[command(flatten)]
    release: ReleaseArgs,
    /// The cluster's name, as its agent is configured (`${cluster.name}`).
    #[arg(long, value_name = "NAME", env = "WINDVANE_CLUSTER")]
    cluster: String,
    /// A cluster label `key=value`; repeat for more. Selects apps and fills `${cluster.labels.KEY}`.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label_assignment)]
    labels: Vec<(String, String)>,
    #[command(flatten)]
    engines: EngineArgs,
    /// Show SOPS-encrypted objects decrypted, as the cluster gets them, with the identities of
    /// --age-key-file. Without it they are shown encrypted.
    #[arg(long, requires = "age_key_file")]
    reveal: bool,
    /// An age identity file (as age-keygen or `windvane age-keygen` writes it) for --reveal.
    #[arg(long, value_name = "FILE", env = "WINDVANE_AGE_KEY_FILE")]
    age_key_file: Option<PathBuf>,
}

pub fn render(args: RenderArgs) -> Result<()> {
    let mut bundle = match &args.source {
        Some(path) => load_bundle_source(path, &args.engines, false)?,
        None => fetch_verified(&args.release)?.1,
    };
    let labels: Labels = args.labels.into_iter().collect();
    let cluster = ClusterIdentity {
        name: args.cluster,
        labels,
    };
    if args.reveal
        && let Some(path) = &args.age_key_file
    {
        reveal(&mut bundle, &cluster, path)?;
    }
    let shares: Vec<_> = cluster_share(&bundle, &cluster).collect();
    if shares.is_empty() {
        eprintln!(
            "no app of fleet {} selects cluster {} with these labels",
            bundle.fleet, cluster.name
        );
    }
    let objects = all_or_first_error(shares).map_err(|source| Error::RenderCluster {
        cluster: cluster.name.clone(),
        source,
    })?;
    print_objects(&objects).map_err(|source| Error::Stdout {
        what: "the rendered objects",
        source,
    })
}

/// Opens the SOPS-encrypted objects of the apps that select `cluster`, with the identities of `path`.
fn reveal(bundle: &mut Bundle, cluster: &ClusterIdentity, path: &std::path::Path) -> Result<()> {
    let keyring = inputs::keyring_file(path)?;
    let selected = bundle
        .apps
        .iter_mut()
        .filter(|app| app.selector.matches(&cluster.labels));
    for app in selected {
        if let Some(sealed) = windvane_shared::format::sops::open_app(app, &keyring)
            .into_iter()
            .next()
        {
            return Err(Error::Unseal {
                app: sealed.app,
                source: sealed.error,
            });
        }
    }
    Ok(())
}

/// Exactly what the agent sends, one document per object, each headed by where it came from.
fn print_objects(objects: &[DesiredObject]) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    for object in objects {
        writeln!(
            out,
            "---\n# app: {} ({} document {})",
            object.app, object.file, object.document
        )?;
        // Only the agent knows (from discovery) whether a kind is namespaced; say where it would go.
        if let Some(namespace) = &object.default_namespace
            && object.body.pointer("/metadata/namespace").is_none()
        {
            writeln!(
                out,
                "# namespace: {namespace} (the app's, if the kind is namespaced)"
            )?;
        }
        out.write_all(yaml_out::to_yaml_string(&object.body).as_bytes())?;
    }
    Ok(())
}
